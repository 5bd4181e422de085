// FPDT (fully pipelined distributed transformer, Ulysses-Offload): Ulysses over chunks of the
// sequence, with the chunks kept for backward offloaded to pinned host memory.
//
// Derivation. The global sequence is cut into N/K chunks of K tokens (K global, a multiple of C
// dividing N); each rank holds K/C tokens of every chunk. Chunk i is projected, all-to-all'd and
// attends to the K/V of chunks j ≤ i (online softmax), so attention buffers scale with K, not N:
// per chunk Q K·(H/C)·d·2 and K/V K·2(H_kv'/C)·d·2 after the all-to-all. With offloading every
// chunk's K/V, Q, output, LSE and dOut go to host as made and come back through two GPU buffers
// (double buffering); the backward loops K/V chunks outer, query chunks inner
// (attention_fpdt.cpp). One chunk is DeepSpeed's GPU-only path: plain Ulysses. Sequence lengths
// are multiples of lcm(C, K).
//
// Sources:
//   Yao et al., "Training Ultra Long Context Language Model with Fully Pipelined Distributed
//   Transformer", arXiv:2408.16978.
//   github.com/microsoft/DeepSpeed, deepspeed/sequence/fpdt_layer.py (FPDT_Attention,
//   _FPDTGPUOffloadingAttentionImpl_); Megatron-DeepSpeed's --ds-sequence-parallel-fpdt flags.
#include <numeric>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "../step_builder.hpp"
#include "common.hpp"

namespace cpsim::sim::methods {
namespace {

class Fpdt final : public CpScheme {
 public:
  models::CpMethod id() const override { return models::CpMethod::kFpdt; }
  bool has_ulysses_part() const override { return true; }
  bool has_ring_part() const override { return false; }
  bool uses_fpdt_chunk() const override { return true; }
  bool builds_latent_attention() const override {
    return false;
  }  // one head width (attention_fpdt)
  /// The chunked layer keeps its own chunks (on the host or the GPU) whatever the checkpointing;
  /// one chunk runs plain Ulysses, which recomputes selectively.
  bool recomputes_selectively(const models::ParallelConfig& p) const override {
    return p.fpdt_chunk <= 0 || p.seq_len / p.fpdt_chunk <= 1;
  }

  std::optional<ConfigIssue> check_ring_degree(const models::ParallelConfig& p) const override {
    return no_ring(p);
  }

  std::optional<ConfigIssue> check_sequence(const ScheduleInputs& in) const override {
    const auto& p = in.parallel;
    const std::int64_t k = p.fpdt_chunk;
    if (k <= 0 || k % p.cp_degree != 0 || p.seq_len % k != 0) {
      return ConfigIssue{Quantity::kFpdtChunk,
                         fmt::format("chunk {} must be a positive multiple of the CP degree {} "
                                     "that divides the sequence length {}",
                                     k, p.cp_degree, p.seq_len)};
    }
    return std::nullopt;
  }

  std::optional<ConfigIssue> stage_heads(const ScheduleInputs& in, HeadLayout& L) const override {
    if (auto issue = CpScheme::stage_heads(in, L)) {
      return issue;
    }
    L.fpdt_chunks = in.parallel.seq_len / in.parallel.fpdt_chunk;
    return std::nullopt;
  }

  // Per chunk of K global tokens instead of the whole sequence.
  AttentionBuffers buffers(const ScheduleInputs& in, const HeadLayout& L) const override {
    AttentionBuffers a = CpScheme::buffers(in, L);
    const std::int64_t k = in.parallel.fpdt_chunk;
    const std::int64_t d = in.model.head_dim;
    const std::int64_t b = in.recipe.activation_bytes;
    const std::int64_t u = L.heads_per_stage;
    const std::int64_t f = L.kv_heads_per_fetch;
    a.qkv_local_bytes = k / L.cp * (u + 2 * f) * d * b;
    a.qkv_headsharded_bytes = k * (u + 2 * f) / L.ulysses * d * b;
    a.out_headsharded_bytes = k * (u / L.ulysses) * d * b;
    a.out_local_bytes = k / L.cp * u * d * b;
    a.lse_bytes = (u / L.ulysses) * k * kFp32Bytes;
    return a;
  }

