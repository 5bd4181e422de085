#include "cpsim/models/io.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/json_keys.hpp"

#include "io_checks.hpp"

namespace cpsim::models {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::string_view kHardwareSchema = "cpsim.hardware/1";
constexpr std::string_view kRecipeSchema = "cpsim.recipe/1";
constexpr std::uintmax_t kMaxFileBytes = 64 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Generic JSON access. Every error names `<origin>:<path>`, where path is dotted ("gpu.sm_count").

std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}

std::string field_name(const std::string& origin, const std::string& path) {
  return path.empty() ? origin : fmt::format("{}:{}", origin, path);
}

/// Short description of a JSON value for error messages: numbers and short strings verbatim,
/// containers by type.
std::string describe(const Json& value) {
  if (value.is_number() || value.is_boolean() || value.is_null()) {
    return value.dump();
  }
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    return s.size() <= 40 ? fmt::format("string \"{}\"", s) : "a string";
  }
  return fmt::format("an {}", value.type_name());
}

/// Parses JSON text; malformed text becomes an InputError naming the origin and the position.
Json parse_json(const std::string& text, const std::string& origin) {
  reject_duplicate_json_keys(text, origin);
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 5: ...".
    std::string message = e.what();
    if (const auto pos = message.find("] "); pos != std::string::npos) {
      message.erase(0, pos + 2);
    }
    std::replace(message.begin(), message.end(), '\n', ' ');
    throw InputError(origin, fmt::format("malformed JSON: {}", message));
  } catch (const Json::exception& e) {
    std::string message = e.what();
    if (const auto pos = message.find("] "); pos != std::string::npos) {
      message.erase(0, pos + 2);
    }
    std::replace(message.begin(), message.end(), '\n', ' ');
    throw InputError(origin, fmt::format("malformed JSON: {}", message));
  }
}

/// Typed reads of one JSON value; `field` is the full field name used in errors.
std::int64_t as_int(const Json& value, const std::string& field) {
  if (value.is_number_unsigned()) {
    const auto u = value.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw InputError(field, fmt::format("integer {} is out of range", u));
    }
    return static_cast<std::int64_t>(u);
  }
  if (value.is_number_integer()) {
    return value.get<std::int64_t>();
  }
  if (value.is_number_float()) {
    // Integral doubles (8.0) are accepted; 2^63 is the first value out of int64 range.
    const double d = value.get<double>();
    constexpr double kLimit = 9223372036854775808.0;
    if (std::isfinite(d) && std::floor(d) == d && d > -kLimit && d < kLimit) {
      return static_cast<std::int64_t>(d);
    }
  }
  throw InputError(field, fmt::format("must be an integer, got {}", describe(value)));
}

double as_number(const Json& value, const std::string& field) {
  if (!value.is_number()) {
    throw InputError(field, fmt::format("must be a number, got {}", describe(value)));
  }
  const double d = value.get<double>();
  if (!std::isfinite(d)) {
    throw InputError(field, fmt::format("must be finite, got {}", d));
  }
  return d;
}

bool as_bool(const Json& value, const std::string& field) {
  if (!value.is_boolean()) {
    throw InputError(field, fmt::format("must be true or false, got {}", describe(value)));
  }
  return value.get<bool>();
}

std::string as_string(const Json& value, const std::string& field) {
  if (!value.is_string()) {
    throw InputError(field, fmt::format("must be a string, got {}", describe(value)));
  }
  return value.get<std::string>();
}

const Json& as_object(const Json& value, const std::string& field) {
  if (!value.is_object()) {
    throw InputError(field, fmt::format("must be a JSON object, got {}", describe(value)));
  }
  return value;
}

/// The member `key` of `object`, or nullptr when absent or null.
const Json* find_member(const Json& object, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    return nullptr;
  }
  return &*it;
}

/// Typo protection: every key of `object` must be in `known`.
void reject_unknown_keys(const Json& object,
                         std::initializer_list<std::string_view> known,
                         const std::string& origin,
                         const std::string& path) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (const std::string_view k : known) {
        list += list.empty() ? std::string(k) : fmt::format(", {}", k);
      }
      throw InputError(field_name(origin, join_path(path, key)),
                       fmt::format("unknown key; known keys here: {}", list));
    }
  }
}

/// Default model or recipe name from its origin: the file stem, or the folder of a config.json.
std::string name_from_origin(const std::string& origin) {
  const fs::path p(origin);
  std::string stem = p.stem().string();
  if (stem == "config" && p.has_parent_path() && !p.parent_path().filename().empty()) {
    stem = p.parent_path().filename().string();
  }
  return stem.empty() ? origin : stem;
}

