#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

// ---- Megatron-LM arguments (REFERENCES.md [Megatron-LM]) ----------------------------------------

// Megatron-Core as a launcher's file runs it (Megatron-LM's arguments, NeMo's recipe): the
// distributed optimizer (ZeRO-1: no parameter or gradient sharding in memory), no optimizer or
// checkpoint offload, tiled MLP or fused loss; the fused RoPE; attention through TE's flash or
// fused (cuDNN) backend; CP tensors in the compute dtype. `w` names the launcher's settings.
RecipeAsRun megatron_core_recipe_as_run(const sim::ScheduleInputs& in, const MegatronCoreWords& w) {
  RecipeAsRun r{in.recipe, {}};
  models::TrainingRecipe& x = r.recipe;
  if (x.zero_stage > 1) {
    run_as(r, x.zero_stage, 1,
           fmt::format("ZeRO-1 ({} shards optimizer states only)", w.distributed_optimizer));
  }
  run_as(r, x.optimizer_offload, false, "no optimizer offload (not emitted)");
  no_offload_or_tiling(r, "incompatible with recompute", w.no_setting);
  run_as(r, x.fused_loss, false,
         fmt::format("logits materialised (no fused linear cross-entropy {})", w.setting_kind));
  run_as(r, x.rope_kernel, models::RopeKernel::kFused,
         fmt::format("Megatron-Core's fused RoPE ({})", w.rope_fusion));
  if (x.attention_kernel != "fa2" && x.attention_kernel != "fa3" && x.attention_kernel != "cudnn") {
    run_as(r, x.attention_kernel, std::string("fa2"), "attention through TE's flash backend");
  }
  comm_dtype_fixed(r, w.launcher_te);
  return r;
}

RecipeAsRun megatron_recipe_as_run(const sim::ScheduleInputs& in) {
  return megatron_core_recipe_as_run(
      in, {"Megatron-LM (TE)", "--use-distributed-optimizer", "no Megatron-LM flag", "flag",
           "on unless --no-rope-fusion, which is not emitted"});
}

void require_te_a2a_heads(const Plan& p, int a2a, const char* launcher, const char* instead) {
  if (a2a > 1 && (p.model.kv_heads % a2a != 0 || p.model.heads % a2a != 0)) {
    refuse(fmt::format(
        "{}'s a2a CP splits query and KV heads across the {} all-to-all ranks "
        "(Transformer "
        "Engine does not replicate KV heads): {} has {} KV heads, so the a2a size must divide {}; "
        "use --emit deepspeed, accelerate or arctic (they replicate KV heads){}",
        launcher, a2a, p.model.name, p.model.kv_heads, p.model.kv_heads, instead));
  }
}

