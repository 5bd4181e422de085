#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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
constexpr std::string_view kMoeWhat = "mixture-of-experts";
constexpr std::string_view kMlaWhat = "multi-head latent attention (MLA)";
constexpr std::array<RefusedKey, 7> kRefusedKeys = {{
    {"num_local_experts", kMoeWhat},
    {"num_experts", kMoeWhat},
    {"n_routed_experts", kMoeWhat},
    {"num_experts_per_tok", kMoeWhat},
    {"moe_intermediate_size", kMoeWhat},
    {"kv_lora_rank", kMlaWhat},
    {"q_lora_rank", kMlaWhat},
}};

bool is_zero_or_false(const Json& value) {
  return (value.is_number() && value.get<double>() == 0.0) ||
         (value.is_boolean() && !value.get<bool>());
}

class HfReader {
 public:
  /// `prefix`: the path of `root` inside the file ("text_config." for a multimodal config's text
  /// model), so that fields are named as the file holds them.
  HfReader(const Json& root, const std::string& origin, std::string prefix = "")
      : root_(root), origin_(origin), prefix_(std::move(prefix)) {}

  std::string field(std::string_view key) const {
    return json_field(origin_, prefix_ + std::string(key));
  }

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
  /// The key's integer, `fallback` when absent; InputError naming it unless positive.
  std::int64_t positive_int(std::string_view key, std::int64_t fallback) const {
    const Json* value = optional(key);
    return positive(key, value != nullptr ? json_integer(*value, field(key)) : fallback);
  }
  /// A required key's integer; InputError naming it unless positive.
  std::int64_t required_positive(std::string_view key) const {
    return positive(key, required_int(key));
  }
  /// The key is present with a null value (optional() treats that as absent).
  bool is_null(std::string_view key) const {
    const auto it = root_.find(key);
    return it != root_.end() && it->is_null();
  }

 private:
  std::int64_t positive(std::string_view key, std::int64_t value) const {
    if (value <= 0) {
      throw InputError(field(key), fmt::format("must be positive, got {}", value));
    }
    return value;
  }

  const Json& root_;
  const std::string& origin_;
  std::string prefix_;
};

// Whether a model's MLP is gated comes from its code, not from `hidden_act`: transformers'
// GemmaMLP applies gelu_pytorch_tanh to a gated MLP (gate_proj, up_proj, down_proj), GPT-2,
// GPT-NeoX or Starcoder2 apply GELU between two matrices (c_fc, c_proj). transformers 4.51.3,
// models/<type>/modeling_<type>.py.
constexpr std::array<std::string_view, 11> kPlainMlpModelTypes = {
    "gpt2", "gpt_neo", "gpt_neox", "gptj",  "gpt_bigcode", "starcoder2",
    "phi",  "falcon",  "opt",      "bloom", "mpt"};
constexpr std::array<std::string_view, 2> kGeGluModelTypes = {"gemma", "gemma3_text"};

// Gemma 3's text model (transformers 4.57.6 models/gemma3): Gemma3TextConfig's defaults for the
// keys a published text_config leaves out (configuration_gemma3.py:171-197), and its block: q/k
// norms, a norm after the attention and after the MLP besides the two before them
// (modeling_gemma3.py:354-356, 388-400), the MLP's act from `hidden_activation`
// (modeling_gemma3.py:119).
constexpr std::string_view kGemma3Text = "gemma3_text";
// gpt-oss (transformers 4.57.6 models/gpt_oss): GptOssConfig's default window and layer pattern
// (configuration_gpt_oss.py: sliding_window 128; layer_types alternate from a sliding first
// layer), attention biases always (`self.attention_bias = True`), sinks in every attention
// (modeling_gpt_oss.py:298).
constexpr std::string_view kGptOss = "gpt_oss";
// Llama 4's text model (transformers 4.57.6 models/llama4): Llama4TextConfig's defaults
// (configuration_llama4.py:310-394): chunks of 8192 on the layers with RoPE, a NoPE layer every
// 4th; every `interleave_moe_layer_step`-th layer a mixture of experts (Scout: every layer).
constexpr std::string_view kLlama4Text = "llama4_text";
// DeepSeek-V3 (transformers 4.57.6 models/deepseek_v3): multi-head latent attention
// (DeepseekV3Attention) and experts behind a grouped sigmoid router with a shared expert
// (DeepseekV3MoE), dense MLPs on the first `first_k_dense_replace` layers.
constexpr std::string_view kDeepseekV3 = "deepseek_v3";
constexpr std::int64_t kLlama4DefaultChunk = 8192;
constexpr std::int64_t kLlama4DefaultNoRopeInterval = 4;
constexpr std::int64_t kGptOssDefaultWindow = 128;
constexpr std::int64_t kGemma3DefaultWindow = 4096;
constexpr std::int64_t kGemma3DefaultPattern = 6;  // `sliding_window_pattern`
constexpr double kGemma3DefaultRopeTheta = 1e6;
constexpr std::int64_t kGemma3DefaultMaxPositions = 131072;

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

