#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- UPipe reference code: TorchTitan fork arguments (REFERENCES.md [UPipe-code]) ---------------

// What the fork's arguments run (the notes of emit_untied_ulysses): flash-attn (fa2 or fa3) in
// its upipe / usp / ring attention, SDPA in its torch ring; Liger's fused loss always; tiled MLP
// and RMSNorm switched together; CP tensors in the compute dtype.
RecipeAsRun untied_ulysses_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  no_transformer_engine_fp8(r, "the UPipe fork");
  torchtitan_rope(r, in.model, "the fork's TorchTitan");  // the UPipe op runs its own kernel
  // The fork's Transformer keeps freqs_cis, complex64 [training.seq_len, d/2], as a buffer
  // (torchtitan/torchtitan/models/llama3/model.py:730-731, :806-814 @ e465aa8).
  torchtitan_rope_cache(r, in.model, false, "the fork's freqs_cis");
  const bool torch_ring =
      launcher_word(LauncherFormat::kUntiedUlysses, in) == "torch_ring_alltoall";
  if (!torch_ring && x.attention_kernel != "fa2" && x.attention_kernel != "fa3") {
    run_as(r, x.attention_kernel, std::string("fa2"), "attention through flash-attn 2");
  }
  run_as(r, x.fused_loss, true, "Liger's fused linear cross-entropy (always on in the fork)");
  run_as(r, x.tiled_norm, x.tiled_mlp, "tiled RMSNorm switched with tiled MLP");
  comm_dtype_fixed(r, "the fork");
  return r;
}

