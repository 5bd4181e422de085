#pragma once
/// @file Dense decoder-only transformer (Llama/Qwen family, GQA): shape, parameter and FLOP
/// accounting.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cpsim::models {

enum class NormKind { kRmsNorm, kLayerNorm };
/// The MLP's activation. All are gated MLPs (gate, up, down: act(x·Wg) ⊙ (x·Wu) · Wd): SwiGLU
/// (Llama, Qwen), GeGLU (Gemma's gelu_pytorch_tanh) and gpt-oss's clamped GLU
/// g·σ(1.702·g)·(u + 1) with g = min(x·Wg, 7) and u = clamp(x·Wu, ±7) (transformers 4.57.6
/// GptOssExperts, modeling_gpt_oss.py:78-79, 100-106; Megatron-Core's quick_gelu GLU with
/// glu_linear_offset 1 and activation_func_clamp_value 7). A plain two-matrix MLP is not modelled.
enum class ActivationKind { kSwiGlu, kGeGlu, kClampedQuickGeGlu };
/// gpt-oss's clamp of the GLU's inputs (GptOssExperts.limit, a constant of its code).
inline constexpr double kGptOssGluLimit = 7.0;
/// A layer's attention: causal over the whole sequence, causal within a sliding window of
/// `TransformerSpec::sliding_window` tokens (each query sees itself and the window − 1 tokens
/// before it), or causal within fixed chunks of `TransformerSpec::attention_chunk` tokens (each
/// query sees the keys of its own chunk up to itself: Llama 4's chunked_attention,
/// transformers 4.57.6 masking_utils.py chunked_overlay).
enum class LayerAttention : std::uint8_t { kFull, kSliding, kChunked };

/// A mixture-of-experts MLP (Mixtral, Qwen3-MoE; transformers 4.57.6 MixtralSparseMoeBlock,
/// Qwen3MoeSparseMoeBlock): a router Linear [h → E] without bias scores the experts, each token
/// goes to its top k, each expert is a gated MLP of width `expert_ffn_hidden` (as the dense one),
/// and the token's output is the routing-weighted sum of its k experts' outputs. Every layer's MLP
/// is one when `experts` > 0. gpt-oss (GptOssMLP) adds biases to the router and to every expert's
/// linears (`biases`); Qwen2-MoE (Qwen2MoeSparseMoeBlock) adds a shared expert, a gated MLP of
/// width `shared_ffn_hidden` on every token whose output, scaled by sigmoid(x·w_g) where
/// `shared_gate`, joins the routed experts' sum.
struct MoeSpec {
  std::int64_t experts = 0;            ///< routed experts E; 0: a dense MLP
  std::int64_t experts_per_token = 0;  ///< k (top-k)
  std::int64_t expert_ffn_hidden = 0;  ///< f_e, one expert's intermediate size
  /// The k routing weights renormalised to sum to 1 (Mixtral always; Qwen3-MoE with
  /// `norm_topk_prob`): one fp32 sum per token kept for the backward.
  bool renormalize = false;
  /// The router [E] and each expert's linears (gate and up [2·f_e], down [h]) carry biases.
  bool biases = false;
  std::int64_t shared_ffn_hidden = 0;  ///< the shared expert's width; 0: none
  bool shared_gate = false;            ///< a sigmoid gate Linear(h, 1) scales the shared expert
  /// DeepSeek-V3's router (transformers 4.57.6 DeepseekV3TopkRouter, `topk_method` noaux_tc):
  /// sigmoid scores, plus a per-expert correction bias (a buffer, not a parameter) for the choice
  /// only, pick the top k among the experts of the best `group_topk` of `groups` groups; the k
  /// scores are renormalised (`renormalize`) and scaled by `routed_scaling`. groups 0: softmax.
  std::int64_t groups = 0;
  std::int64_t group_topk = 0;
  double routed_scaling = 1.0;
  bool operator==(const MoeSpec&) const = default;
};