// Sliding-window attention, as transformers 4.57.6 reads it (configuration_<type>.py and the
// attention modules of modeling_<type>.py):
//   - the window is `sliding_window` (null: none); Qwen2 and Qwen3 keep it only when
//     `use_sliding_window` is true (their default false: configuration_qwen2.py, _qwen3.py), any
//     config with `use_sliding_window` false has none;
//   - Mistral, Phi-3, Mixtral and Qwen3-MoE apply it to every layer, whatever `layer_types` says
//     (MistralAttention sets `self.sliding_window = config.sliding_window`, modeling_mistral.py:
//     177; Mistral logs that it ignores layer_types; modeling_mixtral.py:289,
//     modeling_qwen3_moe.py:149); Qwen3-MoE, as Qwen2/Qwen3, only with `use_sliding_window`
//     (configuration_qwen3_moe.py:207); Qwen2-MoE's attention classes slide the layers from
//     `max_window_layers` on when `use_sliding_window` (modeling_qwen2_moe.py:458-466);
//   - otherwise `layer_types` ("full_attention", "sliding_attention"; layer_type_validation,
//     configuration_utils.py:1364-1380) says which layers, and without it the config class's own
//     rule: Qwen2/Qwen3 slide the layers from `max_window_layers` on (default 28), Ministral all.
// A config of another type with a window and no layer_types is refused: its rule was not read.
// A query sees itself and w − 1 earlier tokens (flash-attn window_size (w − 1, w − 1) with
// causal, modeling_flash_attention_utils.py:506-512; the SDPA mask kv > q − w, masking_utils.py).
constexpr std::array<std::string_view, 4> kEveryLayerWindowTypes = {"mistral", "phi3", "mixtral",
                                                                    "qwen3_moe"};
constexpr std::array<std::string_view, 4> kUseSlidingWindowTypes = {"qwen2", "qwen3", "qwen3_moe",
                                                                    "qwen2_moe"};
constexpr std::int64_t kQwenDefaultMaxWindowLayers = 28;  // Qwen2Config, Qwen3Config

std::int64_t read_window(const HfReader& hf, const std::string& model_type) {
  const Json* window = hf.optional("sliding_window");
  if (window == nullptr && model_type == kGemma3Text) {
    return kGemma3DefaultWindow;  // Gemma3TextConfig's default
  }
  if (window == nullptr && model_type == kGptOss) {
    return kGptOssDefaultWindow;  // GptOssConfig's default
  }
  if (window == nullptr || window->is_null()) {
    return 0;
  }
  const Json* use = hf.optional("use_sliding_window");
  const bool use_on = use != nullptr && json_bool(*use, hf.field("use_sliding_window"));
  if ((use != nullptr && !use_on) || (!use_on && is_one_of(model_type, kUseSlidingWindowTypes))) {
    return 0;  // the config class sets the window to None
  }
  const std::int64_t w = json_integer(*window, hf.field("sliding_window"));
  if (w <= 0) {
    throw InputError(hf.field("sliding_window"), fmt::format("must be positive, got {}", w));
  }
  return w;
}

// Llama 4's chunked layers: `layer_types` ("chunked_attention", "full_attention"), else the
// layers with RoPE (`no_rope_layers`, 1 = RoPE; default every layer but each 4th), in chunks of
// `attention_chunk_size` (null: transformers' create_chunked_causal_mask raises,
// masking_utils.py:986-988).
void read_chunked_layers(const HfReader& hf, TransformerSpec& spec) {
  if (hf.is_null("attention_chunk_size")) {
    throw InputError(hf.field("attention_chunk_size"),
                     "null: transformers' Llama 4 needs a chunk for its chunked layers "
                     "(masking_utils.py:986-988)");
  }
  const std::int64_t chunk = hf.positive_int("attention_chunk_size", kLlama4DefaultChunk);
  const auto n = static_cast<std::size_t>(spec.layers);
  std::vector<LayerAttention> layers;
  if (const Json* types = hf.optional("layer_types")) {
    if (!types->is_array() || types->size() != n) {
      throw InputError(hf.field("layer_types"),
                       fmt::format("must list one type per layer ({})", spec.layers));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::string field = hf.field(fmt::format("layer_types[{}]", i));
      const std::string type = json_string((*types)[i], field);
      if (type != "chunked_attention" && type != "full_attention") {
        throw InputError(field, fmt::format("layer type \"{}\" is not modelled for Llama 4: "
                                            "\"chunked_attention\" and \"full_attention\"",
                                            type));
      }
      layers.push_back(type == "chunked_attention" ? LayerAttention::kChunked
                                                   : LayerAttention::kFull);
    }
  } else {
    const Json* rope = hf.optional("no_rope_layers");
    const std::int64_t interval =
        hf.positive_int("no_rope_layer_interval", kLlama4DefaultNoRopeInterval);
    const bool listed = rope != nullptr && rope->is_array() && !rope->empty();
    if (listed && rope->size() != n) {
      throw InputError(hf.field("no_rope_layers"),
                       fmt::format("must list one flag per layer ({})", spec.layers));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const bool uses_rope =
          listed ? json_integer((*rope)[i], hf.field(fmt::format("no_rope_layers[{}]", i))) != 0
                 : (static_cast<std::int64_t>(i) + 1) % interval != 0;
      layers.push_back(uses_rope ? LayerAttention::kChunked : LayerAttention::kFull);
    }
  }
  spec.attention_chunk = chunk;
  spec.layer_attention = std::move(layers);
}

