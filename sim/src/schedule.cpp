// Entry point of the schedule builders: validation of a configuration (the checks every method
// shares; each CP implementation in methods/ adds its own), its head layout, the per-rank attention
// buffer sizes, and build_step. The step itself is built in step_builder.cpp (block structure,
// ZeRO/FSDP, checkpointing, loss, optimizer); each method's attention block comes from its
// implementation (methods/<name>.cpp, calling the schemes in attention_*.cpp).
//
// Activation checkpointing decides what the first forward saves and what runs again:
//   none       forward runs with autograd: every tensor a backward op reads stays alive.
//   selective  as none, except that the attention core (Q and K/V all-to-alls and core attention
//              forward) is not saved and runs again before attention backward (Ulysses family);
//              UPipe's and FPDT's custom ops already choose what they save, so selective equals
//              none for them.
//   full       forward saves only each block's input (offloaded to pinned host memory on all but
//              the first and last block when the recipe says so); before each block's backward the
//              whole block forward runs again with autograd (the "recompute" phase), then backward.
#include "cpsim/sim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/pipeline.hpp"

#include "methods/common.hpp"
#include "step_builder.hpp"

namespace cpsim::sim {
namespace {

constexpr std::int64_t kMaxSeqLen = std::int64_t{1} << 34;  // 16G tokens: beyond any real run
constexpr double kMaxStepSeconds = 1e7;

ConfigIssue issue(Quantity q, std::string message) {
  return ConfigIssue{q, std::move(message)};
}

// The checks every method shares, in the order the user reads them: GPUs and degrees, the
// method's ring rule, the range of the sequence length, the heads, then the sequence multiples.
std::optional<ConfigIssue> check_degrees(const ScheduleInputs& in, const CpScheme& method) {
  const auto& p = in.parallel;
  if (p.gpus < 1 || p.gpus > 65536) {
    return issue(Quantity::kGpus, fmt::format("must be between 1 and 65536, got {}", p.gpus));
  }
  if (p.gpus_per_node < 1) {
    return issue(Quantity::kGpusPerNode,
                 fmt::format("must be at least 1, got {}", p.gpus_per_node));
  }
  if (p.cp_degree < 1 || p.gpus % p.cp_degree != 0) {
    return issue(Quantity::kCpDegree,
                 fmt::format("CP degree {} must divide --gpus {}", p.cp_degree, p.gpus));
  }
  if (p.ring_degree < 1 || p.cp_degree % p.ring_degree != 0) {
    return issue(Quantity::kRingDegree, fmt::format("ring degree {} must divide the CP degree {}",
                                                    p.ring_degree, p.cp_degree));
  }
  return method.check_ring_degree(p);
}

std::optional<ConfigIssue> check_sequence_range(const ScheduleInputs& in) {
  const auto& m = in.model;
  const auto& p = in.parallel;
  if (p.seq_len <= 0) {
    return issue(Quantity::kSeqLen, "must be positive");
  }
  if (p.seq_len > kMaxSeqLen) {
    return issue(Quantity::kSeqLen,
                 fmt::format("{} tokens is beyond what cpsim models (at most {})", p.seq_len,
                             format_length(kMaxSeqLen)));
  }
  // A step whose model FLOPs alone take more than ~4 months per GPU is not a plan anyone runs, and
  // its nanosecond clock would approach the 64-bit range once recomputation is added: refuse it.
  const double lower_bound_s = models::model_step_flops(m, p.seq_len).total() /
                               static_cast<double>(p.cp_degree) / in.hardware.peak_bf16_flops_per_s;
  if (!(lower_bound_s < kMaxStepSeconds)) {
    return issue(Quantity::kSeqLen, fmt::format("{} tokens on {} would take at least {:.3g} s per "
                                                "step; cpsim refuses lengths this absurd",
                                                p.seq_len, m.name, lower_bound_s));
  }
  return std::nullopt;
}

// Lengths after the heads: a degree that cannot work is the error to report, not the default
// sequence length.
std::optional<ConfigIssue> check_sequence_multiple(const ScheduleInputs& in,
                                                   const CpScheme& method) {
  const auto& p = in.parallel;
  const bool zigzag = p.ring_layout == models::RingLayout::kZigzag && p.ring_degree > 1;
  // Sequence parallelism splits each CP rank's s tokens T ways (Megatron: s/T rows per rank;
  // TorchTitan parallelize.py:70-74 asks seq % (TP × 2 × CP) == 0).
  const std::int64_t seq_multiple = methods::layout_seq_multiple(p) * p.tp_degree;
  if (p.seq_len % seq_multiple != 0) {
    return issue(
        Quantity::kSeqLenMultiple,
        fmt::format("sequence length {} must be divisible by {}{}{}", p.seq_len, seq_multiple,
                    zigzag ? " (2 × CP degree for the zigzag layout)" : " (the CP degree)",
                    p.tp_degree > 1 ? " × the TP degree" : ""));
  }
  return method.check_sequence(in);
}

// Ulysses splits the query heads u ways; KV heads are replicated up to u when fewer.
std::optional<ConfigIssue> split_heads(const ScheduleInputs& in, HeadLayout& L) {
  const auto& m = in.model;
  const auto& p = in.parallel;
  L.cp = p.cp_degree;
  L.ring = p.ring_degree;
  L.ulysses = L.cp / L.ring;
  L.heads = m.heads;
  const std::int64_t u = L.ulysses;
  if (m.heads % u != 0) {
    return issue(Quantity::kModelHeads,
                 fmt::format("{} has {} attention heads, not divisible by the Ulysses degree {}{}: "
                             "Ulysses splits heads across ranks",
                             m.name, m.heads, u, u == p.gpus ? " (--gpus)" : ""));
  }
  if (m.kv_heads % u == 0) {
    L.kv_heads_eff = m.kv_heads;
  } else if (u % m.kv_heads == 0) {
    L.kv_heads_eff = u;  // replicate each KV head u / H_kv times
  } else {
    return issue(Quantity::kModelHeads, fmt::format("{} has {} KV heads: neither divisible by nor "
                                                    "a divisor of the Ulysses degree {}",
                                                    m.name, m.kv_heads, u));
  }
  L.kv_replication = L.kv_heads_eff / m.kv_heads;
  // A CP group of stride T spans C·T GPUs (TP inside it).
  const std::int64_t span = L.cp * p.tp_degree;
  if (span > p.gpus_per_node && span % p.gpus_per_node != 0) {
    return issue(
        Quantity::kCpDegree,
        fmt::format("a CP group spanning nodes must cover whole nodes: degree {}{} is "
                    "not a multiple of --gpus-per-node {}",
                    L.cp, p.tp_degree > 1 ? fmt::format(" × TP degree {}", p.tp_degree) : "",
                    p.gpus_per_node));
  }
  return std::nullopt;
}

// The implementation asked for (--impl), else the recipe's default for the method, else none;
// then its own constraints.
std::optional<ConfigIssue> choose_implementation(const ScheduleInputs& in,
                                                 HeadLayout& L,
                                                 const Implementation*& implementation) {
  const ResolvedImplementation resolved = resolve_implementation(in);
  if (resolved.issue) {
    return resolved.issue;
  }
  const Implementation* chosen = resolved.implementation;
  if (chosen == nullptr) {
    return std::nullopt;
  }
  const bool asked = !in.parallel.implementation.empty();
  const models::CpMethod m = in.parallel.method;
  if (in.parallel.tp_degree > 1 && !chosen->tp_refusal().empty()) {
    return issue(Quantity::kTpDegree,
                 fmt::format("{} does not run tensor parallelism (TP {}): {}", chosen->name(),
                             in.parallel.tp_degree, chosen->tp_refusal()));
  }
  if (in.parallel.pp_degree > 1 && !chosen->pp_refusal().empty()) {
    return issue(Quantity::kPpDegree,
                 fmt::format("{} does not run pipeline parallelism (PP {}): {}", chosen->name(),
                             in.parallel.pp_degree, chosen->pp_refusal()));
  }
  chosen->shape(in, L);
  if (std::optional<ConfigIssue> refused = chosen->check(in, L)) {
    if (!asked) {
      refused->message += fmt::format(
          " ({} is the default implementation of {} in recipe {}; --impl none simulates the "
          "method's scheme alone)",
          chosen->name(), models::to_string(m), in.recipe.name);
    }
    return refused;
  }
  implementation = chosen;
  return std::nullopt;
}

std::optional<ConfigIssue> check_tensor_parallel(const ScheduleInputs& in) {
  const auto& m = in.model;
  const auto& p = in.parallel;
  const int t = p.tp_degree;
  if (p.micro_batches < 1) {
    return issue(Quantity::kMicroBatches,
                 fmt::format("must be at least 1, got {}", p.micro_batches));
  }
  if (std::optional<ConfigIssue> pp = check_pipeline(in)) {
    return pp;
  }
  if (t == 1) {
    return std::nullopt;
  }
  if (t < 1 || p.gpus_per_node < 1 || p.gpus_per_node % t != 0) {
    return issue(Quantity::kTpDegree,
                 fmt::format("TP degree {} must divide --gpus-per-node {} (a TP group stays "
                             "inside a node, on its fast links)",
                             t, p.gpus_per_node));
  }
  if (p.cp_degree < 1 || p.gpus % (static_cast<std::int64_t>(t) * p.cp_degree) != 0) {
    return issue(
        Quantity::kTpDegree,
        fmt::format("TP degree {} × CP degree {} must divide --gpus {}", t, p.cp_degree, p.gpus));
  }
  // Column-parallel Q/K/V split whole heads: Megatron divides heads and query groups by T
  // (megatron/core/transformer/attention.py:364-367, utils.py divide() asserts); TorchTitan's
  // colwise wk/wv shards KV·d rows T ways and views them as heads (llama3/model/model.py:253-258).
  // Megatron's KV < T path (one replicated K/V head per rank, attention.py:353-360) is not
  // modelled.
  if (m.heads % t != 0 || m.kv_heads % t != 0) {
    return issue(Quantity::kTpDegree,
                 fmt::format("TP degree {} must divide the {} attention heads and {} KV heads of "
                             "{} (column-parallel Q/K/V split whole heads; Megatron's replicated "
                             "K/V heads for fewer KV heads than T are not modelled)",
                             t, m.heads, m.kv_heads, m.name));
  }
  if (m.ffn_hidden % t != 0) {
    return issue(Quantity::kTpDegree, fmt::format("TP degree {} must divide the FFN width {} of {}",
                                                  t, m.ffn_hidden, m.name));
  }
  return std::nullopt;
}

}  // namespace

// One tensor-parallel rank's share of the model (Megatron-style TP, Korthikanti et al. 2022 §4):
// Q/K/V and the MLP's gate/up are column parallel (H/T query heads, H_kv/T KV heads, f/T FFN
// columns per rank), the output projection and down projection row parallel (same shares of their
// input width); norms replicated; embedding and LM head vocabulary parallel (⌈V/T⌉ rows: Megatron
// pads V to a multiple of 128·T, arguments.py make_vocab_size_divisible_by, not modelled). Every
// per-rank GEMM, weight, gradient and optimizer state count follows from these shapes.
ScheduleInputs tensor_parallel_rank(const ScheduleInputs& in) {
  ScheduleInputs out = in;
  const int t = in.parallel.tp_degree;
  if (t <= 1 || in.tp_rank_model) {
    return out;
  }
  auto& m = out.model;
  m.name = fmt::format("{} (one of {} TP ranks)", in.model.name, t);
  m.heads /= t;
  m.kv_heads /= t;
  m.ffn_hidden /= t;
  m.vocab = (m.vocab + t - 1) / t;
  out.tp_rank_model = true;
  return out;
}

namespace {

// `in` itself (T = 1, or already a rank's view), else one TP rank's view kept in `storage`.
const ScheduleInputs& rank_view(const ScheduleInputs& in, std::optional<ScheduleInputs>& storage) {
  if (in.parallel.tp_degree <= 1 || in.tp_rank_model) {
    return in;
  }
  storage = tensor_parallel_rank(in);
  return *storage;
}

// Packed documents: split over the configuration's ring.
std::optional<ConfigIssue> check_documents(const ScheduleInputs& in, const HeadLayout& layout) {
  if (in.documents.empty()) {
    return std::nullopt;
  }
  if (in.documents.ring != layout.ring) {
    return ConfigIssue{Quantity::kDocuments,
                       fmt::format("the documents were split over {} ring positions, the "
                                   "configuration has {}",
                                   in.documents.ring, layout.ring)};
  }
  return std::nullopt;
}

// What differs between sliding-window and chunked layers in check_layer_mask.
struct LayerMask {
  std::string what;             // "N of L layers use a w-token sliding window"
  std::string_view under;       // "a sliding window": what documents are refused under
  std::string_view mask;        // "a window": what SDPA would take as a tensor
  std::string_view split_text;  // why a split sequence is refused, and what is modelled
  Quantity quantity = Quantity::kAttentionWindow;
  bool gathered_prefixes = false;  // modelled under K/V all-gathered (allgather)
  bool runs = true;                // the implementation's code runs the layers
  std::string_view source;         // where it says so, or why not
};

std::optional<ConfigIssue> check_layer_mask(const ScheduleInputs& in,
                                            const CpScheme& method,
                                            const HeadLayout& layout,
                                            const Implementation* implementation,
                                            const LayerMask& mask) {
  if (!in.documents.empty()) {
    return ConfigIssue{
        Quantity::kDocuments,
        fmt::format("{}; packed documents under {} are not modelled", mask.what, mask.under)};
  }
  if (implementation != nullptr && !mask.runs) {
    return ConfigIssue{mask.quantity, fmt::format("{}; {} does not run them: {}", mask.what,
                                                  implementation->name(), mask.source)};
  }
  if ((layout.ring > 1 && !(mask.gathered_prefixes && method.gathers_kv())) ||
      method.uses_fpdt_chunk()) {
    return ConfigIssue{
        mask.quantity,
        fmt::format("{}; {} splits each head's sequence ({}), and {}", mask.what,
                    models::to_string(in.parallel.method),
                    layout.ring > 1 ? fmt::format("ring degree {}", layout.ring) : "chunks",
                    mask.split_text)};
  }
  const std::string kernel =
      implementation != nullptr ? implementation->attention_kernel(in) : in.recipe.attention_kernel;
  if (kernel == "sdpa") {
    return ConfigIssue{mask.quantity,
                       fmt::format("{}; SDPA takes {} as an explicit mask tensor, which is not "
                                   "modelled: use a FlashAttention kernel (fa2, fa3)",
                                   mask.what, mask.mask)};
  }
  if (in.model.mixed_attention() && in.parallel.pp_degree > 1) {
    return ConfigIssue{Quantity::kPpDegree,
                       fmt::format("{}; pipeline stages of layers whose attention differs are "
                                   "not modelled",
                                   mask.what)};
  }
  return std::nullopt;
}

// Sliding-window layers (TransformerSpec::layer_attention): modelled where the kernel sees the
// whole sequence of its heads and takes the window itself (FlashAttention's window_size skips the
// key blocks outside it), so that a windowed block is a causal one with its attention kernels
// scaled by models::window_share (the step builder's whole_share). A ring part or FPDT's chunks
// would skip or keep ring steps and chunks as each implementation's code does, which is not
// modelled; SDPA takes a window as an explicit mask tensor, which is not either.
std::optional<ConfigIssue> check_attention_window(const ScheduleInputs& in,
                                                  const CpScheme& method,
                                                  const HeadLayout& layout,
                                                  const Implementation* implementation) {
  const models::TransformerSpec& m = in.model;
  // A window of the whole sequence or more hides nothing: those layers are causal.
  if (m.windowed_layers() == 0 || m.sliding_window >= in.parallel.seq_len) {
    return std::nullopt;
  }
  LayerMask mask{fmt::format("{} of {} layers use a {}-token sliding window", m.windowed_layers(),
                             m.layers, m.sliding_window),
                 "a sliding window",
                 "a window",
                 "ring steps or chunks under a window are not modelled: methods whose kernel "
                 "sees the whole sequence (ulysses, upipe) or gathers it (allgather) are",
                 Quantity::kAttentionWindow,
                 true,
                 true,
                 {}};
  if (implementation != nullptr) {
    const WindowSupport support = implementation->sliding_window(in.parallel.method);
    mask.runs = support.passes_window;
    mask.source = support.source;
  }
  return check_layer_mask(in, method, layout, implementation, mask);
}

// Chunked layers (Llama 4) as sliding-window ones: modelled where the kernel sees the whole
// sequence of its heads (ulysses, upipe) and skips the key blocks outside each query's chunk, so
// that a chunked block is a causal one with its attention kernels scaled by models::chunk_share;
// and where the implementation's code runs the chunks (Implementation::chunked_attention). Ring
// steps, all-gathered prefixes and FPDT's chunks under chunked layers are not modelled; SDPA
// takes the chunks as a mask tensor, which is not either.
std::optional<ConfigIssue> check_attention_chunks(const ScheduleInputs& in,
                                                  const CpScheme& method,
                                                  const HeadLayout& layout,
                                                  const Implementation* implementation) {
  const models::TransformerSpec& m = in.model;
  if (m.chunked_layers() == 0 || m.attention_chunk >= in.parallel.seq_len) {
    return std::nullopt;
  }
  LayerMask mask{fmt::format("{} of {} layers attend within {}-token chunks", m.chunked_layers(),
                             m.layers, m.attention_chunk),
                 "chunked attention",
                 "the chunks",
                 "ring steps, gathered prefixes or FPDT's chunks under attention chunks are not "
                 "modelled: methods whose kernel sees the whole sequence (ulysses, upipe) are",
                 Quantity::kAttentionChunks,
                 false,
                 true,
                 {}};
  if (implementation != nullptr) {
    const FeatureSupport support = implementation->chunked_attention(in.parallel.method);
    mask.runs = support.runs;
    mask.source = support.source;
  }
  return check_layer_mask(in, method, layout, implementation, mask);
}

// Attention sinks (gpt-oss) run where the implementation's kernel takes them under the method
// (Implementation::attention_sinks). The sinks add H parameters per layer and a softmax term;
// the kernel's time and memory are those of the kernel without them.
std::optional<ConfigIssue> check_attention_sinks(const ScheduleInputs& in,
                                                 const Implementation* implementation) {
  if (!in.model.attention_sinks || implementation == nullptr) {
    return std::nullopt;
  }
  const FeatureSupport support = implementation->attention_sinks(in.parallel.method);
  if (support.runs) {
    return std::nullopt;
  }
  return ConfigIssue{
      Quantity::kAttentionSinks,
      fmt::format("{} has attention sinks; {} does not run them under {}: {}", in.model.name,
                  implementation->name(), models::to_string(in.parallel.method), support.source)};
}

// Multi-head latent attention (DeepSeek-V3) is built by the Ulysses scheme and the methods on it
// (attention_mla.cpp) and runs where the implementation's code runs it (Implementation::
// latent_attention). Not modelled, so refused: MLA under tensor parallelism (Megatron-Core keeps
// the down projections whole on every TP rank, `parallel_mode='duplicated'`), and FP8 (the FP8
// state counts the Q/K/V weights of a plain attention).
std::optional<ConfigIssue> check_latent_attention(const ScheduleInputs& in,
                                                  const CpScheme& method,
                                                  const Implementation* implementation) {
  if (!in.model.is_mla()) {
    return std::nullopt;
  }
  const std::string_view method_name = models::to_string(in.parallel.method);
  if (!method.builds_latent_attention()) {
    return ConfigIssue{Quantity::kLatentAttention,
                       fmt::format("{} has multi-head latent attention; cpsim's {} scheme builds "
                                   "one head width for Q, K and V, not MLA's",
                                   in.model.name, method_name)};
  }
  if (in.parallel.tp_degree > 1) {
    return ConfigIssue{Quantity::kTpDegree,
                       fmt::format("{} has multi-head latent attention, whose replicated down "
                                   "projections under tensor parallelism are not modelled: TP 1",
                                   in.model.name)};
  }
  if (in.recipe.fp8) {
    return ConfigIssue{Quantity::kLatentAttention,
                       fmt::format("{} has multi-head latent attention; FP8 with MLA is not "
                                   "modelled",
                                   in.model.name)};
  }
  if (implementation == nullptr) {
    return std::nullopt;
  }
  const FeatureSupport support = implementation->latent_attention(in.parallel.method);
  if (support.runs) {
    return std::nullopt;
  }
  return ConfigIssue{
      Quantity::kLatentAttention,
      fmt::format("{} has multi-head latent attention; {} does not run it under "
                  "{}: {}",
                  in.model.name, implementation->name(), method_name, support.source)};
}

// Pipeline stages of a model with dense layers among sparse ones (DeepSeek-V3's first three) are
// simulated as stages whose every layer has experts (make_pipeline_stage): an upper bound when a
// layer with experts holds at least a dense layer's parameters per rank, 3·h·f against
// (E/E_p)·3·h·f_e + h·E + 3·h·f_s, and its tokens pass through MLPs at least as wide, k·f_e + f_s
// against f (the width of the tensors the MLP keeps per token).
bool sparse_layers_bound_dense_ones(const ScheduleInputs& in) {
  const models::TransformerSpec& m = in.model;
  const std::int64_t ep = std::max(1, in.parallel.ep_degree);
  const std::int64_t h = m.hidden;
  const std::int64_t sparse_params = m.moe.experts / ep * 3 * h * m.moe.expert_ffn_hidden +
                                     h * m.moe.experts + 3 * h * m.moe.shared_ffn_hidden;
  const std::int64_t sparse_width =
      m.moe.experts_per_token * m.moe.expert_ffn_hidden + m.moe.shared_ffn_hidden;
  return sparse_params >= 3 * h * m.ffn_hidden && sparse_width >= m.ffn_hidden;
}

// A mixture of experts runs where the implementation's code runs one (Implementation::experts),
// with expert parallelism where it splits the experts. Not modelled, so refused: expert TP under
// tensor parallelism (Megatron's sequence-parallel gather before the dispatch), FP8 experts,
// ALST's tiled MLP around a MoE block. E_p consecutive ranks of one TP position (Group::kExpert)
// must divide the experts and the ranks of a pipeline stage.
std::optional<ConfigIssue> check_experts(const ScheduleInputs& in,
                                         const Implementation* implementation) {
  const models::TransformerSpec& m = in.model;
  const models::ParallelConfig& p = in.parallel;
  if (!(p.expert_imbalance >= 1.0) || !std::isfinite(p.expert_imbalance)) {
    return ConfigIssue{Quantity::kExpertImbalance,
                       fmt::format("must be a finite number of at least 1 (the balanced share), "
                                   "got {}",
                                   p.expert_imbalance)};
  }
  if (!m.is_moe()) {
    if (p.ep_degree > 1) {
      return ConfigIssue{Quantity::kExpertParallel,
                         fmt::format("EP degree {}: {} has no experts", p.ep_degree, m.name)};
    }
    if (m.activation == models::ActivationKind::kClampedQuickGeGlu) {
      return ConfigIssue{Quantity::kExperts,
                         fmt::format("{}: a clamped GLU is modelled in experts only (gpt-oss's; "
                                     "Megatron-Core clamps in MoE only)",
                                     m.name)};
    }
    return std::nullopt;
  }
  const std::string what = fmt::format("{} has {} experts, {} per token", m.name, m.moe.experts,
                                       m.moe.experts_per_token);
  const bool clamped = m.activation == models::ActivationKind::kClampedQuickGeGlu;
  if (m.mixed_mlp() && p.pp_degree > 1 && !sparse_layers_bound_dense_ones(in)) {
    return ConfigIssue{Quantity::kPpDegree,
                       fmt::format("{} of {} layers of {} have experts, the others a dense MLP "
                                   "wider or with more parameters per rank; pipeline stages of "
                                   "such layers are not modelled",
                                   m.sparse_layers(), m.layers, m.name)};
  }
  if (implementation != nullptr) {
    const ExpertSupport support = implementation->experts(p.method);
    if (!support.runs) {
      return ConfigIssue{Quantity::kExperts, fmt::format("{}; {} does not run them: {}", what,
                                                         implementation->name(), support.source)};
    }
    if (m.moe.shared_ffn_hidden > 0 && !support.runs_shared_experts) {
      return ConfigIssue{Quantity::kExperts,
                         fmt::format("{} and a shared expert; {}'s handling of a shared expert was "
                                     "not read",
                                     what, implementation->name())};
    }
    if (clamped && support.clamped_glu_copies < 0) {
      return ConfigIssue{Quantity::kExperts,
                         fmt::format("{}; what {}'s experts keep for its clamped GLU "
                                     "(gpt-oss's) was not read",
                                     what, implementation->name())};
    }
    if (p.ep_degree > 1 && !support.expert_parallel) {
      return ConfigIssue{Quantity::kExpertParallel,
                         fmt::format("EP degree {}: {} runs every expert on each rank: {}",
                                     p.ep_degree, implementation->name(), support.source)};
    }
  }
  if (p.tp_degree > 1) {
    return ConfigIssue{Quantity::kTpDegree,
                       fmt::format("{}; experts under tensor parallelism are not modelled", what)};
  }
  if (in.recipe.activation_bytes != 2) {  // ExpertSupport's routing bytes are stated for bf16
    return ConfigIssue{Quantity::kExperts,
                       fmt::format("{}; experts with {}-byte activations are not modelled", what,
                                   in.recipe.activation_bytes)};
  }
  if (in.recipe.fp8 || in.recipe.tiled_mlp) {
    return ConfigIssue{
        Quantity::kExperts,
        fmt::format("{}; {} around experts is not modelled (--tiled-mlp off, --fp8 off)", what,
                    in.recipe.fp8 ? "FP8" : "a tiled MLP")};
  }
  if (p.ep_degree > 1 && (in.recipe.param_offload || in.recipe.optimizer_offload)) {
    return ConfigIssue{Quantity::kExpertParallel,
                       fmt::format("EP degree {}: expert parallelism with offloaded parameters or "
                                   "optimizer states is not modelled",
                                   p.ep_degree)};
  }
  const int stage_ranks = p.gpus / std::max(1, p.pp_degree);
  if (p.ep_degree < 1 || m.moe.experts % p.ep_degree != 0 || stage_ranks % p.ep_degree != 0) {
    return ConfigIssue{Quantity::kExpertParallel,
                       fmt::format("EP degree {} must divide the {} experts and the {} GPUs of a "
                                   "pipeline stage",
                                   p.ep_degree, m.moe.experts, stage_ranks)};
  }
  return std::nullopt;
}

LayoutCheck check_rank_layout(const ScheduleInputs& in) {
  const CpScheme& method = cp_scheme(in.parallel.method);
  LayoutCheck out;
  out.issue = check_degrees(in, method);
  if (!out.issue) {
    out.issue = check_sequence_range(in);
  }
  if (!out.issue) {
    out.issue = split_heads(in, out.layout);
  }
  if (!out.issue) {
    out.issue = check_sequence_multiple(in, method);
  }
  if (!out.issue) {
    out.issue = method.stage_heads(in, out.layout);
  }
  if (!out.issue) {
    out.issue = check_documents(in, out.layout);
  }
  if (!out.issue) {
    out.issue = choose_implementation(in, out.layout, out.implementation);
  }
  if (!out.issue) {
    out.issue = check_attention_window(in, method, out.layout, out.implementation);
  }
  if (!out.issue) {
    out.issue = check_attention_chunks(in, method, out.layout, out.implementation);
  }
  if (!out.issue) {
    out.issue = check_attention_sinks(in, out.implementation);
  }
  if (!out.issue) {
    out.issue = check_latent_attention(in, method, out.implementation);
  }
  if (!out.issue) {
    out.issue = check_experts(in, out.implementation);
  }
  return out;
}

}  // namespace

LayoutCheck check_head_layout(const ScheduleInputs& in) {
  if (in.parallel.tp_degree == 1 || in.tp_rank_model) {
    LayoutCheck out;
    out.issue = check_tensor_parallel(in);
    return out.issue ? out : check_rank_layout(in);
  }
  LayoutCheck out;
  // The GPU count and the CP degree first, as without TP, then TP's own rules.
  out.issue = check_degrees(in, cp_scheme(in.parallel.method));
  if (!out.issue) {
    out.issue = check_tensor_parallel(in);
  }
  std::optional<ScheduleInputs> storage;
  return out.issue ? out : check_rank_layout(rank_view(in, storage));
}

LayoutCheck checked_layout(const ScheduleInputs& in) {
  LayoutCheck checked = check_head_layout(in);
  if (checked.issue) {
    throw ConfigError(std::move(*checked.issue), in.parallel);
  }
  return checked;
}

HeadLayout derive_head_layout(const ScheduleInputs& in) {
  return checked_layout(in).layout;
}

AttentionBuffers attention_buffers(const ScheduleInputs& inputs, const HeadLayout& L) {
  std::optional<ScheduleInputs> storage;
  const ScheduleInputs& in = rank_view(inputs, storage);
  return cp_scheme(in.parallel.method).buffers(in, L);
}

// 32-bit element offsets (recipe.int32_kernel_indexing). A kernel that computes row × stride in
// int32 addresses garbage once a tensor holds 2^31 elements: Liger's RMSNorm and RoPE index rows
// of [s, h] and [s, H·d] (Liger issue #803: Llama-8B crashes just above 500K tokens per GPU,
// 500_000 × 4096 ≈ 2^31), and FlashAttention-2 its head-sharded Q/O/dQ of n_r × (H/u) × d per
// call ("FA2 as well, but FA3 solves it"). The limit is what the kernels of the recipe can address,
// not memory: it binds whatever the GPU's size.
std::string int32_index_violation(const ScheduleInputs& inputs, const HeadLayout& L) {
  if (!inputs.recipe.int32_kernel_indexing) {
    return {};
  }
  std::optional<ScheduleInputs> storage;
  const ScheduleInputs& in = rank_view(inputs, storage);
  constexpr std::int64_t kLimit = std::int64_t{1} << 31;
  const auto& m = in.model;
  const std::int64_t s = in.parallel.local_seq();
  struct Indexed {
    const char* what;
    std::int64_t rows, cols;
  };
  // The norm runs on the sequence-parallel s/T tokens under tensor parallelism.
  std::vector<Indexed> tensors = {{"RMSNorm input", s / in.parallel.tp_degree, m.hidden},
                                  {"RoPE query", s, m.heads * m.head_dim}};
  if (in.recipe.attention_kernel == "fa2") {
    const std::int64_t width = (L.heads_per_stage / L.ulysses) * m.head_dim;
    tensors.push_back({"FlashAttention-2 query", in.parallel.seq_len / L.ring, width});
  }
  for (const Indexed& t : tensors) {
    if (t.rows * t.cols >= kLimit) {
      return fmt::format(
          "32-bit kernel indexing: the {} [{} × {}] has {} elements, at or above 2^31 (recipe "
          "{}: kernels with int32 offsets crash with an illegal memory access)",
          t.what, t.rows, t.cols, t.rows * t.cols, in.recipe.name);
    }
  }
  return {};
}

// Model states per rank, P parameters, G ranks sharing the shards, bytes per parameter from the
// recipe: compute copy p (bf16), fp32 master m, gradients g, optimizer states o (ZeRO paper §5):
//   ZeRO-0  P·(p + m + g + o)                   nothing sharded
//   ZeRO-1  P·(p + g) + ⌈P/G⌉·(m + o)           optimizer states (with master) sharded
//   ZeRO-2  P·p + ⌈P/G⌉·(m + g + o)             + gradients sharded
//   ZeRO-3  ⌈P/G⌉·(p' + m + g + o)              + parameters sharded, gathered per block;
//           p' = p with a persistent compute copy (DeepSpeed), 0 for FSDP2 (the fp32 shard is
//           the master and is cast when gathered). FSDP2 bf16/fp32 gives 4 + 4 + 8 = 16 bytes.
// With optimizer offload, m and o live in pinned host memory with an fp32 gradient copy, and from
// ZeRO-2 on the GPU keeps no gradient partition (it is streamed to host as it is reduced).
// With parameter offload (ZeRO-3 offload_param) the compute-dtype shard p' moves to host too:
// the GPU keeps no model state at all between block gathers.
// DeepSpeed ZeRO-3 (recipe host_grad_partition_buffer) also keeps the rank's reduced gradient
// partitions in a flat buffer of the gradient dtype g on the optimizer's device, the host when it
// is offloaded: ⌈P/G⌉·g more host bytes beside the fp32 copy CPU Adam reads. Source:
// deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641
// deepspeed/runtime/zero/stage3.py:328 (device = cpu with offload_optimizer), :742-744
// (grad_partitions_flat_buffer, gradient_accumulation_dtype), deepspeed/runtime/engine.py:1485-1493
// (that dtype is the model's, bf16, under ZeRO); the same lines in v0.17.2, which the recipes ran.
// With tensor parallelism P is one TP rank's share (tensor_parallel_rank: sharded matrices / T,
// norms whole) and the shards are spread over the G/T ranks that hold the same share (the data-
// and context-parallel ranks: Megatron's distributed optimizer and TorchTitan's FSDP mesh both
// leave the TP dimension out).
// TransformerEngine FP8 state per rank (recipe.fp8, DelayedScaling), for the rank's share of the
// model (in.model after rank_view: heads/T, f/T). Source: NVIDIA/TransformerEngine@d0067d0.
// - Cached FP8 weights: every Linear keeps its weight quantized across micro-batches
//   (module/linear.py:479-490, is_first_microbatch) with the row-wise copy for the forward GEMM
//   and the column-wise (transposed) copy the backward's dgrad reads (Hopper's FP8 GEMM takes
//   only TN layouts): 2 bytes per weight element of Q/K/V, output projection, gate/up and down,
//   h·(H + 2H_kv)·d + H·d·h + 3·f·h per layer.
// - Scaling state: per Linear (one GEMM) 3 forward and 2 backward quantizers
//   (module/base.py:1139), each with an fp32 amax history of amax_history_len = 1024 rows
//   (DelayedScaling's default, common/recipe/__init__.py:255) and an fp32 scale
//   (quantization.py:1436-1442): 5·(1024·4 + 4) bytes per Linear, 4 Linears per layer.
std::int64_t fp8_state_bytes(const models::TransformerSpec& m) {
  constexpr std::int64_t kAmaxHistoryLen = 1024;
  constexpr std::int64_t kQuantizersPerLinear = 5;
  constexpr std::int64_t kLinearsPerLayer = 4;
  const std::int64_t weights_per_layer = m.hidden * (m.heads + 2 * m.kv_heads) * m.head_dim +
                                         m.q_width() * m.hidden + 3 * m.ffn_hidden * m.hidden;
  const std::int64_t scaling_per_layer =
      kLinearsPerLayer * kQuantizersPerLinear * (kAmaxHistoryLen * kFp32Bytes + kFp32Bytes);
  return m.layers * (2 * weights_per_layer + scaling_per_layer);
}

ModelStates model_states(const ScheduleInputs& inputs) {
  std::optional<ScheduleInputs> storage;
  const ScheduleInputs& in = rank_view(inputs, storage);
  const auto& r = in.recipe;
  // Expert parallelism: a rank holds 1/E_p of the experts, sharded over the E_p-strided ranks
  // that hold the same ones (G/E_p of them); the other parameters as before.
  const models::ParameterCount count = models::count_parameters(in.model);
  const std::int64_t ep = std::max(1, in.parallel.ep_degree);
  const std::int64_t sparse = in.model.sparse_layers();
  const std::int64_t experts = sparse * count.experts_per_layer / ep;
  const std::int64_t total = count.total - sparse * count.experts_per_layer + experts;
  const std::int64_t gpus = std::max(1, in.parallel.gpus / std::max(1, in.parallel.tp_degree));
  const std::int64_t expert_gpus = std::max<std::int64_t>(1, gpus / ep);
  const std::int64_t shard =
      (total - experts + gpus - 1) / gpus + (experts + expert_gpus - 1) / expert_gpus;
  const std::int64_t p = r.param_bytes, m = r.master_param_bytes, g = r.grad_bytes,
                     o = r.optimizer_state_bytes;
  const std::int64_t mo_gpu = r.optimizer_offload ? 0 : (m + o);
  // With optimizer offload the gradient partitions also go to host as they are reduced
  // (ZeRO-Offload, FSDP CPU offload) from ZeRO-2 on; ZeRO-0/1 keep full gradients on the GPU.
  const std::int64_t g_sharded = r.optimizer_offload ? 0 : g;
  ModelStates s;
  switch (r.zero_stage) {
    case 0:
      s.gpu_bytes = total * (p + g) + total * mo_gpu;
      break;
    case 1:
      s.gpu_bytes = total * (p + g) + shard * mo_gpu;
      break;
    case 2:
      s.gpu_bytes = total * p + shard * (g_sharded + mo_gpu);
      break;
    default:
      s.gpu_bytes =
          shard * ((r.persistent_compute_params && !r.param_offload ? p : 0) + g_sharded + mo_gpu);
      break;
  }
  if (r.fp8) {
    s.gpu_bytes += fp8_state_bytes(in.model);
  }
  // The framework's RoPE table for every position of the training length (TrainingRecipe::
  // rope_cache_bytes_per_head_dim): whole on every rank, neither sharded nor offloaded.
  s.gpu_bytes += r.rope_cache_bytes_per_head_dim * in.model.rope_head_dim() * in.parallel.seq_len *
                 (r.rope_cache_per_layer ? in.model.layers : 1);
  s.host_bytes =
      r.optimizer_offload ? (r.zero_stage == 0 ? total : shard) * (m + o + kFp32Bytes) : 0;
  if (r.param_offload && r.zero_stage == 3) {
    s.host_bytes += shard * p;
  }
  if (r.host_grad_partition_buffer && r.optimizer_offload && r.zero_stage == 3) {
    s.host_bytes += shard * g;
  }
  return s;
}

bool has_representative_rank(const ScheduleInputs& inputs) {
  // Without a ring every rank runs the same ops with the same durations (Ulysses-type all-to-alls
  // and FSDP collectives are symmetric); ring steps differ per rank (layouts, positions).
  return inputs.parallel.ring_degree == 1;
}

Workload build_step(const ScheduleInputs& inputs, const BuildOptions& options) {
  Workload w;
  build_step(inputs, w, options);
  return w;
}

void build_step(const ScheduleInputs& inputs, Workload& into, const BuildOptions& options) {
  inputs.model.validate();
  inputs.recipe.validate();
  const LayoutCheck checked = checked_layout(inputs);
  // The step of one TP rank: its share of the model (tensor_parallel_rank).
  std::optional<ScheduleInputs> storage;
  const ScheduleInputs& rank = rank_view(inputs, storage);
  // One representative rank unless asked otherwise: exact without a ring; with a ring each step
  // takes its slowest position's time (see attention_core.cpp).
  const bool fast = !options.all_ranks;
  into.clear();
  into.layout = checked.layout;
  into.implementation = checked.implementation;
  detail::StepBuilder builder(rank, checked.layout, checked.implementation, into,
                              fast ? 1 : inputs.parallel.gpus, fast && options.merge_ring_steps,
                              options.repeat_layers);
  builder.build();
}

}  // namespace cpsim::sim
