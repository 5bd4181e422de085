// `cpsim simulate`: one training step of one configuration.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/trace.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "config_flags.hpp"
#include "cost.hpp"
#include "output.hpp"
#include "side_by_side.hpp"
#include "trace_output.hpp"

namespace cpsim::cli {
namespace {

constexpr int kSimulateSchemaVersion = 1;

}  // namespace

namespace {

std::string method_label(const sim::ScheduleInputs& in, const sim::HeadLayout& L) {
  return sim::cp_scheme(in.parallel.method).label(sim::LabelStyle::kDescription, in.parallel, &L);
}

std::string recipe_label(const models::TrainingRecipe& r,
                         const sim::StepReport& rep,
                         std::int64_t local_seq,
                         std::int64_t hidden) {
  std::string s = fmt::format("ZeRO-{}, AC {}", r.zero_stage, models::to_string(r.checkpointing));
  if (r.checkpointing == models::CheckpointMode::kFull) {
    s += r.checkpoint_offload ? (r.offload_keep_first_last ? ", checkpoints offloaded to host "
                                                             "(first/last layer kept)"
                                                           : ", checkpoints offloaded to host")
                              : ", checkpoints on GPU";
    if (r.checkpoint_reentrant) {
      s += " (reentrant)";
    }
  }
  if (r.tiled_mlp) {
    const std::int64_t shards =
        r.tiled_mlp_shards > 0 ? r.tiled_mlp_shards : (local_seq + hidden - 1) / hidden;
    s += fmt::format(", tiled MLP ({} shards)", shards);
  } else {
    s += ", untiled MLP";
  }
  s += r.fused_loss ? ", fused loss" : ", materialised logits";
  if (r.norm_kernel != models::NormKernel::kUpcast) {
    s += fmt::format(", {} RMSNorm", models::to_string(r.norm_kernel));
  }
  s += fmt::format(", {} RoPE", models::to_string(r.rope_kernel));
  if (r.param_offload) {
    s += ", parameters offloaded";
  }
  if (r.fp8) {
    s += ", FP8 Linear GEMMs (TransformerEngine delayed scaling)";
  }
  s += fmt::format(", {} attention", r.attention_kernel);
  (void)rep;
  return s;
}

// The configuration as simulated.
nlohmann::json config_json(const sim::ScheduleInputs& in,
                           const sim::HeadLayout& L,
                           const sim::Implementation* implementation) {
  using nlohmann::json;
  const auto& r = in.recipe;
  json c = {{"model", in.model.name},
            {"hardware", in.hardware.name},
            {"gpus", in.parallel.gpus},
            {"gpus_per_node", in.parallel.gpus_per_node},
            {"method", models::to_string(in.parallel.method)},
            {"implementation", implementation != nullptr ? json(implementation->name()) : json()},
            {"seq_len", in.parallel.seq_len},
            {"cp_degree", in.parallel.cp_degree},
            {"ulysses_degree", L.ulysses},
            {"ring_degree", L.ring},
            {"ring_layout", models::to_string(in.parallel.ring_layout)},
            {"fpdt_chunk", in.parallel.fpdt_chunk},
            {"fpdt_offload", in.parallel.fpdt_offload},
            {"optimizer_offload", r.optimizer_offload},
            {"param_offload", r.param_offload},
            {"comm_dtype", r.cp_comm_bytes == 4 ? "fp32" : "bf16"},
            {"data_parallel", in.parallel.data_parallel()},
            {"heads_per_stage", L.heads_per_stage},
            {"stages", L.stages},
            {"recipe", r.name},
            {"zero_stage", r.zero_stage},
            {"ac", models::to_string(r.checkpointing)},
            {"ac_offload", r.checkpoint_offload},
            {"tiled_mlp", r.tiled_mlp},
            {"fused_loss", r.fused_loss},
            {"norm_kernel", models::to_string(r.norm_kernel)},
            {"rope_kernel", models::to_string(r.rope_kernel)},
            {"mlp_kernel", models::to_string(r.mlp_kernel)},
            {"int32_kernel_indexing", r.int32_kernel_indexing},
            {"attention_kernel", r.attention_kernel}};
  // Written only when set, so that a run without them reads as before.
  if (in.parallel.tp_degree > 1 || in.parallel.micro_batches > 1) {
    c["tp_degree"] = in.parallel.tp_degree;
    c["micro_batches"] = in.parallel.micro_batches;
  }
  if (r.fp8) {
    c["fp8"] = true;
  }
  if (in.parallel.pp_degree > 1) {
    c["pp_degree"] = in.parallel.pp_degree;
    c["pp_schedule"] = models::to_string(in.parallel.pp_schedule);
    c["virtual_stages"] = in.parallel.virtual_stages;
  }
  if (in.model.is_moe()) {
    c["ep_degree"] = in.parallel.ep_degree;
    c["expert_imbalance"] = in.parallel.expert_imbalance;
  }
  return c;
}

// The pipeline's counts and both stages' peaks (PP > 1).
nlohmann::json pipeline_json(const sim::ScheduleInputs& in, const sim::StepReport& rep) {
  const sim::PipelineShape& s = rep.pipeline;
  nlohmann::json j = {{"stage_layers", s.stage_layers},
                      {"bubble_fraction", s.bubble_fraction},
                      {"warmup_first_stage", s.warmup_first_stage},
                      {"in_flight_first_stage", s.in_flight_first_stage},
                      {"in_flight_extra_bytes", rep.pipeline_in_flight_extra_bytes},
                      {"micro_batch_stage_s", rep.pipeline_micro_batch_s},
                      {"p2p_bytes", s.p2p_bytes},
                      {"p2p_s", rep.pipeline_p2p_s},
                      {"p2p_span", models::to_string(s.p2p_span)},
                      {"p2p_exposed", s.p2p_exposed},
                      {"last_stage_activation_factor", s.last_stage_activation_factor},
                      {"forward_saved_bytes", rep.forward_saved_bytes},
                      {"peak_stage", rep.pipeline_peak_stage},
                      {"first_stages_peak_bytes", rep.pipeline_inner_stage_peak_bytes},
                      {"last_stage_peak_bytes", rep.pipeline_last_stage_peak_bytes}};
  if (in.parallel.pp_first_stage_layers > 0 || in.parallel.pp_last_stage_layers > 0) {
    j["first_stage_layers"] = s.first_stage_layers;
    j["middle_stage_layers"] = s.middle_stage_layers;
    j["last_stage_layers"] = s.last_stage_layers;
    j["memory_stage"] = s.memory_stage;
    j["activation_factor"] = s.activation_factor;
  }
  return j;
}

nlohmann::json attention_buffers_json(const sim::AttentionBuffers& a) {
  return {{"qkv_local", a.qkv_local_bytes},
          {"qkv_headsharded", a.qkv_headsharded_bytes},
          {"out_headsharded", a.out_headsharded_bytes},
          {"out_local", a.out_local_bytes},
          {"lse", a.lse_bytes},
          {"final_out", a.final_out_bytes},
          {"a2a_send_per_layer_forward", a.a2a_send_bytes_per_layer_fwd},
          {"ring_block", a.ring_block_bytes},
          {"allgather_kv", a.allgather_kv_bytes}};
}

nlohmann::json peak_contents_json(const sim::PeakContents& peak) {
  nlohmann::json largest = nlohmann::json::array();
  for (const sim::LiveTensor& t : peak.largest) {
    largest.push_back({{"name", t.name},
                       {"allocated_by", t.producer},
                       {"category", sim::to_string(t.category)},
                       {"bytes", t.bytes}});
  }
  return {
      {"largest", largest}, {"other_bytes", peak.other_bytes}, {"other_count", peak.other_count}};
}

nlohmann::json to_json(const sim::ScheduleInputs& in,
                       const sim::StepReport& rep,
                       const sim::PeakContents* peak = nullptr) {
  using nlohmann::json;
  json breakdown;
  json category_peaks;
  for (int c = 0; c < sim::kMemCategoryCount; ++c) {
    const auto cat = static_cast<sim::MemCategory>(c);
    breakdown[sim::to_string(cat)] = rep.breakdown_at_peak[static_cast<std::size_t>(c)];
    category_peaks[sim::to_string(cat)] = rep.category_peak[static_cast<std::size_t>(c)];
  }
  breakdown["fixed_overhead"] = rep.fixed_overhead_bytes;
  breakdown["nccl"] = rep.nccl_memory_bytes;
  json busy;
  for (int s = 0; s < sim::kStreamCount; ++s) {
    busy[sim::to_string(static_cast<sim::Stream>(s))] =
        rep.stream_busy_s[static_cast<std::size_t>(s)];
  }
  json j = {
      {"schema_version", kSimulateSchemaVersion},
      {"command", "simulate"},
      {"config", config_json(in, rep.layout, rep.implementation)},
      {"step_time_s", rep.step_time_s},
      {"tokens_per_step", rep.tokens_per_step},
      {"tokens_per_s_per_gpu", rep.tokens_per_s_per_gpu},
      {"model_tflops_per_gpu", rep.model_tflops_per_gpu},
      {"mfu", rep.mfu},
      {"peak_memory_bytes", rep.peak_memory_bytes},
      {"memory_breakdown_bytes", breakdown},
      {"category_peak_bytes", category_peaks},
      {"peak", {{"rank", rep.peak_rank}, {"op", rep.peak_op}}},
      {"gpu_capacity_bytes", rep.gpu_capacity_bytes},
      {"gpu_margin_bytes", rep.gpu_margin_bytes},
      {"headroom_bytes", rep.gpu_headroom_bytes},
      {"fits_decided_on", rep.reserved_checked ? "reserved" : "allocated"},
      {"reserved_memory_bytes",
       rep.reserved_peak_bytes > 0 ? json(rep.reserved_peak_bytes) : json(nullptr)},
      {"allocator_cache_releases", rep.allocator_cache_releases},
      {"allocator_out_of_memory", rep.allocator_out_of_memory},
      {"host_memory_bytes", rep.host_memory_bytes},
      {"host_capacity_bytes", rep.host_capacity_bytes},
      {"host_margin_bytes", rep.host_margin_bytes},
      {"fits", rep.fits()},
      {"fits_gpu", rep.fits_gpu},
      {"fits_host", rep.fits_host},
      {"binding_constraint", rep.binding.empty() ? json(nullptr) : json(rep.binding)},
      {"attention_buffers_bytes", attention_buffers_json(rep.attention)},
      {"stream_busy_s", busy},
      {"exposed_non_compute_s", rep.exposed_comm_s},
      {"simulator",
       {{"ops", rep.ops}, {"events", rep.events}, {"simulated_ranks", rep.simulated_ranks}}},
      {"notes", rep.notes},
  };
  if (in.parallel.pp_degree > 1) {
    j["pipeline"] = pipeline_json(in, rep);
  }
  if (peak != nullptr) {
    j["peak_contents"] = peak_contents_json(*peak);
  }
  return j;
}

// The pipeline's layout, schedule, in-flight micro-batches and P2P.
std::string pipeline_line(const sim::ScheduleInputs& in, const sim::StepReport& rep) {
  const sim::PipelineShape& s = rep.pipeline;
  const bool uneven = in.parallel.pp_first_stage_layers > 0 || in.parallel.pp_last_stage_layers > 0;
  const std::string blocks =
      uneven ? fmt::format("{}/{}/{} blocks on the first/middle/last stages (the {} simulated)",
                           s.first_stage_layers, s.middle_stage_layers, s.last_stage_layers,
                           s.stage_layers)
             : fmt::format("{} blocks per stage", s.stage_layers);
  const std::string held =
      s.memory_stage == 0 ? ""
                          : fmt::format("; stage {} holds the most activations", s.memory_stage);
  return fmt::format(
      "  PP {} ({}{}): {} on {} GPUs, bubble {:.3f}, {:.3g} micro-batches in "
      "flight on the first stage{} (+{}); P2P {} per send/recv on the {} link, {}\n",
      s.stages, models::to_string(in.parallel.pp_schedule),
      s.virtual_stages > 1 ? fmt::format(", {} virtual stages", s.virtual_stages) : "", blocks,
      in.parallel.gpus / s.stages, s.bubble_fraction, s.in_flight_first_stage, held,
      format_bytes(static_cast<double>(rep.pipeline_in_flight_extra_bytes)),
      format_bytes(static_cast<double>(s.p2p_bytes)), models::to_string(s.p2p_span),
      s.p2p_exposed ? "exposed (blocking)" : "overlapped");
}

// The set-up: model, method, recipe, implementation, TP/DP/PP layout, micro-batches.
std::string setup_lines(const sim::ScheduleInputs& in, const sim::StepReport& rep) {
  const auto& L = rep.layout;
  std::string o;
  o += fmt::format("{} on {} x {}, {}, seq {} ({} tokens), recipe {}\n", in.model.name,
                   in.parallel.gpus, in.hardware.name, method_label(in, L),
                   format_length(in.parallel.seq_len), in.parallel.seq_len, in.recipe.name);
  o +=
      fmt::format("  {}\n", recipe_label(in.recipe, rep, in.parallel.local_seq(), in.model.hidden));
  if (const sim::Implementation* impl = rep.implementation; impl != nullptr) {
    o += fmt::format("  implementation {} ({}; ledger {})\n", impl->name(), impl->pinned_source(),
                     impl->ledger_document());
  } else {
    o += "  implementation none: the method's scheme alone (no wrapper allocations)\n";
  }
  const int tp = in.parallel.tp_degree;
  if (tp > 1) {
    o += fmt::format(
        "  TP {} with sequence parallelism (groups of {} consecutive GPUs; CP groups "
        "of stride {}), sharding over the {} GPUs of each TP position\n",
        tp, tp, tp, in.parallel.gpus / (tp * in.parallel.pp_degree));
  }
  if (in.parallel.data_parallel() > 1 && tp == 1 && in.parallel.pp_degree == 1) {
    o += fmt::format("  {} CP groups of {} GPUs (data parallel), FSDP over all {}\n",
                     in.parallel.data_parallel(), in.parallel.cp_degree, in.parallel.gpus);
  } else if (in.parallel.data_parallel() > 1 && in.parallel.pp_degree > 1) {
    o += fmt::format("  {} data-parallel replicas of CP {} x TP {} GPUs in each of {} stages\n",
                     in.parallel.data_parallel(), in.parallel.cp_degree, tp, in.parallel.pp_degree);
  } else if (in.parallel.data_parallel() > 1) {
    o += fmt::format("  {} data-parallel replicas of CP {} x TP {} GPUs\n",
                     in.parallel.data_parallel(), in.parallel.cp_degree, tp);
  }
  if (in.parallel.pp_degree > 1) {
    o += pipeline_line(in, rep);
  }
  if (const models::MoeSpec& e = in.model.moe; in.model.is_moe()) {
    const int ep = in.parallel.ep_degree;
    o += ep > 1 ? fmt::format(
                      "  experts: EP {} (groups of {} consecutive GPUs), {} of the {} "
                      "experts on each GPU{}\n",
                      ep, ep, e.experts / ep, e.experts,
                      in.parallel.expert_imbalance > 1.0
                          ? fmt::format("; the busiest receives {}x the balanced tokens",
                                        in.parallel.expert_imbalance)
                          : "; routing balanced (--expert-imbalance)")
                : fmt::format("  experts: all {} on every GPU ({} per token; --ep splits them)\n",
                              e.experts, e.experts_per_token);
  }
  if (tp > 1 || in.parallel.micro_batches > 1 || in.parallel.pp_degree > 1) {
    o += fmt::format("  {} micro-batch{} per step: {} tokens per step\n", in.parallel.micro_batches,
                     in.parallel.micro_batches > 1 ? "es" : "", rep.tokens_per_step);
  }
  return o;
}

// The peak, where it is and whether it fits, and the reserved memory.
std::string peak_lines(const sim::ScheduleInputs& in, const sim::StepReport& rep) {
  std::string o;
  const std::string margin =
      rep.gpu_margin_bytes > 0
          ? fmt::format(" beyond the {} margin",
                        format_bytes(static_cast<double>(rep.gpu_margin_bytes)))
          : "";
  const std::string decided_by = rep.reserved_checked ? " (reserved)" : "";
  const std::string verdict =
      rep.fits_gpu                  ? fmt::format("fits, {} headroom{}{}",
                                                  format_bytes(static_cast<double>(rep.gpu_headroom_bytes)),
                                                  decided_by, margin)
      : rep.allocator_out_of_memory ? "DOES NOT FIT (the caching allocator runs out of memory)"
      : rep.gpu_headroom_bytes >= 0
          ? "DOES NOT FIT with the margin (the caching allocator reaches the whole GPU and empties "
            "its cache)"
          : fmt::format("DOES NOT FIT, {} over{}{}",
                        format_bytes(static_cast<double>(-rep.gpu_headroom_bytes)), decided_by,
                        rep.gpu_margin_bytes > 0 ? " with the margin" : "");
  o += fmt::format("  peak GPU memory      {} of {}: {}\n",
                   format_bytes(static_cast<double>(rep.peak_memory_bytes)),
                   format_bytes(static_cast<double>(rep.gpu_capacity_bytes)), verdict);
  if (rep.pipeline_peak_stage.empty()) {
    o += fmt::format("  at                   rank {}, {}\n", rep.peak_rank, rep.peak_op);
  } else {
    o += fmt::format("  at                   {}: rank {}, {}\n", rep.pipeline_peak_stage,
                     rep.peak_rank, rep.peak_op);
    o += fmt::format(
        "  per stage            {} before the last stage (with its micro-batches in flight), {} "
        "on the last (LM head and loss)\n",
        format_bytes(static_cast<double>(rep.pipeline_inner_stage_peak_bytes)),
        format_bytes(static_cast<double>(rep.pipeline_last_stage_peak_bytes)));
  }
  if (rep.reserved_peak_bytes > 0 && rep.allocator_out_of_memory && rep.fits_gpu) {
    o += fmt::format(
        "  reserved             {} needed by PyTorch's caching allocator (modelled): MORE THAN THE "
        "GPU, out of memory from fragmentation although the allocated peak fits; run with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (recipe allocator.expandable_segments)\n",
        format_bytes(static_cast<double>(rep.reserved_peak_bytes)));
  } else if (rep.reserved_peak_bytes > 0) {
    o += fmt::format(
        "  reserved             {} (what nvidia-smi shows: PyTorch's caching allocator{}, "
        "modelled{})\n",
        format_bytes(static_cast<double>(rep.reserved_peak_bytes)),
        in.recipe.expandable_segments ? " with expandable segments" : "",
        rep.allocator_cache_releases > 0
            ? fmt::format("; it empties its cache {} time(s) to fit", rep.allocator_cache_releases)
            : "");
  }
  return o;
}

// `table`, each line indented by four spaces.
// The categories at the peak and on their own, the largest allocations, the host memory.
std::string memory_tables(const sim::StepReport& rep, const sim::PeakContents* peak) {
  std::vector<std::vector<std::string>> rows;
  for (int c = 0; c < sim::kMemCategoryCount; ++c) {
    const auto i = static_cast<std::size_t>(c);
    rows.push_back({sim::to_string(static_cast<sim::MemCategory>(c)),
                    format_bytes(static_cast<double>(rep.breakdown_at_peak[i])),
                    format_bytes(static_cast<double>(rep.category_peak[i]))});
  }
  rows.push_back({"fixed overheads", format_bytes(static_cast<double>(rep.fixed_overhead_bytes)),
                  format_bytes(static_cast<double>(rep.fixed_overhead_bytes))});
  // NCCL's communicators, part of the fixed overheads (docs/MODEL.md "NCCL memory").
  rows.push_back({"  of which NCCL", format_bytes(static_cast<double>(rep.nccl_memory_bytes)),
                  format_bytes(static_cast<double>(rep.nccl_memory_bytes))});
  std::string o = indent_lines(
      format_table({"category", "at peak", "own peak"}, rows, {false, true, true}), "    ");
  if (peak != nullptr && !peak->largest.empty()) {
    o += "  largest allocations at the peak (model states and fixed overheads not listed):\n";
    std::vector<std::vector<std::string>> big;
    for (const sim::LiveTensor& t : peak->largest) {
      big.push_back({t.name, format_bytes(static_cast<double>(t.bytes)), sim::to_string(t.category),
                     t.producer});
    }
    if (peak->other_count > 0) {
      big.push_back({fmt::format("{} others", peak->other_count),
                     format_bytes(static_cast<double>(peak->other_bytes)), "", ""});
    }
    o += indent_lines(format_table({"tensor", "bytes", "category", "allocated by"}, big,
                                   {false, true, false, false}),
                      "    ");
  }
  o += fmt::format("  host memory (pinned) {} per node of {}: {}{}\n",
                   format_bytes(static_cast<double>(rep.host_memory_bytes)),
                   format_bytes(static_cast<double>(rep.host_capacity_bytes)),
                   rep.fits_host ? "fits" : "DOES NOT FIT",
                   rep.host_margin_bytes > 0
                       ? fmt::format(" with a {} margin",
                                     format_bytes(static_cast<double>(rep.host_margin_bytes)))
                       : "");
  return o;
}

// Attention buffers, stream occupancy, what was simulated, and the modelling notes.
std::string detail_lines(const sim::ScheduleInputs& in, const sim::StepReport& rep) {
  std::string o;
  const auto& A = rep.attention;
  o += fmt::format(
      "  attention buffers per rank ({}): QKV local {}, head-sharded {}, out {}, LSE {}",
      rep.layout.stages > 1 ? "one stage" : "all heads",
      format_bytes(static_cast<double>(A.qkv_local_bytes)),
      format_bytes(static_cast<double>(A.qkv_headsharded_bytes)),
      format_bytes(static_cast<double>(A.out_headsharded_bytes)),
      format_bytes(static_cast<double>(A.lse_bytes)));
  if (A.final_out_bytes > 0) {
    o += fmt::format(", final_out {}", format_bytes(static_cast<double>(A.final_out_bytes)));
  }
  o += "\n";
  o += fmt::format("  streams busy (rank 0): compute {}, comm {}, fsdp {}, d2h {}, h2d {}\n",
                   format_seconds(rep.stream_busy_s[0]), format_seconds(rep.stream_busy_s[1]),
                   format_seconds(rep.stream_busy_s[2]), format_seconds(rep.stream_busy_s[3]),
                   format_seconds(rep.stream_busy_s[4]));
  o += fmt::format("  step time not covered by compute (exposed comm/copies): {}\n",
                   format_seconds(rep.exposed_comm_s));
  o += fmt::format("  simulated {} ops, {} events{}\n", rep.ops, rep.events,
                   rep.simulated_ranks < in.parallel.gpus
                       ? " (one representative rank: every rank runs the same schedule)"
                       : "");
  if (!rep.notes.empty()) {
    o += "\n  modelling notes:\n";
    for (const auto& n : rep.notes) {
      o += "    - " + n + "\n";
    }
  }
  return o;
}

std::string human(const sim::ScheduleInputs& in,
                  const sim::StepReport& rep,
                  const sim::PeakContents* peak = nullptr) {
  std::string o = setup_lines(in, rep);
  o += "\n";
  o += fmt::format("  step time            {}\n", format_seconds(rep.step_time_s));
  o += fmt::format("  throughput           {:.1f} tokens/s/GPU\n", rep.tokens_per_s_per_gpu);
  o += fmt::format("  model TFLOP/s/GPU    {:.1f}  (MFU {:.1f} %, model FLOPs exclude recompute)\n",
                   rep.model_tflops_per_gpu, 100.0 * rep.mfu);
  o += "\n";
  o += peak_lines(in, rep);
  o += memory_tables(rep, peak);
  o += "\n";
  o += detail_lines(in, rep);
  return o;
}

}  // namespace

CLI::App* register_simulate(CLI::App& app, SimulateArgs& a) {
  CLI::App* c = app.add_subcommand("simulate", "Simulate one training step of one configuration");
  c->footer(
      "Exit status 3 when the configuration does not fit (GPU memory, host memory or a kernel's "
      "32-bit limit; with several methods: when none fits), after printing the answer; 2 for bad "
      "input.");
  add_config_options(c, a, /*with_seq=*/true);
  add_cost_options(c, a.gpu_hour_cost, a.train_tokens);
  c->add_option("--trace", a.trace,
                "write a Chrome/Perfetto trace (JSON) of the step to FILE (- = standard output, "
                "the summary then goes to standard error)")
      ->check(output_path_check());
  c->add_option("--trace-ranks", a.trace_ranks,
                "ranks the trace shows: `all` or a list such as 0,3,5-7 (default: 0, the "
                "representative rank)");
  c->add_option("--trace-layers", a.trace_layers,
                "layers whose ops the trace shows, e.g. 0-1,31 (default: all, with the ops "
                "outside layers); memory counters stay complete");
  c->add_option("--trace-max-bytes", a.trace_max_bytes,
                "refuse a trace estimated above this size (default: 1G)");
  c->add_flag("--trace-force", a.trace_force, "write the trace whatever its estimated size");
  c->add_flag("--json", a.json, "print one JSON object instead of the table");
  add_batch_options(c, a);
  return c;
}

namespace {

// Flags every method of a comparison shares: wrong for one, wrong for all.
bool is_shared_flag(const std::string& f) {
  return f == "--gpus" || f == "--hardware" || f == "--recipe" || f == "--ac" ||
         f == "--ac-offload" || f == "--tiled-mlp" || f == "--fused-loss" || f == "--zero" ||
         f == "--param-offload" || f == "--norm-kernel" || f == "--mlp-kernel" ||
         f == "--int32-indexing" || f == "--fp8" || f == "--memory-margin" ||
         f == "--host-memory-margin" || f.find(".json") != std::string::npos;
}

// One method of a comparison: its inputs and report, or why it cannot run.
struct ComparisonRow {
  std::string method;
  std::string error;
  sim::ScheduleInputs in;
  sim::StepReport rep;
};

// A comparison's exit status: 0 when at least one method fits, else kExitDoesNotFit.
int comparison_status(const std::vector<ComparisonRow>& rows) {
  const bool one_fits = std::any_of(rows.begin(), rows.end(), [](const ComparisonRow& r) {
    return r.error.empty() && r.rep.fits();
  });
  return one_fits ? 0 : kExitDoesNotFit;
}

ComparisonRow simulate_row(const SimulateArgs& a, const std::string& method) {
  ComparisonRow row;
  row.method = method;
  const SimulateArgs m = config_for_method(a, method);
  try {
    row.in = resolve_inputs(m);
    planner::EvaluateOptions with_allocator;  // "fits" is decided on the reserved memory
    with_allocator.model_allocator = true;
    row.rep = planner::evaluate(row.in, with_allocator).report;
  } catch (const sim::ConfigError& e) {
    // A length out of range, or a flag every method shares, stops the comparison; a method that
    // cannot run this configuration (heads vs degree, divisibility) is reported in its row.
    const InputError flagged = flag_error(e);
    if (refuses_every_method(e) || is_shared_flag(flagged.field())) {
      throw;
    }
    row.error = flagged.what();
  } catch (const InputError& e) {
    // Shared inputs (model, lengths, files) are wrong for every method: stop.
    if (e.field() == "--seq" || is_shared_flag(e.field())) {
      throw;
    }
    row.error = e.what();
  }
  return row;
}

nlohmann::json comparison_json(const std::vector<ComparisonRow>& rows,
                               const std::optional<CostRate>& rate) {
  nlohmann::json list = nlohmann::json::array();
  for (const ComparisonRow& r : rows) {
    if (r.error.empty()) {
      list.push_back(to_json(r.in, r.rep));
      if (rate) {
        list.back()["cost"] = cost_json(
            *rate, step_cost(*rate, r.rep.step_time_s, r.rep.tokens_per_step, r.in.parallel.gpus));
      }
    } else {
      list.push_back({{"config", {{"method", r.method}}}, {"error", r.error}});
    }
  }
  return nlohmann::json{
      {"schema_version", kSimulateSchemaVersion}, {"command", "simulate"}, {"comparison", list}};
}

void print_comparison_table(const std::vector<ComparisonRow>& rows) {
  std::vector<std::vector<std::string>> table;
  for (const ComparisonRow& r : rows) {
    if (!r.error.empty()) {
      table.push_back({r.method, "-", "-", "-", "-", "-", "-", "-", "cannot run"});
      continue;
    }
    const auto& p = r.rep;
    table.push_back({r.method, format_seconds(p.step_time_s),
                     fmt::format("{:.1f}", p.tokens_per_s_per_gpu),
                     fmt::format("{:.1f}", 100.0 * p.mfu),
                     format_bytes(static_cast<double>(p.peak_memory_bytes)),
                     format_bytes(static_cast<double>(
                         p.category_peak[static_cast<std::size_t>(sim::MemCategory::kAttention)])),
                     format_bytes(static_cast<double>(p.host_memory_bytes)),
                     format_seconds(p.exposed_comm_s), p.fits() ? "yes" : "NO"});
  }
  std::cout << format_table({"method", "step", "tok/s/GPU", "MFU %", "peak GPU", "attention",
                             "host/node", "exposed", "fits"},
                            table, {false, true, true, true, true, true, true, true, false});
}

// What sets each method's peak and time.
void print_comparison_why(const std::vector<ComparisonRow>& rows) {
  std::cout << "\nwhy:\n";
  for (const ComparisonRow& r : rows) {
    if (!r.error.empty()) {
      std::cout << fmt::format("  {:<10} {}\n", r.method, r.error);
      continue;
    }
    const auto& p = r.rep;
    // The largest sequence-dependent category at the peak (model states and gathered
    // parameters do not change with the method).
    std::size_t top = static_cast<std::size_t>(sim::MemCategory::kActivations);
    for (std::size_t c = top; c < sim::kMemCategoryCount; ++c) {
      if (p.breakdown_at_peak[c] > p.breakdown_at_peak[top])
        top = c;
    }
    std::cout << fmt::format(
        "  {:<10} {}; peak at {} (largest: {} {}); {:.0f} % of the step not "
        "covered by compute\n",
        r.method, method_label(r.in, p.layout), p.peak_op,
        sim::to_string(static_cast<sim::MemCategory>(top)),
        format_bytes(static_cast<double>(p.breakdown_at_peak[top])),
        p.step_time_s > 0 ? 100.0 * p.exposed_comm_s / p.step_time_s : 0.0);
  }
}

// Side-by-side table of several methods, with what sets each one's peak and time.
// Every method's row; the methods' error when none can run.
std::vector<ComparisonRow> comparison_rows(const SimulateArgs& a,
                                           const std::vector<std::string>& methods) {
  std::vector<ComparisonRow> rows;
  for (const std::string& method : methods) {
    rows.push_back(simulate_row(a, method));
  }
  const bool any =
      std::any_of(rows.begin(), rows.end(), [](const ComparisonRow& r) { return r.error.empty(); });
  if (!any) {
    throw InputError("--method", "no method can run this configuration: " + rows.front().error);
  }
  return rows;
}

int run_comparison(const SimulateArgs& a,
                   const std::vector<std::string>& methods,
                   const std::optional<CostRate>& rate) {
  const std::vector<ComparisonRow> rows = comparison_rows(a, methods);
  if (a.json) {
    std::cout << comparison_json(rows, rate).dump(2) << "\n";
    return comparison_status(rows);
  }
  const ComparisonRow& first = *std::find_if(
      rows.begin(), rows.end(), [](const ComparisonRow& r) { return r.error.empty(); });
  std::cout << fmt::format("{} on {} x {}, seq {} ({} tokens), recipe {}\n\n", first.in.model.name,
                           first.in.parallel.gpus, first.in.hardware.name,
                           format_length(first.in.parallel.seq_len), first.in.parallel.seq_len,
                           first.in.recipe.name);
  print_comparison_table(rows);
  print_comparison_why(rows);
  if (rate) {
    std::cout << "\ncost:\n";
    for (const ComparisonRow& r : rows) {
      if (r.error.empty()) {
        std::cout << fmt::format("  {:<10}\n", r.method)
                  << cost_lines(*rate,
                                step_cost(*rate, r.rep.step_time_s, r.rep.tokens_per_step,
                                          r.in.parallel.gpus),
                                "    ");
      }
    }
  }
  return comparison_status(rows);
}

// The step of one configuration as `simulate` reports it: with the peak explained, the caching
// allocator replayed, and the trace kept for the ranks of `trace` (nullptr: none).
planner::Evaluation evaluate_one(const SimulateArgs& a,
                                 const sim::ScheduleInputs& in,
                                 const sim::TraceSelection* trace) {
  planner::EvaluateOptions opts;
  opts.keep_trace = trace != nullptr && !a.trace.empty();
  if (trace != nullptr) {
    opts.trace_ranks = trace->ranks;
  }
  opts.explain_peak = true;
  opts.model_allocator = true;
  planner::Evaluation e = planner::evaluate(in, opts);
  const sim::CpScheme& method = sim::cp_scheme(in.parallel.method);
  if (in.recipe.checkpointing == models::CheckpointMode::kSelective &&
      !method.recomputes_selectively(in.parallel)) {
    e.report.notes.push_back(fmt::format(
        "--ac selective: {} keeps what it keeps without checkpointing (its attention saves its "
        "own tensors for backward), so this is the step of --ac none",
        method.label(sim::LabelStyle::kDescription, in.parallel, &e.report.layout)));
  }
  return e;
}

// The same question on each profile of `--hardware a,b,...`, side by side.
int run_side_by_side(const SimulateArgs& a,
                     const std::vector<std::string>& profiles,
                     const std::optional<CostRate>& rate) {
  if (!a.trace.empty()) {
    throw InputError("--trace", "write a trace for one hardware profile at a time");
  }
  const bool several_methods = a.method.find(',') != std::string::npos || a.method == "all";
  std::vector<HardwareAnswer> answers;
  int status = kExitDoesNotFit;
  for (const std::string& hardware : profiles) {
    SimulateArgs on = a;
    on.hardware = hardware;
    if (several_methods) {
      const std::vector<ComparisonRow> rows =
          comparison_rows(on, split_methods(on.method, "--method"));
      answers.push_back({hardware, comparison_json(rows, rate)});
      status = std::min(status, comparison_status(rows));
      continue;
    }
    const sim::ScheduleInputs in = resolve_inputs(on);
    const planner::Evaluation e = evaluate_one(on, in, nullptr);
    nlohmann::json j = to_json(in, e.report, &e.peak);
    if (rate) {
      j["cost"] = cost_json(*rate, step_cost(*rate, e.report.step_time_s, e.report.tokens_per_step,
                                             in.parallel.gpus));
    }
    answers.push_back({hardware, std::move(j)});
    status = std::min(status, e.report.fits() ? 0 : kExitDoesNotFit);
  }
  std::cout << (a.json ? side_by_side_json("simulate", answers).dump(2) + "\n"
                       : side_by_side_table("simulate", answers));
  return status;
}

}  // namespace

int run_simulate(const SimulateArgs& a) {
  if (!a.lengths.empty() || !a.pack.empty()) {
    return run_simulate_batches(a);
  }
  check_batch_flags_need_lengths(a);
  const std::optional<CostRate> rate = parse_cost_rate(a.gpu_hour_cost, a.train_tokens);
  if (const std::vector<std::string> profiles = hardware_profiles(a.hardware);
      profiles.size() > 1) {
    return run_side_by_side(a, profiles, rate);
  }
  if (a.method.find(',') != std::string::npos || a.method == "all") {
    if (!a.trace.empty()) {
      throw InputError("--trace", "write a trace for one method at a time");
    }
    return run_comparison(a, split_methods(a.method, "--method"), rate);
  }
  const sim::ScheduleInputs in = resolve_inputs(a);
  const sim::TraceSelection trace = trace_selection(a, in);
  const planner::Evaluation e = evaluate_one(a, in, &trace);
  if (!a.trace.empty()) {
    write_trace(a, in, e, trace);
  }
  // With `--trace -` the trace is standard output; the summary goes to standard error.
  std::ostream& summary = a.trace == "-" ? std::cerr : std::cout;
  const StepCost cost =
      rate ? step_cost(*rate, e.report.step_time_s, e.report.tokens_per_step, in.parallel.gpus)
           : StepCost{};
  if (a.json) {
    nlohmann::json j = to_json(in, e.report, &e.peak);
    if (rate) {
      j["cost"] = cost_json(*rate, cost);
    }
    summary << j.dump(2) << "\n";
  } else {
    summary << human(in, e.report, &e.peak);
    if (rate) {
      summary << "\n" << cost_lines(*rate, cost, "  ");
    }
    if (!a.trace.empty() && a.trace != "-") {
      summary << "\n  trace written to " << a.trace
              << " (open in ui.perfetto.dev or chrome://tracing)\n";
    }
  }
  return e.report.fits() ? 0 : kExitDoesNotFit;
}

}  // namespace cpsim::cli
