#include <array>
#include <cctype>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"
#include "cpsim/sim/pipeline.hpp"

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- TorchTitan 0.3.0 and main: a Python config function (REFERENCES.md [TorchTitan]) ----------
// Sources: torchtitan 0.3.0 (PyPI; CI loads every file through it, tests/launchers) and
// pytorch/torchtitan @ b5bcd76 (2026-08-21, main). torchtitan/config/manager.py (a run is a
// function returning Trainer.Config, selected by --module / --config); torchtitan/config/
// configs.py (TrainingConfig, ParallelismConfig); torchtitan/models/{llama3,qwen3}/
// config_registry.py (the per-size baselines this file starts from); models/common/decoder.py
// update_from_config (the RoPE maximum). The two releases differ in the training fields: 0.3.0
// has seq_len and local_batch_size (sequences), main max_context_length and
// num_tokens_per_microbatch_per_dp_rank (tokens, since 73aed7f "fold batch dim", 2026-08-20).

namespace {

// What differs between the releases this file writes.
struct Release {
  const char* title;           ///< "TorchTitan 0.3.0"
  const char* rope_field;      ///< RoPE.Config's maximum length
  bool tokens_per_microbatch;  ///< main: batches in tokens; 0.3.0: local_batch_size sequences
};

Release release_of(const Plan& p) {
  if (p.format == LauncherFormat::kTorchTitanMain) {
    return {"TorchTitan main", "max_context_length", true};
  }
  return {"TorchTitan 0.3.0", "max_seq_len", false};
}

// The RoPE maximum of the baselines' model_registry (torchtitan/models/llama3/__init__.py,
// models/qwen3/__init__.py, the same in 0.3.0 and at b5bcd76); update_from_config refuses a
// longer training length ("exceeds attention RoPE maximum").
std::int64_t registry_rope_maximum(const Flavor& fl) {
  return std::string(fl.name) == "qwen3" ? 40960 : 131072;
}

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
      Baseline{"qwen3", "32B", "qwen3_32b"},     Baseline{"qwen3", "30B-A3B", "qwen3_30b_a3b"}};
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

