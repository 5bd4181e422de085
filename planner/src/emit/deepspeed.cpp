#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- DeepSpeed + Megatron-DeepSpeed FPDT (REFERENCES.md [DeepSpeed], [Megatron-DeepSpeed]) ------

namespace {

// The FPDT run's Megatron-DeepSpeed flags as a file beside the ds_config JSON (which they name),
// so that a script keeping the files keeps the flags: a bash array to source.
CompanionFile megatron_deepspeed_flags_file(const Plan& p,
                                            const std::vector<std::string>& flags,
                                            const std::string& ds_config) {
  CompanionFile file;
  file.path = companion_path(p.main_path, "cpsim_deepspeed.json", ".megatron-deepspeed.sh");
  file.what = "Megatron-DeepSpeed flags of the FPDT run (a bash array naming the ds_config JSON)";
  file.text = comment_lines(
      {p.provenance(),
       fmt::format("Megatron-DeepSpeed flags of this FPDT run; ds_config: {}", ds_config),
       fmt::format("usage: source {} && deepspeed pretrain_gpt.py "
                   "\"${{CPSIM_MEGATRON_DEEPSPEED_FLAGS[@]}}\" <data, tokenizer and optimizer "
                   "flags>",
                   file.path)});
  if (p.recipe.expandable_segments) {
    file.text += "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n";
  }
  file.text += "CPSIM_MEGATRON_DEEPSPEED_FLAGS=(\n";
  for (const std::string& flag : flags) {
    file.text += "  " + flag + "\n";
  }
  file.text += ")\n";
  return file;
}

}  // namespace

// What the ds_config (and, for FPDT, the Megatron-DeepSpeed flags) run: FPDT through
// --use-flash-attn-v2 with full checkpointing; the Hugging Face Ulysses path has no key for tiled
// MLP, the fused loss or checkpoint offload of HF checkpointing (code changes, named in the notes).
RecipeAsRun deepspeed_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  no_transformer_engine_fp8(r, "DeepSpeed");
  if (launcher_word(LauncherFormat::kDeepSpeed, in) == "fpdt") {
    run_as(r, x.attention_kernel, std::string("fa2"), "attention through --use-flash-attn-v2");
    if (x.checkpointing == CheckpointMode::kSelective) {
      run_as(r, x.checkpointing, CheckpointMode::kFull,
             "full checkpointing (Megatron-DeepSpeed has no selective flag for FPDT)");
    }
    return r;
  }
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

// Megatron-DeepSpeed's FPDT, ZeRO, checkpointing and optimizer flags.
std::vector<std::string> fpdt_run_flags(Plan& p, const std::string& ds_config) {
  const std::int64_t chunk = p.par.fpdt_chunk;
  std::vector<std::string> f = {"--deepspeed",
                                "--deepspeed_config " + shell_word(ds_config),
                                fmt::format("--zero-stage {}", p.recipe.zero_stage),
                                "--no-pipeline-parallel",
                                fmt::format("--ds-sequence-parallel-size {}", p.ulysses),
                                "--ds-sequence-parallel-fpdt",
                                fmt::format("--ds-sequence-parallel-fpdt-chunk-size {}", chunk)};
  if (p.par.fpdt_offload) {
    f.emplace_back("--ds-sequence-parallel-fpdt-offloading");
    if (p.seq / chunk <= 1) {
      p.note("FPDT offloading only takes effect with more than one chunk (seq / chunk > 1)");
    }
  }
  if (p.recipe.checkpointing != CheckpointMode::kNone) {
    f.emplace_back("--checkpoint-activations --deepspeed-activation-checkpointing");
    if (p.ckpt_offload()) {
      f.emplace_back("--checkpoint-in-cpu");
    }
    if (p.recipe.checkpointing == CheckpointMode::kSelective) {
      p.note(
          "Megatron-DeepSpeed has no selective recompute flag for FPDT; emitted full "
          "checkpointing (less memory, more recompute than simulated)");
    }
  }
  if (p.recipe.optimizer_offload) {
    f.emplace_back("--cpu-optimizer");
  }
  return f;
}

