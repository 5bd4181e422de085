#pragma once
/// @file Schedule builders: turn (model, recipe, parallel layout, hardware) into the op graph of
/// one training step for every rank. One builder per CP method.

#include <cstdint>
#include <string>
#include <vector>

#include "cpsim/models/hardware.hpp"
#include "cpsim/models/parallel.hpp"
#include "cpsim/models/recipe.hpp"
#include "cpsim/models/transformer.hpp"
#include "cpsim/sim/workload.hpp"

namespace cpsim::sim {

struct ScheduleInputs {
  models::TransformerSpec model;
  models::TrainingRecipe recipe;
  models::ParallelConfig parallel;
  models::HardwareProfile hardware;
};

/// Head layout of one Ulysses/UPipe rank after the all-to-all (derived, validated).
///   kv_heads_eff = H_kv if H_kv % C == 0, else C when C % H_kv == 0 (KV heads replicated).
///   UPipe: U query heads per stage (all ranks), stages = H / U, U/C query heads per rank per
///   stage, kv_per_stage = min(U, kv_heads_eff) KV heads fetched per KV cycle, cycle length g = H /
///   kv_heads_eff stages when U <= kv_heads_eff (one KV fetch per cycle, reused by g stages), else
///   one KV fetch for all stages.
struct HeadLayout {
  std::int64_t cp = 0;                   ///< C
  std::int64_t ulysses = 0;              ///< Ulysses (all-to-all) degree u
  std::int64_t ring = 1;                 ///< ring degree r; C = u·r
  std::int64_t fpdt_chunks = 0;          ///< FPDT: chunks of the global sequence
  std::int64_t heads = 0;                ///< H
  std::int64_t kv_heads_eff = 0;         ///< KV heads after replication
  std::int64_t heads_per_stage = 0;      ///< U (== H for Ulysses)
  std::int64_t stages = 0;               ///< H / U
  std::int64_t kv_heads_per_fetch = 0;   ///< KV heads projected and sent per fetch (all ranks)
  std::int64_t stages_per_kv_fetch = 0;  ///< stages that reuse one KV fetch
  std::int64_t kv_replication = 1;       ///< kv_heads_eff / H_kv
};

/// Validates the combination and derives the head layout (Ulysses heads are split u ways).
/// @throws InputError naming the flag: `--gpus` (not a multiple of the CP degree, or above 2^16),
///   `--seq` (not divisible by the CP degree, or too long), `--model` (heads not divisible by C, KV
///   heads neither divisible by nor dividing C), `--heads-per-stage` (U not a multiple of C, or not
///   dividing H, or not compatible with the KV groups).
HeadLayout derive_head_layout(const ScheduleInputs& inputs);

/// Per-rank bytes of the attention buffers of one layer (hand-checkable; used by tests and
/// `--explain`).
struct AttentionBuffers {
  std::int64_t qkv_local_bytes =
      0;  ///< Q,K,V of the local sequence before the all-to-all (one stage)
  std::int64_t qkv_headsharded_bytes =
      0;  ///< Q,K,V after the all-to-all: full sequence, heads/C (one stage)
  std::int64_t out_headsharded_bytes = 0;  ///< attention output, full sequence, heads/C (one stage)
  std::int64_t out_local_bytes = 0;        ///< output after the reverse all-to-all (one stage)
  std::int64_t lse_bytes = 0;              ///< fp32 log-sum-exp (one stage)
  std::int64_t final_out_bytes = 0;        ///< UPipe: full [N/C, H, d] output kept for backward
  std::int64_t a2a_send_bytes_per_layer_fwd =
      0;                                ///< per rank, all all-to-alls of one forward layer
  std::int64_t ring_block_bytes = 0;    ///< K/V block sent per ring step (ring, usp, upipe + ring)
  std::int64_t allgather_kv_bytes = 0;  ///< K/V of the whole sequence gathered (allgather)
};
AttentionBuffers attention_buffers(const ScheduleInputs& inputs, const HeadLayout& layout);

/// With `recipe.int32_kernel_indexing`, the first tensor a 32-bit-indexed kernel would see with
/// 2^31 elements or more, described for the user ("norm input [524288 × 4096] = 2^31
/// elements ..."); empty when every tensor is below the limit or the recipe has 64-bit kernels.
std::string int32_index_violation(const ScheduleInputs& inputs, const HeadLayout& layout);

/// Persistent model states per rank (parameters, gradients, optimizer states; see the derivation
/// in schedule.cpp), on the GPU and, with optimizer offload, in pinned host memory.
struct ModelStates {
  std::int64_t gpu_bytes = 0;
  std::int64_t host_bytes = 0;
};
ModelStates model_states(const ScheduleInputs& inputs);

struct BuildOptions {
  /// Give every rank its ops. Otherwise one representative rank is simulated whose collectives
  /// still cost what their real groups cost (docs/MODEL.md, "Fast path"): exact when no ring part
  /// exists; with a ring each step lasts as long as its slowest ring position (tested within a few
  /// percent of the full simulation).
  bool all_ranks = false;
  /// Representative rank: the ring steps between the first and the last, which all last as long
  /// and hold the same buffers, are one op per stream (a send of r−2 blocks, r−2 steps of
  /// attention). Ring steps run in lockstep, so this gives the step-by-step schedule's times and
  /// peak when nothing else runs beside the ring (tested), with O(1) ops per ring instead of O(r).
  bool merge_ring_steps = true;
  /// Transformer blocks that are alike are copied from the block before with their ids moved,
  /// once a built block is checked to be its predecessor so moved; the workload is the same as
  /// built block by block (tested), in a fraction of the time.
  bool repeat_layers = true;
};

/// True when every rank runs the same ops with the same durations (no ring part), so the
/// representative-rank fast path is exact.
bool has_representative_rank(const ScheduleInputs& inputs);

/// Builds the step. @throws InputError for invalid combinations (see derive_head_layout).
Workload build_step(const ScheduleInputs& inputs, const BuildOptions& options = {});
/// The same into `into`, emptied first (Workload::clear): a loop of evaluations reuses one
/// workload's capacity. `into` is unspecified if this throws.
void build_step(const ScheduleInputs& inputs, Workload& into, const BuildOptions& options = {});

}  // namespace cpsim::sim
