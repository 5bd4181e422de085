#include "cpsim/sim/pipeline.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "cpsim/sim/cost_model.hpp"

// Pipeline parallelism as Megatron-Core runs it
// (NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553,
// megatron/core/pipeline_parallel/schedules.py, "schedules.py" below) and as Narayanan et al. 2021
// analyse it (REFERENCES.md [Megatron-PP]).
//
// Placement: parallel_state.py:617 orders ranks "tp-cp-ep-dp-pp": PP is the outermost dimension,
// so stage i holds the G/P consecutive ranks [i·G/P, (i+1)·G/P) and the TP, CP and DP groups are
// inside a stage, laid out there as without PP. A stage boundary is on the inter-node link unless
// the whole job is one node (G ≤ GPUs per node); with G/P ≥ GPUs per node every boundary crosses
// nodes, otherwise some do (the slowest boundary sets the pace of the pipeline).
//
// 1F1B (forward_backward_pipelining_without_interleaving): rank r runs
// min(P − r − 1, m) warm-up forwards (schedules.py:2277-2279), then one forward and one backward
// per step, so rank 0 holds min(P, m) micro-batches' activations when its first backward starts
// (P − 1 warm-up forwards and the steady state's forward). The pipeline fills and drains in
// P − 1 slots of one micro-batch's forward + backward on the slowest stage:
//   step = (m + P − 1)·t_mb,  bubble = (P − 1)/m  ([Megatron-PP] §2.2.1).
// Its P2P runs blocking: overlap_p2p_comm is refused (schedules.py:2181-2184; training/
// arguments.py:1010-1012 turns it off without interleaving), so each slot also waits for one
// activation received forward and one gradient received backward.
//
// Interleaved (forward_backward_pipelining_with_interleaving, V model chunks of L/(P·V) blocks per
// rank): warm-up on rank r = 2(P − r − 1) + (V − 1)·g chunk forwards, capped at m·V
// (schedules.py:963-978), with g = microbatch_group_size_per_vp_stage, default P
// (model_parallel_config.py:567-568); m must be a multiple of P (schedules.py:1160-1180 with g =
// P). Rank 0 holds warm-up + 1 chunks' activations at its first backward, each 1/V of the stage's
// blocks: (2(P − 1) + (V − 1)·P + 1)/V micro-batches' worth.
//   step = (m + (P − 1)/V)·t_mb,  bubble = (P − 1)/(m·V)  ([Megatron-PP] §2.2.2).
// P2P overlaps the next chunk's compute (overlap_p2p_comm, on by default: training/
// arguments.py:3118-3120): exposed only where the transfer outlasts the chunk (planner).
//
// The sent tensor is [s/(C·T), b, h] (schedules.py:2137-2143: seq / CP, / TP under sequence
// parallelism), in the activation dtype; b = 1 (a micro-batch is one sequence in cpsim).

namespace cpsim::sim {
namespace {

ConfigIssue pp_issue(std::string message) {
  return ConfigIssue{Quantity::kPpDegree, std::move(message)};
}

}  // namespace

std::optional<ConfigIssue> check_pipeline(const ScheduleInputs& in) {
  const auto& p = in.parallel;
  const int pp = p.pp_degree;
  const bool interleaved = p.pp_schedule == models::PipelineSchedule::kInterleaved;
  if (pp == 1 && !interleaved && p.virtual_stages == 1) {
    return std::nullopt;
  }
  if (pp < 1) {
    return pp_issue(fmt::format("PP degree must be at least 1, got {}", pp));
  }
  if (p.gpus % pp != 0) {
    return pp_issue(fmt::format("PP degree {} must divide --gpus {}", pp, p.gpus));
  }
  if (!interleaved && p.virtual_stages != 1) {
    return pp_issue(
        fmt::format("{} virtual stages need --pp-schedule interleaved", p.virtual_stages));
  }
  const std::int64_t chunks = static_cast<std::int64_t>(pp) * p.virtual_stages;
  if (p.virtual_stages < 1 || in.model.layers % chunks != 0) {
    return pp_issue(fmt::format(
        "PP degree {}{} must divide the {} blocks of {} (cpsim splits blocks evenly, as "
        "Megatron-LM does by default, training/arguments.py:985-998; uneven first/last stages, "
        "--decoder-first/last-pipeline-num-layers, are not modelled)",
        pp, interleaved ? fmt::format(" × {} virtual stages", p.virtual_stages) : "",
        in.model.layers, in.model.name));
  }
  if (interleaved && (pp < 2 || p.micro_batches % pp != 0)) {
    return pp_issue(
        fmt::format("the interleaved schedule needs PP ≥ 2 and micro-batches a "
                    "multiple of the PP degree {} (Megatron-Core schedules.py), got {}",
                    pp, p.micro_batches));
  }
  return std::nullopt;
}

PipelineShape pipeline_shape(const ScheduleInputs& in) {
  const auto& p = in.parallel;
  PipelineShape s;
  s.stages = p.pp_degree;
  s.virtual_stages = p.pp_schedule == models::PipelineSchedule::kInterleaved ? p.virtual_stages : 1;
  s.micro_batches = std::max(1, p.micro_batches);
  s.stage_layers = in.model.layers / s.stages;
  const int pp = s.stages;
  const int v = s.virtual_stages;
  const int m = s.micro_batches;
  if (p.pp_schedule == models::PipelineSchedule::kInterleaved) {
    const int total = m * v;
    s.warmup_first_stage = std::min(2 * (pp - 1) + (v - 1) * pp, total);
    s.in_flight_first_stage = static_cast<double>(std::min(s.warmup_first_stage + 1, total)) / v;
    s.p2p_exposed = false;
  } else {
    s.warmup_first_stage = std::min(pp - 1, m);
    s.in_flight_first_stage = std::min(pp, m);
    s.p2p_exposed = true;
  }
  s.bubble_fraction = static_cast<double>(pp - 1) / (static_cast<double>(m) * v);
  s.step_slots = m + static_cast<double>(pp - 1) / v;
  const std::int64_t sp_tokens = p.seq_len / (static_cast<std::int64_t>(p.cp_degree) * p.tp_degree);
  s.p2p_bytes = sp_tokens * in.model.hidden * in.recipe.activation_bytes;  // b = 1 sequence
  s.p2p_span = p.gpus > p.gpus_per_node ? models::Span::kInterNode : models::Span::kIntraNode;
  return s;
}

ScheduleInputs pipeline_stage_inputs(const ScheduleInputs& in, int micro_batches) {
  ScheduleInputs out = in;
  auto& p = out.parallel;
  const int pp = std::max(1, p.pp_degree);
  out.model.layers = in.model.layers / pp;
  out.model.name = fmt::format("{} (one of {} pipeline stages)", in.model.name, pp);
  p.gpus = in.parallel.gpus / pp;
  p.pp_degree = 1;
  p.pp_schedule = models::PipelineSchedule::k1F1B;
  p.virtual_stages = 1;
  p.micro_batches = micro_batches;
  return out;
}

double pipeline_p2p_s(const ScheduleInputs& in, const PipelineShape& shape) {
  const CostModel cost(in.hardware, in.recipe.attention_kernel);
  return cost.collective(models::Collective::kSendRecv, shape.p2p_span, 2, shape.p2p_bytes)
      .time_s();
}

}  // namespace cpsim::sim
