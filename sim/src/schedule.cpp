// Entry point of the schedule builders: validation of a configuration, its head layout, the
// per-rank attention buffer sizes, and build_step. The step itself is built in step_builder.cpp
// (block structure, ZeRO/FSDP, checkpointing, loss, optimizer) and attention_*.cpp (one file per
// attention scheme, each with its derivation).
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
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;

constexpr std::int64_t kMaxSeqLen = std::int64_t{1} << 34;  // 16G tokens: beyond any real run
constexpr double kMaxStepSeconds = 1e7;

bool ring_based(CpMethod m) {
  return m == CpMethod::kRing || m == CpMethod::kAllGather || m == CpMethod::kUsp ||
         m == CpMethod::kUPipe;
}

}  // namespace

HeadLayout derive_head_layout(const ScheduleInputs& in) {
  const auto& m = in.model;
  const auto& p = in.parallel;
  if (p.gpus < 1 || p.gpus > 65536) {
    throw InputError("--gpus", fmt::format("must be between 1 and 65536, got {}", p.gpus));
  }
  if (p.gpus_per_node < 1) {
    throw InputError("--gpus-per-node", fmt::format("must be at least 1, got {}", p.gpus_per_node));
  }
  const char* cp_flag = p.method == CpMethod::kRing || p.method == CpMethod::kAllGather
                            ? "--cp-degree"
                            : "--ulysses-degree";
  if (p.cp_degree < 1 || p.gpus % p.cp_degree != 0) {
    throw InputError(p.cp_degree == p.gpus ? "--gpus" : cp_flag,
                     fmt::format("CP degree {} must divide --gpus {}", p.cp_degree, p.gpus));
  }
  if (p.ring_degree < 1 || p.cp_degree % p.ring_degree != 0) {
    throw InputError("--ring-degree", fmt::format("ring degree {} must divide the CP degree {}",
                                                  p.ring_degree, p.cp_degree));
  }
  switch (p.method) {
    case CpMethod::kUlysses:
    case CpMethod::kFpdt:
      if (p.ring_degree != 1) {
        throw InputError("--ring-degree", fmt::format("--method {} has no ring; use --method usp "
                                                      "(or upipe) for Ulysses × ring",
                                                      models::to_string(p.method)));
      }
      break;
    case CpMethod::kRing:
    case CpMethod::kAllGather:
      if (p.ring_degree != p.cp_degree) {
        throw InputError("--ring-degree",
                         fmt::format("--method {} rotates over the whole CP group: ring degree "
                                     "must equal the CP degree {}",
                                     models::to_string(p.method), p.cp_degree));
      }
      break;
    default:
      break;
  }
  if (p.seq_len <= 0) {
    throw InputError("--seq", "must be positive");
  }
  if (p.seq_len > kMaxSeqLen) {
    throw InputError("--seq", fmt::format("{} tokens is beyond what cpsim models (at most {})",
                                          p.seq_len, format_length(kMaxSeqLen)));
  }
  // A step whose model FLOPs alone take more than ~4 months per GPU is not a plan anyone runs, and
  // its nanosecond clock would approach the 64-bit range once recomputation is added: refuse it.
  const double lower_bound_s = models::model_step_flops(m, p.seq_len).total() /
                               static_cast<double>(p.cp_degree) / in.hardware.peak_bf16_flops_per_s;
  if (!(lower_bound_s < kMaxStepSeconds)) {
    throw InputError("--seq", fmt::format("{} tokens on {} would take at least {:.3g} s per step; "
                                          "cpsim refuses lengths this absurd",
                                          p.seq_len, m.name, lower_bound_s));
  }
  const std::int64_t c = p.cp_degree;
  const std::int64_t ring = p.ring_degree;
  const std::int64_t u = c / ring;
  const bool zigzag = p.ring_layout == models::RingLayout::kZigzag && ring > 1;
  const std::int64_t seq_multiple = zigzag ? 2 * c : c;
  if (p.seq_len % seq_multiple != 0) {
    throw InputError(
        "--seq",
        fmt::format("sequence length {} must be divisible by {}{}", p.seq_len, seq_multiple,
                    zigzag ? " (2 × CP degree for the zigzag layout)" : " (the CP degree)"));
  }
  if (p.method == CpMethod::kFpdt) {
    const std::int64_t k = p.fpdt_chunk;
    if (k <= 0 || k % c != 0 || p.seq_len % k != 0) {
      throw InputError("--fpdt-chunk",
                       fmt::format("chunk {} must be a positive multiple of the CP degree {} that "
                                   "divides the sequence length {}",
                                   k, c, p.seq_len));
    }
  }
  HeadLayout L;
  L.cp = c;
  L.ulysses = u;
  L.ring = ring;
  L.heads = m.heads;
  if (m.heads % u != 0) {
    throw InputError("--model", fmt::format("{} has {} attention heads, not divisible by the "
                                            "Ulysses degree {} (Ulysses splits heads across ranks)",
                                            m.name, m.heads, u));
  }
  if (m.kv_heads % u == 0) {
    L.kv_heads_eff = m.kv_heads;
  } else if (u % m.kv_heads == 0) {
    L.kv_heads_eff = u;  // replicate each KV head u / H_kv times
  } else {
    throw InputError("--model",
                     fmt::format("{} has {} KV heads: neither divisible by nor a divisor "
                                 "of the Ulysses degree {}",
                                 m.name, m.kv_heads, u));
  }
  L.kv_replication = L.kv_heads_eff / m.kv_heads;
  if (c > p.gpus_per_node && c % p.gpus_per_node != 0) {
    throw InputError(p.cp_degree == p.gpus ? "--gpus" : cp_flag,
                     fmt::format("a CP group spanning nodes must cover whole nodes: degree {} is "
                                 "not a multiple of --gpus-per-node {}",
                                 c, p.gpus_per_node));
  }
  if (p.method != CpMethod::kUPipe) {
    if (p.heads_per_stage != 0) {
      throw InputError("--heads-per-stage", "applies to --method upipe only");
    }
    L.heads_per_stage = m.heads;
  } else {
    const std::int64_t hs = p.heads_per_stage == 0 ? u : p.heads_per_stage;
    if (hs <= 0 || hs % u != 0) {
      throw InputError(
          "--heads-per-stage",
          fmt::format("U = {} must be a positive multiple of the Ulysses degree {}", hs, u));
    }
    if (m.heads % hs != 0) {
      throw InputError(
          "--heads-per-stage",
          fmt::format("U = {} must divide the {} query heads of {}", hs, m.heads, m.name));
    }
    if ((hs <= L.kv_heads_eff && L.kv_heads_eff % hs != 0) ||
        (hs > L.kv_heads_eff && hs % L.kv_heads_eff != 0)) {
      throw InputError("--heads-per-stage",
                       fmt::format("U = {} is not compatible with {} KV heads (after replication): "
                                   "one must divide the other",
                                   hs, L.kv_heads_eff));
    }
    L.heads_per_stage = hs;
  }
  L.stages = m.heads / L.heads_per_stage;
  if (L.heads_per_stage <= L.kv_heads_eff) {
    L.kv_heads_per_fetch = L.heads_per_stage;
    L.stages_per_kv_fetch = m.heads / L.kv_heads_eff;
  } else {
    L.kv_heads_per_fetch = L.kv_heads_eff;
    L.stages_per_kv_fetch = L.stages;
  }
  if (p.method != CpMethod::kUPipe) {
    L.kv_heads_per_fetch = L.kv_heads_eff;
    L.stages_per_kv_fetch = 1;
  }
  L.fpdt_chunks = p.method == CpMethod::kFpdt ? p.seq_len / p.fpdt_chunk : 0;
  (void)ring_based;
  return L;
}