/// Rethrows an InputError from a validate() whose field is `<prefix><path>` as `<origin>:<path>`.
[[noreturn]] void rethrow_with_origin(const InputError& e,
                                      std::string_view prefix,
                                      const std::string& origin) {
  std::string path = e.field();
  if (path.rfind(prefix, 0) == 0) {
    path.erase(0, prefix.size());
  }
  const std::string what = e.what();
  const std::string message = what.substr(std::min(what.size(), e.field().size() + 2));
  throw InputError(field_name(origin, path), message);
}

// ---------------------------------------------------------------------------------------------
// Hugging Face config.json

/// Keys whose presence (with a non-null, non-zero value) means an architecture cpsim does not
/// model.
struct RefusedKey {
  std::string_view key;
  std::string_view what;
};
constexpr std::array<RefusedKey, 7> kRefusedKeys = {{
    {"num_local_experts", "mixture-of-experts"},
    {"num_experts", "mixture-of-experts"},
    {"n_routed_experts", "mixture-of-experts"},
    {"num_experts_per_tok", "mixture-of-experts"},
    {"moe_intermediate_size", "mixture-of-experts"},
    {"kv_lora_rank", "multi-head latent attention (MLA)"},
    {"q_lora_rank", "multi-head latent attention (MLA)"},
}};

bool is_zero_or_false(const Json& value) {
  return (value.is_number() && value.get<double>() == 0.0) ||
         (value.is_boolean() && !value.get<bool>());
}

class HfReader {
 public:
  HfReader(const Json& root, const std::string& origin) : root_(root), origin_(origin) {}

  std::string field(std::string_view key) const { return field_name(origin_, std::string(key)); }

  const Json& required(std::string_view key) const {
    const auto it = root_.find(key);
    if (it == root_.end()) {
      const char* hint = root_.contains("text_config")
                             ? " (multimodal configs with text_config are not supported yet; pass "
                               "the text model's config)"
                             : "";
      throw InputError(field(key), fmt::format("required key is missing{}", hint));
    }
    return *it;
  }
  std::int64_t required_int(std::string_view key) const {
    return as_int(required(key), field(key));
  }
  const Json* optional(std::string_view key) const { return find_member(root_, key); }

 private:
  const Json& root_;
  const std::string& origin_;
};

ActivationKind parse_activation(const std::string& act, const std::string& field) {
  if (act == "silu" || act == "swiglu" || act == "swish") {
    return ActivationKind::kSwiGlu;
  }
  if (act.rfind("gelu", 0) == 0) {
    return ActivationKind::kGelu;
  }
  throw InputError(field,
                   fmt::format("unsupported activation '{}'; known: silu, swiglu, gelu*", act));
}

// ---------------------------------------------------------------------------------------------
// Hardware profile

enum class Bound { kNonNegative, kPositive, kFraction };

void check_bound(double v, Bound bound, const std::string& field) {
  switch (bound) {
    case Bound::kNonNegative:
      if (v < 0.0) {
        throw InputError(field, fmt::format("must not be negative, got {}", v));
      }
      return;
    case Bound::kPositive:
      if (v <= 0.0) {
        throw InputError(field, fmt::format("must be positive, got {}", v));
      }
      return;
    case Bound::kFraction:
      if (v <= 0.0 || v > 1.0) {
        throw InputError(field, fmt::format("must be a fraction in (0, 1], got {}", v));
      }
      return;
  }
}

/// Reads coefficients ({"value", "source"}) and curves ({"points", "source"}) of a profile and
/// records each source in `provenance` under the coefficient's JSON path.
class ProfileReader {
 public:
  ProfileReader(const std::string& origin, std::map<std::string, std::string>& provenance)
      : origin_(origin), provenance_(provenance) {}

  std::string field(const std::string& path) const { return field_name(origin_, path); }

  const Json& member(const Json& object, const std::string& path, std::string_view key) const {
    const auto it = object.find(key);
    const std::string child = join_path(path, key);
    if (it == object.end()) {
      throw InputError(field(child), "required key is missing");
    }
    return *it;
  }

  const Json& section(const Json& object,
                      const std::string& path,
                      std::string_view key,
                      std::initializer_list<std::string_view> known) const {
    const std::string child = join_path(path, key);
    const Json& value = as_object(member(object, path, key), field(child));
    reject_unknown_keys(value, known, origin_, child);
    return value;
  }

