#include <string>
#include <utility>

#include <fmt/format.h>

#include "cpsim/sim/pipeline.hpp"

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- TorchTitan v0.2.2 and v0.2.1 TOML (REFERENCES.md [TorchTitan]) ---------------------------
// Older releases (--launcher-version): TorchTitan 0.3.0, the current release, reads no TOML
// (torchtitan_main.cpp writes its config function). v0.2.2's training ignores
// context_parallel_rotate_method (only validate.py reads it), so its CP is PyTorch's default
// all-gather and the ring runs from v0.2.1's TOML alone (the methods' launcher tables).

// What the TOML cannot set (the notes of emit_torchtitan_toml): no checkpoint offload, tiled
// MLP/norm or fused loss key; CP attention runs SDPA (TorchTitan's ScaledDotProductAttention:
// cuDNN, flash, efficient in that priority, torchtitan/models/attention.py in v0.2.0); gradients
// reduce in float32; CP tensors move in the compute dtype; the model's RoPE buffer (freqs_cis or
// rope_cache, persistent, max_seq_len = training.seq_len) holds every position.
RecipeAsRun torchtitan_toml_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  no_transformer_engine_fp8(r, "TorchTitan (its float8 is torchao)");
  torchtitan_rope(r, in.model, "TorchTitan");
  torchtitan_rope_cache(r, in.model, false, "TorchTitan v0.2.x");
  no_offload_or_tiling(r, "no TorchTitan TOML key", "no TorchTitan TOML key");
  run_as(r, x.fused_loss, false, "logits materialised (no fused-loss TOML key)");
  if (x.attention_kernel != "sdpa" && x.attention_kernel != "cudnn") {
    run_as(r, x.attention_kernel, std::string("sdpa"), "attention through PyTorch SDPA");
  }
  run_as(r, x.grad_reduce_bytes, std::int64_t{4}, "gradients reduced in float32");
  comm_dtype_fixed(r, "TorchTitan");
  return r;
}