// Attention buffers of one layer, per rank (bf16 = 2 bytes, LSE fp32). s = N/C local tokens,
// n_r = N/ring tokens after the Ulysses all-to-all, u the Ulysses degree, U heads per stage (H
// unless UPipe), F K/V heads per fetch (H_kv' after replication unless UPipe):
//     QKV local          s·(U + 2F)·d·2       before the all-to-all (one stage)
//     QKV head-sharded   n_r·(U + 2F)/u·d·2   after it: the same bytes
//     out head-sharded   n_r·(U/u)·d·2,   out local s·U·d·2,   LSE (U/u)·n_r·4
//     final_out          s·H·d·2 (UPipe keeps it for backward)
//     ring block         n_r·2(F/u)·d·2 sent per ring step; all-gather: N·2(F/u)·d·2 gathered
//     FPDT               per chunk of K global tokens: Q K·(H/C)·d·2, K/V K·2(H_kv'/C)·d·2
// All-to-all bytes sent per rank in one forward layer (u > 1): s·(H + 2H_kv')·d·2 + s·H·d·2
// (REFERENCES.md [Ulysses]: 4Nh/P for MHA).
AttentionBuffers attention_buffers(const ScheduleInputs& in, const HeadLayout& L) {
  const std::int64_t n = in.parallel.seq_len;
  const std::int64_t s = n / L.cp;
  const std::int64_t nr = n / L.ring;
  const std::int64_t d = in.model.head_dim;
  const std::int64_t b = in.recipe.activation_bytes;
  const std::int64_t u = L.heads_per_stage;
  const std::int64_t f = L.kv_heads_per_fetch;
  AttentionBuffers a;
  if (in.parallel.method == CpMethod::kFpdt) {
    const std::int64_t k = in.parallel.fpdt_chunk;
    a.qkv_local_bytes = k / L.cp * (u + 2 * f) * d * b;
    a.qkv_headsharded_bytes = k * (u + 2 * f) / L.ulysses * d * b;
    a.out_headsharded_bytes = k * (u / L.ulysses) * d * b;
    a.out_local_bytes = k / L.cp * u * d * b;
    a.lse_bytes = (u / L.ulysses) * k * kFp32Bytes;
  } else {
    a.qkv_local_bytes = s * (u + 2 * f) * d * b;
    a.qkv_headsharded_bytes = nr * (u + 2 * f) / L.ulysses * d * b;
    a.out_headsharded_bytes = nr * (u / L.ulysses) * d * b;
    a.out_local_bytes = s * u * d * b;
    a.lse_bytes = (u / L.ulysses) * nr * kFp32Bytes;
  }
  a.final_out_bytes = in.parallel.method == CpMethod::kUPipe ? s * L.heads * d * b : 0;
  if (L.ring > 1) {
    if (in.parallel.method == CpMethod::kAllGather) {
      a.allgather_kv_bytes = n * 2 * (f / L.ulysses) * d * b;
    } else {
      a.ring_block_bytes = nr * 2 * (f / L.ulysses) * d * b;
    }
  }
  a.a2a_send_bytes_per_layer_fwd =
      L.ulysses > 1 ? s * (L.heads + 2 * L.kv_heads_eff) * d * b + s * L.heads * d * b : 0;
  return a;
}

