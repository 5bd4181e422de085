#include "evaluate_pipeline.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cpsim/sim/pipeline.hpp"

// A pipeline-parallel step composed from simulations of one stage (sim/pipeline.hpp for the
// schedule's counts and their sources). The stage (L/P blocks on G/P GPUs, with the embedding
// and the LM head + loss both) is simulated with one micro-batch and with two:
//   t_mb  = T(2) − T(1)        one micro-batch's forward + backward on the stage,
//   t_end = T(1) − t_mb        what runs once per step (optimizer, last gradient reduction),
//   step  = (m + (P − 1)/V)·(t_mb + p2p) + t_end,
// with p2p = 2 send/recv times per slot under 1F1B (blocking: one activation received forward, one
// gradient received backward) and max(0, 2·V·send/recv − t_mb) interleaved (overlapped with the
// next chunk). Memory: the stage holding the most activations (the first, or with uneven stages
// possibly the second) holds `activation_factor` micro-batches' activations of the simulated
// stage; the simulation holds one, so the rest, (factor − 1)·A with A the stage's peak of
// activations saved for backward (MemCategory::kActivations), is added to its peak. The stage
// simulated holds the most blocks of any stage, the embedding and the LM head: its model states
// and time bound every stage's from above.
namespace cpsim::planner {
namespace {

EvaluateOptions stage_options(const EvaluateOptions& options) {
  EvaluateOptions out = options;
  out.stop_above_device_bytes = 0;  // the extra in-flight activations are known only afterwards
  return out;
}

// Memory of the micro-batches in flight beyond the one the stage simulation holds.
void add_in_flight_activations(const sim::PipelineShape& shape, sim::StepReport& rep) {
  const auto act = static_cast<std::size_t>(sim::MemCategory::kActivations);
  const double per_micro_batch = static_cast<double>(rep.category_peak[act]);
  const auto extra =
      static_cast<std::int64_t>(std::llround((shape.activation_factor - 1.0) * per_micro_batch));
  rep.pipeline_in_flight_extra_bytes = extra;
  rep.peak_memory_bytes += extra;
  rep.breakdown_at_peak[act] += extra;
  rep.category_peak[act] += extra;
  if (rep.reserved_peak_bytes > 0) {
    rep.reserved_peak_bytes += extra;
  }
  rep.gpu_headroom_bytes -= extra;
  const bool fits = rep.gpu_headroom_bytes >= 0 && !rep.allocator_out_of_memory;
  if (rep.fits_gpu && !fits) {
    rep.binding =
        shape.memory_stage == 0
            ? fmt::format("GPU memory on the first pipeline stage ({} micro-batches in flight)",
                          shape.in_flight_first_stage)
            : fmt::format(
                  "GPU memory on pipeline stage {} ({:.3g} micro-batches' activations of "
                  "the simulated stage in flight)",
                  shape.memory_stage, shape.activation_factor);
  }
  rep.fits_gpu = fits;
}

// Step time, throughput and model FLOPs of the whole pipeline from the stage's two runs.
void compose_time(const sim::ScheduleInputs& in,
                  const sim::PipelineShape& shape,
                  const sim::StepReport& two,
                  sim::StepReport& rep) {
  const double t1 = rep.step_time_s;
  const double t_mb = std::max(0.0, two.step_time_s - t1);
  const double t_end = std::max(0.0, t1 - t_mb);
  const double send = sim::pipeline_p2p_s(in, shape);
  const double p2p =
      shape.p2p_exposed ? 2.0 * send : std::max(0.0, 2.0 * shape.virtual_stages * send - t_mb);
  rep.pipeline = shape;
  rep.pipeline_micro_batch_s = t_mb;
  rep.pipeline_p2p_s = send;
  rep.step_time_s = shape.step_slots * (t_mb + p2p) + t_end;
  const auto& par = in.parallel;
  const int m = shape.micro_batches;
  rep.tokens_per_step = par.seq_len * par.data_parallel() * m;
  const double gpus = static_cast<double>(par.gpus);
  rep.tokens_per_s_per_gpu = static_cast<double>(rep.tokens_per_step) / rep.step_time_s / gpus;
  rep.model_flops_per_step =
      models::model_step_flops(in.model, par.seq_len).total() * par.data_parallel() * m;
  rep.model_tflops_per_gpu = rep.model_flops_per_step / rep.step_time_s / gpus / 1e12;
  rep.mfu = rep.model_tflops_per_gpu * 1e12 / in.hardware.peak_bf16_flops_per_s;
  // Busy time of the stage's streams over m micro-batches; the rest of the step (bubble,
  // exposed P2P) is exposed non-compute time.
  for (std::size_t s = 0; s < rep.stream_busy_s.size(); ++s) {
    const double per_mb = std::max(0.0, two.stream_busy_s[s] - rep.stream_busy_s[s]);
    rep.stream_busy_s[s] += (m - 1) * per_mb;
  }
  rep.exposed_comm_s = std::max(
      0.0, rep.step_time_s - rep.stream_busy_s[static_cast<std::size_t>(sim::Stream::kCompute)]);
}

}  // namespace

Evaluation simulate_pipeline_stage_one(const sim::ScheduleInputs& inputs,
                                       const EvaluateOptions& options,
                                       EvaluationScratch* scratch) {
  const sim::ScheduleInputs one = sim::pipeline_stage_inputs(inputs, 1);
  return scratch != nullptr ? evaluate(one, options, *scratch) : evaluate(one, options);
}

sim::StepReport simulate_pipeline_stage_two(const sim::ScheduleInputs& inputs,
                                            const EvaluateOptions& options,
                                            EvaluationScratch* scratch) {
  EvaluateOptions plain;
  plain.all_ranks = options.all_ranks;
  plain.merge_ring_steps = options.merge_ring_steps;
  const sim::ScheduleInputs two = sim::pipeline_stage_inputs(inputs, 2);
  return scratch != nullptr ? evaluate(two, plain, *scratch).report : evaluate(two, plain).report;
}

StageRuns simulate_pipeline_stage(const sim::ScheduleInputs& inputs,
                                  const EvaluateOptions& options,
                                  EvaluationScratch* scratch) {
  StageRuns runs;
  runs.one = simulate_pipeline_stage_one(inputs, options, scratch);
  if (runs.one.report.stopped_early) {
    runs.two = runs.one.report;  // over the capacity with one micro-batch: no step fits
    return runs;
  }
  runs.two = simulate_pipeline_stage_two(inputs, options, scratch);
  return runs;
}

bool pipeline_fits(const sim::ScheduleInputs& inputs, const sim::StepReport& one) {
  sim::StepReport rep = one;
  add_in_flight_activations(sim::pipeline_shape(inputs), rep);
  return rep.fits();
}

Evaluation compose_pipeline(const sim::ScheduleInputs& inputs, const StageRuns& runs) {
  const sim::PipelineShape shape = sim::pipeline_shape(inputs);
  Evaluation e = runs.one;
  compose_time(inputs, shape, runs.two, e.report);
  add_in_flight_activations(shape, e.report);
  const bool uneven =
      inputs.parallel.pp_first_stage_layers > 0 || inputs.parallel.pp_last_stage_layers > 0;
  e.report.notes.push_back(fmt::format(
      "pipeline: PP {} ({}{}), {} micro-batches: one stage of {} blocks simulated{} (with the "
      "embedding and the LM head + loss both: first and last stage in one), the step composed "
      "analytically: (m + (P-1)/V) slots of {:.4g} s, bubble {:.3g}, P2P {:.3g} s per send/recv "
      "({}, {}), {:.3g} micro-batches' activations in flight on the first stage",
      shape.stages, models::to_string(inputs.parallel.pp_schedule),
      shape.virtual_stages > 1 ? fmt::format(" V={}", shape.virtual_stages) : "",
      shape.micro_batches, shape.stage_layers,
      uneven ? fmt::format(" (the largest of {}/{}/{} on the first/middle/last stages)",
                           shape.first_stage_layers, shape.middle_stage_layers,
                           shape.last_stage_layers)
             : "",
      e.report.pipeline_micro_batch_s, shape.bubble_fraction, e.report.pipeline_p2p_s,
      models::to_string(shape.p2p_span),
      shape.p2p_exposed ? "exposed: 1F1B's P2P is blocking" : "overlapped with the next chunk",
      shape.in_flight_first_stage));
  return e;
}

Evaluation evaluate_pipeline(const sim::ScheduleInputs& inputs,
                             const EvaluateOptions& options,
                             EvaluationScratch* scratch) {
  const sim::HeadLayout checked = sim::derive_head_layout(inputs);  // throws ConfigError
  (void)checked;
  return compose_pipeline(inputs, simulate_pipeline_stage(inputs, stage_options(options), scratch));
}

}  // namespace cpsim::planner
