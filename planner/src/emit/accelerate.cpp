#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- HF Accelerate config YAML (REFERENCES.md [Accelerate]) -------------------------------------

std::string accelerate_sp_attention(Plan& p) {
  const std::string& k = p.recipe.attention_kernel;
  if (k == "fa3") {
    return "flash_attention_3";
  }
  if (k == "fa2") {
    return "flash_attention_2";
  }
  if (k != "sdpa") {
    p.note(
        fmt::format("sp_attn_implementation accepts flash_attention_2 / flash_attention_3 / "
                    "sdpa; the recipe's {} kernel maps to sdpa",
                    k));
  }
  return "sdpa";
}

// The ds_config JSON of Accelerate's DeepSpeed path: the batch keys "auto" (Accelerate fills
// them from the trainer), the shared bf16 / ZeRO / communication-dtype keys.
CompanionFile accelerate_ds_config(Plan& p) {
  CompanionFile file;
  file.path = companion_path(p.main_path, "cpsim_accelerate.yaml", ".ds_config.json");
  file.what = "DeepSpeed config that the YAML's deepspeed_config_file names";
  file.text =
      "{\n  \"train_batch_size\": \"auto\",\n  \"train_micro_batch_size_per_gpu\": "
      "\"auto\",\n  \"gradient_accumulation_steps\": " +
      std::to_string(p.par.micro_batches);
  for (const std::string& line : ds_config_common_lines(p)) {
    file.text += ",\n" + line;
  }
  file.text += "\n}\n";
  return file;
}

// The trainer's arguments of the run, which the accelerate YAML cannot hold: transformers'
// TrainingArguments as JSON (HfArgumentParser(TrainingArguments).parse_json_file reads it; TRL's
// SFTConfig extends it): one sequence per micro-batch, the accumulation steps, bf16, Hugging Face
// gradient checkpointing per block on the Ulysses path (FSDP's fsdp_activation_checkpointing on
// the torch CP path) and Liger's fused linear cross-entropy for the fused loss
// (training_args.py: gradient_checkpointing, gradient_checkpointing_kwargs, use_liger_kernel).
CompanionFile accelerate_training_args(Plan& p, bool sp) {
  CompanionFile file;
  file.path = companion_path(p.main_path, "cpsim_accelerate.yaml", ".training_args.json");
  file.what =
      "the trainer's arguments (HfArgumentParser(TrainingArguments or SFTConfig)"
      ".parse_json_file): checkpointing, Liger's fused loss, the batch";
  const bool hf_checkpointing = sp && p.recipe.checkpointing != CheckpointMode::kNone;
  file.text = fmt::format(
      "{{\n  \"output_dir\": \"outputs\",\n  \"per_device_train_batch_size\": 1,\n  "
      "\"gradient_accumulation_steps\": {},\n  \"bf16\": {},\n  \"gradient_checkpointing\": {},\n",
      p.par.micro_batches, boolean(p.recipe.param_bytes == 2), boolean(hf_checkpointing));
  if (hf_checkpointing) {
    file.text += fmt::format("  \"gradient_checkpointing_kwargs\": {{\"use_reentrant\": {}}},\n",
                             boolean(p.recipe.checkpoint_reentrant));
  }
  file.text += fmt::format("  \"use_liger_kernel\": {}\n}}\n", boolean(p.recipe.fused_loss));
  return file;
}