void read_attention_layers(const HfReader& hf, TransformerSpec& spec) {
  if (spec.model_type == kLlama4Text) {
    read_chunked_layers(hf, spec);
    return;
  }
  const Json* types = hf.optional("layer_types");
  const std::int64_t window = read_window(hf, spec.model_type);
  std::vector<LayerAttention> layers;
  if (types != nullptr) {
    const Json& list = *types;
    if (!list.is_array() || static_cast<std::int64_t>(list.size()) != spec.layers) {
      throw InputError(hf.field("layer_types"),
                       fmt::format("must list one type per layer ({})", spec.layers));
    }
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string field = hf.field(fmt::format("layer_types[{}]", i));
      const std::string type = json_string(list[i], field);
      if (type == "full_attention") {
        layers.push_back(LayerAttention::kFull);
      } else if (type == "sliding_attention") {
        layers.push_back(LayerAttention::kSliding);
      } else {
        throw InputError(field, fmt::format("layer type \"{}\" is not modelled: cpsim simulates "
                                            "\"full_attention\" and \"sliding_attention\" "
                                            "layers",
                                            type));
      }
    }
  }
  if (window == 0) {
    // No window: every layer attends causally to the whole sequence, sliding_attention layers
    // too (their attention gets a window of None: tests/models/test_hf_models.py).
    return;
  }
  const auto n = static_cast<std::size_t>(spec.layers);
  if (is_one_of(spec.model_type, kEveryLayerWindowTypes) ||
      (types == nullptr && spec.model_type == "ministral")) {
    layers.assign(n, LayerAttention::kSliding);
  } else if (types == nullptr && is_one_of(spec.model_type, kUseSlidingWindowTypes)) {
    std::int64_t from = kQwenDefaultMaxWindowLayers;
    if (const Json* max_layers = hf.optional("max_window_layers")) {
      from = json_integer(*max_layers, hf.field("max_window_layers"));
    }
    layers.assign(n, LayerAttention::kFull);
    for (std::int64_t i = std::max<std::int64_t>(from, 0); i < spec.layers; ++i) {
      layers[static_cast<std::size_t>(i)] = LayerAttention::kSliding;
    }
  } else if (types == nullptr && spec.model_type == kGemma3Text) {
    // Gemma3TextConfig: every `sliding_window_pattern`-th layer full (configuration_gemma3.py:
    // 236-242; re-saved configs also write `_sliding_window_pattern`).
    std::int64_t pattern = kGemma3DefaultPattern;
    for (const char* key : {"sliding_window_pattern", "_sliding_window_pattern"}) {
      if (const Json* value = hf.optional(key)) {
        pattern = json_integer(*value, hf.field(key));
        break;
      }
    }
    if (pattern <= 0) {
      throw InputError(hf.field("sliding_window_pattern"),
                       fmt::format("must be positive, got {}", pattern));
    }
    for (std::int64_t i = 0; i < spec.layers; ++i) {
      layers.push_back((i + 1) % pattern != 0 ? LayerAttention::kSliding : LayerAttention::kFull);
    }
  } else if (types == nullptr && spec.model_type == kGptOss) {
    for (std::int64_t i = 0; i < spec.layers; ++i) {  // GptOssConfig: (i + 1) % 2 slides
      layers.push_back((i + 1) % 2 != 0 ? LayerAttention::kSliding : LayerAttention::kFull);
    }
  } else if (types == nullptr) {
    throw InputError(hf.field("sliding_window"),
                     fmt::format("which layers of model_type '{}' use the window was not read "
                                 "from its code: give layer_types",
                                 spec.model_type));
  }
  spec.sliding_window = window;
  spec.layer_attention = std::move(layers);
}