  double number(const Json& object, const std::string& path, std::string_view key, Bound bound) {
    const std::string child = join_path(path, key);
    const Json& coefficient = as_object(member(object, path, key), field(child));
    reject_unknown_keys(coefficient, {"value", "source"}, origin_, child);
    record_source(coefficient, child);
    const double v = as_number(member(coefficient, child, "value"), field(child));
    check_bound(v, bound, field(child));
    return v;
  }

  std::int64_t integer(const Json& object,
                       const std::string& path,
                       std::string_view key,
                       Bound bound) {
    const std::string child = join_path(path, key);
    const Json& coefficient = as_object(member(object, path, key), field(child));
    reject_unknown_keys(coefficient, {"value", "source"}, origin_, child);
    record_source(coefficient, child);
    const std::int64_t v = as_int(member(coefficient, child, "value"), field(child));
    check_bound(static_cast<double>(v), bound, field(child));
    return v;
  }

  /// A curve with at least one point, x > 0 strictly increasing, y within `bound`.
  LogCurve curve(const Json& object, const std::string& path, std::string_view key, Bound bound) {
    const std::string child = join_path(path, key);
    const Json& node = as_object(member(object, path, key), field(child));
    reject_unknown_keys(node, {"points", "source"}, origin_, child);
    record_source(node, child);
    const std::string points_path = join_path(child, "points");
    const Json& points = member(node, child, "points");
    if (!points.is_array() || points.empty()) {
      throw InputError(field(points_path),
                       fmt::format("must be a non-empty array of [x, y] pairs, got {}",
                                   points.is_array() ? "an empty array" : describe(points)));
    }
    std::vector<std::pair<double, double>> xy;
    xy.reserve(points.size());
    for (std::size_t i = 0; i < points.size(); ++i) {
      const std::string point_field = field(fmt::format("{}[{}]", points_path, i));
      const Json& p = points[i];
      if (!p.is_array() || p.size() != 2) {
        throw InputError(point_field, fmt::format("must be an [x, y] pair, got {}", describe(p)));
      }
      const double x = as_number(p[0], point_field);
      const double y = as_number(p[1], point_field);
      if (x <= 0.0) {
        throw InputError(point_field, fmt::format("x must be positive, got {}", x));
      }
      if (!xy.empty() && x <= xy.back().first) {
        throw InputError(point_field, fmt::format("x must be strictly increasing ({} after {})", x,
                                                  xy.back().first));
      }
      check_bound(y, bound, point_field);
      xy.emplace_back(x, y);
    }
    return LogCurve(std::move(xy));
  }

 private:
  void record_source(const Json& node, const std::string& path) {
    const std::string source_path = join_path(path, "source");
    const auto it = node.find("source");
    if (it == node.end()) {
      throw InputError(field(source_path), "every coefficient needs a non-empty source");
    }
    const std::string source = as_string(*it, field(source_path));
    if (source.find_first_not_of(" \t\r\n") == std::string::npos) {
      throw InputError(field(source_path), "every coefficient needs a non-empty source");
    }
    provenance_[path] = source;
  }

  const std::string& origin_;
  std::map<std::string, std::string>& provenance_;
};

/// Checks that a name can be used as one component of a dotted JSON path.
void check_name_component(const std::string& name, const std::string& field) {
  const bool ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
  if (!ok) {
    throw InputError(field, fmt::format("name '{}' must be non-empty and use only letters, digits, "
                                        "'_' and '-'",
                                        name));
  }
}

void check_schema(const Json& root, std::string_view expected, const std::string& origin) {
  const std::string field = field_name(origin, "schema");
  const auto it = root.find("schema");
  if (it == root.end()) {
    throw InputError(field, fmt::format("required key is missing (expected \"{}\")", expected));
  }
  const std::string schema = as_string(*it, field);
  if (schema != expected) {
    throw InputError(field, fmt::format("unknown schema '{}'; expected \"{}\"", schema, expected));
  }
}

int to_int(std::int64_t v, const std::string& field) {
  if (v > std::numeric_limits<int>::max()) {
    throw InputError(field, fmt::format("{} is out of range", v));
  }
  return static_cast<int>(v);
}

constexpr std::array<std::pair<Span, std::string_view>, 2> kSpans = {{
    {Span::kIntraNode, "intra_node"},
    {Span::kInterNode, "inter_node"},
}};
constexpr std::array<std::pair<Collective, std::string_view>, 5> kCollectives = {{
    {Collective::kAllToAll, "all_to_all"},
    {Collective::kAllGather, "all_gather"},
    {Collective::kReduceScatter, "reduce_scatter"},
    {Collective::kAllReduce, "all_reduce"},
    {Collective::kSendRecv, "send_recv"},
}};

// ---------------------------------------------------------------------------------------------
// Files and built-in names