// What the accelerate config runs (the notes of emit_accelerate): no checkpoint offload or tiled
// MLP in Accelerate / Transformers; the DeepSpeed path's attention is flash_attention_2/3 or
// sdpa; torch CP runs SDPA with full per-block checkpointing and CP tensors in the compute dtype.
// Gradient checkpointing and Liger are trainer arguments: kept, and written in the trainer's
// arguments file beside the YAML (accelerate_training_args).
RecipeAsRun accelerate_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  no_transformer_engine_fp8(r, "Accelerate");
  no_offload_or_tiling(r, "not in Accelerate", "not in Accelerate");
  const bool sp = launcher_word(LauncherFormat::kAccelerate, in) == "deepspeed";
  const std::string& k = x.attention_kernel;
  if (sp && k != "fa2" && k != "fa3" && k != "sdpa") {
    run_as(r, x.attention_kernel, std::string("sdpa"), "attention through sdpa");
  }
  if (!sp) {
    run_as(r, x.attention_kernel, std::string("sdpa"), "attention through SDPA (torch CP)");
    if (x.checkpointing == CheckpointMode::kSelective) {
      run_as(r, x.checkpointing, CheckpointMode::kFull, "full per-block checkpointing (FSDP)");
    }
    comm_dtype_fixed(r, "Accelerate's torch CP");
  }
  return r;
}

namespace {

// The DeepSpeed block (Ulysses SP): the ds_config JSON beside the YAML.
std::string deepspeed_block(Plan& p) {
  // DeepSpeed keys live in a ds_config JSON beside the YAML, as Accelerate's ALST example does
  // (examples/alst_ulysses_sequence_parallelism): `seq_parallel_communication_data_type` is no
  // accelerate config key, and with `deepspeed_config_file` Accelerate refuses zero_stage,
  // offload and mixed_precision in the YAML (utils/dataclasses.py, _deepspeed_config_checks).
  require_zero_for_optimizer_offload(p, "DeepSpeed");
  p.companions.push_back(accelerate_ds_config(p));
  std::string y = "distributed_type: DEEPSPEED\n";
  y += "deepspeed_config:\n";
  y += fmt::format("  deepspeed_config_file: {}\n", quoted(p.companions.back().path));
  y += "  zero3_init_flag: false\n";
  return y;
}

// What the FSDP2 + torch CP configuration cannot say.
void torch_cp_notes(Plan& p) {
  if (p.recipe.optimizer_offload) {
    p.note(
        "fsdp_offload_params offloads parameters, gradients and optimizer states (FSDP2 "
        "CPUOffload), not only the optimizer as simulated");
  }
  if (p.recipe.zero_stage < 3) {
    p.note(
        fmt::format("FSDP2 always shards; ZeRO-{} is approximated by "
                    "fsdp_reshard_after_forward: false",
                    p.recipe.zero_stage));
  }
  if (p.recipe.checkpointing == CheckpointMode::kSelective) {
    p.note(
        "fsdp_activation_checkpointing is full per block; selective checkpointing is not "
        "expressible (emitted full: less memory, more recompute than simulated)");
  }
  if (p.recipe.attention_kernel != "sdpa") {
    p.note(
        fmt::format("Accelerate's torch CP runs SDPA only (load the model with "
                    "attn_implementation=\"sdpa\"); the recipe's {} kernel is not available",
                    p.recipe.attention_kernel));
  }
  if (!p.zigzag()) {
    p.note(
        "torch CP load-balances the sequence (head-tail); the contiguous layout is not "
        "selectable");
  }
  p.note_comm_dtype_fixed("Accelerate's torch CP");
  p.note(
      fmt::format("pad sequences to a multiple of 2 x cp_size = {} (TRL: "
                  "pad_to_multiple_of)",
                  2 * p.cp));
}

// The FSDP2 block (torch CP).
std::string fsdp_block(Plan& p) {
  require_seq_multiple_of_2cp(p, "Accelerate CP", "torch CP load balancing; TRL docs");
  std::string y = "distributed_type: FSDP\n";
  y += "fsdp_config:\n";
  y += "  fsdp_version: 2\n";
  y += fmt::format("  fsdp_activation_checkpointing: {}\n",
                   boolean(p.recipe.checkpointing != CheckpointMode::kNone));
  y += "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n";
  y += "  fsdp_cpu_ram_efficient_loading: false\n";
  y += fmt::format("  fsdp_offload_params: {}\n", boolean(p.recipe.optimizer_offload));
  y += fmt::format("  fsdp_reshard_after_forward: {}\n", boolean(p.recipe.zero_stage >= 3));
  y += "  fsdp_state_dict_type: SHARDED_STATE_DICT\n";
  torch_cp_notes(p);
  return y;
}

// parallelism_config: data sharding, SP or CP, TP.
std::string parallelism_block(Plan& p, bool sp) {
  std::string y = "parallelism_config:\n";
  y += "  parallelism_config_dp_replicate_size: 1\n";
  y += fmt::format("  parallelism_config_dp_shard_size: {}\n", p.dp);
  if (sp) {
    y += fmt::format("  parallelism_config_sp_size: {}\n", p.ulysses);
    y += "  parallelism_config_sp_backend: deepspeed\n";
    y += "  parallelism_config_sp_seq_length_is_variable: true\n";
    y += fmt::format("  parallelism_config_sp_attn_implementation: {}\n",
                     accelerate_sp_attention(p));
  } else {
    y += fmt::format("  parallelism_config_cp_size: {}\n", p.cp);
    y += "  parallelism_config_cp_backend: torch\n";
    y += fmt::format("  parallelism_config_cp_comm_strategy: {}\n", p.selects());
  }
  y += fmt::format("  parallelism_config_tp_size: {}\n", p.par.tp_degree);
  return y;
}

// What neither backend's configuration can say.
void common_notes(Plan& p, bool sp) {
  if (sp && p.recipe.checkpointing == CheckpointMode::kSelective) {
    p.note(
        "Hugging Face gradient checkpointing is per block (full); selective checkpointing is "
        "chosen in the model code");
  }
  if (p.nodes > 1) {
    p.note(
        fmt::format("{} machines: set machine_rank, main_process_ip and main_process_port per "
                    "node",
                    p.nodes));
  }
  if (p.ckpt_offload()) {
    p.note("checkpoint offload to host is not available in Accelerate / Transformers");
  }
  p.note_if_ckpt_offload_ignored();
  if (p.recipe.tiled_mlp) {
    p.note("tiled MLP is not available in Accelerate / Transformers");
  }
  if (p.recipe.fused_loss) {
    p.note("use_liger_kernel needs liger-kernel installed where the trainer runs");
  }
}

}  // namespace

