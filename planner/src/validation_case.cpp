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

// Setup keys are the flags of `cpsim simulate` without their dashes.
ValidationSetup parse_setup(const Json& s, const std::string& origin) {
  if (!s.is_object()) {
    throw InputError(origin + ":setup", "must be an object of simulate flags");
  }
  ValidationSetup a;
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& key = it.key();
    const Json& value = it.value();
    const std::string field = origin + ":setup." + key;
    auto text = [&]() { return text_value(value, field); };
    auto integer = [&]() { return int_value(value, field, "must be an integer"); };
    if (key == "model")
      a.model = text();
    else if (key == "gpus")
      a.gpus = integer();
    else if (key == "gpus-per-node")
      a.gpus_per_node = integer();
    else if (key == "hardware")
      a.hardware = text();
    else if (key == "method")
      a.method = text();
    else if (key == "seq")
      a.seq = text();
    else if (key == "recipe")
      a.recipe = text();
    else if (key == "heads-per-stage")
      a.heads_per_stage = integer();
    else if (key == "cp-degree")
      a.cp_degree = integer();
    else if (key == "ulysses-degree")
      a.ulysses_degree = integer();
    else if (key == "ring-degree")
      a.ring_degree = integer();
    else if (key == "ring-layout")
      a.ring_layout = text();
    else if (key == "fpdt-chunk")
      a.fpdt_chunk = text();
    else if (key == "fpdt-offload")
      a.fpdt_offload = text();
    else if (key == "ac")
      a.ac = text();
    else if (key == "ac-offload")
      a.ac_offload = text();
    else if (key == "tiled-mlp")
      a.tiled_mlp = text();
    else if (key == "fused-loss")
      a.fused_loss = text();
    else if (key == "attention-kernel")
      a.attention_kernel = text();
    else if (key == "zero")
      a.zero = integer();
    else if (key == "optimizer-offload")
      a.optimizer_offload = text();
    else if (key == "comm-dtype")
      a.comm_dtype = text();
    else if (key == "param-offload")
      a.param_offload = text();
    else if (key == "norm-kernel")
      a.norm_kernel = text();
    else if (key == "rope-kernel")
      a.rope_kernel = text();
    else if (key == "mlp-kernel")
      a.mlp_kernel = text();
    else if (key == "int32-indexing")
      a.int32_indexing = text();
    else if (key == "fp8")
      a.fp8 = text();
    else if (key == "tp")
      a.tp = integer();
    else if (key == "micro-batches")
      a.micro_batches = integer();
    else if (key == "pp")
      a.pp = integer();
    else if (key == "pp-schedule")
      a.pp_schedule = text();
    else if (key == "virtual-stages")
      a.virtual_stages = integer();
    else if (key == "pp-first-stage-layers")
      a.pp_first_stage_layers = integer();
    else if (key == "pp-last-stage-layers")
      a.pp_last_stage_layers = integer();
    else if (key == "impl")
      a.impl = text();
    else
      throw InputError(field, "unknown setup key (use the flags of `cpsim simulate`)");
  }
  return a;
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
  auto need = [&](const char* key) -> const Json& {
    if (!j.is_object() || !j.contains(key)) {
      throw InputError(origin + ":" + key, "missing");
    }
    return j.at(key);
  };
  if (need("schema") != kValidationSchema) {
    throw InputError(origin + ":schema", fmt::format("expected \"{}\"", kValidationSchema));
  }
  ValidationCase c;
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
    if (j.contains("skip"))
      c.skip = j.at("skip").get<std::string>();
    if (j.contains("granularity"))
      c.granularity = j.at("granularity").get<std::string>();
    if (j.contains("bound"))
      c.bound = j.at("bound").get<std::string>();
    if (j.contains("setup_note"))
      c.setup_note = j.at("setup_note").get<std::string>();
    if (j.contains("bound_quote"))
      c.bound_quote = j.at("bound_quote").get<std::string>();
    if (j.contains("open_gap"))
      c.open_gap = j.at("open_gap").get<std::string>();
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
  c.setup = parse_setup(need("setup"), origin);
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