// 32-bit element offsets (recipe.int32_kernel_indexing). A kernel that computes row × stride in
// int32 addresses garbage once a tensor holds 2^31 elements: Liger's RMSNorm and RoPE index rows
// of [s, h] and [s, H·d] (Liger issue #803: Llama-8B crashes just above 500K tokens per GPU,
// 500_000 × 4096 ≈ 2^31), and FlashAttention-2 its head-sharded Q/O/dQ of n_r × (H/u) × d per
// call ("FA2 as well, but FA3 solves it"). The limit is what the kernels of the recipe can address,
// not memory: it binds whatever the GPU's size.
std::string int32_index_violation(const ScheduleInputs& in, const HeadLayout& L) {
  if (!in.recipe.int32_kernel_indexing) {
    return {};
  }
  constexpr std::int64_t kLimit = std::int64_t{1} << 31;
  const auto& m = in.model;
  const std::int64_t s = in.parallel.seq_len / L.cp;
  struct Indexed {
    const char* what;
    std::int64_t rows, cols;
  };
  std::vector<Indexed> tensors = {{"RMSNorm input", s, m.hidden},
                                  {"RoPE query", s, m.heads * m.head_dim}};
  if (in.recipe.attention_kernel == "fa2") {
    const AttentionBuffers a = attention_buffers(in, L);
    const std::int64_t width = (L.heads_per_stage / L.ulysses) * m.head_dim;
    tensors.push_back({"FlashAttention-2 query",
                       a.out_headsharded_bytes / in.recipe.activation_bytes / width, width});
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
ModelStates model_states(const ScheduleInputs& in) {
  const auto& r = in.recipe;
  const std::int64_t total = models::count_parameters(in.model).total;
  const std::int64_t gpus = std::max(1, in.parallel.gpus);
  const std::int64_t shard = (total + gpus - 1) / gpus;
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
  s.host_bytes =
      r.optimizer_offload ? (r.zero_stage == 0 ? total : shard) * (m + o + kFp32Bytes) : 0;
  if (r.param_offload && r.zero_stage == 3) {
    s.host_bytes += shard * p;
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
  (void)derive_head_layout(inputs);
  // One representative rank unless asked otherwise: exact without a ring; with a ring each step
  // takes its slowest position's time (see attention_core.cpp).
  const bool fast = !options.all_ranks;
  into.clear();
  detail::StepBuilder builder(inputs, into, fast ? 1 : inputs.parallel.gpus,
                              fast && options.merge_ring_steps, options.repeat_layers);
  builder.build();
}

}  // namespace cpsim::sim
