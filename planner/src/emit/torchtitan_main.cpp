#include <array>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "cpsim/sim/pipeline.hpp"

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- TorchTitan main: a Python config function (REFERENCES.md [TorchTitan]) ---------------------
// Sources: pytorch/torchtitan @ b5bcd76 (2026-08-21). torchtitan/config/README.md (a run is a
// function returning Trainer.Config, selected by --module / --config); torchtitan/config/
// configs.py (TrainingConfig, ParallelismConfig); torchtitan/models/{llama3,qwen3}/
// config_registry.py (the per-size baselines this file starts from).

namespace {

// The baseline config functions of torchtitan/models/{llama3,qwen3}/config_registry.py @ b5bcd76,
// by flavor. Qwen3 4B and 8B have none there (8B only as an SFT recipe).
const char* baseline_function(const Flavor& fl) {
  struct Baseline {
    const char* name;
    const char* flavor;
    const char* function;
  };
  static constexpr std::array kBaselines = {
      Baseline{"llama3", "8B", "llama3_8b"},     Baseline{"llama3", "70B", "llama3_70b"},
      Baseline{"llama3", "405B", "llama3_405b"}, Baseline{"qwen3", "0.6B", "qwen3_0_6b"},
      Baseline{"qwen3", "1.7B", "qwen3_1_7b"},   Baseline{"qwen3", "14B", "qwen3_14b"},
      Baseline{"qwen3", "32B", "qwen3_32b"}};
  for (const Baseline& b : kBaselines) {
    if (fl.name != nullptr && std::string(fl.name) == b.name &&
        std::string(fl.flavor) == b.flavor) {
      return b.function;
    }
  }
  return nullptr;
}

// The module name `--module` imports: the file name without its folder and ".py".
std::string module_name(const std::string& main_path, const std::string& fallback) {
  const std::string& path = main_path.empty() || main_path == "-" ? fallback : main_path;
  const std::size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() > 3 && base.substr(base.size() - 3) == ".py") {
    base.resize(base.size() - 3);
  }
  return base;
}

std::string activation_checkpoint_line(Plan& p) {
  switch (p.recipe.checkpointing) {
    case CheckpointMode::kFull:
      return "    config.activation_checkpoint = FullAC.Config()\n";
    case CheckpointMode::kSelective:
      p.note(
          "selective checkpointing maps to TorchTitan's per-op SAC (SelectiveAC), which saves "
          "different tensors than cpsim's selective model (attention core recomputed)");
      return "    config.activation_checkpoint = SelectiveAC.Config()  # per-op SAC\n";
    case CheckpointMode::kNone:
      break;
  }
  // No policy: the trainer applies none (gpt_oss/config_registry.py:55 @ b5bcd76 sets None).
  return "    config.activation_checkpoint = None\n";
}

std::string training_lines(Plan& p) {
  std::string body = fmt::format(
      "    config.training.max_context_length = {}  # divisible by 2 x cp = {}\n"
      "    # one sequence per micro-batch: token slots per data-parallel rank before CP/TP "
      "sharding\n"
      "    config.training.num_tokens_per_microbatch_per_dp_rank = {}\n",
      p.seq, 2 * p.cp, p.seq);
  if (p.par.micro_batches > 1) {
    body += fmt::format(
        "    # {} micro-batches ({}) x data parallel {}\n"
        "    config.training.num_tokens_per_train_step = {}\n",
        p.par.micro_batches,
        p.par.pp_degree > 1 ? "the pipeline's, num_pp_microbatches" : "gradient accumulation", p.dp,
        p.par.micro_batches * p.dp * p.seq);
  }
  body += fmt::format("    config.training.mixed_precision_param = {}\n",
                      quoted(p.recipe.param_bytes == 4 ? "float32" : "bfloat16"));
  body += "    config.training.mixed_precision_reduce = \"float32\"  # the only value accepted\n";
  if (p.recipe.grad_reduce_bytes != 4) {
    p.note("TorchTitan reduces gradients in float32 only; a narrower reduce is not expressible");
  }
  if (p.recipe.optimizer_offload) {
    body +=
        "    # FSDP CPU offload: parameters, gradients AND optimizer states on the host\n"
        "    config.training.enable_cpu_offload = True\n";
    p.note(
        "training.enable_cpu_offload offloads parameters, gradients and optimizer states "
        "(FSDP CPUOffload), not only the optimizer as simulated");
  }
  return body;
}