  std::int64_t seq_multiple(const models::ParallelConfig& p) const override {
    return std::lcm(layout_seq_multiple(p), p.fpdt_chunk);
  }

  void attention_forward(detail::StepBuilder& b,
                         detail::SavedLayer& sv,
                         detail::TensorSet params,
                         bool grad) const override {
    if (b.layout().fpdt_chunks > 1) {
      b.fpdt_forward(sv, params, grad);
    } else {
      b.ulysses_forward(sv, params, grad);
    }
  }
  detail::InputGrad attention_backward(detail::StepBuilder& b,
                                       const detail::SavedLayer& sv,
                                       detail::TensorSet d_o,
                                       detail::TensorSet params,
                                       detail::TensorSet grads) const override {
    return b.layout().fpdt_chunks > 1 ? b.fpdt_backward(sv, d_o, params, grads)
                                      : b.ulysses_backward(sv, d_o, params, grads);
  }

  // Chunks of 32K..256K tokens that the CP degree divides; at a given length, those that divide
  // it into more than one chunk.
  void search_candidates(const models::ParallelConfig& base,
                         const SearchSpace& space,
                         std::vector<models::ParallelConfig>& out) const override {
    models::ParallelConfig p = base;
    p.ring_degree = 1;
    for (const std::int64_t k : {32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024}) {
      if (k % base.cp_degree != 0) {
        continue;
      }
      if (space.seq_len && (*space.seq_len % k != 0 || k == *space.seq_len)) {
        continue;
      }
      p.fpdt_chunk = k;
      out.push_back(p);
    }
  }

  std::int64_t ops_per_block_estimate(const ScheduleInputs& in) const override {
    const auto& p = in.parallel;
    if (p.fpdt_chunk <= 0) {
      return CpScheme::ops_per_block_estimate(in);
    }
    return 40 + 30 * std::max<std::int64_t>(1, p.seq_len / p.fpdt_chunk);
  }

  std::string label(LabelStyle style,
                    const models::ParallelConfig& p,
                    const HeadLayout* L) const override {
    switch (style) {
      case LabelStyle::kSearch:
        return fmt::format("fpdt C{} chunk {}", p.cp_degree, format_length(p.fpdt_chunk));
      case LabelStyle::kDescription: {
        const std::int64_t chunks = L != nullptr ? L->fpdt_chunks : p.seq_len / p.fpdt_chunk;
        return fmt::format("FPDT (C={}, {} chunks of {}, {})", p.cp_degree, chunks,
                           format_length(p.fpdt_chunk),
                           p.fpdt_offload && chunks > 1 ? "offloaded to host" : "on GPU");
      }
      case LabelStyle::kDegrees:
        break;
    }
    return fmt::format("Ulysses {}, chunk {}, {}", p.ulysses_degree(), format_length(p.fpdt_chunk),
                       p.fpdt_offload ? "offloaded to host" : "on GPU");
  }
  std::string_view report_color() const override { return "#8c564b"; }
  LauncherSupport launchers() const override {
    // Megatron-DeepSpeed's FPDT layers train biases and a plain GELU MLP (deepspeed 0.19.8
    // deepspeed/sequence/fpdt_layer.py:208, :645, :1196-1197; run on the CPU by
    // tests/launchers/deepspeed_launcher.py), never the gated, bias-free blocks cpsim simulates.
    return {{},
            "no launcher: Megatron-DeepSpeed's FPDT layers add biases and a plain GELU MLP, so "
            "they cannot train the gated bias-free blocks simulated"};
  }
};

}  // namespace

const CpScheme& fpdt() {
  static const Fpdt kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::methods
