#include "cpsim/models/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

// Upper bounds keep every parameter and FLOP product far inside int64/double range
// (layers · h · H·d stays below 2^60). They are far above any published dense model.
constexpr std::int64_t kMaxLayers = std::int64_t{1} << 12;
constexpr std::int64_t kMaxHidden = std::int64_t{1} << 20;
constexpr std::int64_t kMaxHeads = std::int64_t{1} << 14;
constexpr std::int64_t kMaxHeadDim = std::int64_t{1} << 12;
constexpr std::int64_t kMaxFfnHidden = std::int64_t{1} << 22;
constexpr std::int64_t kMaxVocab = std::int64_t{1} << 24;

/// Field names follow the Hugging Face config.json keys, prefixed with "model.".
void check_dimension(std::int64_t value, std::int64_t max_value, const char* key) {
  if (value <= 0) {
    throw InputError(fmt::format("model.{}", key), fmt::format("must be positive, got {}", value));
  }
  if (value > max_value) {
    throw InputError(fmt::format("model.{}", key),
                     fmt::format("{} is above the supported maximum {}", value, max_value));
  }
}

/// Weights of the attention projections of one layer (Wq, Wk, Wv, Wo; MLA's down and up
/// projections), without biases or norms.
std::int64_t attention_matmul_weights(const TransformerSpec& spec) {
  const std::int64_t h = spec.hidden;
  if (spec.is_mla()) {
    const MlaSpec& a = spec.mla;
    const std::int64_t q =
        a.q_lora_rank > 0 ? h * a.q_lora_rank + a.q_lora_rank * spec.q_width() : h * spec.q_width();
    const std::int64_t k_nope_and_v =
        spec.heads * (spec.head_dim - a.rope_head_dim + spec.value_head_dim());
    return q + h * (a.kv_lora_rank + a.rope_head_dim) + a.kv_lora_rank * k_nope_and_v +
           spec.o_width() * h;
  }
  return h * spec.q_width() + 2 * h * spec.kv_width() + spec.q_width() * h;
}

/// A mixture of experts' shared expert and its gate (MoeSpec::shared_ffn_hidden), which every
/// token passes through.
std::int64_t shared_expert_weights(const TransformerSpec& spec) {
  const MoeSpec& e = spec.moe;
  return 3 * spec.hidden * e.shared_ffn_hidden + (e.shared_gate ? spec.hidden : 0);
}

std::int64_t mlp_matmul_weights(const TransformerSpec& spec) {
  if (spec.is_moe()) {
    return spec.moe.experts * 3 * spec.hidden * spec.moe.expert_ffn_hidden +
           spec.hidden * spec.moe.experts + shared_expert_weights(spec);  // experts, router
  }
  return 3 * spec.hidden * spec.ffn_hidden;  // gate, up, down (ActivationKind: always gated)
}

/// The MLP weights one token's GEMMs read: all of a dense MLP; the router and k experts of a
/// mixture of experts.
std::int64_t mlp_active_weights(const TransformerSpec& spec) {
  if (spec.is_moe()) {
    return spec.moe.experts_per_token * 3 * spec.hidden * spec.moe.expert_ffn_hidden +
           spec.hidden * spec.moe.experts + shared_expert_weights(spec);
  }
  return mlp_matmul_weights(spec);
}

constexpr std::int64_t kMaxExperts = std::int64_t{1} << 12;

std::int64_t norm_weights(const TransformerSpec& spec) {
  return spec.norm == NormKind::kRmsNorm ? spec.hidden : 2 * spec.hidden;
}

}  // namespace

