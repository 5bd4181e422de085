#include "evaluate_pipeline.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cpsim/sim/pipeline.hpp"

// A pipeline-parallel step composed from simulations of one stage (sim/pipeline.hpp for the
// schedule's counts and their sources). The stage (L/P blocks on G/P GPUs) is simulated three
// times: with the embedding and the LM head + loss both (standing for the last stage, and an upper
// bound on every stage's time) with one micro-batch and with two, and without the LM head + loss
// (the stages before the last) with one:
//   t_mb  = T(2) − T(1)        one micro-batch's forward + backward on the stage,
//   t_end = T(1) − t_mb        what runs once per step (optimizer, last gradient reduction),
//   step  = (m + (P − 1)/V)·(t_mb + p2p) + t_end,
// with p2p = 2 send/recv times per slot under 1F1B (blocking: one activation received forward, one
// gradient received backward) and max(0, 2·V·send/recv − t_mb) interleaved (overlapped with the
// next chunk). Memory: a stage holds `factor` micro-batches' activations of the simulated stage
// (sim::PipelineShape: activation_factor for the stage before the last that holds the most,
// last_stage_activation_factor for the last); its simulation holds one, so the rest,
// (factor − 1)·A, is added to that run's peak, with A what one micro-batch holds from the end of
// its forward to its backward (sim::forward_saved_bytes: the device tensors the embedding and the
// blocks' forward allocate and the recomputation or backward reads). A micro-batch in flight has
// run its forward and not yet its backward, so it holds neither the loss's logits nor a block's
// recomputed tensors. The step's peak is the larger of the two stages'; a stage holding fewer
// than the simulated stage's activations (factor < 1) is kept at its simulated peak.
namespace cpsim::planner {
namespace {

EvaluateOptions stage_options(const EvaluateOptions& options) {
  EvaluateOptions out = options;
  out.stop_above_device_bytes = 0;  // the extra in-flight activations are known only afterwards
  return out;
}

// A stage's peak with `factor` micro-batches in flight where its run held one; returns the bytes
// added.
std::int64_t add_in_flight_activations(double factor, sim::StepReport& rep) {
  const auto act = static_cast<std::size_t>(sim::MemCategory::kActivations);
  const double per_micro_batch = static_cast<double>(rep.forward_saved_bytes);
  const auto extra =
      static_cast<std::int64_t>(std::llround(std::max(0.0, factor - 1.0) * per_micro_batch));
  rep.peak_memory_bytes += extra;
  rep.breakdown_at_peak[act] += extra;
  rep.category_peak[act] += extra;
  if (rep.reserved_peak_bytes > 0) {
    rep.reserved_peak_bytes += extra;
  }
  rep.gpu_headroom_bytes -= extra;
  rep.fits_gpu = rep.gpu_headroom_bytes >= 0 && !rep.allocator_out_of_memory;
  return extra;
}

// The GPU memory of the stage that binds (the smaller headroom) into `rep`, whose time stays.
void take_gpu_memory(const sim::StepReport& from, sim::StepReport& rep) {
  rep.peak_memory_bytes = from.peak_memory_bytes;
  rep.peak_rank = from.peak_rank;
  rep.peak_op = from.peak_op;
  rep.breakdown_at_peak = from.breakdown_at_peak;
  rep.fixed_overhead_bytes = from.fixed_overhead_bytes;
  rep.nccl_memory_bytes = from.nccl_memory_bytes;
  rep.category_peak = from.category_peak;
  rep.gpu_headroom_bytes = from.gpu_headroom_bytes;
  rep.reserved_peak_bytes = from.reserved_peak_bytes;
  rep.allocator_cache_releases = from.allocator_cache_releases;
  rep.allocator_out_of_memory = from.allocator_out_of_memory;
  rep.forward_saved_bytes = from.forward_saved_bytes;
}

std::string stage_name(const sim::PipelineShape& shape, bool last) {
  if (last) {
    return "the last pipeline stage (LM head and loss)";
  }
  return shape.memory_stage == 0
             ? fmt::format("the first pipeline stage ({:.3g} micro-batches in flight)",
                           shape.in_flight_first_stage)
             : fmt::format(
                   "pipeline stage {} ({:.3g} micro-batches' activations of the "
                   "simulated stage in flight)",
                   shape.memory_stage, shape.activation_factor);
}

// Peak memory of the pipeline: the last stage's (the run with the LM head and the loss) and the
// in-flight stage's (the run without them), the one with less headroom in `rep`. Returns whether
// that is the last stage's.
bool compose_memory(const sim::PipelineShape& shape, const StageRuns& runs, sim::StepReport& rep) {
  sim::StepReport inner = runs.inner.report;
  const std::int64_t in_flight = add_in_flight_activations(shape.activation_factor, inner);
  add_in_flight_activations(shape.last_stage_activation_factor, rep);
  rep.pipeline_in_flight_extra_bytes = in_flight;
  rep.pipeline_inner_stage_peak_bytes = inner.peak_memory_bytes;
  rep.pipeline_last_stage_peak_bytes = rep.peak_memory_bytes;
  const bool last_binds = rep.gpu_headroom_bytes <= inner.gpu_headroom_bytes;
  const bool fits = rep.fits_gpu && inner.fits_gpu;
  if (!last_binds) {
    take_gpu_memory(inner, rep);
  }
  rep.host_memory_bytes = std::max(rep.host_memory_bytes, inner.host_memory_bytes);
  rep.fits_host = rep.fits_host && inner.fits_host;
  rep.stopped_early = rep.stopped_early || inner.stopped_early;
  rep.pipeline_peak_stage = stage_name(shape, last_binds);
  rep.fits_gpu = fits;
  if (!fits) {
    rep.binding = fmt::format("GPU memory on {} at {}", rep.pipeline_peak_stage, rep.peak_op);
  } else if (!rep.fits_host && rep.binding.empty()) {
    rep.binding = "host memory (pinned checkpoint offload)";
  }
  return last_binds;
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
                                       EvaluationScratch* scratch,
                                       sim::PipelineStage stage) {
  const sim::ScheduleInputs one = sim::pipeline_stage_inputs(inputs, 1, stage);
  EvaluateOptions measured = options;
  measured.measure_forward_saved = true;
  return scratch != nullptr ? evaluate(one, measured, *scratch) : evaluate(one, measured);
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
  runs.inner = simulate_pipeline_stage_one(inputs, options, scratch,
                                           sim::PipelineStage::kWithoutOutputLayer);
  runs.one =
      simulate_pipeline_stage_one(inputs, options, scratch, sim::PipelineStage::kWithOutputLayer);
  if (runs.one.report.stopped_early || runs.inner.report.stopped_early) {
    runs.two = runs.one.report;  // over the capacity with one micro-batch: no step fits
    return runs;
  }
  runs.two = simulate_pipeline_stage_two(inputs, options, scratch);
  return runs;
}

bool pipeline_fits(const sim::ScheduleInputs& inputs,
                   const sim::StepReport& one,
                   const sim::StepReport& inner) {
  StageRuns runs;
  runs.one.report = one;
  runs.inner.report = inner;
  sim::StepReport rep = one;
  (void)compose_memory(sim::pipeline_shape(inputs), runs, rep);
  return rep.fits();
}

Evaluation compose_pipeline(const sim::ScheduleInputs& inputs, const StageRuns& runs) {
  const sim::PipelineShape shape = sim::pipeline_shape(inputs);
  Evaluation e = runs.one;
  compose_time(inputs, shape, runs.two, e.report);
  if (!compose_memory(shape, runs, e.report)) {
    e.peak = runs.inner.peak;  // the largest allocations of the stage that binds
  }
  const bool uneven =
      inputs.parallel.pp_first_stage_layers > 0 || inputs.parallel.pp_last_stage_layers > 0;
  e.report.notes.push_back(fmt::format(
      "pipeline: PP {} ({}{}), {} micro-batches: one stage of {} blocks simulated{}, with the "
      "embedding and the LM head + loss (the last stage; the time of every stage) and without "
      "the LM head + loss (the stages before it), the step composed analytically: (m + (P-1)/V) "
      "slots of {:.4g} s, bubble {:.3g}, P2P {:.3g} s per send/recv ({}, {}), {:.3g} "
      "micro-batches' activations in flight on the first stage; host memory of the "
      "micro-batches in flight (offloaded checkpoints) is counted for one",
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