/// Multi-head latent attention (DeepSeek-V2/V3; transformers 4.57.6 DeepseekV3Attention,
/// modeling_deepseek_v3.py; Megatron-Core MLASelfAttention). q comes from a latent of rank r_q
/// (x·W_qa [h → r_q], RMSNorm, ·W_qb [r_q → H·d]) or, with r_q = 0, straight from x (W_q
/// [h → H·d]). k and v come from one latent: x·W_kva [h → r_kv + d_r] is the latent c [r_kv]
/// and one rotated key part k_r [d_r] that every head shares; RMSNorm(c)·W_kvb
/// [r_kv → H·(d − d_r + d_v)] is each head's non-rotated key part [d − d_r] and its value [d_v].
/// Per head, q and k are d = d_nope + d_r wide (TransformerSpec::head_dim), v and the output d_v
/// (TransformerSpec::v_head_dim); every head has its own k and v (H_kv = H).
struct MlaSpec {
  std::int64_t q_lora_rank = 0;    ///< r_q; 0: q projected from x
  std::int64_t kv_lora_rank = 0;   ///< r_kv; 0: not MLA
  std::int64_t rope_head_dim = 0;  ///< d_r (qk_rope_head_dim)
  bool operator==(const MlaSpec&) const = default;
};

/// YaRN RoPE scaling as a config's rope_scaling / rope_parameters states it (transformers
/// 4.57.6 modeling_rope_utils.py _compute_yarn_parameters: beta_fast 32 and beta_slow 1 unless
/// given; mscale and mscale_all_dim only where given, else the attention factor is
/// 0.1·ln(factor) + 1). It changes no cost; launchers that define the model themselves get it.
struct YarnScaling {
  double factor = 0.0;
  std::int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale, mscale_all_dim;
  bool operator==(const YarnScaling&) const = default;
};

/// A layer's MLP in a mixture-of-experts model: the experts, or a dense gated MLP of
/// `TransformerSpec::ffn_hidden` (Qwen3-MoE's `mlp_only_layers` and `decoder_sparse_step`,
/// Llama 4's `moe_layers`).
enum class LayerMlp : std::uint8_t { kExperts, kDense };

/// Shape of a decoder-only transformer. Dimensions are element counts.
struct TransformerSpec {
  std::string name;
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;     ///< query heads H
  std::int64_t kv_heads = 0;  ///< key/value heads H_kv (GQA); equals `heads` for MHA
  std::int64_t head_dim = 0;  ///< d, a query's and a key's head width
  /// d_v, a value's and the attention output's head width; 0: d (every model but MLA).
  std::int64_t v_head_dim = 0;
  MlaSpec mla;                  ///< mla.kv_lora_rank > 0: multi-head latent attention
  std::int64_t ffn_hidden = 0;  ///< intermediate size f of a dense MLP (MoE: its dense layers')
  MoeSpec moe;                  ///< moe.experts > 0: the MLPs are mixtures of experts
  /// A mixture-of-experts model's MLP per layer; empty: every layer's is the experts.
  std::vector<LayerMlp> layer_mlp;
  std::int64_t vocab = 0;
  bool tied_embeddings = false;
  /// The final norm, LM head and loss: false for the share of a pipeline stage other than the last
  /// (sim::make_pipeline_stage); a whole model has them.
  bool has_output_layer = true;
  bool qk_norm = false;  ///< per-head RMSNorm on q and k (Qwen3, Gemma 3)
  /// A norm on the attention's and the MLP's outputs before each residual, besides the norms on
  /// their inputs (Gemma 2/3: post_attention_layernorm, post_feedforward_layernorm): four norms
  /// per layer.
  bool post_sublayer_norms = false;
  /// The Hugging Face config's `model_type` ("llama", "qwen3"); empty when the config has none.
  /// Frameworks run different model code per type (TorchTitan's RoPE: TrainingRecipe).
  std::string model_type;
  /// Biases on the q, k and v projections (Qwen2 always; Llama-style code with
  /// `attention_bias`) and on the output projection (Llama-style code only).
  bool qkv_bias = false;
  bool output_proj_bias = false;
  /// A learned logit per query head that joins every softmax's denominator (gpt-oss's `sinks`,
  /// modeling_gpt_oss.py:298): H parameters per layer; the kernel must take them.
  bool attention_sinks = false;
  NormKind norm = NormKind::kRmsNorm;
  ActivationKind activation = ActivationKind::kSwiGlu;
  double rope_theta = 10000.0;
  std::optional<YarnScaling> yarn;  ///< RoPE scaled by YaRN (rope_scaling type "yarn")
  /// Tokens a sliding-window layer's queries see (themselves included); 0: no window.
  std::int64_t sliding_window = 0;
  /// Tokens of a chunked layer's chunks; 0: no chunks.
  std::int64_t attention_chunk = 0;
  /// Each layer's attention, one per layer; empty: every layer full.
  std::vector<LayerAttention> layer_attention;
  std::int64_t max_position_embeddings = 0;
  std::string source;  ///< where the numbers come from
  /// What a Hugging Face loader takes for this model (`from_pretrained`): the hub id of a
  /// built-in (its `_name_or_path`) or the folder of a config.json given by path; empty when
  /// unknown (a config file not named config.json without `_name_or_path`).
  std::string hf_name_or_path;
  /// How the config was read where a reader could expect otherwise (head_dim against
  /// hidden_size); printed with the results as modelling notes.
  std::vector<std::string> notes;