std::string read_text_file(const fs::path& path, const std::string& field) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > kMaxFileBytes) {
    throw InputError(field, fmt::format("'{}' is too large ({} bytes)", path.string(), size));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(field, fmt::format("cannot open '{}' for reading", path.string()));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw InputError(field, fmt::format("error while reading '{}'", path.string()));
  }
  return text.str();
}

struct ResolvedFile {
  fs::path path;
  std::string
      origin;  ///< prefix of error fields: the path as given, or "<name>.json" for built-ins
};

/// An argument that looks like a path (has a '/' or ends in .json) but names nothing is a missing
/// file, not an unknown built-in name. @throws InputError naming `field` and the path.
void check_path_exists(const std::string& name_or_path, const std::string& field) {
  const bool looks_like_path =
      name_or_path.find_first_of("/\\") != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".json") == 0);
  std::error_code ec;
  if (looks_like_path && !fs::exists(name_or_path, ec)) {
    throw InputError(field, fmt::format("file not found: '{}'", name_or_path));
  }
}

/// `name_or_path` as an existing file, else as a built-in `data.root/kind/<name>.json`.
/// `noun` and `hint` shape the error: "unknown model 'x'; built-in: a, b (or give a path to ...)".
ResolvedFile resolve_file(const std::string& name_or_path,
                          const DataDir& data,
                          const std::string& kind,
                          std::string_view noun,
                          std::string_view hint,
                          const std::string& field) {
  std::error_code ec;
  if (!name_or_path.empty()) {
    const fs::path given(name_or_path);
    if (fs::is_regular_file(given, ec)) {
      return {given, name_or_path};
    }
    if (kind == "models" && fs::is_directory(given, ec) &&
        fs::is_regular_file(given / "config.json", ec)) {
      return {given / "config.json", (given / "config.json").string()};
    }
    const bool plain_name = name_or_path.find_first_of("/\\") == std::string::npos &&
                            name_or_path != "." && name_or_path != "..";
    if (plain_name) {
      std::string stem = name_or_path;
      if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0) {
        stem.resize(stem.size() - 5);
      }
      const fs::path builtin = data.root / kind / (stem + ".json");
      if (fs::is_regular_file(builtin, ec)) {
        return {builtin, stem + ".json"};
      }
    }
  }
  check_path_exists(name_or_path, field);
  const std::vector<std::string> names = list_builtin(data, kind);
  std::string list;
  for (const auto& n : names) {
    list += list.empty() ? n : ", " + n;
  }
  const std::string none = fmt::format("none found in '{}'", (data.root / kind).string());
  throw InputError(field, fmt::format("unknown {} '{}'; built-in: {} ({})", noun, name_or_path,
                                      list.empty() ? none : list, hint));
}

}  // namespace

// -------------------------------------------------------------------------------------------------