// Megatron-DeepSpeed's model flags.
void fpdt_model_flags(const Plan& p, std::int64_t max_pos, std::vector<std::string>& f) {
  f.emplace_back(fmt::format("--num-layers {}", p.model.layers));
  f.emplace_back(fmt::format("--hidden-size {}", p.model.hidden));
  f.emplace_back(fmt::format("--ffn-hidden-size {}", p.model.ffn_hidden));
  f.emplace_back(fmt::format("--num-attention-heads {}", p.model.heads));
  f.emplace_back(fmt::format("--num-key-value-heads {}", p.model.kv_heads));
  f.emplace_back(fmt::format("--kv-channels {}", p.model.head_dim));
  if (p.model.activation == models::ActivationKind::kSwiGlu) {
    f.emplace_back("--swiglu");
  }
  if (p.model.norm == models::NormKind::kRmsNorm) {
    f.emplace_back("--normalization rmsnorm");  // Megatron-DeepSpeed spells it in lower case
  }
  if (!p.model.attention_bias) {
    f.emplace_back("--disable-bias-linear");
  }
  if (!p.model.tied_embeddings) {
    f.emplace_back("--untie-embeddings-and-output-weights");
  }
  f.emplace_back(fmt::format("--seq-length {}", p.seq));
  f.emplace_back(fmt::format("--max-position-embeddings {}", max_pos));
  f.emplace_back("--use-rotary-position-embeddings --no-position-embedding");
  // An int in Megatron-DeepSpeed's argparse.
  f.emplace_back(fmt::format("--rotary-position-embeddings-theta {}",
                             static_cast<std::int64_t>(std::llround(p.model.rope_theta))));
  f.emplace_back("--micro-batch-size 1");
  f.emplace_back(p.recipe.param_bytes == 2 ? "--bf16" : "--fp16");
  f.emplace_back("--use-flash-attn-v2");
}

// What Megatron-DeepSpeed's flags cannot say for FPDT.
void fpdt_notes(Plan& p, std::int64_t max_pos) {
  if (p.recipe.attention_kernel == "fa3") {
    p.note(
        "--use-flash-attn-v3 exists only in the UPipe authors' FPDT fork (Untied-Ulysses "
        "FPDT/Megatron-DeepSpeed), not upstream; emitted --use-flash-attn-v2");
  } else if (p.recipe.attention_kernel != "fa2") {
    p.note(
        fmt::format("FPDT requires flash-attn; the recipe's {} kernel is replaced by "
                    "--use-flash-attn-v2",
                    p.recipe.attention_kernel));
  }
  if (p.par.fpdt_chunk % (std::int64_t{p.ulysses} * p.ulysses) != 0) {
    p.note(
        fmt::format("the reference FPDT script asks for seq divisible by sp x sp x chunks, "
                    "i.e. a chunk divisible by sp x sp = {}",
                    p.ulysses * p.ulysses));
  }
  if (p.model.attention_bias) {
    p.note(
        "the model's q/k/v biases have no Megatron-DeepSpeed flag (biases stay on in every "
        "linear without --disable-bias-linear)");
  }
  if (p.model.qk_norm) {
    p.note(
        "Megatron-DeepSpeed has no q/k RMSNorm (Qwen3); the flags describe the closest Llama "
        "block");
  }
  if (max_pos != p.model.max_position_embeddings) {
    p.note(
        fmt::format("--max-position-embeddings is raised from {} to the sequence length, as "
                    "the reference FPDT script does (Megatron-DeepSpeed asserts "
                    "max_position_embeddings >= seq_length)",
                    p.model.max_position_embeddings));
  }
  p.note("add data, tokenizer and optimizer flags; launch with deepspeed pretrain_gpt.py <flags>");
}

// FPDT through Megatron-DeepSpeed: its flags, as a usage line and a companion file.
void fpdt_flags(Plan& p, std::vector<std::string>& usage) {
  const std::int64_t chunk = p.par.fpdt_chunk;
  if (chunk / p.ulysses / 32 < 1) {
    refuse(
        fmt::format("Megatron-DeepSpeed's FPDT loss splits into chunks of fpdt_chunk / sp / 32 "
                    "tokens; --fpdt-chunk {} with sequence parallel size {} gives 0 (needs "
                    "at least {})",
                    chunk, p.ulysses, 32 * p.ulysses));
  }
  const std::int64_t max_pos = std::max(p.model.max_position_embeddings, p.seq);
  const std::string ds_config = p.main_file("cpsim_deepspeed.json");
  std::vector<std::string> f = fpdt_run_flags(p, ds_config);
  fpdt_model_flags(p, max_pos, f);
  std::string line = "Megatron-DeepSpeed flags:";
  for (const auto& s : f) {
    line += fmt::format(" {}", s);
  }
  usage.push_back(std::move(line));
  p.companions.push_back(megatron_deepspeed_flags_file(p, f, ds_config));
  fpdt_notes(p, max_pos);
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
  const bool fpdt = p.selects() == "fpdt";
  std::vector<std::string> usage;  // the Megatron-DeepSpeed flags for FPDT
  std::string j = ds_config_json(p);
  p.note_if_ckpt_offload_ignored();
  if (fpdt) {
    fpdt_flags(p, usage);
  } else {
    ulysses_notes(p);
  }
  if (p.recipe.expandable_segments) {
    p.note("run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
  }
  // JSON has no comments: the provenance and the flags lead the notes.
  return finish(p, {std::move(usage), std::move(j), "cpsim_deepspeed.json", false});
}

}  // namespace cpsim::planner::emit_detail