  /// Throws InputError naming the field if any dimension is non-positive or inconsistent.
  void validate() const;
  void validate_mla() const;  ///< validate()'s checks of an MLA model

  /// Layer `layer`'s attention (0-based).
  LayerAttention attention_of(std::int64_t layer) const {
    return layer_attention.empty() ? LayerAttention::kFull
                                   : layer_attention[static_cast<std::size_t>(layer)];
  }
  /// Layers with a sliding window.
  std::int64_t windowed_layers() const;
  /// Layers attending within chunks.
  std::int64_t chunked_layers() const;
  /// Layers whose attention differs (full, windowed, chunked: more than one kind).
  bool mixed_attention() const {
    const std::int64_t w = windowed_layers(), c = chunked_layers();
    return (w > 0 && w < layers) || (c > 0 && c < layers);
  }
  bool is_moe() const { return moe.experts > 0; }
  /// Layer `layer`'s MLP is a mixture of experts.
  bool experts_at(std::int64_t layer) const {
    return is_moe() &&
           (layer_mlp.empty() || layer_mlp[static_cast<std::size_t>(layer)] == LayerMlp::kExperts);
  }
  /// Layers whose MLP is a mixture of experts (0 for a dense model).
  std::int64_t sparse_layers() const;
  /// Some layers with experts and some with a dense MLP.
  bool mixed_mlp() const { return is_moe() && sparse_layers() < layers; }
  /// The width of the MLP a token passes through: one expert's (MoE) or the dense MLP's.
  std::int64_t mlp_width() const { return is_moe() ? moe.expert_ffn_hidden : ffn_hidden; }
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  /// d_v: v_head_dim, or d when not set.
  std::int64_t value_head_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  std::int64_t q_width() const { return heads * head_dim; }
  std::int64_t kv_width() const { return kv_heads * head_dim; }
  /// The width RoPE rotates per head: d_r under MLA, else d.
  std::int64_t rope_head_dim() const { return is_mla() ? mla.rope_head_dim : head_dim; }
  /// The attention output's width, the output projection's input: H·d_v.
  std::int64_t o_width() const { return heads * value_head_dim(); }
  /// A key and a value per KV head, together: H_kv·(d + d_v) (2·H_kv·d but under MLA).
  std::int64_t kv_pair_width() const { return kv_heads * (head_dim + value_head_dim()); }
};