std::string parallelism_lines(Plan& p) {
  std::string body =
      "    config.parallelism.data_parallel_replicate_degree = 1\n" +
      fmt::format("    config.parallelism.pipeline_parallel_degree = {}\n", p.par.pp_degree);
  if (p.par.pp_degree > 1) {
    // The same split keys as v0.2.x (configs.py:180-236 @ b5bcd76); the micro-batch count is
    // num_pp_microbatches on main.
    const TorchTitanPipeline pl = torchtitan_pipeline(p);
    const sim::PipelineShape s = sim::pipeline_shape(p.in);
    body += fmt::format(
        "    config.parallelism.pipeline_parallel_schedule = {}\n"
        "    config.parallelism.num_pp_microbatches = {}\n"
        "    # blocks per stage: {}/{}/{} (first/middle/last)\n"
        "    config.parallelism.pipeline_parallel_first_stage_less_layers = {}\n"
        "    config.parallelism.pipeline_parallel_last_stage_less_layers = {}\n",
        quoted(pl.schedule), p.par.micro_batches, s.first_stage_layers, s.middle_stage_layers,
        s.last_stage_layers, pl.first_less, pl.last_less);
    if (pl.layers_per_stage > 0) {
      body += fmt::format(
          "    config.parallelism.pipeline_parallel_layers_per_stage = {}  # {} virtual stages "
          "per rank\n",
          pl.layers_per_stage, p.par.virtual_stages);
    }
    p.note(
        "PyTorch's pipelining schedules (Schedule1F1B, ScheduleInterleaved1F1B) are timed with "
        "Megatron-Core's schedule counts (warm-up, micro-batches in flight, bubble)");
  }
  body += fmt::format(
      "    # the leftover ranks ({}); FSDP shards over dp_shard x cp = {} GPUs\n"
      "    config.parallelism.data_parallel_shard_degree = -1\n",
      p.dp, p.dp * p.cp);
  if (p.recipe.zero_stage < 3) {
    body += fmt::format(
        "    # keeps gathered parameters after forward: the closest FSDP2 gets to ZeRO-{}\n"
        "    config.parallelism.fsdp_reshard_after_forward = \"never\"\n",
        p.recipe.zero_stage);
    p.note(fmt::format(
        "TorchTitan always shards with FSDP2 (ZeRO-3 style); ZeRO-{} is approximated by "
        "fsdp_reshard_after_forward = \"never\"",
        p.recipe.zero_stage));
  } else {
    body += "    config.parallelism.fsdp_reshard_after_forward = \"default\"\n";
  }
  body += fmt::format("    config.parallelism.tensor_parallel_degree = {}\n", p.par.tp_degree);
  body += fmt::format(
      "    # FlexAttention CP: K/V all-gathered over the CP group (no rotate key on main)\n"
      "    config.parallelism.context_parallel_degree = {}\n",
      p.cp);
  body += p.zigzag() ? "    config.parallelism.context_parallel_load_balancer = \"headtail\"  # "
                       "zigzag layout\n"
                     : "    config.parallelism.context_parallel_load_balancer = None  # "
                       "contiguous layout\n";
  return body;
}

}  // namespace

