#include "cpsim/planner/validation_case.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/json_io.hpp"

namespace cpsim::planner {
namespace {

using Json = nlohmann::json;

// activation_peak_bytes: the peak's activations, attention intermediates and other step tensors
// (MemCategory kActivations, kAttention, kOther), i.e. what the step allocates above the weights,
// gradients, optimizer states, gathered parameters and fixed overheads: comparable with a
// measurement's allocated peak less what was allocated before the step.
constexpr std::array<std::string_view, 7> kQuantities = {"max_seq_len",
                                                         "peak_memory_bytes",
                                                         "reserved_memory_bytes",
                                                         "activation_peak_bytes",
                                                         "tokens_per_s_per_gpu",
                                                         "model_tflops_per_gpu",
                                                         "mfu"};

}  // namespace

std::span<const std::string_view> validation_quantities() {
  return kQuantities;
}

namespace {

/// A JSON integer that fits an int. @throws InputError(field) otherwise.
int int_value(const Json& value, const std::string& field, const char* message) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned()) {
      if (value.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
        return static_cast<int>(value.get<std::uint64_t>());
    } else {
      const std::int64_t v = value.get<std::int64_t>();
      if (v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max())
        return static_cast<int>(v);
    }
  }
  throw InputError(field, message);
}

/// A setup value given as text: a string as is, a number or boolean as its JSON text.
std::string text_value(const Json& value, const std::string& field) {
  if (value.is_string())
    return value.get<std::string>();
  if (value.is_number() || value.is_boolean())
    return value.dump();
  throw InputError(field, "must be a string");
}

// Setup keys are the flags of `cpsim simulate` without their dashes: those that take text, and
// those that take an integer.
struct TextKey {
  const char* key;
  std::optional<std::string> ValidationSetup::*field;
};
constexpr TextKey kTextKeys[] = {
    {"model", &ValidationSetup::model},
    {"hardware", &ValidationSetup::hardware},
    {"seq", &ValidationSetup::seq},
    {"recipe", &ValidationSetup::recipe},
    {"ring-layout", &ValidationSetup::ring_layout},
    {"fpdt-chunk", &ValidationSetup::fpdt_chunk},
    {"fpdt-offload", &ValidationSetup::fpdt_offload},
    {"ac", &ValidationSetup::ac},
    {"ac-offload", &ValidationSetup::ac_offload},
    {"tiled-mlp", &ValidationSetup::tiled_mlp},
    {"fused-loss", &ValidationSetup::fused_loss},
    {"attention-kernel", &ValidationSetup::attention_kernel},
    {"optimizer-offload", &ValidationSetup::optimizer_offload},
    {"comm-dtype", &ValidationSetup::comm_dtype},
    {"param-offload", &ValidationSetup::param_offload},
    {"norm-kernel", &ValidationSetup::norm_kernel},
    {"rope-kernel", &ValidationSetup::rope_kernel},
    {"mlp-kernel", &ValidationSetup::mlp_kernel},
    {"int32-indexing", &ValidationSetup::int32_indexing},
    {"fp8", &ValidationSetup::fp8},
    {"pp-schedule", &ValidationSetup::pp_schedule},
};
struct IntKey {
  const char* key;
  std::optional<int> ValidationSetup::*field;
};
constexpr IntKey kIntKeys[] = {
    {"gpus", &ValidationSetup::gpus},
    {"gpus-per-node", &ValidationSetup::gpus_per_node},
    {"heads-per-stage", &ValidationSetup::heads_per_stage},
    {"cp-degree", &ValidationSetup::cp_degree},
    {"ulysses-degree", &ValidationSetup::ulysses_degree},
    {"ring-degree", &ValidationSetup::ring_degree},
    {"zero", &ValidationSetup::zero},
    {"tp", &ValidationSetup::tp},
    {"micro-batches", &ValidationSetup::micro_batches},
    {"pp", &ValidationSetup::pp},
    {"virtual-stages", &ValidationSetup::virtual_stages},
    {"pp-first-stage-layers", &ValidationSetup::pp_first_stage_layers},
    {"pp-last-stage-layers", &ValidationSetup::pp_last_stage_layers},
};

// One setup key into `a`; false when it is no simulate flag.
bool set_setup_key(const std::string& key,
                   const Json& value,
                   const std::string& field,
                   ValidationSetup& a) {
  if (key == "method") {
    a.method = text_value(value, field);
    return true;
  }
  if (key == "impl") {
    a.impl = text_value(value, field);
    return true;
  }
  for (const TextKey& t : kTextKeys) {
    if (key == t.key) {
      a.*(t.field) = text_value(value, field);
      return true;
    }
  }
  for (const IntKey& k : kIntKeys) {
    if (key == k.key) {
      a.*(k.field) = int_value(value, field, "must be an integer");
      return true;
    }
  }
  return false;
}

ValidationSetup parse_setup(const Json& s, const std::string& origin) {
  if (!s.is_object()) {
    throw InputError(origin + ":setup", "must be an object of simulate flags");
  }
  ValidationSetup a;
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string field = origin + ":setup." + it.key();
    if (!set_setup_key(it.key(), it.value(), field, a)) {
      throw InputError(field, "unknown setup key (use the flags of `cpsim simulate`)");
    }
  }
  return a;
}

}  // namespace

