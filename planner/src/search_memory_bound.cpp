#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/pipeline.hpp"

#include "evaluate_pipeline.hpp"
#include "search_parts.hpp"

namespace cpsim::planner {

using namespace search_parts;
using models::CheckpointMode;

// Two instants, each with only tensors the step builder certainly holds then (allocation rounding
// and everything else only add to them); both see the model states, the fixed overheads and the
// tensors every block saved in the forward (`saved`):
//   - the unfused loss at its backward peak (sim::logits_loss_peak_bytes_per_logit): Hugging
//     Face's at log_softmax_bwd holds the saved fp32 log-softmax output, its fp32 gradient and the
//     fp32 gradient of the logits (12 bytes per logit, whatever the activation dtype); Megatron's
//     the fp32 softmax and the gradient cast to the activation dtype; and x_final;
//   - the MLP backward of the last block: the incoming gradient dy and the output dh1n (2·act);
//     untiled, gate/up and the product (3·s·f·ab, the product s·f with FP8; recomputed under full
//     AC, else among `saved`)
//     and at least the product's gradient as workspace (s·f·ab); under full AC the recomputed norm
//     output h1n (act).
namespace {

// One [rows, f/T] tensor of the MLP: s tokens of the dense MLP's width, or the s·k token copies of
// a mixture of experts at one expert's width (at least that many rows: routing imbalance only
// adds); the smaller of the two where layers with experts and dense ones mix.
std::int64_t mlp_tensor_bytes(const sim::ScheduleInputs& in, std::int64_t s, std::int64_t t) {
  const auto& m = in.model;
  const std::int64_t dense = s * (m.ffn_hidden / t) * in.recipe.activation_bytes;
  if (!m.is_moe()) {
    return dense;
  }
  const std::int64_t experts =
      s * m.moe.experts_per_token * (m.moe.expert_ffn_hidden / t) * in.recipe.activation_bytes;
  return m.mixed_mlp() ? std::min(dense, experts) : experts;
}

std::int64_t bound_with_in_flight(const sim::ScheduleInputs& in, double in_flight) {
  const auto& m = in.model;
  const auto& r = in.recipe;
  const std::int64_t s = in.parallel.seq_len / in.parallel.cp_degree;
  const std::int64_t ab = r.activation_bytes;
  // Tensor parallelism with sequence parallelism: norms, residuals and block inputs hold s/T
  // tokens, the MLP's tensors f/T columns, the logits ⌈V/T⌉ (docs/MODEL.md).
  const std::int64_t t = std::max(1, in.parallel.tp_degree);
  const std::int64_t act = s / t * m.hidden * ab;
  const std::int64_t mlp_tensor = mlp_tensor_bytes(in, s, t);  // one [s, f/T] tensor
  const std::int64_t vocab = (m.vocab + t - 1) / t;
  // The product as the backward keeps it: with FP8 the down projection's FP8 copy (1 byte).
  const std::int64_t product = r.fp8 ? mlp_tensor / ab : mlp_tensor;
  const bool full_ac = r.checkpointing == CheckpointMode::kFull;
  const std::int64_t saved = saved_bytes(in);
  const std::int64_t loss = r.fused_loss || !m.has_output_layer
                                ? 0
                                : s * vocab * sim::logits_loss_peak_bytes_per_logit(in) + act;
  std::int64_t last_mlp_backward = 2 * act;
  if (!r.tiled_mlp) {
    last_mlp_backward += full_ac ? 3 * mlp_tensor + product : mlp_tensor;
  }
  if (full_ac) {
    last_mlp_backward += act;
  }
  const auto held = static_cast<std::int64_t>(in_flight * static_cast<double>(saved));
  return sim::model_states(in).gpu_bytes + in.hardware.fixed_overhead_bytes() + held +
         std::max(loss, last_mlp_backward);
}

}  // namespace

std::int64_t memory_lower_bound(const sim::ScheduleInputs& in) {
  if (in.parallel.pp_degree > 1) {
    sim::ScheduleInputs scratch = in;
    return memory_lower_bound(in, scratch);
  }
  return bound_with_in_flight(in, 1.0);
}

std::int64_t memory_lower_bound(const sim::ScheduleInputs& in, sim::ScheduleInputs& scratch) {
  if (in.parallel.pp_degree <= 1) {
    return bound_with_in_flight(in, 1.0);
  }
  // The composed peak is the larger of the two stages' simulated peaks, each plus (factor − 1)
  // times what a micro-batch holds between its forward and backward, at least `saved`
  // (evaluate_pipeline.cpp).
  const sim::PipelineShape shape = sim::pipeline_shape(in);
  stage_into(in, scratch, sim::PipelineStage::kWithoutOutputLayer);
  const std::int64_t inner = bound_with_in_flight(scratch, std::max(1.0, shape.activation_factor));
  scratch.model.has_output_layer = true;  // the same stage with the LM head: the last
  return std::max(inner,
                  bound_with_in_flight(scratch, std::max(1.0, shape.last_stage_activation_factor)));
}

namespace search_parts {

// The tensors every block saves in the forward and holds to its backward (see above).
std::int64_t saved_bytes(const sim::ScheduleInputs& in) {
  const auto& m = in.model;
  const auto& r = in.recipe;
  const std::int64_t s = in.parallel.seq_len / in.parallel.cp_degree;
  const std::int64_t t = std::max(1, in.parallel.tp_degree);
  const std::int64_t act = s / t * m.hidden * r.activation_bytes;
  const std::int64_t mlp_tensor = mlp_tensor_bytes(in, s, t);
  const std::int64_t product = r.fp8 ? mlp_tensor / r.activation_bytes : mlp_tensor;
  if (r.checkpointing == CheckpointMode::kFull) {
    // Block inputs stay on the GPU unless offloaded (then the first and last stay).
    return r.checkpoint_offload
               ? (r.offload_keep_first_last ? std::min<std::int64_t>(2, m.layers) : 0) * act
               : m.layers * act;
  }
  // Block input, norm1 output, attention residual, norm2 output of every block; untiled, the
  // MLP's gate/up and activation.
  return m.layers * 4 * act + (r.tiled_mlp ? 0 : m.layers * (2 * mlp_tensor + product));
}

// `scratch` (a copy of `in` but for the model, recipe, parallel configuration and margin) becomes
// the stage `in` simulates with one micro-batch, without copying the hardware profile.
void stage_into(const sim::ScheduleInputs& in,
                sim::ScheduleInputs& scratch,
                sim::PipelineStage stage) {
  scratch.model = in.model;
  scratch.recipe = in.recipe;
  scratch.parallel = in.parallel;
  scratch.margin = in.margin;
  scratch.tp_rank_model = in.tp_rank_model;
  sim::make_pipeline_stage(scratch, 1, stage);
}

}  // namespace search_parts

}  // namespace cpsim::planner