// Mixture-of-experts MLPs, as transformers 4.57.6 builds them:
//   mixtral    MixtralSparseMoeBlock (modeling_mixtral.py:75-140): `num_local_experts` experts of
//              width `intermediate_size`, top `num_experts_per_tok`, on every layer;
//              `router_jitter_noise` > 0 multiplies the input by noise in training (:105-106);
//   qwen3_moe  Qwen3MoeSparseMoeBlock (modeling_qwen3_moe.py:213-264): `num_experts` experts of
//              width `moe_intermediate_size`, top `num_experts_per_tok`; a layer is sparse unless
//              listed in `mlp_only_layers` and when (i + 1) % `decoder_sparse_step` == 0
//              (:295-296), else a dense MLP of `intermediate_size`.
//   gpt_oss    GptOssMLP (modeling_gpt_oss.py:67-170): `num_local_experts` experts of width
//              `intermediate_size`, top `num_experts_per_tok`, on every layer; the router
//              Linear(h, E) has a bias, the top k logits are softmaxed (renormalised weights), and
//              every expert's gate_up [h, 2f] and down [f, h] carry biases (:74-77, 149-157); the
//              GLU is clamped (ActivationKind::kClampedQuickGeGlu).
// Mixtral, Qwen3-MoE: router Linear(h, E, bias=False), softmax in fp32, top-k, the k weights
// renormalised (Qwen3-MoE when `norm_topk_prob`), a gated MLP per expert. Routing-loss terms
// (the load-balancing loss of `output_router_logits`) are a few [s, E] ops, not modelled.
//   qwen2_moe  Qwen2MoeSparseMoeBlock (modeling_qwen2_moe.py:590-650): as Qwen3-MoE, plus a shared
//              expert of width `shared_expert_intermediate_size` on every token, its output
//              scaled by sigmoid(shared_expert_gate(x)) (:602-603, 643-646).
//   llama4_text Llama4TextMoe (modeling_llama4.py:147-165): `num_local_experts` experts of width
//              `intermediate_size`, top `num_experts_per_tok` by sigmoid scores (not
//              renormalised), and a shared expert of the same width without a gate
//              (Llama4TextMLP(config), :79-84, 155); dense layers (`intermediate_size_mlp`) where
//              `moe_layers` leaves them (:380-384), refused.
//   deepseek_v3 DeepseekV3MoE (modeling_deepseek_v3.py): `n_routed_experts` experts of width
//              `moe_intermediate_size`, top `num_experts_per_tok` by DeepseekV3TopkRouter (sigmoid
//              scores, groups `n_group`/`topk_group`, renormalised with `norm_topk_prob`, scaled
//              by `routed_scaling_factor`), a shared expert of width moe_intermediate_size ·
//              `n_shared_experts` without a gate; layers below `first_k_dense_replace` dense.
constexpr std::array<std::string_view, 6> kMoeModelTypes = {"mixtral", "qwen3_moe", "qwen2_moe",
                                                            kGptOss,   kLlama4Text, kDeepseekV3};

// The layers listed in `key` (layer indices) as a set of flags; refused out of range.
std::vector<bool> listed_layers(const HfReader& hf,
                                const Json& list,
                                std::string_view key,
                                std::int64_t layers) {
  std::vector<bool> out(static_cast<std::size_t>(layers), false);
  if (!list.is_array()) {
    throw InputError(hf.field(key), "must be a list of layer indices");
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string field = hf.field(fmt::format("{}[{}]", key, i));
    const std::int64_t layer = json_integer(list[i], field);
    if (layer < 0 || layer >= layers) {
      throw InputError(field, fmt::format("layer {} is outside 0 to {}", layer, layers - 1));
    }
    out[static_cast<std::size_t>(layer)] = true;
  }
  return out;
}

// The layer kinds from a per-layer "has experts" flag: empty when every layer has them.
std::vector<LayerMlp> layer_mlp_of(const std::vector<bool>& sparse) {
  if (std::all_of(sparse.begin(), sparse.end(), [](bool b) { return b; })) {
    return {};
  }
  std::vector<LayerMlp> out;
  for (const bool b : sparse) {
    out.push_back(b ? LayerMlp::kExperts : LayerMlp::kDense);
  }
  return out;
}

// Qwen2-MoE and Qwen3-MoE: layer i has experts unless listed in `mlp_only_layers`, when
// (i + 1) % `decoder_sparse_step` == 0 (modeling_qwen3_moe.py:295-296,
// modeling_qwen2_moe.py:659-660); else a dense MLP of `intermediate_size`.
void read_qwen_sparse_layers(const HfReader& hf, TransformerSpec& spec) {
  const std::int64_t step = hf.positive_int("decoder_sparse_step", 1);
  std::vector<bool> dense(static_cast<std::size_t>(spec.layers), false);
  if (const Json* only = hf.optional("mlp_only_layers")) {
    dense = listed_layers(hf, *only, "mlp_only_layers", spec.layers);
  }
  std::vector<bool> sparse;
  for (std::int64_t i = 0; i < spec.layers; ++i) {
    sparse.push_back(!dense[static_cast<std::size_t>(i)] && (i + 1) % step == 0);
  }
  spec.layer_mlp = layer_mlp_of(sparse);
}