void TransformerSpec::validate() const {
  check_dimension(layers, kMaxLayers, "num_hidden_layers");
  check_dimension(hidden, kMaxHidden, "hidden_size");
  check_dimension(heads, kMaxHeads, "num_attention_heads");
  check_dimension(kv_heads, kMaxHeads, "num_key_value_heads");
  check_dimension(head_dim, kMaxHeadDim, "head_dim");
  check_dimension(ffn_hidden, kMaxFfnHidden, "intermediate_size");
  check_dimension(vocab, kMaxVocab, "vocab_size");
  if (heads % kv_heads != 0) {
    throw InputError(
        "model.num_key_value_heads",
        fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}", heads,
                    kv_heads));
  }
  if (!std::isfinite(rope_theta) || rope_theta <= 0.0) {
    throw InputError("model.rope_theta",
                     fmt::format("must be finite and positive, got {}", rope_theta));
  }
  if (sliding_window < 0) {
    throw InputError("model.sliding_window",
                     fmt::format("must not be negative, got {}", sliding_window));
  }
  if (is_moe() && sparse_layers() == 0) {
    throw InputError("model.mlp_only_layers", "no layer has experts");
  }
  if (!layer_mlp.empty() && (!is_moe() || static_cast<std::int64_t>(layer_mlp.size()) != layers)) {
    throw InputError("model.mlp_only_layers",
                     fmt::format("names {} layers' MLPs, num_hidden_layers is {}{}",
                                 layer_mlp.size(), layers, is_moe() ? "" : ", and no experts"));
  }
  if (!layer_attention.empty() && static_cast<std::int64_t>(layer_attention.size()) != layers) {
    throw InputError("model.layer_types", fmt::format("names {} layers, num_hidden_layers is {}",
                                                      layer_attention.size(), layers));
  }
  if (windowed_layers() > 0 && sliding_window == 0) {
    throw InputError("model.sliding_window",
                     "layers with sliding-window attention need a window of at least one token");
  }
  if (chunked_layers() > 0 && attention_chunk <= 0) {
    throw InputError("model.attention_chunk_size",
                     "layers with chunked attention need a chunk of at least one token");
  }
  if (is_moe()) {
    check_dimension(moe.experts, kMaxExperts, "num_experts");
    check_dimension(moe.expert_ffn_hidden, kMaxFfnHidden, "moe_intermediate_size");
    if (moe.shared_ffn_hidden != 0) {
      check_dimension(moe.shared_ffn_hidden, kMaxFfnHidden, "shared_expert_intermediate_size");
    }
    if (moe.experts_per_token <= 0 || moe.experts_per_token > moe.experts) {
      throw InputError("model.num_experts_per_tok",
                       fmt::format("must be between 1 and the {} experts, got {}", moe.experts,
                                   moe.experts_per_token));
    }
  }
  if (v_head_dim != 0) {
    check_dimension(v_head_dim, kMaxHeadDim, "v_head_dim");
  }
  if (is_mla()) {
    validate_mla();
  } else if (mla.q_lora_rank != 0 || mla.rope_head_dim != 0) {
    throw InputError("model.kv_lora_rank", "q_lora_rank or qk_rope_head_dim without MLA's latent");
  }
  if (max_position_embeddings < 0) {
    throw InputError("model.max_position_embeddings",
                     fmt::format("must not be negative, got {}", max_position_embeddings));
  }
}

void TransformerSpec::validate_mla() const {
  check_dimension(mla.kv_lora_rank, kMaxHidden, "kv_lora_rank");
  check_dimension(mla.rope_head_dim, kMaxHeadDim, "qk_rope_head_dim");
  if (mla.q_lora_rank != 0) {
    check_dimension(mla.q_lora_rank, kMaxHidden, "q_lora_rank");
  }
  if (mla.rope_head_dim >= head_dim) {
    throw InputError("model.qk_rope_head_dim",
                     fmt::format("{} leaves no non-rotated part of the {}-wide query head",
                                 mla.rope_head_dim, head_dim));
  }
  if ((head_dim + value_head_dim()) % 2 != 0) {
    throw InputError("model.v_head_dim",
                     fmt::format("q/k heads {} and v heads {} wide: an odd sum is not modelled",
                                 head_dim, value_head_dim()));
  }
  if (kv_heads != heads) {
    throw InputError("model.num_key_value_heads",
                     fmt::format("MLA gives every head its own key and value: {} KV heads for {} "
                                 "query heads",
                                 kv_heads, heads));
  }
  if (qkv_bias || output_proj_bias || qk_norm || attention_sinks) {
    throw InputError("model.attention_bias",
                     "MLA with attention biases, q/k norms or sinks is not modelled");
  }
}

std::int64_t TransformerSpec::windowed_layers() const {
  return std::count(layer_attention.begin(), layer_attention.end(), LayerAttention::kSliding);
}

std::int64_t TransformerSpec::sparse_layers() const {
  if (!is_moe()) {
    return 0;
  }
  return layer_mlp.empty() ? layers
                           : static_cast<std::int64_t>(std::count(
                                 layer_mlp.begin(), layer_mlp.end(), LayerMlp::kExperts));
}

std::int64_t TransformerSpec::chunked_layers() const {
  return std::count(layer_attention.begin(), layer_attention.end(), LayerAttention::kChunked);
}

double chunk_share(std::int64_t n, std::int64_t c) {
  if (n <= 0 || c <= 0 || c >= n) {
    return 1.0;
  }
  const auto nd = static_cast<double>(n), cd = static_cast<double>(c);
  const auto rd = static_cast<double>(n % c);
  return (static_cast<double>(n / c) * cd * cd + rd * rd) / (nd * nd);
}

double causal_window_area(std::int64_t n, std::int64_t w) {
  const auto nd = static_cast<double>(n);
  if (w >= n) {
    return nd * nd / 2.0;
  }
  const auto wd = static_cast<double>(w);
  return nd * wd - wd * wd / 2.0;
}