// The training length and batch. 0.3.0: Trainer.__init__ needs seq_len divisible by
// tp x 2 x cp (sequence parallel on), FlexAttention's CP block mask (torch's
// _create_cp_block_mask) by cp x 128.
std::string training_lines(Plan& p, const Release& r) {
  std::string body;
  if (!r.tokens_per_microbatch) {
    body += fmt::format(
        "    config.training.seq_len = {}  # divisible by tp x 2 x cp = {} and cp x 128 = {}\n",
        p.seq, p.par.tp_degree * 2 * p.cp, p.cp * 128);
    if (p.par.pp_degree > 1) {
      // local_batch_size / pipeline_parallel_microbatch_size micro-batches (trainer.py:124-135).
      body += fmt::format(
          "    config.training.local_batch_size = {}  # {} pipeline micro-batches of one "
          "sequence\n"
          "    config.parallelism.pipeline_parallel_microbatch_size = 1\n"
          "    config.training.global_batch_size = {}  # x data parallel {}\n",
          p.par.micro_batches, p.par.micro_batches, p.par.micro_batches * p.dp, p.dp);
    } else {
      body += "    config.training.local_batch_size = 1  # one sequence per micro-batch\n";
      if (p.par.micro_batches > 1) {
        body += fmt::format(
            "    # {} micro-batches (gradient accumulation) x data parallel {}\n"
            "    config.training.global_batch_size = {}\n",
            p.par.micro_batches, p.dp, p.par.micro_batches * p.dp);
      }
    }
  } else {
    body += fmt::format(
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
          p.par.pp_degree > 1 ? "the pipeline's, num_pp_microbatches" : "gradient accumulation",
          p.dp, p.par.micro_batches * p.dp * p.seq);
    }
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

std::string parallelism_lines(Plan& p, const Release& r) {
  std::string body =
      "    config.parallelism.data_parallel_replicate_degree = 1\n" +
      fmt::format("    config.parallelism.pipeline_parallel_degree = {}\n", p.par.pp_degree);
  if (p.par.pp_degree > 1) {
    // The same split keys as v0.2.x (configs.py:180-236 @ b5bcd76); the micro-batch count is
    // num_pp_microbatches on main, local_batch_size in 0.3.0 (training_lines).
    const TorchTitanPipeline pl = torchtitan_pipeline(p);
    const sim::PipelineShape s = sim::pipeline_shape(p.in);
    body += fmt::format("    config.parallelism.pipeline_parallel_schedule = {}\n",
                        quoted(pl.schedule));
    if (r.tokens_per_microbatch) {
      body += fmt::format("    config.parallelism.num_pp_microbatches = {}\n", p.par.micro_batches);
    } else {
      // 0.3.0 captures the step in CUDA graphs by default, which refuse pipeline parallelism.
      body += "    config.training.disable_cuda_graphs = True  # CUDA graphs refuse PP\n";
    }
    body += fmt::format(
        "    # blocks per stage: {}/{}/{} (first/middle/last)\n"
        "    config.parallelism.pipeline_parallel_first_stage_less_layers = {}\n"
        "    config.parallelism.pipeline_parallel_last_stage_less_layers = {}\n",
        s.first_stage_layers, s.middle_stage_layers, s.last_stage_layers, pl.first_less,
        pl.last_less);
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
  if (p.model.is_moe()) {
    // EP innermost over dp_shard · cp · tp, the experts' FSDP over the rest (efsdp):
    // distributed/parallel_dims.py:187-191, 281-282 @ b5bcd76.
    body += fmt::format("    config.parallelism.expert_parallel_degree = {}\n", p.par.ep_degree);
    const bool graphs_off_for_pp = p.par.pp_degree > 1 && !r.tokens_per_microbatch;
    if (p.par.ep_degree > 1 && !graphs_off_for_pp) {
      // CUDA graphs (on by default in 0.3.0 and main) refuse the all-to-all dispatcher, which
      // synchronises with the CPU (trainer.py:189-210 in 0.3.0, :193 at b5bcd76); the PP line
      // above already turns them off in 0.3.0.
      body +=
          "    config.training.disable_cuda_graphs = True  # CUDA graphs refuse the "
          "all-to-all token dispatcher\n";
    }
  }
  body += fmt::format(
      "    # FlexAttention CP: K/V all-gathered over the CP group (no rotate key)\n"
      "    config.parallelism.context_parallel_degree = {}\n",
      p.cp);
  body += p.zigzag() ? "    config.parallelism.context_parallel_load_balancer = \"headtail\"  # "
                       "zigzag layout\n"
                     : "    config.parallelism.context_parallel_load_balancer = None  # "
                       "contiguous layout\n";
  return body;
}

// Raises the RoPE maximum of every block to the training length when the registry's is shorter
// (update_from_config refuses a longer one and then resizes the tables to the training length
// itself: TorchTitan's RL trainer replaces the RoPE config the same way). The tables stay on
// every GPU, one per block: the RoPE memory of the recipe as run (torchtitan_rope_cache).
std::string rope_maximum_lines(Plan& p, const Release& r, const Flavor& fl) {
  const std::int64_t maximum = registry_rope_maximum(fl);
  if (p.seq <= maximum) {
    return "";
  }
  p.note(fmt::format(
      "the training length is past the model registry's RoPE maximum {}: the file raises it; "
      "training past the model's native context needs RoPE scaling",
      maximum));
  return fmt::format(
      "    # past the registry's RoPE maximum ({}): update_from_config refuses longer lengths\n"
      "    for layer in config.model_spec.model.layers:\n"
      "        layer.attention.rope = dataclasses.replace(layer.attention.rope, {}={})\n",
      maximum, r.rope_field, p.seq);
}

// The module name must be importable: TorchTitan's --module imports it.
void require_module_name(const Plan& p, const std::string& module) {
  bool importable = !module.empty() &&
                    (std::isalpha(static_cast<unsigned char>(module[0])) != 0 || module[0] == '_');
  for (const char c : module) {
    importable = importable && (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_');
  }
  if (!importable) {
    throw InputError("--out", fmt::format("TorchTitan imports the file as a Python module "
                                          "(--module): name it NAME.py with NAME an identifier, "
                                          "not '{}'",
                                          p.main_file("")));
  }
}

EmittedConfig emit_config_function(Plan& p) {
  const Release r = release_of(p);
  const Flavor fl = torchtitan_flavor(p.model);
  const char* baseline = baseline_function(fl);
  if (baseline == nullptr) {
    throw InputError("--model",
                     fmt::format("{} has no baseline config function for {} ({}); baselines: "
                                 "llama3 8B, 70B, 405B; qwen3 0.6B, 1.7B, 14B, 32B, 30B-A3B",
                                 r.title, p.model.name, shape_summary(p.model)));
  }
  if (r.tokens_per_microbatch) {
    require_seq_multiple_of_2cp(
        p, r.title, "the headtail load balancer splits the sequence into 2 x cp chunks");
  } else {
    const std::int64_t multiple =
        std::lcm(std::int64_t{2} * p.par.tp_degree * p.cp, std::int64_t{128} * p.cp);
    if (p.seq % multiple != 0) {
      refuse(
          fmt::format("{} needs --seq divisible by {} (tp x 2 x cp for its Trainer, cp x 128 "
                      "for FlexAttention's CP block mask); {} is not",
                      r.title, multiple, p.seq));
    }
  }
  const std::string default_file =
      r.tokens_per_microbatch ? "cpsim_torchtitan_main.py" : "cpsim_torchtitan.py";
  const std::string module = module_name(p.main_path, default_file);
  require_module_name(p, module);
  const char* policy = p.recipe.checkpointing == CheckpointMode::kSelective ? "SelectiveAC"
                       : p.recipe.checkpointing == CheckpointMode::kFull    ? "FullAC"
                                                                            : nullptr;
  std::string body = fmt::format(
      "\nimport dataclasses\n\n"
      "{}"
      "from torchtitan.models.{}.config_registry import {}\n"
      "from torchtitan.trainer import Trainer\n\n\n"
      "def cpsim_config() -> Trainer.Config:\n"
      "    # the baseline: {} {}, attention backend flex (model_registry's default), "
      "ChunkedLossWrapper loss\n"
      "    config = {}()\n",
      policy != nullptr
          ? fmt::format("from torchtitan.distributed.activation_checkpoint import {}\n", policy)
          : "",
      fl.name, baseline, fl.name, fl.flavor, baseline);
  body += training_lines(p, r);
  body += parallelism_lines(p, r);
  body += activation_checkpoint_line(p);
  body += rope_maximum_lines(p, r, fl);
  body += "    return config\n";
  if (body.find("dataclasses.") == std::string::npos) {
    body.erase(0, std::string("\nimport dataclasses\n").size());
  }

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
  p.note(fmt::format(
      "every block keeps a RoPE table of all {} positions on each GPU ({} per block), counted "
      "in the model states",
      p.seq,
      format_bytes(
          static_cast<double>(p.recipe.rope_cache_bytes_per_head_dim * p.model.head_dim * p.seq))));
  p.note_comm_dtype_fixed(r.title);

  LauncherText text;
  text.usage = {
      fmt::format("{} (Python config functions): put this file's folder on PYTHONPATH,", r.title),
      fmt::format("then: NGPU={} MODULE={} CONFIG=cpsim_config ./run_train.sh", p.par.gpus,
                  module)};
  if (p.nodes > 1) {
    text.usage.emplace_back(fmt::format(
        "run_train.sh starts one node: launch the same torchrun on each of the {} nodes", p.nodes));
  }
  add_environment_line(p, text.usage);
  text.body = std::move(body);
  text.filename = r.tokens_per_microbatch ? "cpsim_torchtitan_main.py" : "cpsim_torchtitan.py";
  return finish(p, std::move(text));
}

}  // namespace

// What a config function starting from the baseline runs without a key (the notes of
// emit_config_function):
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
// - a RoPE table of every position per block on every GPU (RoPE.__init__, models/common/rope.py).
RecipeAsRun torchtitan_main_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  no_transformer_engine_fp8(r, "TorchTitan main (its float8 is torchao)");
  torchtitan_rope(r, in.model, "TorchTitan main");
  torchtitan_rope_cache(r, in.model, true, "TorchTitan main");
  no_offload_or_tiling(r, "no TorchTitan config field", "no TorchTitan config field");
  run_as(r, x.fused_loss, true, "logits in chunks (the baselines' ChunkedLossWrapper)");
  run_as(r, x.grad_reduce_bytes, std::int64_t{4}, "gradients reduced in float32");
  comm_dtype_fixed(r, "TorchTitan main");
  return r;
}

RecipeAsRun torchtitan_030_recipe_as_run(const sim::ScheduleInputs& in) {
  RecipeAsRun r = torchtitan_main_recipe_as_run(in);  // the same model code and baselines
  for (std::string& change : r.changes) {
    const std::string main = "TorchTitan main";
    if (const std::size_t at = change.find(main); at != std::string::npos) {
      change.replace(at, main.size(), "TorchTitan 0.3.0");
    }
  }
  return r;
}

EmittedConfig emit_torchtitan_030(Plan& p) {
  return emit_config_function(p);
}

EmittedConfig emit_torchtitan_main(Plan& p) {
  return emit_config_function(p);
}

}  // namespace cpsim::planner::emit_detail
