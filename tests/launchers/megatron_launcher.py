"""Check a cpsim Megatron-LM argument array against megatron-core's own code, on CPU.

Megatron-LM's parser (megatron.training.arguments) is not part of the megatron-core wheel, so the
flags are mapped onto the fields Megatron-LM's core_transformer_config_from_args fills (mapping as
of Megatron-LM tag core_v0.16.1), and megatron-core validates them: TransformerConfig.__post_init__
(heads / query groups vs TP, recompute, fusions, sequence parallel), the DDP and optimizer configs,
parallel_state.initialize_model_parallel on a "fake" torch.distributed group of the emitted world
size (world % tp*pp*cp, rank layout), the microbatch calculator (global batch vs micro * dp) and
get_batch_on_this_cp_rank on a token batch of the real sequence length (seq % 2*cp).
Flags with no mapping are listed in the notes. usage: megatron_launcher.py args.sh --gpus N
"""
import ast
import contextlib
import functools
import importlib.metadata as md

import launcher_check
from launcher_check import bash_array_flags, main, new_report

# the launcher's innermost frame names where it raised
stage = functools.partial(launcher_check.stage, frames="/megatron/")

INT = {"--num-layers": "num_layers", "--hidden-size": "hidden_size",
       "--ffn-hidden-size": "ffn_hidden_size", "--num-attention-heads": "num_attention_heads",
       "--num-query-groups": "num_query_groups", "--kv-channels": "kv_channels",
       "--tensor-model-parallel-size": "tensor_model_parallel_size",
       "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
       "--context-parallel-size": "context_parallel_size",
       "--recompute-num-layers": "recompute_num_layers", "--num-experts": "num_moe_experts",
       "--moe-router-topk": "moe_router_topk", "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
       "--expert-model-parallel-size": "expert_model_parallel_size",
       "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
       "--q-lora-rank": "q_lora_rank", "--kv-lora-rank": "kv_lora_rank",
       "--qk-head-dim": "qk_head_dim", "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
       "--v-head-dim": "v_head_dim", "--moe-router-num-groups": "moe_router_num_groups",
       "--moe-router-group-topk": "moe_router_group_topk"}
STR = {"--normalization": "normalization", "--recompute-granularity": "recompute_granularity",
       "--recompute-method": "recompute_method",
       "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
       "--moe-router-load-balancing-type": "moe_router_load_balancing_type",
       "--softmax-type": "softmax_type", "--rope-type": "rope_type",
       "--moe-router-score-function": "moe_router_score_function"}
FLOAT = {"--attention-dropout": "attention_dropout", "--hidden-dropout": "hidden_dropout",
         "--norm-epsilon": "layernorm_epsilon", "--glu-linear-offset": "glu_linear_offset",
         "--activation-func-clamp-value": "activation_func_clamp_value",
         "--moe-router-topk-scaling-factor": "moe_router_topk_scaling_factor",
         "--rotary-scaling-factor": "rotary_scaling_factor", "--mscale": "mscale",
         "--mscale-all-dim": "mscale_all_dim"}
TRUE = {"--qk-layernorm": "qk_layernorm", "--sequence-parallel": "sequence_parallel",
        "--bf16": "bf16", "--fp16": "fp16", "--moe-grouped-gemm": "moe_grouped_gemm",
        "--moe-router-pre-softmax": "moe_router_pre_softmax", "--add-qkv-bias": "add_qkv_bias",
        "--moe-shared-expert-gate": "moe_shared_expert_gate",
        "--moe-router-enable-expert-bias": "moe_router_enable_expert_bias",
        "--multi-latent-attention": "multi_latent_attention"}
FALSE = {"--disable-bias-linear": "add_bias_linear", "--no-rope-fusion": "apply_rope_fusion",
         "--no-bias-swiglu-fusion": "bias_activation_fusion",
         "--no-bias-gelu-fusion": "bias_activation_fusion",
         "--no-masked-softmax-fusion": "masked_softmax_fusion",
         "--no-bias-dropout-fusion": "bias_dropout_fusion"}
SPECIAL = {"--swiglu", "--quick-geglu", "--group-query-attention", "--cp-comm-type",
           "--attention-backend", "--use-distributed-optimizer", "--micro-batch-size",
           "--global-batch-size", "--seq-length", "--window-size", "--window-attn-skip-freq",
           "--moe-layer-freq"}
