#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- NeMo 2.0: a Python recipe module (REFERENCES.md [NeMo]) ------------------------------------
// Sources: NVIDIA/NeMo v2.4.0 @ 2381f42 (Megatron-Core pinned at 03f7793 by its
// requirements/manifest.json). A run is a pretrain recipe (nemo/collections/llm/recipes/
// <model>.py: pretrain_recipe(name, num_nodes, num_gpus_per_node) -> run.Partial) with fields set
// on it, launched by NeMo-Run's `run.cli.main(llm.pretrain, default_factory=...)`
// (examples/llm/pretrain/custom_recipe.py). The fields: trainer.strategy (nl.MegatronStrategy:
// the parallel sizes, copied onto the model config by set_model_parallel_attributes,
// nemo/lightning/_strategy_lib.py:172-175), data (MockDataModule: seq_length, micro/global batch),
// model.config (Megatron-Core's TransformerConfig: seq_length, which NeMo does not sync with the
// data's, recompute, cp_comm_type, attention_backend), optim.config (use_distributed_optimizer),
// trainer.plugins (MegatronMixedPrecision: fp8 fields, grad_reduce_in_fp32) and
// trainer.strategy.ddp (grad_reduce_in_fp32).

namespace {

// The pretrain recipes whose model config has the model's shape (nemo/collections/llm/gpt/model/
// llama.py, qwen3.py @ 2381f42): layers, hidden, heads, query groups, FFN, head dim; Qwen3's has
// QK-norm. Llama-2 13B has a config but no recipe there.
struct NemoRecipe {
  const char* module;
  bool qk_norm;
  std::int64_t layers, hidden, heads, kv_heads, ffn, head_dim;
};
constexpr std::array kRecipes = {
    NemoRecipe{"llama2_7b", false, 32, 4096, 32, 32, 11008, 128},
    NemoRecipe{"llama3_8b", false, 32, 4096, 32, 8, 14336, 128},
    NemoRecipe{"llama3_70b", false, 80, 8192, 64, 8, 28672, 128},
    NemoRecipe{"llama31_405b", false, 126, 16384, 128, 8, 53248, 128},
    NemoRecipe{"qwen3_4b", true, 36, 2560, 32, 8, 9728, 128},
    NemoRecipe{"qwen3_8b", true, 36, 4096, 32, 8, 12288, 128},
    NemoRecipe{"qwen3_14b", true, 40, 5120, 40, 8, 17408, 128},
    NemoRecipe{"qwen3_32b", true, 64, 5120, 64, 8, 25600, 128},
};

const NemoRecipe* recipe_for(const models::TransformerSpec& m) {
  for (const NemoRecipe& r : kRecipes) {
    if (r.qk_norm == m.qk_norm && r.layers == m.layers && r.hidden == m.hidden &&
        r.heads == m.heads && r.kv_heads == m.kv_heads && r.ffn == m.ffn_hidden &&
        r.head_dim == m.head_dim) {
      return &r;
    }
  }
  return nullptr;
}

const char* python_bool(bool b) {
  return b ? "True" : "False";
}

// trainer.strategy: the parallel sizes (MegatronStrategy.__init__, megatron_strategy.py @
// 2381f42); PP > 1 needs pipeline_dtype (api.py _validate_config); V only when interleaved; the
// uneven first/last stages as Megatron-Core's num_layers_in_first/last_pipeline_stage.
std::string strategy_lines(const Plan& p) {
  const models::ParallelConfig& par = p.par;
  std::string s = fmt::format(
      "    recipe.trainer.strategy.tensor_model_parallel_size = {}\n"
      "    recipe.trainer.strategy.sequence_parallel = {}  # Megatron-style SP with TP\n"
      "    recipe.trainer.strategy.pipeline_model_parallel_size = {}\n"
      "    recipe.trainer.strategy.pipeline_dtype = {}\n"
      "    recipe.trainer.strategy.virtual_pipeline_model_parallel_size = {}\n",
      par.tp_degree, python_bool(par.tp_degree > 1), par.pp_degree,
      par.pp_degree > 1 ? "torch.bfloat16" : "None",
      par.pp_degree > 1 && par.pp_schedule == models::PipelineSchedule::kInterleaved
          ? fmt::format("{}", par.virtual_stages)
          : std::string("None"));
  if (par.pp_degree > 1 && par.pp_first_stage_layers > 0) {
    s += fmt::format("    recipe.trainer.strategy.num_layers_in_first_pipeline_stage = {}\n",
                     par.pp_first_stage_layers);
  }
  if (par.pp_degree > 1 && par.pp_last_stage_layers > 0) {
    s += fmt::format("    recipe.trainer.strategy.num_layers_in_last_pipeline_stage = {}\n",
                     par.pp_last_stage_layers);
  }
  s += fmt::format("    recipe.trainer.strategy.context_parallel_size = {}\n", p.cp);
  return s;
}

// model.config: recompute as Megatron-Core reads it (transformer_config.py:255-283, 768-799 @
// 03f7793: full needs a method and a layer count, selective none; selective recomputes
// core_attn by default), the CP communication type (None means p2p in TE), the attention
// backend and RoPE fusion (off by default in Qwen's config).
std::string model_lines(Plan& p, const std::string& comm) {
  std::string s = fmt::format(
      "    recipe.model.config.seq_length = {}  # the data's too: NeMo does not sync them\n"
      "    recipe.model.config.cp_comm_type = \"{}\"\n",
      p.seq, comm);
  switch (p.recipe.checkpointing) {
    case CheckpointMode::kFull:
      s += "    recipe.model.config.recompute_granularity = \"full\"\n"
           "    recipe.model.config.recompute_method = \"uniform\"\n"
           "    recipe.model.config.recompute_num_layers = 1\n";
      break;
    case CheckpointMode::kSelective:
      s += "    recipe.model.config.recompute_granularity = \"selective\"  # core_attn\n"
           "    recipe.model.config.recompute_method = None\n"
           "    recipe.model.config.recompute_num_layers = None\n";
      break;
    case CheckpointMode::kNone:
      s += "    recipe.model.config.recompute_granularity = None\n"
           "    recipe.model.config.recompute_method = None\n"
           "    recipe.model.config.recompute_num_layers = None\n";
      break;
  }
  const std::string& kernel = p.recipe.attention_kernel;
  s += fmt::format("    recipe.model.config.attention_backend = AttnBackend.{}\n",
                   kernel == "cudnn" ? "fused" : "flash");
  if (kernel == "fa3") {
    p.note(
        "AttnBackend.flash runs FlashAttention through Transformer Engine (FA3 when flash-attn 3 "
        "is installed on Hopper)");
  } else if (kernel != "fa2" && kernel != "cudnn") {
    p.note(fmt::format(
        "Transformer Engine has no {} backend; the recipe's kernel is replaced by flash", kernel));
  }
  s += "    recipe.model.config.apply_rope_fusion = True\n";
  return s;
}

// Precision: the plugin's FP8 fields as TransformerEngine's delayed scaling cpsim simulates (the
// values of recipes/precision/mixed_precision.py bf16_with_fp8_mixed, with BF16 parameters
// gathered), and the gradient reduction dtype on both the plugin and the DDP config.
std::string precision_lines(const Plan& p) {
  std::string s;
  if (p.recipe.fp8) {
    s += "    recipe.trainer.plugins.fp8 = \"hybrid\"  # E4M3 forward, E5M2 gradients\n"
         "    recipe.trainer.plugins.fp8_recipe = \"delayed\"\n"
         "    recipe.trainer.plugins.fp8_amax_history_len = 1024\n"
         "    recipe.trainer.plugins.fp8_amax_compute_algo = \"max\"\n"
         "    recipe.trainer.plugins.fp8_param_gather = False\n";
  }
  const char* fp32_reduce = python_bool(p.recipe.grad_reduce_bytes == 4);
  s += fmt::format(
      "    recipe.trainer.plugins.grad_reduce_in_fp32 = {}\n"
      "    recipe.trainer.strategy.ddp.grad_reduce_in_fp32 = {}\n"
      "    recipe.optim.config.use_distributed_optimizer = {}\n",
      fp32_reduce, fp32_reduce, python_bool(p.recipe.zero_stage >= 1));
  return s;
}

void note_unexpressed(Plan& p) {
  if (p.recipe.zero_stage >= 2) {
    p.note(fmt::format(
        "use_distributed_optimizer shards optimizer states (and gradients in the "
        "reduce-scatter) but not parameters; ZeRO-{} parameter sharding needs Megatron FSDP, not "
        "set: memory will be higher than simulated",
        p.recipe.zero_stage));
  }
  if (p.recipe.optimizer_offload) {
    p.note("optimizer offload is not set (Megatron-Core's optimizer CPU offload is not covered)");
  }
  if (p.ckpt_offload()) {
    p.note(
        "checkpoint offload is not set: Megatron-Core's activation offloading is incompatible "
        "with recompute");
  }
  p.note_if_ckpt_offload_ignored();
  if (p.recipe.tiled_mlp) {
    p.note("tiled MLP has no NeMo recipe field");
  }
  if (p.recipe.fused_loss) {
    p.note(
        "fused linear cross-entropy (no logits) has no NeMo recipe field (its "
        "cross_entropy_loss_fusion still materialises the logits)");
  }
  if (!p.zigzag() && p.selects() != "a2a") {
    p.note(
        "Transformer Engine always uses the load-balanced DualChunkSwap (zigzag) layout; the "
        "contiguous layout is not selectable");
  }
  if (p.seq > p.model.max_position_embeddings) {
    p.note(fmt::format(
        "the sequence is longer than the model's {} positions; training past its native "
        "context needs RoPE scaling",
        p.model.max_position_embeddings));
  }
  p.note_comm_dtype_fixed("NeMo (TE)");
}

}  // namespace

