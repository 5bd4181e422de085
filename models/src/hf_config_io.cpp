#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/json_io.hpp"

#include "io_checks.hpp"
#include "loader_common.hpp"

namespace cpsim::models {
namespace {

using detail::name_from_origin;
using detail::resolve_file;
using detail::ResolvedFile;
using detail::rethrow_with_origin;

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

  std::string field(std::string_view key) const { return json_field(origin_, std::string(key)); }

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
    return json_integer(required(key), field(key));
  }
  const Json* optional(std::string_view key) const { return find_member(root_, key); }

 private:
  const Json& root_;
  const std::string& origin_;
};

// Whether a model's MLP is gated comes from its code, not from `hidden_act`: transformers'
// GemmaMLP applies gelu_pytorch_tanh to a gated MLP (gate_proj, up_proj, down_proj), GPT-2,
// GPT-NeoX or Starcoder2 apply GELU between two matrices (c_fc, c_proj). transformers 4.51.3,
// models/<type>/modeling_<type>.py.
constexpr std::array<std::string_view, 11> kPlainMlpModelTypes = {
    "gpt2", "gpt_neo", "gpt_neox", "gptj",  "gpt_bigcode", "starcoder2",
    "phi",  "falcon",  "opt",      "bloom", "mpt"};
constexpr std::array<std::string_view, 1> kGeGluModelTypes = {"gemma"};

bool is_one_of(std::string_view value, std::span<const std::string_view> names) {
  return std::find(names.begin(), names.end(), value) != names.end();
}

// `model_type` empty: a config without one (the built-in Llama-style files and tests).
ActivationKind parse_activation(const std::string& act,
                                const std::string& model_type,
                                const std::string& field) {
  if (act == "silu" || act == "swiglu" || act == "swish") {
    return ActivationKind::kSwiGlu;
  }
  if (act.rfind("gelu", 0) == 0) {
    if (is_one_of(model_type, kGeGluModelTypes)) {
      return ActivationKind::kGeGlu;
    }
    throw InputError(
        field, fmt::format("'{}' with model_type '{}': a gated GELU MLP is known only for "
                           "model_type gemma; a plain GELU MLP (two matrices) is not modelled",
                           act, model_type));
  }
  throw InputError(field,
                   fmt::format("unsupported activation '{}'; known: silu, swiglu, gelu*", act));
}

}  // namespace

namespace {

// Layers, widths, heads (KV heads default to the query heads), vocabulary, head dim.
void read_shape(const HfReader& hf, TransformerSpec& spec) {
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
  spec.kv_heads = kv != nullptr ? json_integer(*kv, hf.field("num_key_value_heads")) : spec.heads;

  if (const Json* head_dim = hf.optional("head_dim")) {
    spec.head_dim = json_integer(*head_dim, hf.field("head_dim"));
  } else {
    if (spec.hidden % spec.heads != 0) {
      throw InputError(hf.field("head_dim"),
                       fmt::format("missing, and hidden_size {} is not divisible by "
                                   "num_attention_heads {}",
                                   spec.hidden, spec.heads));
    }
    spec.head_dim = spec.hidden / spec.heads;
  }
}

// Tied embeddings, context, biases, activation, model type (Qwen3's q/k norms).
void read_architecture(const HfReader& hf, TransformerSpec& spec) {
  if (const Json* tie = hf.optional("tie_word_embeddings")) {
    spec.tied_embeddings = json_bool(*tie, hf.field("tie_word_embeddings"));
  }
  if (const Json* max_pos = hf.optional("max_position_embeddings")) {
    spec.max_position_embeddings = json_integer(*max_pos, hf.field("max_position_embeddings"));
  }
  if (const Json* bias = hf.optional("attention_bias")) {
    spec.attention_bias = json_bool(*bias, hf.field("attention_bias"));
  }
  if (const Json* model_type = hf.optional("model_type")) {
    spec.model_type = json_string(*model_type, hf.field("model_type"));
    spec.qk_norm = spec.model_type == "qwen3";
    if (is_one_of(spec.model_type, kPlainMlpModelTypes)) {
      throw InputError(hf.field("model_type"),
                       fmt::format("{} models have a plain two-matrix MLP; only gated MLPs "
                                   "(SwiGLU, GeGLU) are modelled",
                                   spec.model_type));
    }
  }
  if (const Json* act = hf.optional("hidden_act")) {
    spec.activation = parse_activation(json_string(*act, hf.field("hidden_act")), spec.model_type,
                                       hf.field("hidden_act"));
  }
}

void read_rope(const HfReader& hf, TransformerSpec& spec) {
  // RoPE: legacy rope_theta (+ rope_scaling), or transformers v5 rope_parameters, which wins.
  if (const Json* theta = hf.optional("rope_theta")) {
    spec.rope_theta = json_number(*theta, hf.field("rope_theta"));
  }
  if (const Json* scaling = hf.optional("rope_scaling")) {
    json_object(*scaling, hf.field("rope_scaling"));  // scaling does not change cost; shape checked
  }
  if (const Json* params = hf.optional("rope_parameters")) {
    json_object(*params, hf.field("rope_parameters"));
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
      spec.rope_theta = json_number(*theta, hf.field(theta_key));
    }
  }
}

// The name (`name`, else the hub id, else the file's) and the source.
void read_names(const HfReader& hf, const std::string& origin, TransformerSpec& spec) {
  const Json* hub = hf.optional("_name_or_path");
  if (hub != nullptr && hub->is_string()) {
    spec.hf_name_or_path = hub->get<std::string>();
  }
  if (const Json* name = hf.optional("name")) {
    spec.name = json_string(*name, hf.field("name"));
  } else if (!spec.hf_name_or_path.empty()) {
    spec.name = spec.hf_name_or_path;
  }
  if (spec.name.empty()) {
    spec.name = name_from_origin(origin);
  }
  if (const Json* source = hf.optional("source")) {
    spec.source = json_string(*source, hf.field("source"));
  }
  if (spec.source.empty()) {
    spec.source = origin;
  }
}

}  // namespace

TransformerSpec parse_hf_config(const std::string& json_text, const std::string& origin) {
  const Json root = parse_json(json_text, origin);
  if (!root.is_object()) {
    throw InputError(
        origin, fmt::format("a config.json must be a JSON object, got {}", describe_json(root)));
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
  read_shape(hf, spec);
  read_architecture(hf, spec);
  read_rope(hf, spec);
  read_names(hf, origin, spec);

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
  TransformerSpec spec = parse_hf_config(read_text_file(file.path, field), file.origin);
  // A Hugging Face folder given by path: loaders take the folder holding config.json.
  if (!file.builtin && file.path.filename() == "config.json") {
    const std::filesystem::path folder = file.path.parent_path();
    spec.hf_name_or_path = folder.empty() ? "." : folder.string();
  }
  return spec;
}

}  // namespace cpsim::models
