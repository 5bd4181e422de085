#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- DeepSpeed: the ds_config of Ulysses (REFERENCES.md [DeepSpeed]) ----------------------------
// FPDT has no launcher here: Megatron-DeepSpeed's FPDT layers (deepspeed/sequence/fpdt_layer.py in
// deepspeed 0.19.8: the attention adds qkv_linear_bias at :208 and :645, FPDT_FFN adds b1 and
// applies a tanh GELU at :1196-1197 whatever --swiglu says) train a block with biases and a plain
// GELU MLP, not the bias-free gated blocks cpsim simulates; with --disable-bias-linear the bias is
// None and the first forward raises (sim/src/methods/fpdt.cpp, its launcher table).

// What the ds_config runs: the Hugging Face Ulysses path has no key for tiled MLP, the fused loss
// or checkpoint offload of HF checkpointing (code changes, named in the notes).
RecipeAsRun deepspeed_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  no_transformer_engine_fp8(r, "DeepSpeed");
  no_offload_or_tiling(r, "HF checkpointing offloads only with a code change",
                       "a code change, no ds_config key");
  run_as(r, x.fused_loss, false, "logits materialised (the tiled loss is a code change)");
  return r;
}

namespace {

// The ds_config JSON.
std::string ds_config_json(Plan& p) {
  std::string j = "{\n";
  j += "  \"train_micro_batch_size_per_gpu\": 1,\n";
  j += fmt::format("  \"gradient_accumulation_steps\": {},\n", p.par.micro_batches);
  for (const std::string& line : ds_config_common_lines(p)) {
    j += line + ",\n";
  }
  j += fmt::format("  \"sequence_parallel_size\": {},\n", p.ulysses);
  j += fmt::format(
      "  \"activation_checkpointing\": {{\n    \"partition_activations\": false,\n    "
      "\"cpu_checkpointing\": {},\n    \"contiguous_memory_optimization\": false\n  }}\n",
      boolean(p.ckpt_offload()));
  j += "}\n";
  return j;
}

// Ulysses with DeepSpeed: how the file is used, and what it cannot say.
void ulysses_notes(Plan& p) {
  p.note(
      fmt::format("Ulysses: pass this file to deepspeed.initialize with ALST's "
                  "UlyssesSPAttentionHF.register_with_transformers(..., "
                  "sequence_parallel_size={}) for HF models, or use it with "
                  "Megatron-DeepSpeed --ds-sequence-parallel-size {}",
                  p.ulysses, p.ulysses));
  if (p.recipe.tiled_mlp) {
    p.note(
        "tiled MLP is a code change in DeepSpeed (TiledMLP.apply / sequence_tiled_compute); "
        "no ds_config key");
  }
  if (p.recipe.fused_loss) {
    p.note(
        "the fused / tiled loss is a code change (TiledFusedLogitsLoss, "
        "UlyssesSPFwdLossBwdWithLogits); no ds_config key");
  }
  if (p.ckpt_offload()) {
    p.note(
        "for HF non-reentrant checkpointing, checkpoint offload also needs "
        "get_checkpoint_hidden_states_offloading_ctx_manager() around the forward");
  }
  if (p.recipe.checkpointing == CheckpointMode::kSelective) {
    p.note(
        "selective checkpointing is chosen in the model code (HF gradient checkpointing is "
        "per block); no ds_config key");
  }
}

}  // namespace

EmittedConfig emit_deepspeed(Plan& p) {
  require_zero_for_optimizer_offload(p, "DeepSpeed");
  std::string j = ds_config_json(p);
  p.note_if_ckpt_offload_ignored();
  ulysses_notes(p);
  if (p.recipe.expandable_segments) {
    p.note("run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
  }
  // JSON has no comments: the provenance leads the notes.
  return finish(p, {{}, std::move(j), "cpsim_deepspeed.json", false});
}

}  // namespace cpsim::planner::emit_detail