TransformerSpec parse_hf_config(const std::string& json_text, const std::string& origin) {
  const Json root = parse_json(json_text, origin);
  if (!root.is_object()) {
    throw InputError(origin,
                     fmt::format("a config.json must be a JSON object, got {}", describe(root)));
  }
  const HfReader hf(root, origin);

  for (const auto& refused : kRefusedKeys) {
    const Json* value = hf.optional(refused.key);
    if (value != nullptr && !is_zero_or_false(*value)) {
      throw InputError(hf.field(refused.key),
                       fmt::format("{} models are not modelled yet (only dense decoder-only "
                                   "transformers)",
                                   refused.what));
    }
  }

  detail::check_modelled_architecture(root, origin);

  TransformerSpec spec;
  spec.hidden = hf.required_int("hidden_size");
  spec.ffn_hidden = hf.required_int("intermediate_size");
  spec.layers = hf.required_int("num_hidden_layers");
  spec.heads = hf.required_int("num_attention_heads");
  spec.vocab = hf.required_int("vocab_size");
  if (spec.heads <= 0) {
    throw InputError(hf.field("num_attention_heads"),
                     fmt::format("must be positive, got {}", spec.heads));
  }

  const Json* kv = hf.optional("num_key_value_heads");
  spec.kv_heads = kv != nullptr ? as_int(*kv, hf.field("num_key_value_heads")) : spec.heads;

  if (const Json* head_dim = hf.optional("head_dim")) {
    spec.head_dim = as_int(*head_dim, hf.field("head_dim"));
  } else {
    if (spec.hidden % spec.heads != 0) {
      throw InputError(hf.field("head_dim"),
                       fmt::format("missing, and hidden_size {} is not divisible by "
                                   "num_attention_heads {}",
                                   spec.hidden, spec.heads));
    }
    spec.head_dim = spec.hidden / spec.heads;
  }

  if (const Json* tie = hf.optional("tie_word_embeddings")) {
    spec.tied_embeddings = as_bool(*tie, hf.field("tie_word_embeddings"));
  }
  if (const Json* max_pos = hf.optional("max_position_embeddings")) {
    spec.max_position_embeddings = as_int(*max_pos, hf.field("max_position_embeddings"));
  }
  if (const Json* bias = hf.optional("attention_bias")) {
    spec.attention_bias = as_bool(*bias, hf.field("attention_bias"));
  }
  if (const Json* act = hf.optional("hidden_act")) {
    spec.activation =
        parse_activation(as_string(*act, hf.field("hidden_act")), hf.field("hidden_act"));
  }
  if (const Json* model_type = hf.optional("model_type")) {
    spec.qk_norm = as_string(*model_type, hf.field("model_type")) == "qwen3";
  }

  // RoPE: legacy rope_theta (+ rope_scaling), or transformers v5 rope_parameters, which wins.
  if (const Json* theta = hf.optional("rope_theta")) {
    spec.rope_theta = as_number(*theta, hf.field("rope_theta"));
  }
  if (const Json* scaling = hf.optional("rope_scaling")) {
    as_object(*scaling, hf.field("rope_scaling"));  // scaling does not change cost; shape checked
  }
  if (const Json* params = hf.optional("rope_parameters")) {
    as_object(*params, hf.field("rope_parameters"));
    std::string theta_key = "rope_parameters.rope_theta";
    const Json* theta = find_member(*params, "rope_theta");
    if (theta == nullptr) {
      // Per-layer-type form: {"full_attention": {...}, "sliding_attention": {...}}.
      if (const Json* full = find_member(*params, "full_attention"); full && full->is_object()) {
        theta = find_member(*full, "rope_theta");
        theta_key = "rope_parameters.full_attention.rope_theta";
      }
    }
    if (theta != nullptr) {
      spec.rope_theta = as_number(*theta, hf.field(theta_key));
    }
  }

  if (const Json* name = hf.optional("name")) {
    spec.name = as_string(*name, hf.field("name"));
  } else if (const Json* hub = hf.optional("_name_or_path"); hub && hub->is_string()) {
    spec.name = hub->get<std::string>();
  }
  if (spec.name.empty()) {
    spec.name = name_from_origin(origin);
  }
  if (const Json* source = hf.optional("source")) {
    spec.source = as_string(*source, hf.field("source"));
  }
  if (spec.source.empty()) {
    spec.source = origin;
  }

  try {
    spec.validate();
  } catch (const InputError& e) {
    rethrow_with_origin(e, "model.", origin);
  }
  detail::note_head_dim(spec);
  return spec;
}

TransformerSpec load_model(const std::string& name_or_path,
                           const DataDir& data,
                           const std::string& field) {
  const ResolvedFile file =
      resolve_file(name_or_path, data, "models", "model", "or give a path to a config.json", field);
  return parse_hf_config(read_text_file(file.path, field), file.origin);
}