// What a config function starting from the baseline runs without a key (the notes of
// emit_torchtitan_main):
// - no checkpoint offload (configs.py, activation_checkpoint.py and trainer.py @ b5bcd76 offload
//   only FSDP state, enable_cpu_offload), no tiled MLP or RMSNorm anywhere in torchtitan/;
// - the loss: the baselines pass loss=ChunkedLossWrapper.Config (llama3/config_registry.py:197
//   @ b5bcd76), which runs the LM head and the loss per chunk of the tokens (num_chunks = 8),
//   each chunk's backward inside the loss call, so the full [T, V] logits never exist
//   (components/loss.py:501-544 @ b5bcd76): cpsim's fused_loss. Its chunk is T/8 tokens, larger
//   than cpsim's fused-loss chunk (about T·h/V), a workspace cpsim does not model;
// - attention: model_registry's default attn_backend is "flex" (llama3/__init__.py:371
//   @ b5bcd76), the only backend that runs with CP (decoder.py:173-183); the hardware profiles
//   have no FlexAttention curves, so the recipe's kernel times it (named in the file's notes);
// - FP8 off (main's float8 is torchao, not TransformerEngine); gradients reduce in float32
//   (configs.py:102 @ b5bcd76); CP tensors move in the compute dtype.
RecipeAsRun torchtitan_main_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  no_transformer_engine_fp8(r, "TorchTitan main (its float8 is torchao)");
  torchtitan_rope(r, in.model, "TorchTitan main");
  no_offload_or_tiling(r, "no TorchTitan config field", "no TorchTitan config field");
  run_as(r, x.fused_loss, true, "logits in chunks (the baselines' ChunkedLossWrapper)");
  run_as(r, x.grad_reduce_bytes, std::int64_t{4}, "gradients reduced in float32");
  comm_dtype_fixed(r, "TorchTitan main");
  return r;
}

EmittedConfig emit_torchtitan_main(Plan& p) {
  require_seq_multiple_of_2cp(p, "TorchTitan main",
                              "the headtail load balancer splits the sequence into 2 x cp chunks");
  const Flavor fl = torchtitan_flavor(p.model);
  const char* baseline = baseline_function(fl);
  if (baseline == nullptr) {
    refuse(fmt::format(
        "TorchTitan main has no baseline config function for {} ({}); baselines at b5bcd76: "
        "llama3 8B, 70B, 405B; qwen3 0.6B, 1.7B, 14B, 32B",
        p.model.name, shape_summary(p.model)));
  }
  std::string body = fmt::format(
      "\nfrom torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC\n"
      "from torchtitan.models.{}.config_registry import {}\n"
      "from torchtitan.trainer import Trainer\n\n\n"
      "def cpsim_config() -> Trainer.Config:\n"
      "    # the baseline: {} {}, attention backend flex (model_registry's default), "
      "ChunkedLossWrapper loss\n"
      "    config = {}()\n",
      fl.name, baseline, fl.name, fl.flavor, baseline);
  body += training_lines(p);
  body += parallelism_lines(p);
  body += activation_checkpoint_line(p);
  body += "    return config\n";

  if (p.ckpt_offload()) {
    p.note("checkpoint offload to host has no TorchTitan config field");
  }
  p.note_if_ckpt_offload_ignored();
  if (p.recipe.tiled_mlp) {
    p.note("tiled MLP / tiled RMSNorm have no TorchTitan config field");
  }
  if (!p.recipe.fused_loss) {
    p.note("the baselines' ChunkedLossWrapper never materialises the full logits");
  }
  p.note(fmt::format(
      "CP runs FlexAttention (K/V all-gathered); cpsim times it with the recipe's {} kernel "
      "curves (the hardware profile has none for FlexAttention); ChunkedLossWrapper's T/8-token "
      "logit chunks are not modelled (cpsim's fused loss holds a smaller chunk)",
      p.recipe.attention_kernel));
  p.note_comm_dtype_fixed("TorchTitan main");

  const std::string module = module_name(p.main_path, "cpsim_torchtitan_main.py");
  LauncherText text;
  text.usage = {
      "TorchTitan main (Python config functions, b5bcd76): put this file's folder on PYTHONPATH,",
      fmt::format("then: NGPU={} MODULE={} CONFIG=cpsim_config ./run_train.sh", p.par.gpus,
                  module)};
  if (p.nodes > 1) {
    text.usage.emplace_back(fmt::format(
        "run_train.sh starts one node: launch the same torchrun on each of the {} nodes", p.nodes));
  }
  add_environment_line(p, text.usage);
  text.body = std::move(body);
  text.filename = "cpsim_torchtitan_main.py";
  return finish(p, std::move(text));
}

}  // namespace cpsim::planner::emit_detail
