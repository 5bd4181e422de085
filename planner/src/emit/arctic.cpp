#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- ArcticTraining recipe YAML (REFERENCES.md [ArcticTraining]) --------------------------------

// What the recipe YAML runs (the notes of emit_arctic): the liger model always fuses the loss;
// whole-block checkpointing; attention flash_attention_2 or sdpa.
RecipeAsRun arctic_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  no_transformer_engine_fp8(r, "ArcticTraining");
  run_as(r, x.fused_loss, true, "Liger's fused loss (the liger model always fuses it)");
  run_as(
      r, x.rope_kernel, models::RopeKernel::kFused,
      "Liger's RoPE kernel (the liger model applies it: AutoLigerKernelForCausalLM's rope=True)");
  if (x.checkpointing == CheckpointMode::kSelective) {
    run_as(r, x.checkpointing, CheckpointMode::kFull, "full per-block checkpointing");
  }
  const std::string kernel = x.attention_kernel == "sdpa" || x.attention_kernel == "cudnn"
                                 ? std::string("sdpa")
                                 : std::string("fa2");
  run_as(r, x.attention_kernel, kernel,
         fmt::format("attention through {}", kernel == "sdpa" ? "sdpa" : "flash_attention_2"));
  return r;
}

EmittedConfig emit_arctic(Plan& p) {
  require_zero_for_optimizer_offload(p, "ArcticTraining (DeepSpeed)");
  // arctic_training/config/data.py: `sources` is required (a string is a Hugging Face dataset id
  // or a registered source name, "name:split" picks a split); model.name_or_path goes to
  // transformers' from_pretrained.
  if (p.dataset.empty()) {
    throw InputError("--dataset",
                     "ArcticTraining's recipe requires data.sources: give the training data as a "
                     "Hugging Face dataset id (name or name:split) or a local path");
  }
  if (p.model.hf_name_or_path.empty()) {
    throw InputError("--model",
                     fmt::format("ArcticTraining loads the model with from_pretrained, which needs "
                                 "a Hugging Face id or folder; {} has neither: give --model as the "
                                 "model's folder or its config.json",
                                 p.model.name));
  }
  const std::string comm = p.ds_comm_dtype();
  const std::string& k = p.recipe.attention_kernel;
  std::string attn = "flash_attention_2";
  if (k == "sdpa" || k == "cudnn") {
    attn = "sdpa";
  } else if (k == "fa3") {
    p.note(
        "ArcticTraining's recipes use flash_attention_2; FA3 would need "
        "attn_implementation flash_attention_3 support in your transformers version");
  } else if (k != "fa2") {
    p.note(fmt::format("the recipe's {} kernel maps to flash_attention_2", k));
  }
  std::string y;
  y += "type: sft\n";
  y += "micro_batch_size: 1\n";
  if (p.par.micro_batches > 1) {
    y += fmt::format("gradient_accumulation_steps: {}\n", p.par.micro_batches);
  }
  y += fmt::format("sequence_parallel_size: {}\n", p.ulysses);
  y += fmt::format("activation_checkpoint_cpu_offload: {}\n", boolean(p.ckpt_offload()));
  y += fmt::format("tiled_mlp_compute: {}\n", boolean(p.recipe.tiled_mlp));
  y += "model:\n";
  y += "  type: liger\n";
  y += fmt::format("  name_or_path: {}\n", quoted(p.model.hf_name_or_path));
  y += fmt::format("  attn_implementation: {}\n", attn);
  if (p.recipe.checkpointing == CheckpointMode::kNone) {
    y += "  disable_activation_checkpoint: true\n";
  }
  y += "data:\n";
  y += fmt::format("  max_length: {}\n", p.seq);
  y += fmt::format("  sources:\n    - {}\n", quoted(p.dataset));
  y += "deepspeed:\n";
  y += "  zero_optimization:\n";
  y += fmt::format("    stage: {}\n", p.recipe.zero_stage);
  if (p.recipe.optimizer_offload) {
    y += "    offload_optimizer:\n      device: cpu\n";
  }
  y += fmt::format("  seq_parallel_communication_data_type: {}\n", comm);
  if (p.recipe.optimizer_offload) {
    y += "optimizer:\n  type: cpu_adam\n";
  }

  p.note_if_ckpt_offload_ignored();
  if (p.recipe.checkpointing == CheckpointMode::kSelective) {
    p.note(
        "ArcticTraining checkpoints whole blocks (HF gradient checkpointing); selective is not "
        "expressible (runs full: less memory, more recompute than simulated)");
  }
  if (!p.recipe.fused_loss) {
    p.note(
        "the liger model fuses the loss (and SP tiles logits + loss); an unfused loss is not "
        "expressible");
  }
  if (p.seq % (std::int64_t{256} * p.ulysses) != 0) {
    p.note(fmt::format("ArcticTraining's guidance: seq ideally divisible by 256 x sp = {}",
                       256 * p.ulysses));
  }
  std::vector<std::string> usage = {
      fmt::format("ArcticTraining recipe: arctic_training cpsim_arctic.yaml --num_gpus {}{}",
                  p.par.gpus, p.nodes > 1 ? " -H <hostfile>" : "")};
  add_environment_line(p, usage);
  return finish(p, {std::move(usage), std::move(y), "cpsim_arctic.yaml", true});
}

}  // namespace cpsim::planner::emit_detail