namespace {

// [model]: the registered model and flavor of this shape. Without one the file would train
// TorchTitan's default model (its debug model), so a shape no flavor matches is refused.
std::string model_section(const Plan& p) {
  if (p.model.is_moe()) {
    throw InputError("--model", fmt::format("the mixture-of-experts flavors of TorchTitan v0.2.x "
                                            "were not read: {} is emitted for TorchTitan 0.3.0 "
                                            "(the default --launcher-version)",
                                            p.model.name));
  }
  const Flavor fl = torchtitan_flavor(p.model);
  if (fl.name == nullptr) {
    throw InputError("--model", fmt::format("no TorchTitan llama3 or qwen3 flavor matches {} "
                                            "({}); the TOML would train TorchTitan's default model",
                                            p.model.name, shape_summary(p.model)));
  }
  return fmt::format("[model]\nname = {}\nflavor = {}\n\n", quoted(fl.name), quoted(fl.flavor));
}

// [training]: the batch (pipeline micro-batches or gradient accumulation), length, precision.
std::string training_section(Plan& p) {
  std::string body;
  if (p.par.pp_degree > 1) {
    // The pipeline's micro-batches: local_batch_size / pipeline_parallel_microbatch_size
    // (distributed/pipeline_parallel.py:186-194), no gradient accumulation on top.
    body += fmt::format(
        "[training]\nlocal_batch_size = {}  # {} pipeline micro-batches of one sequence\n"
        "global_batch_size = {}  # x data parallel {}\n",
        p.par.micro_batches, p.par.micro_batches, p.par.micro_batches * p.dp, p.dp);
  } else {
    body += "[training]\nlocal_batch_size = 1\n";
  }
  if (p.par.micro_batches > 1 && p.par.pp_degree == 1) {
    body += fmt::format(
        "global_batch_size = {}  # {} micro-batches (gradient accumulation) x data parallel {}\n",
        p.par.micro_batches * p.dp, p.par.micro_batches, p.dp);
  }
  body += fmt::format("seq_len = {}  # divisible by 2 x cp = {}\n", p.seq, 2 * p.cp);
  body += fmt::format("mixed_precision_param = {}\n",
                      quoted(p.recipe.param_bytes == 4 ? "float32" : "bfloat16"));
  body += "mixed_precision_reduce = \"float32\"  # the only value TorchTitan accepts\n";
  if (p.recipe.grad_reduce_bytes != 4) {
    p.note(
        "TorchTitan reduces gradients in float32 only; the recipe's narrower gradient reduce is "
        "not expressible");
  }
  if (p.recipe.optimizer_offload) {
    body +=
        "enable_cpu_offload = true  # FSDP CPU offload: parameters, gradients AND optimizer "
        "states live on the host (more than cpsim's optimizer offload)\n";
    p.note(
        "training.enable_cpu_offload offloads parameters, gradients and optimizer states "
        "(FSDP CPUOffload), not only the optimizer as simulated");
  }
  return body;
}

// The pipeline keys of [parallelism] (PP > 1).
std::string pipeline_keys(Plan& p) {
  const TorchTitanPipeline pl = torchtitan_pipeline(p);
  const sim::PipelineShape s = sim::pipeline_shape(p.in);
  std::string body = fmt::format(
      "pipeline_parallel_degree = {}\npipeline_parallel_schedule = {}\n"
      "pipeline_parallel_microbatch_size = 1\n"
      "pipeline_parallel_first_stage_less_layers = {}  # blocks per stage: {}/{}/{} "
      "(first/middle/last)\npipeline_parallel_last_stage_less_layers = {}\n",
      p.par.pp_degree, quoted(pl.schedule), pl.first_less, s.first_stage_layers,
      s.middle_stage_layers, s.last_stage_layers, pl.last_less);
  if (pl.layers_per_stage > 0) {
    body += fmt::format("pipeline_parallel_layers_per_stage = {}  # {} virtual stages per rank\n",
                        pl.layers_per_stage, p.par.virtual_stages);
  }
  p.note(
      "PyTorch's pipelining schedules (Schedule1F1B, ScheduleInterleaved1F1B) are timed with "
      "Megatron-Core's schedule counts (warm-up, micro-batches in flight, bubble)");
  return body;
}

// The context-parallel keys of [parallelism]: degree, rotation, load balancer.
std::string context_parallel_keys(Plan& p, bool allgather) {
  const bool v022 = p.format == LauncherFormat::kTorchTitan022;
  std::string body = fmt::format("context_parallel_degree = {}\n", p.cp);
  if (allgather) {
    body += v022 ? "context_parallel_rotate_method = \"allgather\"  # read by validation only; "
                   "training runs PyTorch's default, the all-gather\n"
                 : "context_parallel_rotate_method = \"allgather\"  # all-gather K/V after the "
                   "first sub-SDPA (all-gather CP)\n";
  } else {
    body +=
        "context_parallel_rotate_method = \"alltoall\"  # ring: K/V shards rotate peer to peer "
        "(TorchTitan's name for ring passing)\n";
  }
  // The balancer key is new in v0.2.2; v0.2.1 balances head and tail (PyTorch's default
  // _cp_options.enable_load_balance).
  if (p.zigzag() && v022) {
    body += "context_parallel_load_balancer = \"headtail\"  # zigzag layout (SDPA)\n";
  } else if (!p.zigzag()) {
    body += v022 ? "# context_parallel_load_balancer: the contiguous layout needs None, which TOML "
                   "cannot write (an empty string is rejected)\n"
                 : "# v0.2.1 has no load-balancer key: PyTorch's head-tail balancing runs\n";
    p.note(
        "contiguous layout is not expressible in the TOML; TorchTitan's default head-tail "
        "(zigzag) balancing will run, which evens out causal work");
  }
  return body;
}

// [parallelism]: data, tensor, pipeline and context parallelism, FSDP's sharding.
std::string parallelism_section(Plan& p, bool allgather) {
  std::string body = "\n[parallelism]\ndata_parallel_replicate_degree = 1\n";
  if (p.par.tp_degree > 1) {
    body += fmt::format(
        "tensor_parallel_degree = {}  # with sequence parallelism (TorchTitan's TP plan)\n",
        p.par.tp_degree);
  }
  if (p.par.pp_degree > 1) {
    body += pipeline_keys(p);
  }
  body += fmt::format(
      "data_parallel_shard_degree = -1  # the leftover ranks ({}); FSDP shards over dp_shard x cp "
      "= {} GPUs\n",
      p.dp, p.par.gpus / p.par.pp_degree);
  if (p.recipe.zero_stage < 3) {
    body += fmt::format(
        "fsdp_reshard_after_forward = \"never\"  # keeps gathered parameters after forward, the "
        "closest FSDP2 gets to ZeRO-{}\n",
        p.recipe.zero_stage);
    p.note(
        fmt::format("TorchTitan always shards with FSDP2 (ZeRO-3 style); ZeRO-{} is "
                    "approximated by fsdp_reshard_after_forward = \"never\"",
                    p.recipe.zero_stage));
  }
  return body + context_parallel_keys(p, allgather);
}

// [activation_checkpoint].
std::string checkpoint_section(Plan& p) {
  std::string body = "\n[activation_checkpoint]\n";
  switch (p.recipe.checkpointing) {
    case CheckpointMode::kFull:
      body += "mode = \"full\"\n";
      break;
    case CheckpointMode::kSelective:
      body +=
          "mode = \"selective\"\nselective_ac_option = \"op\"  # per-op SAC; cpsim's selective "
          "(attention core recomputed) has no exact TorchTitan equivalent\n";
      p.note(
          "selective checkpointing maps to TorchTitan's per-op SAC, which saves different "
          "tensors than cpsim's selective model (attention core recomputed)");
      break;
    case CheckpointMode::kNone:
      body += "mode = \"none\"\n";
      break;
  }
  return body;
}

// What the TOML cannot say.
void notes_on_what_the_toml_cannot_say(Plan& p) {
  if (p.ckpt_offload()) {
    p.note(
        "checkpoint offload to host (block inputs in pinned memory) has no TorchTitan TOML key; "
        "it lives in code (e.g. the UPipe fork's \"offload\" attn_impl)");
  }
  p.note_if_ckpt_offload_ignored();
  if (p.recipe.tiled_mlp) {
    p.note(
        "tiled MLP / tiled RMSNorm have no TorchTitan TOML key; they live in code (the UPipe "
        "fork's \"tiled_mlp\" attn_impl)");
  }
  if (p.recipe.fused_loss) {
    p.note(
        "fused linear cross-entropy (logits never materialised) has no TorchTitan TOML key; it "
        "lives in code");
  }
  if (p.recipe.attention_kernel != "sdpa" && p.recipe.attention_kernel != "cudnn") {
    p.note(
        fmt::format("TorchTitan CP runs PyTorch SDPA (flash / cuDNN backends) or flex; the "
                    "recipe's {} kernel is not selectable",
                    p.recipe.attention_kernel));
  }
  p.note_comm_dtype_fixed("TorchTitan");
}

}  // namespace

