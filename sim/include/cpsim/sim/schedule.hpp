#pragma once
/// @file Schedule builders: turn (model, recipe, parallel layout, hardware) into the op graph of
/// one training step for every rank. The CP method's part comes from its implementation
/// (cp_method.hpp).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/head_layout.hpp"
#include "cpsim/sim/schedule_inputs.hpp"
#include "cpsim/sim/workload.hpp"

namespace cpsim::sim {

/// A configuration checked: its head layout and the implementation that runs it, or what is wrong
/// with it (a result value: refused configurations are an expected outcome of a search).
struct LayoutCheck {
  HeadLayout layout;
  /// Resolved once (resolve_implementation) and checked; nullptr: the method's scheme alone.
  const Implementation* implementation = nullptr;
  std::optional<ConfigIssue> issue;  ///< set when the configuration is refused
};
/// Validates the combination (the checks every method shares, then its implementation's) and
/// derives the head layout (Ulysses heads are split u ways). Quantities at fault: the GPU count
/// (range), GPUs per node, the CP degree (not dividing the GPUs, or a group spanning part of a
/// node), the ring degree, the sequence length (range, or not a multiple of what the method needs),
/// the model's heads (not divisible by the Ulysses degree, KV heads neither dividing nor divisible
/// by it), and the method's own knobs (heads per stage, FPDT chunk).
LayoutCheck check_head_layout(const ScheduleInputs& inputs);
/// check_head_layout for callers that cannot go on without it. @throws ConfigError.
LayoutCheck checked_layout(const ScheduleInputs& inputs);
/// checked_layout(inputs).layout. @throws ConfigError.
HeadLayout derive_head_layout(const ScheduleInputs& inputs);

/// One tensor-parallel rank's view of `inputs` (parallel.tp_degree = T): the model's heads, KV
/// heads, FFN width and vocabulary divided by T (tp_rank_model set); the inputs themselves when
/// T = 1 or already a rank's view. Not validated (check_head_layout does that).
ScheduleInputs tensor_parallel_rank(const ScheduleInputs& inputs);

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
/// TransformerEngine's FP8 state on one rank (recipe.fp8): cached FP8 weights with their
/// transposes and the delayed-scaling amax histories, for the model `m` a rank holds.
std::int64_t fp8_state_bytes(const models::TransformerSpec& m);

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
  /// Every transformer block is an instance of a block recorded once per build (its forward,
  /// recomputation and backward), copied with its ids moved; the workload is the same as built
  /// block by block (by construction, and tested), in a fraction of the time.
  bool repeat_layers = true;
};

/// True when every rank runs the same ops with the same durations (no ring part), so the
/// representative-rank fast path is exact.
bool has_representative_rank(const ScheduleInputs& inputs);

/// Builds the step; the workload carries the head layout. @throws ConfigError for invalid
/// combinations (see check_head_layout), InputError for an invalid model or recipe.
Workload build_step(const ScheduleInputs& inputs, const BuildOptions& options = {});
/// The same into `into`, emptied first (Workload::clear): a loop of evaluations reuses one
/// workload's capacity. `into` is unspecified if this throws.
void build_step(const ScheduleInputs& inputs, Workload& into, const BuildOptions& options = {});

}  // namespace cpsim::sim
