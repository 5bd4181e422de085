#pragma once
/// @file Pipeline parallelism (ParallelConfig::pp_degree = P): the schedule's counts (bubble,
/// warm-up, micro-batches in flight), the stage's share of the model and its point-to-point
/// transfers. The step is composed analytically from a simulation of one stage (docs/MODEL.md,
/// "Pipeline parallelism"): planner/evaluate.cpp simulates the stage and applies these counts.

#include <cstdint>
#include <optional>

#include "cpsim/models/hardware.hpp"
#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/schedule_inputs.hpp"

namespace cpsim::sim {

/// What the schedule of `inputs` means for its first stage and its step (see pipeline.cpp for
/// the derivation from Megatron-Core's schedules.py).
struct PipelineShape {
  int stages = 1;          ///< P
  int virtual_stages = 1;  ///< V (1 under 1F1B)
  int micro_batches = 1;   ///< m
  /// Blocks of the simulated stage: the most any pipeline rank holds (L/P when even).
  std::int64_t stage_layers = 0;
  std::int64_t first_stage_layers = 0;   ///< blocks of stage 0 (Megatron's first-stage flag)
  std::int64_t middle_stage_layers = 0;  ///< blocks of each stage between (0 when P ≤ 2)
  std::int64_t last_stage_layers = 0;    ///< blocks of stage P − 1
  /// Forward passes (of model chunks) the first stage runs before its first backward.
  int warmup_first_stage = 0;
  /// Micro-batches whose activations the first stage holds at once, in units of one
  /// micro-batch's activations of all its L/P blocks: min(P, m) under 1F1B, (warm-up + 1)/V
  /// model chunks interleaved.
  double in_flight_first_stage = 1.0;
  /// The stage before the last whose activations in flight are largest (0: the first; with
  /// uneven stages the second can hold more: one micro-batch fewer but more blocks) and those
  /// activations in units of one micro-batch's activations of `stage_layers` blocks: max over
  /// ranks r < P − 1 of in_flight(r)·blocks(r)/stage_layers (= in_flight_first_stage when the
  /// split is even).
  int memory_stage = 0;
  double activation_factor = 1.0;
  /// The same for the last stage, which alone holds the LM head and the loss:
  /// in_flight(P − 1)·blocks(P − 1)/stage_layers (1 under 1F1B with an even split).
  double last_stage_activation_factor = 1.0;
  /// Idle time over ideal time: (P − 1)/(m·V).
  double bubble_fraction = 0.0;
  /// Step time in units of one micro-batch's forward and backward on one stage:
  /// m + (P − 1)/V.
  double step_slots = 1.0;
  /// One activation (or its gradient) sent between adjacent stages: [s/(C·T), 1, h] in the
  /// activation dtype.
  std::int64_t p2p_bytes = 0;
  /// The link of the slowest stage boundary: inter-node when a stage boundary crosses a node.
  models::Span p2p_span = models::Span::kIntraNode;
  /// Megatron's P2P waits on the critical path (1F1B: overlap_p2p_comm is refused) or runs beside
  /// the next chunk's compute (interleaved, overlap_p2p_comm on by default).
  bool p2p_exposed = true;
};

/// @pre check_pipeline(inputs) found nothing.
PipelineShape pipeline_shape(const ScheduleInputs& inputs);

/// Refusals of the pipeline layout: P not dividing the blocks (or P·V under interleaving; with
/// uneven stages the middle stages' blocks as Megatron-Core checks them), the GPUs, or the
/// schedule's own knobs; nothing when P = 1 and V = 1 and no stage is uneven.
std::optional<ConfigIssue> check_pipeline(const ScheduleInputs& inputs);

/// Which stage a simulation stands for: the last (with the final norm, LM head and loss), or any
/// other (without them: it sends its output on and receives the gradient of it).
enum class PipelineStage : std::uint8_t { kWithOutputLayer, kWithoutOutputLayer };

/// A stage simulated for a pipeline: PipelineShape::stage_layers blocks (L/P when even, else the
/// largest stage) on G/P GPUs, one micro-batch (or `micro_batches`), P = 1. Both kinds keep the
/// embedding (an upper bound on the stages without it); kWithOutputLayer stands for the last stage
/// and, holding every stage's work, times them all; kWithoutOutputLayer for the stages before it.
/// The
/// step's tokens and model FLOPs are the full model's (planner).
ScheduleInputs pipeline_stage_inputs(const ScheduleInputs& inputs,
                                     int micro_batches,
                                     PipelineStage stage = PipelineStage::kWithOutputLayer);
/// The same in place (no copy of the hardware profile: the planner's bound runs it per candidate).
void make_pipeline_stage(ScheduleInputs& inputs,
                         int micro_batches,
                         PipelineStage stage = PipelineStage::kWithOutputLayer);

/// Seconds of one send/recv of PipelineShape::p2p_bytes on its link (nccl-tests send/recv model).
double pipeline_p2p_s(const ScheduleInputs& inputs, const PipelineShape& shape);

}  // namespace cpsim::sim