namespace {

// The case's fields (all but the setup), typed; a wrong type names the file.
void read_case_fields(const Json& j, const std::string& origin, ValidationCase& c) {
  auto need = [&](const char* key) -> const Json& {
    if (!j.contains(key)) {
      throw InputError(origin + ":" + key, "missing");
    }
    return j.at(key);
  };
  try {
    c.id = need("id").get<std::string>();
    c.title = need("title").get<std::string>();
    c.quantity = need("quantity").get<std::string>();
    c.source = need("source").get<std::string>();
    c.published = need("published").get<double>();
    c.tolerance = need("tolerance").at("relative").get<double>();
    c.tolerance_why = need("tolerance").at("why").get<std::string>();
    if (j.contains("row") && !j.at("row").is_null()) {
      c.row = int_value(j.at("row"), origin + ":row", "must be a non-negative integer or null");
      if (c.row < 0)
        throw InputError(origin + ":row", "must be a non-negative integer or null");
    }
    for (const auto& [key, field] :
         {std::pair{"skip", &c.skip}, std::pair{"granularity", &c.granularity},
          std::pair{"bound", &c.bound}, std::pair{"setup_note", &c.setup_note},
          std::pair{"bound_quote", &c.bound_quote}, std::pair{"open_gap", &c.open_gap}}) {
      if (j.contains(key))
        *field = j.at(key).get<std::string>();
    }
    if (j.contains("shared_gaps")) {
      if (!j.at("shared_gaps").is_array()) {
        throw InputError(origin + ":shared_gaps", "must be an array of keys");
      }
      for (const Json& key : j.at("shared_gaps")) {
        c.shared_gaps.push_back({key.get<std::string>(), ""});
      }
    }
  } catch (const Json::exception& e) {
    throw InputError(origin, fmt::format("wrong type: {}", e.what()));
  }
}

// What a case must say: a positive value and tolerance, a known quantity, a bound of its kind
// (a lower one only with the source's words), shared gaps that name files beside it.
void check_case(const ValidationCase& c, const std::string& origin) {
  if (!(c.published > 0.0) || !(c.tolerance > 0.0) || c.tolerance > 1.0) {
    throw InputError(origin + ":published", "published value and tolerance must be positive");
  }
  if (std::find(kQuantities.begin(), kQuantities.end(), c.quantity) == kQuantities.end()) {
    throw InputError(origin + ":quantity", fmt::format("unknown quantity '{}'", c.quantity));
  }
  if (c.bound != "two-sided" && c.bound != "lower") {
    throw InputError(origin + ":bound",
                     fmt::format("must be two-sided or lower, got '{}'", c.bound));
  }
  if (c.bound == "lower" && c.quantity != "max_seq_len") {
    throw InputError(origin + ":bound", "a lower bound applies to max_seq_len cases only");
  }
  if (c.bound == "lower" && c.bound_quote.empty()) {
    throw InputError(origin + ":bound_quote",
                     "a lower bound needs the source's own words that the run was not at the "
                     "limit");
  }
  for (const ValidationCase::SharedGap& g : c.shared_gaps) {
    // A file name beside the case, nothing else.
    if (g.key.empty() || !std::all_of(g.key.begin(), g.key.end(), [](char ch) {
          return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-';
        })) {
      throw InputError(
          origin + ":shared_gaps",
          fmt::format("'{}' is not a key (lower-case letters, digits and '-')", g.key));
    }
  }
}

}  // namespace

ValidationCase parse_validation_case(const std::string& json_text, const std::string& origin) {
  models::reject_duplicate_json_keys(json_text, origin);
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    throw InputError(origin, fmt::format("malformed JSON at byte {}", e.byte));
  } catch (const Json::exception& e) {  // e.g. a number too large for a double
    throw InputError(origin, fmt::format("malformed JSON: {}", e.what()));
  }
  if (!j.is_object() || !j.contains("schema")) {
    throw InputError(origin + ":schema", "missing");
  }
  if (j.at("schema") != kValidationSchema) {
    throw InputError(origin + ":schema", fmt::format("expected \"{}\"", kValidationSchema));
  }
  ValidationCase c;
  read_case_fields(j, origin, c);
  check_case(c, origin);
  if (!j.contains("setup")) {
    throw InputError(origin + ":setup", "missing");
  }
  c.setup = parse_setup(j.at("setup"), origin);
  if (c.setup.impl.empty()) {
    throw InputError(origin + ":setup.impl",
                     "name the implementation the run used (`cpsim implementations`), or none");
  }
  return c;
}

ValidationCase load_validation_case(const std::filesystem::path& path) {
  const std::string origin = path.filename().string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(origin, "cannot read the file");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  ValidationCase c = parse_validation_case(buffer.str(), origin);
  for (ValidationCase::SharedGap& g : c.shared_gaps) {
    const std::filesystem::path gap = path.parent_path() / "gaps" / (g.key + ".md");
    std::ifstream text(gap, std::ios::binary);
    std::stringstream read;
    read << text.rdbuf();
    g.text = read.str();
    while (!g.text.empty() && (g.text.back() == '\n' || g.text.back() == ' ')) {
      g.text.pop_back();
    }
    if (!text || g.text.empty()) {
      throw InputError(origin + ":shared_gaps",
                       fmt::format("cannot read '{}' (or it is empty)", gap.string()));
    }
  }
  return c;
}

}  // namespace cpsim::planner