EmittedConfig emit_torchtitan_toml(Plan& p) {
  require_seq_multiple_of_2cp(p, "TorchTitan",
                              "training.seq_len must be divisible by tp x 2 x cp for CP load "
                              "balancing");
  const bool allgather = p.selects() == "allgather";  // context_parallel_rotate_method
  std::string body = model_section(p);
  body += training_section(p);
  body += parallelism_section(p, allgather);
  body += checkpoint_section(p);
  notes_on_what_the_toml_cannot_say(p);

  LauncherText text;
  text.usage = {
      fmt::format(
          "{} TOML job config: CONFIG_FILE={} ./run_train.sh", launcher_target(p.format),
          p.main_file(p.format == LauncherFormat::kTorchTitan022 ? "cpsim_torchtitan-0.2.2.toml"
                                                                 : "cpsim_torchtitan-0.2.1.toml")),
      "(TorchTitan 0.3.0 and main take a Python config function instead: --emit torchtitan, "
      "--emit torchtitan-main)"};
  add_environment_line(p, text.usage);
  text.body = "\n" + body;
  text.filename = p.format == LauncherFormat::kTorchTitan022 ? "cpsim_torchtitan-0.2.2.toml"
                                                             : "cpsim_torchtitan-0.2.1.toml";
  return finish(p, std::move(text));
}

}  // namespace cpsim::planner::emit_detail