namespace {

using Args = std::vector<std::vector<std::string>>;  // one flag with its values per line

void window_args(const models::TransformerSpec& m, Args& a);
void expert_args(const Plan& p, Args& a);

// The gated MLP's activation. Megatron-LM arguments.py (core_v0.16.1): --swiglu (SiLU GLU);
// --quick-geglu (gated_linear_unit with quick_gelu, x·σ(1.702·x): argument_utils.py) with
// --glu-linear-offset (act(x[0])·(x[1] + offset)) and --activation-func-clamp-value (x[0] ≤ c,
// |x[1]| ≤ c; experts.py's fused weighted_bias_quick_geglu_impl): gpt-oss's GLU, as Megatron-LM's
// examples/gptoss runs it. No flag names Gemma's tanh-GELU GLU.
void activation_args(const models::TransformerSpec& m, Args& a) {
  switch (m.activation) {
    case models::ActivationKind::kSwiGlu:
      a.push_back({"--swiglu"});
      return;
    case models::ActivationKind::kClampedQuickGeGlu:
      a.push_back({"--quick-geglu"});
      a.push_back({"--glu-linear-offset", "1.0"});
      a.push_back({"--activation-func-clamp-value", number(models::kGptOssGluLimit)});
      return;
    case models::ActivationKind::kGeGlu:
      break;
  }
  throw InputError("--model", fmt::format("Megatron-LM's arguments name no tanh-GELU gated MLP "
                                          "(--swiglu, --quick-geglu); {} has one",
                                          m.name));
}

// Biases. --add-qkv-bias: the q, k, v projections' (linear_qkv); add_bias_linear (the default;
// --disable-bias-linear turns it off): every linear's, the output projection, the MLP's, the
// experts' and the router's included (arguments.py keeps add_qkv_bias on with it; megatron-core
// 0.16.1 moe/router.py:67 gives the router one). So a model whose output projection has a bias
// needs biases on its MLP too (gpt-oss), and one with MLP biases needs them on every linear.
void bias_args(const models::TransformerSpec& m, Args& a) {
  const bool mlp_biases = m.is_moe() && m.moe.biases;
  if (m.output_proj_bias && m.qkv_bias && mlp_biases) {
    return;  // add_bias_linear
  }
  if (m.output_proj_bias || mlp_biases) {
    throw InputError("--model", fmt::format("{} has biases on {} but not on every linear: "
                                            "Megatron-LM's --add-bias-linear puts one on each",
                                            m.name,
                                            m.output_proj_bias ? "its attention's output "
                                                                 "projection"
                                                               : "its MLP"));
  }
  a.push_back({"--disable-bias-linear"});
  if (m.qkv_bias) {
    a.push_back({"--add-qkv-bias"});
  }
}

// Multi-head latent attention (Megatron-LM d98e8a6 arguments.py:3548-3556; Megatron-LM selects
// MLATransformerConfig with --multi-latent-attention, argument_utils.py:292-293): the ranks, the
// non-rotated and rotated q/k widths, the value width, and the RoPE: the config's YaRN as
// --rope-type yarn with --rotary-scaling-factor, --mscale and --mscale-all-dim, which reach
// MLATransformerConfig's fields of those names (arguments.py:2907-2910, 3558-3563). Absent
// mscale and mscale_all_dim in the config give transformers' attention factor 0.1·ln(factor) + 1,
// which MLATransformerConfig's 1.0 and 0.0 reproduce (its _yarn_get_mscale). Plain RoPE without a
// YaRN config (MLATransformerConfig's default is YaRN).
void latent_attention_args(const models::TransformerSpec& m, Args& a) {
  if (!m.is_mla()) {
    return;
  }
  a.push_back({"--multi-latent-attention"});
  if (m.mla.q_lora_rank > 0) {
    a.push_back({"--q-lora-rank", fmt::format("{}", m.mla.q_lora_rank)});
  }
  a.push_back({"--kv-lora-rank", fmt::format("{}", m.mla.kv_lora_rank)});
  a.push_back({"--qk-head-dim", fmt::format("{}", m.head_dim - m.mla.rope_head_dim)});
  a.push_back({"--qk-pos-emb-head-dim", fmt::format("{}", m.mla.rope_head_dim)});
  a.push_back({"--v-head-dim", fmt::format("{}", m.value_head_dim())});
  if (!m.yarn) {
    a.push_back({"--rope-type", "rope"});
    return;
  }
  a.push_back({"--rope-type", "yarn"});
  a.push_back({"--rotary-scaling-factor", number(m.yarn->factor)});
  a.push_back({"--mscale", number(m.yarn->mscale.value_or(1.0))});
  a.push_back({"--mscale-all-dim", number(m.yarn->mscale_all_dim.value_or(0.0))});
}

// The model's shape and architecture flags.
void model_args(const Plan& p, std::int64_t max_pos, Args& a) {
  a.push_back({"--num-layers", fmt::format("{}", p.model.layers)});
  a.push_back({"--hidden-size", fmt::format("{}", p.model.hidden)});
  a.push_back({"--ffn-hidden-size", fmt::format("{}", p.model.ffn_hidden)});
  a.push_back({"--num-attention-heads", fmt::format("{}", p.model.heads)});
  if (p.model.kv_heads != p.model.heads) {
    a.push_back({"--group-query-attention"});
    a.push_back({"--num-query-groups", fmt::format("{}", p.model.kv_heads)});
  }
  a.push_back({"--kv-channels", fmt::format("{}", p.model.head_dim)});
  latent_attention_args(p.model, a);
  a.push_back({"--seq-length", fmt::format("{}", p.seq)});
  a.push_back({"--max-position-embeddings", fmt::format("{}", max_pos)});
  a.push_back({"--position-embedding-type", "rope"});
  a.push_back({"--rotary-base", number(p.model.rope_theta)});
  a.push_back(
      {"--normalization", p.model.norm == models::NormKind::kRmsNorm ? "RMSNorm" : "LayerNorm"});
  activation_args(p.model, a);
  bias_args(p.model, a);
  if (p.model.attention_sinks) {
    // A learned softmax offset per head (megatron-core 0.16.1 dot_product_attention.py:126,
    // TE's softmax_type): gpt-oss's sinks (Megatron-LM examples/gptoss).
    a.push_back({"--softmax-type", "learnable"});
  }
  if (!p.model.tied_embeddings) {
    a.push_back({"--untie-embeddings-and-output-weights"});
  }
  if (p.model.qk_norm) {
    a.push_back({"--qk-layernorm"});
  }
  window_args(p.model, a);
  expert_args(p, a);
}

// A mixture of experts (Megatron-LM core_v0.16.1 arguments.py, the MoE group; megatron-core
// 0.16.1 TransformerConfig): E experts of width f_e, top k, as simulated (step_experts.cpp): the
// all-to-all dispatcher, grouped expert GEMMs, no load-balancing loss, E_p-way expert parallelism
// (expert TP = TP, folded with CP and DP: megatron_core_cp's experts). Megatron's router takes the
// top k logits and softmaxes them, which is the softmax over all renormalised over the k
// (Mixtral, Qwen3-MoE with norm_topk_prob); without renormalisation, --moe-router-pre-softmax
// (the softmax over all, then the top k).
void expert_args(const Plan& p, Args& a) {
  const models::TransformerSpec& m = p.model;
  if (!m.is_moe()) {
    return;
  }
  a.push_back({"--num-experts", fmt::format("{}", m.moe.experts)});
  a.push_back({"--moe-router-topk", fmt::format("{}", m.moe.experts_per_token)});
  a.push_back({"--moe-ffn-hidden-size", fmt::format("{}", m.moe.expert_ffn_hidden)});
  if (m.moe.groups > 0) {
    // DeepSeek-V3's router (megatron-core 0.16.1 TransformerConfig moe_router_score_function,
    // moe_router_enable_expert_bias, moe_router_num_groups, moe_router_group_topk,
    // moe_router_topk_scaling_factor; moe/moe_utils.py topk_routing_with_score_function: sigmoid
    // scores, the top k renormalised when k > 1).
    a.push_back({"--moe-router-score-function", "sigmoid"});
    a.push_back({"--moe-router-enable-expert-bias"});
    a.push_back({"--moe-router-num-groups", fmt::format("{}", m.moe.groups)});
    a.push_back({"--moe-router-group-topk", fmt::format("{}", m.moe.group_topk)});
    a.push_back({"--moe-router-topk-scaling-factor", number(m.moe.routed_scaling)});
  } else if (!m.moe.renormalize) {
    a.push_back({"--moe-router-pre-softmax"});
  }
  // A shared expert (megatron-core 0.16.1 TransformerConfig moe_shared_expert_intermediate_size,
  // moe_shared_expert_gate: SharedExpertMLP's sigmoid gate; Megatron-LM d98e8a6 builds the
  // config's flags from its fields, arguments.py:2373).
  if (m.moe.shared_ffn_hidden > 0) {
    a.push_back(
        {"--moe-shared-expert-intermediate-size", fmt::format("{}", m.moe.shared_ffn_hidden)});
    if (m.moe.shared_gate) {
      a.push_back({"--moe-shared-expert-gate"});
    }
  }
  // Layers with experts and dense ones (megatron-core 0.16.1 moe_layer_freq, a list with 1 for a
  // layer with experts: models/gpt/gpt_layer_specs.py:579-590); the dense ones' MLP is
  // --ffn-hidden-size.
  if (m.mixed_mlp()) {
    std::string list = "[";
    for (std::int64_t l = 0; l < m.layers; ++l) {
      list += fmt::format("{}{}", l > 0 ? "," : "", m.experts_at(l) ? 1 : 0);
    }
    a.push_back({"--moe-layer-freq", list + "]"});
  }
  a.push_back({"--moe-token-dispatcher-type", "alltoall"});
  a.push_back({"--moe-grouped-gemm"});
  a.push_back({"--moe-router-load-balancing-type", "none"});
  a.push_back({"--expert-model-parallel-size", fmt::format("{}", p.par.ep_degree)});
}

// Sliding-window layers. Megatron-LM core_v0.16.1 arguments.py:1632 (--window-size, tuple_type
// :281-291: "4095,0" is (4095, 0)) and :1635 (--window-attn-skip-freq, moe_freq_type :231-254: an
// int, or a list in which 1 is a sliding-window layer); megatron/core/transformer/utils.py:451-467
// (is_layer_window_attention, layer numbers from 1; no skip frequency: every layer). TE's window
// (left, right) is inclusive, so (w − 1, 0) is w keys, the query's own included, as transformers'
// sliding_window w. TE runs it under CP with cp_comm_type a2a or all_gather only
// (megatron_core_cp's sliding_window).
void window_args(const models::TransformerSpec& m, Args& a) {
  if (m.windowed_layers() == 0) {
    return;
  }
  a.push_back({"--window-size", fmt::format("{},0", m.sliding_window - 1)});
  if (m.windowed_layers() < m.layers) {
    std::string list = "[";
    for (std::int64_t l = 0; l < m.layers; ++l) {
      list += fmt::format("{}{}", l > 0 ? "," : "",
                          m.attention_of(l) == models::LayerAttention::kSliding ? 1 : 0);
    }
    a.push_back({"--window-attn-skip-freq", list + "]"});
  }
}

// TP, PP, CP and the batch.
void parallel_args(const Plan& p, const std::string& comm, Args& a) {
  a.push_back({"--tensor-model-parallel-size", fmt::format("{}", p.par.tp_degree)});
  if (p.par.tp_degree > 1) {
    a.push_back({"--sequence-parallel"});  // Megatron-style SP, as simulated
  }
  // Pipeline parallelism (training/arguments.py @d98e8a6): P stages; the interleaved schedule's V
  // as --num-virtual-stages-per-pipeline-rank (the form uneven stages require, arguments.py:955);
  // uneven first/last stages with --decoder-first/last-pipeline-num-layers
  // (transformer_block.py:95-146). Megatron's 1F1B turns overlap_p2p_comm off, interleaving keeps
  // it on by default: what cpsim's composition assumes (sim/src/pipeline.cpp).
  a.push_back({"--pipeline-model-parallel-size", fmt::format("{}", p.par.pp_degree)});
  if (p.par.pp_degree > 1 && p.par.pp_schedule == models::PipelineSchedule::kInterleaved) {
    a.push_back(
        {"--num-virtual-stages-per-pipeline-rank", fmt::format("{}", p.par.virtual_stages)});
  }
  if (p.par.pp_degree > 1 && p.par.pp_first_stage_layers > 0) {
    a.push_back(
        {"--decoder-first-pipeline-num-layers", fmt::format("{}", p.par.pp_first_stage_layers)});
  }
  if (p.par.pp_degree > 1 && p.par.pp_last_stage_layers > 0) {
    a.push_back(
        {"--decoder-last-pipeline-num-layers", fmt::format("{}", p.par.pp_last_stage_layers)});
  }
  a.push_back({"--context-parallel-size", fmt::format("{}", p.cp)});
  a.push_back({"--cp-comm-type", comm});
  if (comm == "a2a+p2p") {
    a.push_back({"--hierarchical-context-parallel-sizes", fmt::format("{}", p.ulysses),
                 fmt::format("{}", p.ring)});
  }
  a.push_back({"--micro-batch-size", "1"});
  // Micro-batches per step = global / (micro-batch size x data parallel): gradient accumulation
  // without PP, the pipeline's micro-batches with it (core/num_microbatches_calculator.py:379).
  a.push_back({"--global-batch-size", fmt::format("{}", p.par.micro_batches * p.dp)});
}

// Precision, FP8, the distributed optimizer and recomputation.
void training_args(const Plan& p, Args& a) {
  a.push_back({p.recipe.param_bytes == 2 ? "--bf16" : "--fp16"});
  if (p.recipe.fp8) {
    // TransformerEngine's delayed scaling as simulated: E4M3 forward, E5M2 gradients, the
    // recipe's 1024-step amax history with the max of it.
    a.push_back({"--fp8-format", "hybrid"});
    a.push_back({"--fp8-amax-history-len", "1024"});
    a.push_back({"--fp8-amax-compute-algo", "max"});
  }
  // cpsim reduces each block's gradients as soon as its backward ends, overlapped with the
  // backward of the blocks below (StepBuilder::backward_layers): Megatron's DDP does that with
  // --overlap-grad-reduce (its buckets reduce as their gradients are ready), and with the
  // distributed optimizer gathers the updated parameters overlapped with the next forward with
  // --overlap-param-gather (arguments.py:1024-1029 requires the first). Without them both
  // collectives run after the backward and the optimizer, exposed.
  a.push_back({"--overlap-grad-reduce"});
  if (p.recipe.zero_stage >= 1) {
    a.push_back({"--use-distributed-optimizer"});
    a.push_back({"--overlap-param-gather"});
  }
  switch (p.recipe.checkpointing) {
    case CheckpointMode::kFull:
      a.push_back({"--recompute-granularity", "full"});
      a.push_back({"--recompute-method", "uniform"});
      a.push_back({"--recompute-num-layers", "1"});
      break;
    case CheckpointMode::kSelective:
      a.push_back({"--recompute-granularity", "selective"});
      a.push_back({"--recompute-modules", "core_attn"});
      break;
    case CheckpointMode::kNone:
      break;
  }
}

// The attention backend inside TE, with a note where the recipe's kernel is not what runs.
void attention_backend_args(Plan& p, Args& a) {
  const std::string& kernel = p.recipe.attention_kernel;
  if (kernel == "cudnn" || p.model.attention_sinks || p.model.is_mla()) {
    // cuDNN fused attention inside TE; TE runs a learnable softmax (the sinks) under CP on it
    // only, and MLA's unequal head widths (megatron_core_cp's attention_kernel).
    a.push_back({"--attention-backend", "fused"});
    return;
  }
  a.push_back({"--attention-backend", "flash"});
  if (kernel == "fa3") {
    p.note(
        "--attention-backend flash runs FlashAttention through Transformer Engine (FA3 when "
        "flash-attn 3 is installed on Hopper; recent Megatron can pin it with "
        "--flash-attention-version 3)");
  } else if (kernel != "fa2") {
    p.note(
        fmt::format("Megatron-LM has no SDPA backend in TE; the recipe's {} kernel is "
                    "replaced by flash",
                    kernel));
  }
}

// What the recipe asks for that the file cannot say.
void notes_on_what_is_not_emitted(Plan& p, const std::string& comm, std::int64_t max_pos) {
  if (p.recipe.zero_stage >= 2) {
    p.note(
        fmt::format("--use-distributed-optimizer shards optimizer states (and gradients in the "
                    "reduce-scatter) but not parameters; ZeRO-{} parameter sharding needs "
                    "Megatron FSDP, not emitted: memory will be higher than simulated",
                    p.recipe.zero_stage));
  }
  if (p.recipe.optimizer_offload) {
    p.note(
        "optimizer offload is not emitted (Megatron-Core's optimizer CPU offload is not covered "
        "here; check your version)");
  }
  if (p.ckpt_offload()) {
    p.note(
        "checkpoint offload is not emitted: --cpu-offloading-num-layers is incompatible with "
        "recompute");
  }
  p.note_if_ckpt_offload_ignored();
  if (p.recipe.tiled_mlp) {
    p.note("tiled MLP has no Megatron-LM flag");
  }
  if (p.recipe.fused_loss) {
    p.note(
        "fused linear cross-entropy (no logits) has no Megatron-LM flag "
        "(--cross-entropy-loss-fusion still materialises the logits)");
  }
  if (!p.zigzag() && comm != "a2a") {
    p.note(
        "Transformer Engine always uses the load-balanced DualChunkSwap (zigzag) layout; the "
        "contiguous layout is not selectable");
  }
  if (max_pos != p.model.max_position_embeddings) {
    p.note(
        fmt::format("--max-position-embeddings raised from {} to the sequence length; training "
                    "past the model's native context needs RoPE scaling",
                    p.model.max_position_embeddings));
  }
  if (p.model.is_mla()) {
    p.note("multi-token prediction (--mtp-num-layers) is not emitted");
  }
  // MLATransformerConfig keeps its own original_max_position_embeddings 4096, beta_fast 32 and
  // beta_slow 1 (megatron-core 0.16.1 transformer_config.py): Megatron-LM's --yarn-* arguments
  // reach only non-MLA models (argument_utils.py:384-413).
  if (const auto& y = p.model.yarn; y && p.model.is_mla() &&
                                    (y->original_max_position_embeddings != 4096 ||
                                     y->beta_fast != 32.0 || y->beta_slow != 1.0)) {
    p.note(fmt::format(
        "YaRN's original_max_position_embeddings {}, beta_fast {} and beta_slow {} differ from "
        "MLATransformerConfig's 4096, 32 and 1, which Megatron-LM's arguments do not set for MLA",
        y->original_max_position_embeddings, number(y->beta_fast), number(y->beta_slow)));
  }
  if (p.model.yarn && !p.model.is_mla()) {
    p.note(
        "--position-embedding-type rope: the config's YaRN scaling is not carried; add "
        "--position-embedding-type yarn with --rotary-scaling-factor and the --yarn-* values to "
        "match it (the same step's cost)");
  }
  p.note_comm_dtype_fixed("Megatron-LM (TE)");
}

// The bash array the launch line expands.
std::string megatron_args_text(const Plan& p, const Args& a) {
  std::string text;
  if (p.recipe.expandable_segments) {
    text += "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n";
  }
  text += "MEGATRON_ARGS=(\n";
  for (const auto& line : a) {
    text += " ";
    for (const auto& w : line) {
      text += fmt::format(" {}", shell_word(w));
    }
    text += "\n";
  }
  text += ")\n";
  return text;
}

}  // namespace