// What the recipe runs as written (the notes of emit_nemo): Megatron-Core as Megatron-LM runs it
// (the distributed optimizer is ZeRO-1, no offload, no tiling, logits materialised, TE's flash or
// fused attention, CP tensors in the compute dtype), with the fused RoPE the file sets.
RecipeAsRun nemo_recipe_as_run(const sim::ScheduleInputs& in) {
  return megatron_core_recipe_as_run(
      in, {"NeMo (TE)", "use_distributed_optimizer", "no NeMo recipe field", "field",
           "apply_rope_fusion = True, set by the file"});
}

EmittedConfig emit_nemo(Plan& p) {
  const NemoRecipe* base = recipe_for(p.model);
  if (base == nullptr) {
    refuse(fmt::format(
        "NeMo has no pretrain recipe with {}'s shape ({}); its recipes: llama2_7b, llama3_8b, "
        "llama3_70b, llama31_405b, qwen3_4b/8b/14b/32b; use --emit megatron, whose arguments set "
        "the model's shape",
        p.model.name, shape_summary(p.model)));
  }
  require_seq_multiple_of_2cp(p, "NeMo", "Transformer Engine's DualChunkSwap layout");
  // The trainer starts num_nodes x num_gpus_per_node processes (its `devices` per node).
  const int per_node = p.procs_per_node();
  if (p.par.gpus % per_node != 0) {
    refuse(fmt::format(
        "NeMo's trainer runs num_nodes x num_gpus_per_node GPUs; {} GPUs are not whole nodes of {}",
        p.par.gpus, per_node));
  }
  const int nodes = p.par.gpus / per_node;
  const std::string comm = p.selects();
  p.note_selection();
  require_te_a2a_heads(p, comm == "a2a" ? p.cp : 0, "NeMo", "");
  note_unexpressed(p);

  std::string body =
      "import nemo_run as run\n"
      "import torch\n"
      "from megatron.core.transformer.enums import AttnBackend\n"
      "\n"
      "from nemo.collections import llm\n";
  body += fmt::format("from nemo.collections.llm.recipes import {}\n\n\n", base->module);
  body += "def cpsim_recipe() -> run.Partial:\n";
  body += fmt::format(
      "    recipe = {}.pretrain_recipe(name=\"cpsim\", num_nodes={}, num_gpus_per_node={})\n",
      base->module, nodes, per_node);
  body += strategy_lines(p);
  // One sequence per micro-batch; micro-batches per step = global / (micro x data parallel).
  body += fmt::format(
      "    recipe.data.seq_length = {}\n"
      "    recipe.data.micro_batch_size = 1\n"
      "    recipe.data.global_batch_size = {}  # {} micro-batch{} x data parallel {}\n",
      p.seq, p.par.micro_batches * p.dp, p.par.micro_batches, p.par.micro_batches > 1 ? "es" : "",
      p.dp);
  body += model_lines(p, comm);
  body += precision_lines(p);
  body +=
      "    return recipe\n"
      "\n"
      "\n"
      "if __name__ == \"__main__\":\n"
      "    run.cli.main(llm.pretrain, default_factory=cpsim_recipe)\n";

  std::vector<std::string> usage = {
      fmt::format("NeMo 2.0 recipe (from {}.pretrain_recipe); replace recipe.data (a mock "
                  "dataset) with your data module, then on each node:",
                  base->module),
      fmt::format("  torchrun --nnodes {} --nproc-per-node {} ... {} --yes", nodes, per_node,
                  p.main_file("cpsim_nemo.py"))};
  add_environment_line(p, usage);
  return finish(p, {std::move(usage), std::move(body), "cpsim_nemo.py", true});
}

}  // namespace cpsim::planner::emit_detail