# flags Megatron-LM hands to GPTModel / the data path, not to a megatron-core config object
MODEL_LEVEL = {"--max-position-embeddings", "--position-embedding-type", "--rotary-base",
               "--rotary-percent", "--untie-embeddings-and-output-weights"}


def to_kwargs(fl):
    """TransformerConfig kwargs as Megatron-LM's parser and core_transformer_config_from_args
    build them (core_v0.16.1), with Megatron-LM's defaults for flags that are not given."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnBackend
    kw = {"bias_activation_fusion": True}  # --no-bias-swiglu-fusion / --no-bias-gelu-fusion unset
    for table, conv in ((INT, int), (STR, str), (FLOAT, float)):
        kw.update({table[k]: conv(v) for k, v in fl.items() if k in table})
    kw.update({TRUE[k]: True for k in fl if k in TRUE})
    kw.update({FALSE[k]: False for k in fl if k in FALSE})
    if kw.get("add_bias_linear", True):  # validate_args keeps add_qkv_bias on with it (@ d98e8a6)
        kw["add_qkv_bias"] = True
    if "--group-query-attention" not in fl:
        kw["num_query_groups"] = None
    if "--swiglu" in fl:
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    if "--quick-geglu" in fl:  # Megatron-LM argument_utils.py (core_transformer_config_from_args)
        from megatron.core.fusions.fused_bias_geglu import quick_gelu
        kw.update(gated_linear_unit=True, activation_func=quick_gelu)
    if "--attention-backend" in fl:  # argparse type: AttnBackend[name]
        kw["attention_backend"] = AttnBackend[fl["--attention-backend"]]
    cp_comm = fl.get("--cp-comm-type", "p2p")
    kw["cp_comm_type"] = cp_comm if isinstance(cp_comm, str) else (
        cp_comm[0] if len(cp_comm) == 1 else list(cp_comm))
    if "--window-size" in fl:  # Megatron-LM tuple_type (arguments.py:281-291 @ core_v0.16.1)
        kw["window_size"] = tuple(int(i) for i in fl["--window-size"].strip("()").split(","))
    if "--window-attn-skip-freq" in fl:  # moe_freq_type (:231-254): an int, or a list
        freq = fl["--window-attn-skip-freq"]
        kw["window_attn_skip_freq"] = ast.literal_eval(freq) if "[" in freq else int(freq)
    if "--moe-layer-freq" in fl:  # moe_freq_type: an int, or a list with 1 for a layer with experts
        freq = fl["--moe-layer-freq"]
        kw["moe_layer_freq"] = ast.literal_eval(freq) if "[" in freq else int(freq)
    dtype = torch.bfloat16 if kw.get("bf16") else torch.float16 if kw.get("fp16") else None
    if dtype is not None:
        kw.update(params_dtype=dtype, pipeline_dtype=dtype)
    return kw


def window_layers(rep, tc):
    """Which layers megatron-core gives the window (is_layer_window_attention, layer numbers from
    1) as "S"/"F" per layer into the report, and TransformerEngine's condition for a window under
    CP (context_parallel.py attn_forward_func_with_cp, v2.11:4023-4029; TE is not installed here):
    cp_comm_type a2a or all_gather."""
    from megatron.core.transformer.utils import is_layer_window_attention
    rep["window_layers"] = "".join(
        "S" if is_layer_window_attention(tc.window_size, tc.window_attn_skip_freq, n) else "F"
        for n in range(1, tc.num_layers + 1))
    rep["window_size"] = list(tc.window_size)
    if tc.context_parallel_size > 1:
        assert tc.cp_comm_type in ("a2a", "all_gather"), (
            f"Context parallelism does not support sliding window attention with "
            f"cp_comm_type={tc.cp_comm_type!r}! (TransformerEngine's assert)")


def softmax_and_activation(rep, tc):
    """The attention's softmax, the MLP's activation and biases as megatron-core got them, and
    TransformerEngine's condition for a softmax other than vanilla under CP (context_parallel.py
    @ d0067d0:5062-5067; TE is not installed here): FusedAttention and cp_comm_type a2a."""
    rep["softmax_type"] = tc.softmax_type
    rep["activation"] = {"func": tc.activation_func.__name__, "gated": tc.gated_linear_unit,
                         "glu_linear_offset": tc.glu_linear_offset,
                         "clamp": tc.activation_func_clamp_value}
    rep["add_bias_linear"], rep["add_qkv_bias"] = tc.add_bias_linear, tc.add_qkv_bias
    if tc.context_parallel_size > 1 and tc.softmax_type != "vanilla":
        assert tc.attention_backend.name == "fused", (
            f"Context parallelism only supports softmax_type={tc.softmax_type!r} with "
            "FusedAttention backend! (TransformerEngine's assert)")
        assert tc.cp_comm_type == "a2a", (
            f"Context parallelism only supports softmax_type={tc.softmax_type!r} with "
            "cp_comm_type = 'a2a'! (TransformerEngine's assert)")


def latent_attention(rep, tc):
    """MLA's widths as megatron-core's MLATransformerConfig got them, and TransformerEngine's
    condition for MLA under CP (context_parallel.py, v2.11:4031-4035; TE is not installed here):
    cp_comm_type p2p or a2a+p2p."""
    rep["mla"] = {"q_lora_rank": tc.q_lora_rank, "kv_lora_rank": tc.kv_lora_rank,
                  "qk_head_dim": tc.qk_head_dim, "qk_pos_emb_head_dim": tc.qk_pos_emb_head_dim,
                  "v_head_dim": tc.v_head_dim, "rope_type": tc.rope_type}
    if tc.rope_type == "yarn":  # MLATransformerConfig's YaRN fields, as the rotary embedding reads
        rep["mla"]["yarn"] = {f: getattr(tc, f) for f in (
            "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
            "mscale", "mscale_all_dim")}
    if tc.context_parallel_size > 1:
        assert tc.cp_comm_type in ("p2p", "a2a+p2p"), (
            f"Context parallelism does not support MLA with cp_comm_type={tc.cp_comm_type!r}! "
            "(TransformerEngine's assert)")


def check(path: str, gpus: int) -> dict:
    rep = new_report()
    for pkg in ("megatron-core", "torch", "transformer-engine"):
        with contextlib.suppress(md.PackageNotFoundError):
            rep["versions"][pkg] = None
            rep["versions"][pkg] = md.version(pkg)
    import torch
    import torch.distributed as tdist
    try:
        import megatron.training.arguments  # noqa: F401
        rep["notes"].append("megatron.training.arguments is importable (not used: see docstring)")
    except ImportError as e:
        rep["notes"].append(f"megatron.training.arguments not in the megatron-core wheel ({e}); "
                            "flags mapped onto megatron-core configs instead")
    from megatron.core import num_microbatches_calculator as nmc
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )
    from megatron.core.utils import get_batch_on_this_cp_rank
    fl = stage(rep, "parse bash array", lambda: bash_array_flags(path))
    if fl is None:
        return rep
    kw = stage(rep, "map flags onto TransformerConfig fields", lambda: to_kwargs(fl))
    if kw is None:
        return rep
    dtype, tp = kw.get("params_dtype"), kw.get("tensor_model_parallel_size", 1)
    if tp == 1 and kw.get("sequence_parallel"):  # Megatron-LM's validate_args does this
        kw["sequence_parallel"] = False
        rep["notes"].append("--sequence-parallel with TP 1: Megatron-LM turns it off (warning)")
    known = set(INT) | set(STR) | set(FLOAT) | set(TRUE) | set(FALSE) | SPECIAL | MODEL_LEVEL
    unmapped = [k for k in fl if k not in known]
    if unmapped:
        rep["notes"].append(f"flags without a mapping (not checked): {unmapped}")
    rep["notes"].append("model-level flags (GPTModel / data path; not checked by megatron-core "
                        f"configs): {[k for k in fl if k in MODEL_LEVEL]}")
    rep["notes"].append("Megatron-LM default apply_rope_fusion / masked_softmax_fusion / "
                        "persist_layer_norm / bias_dropout_fusion left at TransformerConfig "
                        "defaults: their checks need Transformer Engine / Apex (GPU)")
    # Megatron-LM builds MLATransformerConfig with --multi-latent-attention (argument_utils.py)
    config = MLATransformerConfig if kw.get("multi_latent_attention") else TransformerConfig
    tc = stage(rep, f"{config.__name__}(**flags).__post_init__", lambda: config(**kw))
    if tc is not None and getattr(tc, "multi_latent_attention", False):
        stage(rep, "multi-head latent attention", lambda: latent_attention(rep, tc))
    if tc is not None and tc.window_size:
        stage(rep, "sliding-window layers", lambda: window_layers(rep, tc))
    if tc is not None:
        stage(rep, "softmax and activation", lambda: softmax_and_activation(rep, tc))
    dist_opt = "--use-distributed-optimizer" in fl
    overlap = {"overlap_grad_reduce": "--overlap-grad-reduce" in fl,
               "overlap_param_gather": "--overlap-param-gather" in fl}

    def validate_overlap():  # Megatron-LM's validate_args (arguments.py:1024-1029 @ d98e8a6)
        if overlap["overlap_param_gather"]:
            assert dist_opt, "--overlap-param-gather only supported with distributed optimizer"
            assert overlap["overlap_grad_reduce"], (
                "Must use --overlap-param-gather with --overlap-grad-reduce")

    stage(rep, "validate_args: overlap flags", validate_overlap)
    stage(rep, "DistributedDataParallelConfig", lambda: DistributedDataParallelConfig(
        use_distributed_optimizer=dist_opt, **overlap))
    stage(rep, "OptimizerConfig", lambda: OptimizerConfig(
        bf16=bool(kw.get("bf16")), fp16=bool(kw.get("fp16")), params_dtype=dtype or torch.float32,
        use_distributed_optimizer=dist_opt))
    pp, cp = kw.get("pipeline_model_parallel_size", 1), kw.get("context_parallel_size", 1)
    ep = kw.get("expert_model_parallel_size", 1)
    tdist.init_process_group("fake", rank=0, world_size=gpus)
    try:
        done = stage(rep, f"parallel_state.initialize_model_parallel on {gpus} ranks", lambda: (
            ps.initialize_model_parallel(tensor_model_parallel_size=tp,
                                         pipeline_model_parallel_size=pp,
                                         context_parallel_size=cp,
                                         expert_model_parallel_size=ep,
                                         create_gloo_process_groups=False), True)[1])
        if done:
            dp = ps.get_data_parallel_world_size()
            rep["notes"].append(f"megatron-core layout: tp {tp} x pp {pp} x cp {cp} x dp {dp}"
                                f" (expert tp {tc.expert_tensor_parallel_size if tc else '?'})")
            if tc is not None and tc.num_moe_experts:
                # The rank's expert-parallel group as megatron-core lays it out (tp-ep-dp).
                rep["experts"] = {
                    "num_moe_experts": tc.num_moe_experts, "topk": tc.moe_router_topk,
                    "ffn_hidden": tc.moe_ffn_hidden_size, "pre_softmax": tc.moe_router_pre_softmax,
                    "shared_ffn_hidden": tc.moe_shared_expert_intermediate_size,
                    "shared_gate": tc.moe_shared_expert_gate,
                    "score_function": tc.moe_router_score_function,
                    "num_groups": tc.moe_router_num_groups,
                    "group_topk": tc.moe_router_group_topk,
                    "topk_scaling": tc.moe_router_topk_scaling_factor,
                    "layer_freq": tc.moe_layer_freq,
                    "dispatcher": tc.moe_token_dispatcher_type,
                    "ep_group": ps.get_expert_model_parallel_world_size(),
                    "expert_data_parallel": ps.get_expert_data_parallel_world_size()}
            mbs = int(fl.get("--micro-batch-size", 1))
            gbs = int(fl.get("--global-batch-size", mbs * dp))
            nmc.destroy_num_microbatches_calculator()
            stage(rep, "num_microbatches_calculator", lambda: nmc.init_num_microbatches_calculator(
                0, None, gbs, mbs, dp))
            nmc.destroy_num_microbatches_calculator()
            if "--seq-length" in fl:
                toks = torch.zeros(mbs, int(fl["--seq-length"]), dtype=torch.int32)
                stage(rep, f"get_batch_on_this_cp_rank(tokens{list(toks.shape)})",
                       lambda: get_batch_on_this_cp_rank({"tokens": toks}))
    finally:
        with contextlib.suppress(Exception):
            ps.destroy_model_parallel()
        if tdist.is_initialized():
            tdist.destroy_process_group()
    return rep


if __name__ == "__main__":
    main(check)
