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

namespace {

// Blocks of the first, middle and last stages (Megatron-Core transformer_block.py:95-146
// get_num_layers_to_build: the first/last flags take their blocks off L, the rest split evenly
// over the stages left; without the flags every stage holds L/P).
struct StageSplit {
  std::int64_t first = 0, middle = 0, last = 0;
  int middle_stages = 0;
};

StageSplit stage_split(const models::TransformerSpec& model, const models::ParallelConfig& p) {
  StageSplit s;
  const int pp = std::max(1, p.pp_degree);
  std::int64_t rest = model.layers;
  s.middle_stages = pp;
  if (p.pp_first_stage_layers > 0) {
    rest -= p.pp_first_stage_layers;
    s.middle_stages -= 1;
  }
  if (p.pp_last_stage_layers > 0) {
    rest -= p.pp_last_stage_layers;
    s.middle_stages -= 1;
  }
  s.middle = s.middle_stages > 0 ? rest / s.middle_stages : 0;
  s.first = p.pp_first_stage_layers > 0 ? p.pp_first_stage_layers : s.middle;
  s.last = p.pp_last_stage_layers > 0 ? p.pp_last_stage_layers : s.middle;
  if (pp == 1) {
    s.last = s.first;
  }
  return s;
}

std::int64_t layers_of_rank(const StageSplit& s, int rank, int pp) {
  return rank == 0 ? s.first : rank == pp - 1 ? s.last : s.middle;
}

// Uneven stages as Megatron-Core's TransformerConfig checks them (transformer_config.py:2293-2350
// @d98e8a64): each given stage > 0 blocks, the middle stages' blocks divided evenly among them
// (none left when there is no middle stage), and under interleaving every stage's blocks a
// multiple of V.
std::optional<ConfigIssue> check_uneven(const ScheduleInputs& in, bool interleaved) {
  const auto& p = in.parallel;
  if (p.pp_first_stage_layers < 0 || p.pp_last_stage_layers < 0) {
    return pp_issue("first/last pipeline stage blocks must be positive");
  }
  if (p.pp_degree < 2) {
    return pp_issue("uneven first/last pipeline stages need PP ≥ 2");
  }
  const StageSplit s = stage_split(in.model, p);
  const std::int64_t rest = in.model.layers - (p.pp_first_stage_layers + p.pp_last_stage_layers);
  if (rest < 0 || (rest > 0) != (s.middle_stages > 0) ||
      (s.middle_stages > 0 && rest % s.middle_stages != 0)) {
    return pp_issue(fmt::format(
        "the {} blocks of {} left after the first/last pipeline stages ({}/{}) must split evenly "
        "over the {} middle stages (Megatron-Core transformer_config.py:2338-2350)",
        std::max<std::int64_t>(rest, 0), in.model.name, p.pp_first_stage_layers,
        p.pp_last_stage_layers, s.middle_stages));
  }
  const int v = interleaved ? p.virtual_stages : 1;
  if (v < 1 || s.first % v != 0 || s.middle % v != 0 || s.last % v != 0) {
    return pp_issue(
        fmt::format("every pipeline stage's blocks ({}/{}/{}) must divide by the {} virtual stages "
                    "(Megatron-Core transformer_config.py:2305-2360)",
                    s.first, s.middle, s.last, v));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ConfigIssue> check_pipeline(const ScheduleInputs& in) {
  const auto& p = in.parallel;
  const int pp = p.pp_degree;
  const bool interleaved = p.pp_schedule == models::PipelineSchedule::kInterleaved;
  const bool uneven = p.pp_first_stage_layers != 0 || p.pp_last_stage_layers != 0;
  if (pp == 1 && !interleaved && p.virtual_stages == 1 && !uneven) {
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
  if (uneven) {
    if (std::optional<ConfigIssue> bad = check_uneven(in, interleaved)) {
      return bad;
    }
  } else if (const std::int64_t chunks = static_cast<std::int64_t>(pp) * p.virtual_stages;
             p.virtual_stages < 1 || in.model.layers % chunks != 0) {
    return pp_issue(fmt::format(
        "PP degree {}{} must divide the {} blocks of {} (an even split, Megatron-LM's default, "
        "training/arguments.py:985-998; --pp-first-stage-layers/--pp-last-stage-layers give "
        "uneven first/last stages)",
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

namespace {

// Micro-batches' activations rank r holds at its first backward, in units of one micro-batch's
// activations of that rank's blocks: 1F1B min(P − r − 1, m) warm-up forwards + the steady
// state's forward; interleaved (2(P − r − 1) + (V − 1)·P) warm-up chunk forwards + 1, capped at
// m·V, each chunk 1/V of the rank's blocks (schedules.py, see above).
double in_flight_of_rank(int rank, int pp, int v, int m, bool interleaved) {
  if (!interleaved) {
    return std::min(pp - rank, m);
  }
  const int total = m * v;
  const int warmup = std::min(2 * (pp - rank - 1) + (v - 1) * pp, total);
  return static_cast<double>(std::min(warmup + 1, total)) / v;
}

}  // namespace

PipelineShape pipeline_shape(const ScheduleInputs& in) {
  const auto& p = in.parallel;
  PipelineShape s;
  const bool interleaved = p.pp_schedule == models::PipelineSchedule::kInterleaved;
  s.stages = p.pp_degree;
  s.virtual_stages = interleaved ? p.virtual_stages : 1;
  s.micro_batches = std::max(1, p.micro_batches);
  const StageSplit split = stage_split(in.model, p);
  s.first_stage_layers = split.first;
  s.middle_stage_layers = s.stages > 2 ? split.middle : 0;
  s.last_stage_layers = split.last;
  s.stage_layers = std::max({split.first, s.middle_stage_layers, split.last});
  const int pp = s.stages;
  const int v = s.virtual_stages;
  const int m = s.micro_batches;
  s.warmup_first_stage =
      interleaved ? std::min(2 * (pp - 1) + (v - 1) * pp, m * v) : std::min(pp - 1, m);
  s.in_flight_first_stage = in_flight_of_rank(0, pp, v, m, interleaved);
  s.p2p_exposed = !interleaved;
  // The stage before the last holding the most activations: ranks 0 and 1 cover it (the middle
  // ranks hold as many blocks as rank 1 and fewer micro-batches); the last stage apart, as it
  // alone holds the LM head and the loss.
  s.activation_factor = 0.0;
  for (const int r : {0, 1}) {
    if (r >= pp - 1) {
      continue;
    }
    const double held = in_flight_of_rank(r, pp, v, m, interleaved) *
                        static_cast<double>(layers_of_rank(split, r, pp)) /
                        static_cast<double>(s.stage_layers);
    if (held > s.activation_factor) {
      s.activation_factor = held;
      s.memory_stage = r;
    }
  }
  s.last_stage_activation_factor = in_flight_of_rank(pp - 1, pp, v, m, interleaved) *
                                   static_cast<double>(split.last) /
                                   static_cast<double>(s.stage_layers);
  s.bubble_fraction = static_cast<double>(pp - 1) / (static_cast<double>(m) * v);
  s.step_slots = m + static_cast<double>(pp - 1) / v;
  const std::int64_t sp_tokens = p.local_seq() / p.tp_degree;
  s.p2p_bytes = sp_tokens * in.model.hidden * in.recipe.activation_bytes;  // b = 1 sequence
  s.p2p_span = p.gpus > p.gpus_per_node ? models::Span::kInterNode : models::Span::kIntraNode;
  return s;
}

void make_pipeline_stage(ScheduleInputs& in, int micro_batches, PipelineStage stage) {
  auto& p = in.parallel;
  const int pp = std::max(1, p.pp_degree);
  const StageSplit split = stage_split(in.model, p);
  in.model.layers = std::max({split.first, pp > 2 ? split.middle : 0, split.last});
  // A stage's layers are the first ones of the model's pattern (stages of layers whose attention
  // differs are refused: check_attention_window).
  if (!in.model.layer_attention.empty()) {
    in.model.layer_attention.resize(static_cast<std::size_t>(in.model.layers));
  }
  // Dense layers among sparse ones: every layer of the stage has experts, an upper bound on the
  // stages with dense layers (check_experts refuses a model where it is not).
  in.model.layer_mlp.clear();
  in.model.has_output_layer = stage == PipelineStage::kWithOutputLayer;
  in.model.name = fmt::format("{} (one of {} pipeline stages)", in.model.name, pp);
  in.pipeline = {pp, p.gpus > p.gpus_per_node ? models::Span::kInterNode
                                              : models::Span::kIntraNode};  // as pipeline_shape
  p.gpus /= pp;
  p.pp_degree = 1;
  p.pp_schedule = models::PipelineSchedule::k1F1B;
  p.virtual_stages = 1;
  p.pp_first_stage_layers = 0;
  p.pp_last_stage_layers = 0;
  p.micro_batches = micro_batches;
}

ScheduleInputs pipeline_stage_inputs(const ScheduleInputs& in,
                                     int micro_batches,
                                     PipelineStage stage) {
  ScheduleInputs out = in;
  make_pipeline_stage(out, micro_batches, stage);
  return out;
}

double pipeline_p2p_s(const ScheduleInputs& in, const PipelineShape& shape) {
  const CostModel cost(in.hardware, in.recipe.attention_kernel);
  return cost.collective(models::Collective::kSendRecv, shape.p2p_span, 2, shape.p2p_bytes)
      .time_s();
}

}  // namespace cpsim::sim