// Llama 4's experts: the layers in `moe_layers` (default every `interleave_moe_layer_step`-th from
// step − 1, configuration_llama4.py:381-386) have experts and a shared expert as wide as a routed
// one, the others a dense MLP of `intermediate_size_mlp` (modeling_llama4.py:380-384).
void read_llama4_moe(const HfReader& hf, TransformerSpec& spec) {
  spec.moe.experts = hf.required_int("num_local_experts");
  spec.moe.expert_ffn_hidden = spec.ffn_hidden;
  spec.moe.shared_ffn_hidden = spec.ffn_hidden;
  const std::int64_t step = hf.positive_int("interleave_moe_layer_step", 1);
  std::vector<bool> sparse;
  if (const Json* layers = hf.optional("moe_layers")) {
    sparse = listed_layers(hf, *layers, "moe_layers", spec.layers);
  } else {
    for (std::int64_t i = 0; i < spec.layers; ++i) {
      sparse.push_back(i >= step - 1 && (i - (step - 1)) % step == 0);
    }
  }
  spec.layer_mlp = layer_mlp_of(sparse);
  if (!spec.layer_mlp.empty()) {
    spec.ffn_hidden = hf.required_int("intermediate_size_mlp");
  }
  if (const Json* noise = hf.optional("router_jitter_noise");
      noise != nullptr && json_number(*noise, hf.field("router_jitter_noise")) != 0.0) {
    throw InputError(hf.field("router_jitter_noise"),
                     "the router's training noise is not modelled");
  }
}

// DeepSeek-V3's experts and router; the first `first_k_dense_replace` layers are dense
// (DeepseekV3DecoderLayer: experts when layer_idx >= first_k_dense_replace).
void read_deepseek_moe(const HfReader& hf, TransformerSpec& spec) {
  MoeSpec& e = spec.moe;
  e.experts = hf.required_int("n_routed_experts");
  e.expert_ffn_hidden = hf.required_int("moe_intermediate_size");
  const std::int64_t shared = hf.required_int("n_shared_experts");
  if (shared < 0) {
    throw InputError(hf.field("n_shared_experts"),
                     fmt::format("must not be negative, got {}", shared));
  }
  e.shared_ffn_hidden = e.expert_ffn_hidden * shared;
  e.renormalize = json_bool(hf.required("norm_topk_prob"), hf.field("norm_topk_prob"));
  e.groups = hf.required_int("n_group");
  e.group_topk = hf.required_int("topk_group");
  e.routed_scaling =
      json_number(hf.required("routed_scaling_factor"), hf.field("routed_scaling_factor"));
  if (e.groups <= 0 || e.experts % e.groups != 0) {
    throw InputError(hf.field("n_group"),
                     fmt::format("must divide the {} experts, got {}", e.experts, e.groups));
  }
  if (e.group_topk <= 0 || e.group_topk > e.groups) {
    throw InputError(
        hf.field("topk_group"),
        fmt::format("must be between 1 and the {} groups, got {}", e.groups, e.group_topk));
  }
  const std::int64_t dense = hf.required_int("first_k_dense_replace");
  if (dense < 0 || dense >= spec.layers) {
    throw InputError(hf.field("first_k_dense_replace"),
                     fmt::format("must be between 0 and {}, got {}", spec.layers - 1, dense));
  }
  std::vector<bool> sparse;
  for (std::int64_t i = 0; i < spec.layers; ++i) {
    sparse.push_back(i >= dense);
  }
  spec.layer_mlp = layer_mlp_of(sparse);
}