EmittedConfig emit_accelerate(Plan& p) {
  // "deepspeed": Accelerate's Ulysses SP backend; else torch CP with this cp_comm_strategy.
  const bool sp = p.selects() == "deepspeed";
  std::string y;
  y += "compute_environment: LOCAL_MACHINE\n";
  y += "debug: false\n";
  y += sp ? deepspeed_block(p) : fsdp_block(p);
  y += "downcast_bf16: 'no'\n";
  y += "machine_rank: 0\n";
  y += "main_training_function: main\n";
  if (!sp) {  // with a DeepSpeed JSON, its bf16 block says it
    y += fmt::format("mixed_precision: {}\n", p.recipe.param_bytes == 2 ? "bf16" : "'no'");
  }
  y += fmt::format("num_machines: {}\n", p.nodes);
  y += fmt::format("num_processes: {}\n", p.par.gpus);
  y += parallelism_block(p, sp);
  y += "rdzv_backend: static\n";
  y += "same_network: true\n";
  y += "use_cpu: false\n";
  common_notes(p, sp);
  p.companions.push_back(accelerate_training_args(p, sp));
  std::vector<std::string> usage = {
      fmt::format("HF Accelerate config: accelerate launch --config_file {} train.py {}",
                  p.main_file("cpsim_accelerate.yaml"), p.companions.back().path),
      "(train.py reads its TrainingArguments / SFTConfig from that JSON: "
      "HfArgumentParser(...).parse_json_file)"};
  add_environment_line(p, usage);
  return finish(p, {std::move(usage), std::move(y), "cpsim_accelerate.yaml", true});
}

}  // namespace cpsim::planner::emit_detail
