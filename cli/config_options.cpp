// The flags that describe one configuration (model, hardware, method, degrees, recipe knobs),
// shared by simulate, maxlen, plan, sweep, report and validate: their registration and their
// resolution into the simulator's inputs.
#include "config_options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "config_flags.hpp"

namespace cpsim::cli {
namespace {

// The attention kernel comes from --attention-kernel or, without the flag, from the recipe. A
// profile without curves for it (FlashAttention-3 on a pre-Hopper GPU, say) is an input error that
// names where the kernel came from, before anything is built.
void check_attention_kernel(const models::HardwareProfile& hw,
                            const models::TrainingRecipe& r,
                            bool from_flag) {
  if (hw.attention_kernels.count(r.attention_kernel) != 0) {
    return;
  }
  if (from_flag) {
    (void)hw.attention_kernel(r.attention_kernel);  // throws, naming --attention-kernel
  }
  std::string known;
  for (const auto& [name, model] : hw.attention_kernels) {
    known += known.empty() ? name : ", " + name;
  }
  throw InputError(
      "recipe.attention_kernel",
      fmt::format("recipe '{}' uses attention kernel '{}', for which hardware profile "
                  "'{}' has no curves (it has: {}); choose one with --attention-kernel",
                  r.name, r.attention_kernel, hw.name, known));
}

/// FP8 compute (--fp8 or the recipe's precision.fp8): what TransformerEngine's FP8 Linear needs
/// of the set-up and of the profile, named by the flag when the flag asked for it.
void check_fp8(const models::HardwareProfile& hw,
               models::TrainingRecipe& r,
               const std::string& flag) {
  if (!flag.empty()) {
    r.fp8 = parse_switch(flag, "--fp8");
  }
  if (!r.fp8) {
    return;
  }
  const std::string field = flag.empty() ? "recipe.precision.fp8" : "--fp8";
  if (hw.peak_fp8_flops_per_s <= 0.0) {
    throw InputError(field, fmt::format("hardware {} has no FP8 tensor-core peak "
                                        "(gpu.peak_fp8_flops_per_s)",
                                        hw.name));
  }
  if (r.tiled_mlp) {
    throw InputError(field, "FP8 runs TransformerEngine's Linear layers: needs --tiled-mlp off");
  }
  if (r.zero_stage == 3) {
    throw InputError(field,
                     "FP8 weight caching is modelled for unsharded compute weights: needs "
                     "--zero 0, 1 or 2");
  }
}

/// Tiled MLP shards: `--tiled-mlp SHARDS` within what a recipe allows (1 to 2^20).
std::int64_t parse_mlp_shards(const std::string& text) {
  constexpr std::int64_t kMaxShards = std::int64_t{1} << 20;
  const std::int64_t shards = parse_length(text, "--tiled-mlp");
  if (shards > kMaxShards) {
    throw InputError("--tiled-mlp", fmt::format("{} shards is out of range: give on, off or a "
                                                "shard count from 1 to {}",
                                                shards, kMaxShards));
  }
  return shards;
}

/// ZeRO-Offload (DeepSpeed `offload_optimizer`, FSDP CPU offload) moves the optimizer's partition
/// to the host: there is a partition only under ZeRO stage 1 to 3. Names the flag that was given.
void check_optimizer_offload(const models::TrainingRecipe& r, const SimulateArgs& a) {
  if (!r.optimizer_offload || r.zero_stage >= 1) {
    return;
  }
  if (!a.optimizer_offload.empty()) {
    throw InputError("--optimizer-offload",
                     "optimizer offload needs ZeRO stage 1, 2 or 3 (it offloads the optimizer "
                     "partition, as DeepSpeed ZeRO-Offload does); got --zero 0");
  }
  throw InputError("--zero", fmt::format("recipe '{}' offloads the optimizer, which needs ZeRO "
                                         "stage 1, 2 or 3; add --optimizer-offload off for "
                                         "stage 0",
                                         r.name));
}

/// The CP degree must divide the GPU count; the error names the flag the degree came from.
void check_cp_degree_divides_gpus(const SimulateArgs& a, int cp_degree) {
  if (cp_degree >= 1 && a.gpus % cp_degree == 0) {
    return;
  }
  if (a.pp > 1 && a.cp_degree <= 0 && a.ulysses_degree <= 0 && a.ring_degree <= 0) {
    throw InputError("--pp", fmt::format("TP degree {} × PP degree {} must divide --gpus {}", a.tp,
                                         a.pp, a.gpus));
  }
  if (a.tp > 1 && a.cp_degree <= 0 && a.ulysses_degree <= 0 && a.ring_degree <= 0) {
    throw InputError("--tp", fmt::format("TP degree {} must divide --gpus {}", a.tp, a.gpus));
  }
  std::string flag = "--cp-degree";
  std::string from = fmt::format("CP degree {}", cp_degree);
  if (a.cp_degree <= 0 && a.ulysses_degree > 0 && a.ring_degree > 0) {
    flag = "--ulysses-degree";
    from = fmt::format("Ulysses degree {} × ring degree {} = CP degree {}", a.ulysses_degree,
                       a.ring_degree, cp_degree);
  } else if (a.cp_degree <= 0 && a.ulysses_degree > 0) {
    flag = "--ulysses-degree";
  } else if (a.cp_degree <= 0 && a.ring_degree > 0) {
    flag = "--ring-degree";
  }
  throw InputError(flag, fmt::format("{} must divide --gpus {}", from, a.gpus));
}

}  // namespace

std::string recipe_for(const SimulateArgs& a) {
  if (!a.recipe_given) {
    if (const sim::Implementation* impl = sim::find_implementation(a.impl);
        impl != nullptr && !impl->default_recipe().empty()) {
      return std::string(impl->default_recipe());
    }
  }
  return a.recipe;
}

namespace {

// --ac, --ac-offload, --tiled-mlp, --fused-loss and the kernel flags over the recipe's values.
void apply_kernel_and_checkpoint_flags(const SimulateArgs& a, models::TrainingRecipe& r) {
  if (!a.ac.empty()) {
    r.checkpointing = models::parse_checkpoint_mode(a.ac, "--ac");
    if (r.checkpointing != models::CheckpointMode::kFull && a.ac_offload.empty()) {
      r.checkpoint_offload = false;  // only full checkpointing produces block inputs to offload
    }
  }
  if (!a.ac_offload.empty()) {
    r.checkpoint_offload = parse_switch(a.ac_offload, "--ac-offload");
    if (r.checkpoint_offload && r.checkpointing != models::CheckpointMode::kFull) {
      throw InputError("--ac-offload",
                       "checkpoint offload needs --ac full (it offloads block inputs)");
    }
  }
  if (!a.tiled_mlp.empty()) {
    if (std::isdigit(static_cast<unsigned char>(a.tiled_mlp[0])) != 0) {
      r.tiled_mlp = true;
      r.tiled_mlp_shards = parse_mlp_shards(a.tiled_mlp);
    } else {
      r.tiled_mlp = parse_switch(a.tiled_mlp, "--tiled-mlp");
      r.tiled_mlp_shards = 0;
    }
  }
  if (!a.fused_loss.empty()) {
    r.fused_loss = parse_switch(a.fused_loss, "--fused-loss");
  }
  if (!a.norm_kernel.empty()) {
    r.norm_kernel = models::parse_norm_kernel(a.norm_kernel, "--norm-kernel");
  }
  if (!a.rope_kernel.empty()) {
    r.rope_kernel = models::parse_rope_kernel(a.rope_kernel, "--rope-kernel");
  }
  if (!a.mlp_kernel.empty()) {
    r.mlp_kernel = models::parse_mlp_kernel(a.mlp_kernel, "--mlp-kernel");
  }
  if (!a.int32_indexing.empty()) {
    r.int32_kernel_indexing = parse_switch(a.int32_indexing, "--int32-indexing");
  }
  if (!a.attention_kernel.empty()) {
    r.attention_kernel = a.attention_kernel;
  }
}

// --zero, the offloads, --fp8 and --comm-dtype over the recipe's values.
void apply_sharding_and_precision_flags(const SimulateArgs& a,
                                        const models::HardwareProfile& hw,
                                        models::TrainingRecipe& r) {
  if (a.zero >= 0) {
    if (a.zero > 3) {
      throw InputError("--zero", fmt::format("ZeRO stage must be 0, 1, 2 or 3, got {}", a.zero));
    }
    r.zero_stage = a.zero;
  }
  if (!a.optimizer_offload.empty()) {
    r.optimizer_offload = parse_switch(a.optimizer_offload, "--optimizer-offload");
  }
  check_optimizer_offload(r, a);
  if (!a.param_offload.empty()) {
    r.param_offload = parse_switch(a.param_offload, "--param-offload");
    if (r.param_offload && r.zero_stage != 3) {
      throw InputError("--param-offload",
                       fmt::format("parameter offload needs ZeRO stage 3, got {}", r.zero_stage));
    }
  }
  check_fp8(hw, r, a.fp8);
  if (!a.comm_dtype.empty()) {
    if (a.comm_dtype == "bf16" || a.comm_dtype == "fp16") {
      r.cp_comm_bytes = 2;
    } else if (a.comm_dtype == "fp32") {
      r.cp_comm_bytes = 4;
    } else {
      throw InputError("--comm-dtype",
                       fmt::format("expected bf16 or fp32, got '{}'", a.comm_dtype));
    }
  }
}

// CP degree: explicit, else ulysses × ring when both are given, else the one given for a method
// that has only that part, else the GPUs that TP and PP leave (0 when they do not divide).
int cp_degree_from_flags(const SimulateArgs& a, const sim::CpScheme& method) {
  for (const auto& [value, flag] :
       {std::pair{a.cp_degree, "--cp-degree"}, std::pair{a.ulysses_degree, "--ulysses-degree"},
        std::pair{a.ring_degree, "--ring-degree"}}) {
    if (value < 0) {
      throw InputError(flag, "must be positive");
    }
  }
  if (a.cp_degree > 0) {
    return a.cp_degree;
  }
  if (a.ulysses_degree > 0 && a.ring_degree > 0) {
    return a.ulysses_degree * a.ring_degree;
  }
  if (!method.has_ring_part() && a.ulysses_degree > 0) {
    return a.ulysses_degree;
  }
  if (!method.has_ulysses_part() && a.ring_degree > 0) {
    return a.ring_degree;
  }
  const int tp_pp = std::max(1, a.tp) * std::max(1, a.pp);
  return a.gpus % tp_pp == 0 ? a.gpus / tp_pp : 0;
}

// --pp, --pp-schedule, --virtual-stages and the uneven stages.
void apply_pipeline_flags(const SimulateArgs& a, models::ParallelConfig& p) {
  p.pp_degree = a.pp;
  if (!a.pp_schedule.empty()) {
    p.pp_schedule = models::parse_pipeline_schedule(a.pp_schedule, "--pp-schedule");
  }
  if (a.virtual_stages > 0 && p.pp_schedule != models::PipelineSchedule::kInterleaved) {
    throw InputError("--virtual-stages", "needs --pp-schedule interleaved");
  }
  if (p.pp_schedule == models::PipelineSchedule::kInterleaved && a.virtual_stages < 2) {
    throw InputError("--virtual-stages",
                     "--pp-schedule interleaved needs --virtual-stages V of at least 2");
  }
  p.virtual_stages = std::max(1, a.virtual_stages);
  p.pp_first_stage_layers = a.pp_first_stage_layers;
  p.pp_last_stage_layers = a.pp_last_stage_layers;
}

// The ring degree: given, else all of CP for a ring-only method, 1 for a Ulysses-only one, CP /
// the Ulysses degree given, else Ulysses inside a node and the ring across nodes (yunchang's
// "ulysses low" placement).
void apply_ring_degree(const SimulateArgs& a,
                       const sim::CpScheme& method,
                       models::ParallelConfig& p) {
  if (!method.has_ulysses_part()) {
    p.ring_degree = a.ring_degree > 0 ? a.ring_degree : p.cp_degree;
    if (a.ulysses_degree > 1) {
      throw InputError("--ulysses-degree", fmt::format("--method {} has no Ulysses part; use "
                                                       "--method usp for Ulysses × ring",
                                                       a.method));
    }
  } else if (!method.has_ring_part()) {
    p.ring_degree = a.ring_degree > 0 ? a.ring_degree : 1;
  } else if (a.ring_degree > 0) {
    p.ring_degree = a.ring_degree;
  } else if (a.ulysses_degree > 0 && p.cp_degree % a.ulysses_degree == 0) {
    p.ring_degree = p.cp_degree / a.ulysses_degree;
  } else {
    p.ring_degree = p.cp_degree > p.gpus_per_node && p.cp_degree % p.gpus_per_node == 0
                        ? p.cp_degree / p.gpus_per_node
                        : 1;
  }
  if (a.ulysses_degree > 0 && p.ring_degree > 0 && p.cp_degree % p.ring_degree == 0 &&
      a.ulysses_degree != p.cp_degree / p.ring_degree) {
    throw InputError("--ulysses-degree",
                     fmt::format("Ulysses degree {} × ring degree {} must equal the CP degree {}",
                                 a.ulysses_degree, p.ring_degree, p.cp_degree));
  }
}

// The method's own knobs: ring layout, FPDT chunk and offload, UPipe's heads per stage.
void apply_method_knobs(const SimulateArgs& a,
                        const sim::CpScheme& method,
                        models::ParallelConfig& p) {
  if (!a.ring_layout.empty()) {
    p.ring_layout = models::parse_ring_layout(a.ring_layout, "--ring-layout");
  }
  if (!a.fpdt_chunk.empty()) {
    p.fpdt_chunk = parse_length(a.fpdt_chunk, "--fpdt-chunk");
  }
  if (!a.fpdt_offload.empty()) {
    p.fpdt_offload = parse_switch(a.fpdt_offload, "--fpdt-offload");
  }
  if ((!a.fpdt_chunk.empty() || !a.fpdt_offload.empty()) && !method.uses_fpdt_chunk()) {
    throw InputError(a.fpdt_chunk.empty() ? "--fpdt-offload" : "--fpdt-chunk",
                     "applies to --method fpdt only");
  }
  p.seq_len = parse_length(a.seq, "--seq");
  if (a.heads_per_stage != 0 && !method.uses_heads_per_stage()) {
    throw InputError("--heads-per-stage", "applies to --method upipe only");
  }
  if (a.heads_per_stage < 0) {
    throw InputError("--heads-per-stage", "must be positive");
  }
  p.heads_per_stage = a.heads_per_stage;
}

void apply_parallel_flags(const SimulateArgs& a, sim::ScheduleInputs& in) {
  auto& p = in.parallel;
  p.method = models::parse_cp_method(a.method, "--method");
  p.implementation = a.impl;
  if (const sim::Implementation* impl = sim::find_implementation(a.impl);
      impl != nullptr && !a.method_given) {
    p.method = impl->methods().front();  // --impl alone: the implementation's first method
  }
  p.gpus = a.gpus;
  if (a.gpus_per_node < 0) {
    throw InputError("--gpus-per-node", "must be positive");
  }
  p.gpus_per_node = a.gpus_per_node > 0 ? a.gpus_per_node : in.hardware.gpus_per_node;
  const sim::CpScheme& method = sim::cp_scheme(p.method);
  p.cp_degree = cp_degree_from_flags(a, method);
  check_cp_degree_divides_gpus(a, p.cp_degree);
  p.tp_degree = a.tp;
  p.ep_degree = a.ep;
  if (!a.expert_imbalance.empty()) {
    double value = 0.0;
    const std::string& text = a.expert_imbalance;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
        value < 1.0) {
      throw InputError("--expert-imbalance",
                       fmt::format("expected a number of at least 1 (the busiest rank's token "
                                   "copies over the balanced share), got '{}'",
                                   text));
    }
    if (a.ep_given && a.ep <= 1) {
      throw InputError("--expert-imbalance", "applies with expert parallelism (--ep above 1)");
    }
    p.expert_imbalance = value;
  }
  p.micro_batches = a.micro_batches;
  apply_pipeline_flags(a, p);
  apply_ring_degree(a, method, p);
  apply_method_knobs(a, method, p);
}

}  // namespace