namespace {

// The fork's --model.attn_impl: usp, upipe or torch_ring_alltoall, with the kernel, offload and
// tiled-MLP suffixes.
std::string attn_impl(Plan& p, const std::string& selects) {
  const std::string& kernel = p.recipe.attention_kernel;
  // usp and upipe go through yunchang's flash-attn wrappers; the torch ring runs SDPA.
  std::string impl = selects;
  if (selects != "torch_ring_alltoall") {
    if (kernel == "fa3") {
      impl += "_fa3";
    } else {
      impl += "_fa2";
      if (kernel != "fa2") {
        p.note(
            fmt::format("the fork's upipe / usp attention runs flash-attn (fa2 or fa3 in "
                        "attn_impl); the recipe's {} kernel is replaced by fa2",
                        kernel));
      }
    }
  }
  if (p.ckpt_offload()) {
    impl += "_offload";
  }
  p.note_if_ckpt_offload_ignored();
  if (p.recipe.tiled_mlp) {
    impl += "_tiled_mlp";
  }
  if (p.recipe.tiled_mlp != p.recipe.tiled_norm) {
    p.note(
        "the fork's tiled_mlp switches on TiledMLP and TiledRMSNorm together; tiled_mlp and "
        "tiled_norm differ in the recipe");
  }
  return impl;
}

// --model.name and --model.flavor of this shape; a shape without one is refused.
void model_args(Plan& p, std::vector<std::string>& args) {
  const Flavor fl = llama3_flavor(p.model);
  // The fork's llama3 "32B" flavor is the Qwen3-32B shape run as a Llama block.
  const auto& md = p.model;
  const bool qwen32 = md.layers == 64 && md.hidden == 5120 && md.heads == 64 && md.kv_heads == 8 &&
                      md.head_dim == 128 && md.ffn_hidden == 25600;
  if (fl.name != nullptr) {
    args.insert(args.end(), {"--model.name", fl.name, "--model.flavor", fl.flavor});
  } else if (qwen32) {
    args.insert(args.end(), {"--model.name", "llama3", "--model.flavor", "32B"});
    p.note(
        "the fork's llama3 32B flavor has Qwen3-32B's shape as a Llama block (no q/k RMSNorm, "
        "the tokenizer of the TOML decides the vocabulary)");
  } else {
    // Without --model.flavor the run trains the base TOML's flavor, another model.
    throw InputError("--model",
                     fmt::format("no llama3 flavor of the UPipe fork matches {} ({}); add one to "
                                 "torchtitan/models/llama3/__init__.py and a model file for it",
                                 p.model.name, shape_summary(p.model)));
  }
}

// The fork's command-line overrides.
std::vector<std::string> fork_args(Plan& p, const std::string& selects) {
  const std::string impl = attn_impl(p, selects);
  std::vector<std::string> args = {
      "--parallelism.context_parallel_ulysses_degree", fmt::format("{}", p.ulysses),
      "--parallelism.context_parallel_degree", fmt::format("{}", p.ring)};
  if (selects == "torch_ring_alltoall") {
    args.insert(args.end(), {"--parallelism.context_parallel_rotate_method", "alltoall"});
  }
  if (p.recipe.zero_stage < 3) {
    args.insert(args.end(), {"--parallelism.fsdp_reshard_after_forward", "never"});
    p.note(
        fmt::format("the fork shards with FSDP2 (ZeRO-3 style); ZeRO-{} is approximated by "
                    "--parallelism.fsdp_reshard_after_forward never",
                    p.recipe.zero_stage));
  }
  model_args(p, args);
  args.insert(args.end(), {"--model.attn_impl", impl, "--model.ring_comm_heads", "gqa_kv",
                           "--activation_checkpoint.mode"});
  switch (p.recipe.checkpointing) {
    case CheckpointMode::kFull:
      args.emplace_back("full");
      break;
    case CheckpointMode::kSelective:
      args.insert(args.end(), {"selective", "--activation_checkpoint.selective_ac_option", "op"});
      p.note(
          "selective checkpointing maps to the fork's per-op SAC, which saves different tensors "
          "than cpsim's selective model (attention core recomputed)");
      break;
    case CheckpointMode::kNone:
      args.emplace_back("none");
      break;
  }
  args.insert(args.end(),
              {"--training.seq_len", fmt::format("{}", p.seq), "--training.batch_size", "1"});
  // The base TOML writes to /data and logs to wandb (llama3_8b_test_2d.toml @ e465aa8): the
  // run's own folder and no wandb instead (command-line values override the TOML's).
  args.insert(args.end(), {"--job.dump_folder", "./outputs", "--metrics.no_enable_wandb"});
  if (p.recipe.optimizer_offload) {
    args.emplace_back("--training.enable_cpu_offload");
    p.note(
        "--training.enable_cpu_offload offloads parameters, gradients and optimizer states "
        "(FSDP CPUOffload), not only the optimizer as simulated");
  }
  return args;
}

// The launch line: torch.distributed.run with the user's Python (the fork's run_train.sh runs
// /root/workspace/Untied-Ulysses/torchtitan/.venv/bin/python, the authors' machine).
std::vector<std::string> usage_lines(const Plan& p) {
  std::vector<std::string> usage = {
      "Arguments for the UPipe reference code (github.com/togethercomputer/Untied-Ulysses, "
      "TorchTitan fork); from its torchtitan/ folder, with the fork installed in your Python:"};
  const char* toml = "./torchtitan/models/llama3/train_configs/llama3_8b_test_2d.toml";
  const std::string source = fmt::format("source {}", p.main_file("cpsim_untied-ulysses.sh"));
  if (p.nodes == 1) {
    usage.push_back(fmt::format(
        "  {} && python -m torch.distributed.run --nproc_per_node {} --rdzv_backend c10d "
        "--rdzv_endpoint localhost:0 -m torchtitan.train --job.config_file {} "
        "\"${{UNTIED_ULYSSES_ARGS[@]}}\"",
        source, p.par.gpus, toml));
  } else {
    usage.push_back(fmt::format(
        "  {} && python -m torch.distributed.run --nnodes {} --nproc_per_node {} --node_rank "
        "<rank> --rdzv_endpoint <host:port> -m torchtitan.train --job.config_file {} "
        "\"${{UNTIED_ULYSSES_ARGS[@]}}\"",
        source, p.nodes, p.par.gpus_per_node, toml));
  }
  return usage;
}

// The environment and the bash array, a flag and its value on one line.
std::string args_text(const Plan& p, const std::vector<std::string>& args) {
  std::string text;
  if (p.recipe.expandable_segments) {
    text += "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n";
  }
  if (p.seq > kPinMemoryLimit) {
    text += "export INP_PIN_MEMORY=False\n";  // the fork's scripts do this above 4M tokens
  }
  text += "UNTIED_ULYSSES_ARGS=(\n";
  for (std::size_t i = 0; i < args.size(); ++i) {
    text += fmt::format("  {}", shell_word(args[i]));
    const bool value_follows = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
    if (value_follows) {
      text += fmt::format(" {}", shell_word(args[++i]));
    }
    text += "\n";
  }
  text += ")\n";
  return text;
}

}  // namespace

EmittedConfig emit_untied_ulysses(Plan& p) {
  // The fork's attention implementation: usp, upipe or torch_ring_alltoall.
  const std::string& selects = p.selects();
  if (selects == "upipe" && p.par.heads_per_stage != 0 && p.par.heads_per_stage != p.ulysses) {
    refuse(
        fmt::format("the UPipe reference code fixes the heads per stage U to the Ulysses degree "
                    "({}); --heads-per-stage {} cannot be expressed there (no other launcher "
                    "runs UPipe): use --heads-per-stage {}",
                    p.ulysses, p.par.heads_per_stage, p.ulysses));
  }
  if (p.ring > 1) {
    require_seq_multiple_of_2cp(p, "the UPipe reference code", "its ring is always zigzag");
  }
  const std::vector<std::string> args = fork_args(p, selects);
  p.note_selection();
  if (p.ring > 1 && !p.zigzag()) {
    p.note(
        "the fork's ring is always load-balanced (zigzag / round robin); the contiguous layout "
        "is not selectable");
  }
  if (!p.recipe.fused_loss) {
    p.note(
        "the fork always uses Liger's fused linear cross-entropy; an unfused loss is not "
        "selectable");
  }
  p.note_comm_dtype_fixed("the fork");
  return finish(p, {usage_lines(p), args_text(p, args), "cpsim_untied-ulysses.sh", true});
}

}  // namespace cpsim::planner::emit_detail