double window_share(std::int64_t n, std::int64_t w) {
  return n <= 0 ? 1.0 : causal_window_area(n, w) / (static_cast<double>(n) * n / 2.0);
}

double window_share(std::int64_t q, std::int64_t k, std::int64_t w) {
  if (q <= 0 || w >= k) {
    return 1.0;
  }
  const auto qd = static_cast<double>(q), kd = static_cast<double>(k), wd = static_cast<double>(w);
  const double first = kd - qd;  // the first query's position
  const double causal = qd * kd - qd * qd / 2.0;
  const double windowed = wd <= first ? qd * wd : (wd * wd - first * first) / 2.0 + (kd - wd) * wd;
  return windowed / causal;
}

ParameterCount count_parameters(const TransformerSpec& spec) {
  ParameterCount count;
  count.attention_per_layer = attention_matmul_weights(spec);
  if (spec.qkv_bias) {
    count.attention_per_layer += spec.q_width() + 2 * spec.kv_width();
  }
  if (spec.output_proj_bias) {
    count.attention_per_layer += spec.hidden;
  }
  if (spec.attention_sinks) {
    count.attention_per_layer += spec.heads;
  }
  if (spec.qk_norm) {
    count.attention_per_layer += 2 * spec.head_dim;
  }
  if (spec.is_mla()) {
    count.attention_per_layer += spec.mla.q_lora_rank + spec.mla.kv_lora_rank;  // latent norms
  }
  count.mlp_per_layer = mlp_matmul_weights(spec);
  if (spec.is_moe()) {
    const MoeSpec& e = spec.moe;
    count.experts_per_layer = e.experts * 3 * spec.hidden * e.expert_ffn_hidden;
    if (e.biases) {
      const std::int64_t expert_biases = e.experts * (2 * e.expert_ffn_hidden + spec.hidden);
      count.experts_per_layer += expert_biases;
      count.mlp_per_layer += expert_biases + e.experts;  // + the router's bias
    }
  }
  const std::int64_t norms_per_layer = spec.post_sublayer_norms ? 4 : 2;
  const std::int64_t beside_mlp = count.attention_per_layer + norms_per_layer * norm_weights(spec);
  count.per_layer = beside_mlp + count.mlp_per_layer;
  count.dense_layers = spec.is_moe() ? spec.layers - spec.sparse_layers() : 0;
  count.dense_per_layer =
      count.dense_layers > 0 ? beside_mlp + 3 * spec.hidden * spec.ffn_hidden : 0;
  count.embedding = spec.vocab * spec.hidden;
  count.lm_head = spec.tied_embeddings || !spec.has_output_layer ? 0 : spec.vocab * spec.hidden;
  count.final_norm = spec.has_output_layer ? norm_weights(spec) : 0;
  count.total = (spec.layers - count.dense_layers) * count.per_layer +
                count.dense_layers * count.dense_per_layer + count.embedding + count.lm_head +
                count.final_norm;
  return count;
}

StepFlops model_step_flops(const TransformerSpec& spec, std::int64_t seq_len) {
  const auto n = static_cast<double>(seq_len);
  const auto layers = static_cast<double>(spec.layers);
  // Dense layers of a mixture of experts: their MLP of ffn_hidden.
  const auto sparse = static_cast<double>(spec.is_moe() ? spec.sparse_layers() : spec.layers);
  const double matmul_weights =
      layers * static_cast<double>(attention_matmul_weights(spec)) +
      sparse * static_cast<double>(mlp_active_weights(spec)) +
      (layers - sparse) * static_cast<double>(3 * spec.hidden * spec.ffn_hidden) +
      static_cast<double>(spec.vocab * spec.hidden);
  StepFlops flops;
  flops.dense = 6.0 * n * matmul_weights;
  // Causal forward N²·H·(d + d_v) per layer (2·H·d for QKᵀ and 2·H·d_v for PV per visible
  // pair); forward + backward = 3.5 × forward. A windowed layer sees causal_window_area(N, w)
  // pairs instead of N²/2.
  const double attention_fwd =
      n * n * static_cast<double>(spec.heads * (spec.head_dim + spec.value_head_dim()));
  // A chunked layer sees chunk_share(N, c) of them.
  const auto windowed = static_cast<double>(spec.windowed_layers());
  const auto chunked = static_cast<double>(spec.chunked_layers());
  flops.attention = (layers - windowed - chunked) * 3.5 * attention_fwd;
  if (windowed > 0) {
    flops.attention += windowed * 3.5 * attention_fwd * window_share(seq_len, spec.sliding_window);
  }
  if (chunked > 0) {
    flops.attention += chunked * 3.5 * attention_fwd * chunk_share(seq_len, spec.attention_chunk);
  }
  return flops;
}

}  // namespace cpsim::models