void read_moe(const HfReader& hf, TransformerSpec& spec) {
  if (spec.model_type == kDeepseekV3) {
    read_deepseek_moe(hf, spec);
  } else if (spec.model_type == kLlama4Text) {
    read_llama4_moe(hf, spec);
  } else if (spec.model_type == kGptOss) {
    spec.moe.experts = hf.required_int("num_local_experts");
    spec.moe.expert_ffn_hidden = spec.ffn_hidden;
    spec.moe.renormalize = true;  // softmax over the top k logits, modeling_gpt_oss.py:156
    spec.moe.biases = true;
  } else if (spec.model_type == "mixtral") {
    spec.moe.experts = hf.required_int("num_local_experts");
    spec.moe.expert_ffn_hidden = spec.ffn_hidden;
    spec.moe.renormalize = true;  // modeling_mixtral.py:113
    if (const Json* noise = hf.optional("router_jitter_noise");
        noise != nullptr && json_number(*noise, hf.field("router_jitter_noise")) != 0.0) {
      throw InputError(hf.field("router_jitter_noise"),
                       "the router's training noise is not modelled (Mixtral's default is 0)");
    }
  } else {
    spec.moe.experts = hf.required_int("num_experts");
    spec.moe.expert_ffn_hidden = hf.required_int("moe_intermediate_size");
    if (spec.model_type == "qwen2_moe") {
      spec.moe.shared_ffn_hidden = hf.required_int("shared_expert_intermediate_size");
      spec.moe.shared_gate = true;
    }
    if (const Json* norm = hf.optional("norm_topk_prob")) {  // default false
      spec.moe.renormalize = json_bool(*norm, hf.field("norm_topk_prob"));
    }
    read_qwen_sparse_layers(hf, spec);
  }
  spec.moe.experts_per_token = hf.required_int("num_experts_per_tok");
  if (spec.moe.experts <= 0) {
    throw InputError(
        hf.field(spec.model_type == "qwen3_moe" || spec.model_type == "qwen2_moe" ? "num_experts"
                 : spec.model_type == kDeepseekV3 ? "n_routed_experts"
                                                  : "num_local_experts"),
        fmt::format("must be positive, got {}", spec.moe.experts));
  }
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

// DeepSeek-V3's multi-head latent attention (DeepseekV3Attention, modeling_deepseek_v3.py): a
// query and a key head are qk_nope_head_dim + qk_rope_head_dim wide, a value head
// v_head_dim; q from a latent of `q_lora_rank` (null: from x), k and v from one of
// `kv_lora_rank`. DeepseekV3Config sets `head_dim` to qk_rope_head_dim (the RoPE width), so a
// saved config's head_dim is not the attention's.
void read_mla(const HfReader& hf, TransformerSpec& spec) {
  MlaSpec& a = spec.mla;
  a.kv_lora_rank = hf.required_positive("kv_lora_rank");
  if (!hf.is_null("q_lora_rank")) {
    a.q_lora_rank = hf.required_int("q_lora_rank");
  }
  a.rope_head_dim = hf.required_int("qk_rope_head_dim");
  const std::int64_t nope = hf.required_positive("qk_nope_head_dim");
  spec.head_dim = nope + a.rope_head_dim;
  spec.v_head_dim = hf.required_int("v_head_dim");
  spec.notes.emplace_back(fmt::format(
      "DeepSeek-V3: multi-head latent attention; q/k heads {} wide ({} + {} RoPE), v and output "
      "heads {}",
      spec.head_dim, nope, a.rope_head_dim, spec.v_head_dim));
}

// DeepSeek-V3: what its model does beyond the modelled block, printed as notes; what is read
// elsewhere (read_mla, read_deepseek_moe).
void read_deepseek_v3(const HfReader& hf, TransformerSpec& spec) {
  if (const Json* act = hf.optional("hidden_act")) {
    spec.activation = parse_activation(json_string(*act, hf.field("hidden_act")), spec.model_type,
                                       hf.field("hidden_act"));
  }
  spec.notes.emplace_back(
      "DeepSeek-V3: the router's grouped sigmoid top-k (DeepseekV3TopkRouter) is timed and held "
      "as the softmax top-k router: [s, E] fp32 scores per token");
  if (const Json* mtp = hf.optional("num_nextn_predict_layers");
      mtp != nullptr && json_integer(*mtp, hf.field("num_nextn_predict_layers")) > 0) {
    spec.notes.emplace_back(
        "DeepSeek-V3: its multi-token prediction layers (num_nextn_predict_layers) are not "
        "built by transformers and not modelled; the step trains the main model only");
  }
}

// Gemma 3's text model: its activation key and the class defaults of what a text_config omits.
void read_gemma3_text(const HfReader& hf, TransformerSpec& spec) {
  std::string act = "gelu_pytorch_tanh";
  if (const Json* value = hf.optional("hidden_activation")) {
    act = json_string(*value, hf.field("hidden_activation"));
  }
  spec.activation = parse_activation(act, spec.model_type, hf.field("hidden_activation"));
  if (hf.optional("tie_word_embeddings") == nullptr) {
    spec.tied_embeddings = true;
  }
  if (hf.optional("max_position_embeddings") == nullptr) {
    spec.max_position_embeddings = kGemma3DefaultMaxPositions;
  }
  spec.notes.emplace_back(
      "Gemma 3: the embedding's scaling by sqrt(hidden) (one elementwise op on the embeddings) is "
      "not modelled");
  if (const Json* both = hf.optional("use_bidirectional_attention");
      both != nullptr && json_bool(*both, hf.field("use_bidirectional_attention"))) {
    throw InputError(hf.field("use_bidirectional_attention"),
                     "bidirectional attention is not modelled: cpsim simulates causal attention");
  }
}

// Llama 4's text model: what its block does beyond the modelled ones, printed as notes.
void read_llama4_text(const HfReader& hf, TransformerSpec& spec) {
  if (const Json* act = hf.optional("hidden_act")) {
    spec.activation = parse_activation(json_string(*act, hf.field("hidden_act")), spec.model_type,
                                       hf.field("hidden_act"));
  }
  const Json* qk = hf.optional("use_qk_norm");
  if (qk == nullptr || json_bool(*qk, hf.field("use_qk_norm"))) {
    spec.notes.emplace_back(
        "Llama 4: the weightless L2 norm of q and k on its RoPE layers (Llama4TextL2Norm, an fp32 "
        "elementwise pass) is not modelled");
  }
  spec.notes.emplace_back(
      "Llama 4: its router's sigmoid scores multiply each expert's input, and its NoPE layers "
      "skip RoPE and scale q by a temperature; modelled as the top-k block and RoPE on every "
      "layer");
}

// Which attention projections carry biases is each model type's code, not always the config
// (transformers 4.57.6 modeling_<type>.py, the q_proj and o_proj Linears):
//   - q, k, v and o with `attention_bias` (default false): Llama and the models built as it;
//   - q, k and v always, o never: Qwen2 (modeling_qwen2.py:134-137); Qwen2-MoE with `qkv_bias`
//     (default true; modeling_qwen2_moe.py:305-308);
//   - none, whatever `attention_bias` says: Mistral, Mixtral, Ministral, Phi-3;
//   - always all four: gpt-oss (GptOssConfig sets attention_bias = True).
// Another type with `attention_bias` true is refused: its projections were not read.
constexpr std::array<std::string_view, 12> kBiasFromKeyTypes = {
    "llama", "qwen3", "qwen3_moe", "gemma",  "gemma2",    kGemma3Text,
    "olmo",  "olmo2", "granite",   "cohere", kLlama4Text, ""};
constexpr std::array<std::string_view, 4> kNoBiasTypes = {"mistral", "mixtral", "ministral",
                                                          "phi3"};

void read_attention_biases(const HfReader& hf, TransformerSpec& spec) {
  const Json* key = hf.optional("attention_bias");
  const bool on = key != nullptr && json_bool(*key, hf.field("attention_bias"));
  if (spec.model_type == kGptOss) {
    spec.qkv_bias = spec.output_proj_bias = true;
  } else if (spec.model_type == kDeepseekV3 && on) {
    throw InputError(hf.field("attention_bias"),
                     "biases on DeepSeek-V3's latent projections (q_a_proj, kv_a_proj_with_mqa, "
                     "o_proj) are not modelled");
  } else if (spec.model_type == "qwen2") {
    spec.qkv_bias = true;
  } else if (spec.model_type == "qwen2_moe") {
    const Json* qkv = hf.optional("qkv_bias");
    spec.qkv_bias = qkv == nullptr || json_bool(*qkv, hf.field("qkv_bias"));
  } else if (is_one_of(spec.model_type, kBiasFromKeyTypes)) {
    spec.qkv_bias = spec.output_proj_bias = on;
  } else if (on && !is_one_of(spec.model_type, kNoBiasTypes)) {
    throw InputError(hf.field("attention_bias"),
                     fmt::format("which attention projections of model_type '{}' carry a bias "
                                 "was not read from its code",
                                 spec.model_type));
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
  if (const Json* model_type = hf.optional("model_type")) {
    spec.model_type = json_string(*model_type, hf.field("model_type"));
    spec.qk_norm = spec.model_type == "qwen3" || spec.model_type == "qwen3_moe" ||
                   spec.model_type == kGemma3Text;
    spec.post_sublayer_norms = spec.model_type == kGemma3Text;
    if (is_one_of(spec.model_type, kPlainMlpModelTypes)) {
      throw InputError(hf.field("model_type"),
                       fmt::format("{} models have a plain two-matrix MLP; only gated MLPs "
                                   "(SwiGLU, GeGLU) are modelled",
                                   spec.model_type));
    }
  }
  read_attention_biases(hf, spec);
  if (spec.model_type == kGemma3Text) {
    read_gemma3_text(hf, spec);
  } else if (spec.model_type == kLlama4Text) {
    read_llama4_text(hf, spec);
  } else if (spec.model_type == kDeepseekV3) {
    read_deepseek_v3(hf, spec);
  } else if (spec.model_type == kGptOss) {
    // GptOssExperts computes its own GLU whatever `hidden_act` says (modeling_gpt_oss.py:100-106);
    // its clamp is a constant of the code (`self.limit = 7.0`), not the config's swiglu_limit.
    spec.activation = ActivationKind::kClampedQuickGeGlu;
    spec.attention_sinks = true;
    spec.notes.emplace_back(
        "gpt-oss: trained as bf16 weights; a checkpoint's quantization_config (MXFP4 experts) is "
        "for inference and is not modelled");
  } else if (const Json* act = hf.optional("hidden_act")) {
    spec.activation = parse_activation(json_string(*act, hf.field("hidden_act")), spec.model_type,
                                       hf.field("hidden_act"));
  }
}

// YaRN's parameters from a rope_scaling or rope_parameters object at `path` whose type is "yarn"
// (transformers 4.57.6 modeling_rope_utils.py _compute_yarn_parameters and its validation):
// factor required, original_max_position_embeddings from it or the config's
// max_position_embeddings, beta_fast 32 and beta_slow 1 unless given, mscale and mscale_all_dim
// as given. Other scaling types change no cost and are not read.
void read_yarn(const HfReader& hf,
               const Json& scaling,
               const std::string& path,
               TransformerSpec& spec) {
  const Json* type = find_member(scaling, "rope_type");
  std::string type_key = path + ".rope_type";
  if (type == nullptr) {
    type = find_member(scaling, "type");
    type_key = path + ".type";
  }
  if (type == nullptr || json_string(*type, hf.field(type_key)) != "yarn") {
    return;
  }
  const auto number = [&](std::string_view key) -> std::optional<double> {
    const Json* v = find_member(scaling, key);
    if (v == nullptr) {
      return std::nullopt;
    }
    const std::string field = hf.field(fmt::format("{}.{}", path, key));
    const double x = json_number(*v, field);
    if (!(x > 0.0) && key != "mscale" && key != "mscale_all_dim") {
      throw InputError(field, fmt::format("must be positive, got {}", x));
    }
    return x;
  };
  YarnScaling y;
  const std::optional<double> factor = number("factor");
  if (!factor) {
    throw InputError(hf.field(path + ".factor"), "required key is missing (YaRN's factor)");
  }
  y.factor = *factor;
  y.original_max_position_embeddings = spec.max_position_embeddings;
  if (const Json* original = find_member(scaling, "original_max_position_embeddings")) {
    const std::string field = hf.field(path + ".original_max_position_embeddings");
    y.original_max_position_embeddings = json_integer(*original, field);
    if (y.original_max_position_embeddings <= 0) {
      throw InputError(field,
                       fmt::format("must be positive, got {}", y.original_max_position_embeddings));
    }
  }
  y.beta_fast = number("beta_fast").value_or(32.0);
  y.beta_slow = number("beta_slow").value_or(1.0);
  y.mscale = number("mscale");
  y.mscale_all_dim = number("mscale_all_dim");
  spec.yarn = y;
}

void read_rope(const HfReader& hf, TransformerSpec& spec) {
  // RoPE: legacy rope_theta (+ rope_scaling), or transformers v5 rope_parameters, which wins.
  if (spec.model_type == kGemma3Text) {
    spec.rope_theta = kGemma3DefaultRopeTheta;  // the global layers'; local ones use 1e4
  }
  if (const Json* theta = hf.optional("rope_theta")) {
    spec.rope_theta = json_number(*theta, hf.field("rope_theta"));
  }
  if (const Json* scaling = hf.optional("rope_scaling"); scaling && !scaling->is_null()) {
    json_object(*scaling, hf.field("rope_scaling"));  // scaling does not change cost; shape checked
    read_yarn(hf, *scaling, "rope_scaling", spec);
  }
  if (const Json* params = hf.optional("rope_parameters")) {
    json_object(*params, hf.field("rope_parameters"));
    read_yarn(hf, *params, "rope_parameters", spec);
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

namespace {

// A decoder's config object (the file's root, or a multimodal config's text_config) into a spec
// without its names.
TransformerSpec read_text_model(const HfReader& hf, const Json& root, const std::string& origin) {
  const Json* type = hf.optional("model_type");
  const bool moe_type =
      type != nullptr && type->is_string() && is_one_of(type->get<std::string>(), kMoeModelTypes);
  const bool mla_type = moe_type && type->get<std::string>() == kDeepseekV3;
  for (const auto& refused : kRefusedKeys) {
    if ((moe_type && refused.what == kMoeWhat) || (mla_type && refused.what == kMlaWhat)) {
      continue;  // read_moe, read_mla
    }
    const Json* value = hf.optional(refused.key);
    if (value != nullptr && !is_zero_or_false(*value)) {
      throw InputError(hf.field(refused.key),
                       fmt::format("{} models are not modelled yet (mixture-of-experts: "
                                   "model_type mixtral, qwen3_moe, qwen2_moe, gpt_oss, llama4 and "
                                   "deepseek_v3; MLA: deepseek_v3)",
                                   refused.what));
    }
  }

  detail::check_modelled_architecture(root, origin);

  TransformerSpec spec;
  read_shape(hf, spec);
  if (mla_type) {
    read_mla(hf, spec);
  }
  read_architecture(hf, spec);
  if (moe_type) {
    read_moe(hf, spec);
  }
  read_attention_layers(hf, spec);
  read_rope(hf, spec);
  return spec;
}

}  // namespace

// Llama 4 (model_type llama4, Llama4Config: configuration_llama4.py:397) holds its text model in
// `text_config` (model_type llama4_text); its vision encoder and projector are not modelled.
TransformerSpec parse_hf_config(const std::string& json_text, const std::string& origin) {
  const Json root = parse_json(json_text, origin);
  if (!root.is_object()) {
    throw InputError(
        origin, fmt::format("a config.json must be a JSON object, got {}", describe_json(root)));
  }
  const HfReader hf(root, origin);
  TransformerSpec spec;
  const Json* type = hf.optional("model_type");
  if (type != nullptr && type->is_string() && type->get<std::string>() == "llama4") {
    const Json* text = hf.optional("text_config");
    if (text == nullptr || !text->is_object()) {
      throw InputError(hf.field("text_config"), "a Llama 4 config holds its text model here");
    }
    Json text_model = *text;
    if (!text_model.contains("model_type")) {
      text_model["model_type"] = std::string(kLlama4Text);
    }
    spec = read_text_model(HfReader(text_model, origin, "text_config."), text_model, origin);
    spec.notes.emplace_back(
        "Llama 4: the text model of a multimodal config; the vision encoder and its projector "
        "(their parameters and activations) are not modelled");
  } else {
    spec = read_text_model(hf, root, origin);
  }
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