sim::ScheduleInputs resolve_inputs(const SimulateArgs& a) {
  const models::DataDir data = data_dir();
  sim::ScheduleInputs in;
  if (a.gpus < 1) {
    throw InputError("--gpus", fmt::format("must be at least 1, got {}", a.gpus));
  }
  in.model = models::load_model(a.model, data);
  in.hardware = models::load_hardware(a.hardware, data);
  if (!a.memory_margin.empty()) {
    in.margin.gpu_bytes = memory_margin_bytes(a.memory_margin, in.hardware.hbm_capacity_bytes,
                                              "--memory-margin", "GPU's memory");
  }
  if (!a.host_memory_margin.empty()) {
    in.margin.host_bytes =
        memory_margin_bytes(a.host_memory_margin, in.hardware.host_memory_bytes_per_node,
                            "--host-memory-margin", "node's host memory");
  }
  in.recipe = models::load_recipe(recipe_for(a), data);
  auto& r = in.recipe;
  // The recipe's RoPE for this model's type, once: every later reader sees one kernel.
  r.rope_kernel = r.rope_kernel_for(in.model.model_type);
  r.rope_kernel_by_model_type.clear();
  apply_kernel_and_checkpoint_flags(a, r);
  if (in.model.is_moe() && r.tiled_mlp && a.tiled_mlp.empty()) {
    // The recipe's, not the user's: turned off and said so (check_experts refuses it).
    r.tiled_mlp = false;
    in.model.notes.emplace_back(
        "the recipe's tiled MLP is off: a tiled MLP around a mixture of experts is not modelled "
        "(--tiled-mlp on is refused)");
  }
  check_attention_kernel(in.hardware, r, !a.attention_kernel.empty());
  apply_sharding_and_precision_flags(a, in.hardware, r);
  apply_parallel_flags(a, in);
  return in;
}