/// Parameter counts. Derivation (gated MLP, RMSNorm, no biases unless stated):
///   attention  = h·(H·d) [Wq] + 2·h·(H_kv·d) [Wk, Wv] + (H·d)·h [Wo] (+ biases H·d + 2·H_kv·d
///              with qkv_bias, + h with output_proj_bias) (+ 2·d for q/k RMSNorm weights when
///              qk_norm) (+ H sinks); under MLA (MlaSpec) h·r_q + r_q·H·d [W_qa, W_qb] (h·H·d
///              when r_q = 0) + h·(r_kv + d_r) [W_kva] + r_kv·H·(d − d_r + d_v) [W_kvb]
///              + (H·d_v)·h [Wo] + r_q + r_kv (the latents' RMSNorm weights)
///   mlp        = 3·h·f (gate, up, down), every gated activation alike; a mixture of experts
///                E·3·h·f_e (the experts) + h·E (the router), with MoeSpec::biases
///                + E·(2·f_e + h) (the experts' biases) + E (the router's), with a shared expert
///                + 3·h·f_s (+ h for its gate)
///   norms      = 2·h per layer (RMSNorm weight; LayerNorm adds a bias: 4·h), twice that with
///                post_sublayer_norms
///   embeddings = V·h, plus V·h for the LM head unless tied, plus h for the final norm (neither
///                the LM head nor the final norm without the output layer: has_output_layer).
///   A mixture of experts' dense layers (layer_mlp) have 3·h·f in place of the experts, router
///   and shared expert.
struct ParameterCount {
  /// A layer's parameters (of a mixture of experts: a layer with experts); `dense_per_layer` of
  /// each of its `dense_layers` layers with a dense MLP.
  std::int64_t per_layer = 0;
  std::int64_t dense_per_layer = 0;
  std::int64_t dense_layers = 0;
  std::int64_t attention_per_layer = 0;
  std::int64_t mlp_per_layer = 0;      ///< experts and router included
  std::int64_t experts_per_layer = 0;  ///< the routed experts' weights (0 for a dense MLP)
  std::int64_t embedding = 0;          ///< input embedding table
  std::int64_t lm_head = 0;            ///< 0 when tied
  std::int64_t final_norm = 0;
  std::int64_t total = 0;
};
ParameterCount count_parameters(const TransformerSpec& spec);

/// Model FLOPs of one training step (forward + backward, no recomputation), the numerator of MFU
/// and "model TFLOP/s". Derivation for a causal sequence of N tokens:
///   dense matmuls: 2 FLOPs per multiply-add, 3 passes (fwd, dgrad, wgrad): 6·N·P_matmul, where
///     P_matmul = layers·(attention + mlp weights) + lm_head weights (V·h, counted even when tied);
///     a mixture of experts counts the weights a token passes through: k·3·h·f_e + h·E
///   attention core: forward 2·N²·H·(d + d_v)/2 per layer (QKᵀ and PV, causal half; 4·N²·H·d/2
///     when d_v = d), backward 2.5× forward
///     (FlashAttention convention), so 3.5 · 2·N²·H·d per layer; a sliding-window layer has
///     causal_window_area(N, w) in place of N²/2.
struct StepFlops {
  double dense = 0.0;
  double attention = 0.0;
  double total() const { return dense + attention; }
};
StepFlops model_step_flops(const TransformerSpec& spec, std::int64_t seq_len);

/// Visible (query, key) area of n causal tokens when each query sees at most w keys, in the
/// convention of the causal FLOPs above (positions as continuous coordinates, full causal: n²/2):
/// the band 0 ≤ q − k ≤ w of the n × n square, n·w − w²/2 for w < n, else n²/2. The discrete
/// count Σ min(i + 1, w) = n·w − w(w − 1)/2 differs by n − w/2 pairs out of n·w, as the causal
/// n(n + 1)/2 does from n²/2.
double causal_window_area(std::int64_t n, std::int64_t w);
/// causal_window_area(n, w) over n²/2: the share of a causal layer's attention work a window
/// keeps (1 when w ≥ n).
double window_share(std::int64_t n, std::int64_t w);
/// The share of a causal layer's attention work (n²/2) that n tokens in chunks of c keep: each
/// full chunk c²/2, the last r = n mod c tokens r²/2, so (⌊n/c⌋·c² + r²)/n² (1 for c ≥ n).
double chunk_share(std::int64_t n, std::int64_t c);
/// The same for the last q of k causal tokens (queries k − q … k against every key before them,
/// a bottom-right aligned causal block): ∫ min(p, w) dp over ∫ p dp = q·k − q²/2, p from k − q
/// to k. window_share(n, n, w) is window_share(n, w).
double window_share(std::int64_t q, std::int64_t k, std::int64_t w);

}  // namespace cpsim::models