HardwareProfile parse_hardware_profile(const std::string& json_text, const std::string& origin) {
  const Json root = parse_json(json_text, origin);
  if (!root.is_object()) {
    throw InputError(
        origin, fmt::format("a hardware profile must be a JSON object, got {}", describe(root)));
  }
  check_schema(root, kHardwareSchema, origin);
  reject_unknown_keys(root,
                      {"schema", "name", "description", "gpu", "compute", "memory_overheads",
                       "node", "collectives"},
                      origin, "");

  HardwareProfile hw;
  ProfileReader r(origin, hw.provenance);
  hw.schema_version = kProfileSchemaVersion;
  hw.name = as_string(r.member(root, "", "name"), r.field("name"));
  if (hw.name.empty()) {
    throw InputError(r.field("name"), "must not be empty");
  }
  if (const Json* description = find_member(root, "description")) {
    hw.description = as_string(*description, r.field("description"));
  }

  const Json& gpu = r.section(root, "", "gpu",
                              {"name", "hbm_capacity_bytes", "sm_count", "peak_bf16_flops_per_s",
                               "hbm_bandwidth_bytes_per_s"});
  hw.gpu_name = as_string(r.member(gpu, "gpu", "name"), r.field("gpu.name"));
  hw.hbm_capacity_bytes = r.integer(gpu, "gpu", "hbm_capacity_bytes", Bound::kPositive);
  hw.sm_count = r.integer(gpu, "gpu", "sm_count", Bound::kPositive);
  hw.peak_bf16_flops_per_s = r.number(gpu, "gpu", "peak_bf16_flops_per_s", Bound::kPositive);
  hw.hbm_bandwidth_bytes_per_s =
      r.number(gpu, "gpu", "hbm_bandwidth_bytes_per_s", Bound::kPositive);

  const Json& compute =
      r.section(root, "", "compute",
                {"gemm_max_efficiency", "gemm_efficiency_by_flops", "memory_bound_efficiency",
                 "kernel_launch_s", "collective_launch_s", "compute_slowdown_under_comm",
                 "attention_kernels"});
  hw.gemm_max_efficiency = r.number(compute, "compute", "gemm_max_efficiency", Bound::kFraction);
  if (compute.contains("gemm_efficiency_by_flops")) {
    hw.gemm_efficiency_by_flops =
        r.curve(compute, "compute", "gemm_efficiency_by_flops", Bound::kFraction);
  }
  hw.memory_bound_efficiency =
      r.number(compute, "compute", "memory_bound_efficiency", Bound::kFraction);
  hw.kernel_launch_s = r.number(compute, "compute", "kernel_launch_s", Bound::kNonNegative);
  hw.collective_launch_s = r.number(compute, "compute", "collective_launch_s", Bound::kNonNegative);
  hw.compute_slowdown_under_comm =
      r.number(compute, "compute", "compute_slowdown_under_comm", Bound::kNonNegative);

  const std::string kernels_path = "compute.attention_kernels";
  const Json& kernels =
      as_object(r.member(compute, "compute", "attention_kernels"), r.field(kernels_path));
  if (kernels.empty()) {
    throw InputError(r.field(kernels_path), "must name at least one attention kernel");
  }
  for (const auto& [kernel_name, kernel_json] : kernels.items()) {
    const std::string path = join_path(kernels_path, kernel_name);
    check_name_component(kernel_name, r.field(path));
    const Json& k =
        r.section(kernels, kernels_path, kernel_name,
                  {"fwd_causal_flops_per_s", "fwd_full_flops_per_s", "bwd_causal_flops_per_s",
                   "bwd_full_flops_per_s", "fwd_block_m", "bwd_block_n", "head_dim"});
    AttentionKernelModel model;
    model.fwd_causal_flops_per_s = r.curve(k, path, "fwd_causal_flops_per_s", Bound::kPositive);
    model.fwd_full_flops_per_s = r.curve(k, path, "fwd_full_flops_per_s", Bound::kPositive);
    model.bwd_causal_flops_per_s = r.curve(k, path, "bwd_causal_flops_per_s", Bound::kPositive);
    model.bwd_full_flops_per_s = r.curve(k, path, "bwd_full_flops_per_s", Bound::kPositive);
    model.fwd_block_m = r.integer(k, path, "fwd_block_m", Bound::kPositive);
    model.bwd_block_n = r.integer(k, path, "bwd_block_n", Bound::kPositive);
    model.head_dim = r.integer(k, path, "head_dim", Bound::kPositive);
    hw.attention_kernels.emplace(kernel_name, std::move(model));
  }

  const Json& overheads =
      r.section(root, "", "memory_overheads",
                {"cuda_context_bytes", "nccl_buffers_bytes", "cublas_workspace_bytes"});
  hw.cuda_context_bytes =
      r.integer(overheads, "memory_overheads", "cuda_context_bytes", Bound::kNonNegative);
  hw.nccl_buffers_bytes =
      r.integer(overheads, "memory_overheads", "nccl_buffers_bytes", Bound::kNonNegative);
  hw.cublas_workspace_bytes =
      r.integer(overheads, "memory_overheads", "cublas_workspace_bytes", Bound::kNonNegative);

  const Json& node =
      r.section(root, "", "node",
                {"gpus_per_node", "host_memory_bytes", "host_link", "cpu_adam_params_per_s"});
  hw.gpus_per_node = to_int(r.integer(node, "node", "gpus_per_node", Bound::kPositive),
                            r.field("node.gpus_per_node"));
  hw.host_memory_bytes_per_node = r.integer(node, "node", "host_memory_bytes", Bound::kPositive);
  hw.cpu_adam_params_per_s = r.number(node, "node", "cpu_adam_params_per_s", Bound::kPositive);
  const Json& host_link =
      r.section(node, "node", "host_link",
                {"alpha_s", "h2d_bytes_per_s", "d2h_bytes_per_s", "duplex_total_bytes_per_s"});
  hw.host_link.alpha_s = r.number(host_link, "node.host_link", "alpha_s", Bound::kNonNegative);
  hw.host_link.h2d_bytes_per_s =
      r.number(host_link, "node.host_link", "h2d_bytes_per_s", Bound::kPositive);
  hw.host_link.d2h_bytes_per_s =
      r.number(host_link, "node.host_link", "d2h_bytes_per_s", Bound::kPositive);
  hw.host_link.duplex_total_bytes_per_s =
      r.number(host_link, "node.host_link", "duplex_total_bytes_per_s", Bound::kPositive);

  const Json& collectives = r.section(root, "", "collectives", {"intra_node", "inter_node"});
  for (const auto& [span, span_key] : kSpans) {
    const std::string span_path = join_path("collectives", span_key);
    const Json& span_json =
        r.section(collectives, "collectives", span_key,
                  {"all_to_all", "all_gather", "reduce_scatter", "all_reduce", "send_recv"});
    for (const auto& [collective, collective_key] : kCollectives) {
      const std::string path = join_path(span_path, collective_key);
      const Json& c = r.section(span_json, span_path, collective_key,
                                {"alpha_s", "peak_busbw_bytes_per_s", "efficiency_by_size"});
      CollectiveModel model;
      model.alpha_s = r.number(c, path, "alpha_s", Bound::kNonNegative);
      model.peak_busbw_bytes_per_s = r.number(c, path, "peak_busbw_bytes_per_s", Bound::kPositive);
      model.efficiency_by_size = r.curve(c, path, "efficiency_by_size", Bound::kFraction);
      hw.collectives[span][collective] = std::move(model);
    }
  }
  detail::check_profile_plausible(hw, origin);
  return hw;
}