EmittedConfig emit_megatron(Plan& p) {
  require_seq_multiple_of_2cp(p, "Megatron-LM", "Transformer Engine's DualChunkSwap layout");
  const std::string& comm = p.selects();  // --cp-comm-type
  p.note_selection();
  // Size of the all-to-all (Ulysses) part: the CP group for a2a, the Ulysses degree for a2a+p2p.
  const int a2a = comm == "a2a" ? p.cp : comm == "a2a+p2p" ? p.ulysses : 0;
  require_te_a2a_heads(p, a2a, "Megatron-LM", ", or --method usp with a smaller Ulysses degree");
  if (p.model.is_mla() && p.cp > 1 && comm != "p2p" && comm != "a2a+p2p") {
    // TransformerEngine v2.11 context_parallel.py:4031-4035 (megatron_core_cp's latent_attention).
    refuse(
        fmt::format("{} has multi-head latent attention, which TransformerEngine runs under CP "
                    "with --cp-comm-type p2p or a2a+p2p only, not {}: use --method ring or usp",
                    p.model.name, comm));
  }

  const std::int64_t max_pos = std::max(p.model.max_position_embeddings, p.seq);
  Args a;
  model_args(p, max_pos, a);
  parallel_args(p, comm, a);
  training_args(p, a);
  attention_backend_args(p, a);
  notes_on_what_is_not_emitted(p, comm, max_pos);

  std::vector<std::string> usage = {
      "Megatron-LM arguments; add data, tokenizer, optimizer and schedule flags, then:",
      fmt::format("  source cpsim_megatron.sh && torchrun --nnodes {} --nproc_per_node {} ... "
                  "pretrain_gpt.py \"${{MEGATRON_ARGS[@]}}\" ...",
                  p.nodes, p.procs_per_node())};
  return finish(p, {std::move(usage), megatron_args_text(p, a), "cpsim_megatron.sh", true});
}

}  // namespace cpsim::planner::emit_detail