namespace {

/// A CLI11 check: a whole number from `lo` to `hi`. Flags whose 0 or -1 stands for "derived" or
/// "from the recipe" take it only as their default, never from the command line.
CLI::Validator whole_number_in(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        long long value = 0;
        if (!CLI::detail::lexical_cast(text, value) || value < lo || value > hi) {
          return fmt::format("must be a whole number from {} to {}, got '{}'", lo, hi, text);
        }
        return {};
      },
      fmt::format("INT in [{} - {}]", lo, hi));
}

constexpr long long kMaxGpus = 65536;

}  // namespace

namespace {

// --model, --gpus, --hardware, --method, --impl, --seq and --recipe.
void add_model_and_method_options(CLI::App* c, SimulateArgs& a, bool with_seq) {
  c->add_option("--model", a.model,
                "built-in model name (see `cpsim models`) or path to a "
                "Hugging Face config.json")
      ->capture_default_str();
  c->add_option("--gpus", a.gpus, "number of GPUs")->capture_default_str();
  c->add_option("--gpus-per-node", a.gpus_per_node,
                "GPUs per node (default: from the hardware profile)")
      ->check(whole_number_in(1, kMaxGpus));
  c->add_option("--hardware", a.hardware,
                "built-in hardware profile (see `cpsim hardware`) or a "
                "profile file")
      ->capture_default_str();
  c->add_option("--method", a.method,
                "context-parallel method: ulysses | upipe | ring | allgather | fpdt | usp; a "
                "comma-separated list or `all` compares them side by side")
      ->capture_default_str()
      ->each([&a](const std::string&) { a.method_given = true; });
  c->add_option("--impl", a.impl,
                fmt::format("implementation of the method that runs (see `cpsim implementations`): "
                            "{}, or none for the method's scheme alone (default: the recipe's "
                            "default for the method; alone it also picks the method)",
                            sim::implementation_names()));
  if (with_seq) {
    c->add_option("--seq", a.seq, "global sequence length in tokens (131072, 128K, 3M)")
        ->capture_default_str()
        ->each([&a](const std::string&) { a.seq_given = true; });
  }
  c->add_option("--recipe", a.recipe,
                "built-in recipe name or recipe file (default: alst, or the recipe --impl's "
                "implementation is the default of, e.g. alst-deepspeed for deepspeed-ulysses)")
      ->capture_default_str()
      ->each([&a](const std::string&) { a.recipe_given = true; });
}

// The degrees and layouts: CP, Ulysses and ring parts, TP, PP, micro-batches, the methods' knobs.
void add_parallel_options(CLI::App* c, SimulateArgs& a) {
  c->add_option(
       "--heads-per-stage", a.heads_per_stage,
       "UPipe: query heads per stage U, a multiple of the CP degree (default: the CP degree)")
      ->check(whole_number_in(1, std::int64_t{1} << 20));
  c->add_option("--cp-degree", a.cp_degree,
                "context-parallel group size C; the rest of the GPUs are data parallel "
                "(default: all GPUs, or ulysses × ring)")
      ->check(whole_number_in(1, kMaxGpus));
  c->add_option("--ulysses-degree", a.ulysses_degree,
                "Ulysses (all-to-all) part of C: ulysses, fpdt, usp, upipe (default: C, or the "
                "GPUs of a node for usp/upipe across nodes)")
      ->check(whole_number_in(1, kMaxGpus));
  c->add_option("--ring-degree", a.ring_degree,
                "ring part of C: usp, upipe (default: C / GPUs per node across nodes, else 1); "
                "ring and allgather use C")
      ->check(whole_number_in(1, kMaxGpus));
  c->add_option("--tp", a.tp,
                "tensor-parallel degree T with sequence parallelism (Megatron-style), T "
                "consecutive GPUs of a node; the CP degree defaults to GPUs / T "
                "(megatron-core-cp, torch-native-cp and --impl none run it; default: 1; plan "
                "searches it unless given)")
      ->check(whole_number_in(1, kMaxGpus))
      ->each([&a](const std::string&) { a.tp_given = true; });
  c->add_option("--ep", a.ep,
                "expert-parallel degree of a mixture-of-experts model: EP consecutive GPUs split "
                "the experts, tokens go to them by all-to-all (megatron-core-cp and "
                "torch-native-cp run it; default: 1; plan searches every EP dividing the "
                "experts and a stage's GPUs for a mixture of experts unless given)")
      ->check(whole_number_in(1, kMaxGpus))
      ->each([&a](const std::string&) { a.ep_given = true; });
  c->add_option("--expert-imbalance", a.expert_imbalance,
                "with --ep: token copies the busiest rank's experts receive, as a multiple of the "
                "balanced share k·s (dropless routing; default: 1, balanced)");
  c->add_option("--pp", a.pp,
                "pipeline-parallel degree P (outermost in the rank order, L/P blocks per stage; "
                "megatron-core-cp, torch-native-cp and --impl none run it; default: 1; plan "
                "searches it unless given, where the step may hold P micro-batches)")
      ->check(whole_number_in(1, kMaxGpus))
      ->each([&a](const std::string&) { a.pp_given = true; });
  c->add_option("--pp-schedule", a.pp_schedule,
                "pipeline schedule: 1f1b | interleaved (default: 1f1b)");
  c->add_option("--virtual-stages", a.virtual_stages,
                "interleaved schedule: model chunks per pipeline rank V (at least 2)")
      ->check(whole_number_in(1, 1024));
  c->add_option("--pp-first-stage-layers", a.pp_first_stage_layers,
                "blocks on the first pipeline stage (Megatron --decoder-first-pipeline-num-layers; "
                "the rest split evenly over the other stages; default: an even split)")
      ->check(whole_number_in(1, 1 << 20));
  c->add_option("--pp-last-stage-layers", a.pp_last_stage_layers,
                "blocks on the last pipeline stage (Megatron --decoder-last-pipeline-num-layers; "
                "default: an even split)")
      ->check(whole_number_in(1, 1 << 20));
  c->add_option("--micro-batches", a.micro_batches,
                "gradient accumulation: micro-batches of one sequence per optimizer step "
                "(default: 1; plan with PP: searched unless given)")
      ->check(whole_number_in(1, 65536))
      ->each([&a](const std::string&) { a.micro_batches_given = true; });
  c->add_option("--ring-layout", a.ring_layout,
                "token layout of ring attention: zigzag | contiguous "
                "(default: zigzag)");
  c->add_option("--fpdt-chunk", a.fpdt_chunk, "FPDT chunk in global tokens (default: 64K)");
  c->add_option("--fpdt-offload", a.fpdt_offload,
                "FPDT: offload chunks to pinned host memory: on | off (default: on)");
}

// What overrides the recipe: sharding, offloads, checkpointing, tiling, loss and kernels.
void add_recipe_options(CLI::App* c, SimulateArgs& a) {
  c->add_option("--zero", a.zero, "ZeRO stage 0-3 (3 = FSDP full shard; default: recipe)")
      ->check(whole_number_in(0, 3));
  c->add_option("--optimizer-offload", a.optimizer_offload,
                "fp32 master weights and optimizer states in host memory, CPU Adam: on | off");
  c->add_option("--param-offload", a.param_offload,
                "ZeRO-3 parameter shards in host memory, copied to the GPU block by block: "
                "on | off");
  c->add_option("--comm-dtype", a.comm_dtype,
                "dtype of context-parallel communication: bf16 | fp32 (default: recipe)");
  c->add_option("--ac", a.ac,
                "activation checkpointing: none | selective (the attention core runs again in "
                "backward; a note says where the method saves its own tensors and it is none) | "
                "full (default: recipe)");
  c->add_option("--ac-offload", a.ac_offload,
                "offload checkpointed block inputs to host: on | off");
  c->add_option("--tiled-mlp", a.tiled_mlp,
                "tiled MLP: on | off | SHARDS (default shards: "
                "ceil(local_seq / hidden))");
  c->add_option("--fused-loss", a.fused_loss, "fused linear cross-entropy: on | off");
  c->add_option("--norm-kernel", a.norm_kernel,
                "RMSNorm implementation: upcast (fp32 copies while it runs) | fused (Liger) | "
                "eager (Hugging Face eager: keeps fp32 input for backward)");
  c->add_option(
      "--rope-kernel", a.rope_kernel,
      "RoPE implementation: fused (Liger, TransformerEngine: one kernel) | eager (Hugging "
      "Face and DeepSpeed rotate_half: 5 kernels forward) | complex (TorchTitan: fp32 "
      "complex product)");
  c->add_option("--mlp-kernel", a.mlp_kernel,
                "untiled SwiGLU MLP: unfused | fused (Liger: gradients in place) | eager (Hugging "
                "Face: keeps silu(gate) too)");
  c->add_option("--int32-indexing", a.int32_indexing,
                "kernels with 32-bit offsets (Liger RMSNorm before PR #804, FlashAttention-2): "
                "tensors of 2^31 elements do not run: on | off (default: recipe)");
  c->add_option("--fp8", a.fp8,
                "FP8 Linear GEMMs as TransformerEngine runs them (delayed scaling): on | off "
                "(default: recipe, off)");
  c->add_option("--attention-kernel", a.attention_kernel,
                "attention kernel curve of the profile: "
                "fa3 | fa2 | cudnn | sdpa (default: recipe)");
}

// The memory kept free for a step to count as fitting.
void add_margin_options(CLI::App* c, SimulateArgs& a) {
  a.memory_margin = kDefaultGpuMargin;
  a.host_memory_margin = kDefaultHostMargin;
  c->add_option("--memory-margin", a.memory_margin,
                "kept free on every GPU for a step to count as fitting, against the reserved "
                "memory (what nvidia-smi shows): N% of the GPU or GiB (4, 4GiB, 512MiB); 0 "
                "for none")
      ->capture_default_str();
  c->add_option("--host-memory-margin", a.host_memory_margin,
                "kept free on every node's host memory: N% or GiB")
      ->capture_default_str();
}

}  // namespace