HardwareProfile load_hardware(const std::string& name_or_path,
                              const DataDir& data,
                              const std::string& field) {
  const ResolvedFile file = resolve_file(name_or_path, data, "hardware", "hardware profile",
                                         "or give a path to a profile JSON", field);
  return parse_hardware_profile(read_text_file(file.path, field), file.origin);
}

TrainingRecipe parse_recipe(const std::string& json_text, const std::string& origin) {
  const Json root = parse_json(json_text, origin);
  if (!root.is_object()) {
    throw InputError(origin, fmt::format("a recipe must be a JSON object, got {}", describe(root)));
  }
  check_schema(root, kRecipeSchema, origin);
  reject_unknown_keys(
      root,
      {"schema", "name", "description", "precision", "optimizer", "sharding",
       "activation_checkpointing", "tiled_mlp", "tiled_norm", "norm_kernel", "mlp_kernel",
       "fused_loss", "allocator", "attention_kernel", "int32_kernel_indexing"},
      origin, "");

  // Every key but `schema` is optional; absent keys keep the defaults of TrainingRecipe (alst).
  TrainingRecipe recipe;
  const auto field = [&](const std::string& path) { return field_name(origin, path); };
  const auto section = [&](std::string_view key,
                           std::initializer_list<std::string_view> known) -> const Json* {
    const Json* value = find_member(root, key);
    if (value != nullptr) {
      as_object(*value, field(std::string(key)));
      reject_unknown_keys(*value, known, origin, std::string(key));
    }
    return value;
  };
  const auto read_int = [&](const Json* object, std::string_view section_key, std::string_view key,
                            auto& out) {
    if (object == nullptr) {
      return;
    }
    if (const Json* v = find_member(*object, key)) {
      const std::string f = field(join_path(std::string(section_key), key));
      const std::int64_t value = as_int(*v, f);
      using Out = std::remove_reference_t<decltype(out)>;
      if (value < std::numeric_limits<Out>::min() || value > std::numeric_limits<Out>::max()) {
        throw InputError(f, fmt::format("{} is out of range", value));
      }
      out = static_cast<Out>(value);
    }
  };
  const auto read_bool = [&](const Json* object, std::string_view section_key, std::string_view key,
                             bool& out) {
    if (object == nullptr) {
      return;
    }
    if (const Json* v = find_member(*object, key)) {
      out = as_bool(*v, field(join_path(std::string(section_key), key)));
    }
  };

  if (const Json* name = find_member(root, "name")) {
    recipe.name = as_string(*name, field("name"));
  }
  if (recipe.name.empty()) {
    recipe.name = name_from_origin(origin);
  }
  if (const Json* description = find_member(root, "description")) {
    recipe.description = as_string(*description, field("description"));
  }

  const Json* precision =
      section("precision", {"param_bytes", "activation_bytes", "master_param_bytes", "grad_bytes",
                            "grad_reduce_bytes", "optimizer_state_bytes", "cp_comm_bytes",
                            "persistent_compute_params"});
  read_int(precision, "precision", "param_bytes", recipe.param_bytes);
  read_int(precision, "precision", "activation_bytes", recipe.activation_bytes);
  read_int(precision, "precision", "master_param_bytes", recipe.master_param_bytes);
  read_int(precision, "precision", "grad_bytes", recipe.grad_bytes);
  read_int(precision, "precision", "grad_reduce_bytes", recipe.grad_reduce_bytes);
  read_int(precision, "precision", "optimizer_state_bytes", recipe.optimizer_state_bytes);
  read_int(precision, "precision", "cp_comm_bytes", recipe.cp_comm_bytes);
  read_bool(precision, "precision", "persistent_compute_params", recipe.persistent_compute_params);

  if (const Json* optimizer = find_member(root, "optimizer")) {
    recipe.optimizer = as_string(*optimizer, field("optimizer"));
  }

  const Json* sharding = section(
      "sharding", {"zero_stage", "fsdp_prefetch_layers", "optimizer_offload", "param_offload"});
  read_int(sharding, "sharding", "zero_stage", recipe.zero_stage);
  read_int(sharding, "sharding", "fsdp_prefetch_layers", recipe.fsdp_prefetch_layers);
  read_bool(sharding, "sharding", "optimizer_offload", recipe.optimizer_offload);
  read_bool(sharding, "sharding", "param_offload", recipe.param_offload);

  const Json* ac = section("activation_checkpointing",
                           {"mode", "offload_to_host", "keep_first_last_on_gpu", "reentrant"});
  if (ac != nullptr) {
    if (const Json* mode = find_member(*ac, "mode")) {
      const std::string f = field("activation_checkpointing.mode");
      recipe.checkpointing = parse_checkpoint_mode(as_string(*mode, f), f);
    }
  }
  read_bool(ac, "activation_checkpointing", "offload_to_host", recipe.checkpoint_offload);
  read_bool(ac, "activation_checkpointing", "keep_first_last_on_gpu",
            recipe.offload_keep_first_last);
  read_bool(ac, "activation_checkpointing", "reentrant", recipe.checkpoint_reentrant);

  const Json* tiled_mlp = section("tiled_mlp", {"enabled", "shards"});
  read_bool(tiled_mlp, "tiled_mlp", "enabled", recipe.tiled_mlp);
  read_int(tiled_mlp, "tiled_mlp", "shards", recipe.tiled_mlp_shards);

  if (const Json* tiled_norm = find_member(root, "tiled_norm")) {
    recipe.tiled_norm = as_bool(*tiled_norm, field("tiled_norm"));
  }
  if (const Json* norm = find_member(root, "norm_kernel")) {
    const std::string f = field("norm_kernel");
    recipe.norm_kernel = parse_norm_kernel(as_string(*norm, f), f);
  }
  if (const Json* mlp = find_member(root, "mlp_kernel")) {
    const std::string f = field("mlp_kernel");
    recipe.mlp_kernel = parse_mlp_kernel(as_string(*mlp, f), f);
  }
  if (const Json* int32 = find_member(root, "int32_kernel_indexing")) {
    recipe.int32_kernel_indexing = as_bool(*int32, field("int32_kernel_indexing"));
  }
  if (const Json* fused_loss = find_member(root, "fused_loss")) {
    recipe.fused_loss = as_bool(*fused_loss, field("fused_loss"));
  }
  const Json* allocator = section("allocator", {"expandable_segments"});
  read_bool(allocator, "allocator", "expandable_segments", recipe.expandable_segments);
  if (const Json* kernel = find_member(root, "attention_kernel")) {
    recipe.attention_kernel = as_string(*kernel, field("attention_kernel"));
  }

  try {
    recipe.validate();
  } catch (const InputError& e) {
    rethrow_with_origin(e, "recipe.", origin);
  }
  detail::check_optimizer_offload_stage(recipe, origin);
  return recipe;
}

TrainingRecipe load_recipe(const std::string& name_or_path,
                           const DataDir& data,
                           const std::string& field) {
  const ResolvedFile file = resolve_file(name_or_path, data, "recipes", "recipe",
                                         "or give a path to a recipe JSON", field);
  return parse_recipe(read_text_file(file.path, field), file.origin);
}

std::vector<std::string> list_builtin(const DataDir& data, const std::string& kind) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(data.root / kind, ec);
  if (ec) {
    return names;
  }
  for (const fs::directory_iterator end; it != end; it.increment(ec)) {
    if (ec) {
      break;
    }
    const fs::path& p = it->path();
    std::error_code file_ec;
    if (p.extension() == ".json" && fs::is_regular_file(p, file_ec)) {
      names.push_back(p.stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace cpsim::models