void add_config_options(CLI::App* c, SimulateArgs& a, bool with_seq) {
  add_model_and_method_options(c, a, with_seq);
  add_parallel_options(c, a);
  add_recipe_options(c, a);
  add_margin_options(c, a);
}

/// The arguments for one method of a comparison: knobs of other methods are dropped.
SimulateArgs config_for_method(const SimulateArgs& a, const std::string& method) {
  SimulateArgs m = a;
  m.method = method;
  m.method_given = true;
  m.recipe = recipe_for(a);  // one recipe for every method compared
  m.recipe_given = true;
  const models::CpMethod id = models::parse_cp_method(method, "--method");
  const sim::CpScheme& cp = sim::cp_scheme(id);
  if (const sim::Implementation* impl = sim::find_implementation(a.impl);
      impl != nullptr && !impl->runs(id)) {
    m.impl.clear();  // another method's implementation: this one runs its recipe default
  }
  if (!cp.uses_heads_per_stage()) {
    m.heads_per_stage = 0;
  }
  if (!cp.uses_fpdt_chunk()) {
    m.fpdt_chunk.clear();
    m.fpdt_offload.clear();
  }
  if (!cp.has_ring_part()) {
    m.ring_degree = 0;
  }
  if (!cp.has_ulysses_part()) {
    m.ulysses_degree = 0;
    m.ring_degree = 0;
  }
  return m;
}

std::vector<std::string> split_methods(const std::string& text, const char* field) {
  if (text == "all") {
    std::vector<std::string> all;
    for (const sim::CpScheme* m : sim::cp_schemes()) {
      all.emplace_back(m->name());
    }
    return all;
  }
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) {
      throw InputError(field, "empty name in the list");
    }
    if (std::find(out.begin(), out.end(), item) != out.end()) {
      throw InputError(field, fmt::format("{} is listed twice", item));
    }
    out.push_back(item);
    if (comma == std::string::npos) {
      break;
    }
    start = comma + 1;
  }
  return out;
}

}  // namespace cpsim::cli
