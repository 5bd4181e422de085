#!/usr/bin/env python3
"""What DeepSpeed ZeRO-3 allocates beyond the model's own tensors, under the ALST recipe's settings.

    .venv/bin/python calibrate/tracer/zero3_buffers.py --out FILE.json [--events EVENTS.json]

Runs two iterations (forward + backward + optimizer step) of a tiny Hugging Face LlamaForCausalLM
(bf16; Llama-3-8B with every width divided by 16: hidden 256, 32 layers, vocabulary 8016) under
`deepspeed.initialize` with ZeRO-3, parameter and optimizer offload to the CPU (what
ArcticTraining's run-h100-sp1-llama-8b-baseline.yml sets; its zero_optimization names no bucket or
threshold, so DeepSpeed's defaults hold, here divided by 256 like every weight matrix, so that
every buffer has its own size and meets the model where Llama-3-8B's does), HF gradient
checkpointing (reentrant),
on DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu), one process, gloo. Every allocation is
recorded with cpsim_tracer's AllocationRecorder and classified by its upstream frame; FILE.json is
a JSON list of the buffers found, each with its bytes in this run, its frames, the config value
that sizes it, its formula from source and that formula at Llama-3-8B (8,030,261,248 parameters,
bf16, one GPU, DeepSpeed's defaults); its last entry (`_run`) holds the run's settings and
observations. The second iteration is the steady state: DeepSpeed's parameter coordinator
prefetches and keeps parameters for reuse only once its module trace is complete.

On the CPU accelerator the host and the device are the same memory, so a host -> device `.to()`
that copies on a GPU returns its input unchanged here and allocates nothing. Two such calls sit on
ZeRO-3's path (read in deepspeed 0.19.8): the parameter fetch at world size 1
(partition_parameters.py NoGatherHandle/NoGatherCoalescedHandle: `param.ds_tensor.data.to(device)`)
and the gradient-partition staging copy in stage3.py partition_grads (`grad_buffer.to(
grad_partition.device)`, the host gradient partition copied back to the GPU). The script makes
exactly those two calls copy (a clone, what the GPU run allocates) and marks their records
`"emulated": true`; every other record is what the CPU run allocated. What the recorder cannot see:
memory that C++ code takes without an aten op (gloo's or NCCL's buffers, pinned-host staging), the
caching allocator's rounding and per-stream pools, and the CUDA context.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import linecache
import logging
import os
import socket
import sys
import warnings
from collections import OrderedDict, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# ---- the run's settings -----------------------------------------------------------------------

# Tiny Llama: Llama-3-8B shrunk by 16 in every width (hidden 4096 -> 256, FFN 14336 -> 896, head
# dim 128 -> 32, vocabulary 128256 -> 8016), the same 32 layers, heads and KV heads: every weight
# matrix is 256 times smaller, so the blocks, the lm_head and the embedding keep Llama-3-8B's
# ratios to each other and to the scaled bucket sizes below, and the gradient and fetch orders are
# the same module for module.
SCALE = 256
TINY = dict(
    vocab_size=8016,
    hidden_size=256,
    intermediate_size=896,
    num_hidden_layers=32,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
    rms_norm_eps=1e-5,
)
SEQ = 256

# Llama-3-8B (meta-llama/Llama-3.1-8B config): the parameter shapes the formulas are evaluated at.
LLAMA8B = dict(vocab=128256, hidden=4096, ffn=14336, layers=32, heads=32, kv_heads=8, head_dim=128)

# DeepSpeed's defaults (deepspeed/runtime/zero/config.py, 0.19.8; the same in 0.17.x), which the
# ALST recipe keeps: its zero_optimization sets only stage and the two offloads.
DS_DEFAULTS = OrderedDict(
    reduce_bucket_size=500_000_000,  # config.py:113
    stage3_prefetch_bucket_size=50_000_000,  # config.py:222
    stage3_param_persistence_threshold=100_000,  # config.py:228
    stage3_max_live_parameters=1_000_000_000,  # config.py:245
    stage3_max_reuse_distance=1_000_000_000,  # config.py:251
    sub_group_size=1_000_000_000,  # config.py:182
)
# The same values divided by SCALE (the element counts a matrix shrank by), so that each buffer
# has its own size and the tiny model meets them where Llama-3-8B does: the lm_head (2,052,096
# elements) is just above the reduce bucket (1,953,125), as Llama-3-8B's (525,336,576) is above
# 5e8; its forward + backward (4,104,192) passes the reuse distance (3,906,250), as 1.05e9 passes
# 1e9. Norm weights shrink by 16 only; they stay under the persistence threshold, as Llama's do.
# sub_group_size is kept (one sub-group here, 9 at Llama-3-8B: host memory only).
TINY_ZERO = OrderedDict(
    reduce_bucket_size=500_000_000 // SCALE,
    stage3_prefetch_bucket_size=50_000_000 // SCALE,
    stage3_param_persistence_threshold=100_000 // SCALE,
    stage3_max_live_parameters=1_000_000_000 // SCALE,
    stage3_max_reuse_distance=1_000_000_000 // SCALE,
    sub_group_size=1_000_000_000,
)
NORM_BUFFER = 250_000_000  # stage3.py:1960 _constant_buffered_norm2(buffer_size=250000000)


def ds_config(zero: dict) -> dict:
    """ArcticTraining's baseline recipe (run-h100-sp1-llama-8b-baseline.yml) as its trainer fills it
    in (arctic_training/config/trainer.py build_deepspeed_config @b28638e: micro batch 1, GAS 1,
    gradient_clipping 1.0, bf16 from the model dtype), with the bucket values written out."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 1,
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": True},
        "seq_parallel_communication_data_type": "bf16",
        # DeepSpeedCPUAdam needs its C++ op built (not done here): a torch AdamW on the host
        # partitions holds the same states (exp_avg, exp_avg_sq in fp32).
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
            **zero,
        },
    }


# ---- environment: must precede `import deepspeed` --------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_env() -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    os.environ["DS_BUILD_OPS"] = "0"
    warnings.filterwarnings("ignore")


# ---- host -> device copies that the CPU accelerator skips ------------------------------------

# (file, function, text on the line) of the `.to()` calls that copy host -> GPU in a GPU run with
# offload_param and offload_optimizer, and what they copy. Read in deepspeed 0.19.8.
EMULATED_TO = [
    (
        "deepspeed/runtime/zero/partition_parameters.py",
        "__init__",
        "ds_tensor.data.to(",
        "gathered_param",
    ),
    (
        "deepspeed/runtime/zero/stage3.py",
        "partition_grads",
        "grad_buffer.to(grad_partition.device",
        "grad_partition_gpu_copy",
    ),
]


def _rel(filename: str) -> str:
    marker = os.sep + "site-packages" + os.sep
    i = filename.rfind(marker)
    return filename[i + len(marker) :] if i >= 0 else filename


class Emulator:
    """Patches torch.Tensor.to so that the EMULATED_TO calls copy, as on a GPU."""

    def __init__(self, rec):
        import torch

        self.rec = rec
        self.torch = torch
        self.orig = torch.Tensor.to
        self.calls = defaultdict(int)
        self.gathered_ds_id = {}  # allocation id -> the parameter's ds_id

    def __enter__(self):
        orig, rec, calls = self.orig, self.rec, self.calls

        def to(t, *args, **kwargs):
            out = orig(t, *args, **kwargs)
            if out is not t:
                return out
            f = sys._getframe(1)
            rel = _rel(f.f_code.co_filename)
            for file, func, text, label in EMULATED_TO:
                if (
                    rel == file
                    and f.f_code.co_name == func
                    and text in linecache.getline(f.f_code.co_filename, f.f_lineno)
                ):
                    if label == "gathered_param":
                        param = f.f_locals.get("param")
                        if param is None or getattr(param, "ds_persist", False):
                            # persistent: stays on the GPU (partition_parameters.py:1829-1830)
                            return out
                    via = "other"
                    g = f
                    while g is not None:
                        if g.f_code.co_filename.endswith("partitioned_param_coordinator.py"):
                            # under the all-gather stream (partitioned_param_coordinator.py:606)
                            via = "coordinator"
                            break
                        g = g.f_back
                    calls[label + "@" + via] += 1
                    with rec.site("emulated:" + label):
                        copy = out.clone()
                    if label == "gathered_param" and rec.events and rec.events[-1].kind == "alloc":
                        self.gathered_ds_id[rec.events[-1].id] = f.f_locals["param"].ds_id
                    return copy
            return out

        self.torch.Tensor.to = to
        return self

    def __exit__(self, *exc):
        self.torch.Tensor.to = self.orig


# ---- the run ------------------------------------------------------------------------------------


def run(zero: dict):
    import torch

    logging.disable(logging.WARNING)
    import deepspeed
    import deepspeed.comm as dist
    import deepspeed.comm.torch  # noqa: F401

    ds_comm_torch = sys.modules[
        "deepspeed.comm.torch"
    ]  # (deepspeed.comm.torch is also the torch package)

    # The CPU accelerator JIT-compiles a shared-memory collective op (C++) when the process group
    # starts; one process needs none: gloo alone, and nothing is built.
    ds_comm_torch.build_shm_op = lambda: None

    def no_build(*a, **k):
        raise RuntimeError("zero3_buffers.py builds no C++ extension")

    import torch.utils.cpp_extension as cpp_extension
    from deepspeed.ops.op_builder.builder import OpBuilder

    cpp_extension.load = no_build
    OpBuilder.jit_load = no_build
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero import stage3 as s3
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from cpsim_tracer.recorder import AllocationRecorder

    hf_logging.set_verbosity_error()
    assert get_accelerator()._name == "cpu", get_accelerator()._name
    bf16 = get_accelerator().is_bf16_supported()
    dtype = torch.bfloat16 if bf16 else torch.float32
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = ds_config(zero)
    if not bf16:
        cfg["bf16"] = {"enabled": False}
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)

    rec = AllocationRecorder()
    bucket_log = []  # one entry per __reduce_and_partition_ipg_grads call that reduced something
    grad_order = []  # ds_id of each gradient as its hook fires

    Z3 = s3.DeepSpeedZeroOptimizer_Stage3
    orig_reduce = Z3._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads
    orig_ready = Z3.reduce_ready_partitions_and_remove_grads

    def reduce_wrapper(self, comm_dtype, *a, **k):
        bucket = self.ipg_buckets[comm_dtype]
        if bucket.params:
            bucket_log.append(
                dict(
                    ds_ids=[p.ds_id for p in bucket.params],
                    elements=int(bucket.elements),
                    contiguous=[
                        p.grad.data_ptr() >= bucket.buffer.data_ptr()
                        and p.grad.data_ptr()
                        < bucket.buffer.data_ptr()
                        + bucket.buffer.numel() * bucket.buffer.element_size()
                        for p in bucket.params
                    ],
                )
            )
        with rec.site("zero3.reduce_and_partition_ipg_grads"):
            return orig_reduce(self, comm_dtype, *a, **k)

    def ready_wrapper(self, param):
        grad_order.append(param.ds_id)
        return orig_ready(self, param)

    orig_rsc = s3.reduce_scatter_coalesced

    def rsc_wrapper(*a, **k):
        with rec.site("zero3.reduce_scatter_coalesced"):
            return orig_rsc(*a, **k)

    Z3._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads = reduce_wrapper
    Z3.reduce_ready_partitions_and_remove_grads = ready_wrapper
    s3.reduce_scatter_coalesced = rsc_wrapper

    gc.collect()
    gc.disable()  # frees happen by reference counting only: the same order every run
    try:
        with rec, Emulator(rec) as emu:
            rec.set_phase("model_init")
            with rec.site("zero.Init"):
                with deepspeed.zero.Init(config_dict_or_path=cfg, dtype=dtype):
                    config = LlamaConfig(**TINY, torch_dtype=dtype)
                    config._attn_implementation = "sdpa"
                    model = LlamaForCausalLM(config)
            # ArcticTraining's hf_factory.py: enable_input_require_grads, then HF gradient
            # checkpointing (transformers 4.51: reentrant).
            model.enable_input_require_grads()
            model.gradient_checkpointing_enable()
            model.train()
            names = {p.ds_id: n for n, p in model.named_parameters()}
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            rec.set_phase("ds_initialize")
            with rec.site("deepspeed.initialize"):
                engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
            with rec.site("driver.inputs"):
                g = torch.Generator().manual_seed(1)
                ids = torch.randint(0, TINY["vocab_size"], (1, SEQ), generator=g)
            # Two iterations: DeepSpeed's parameter coordinator records the module trace in the
            # first and prefetches (stage3_prefetch_bucket_size) and keeps parameters for reuse
            # (stage3_max_reuse_distance) only once the trace is complete, from the second.
            losses = []
            for it in (1, 2):
                rec.set_phase(f"forward#{it}")
                with rec.site("engine.forward"):
                    out = engine(input_ids=ids, labels=ids)
                loss = out.loss
                del out
                rec.set_phase(f"backward#{it}")
                with rec.site("engine.backward"):
                    engine.backward(loss)
                rec.set_phase(f"step#{it}")
                with rec.site("engine.step"):
                    engine.step()
                rec.set_phase(f"after_step#{it}")
                losses.append(float(loss.float()))
                del loss
            live_after = rec.live_bytes()
            opt = engine.optimizer
            info = dict(
                n_params=sum(p.ds_numel for p in model.parameters()),
                persistent_parameters=len(opt.persistent_parameters),
                persistent_are_norms=all(
                    names[p.ds_id].endswith("norm.weight") for p in opt.persistent_parameters
                ),
                comm_dtype=str(opt.communication_data_type).replace("torch.", ""),
                grad_accum_dtype=str(opt.gradient_accumulation_dtype).replace("torch.", ""),
                overlap_comm=bool(engine.zero_overlap_comm()),
                contiguous_gradients=bool(engine.zero_contiguous_gradients()),
                reduce_scatter=bool(engine.zero_reduce_scatter()),
                sub_groups=len(opt.fp16_groups),
                offload_optimizer=bool(opt.offload_optimizer),
                offload_param=bool(opt.offload_param),
                losses=losses,
                live_bytes_after_step=live_after,
                emulated_calls=dict(emu.calls),
                gathered_alloc_ds_id=dict(emu.gathered_ds_id),
                dtype=str(dtype).replace("torch.", ""),
            )
            shapes = {p.ds_id: tuple(p.ds_shape) for p in model.parameters()}
            rec.set_phase(
                "destroy"
            )  # engine.destroy() frees the ipg bucket: not counted as freed below
            engine.destroy()
    finally:
        gc.enable()
        Z3._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads = orig_reduce
        Z3.reduce_ready_partitions_and_remove_grads = orig_ready
        s3.reduce_scatter_coalesced = orig_rsc
    for b in bucket_log:
        b["params"] = [names[i] for i in b.pop("ds_ids")]
    n = len(names)
    assert len(grad_order) == 2 * n, (len(grad_order), n)
    info["gathered_alloc_param"] = {
        k: names[v] for k, v in info.pop("gathered_alloc_ds_id").items()
    }
    info["grad_order"] = [names[i] for i in grad_order[:n]]
    info["grad_order_same_in_both_iterations"] = grad_order[:n] == grad_order[n:]
    info["buckets"] = bucket_log
    info["param_shapes"] = {names[i]: list(s) for i, s in shapes.items()}
    dist.destroy_process_group()
    return rec, info


# ---- classification ---------------------------------------------------------------------------

# (file, function) of the frame -> buffer. The formulas and sizes are in BUFFERS below.
FRAME_RULES = [
    (
        "deepspeed/runtime/zero/stage3.py",
        "_setup_for_real_optimizer",
        "bucket.buffer = torch.empty",
        "ipg_reduce_bucket",
    ),
    (
        "deepspeed/runtime/zero/stage3.py",
        "_setup_for_real_optimizer",
        "grad_partitions_flat_buffer",
        "grad_partitions_flat_buffer",
    ),
    (
        "deepspeed/runtime/zero/stage3.py",
        "initialize_optimizer_states",
        "subgroup_gradient_buffer = torch.zeros",
        "fp32_grad_partition",
    ),
    (
        "deepspeed/runtime/zero/stage3.py",
        "initialize_optimizer_states",
        " gradient_buffer = torch.zeros",
        "init_gradient_buffer",
    ),
    ("deepspeed/runtime/zero/stage3.py", "_create_fp32_partitions", "", "fp32_master_partition"),
    (
        "deepspeed/runtime/zero/stage3.py",
        "_create_param_groups_fp16_flat_cpu_memory",
        "",
        "bf16_param_partitions_flat",
    ),
    ("deepspeed/runtime/zero/stage3.py", "__init__", "inf_or_nan_tracker", "inf_or_nan_tracker"),
    (
        "deepspeed/runtime/zero/partition_parameters.py",
        "wrapped_fn",
        "",
        "zero_init_param_construction",
    ),
    (
        "deepspeed/runtime/zero/partition_parameters.py",
        "_allgather_params_sequential",
        "",
        "init_param_gather",
    ),
    ("deepspeed/runtime/zero/linear.py", "forward", "", "model_linear"),
    ("deepspeed/runtime/zero/linear.py", "backward", "", "model_linear"),
    ("deepspeed/runtime/utils.py", "is_invalid_grad_norm", "", "grad_norm_scalars"),
    ("deepspeed/runtime/utils.py", "mask_nan_or_inf_with_val_inplace", "", "grad_norm_scalars"),
    ("deepspeed/runtime/utils.py", "combine_grad_norm_groups", "", "grad_norm_scalars"),
    ("deepspeed/runtime/zero/stage3.py", "unscale_and_clip_grads", "", "grad_norm_scalars"),
    ("deepspeed/runtime/zero/stage3.py", "step", "", "grad_norm_scalars"),
    ("deepspeed/comm/torch.py", "barrier", "", "comm_scalars"),
    ("deepspeed/runtime/zero/stage3.py", "_constant_buffered_norm2", "", "grad_norm_fp64"),
    (
        "deepspeed/runtime/zero/stage3.py",
        "_offload_grad_partition_at_boundary",
        "",
        "grad_partition_fp32_copy",
    ),
    (
        "deepspeed/runtime/zero/stage3.py",
        "complete_grad_norm_calculation_for_cpu_offload",
        "",
        "grad_norm_scalars",
    ),
]


def phase_of(ev: dict) -> str:
    return ev["phase"].split("#", 1)[0]


def classify(ev: dict) -> str:
    frame = ev["frame"]
    site = ev["site"]
    phase = phase_of(ev)
    if site.startswith("emulated:"):
        return site.split(":", 1)[1]
    if site == "zero3.reduce_scatter_coalesced" and ev["op"] == "cat":
        return "reduce_scatter_cat_copy"  # torch.cat under deepspeed/utils/nvtx.py's wrapper
    if site == "driver.inputs":
        return "driver_input"
    path, _, rest = frame.partition(":")
    lineno = int(rest.split(" ", 1)[0]) if rest[:1].isdigit() else 0
    func = rest[rest.find("(") + 1 : rest.rfind(")")] if "(" in rest else ""
    import deepspeed

    root = os.path.dirname(os.path.dirname(os.path.abspath(deepspeed.__file__)))
    text = linecache.getline(os.path.join(root, path), lineno) if lineno else ""
    for file, f, needle, name in FRAME_RULES:
        if path == file and func == f and needle in text:
            return name
    if path.startswith("deepspeed/runtime/zero/stage3.py") and phase == "step":
        return (
            "optimizer_step_host"  # torch AdamW states and temporaries on the host fp32 partitions
        )
    if path.startswith("transformers/"):
        return "model_activation" if phase in ("forward", "backward") else "model_other"
    if phase == "backward":
        return "autograd_backward"  # made by autograd's engine (activation and parameter gradients)
    return "other"


def pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def llama8b_params():
    """Llama-3-8B parameters in module order (the ds_id order), by the tiny model's names."""
    L = LLAMA8B
    h, f, hd = L["hidden"], L["ffn"], L["head_dim"]
    per_layer = OrderedDict(
        [
            ("self_attn.q_proj.weight", L["heads"] * hd * h),
            ("self_attn.k_proj.weight", L["kv_heads"] * hd * h),
            ("self_attn.v_proj.weight", L["kv_heads"] * hd * h),
            ("self_attn.o_proj.weight", h * L["heads"] * hd),
            ("mlp.gate_proj.weight", f * h),
            ("mlp.up_proj.weight", f * h),
            ("mlp.down_proj.weight", h * f),
            ("input_layernorm.weight", h),
            ("post_attention_layernorm.weight", h),
        ]
    )
    return L["vocab"] * h, per_layer, h, L["vocab"] * h


def llama_size(name: str) -> int:
    emb, per_layer, norm, head = llama8b_params()
    if name == "model.embed_tokens.weight":
        return emb
    if name == "lm_head.weight":
        return head
    if name == "model.norm.weight":
        return norm
    return per_layer[name.split(".", 3)[3]]


def llama_total() -> int:
    emb, per_layer, norm, head = llama8b_params()
    return emb + head + norm + LLAMA8B["layers"] * sum(per_layer.values())


def llama_grad_order(tiny_order: list[str]) -> list[str]:
    """The order the gradient hooks fired in the tiny run, with its layer pattern repeated over
    Llama-3-8B's 32 layers (the tiny model's first and last layers fix the ends)."""
    layers = TINY["num_hidden_layers"]
    head = [n for n in tiny_order if not n.startswith("model.layers.")][:2]  # lm_head, final norm
    tail = [n for n in tiny_order if not n.startswith("model.layers.")][2:]  # embedding
    per_layer = [
        n.split(".", 3)[3] for n in tiny_order if n.startswith(f"model.layers.{layers - 1}.")
    ]
    order = list(head)
    for i in reversed(range(LLAMA8B["layers"])):
        order += [f"model.layers.{i}.{n}" for n in per_layer]
    return order + tail


def simulate_buckets(order: list[str], size, bucket_size: int, reset_elements: bool):
    """stage3.py reduce_independent_p_g_buckets_and_remove_grads / __add_grad_to_ipg_bucket /
    __reduce_and_partition_ipg_grads (0.19.8: bucket.elements reset after each reduction; 0.17.2:
    never reset, PR #7418), then the epilogue. Returns the reductions: (params, elements)."""
    out, params, elements = [], [], 0
    for name in order:
        n = size(name)
        if elements + n > bucket_size and elements > 0:
            if params:
                out.append((list(params), sum(size(p) for p in params)))
            params = []
            if reset_elements:
                elements = 0
        params.append(name)
        elements += n
    if params:
        out.append((list(params), sum(size(p) for p in params)))
    return out


def cat_bytes(reductions, comm_bytes: int) -> list[int]:
    """coalesced_collectives.py:102-122: one tensor (numel % world == 0) is reduced in place, more
    are concatenated into a new buffer of their total size."""
    return [e * comm_bytes for params, e in reductions if len(params) > 1]


def staging_peak(n: int) -> int:
    """partition_grads on one parameter's n-element partition with offload_optimizer (stage3.py
    2023-2047 and 1443-1457, 1957-1964): the bf16 copy back to the GPU (2n) stays while the fp64
    norm runs chunk by chunk (8 min(n, 2.5e8)), then while the fp32 copy (4n) is made."""
    return 2 * n + max(8 * min(n, NORM_BUFFER), 4 * n)


BUFFERS = OrderedDict(
    [
        (
            "ipg_reduce_bucket",
            dict(
                where="GPU, allocated once at optimizer init, lives for the run",
                config="reduce_bucket_size",
                formula=(
                    "reduce_bucket_size x comm-dtype bytes (bf16: 2), one per communication dtype"
                ),
                source="deepspeed/runtime/zero/stage3.py:780-784 (0.19.8); 0.17.2 :557-561",
                what=(
                    "contiguous_gradients: each gradient that fits is copied into it; the bucket "
                    "is reduce-scattered when the next gradient would not fit"
                ),
            ),
        ),
        (
            "reduce_scatter_cat_copy",
            dict(
                where=(
                    "GPU, reduce_and_partition_stream (overlap_comm), transient per bucket "
                    "reduction"
                ),
                config="reduce_bucket_size",
                formula=(
                    "sum of the bucket's gradients' numel x 2 when the bucket holds more than one "
                    "tensor (<= reduce_bucket_size x 2); none for one tensor"
                ),
                source=(
                    "deepspeed/runtime/comm/coalesced_collectives.py:102-122 (torch.cat of the "
                    "interleaved partitions)"
                ),
                what=(
                    "reduce_scatter_coalesced flattens the bucket's gradients into a new buffer "
                    "even at world size 1"
                ),
            ),
        ),
        (
            "grad_partition_gpu_copy",
            dict(
                where="GPU, reduce_and_partition_stream, transient per parameter",
                config="(parameter size)",
                formula="2 n for an n-element gradient partition (n = numel / world)",
                source=(
                    "deepspeed/runtime/zero/stage3.py:2023-2028 partition_grads "
                    "(grad_buffer.to(grad_partition.device)); 0.17.2 :1490-1496"
                ),
                what=(
                    "the host bf16 gradient partition copied back to the GPU (offload_optimizer) "
                    "for the norm and fp32 cast"
                ),
            ),
        ),
        (
            "grad_norm_fp64",
            dict(
                where=(
                    "GPU, reduce_and_partition_stream, transient per parameter (chunk) + one "
                    "8-byte norm per parameter kept to the step"
                ),
                config="(250,000,000-element chunk, hard-coded)",
                formula=(
                    "8 x min(n, 2.5e8) per chunk (fp64 copy of the gradient chunk), plus 8-byte "
                    "scalars"
                ),
                source=(
                    "deepspeed/runtime/zero/stage3.py:1446, 1960-1967 _constant_buffered_norm2 "
                    "(get_norm_dtype() = fp64 where supported, zero/utils.py:59-63); 0.17.2 "
                    ":1430-1437 (.double())"
                ),
                what="per-parameter gradient norm for gradient clipping with offload_optimizer",
            ),
        ),
        (
            "grad_partition_fp32_copy",
            dict(
                where="GPU, reduce_and_partition_stream, transient per parameter",
                config="(parameter size)",
                formula="4 n",
                source=(
                    "deepspeed/runtime/zero/stage3.py:1456-1457 "
                    "_offload_grad_partition_at_boundary (grad_buffer.to(fp32)); 0.17.2 :1526 "
                    "(.float())"
                ),
                what=(
                    "fp32 cast of the gradient partition before its copy into the host fp32 "
                    "gradient"
                ),
            ),
        ),
        (
            "gathered_param",
            dict(
                where="GPU, allgather stream (overlap_comm), per fetched module",
                config=(
                    "stage3_prefetch_bucket_size / stage3_max_live_parameters / "
                    "stage3_max_reuse_distance (how many at once)"
                ),
                formula=(
                    "numel x 2 per gathered parameter (world size 1: a host -> GPU copy of the "
                    "partition)"
                ),
                source=(
                    "deepspeed/runtime/zero/partition_parameters.py:1559-1560 (world size 1) -> "
                    "904-914, 61-75, 89-106 (NoGather handles: ds_tensor.to(device)); "
                    "partitioned_param_coordinator.py:606 (under the all-gather stream, "
                    "parameter_offload.py:195-196)"
                ),
                what=(
                    "the model's parameters, gathered: a model tensor (cpsim param_gather), listed "
                    "for completeness"
                ),
            ),
        ),
        (
            "bf16_param_partitions_flat",
            dict(
                where="host (offload_param), lives for the run",
                config="(all trainable parameters)",
                formula="P x 2",
                source="deepspeed/runtime/zero/stage3.py:906-907",
                what="the flat bf16 parameter partitions in host memory",
            ),
        ),
        (
            "fp32_master_partition",
            dict(
                where=(
                    "host (offload_optimizer), lives for the run; the .to() copy before clone() is "
                    "transient"
                ),
                config="sub_group_size",
                formula="P x 4 (+ P x 4 transient per sub-group at init)",
                source="deepspeed/runtime/zero/stage3.py:1157-1160",
                what="fp32 master weights",
            ),
        ),
        (
            "fp32_grad_partition",
            dict(
                where="host (offload_optimizer), lives for the run",
                config="sub_group_size",
                formula="P x 4",
                source="deepspeed/runtime/zero/stage3.py:1337-1342",
                what="fp32 gradients the CPU optimizer reads",
            ),
        ),
        (
            "init_gradient_buffer",
            dict(
                where="host (self.device = cpu with offload_optimizer), transient at init",
                config="sub_group_size",
                formula="largest sub-group numel x 4",
                source="deepspeed/runtime/zero/stage3.py:1304-1306",
                what=(
                    "unused with offload_optimizer, freed when initialize_optimizer_states returns"
                ),
            ),
        ),
        (
            "grad_partitions_flat_buffer",
            dict(
                where="host (offload_optimizer), lives for the run",
                config="(all trainable parameters)",
                formula="P x 2 (gradient_accumulation_dtype = bf16)",
                source="deepspeed/runtime/zero/stage3.py:791-795",
                what="the reduced bf16 gradient partitions",
            ),
        ),
        (
            "inf_or_nan_tracker",
            dict(
                where="host with offload_optimizer (self.device)",
                config="-",
                formula="1 byte",
                source="deepspeed/runtime/zero/stage3.py:335",
                what="overflow flag (checked only with fp16)",
            ),
        ),
        (
            "grad_norm_scalars",
            dict(
                where="GPU, step",
                config="-",
                formula="a few 4-8 byte scalars",
                source=(
                    "deepspeed/runtime/zero/stage3.py:1975-2003, 2978-2988; "
                    "deepspeed/runtime/utils.py:884-906"
                ),
                what="global norm reduction and clipping (scalars)",
            ),
        ),
        (
            "zero_init_param_construction",
            dict(
                where=(
                    "zero.Init: each parameter made whole, initialised, then partitioned (host "
                    "with offload_param); transient at model construction"
                ),
                config="-",
                formula="numel x 4 or 2 per parameter, one at a time",
                source=(
                    "deepspeed/runtime/zero/partition_parameters.py:254-290 (wrapped "
                    "torch.empty/zeros/ones), _partition_param"
                ),
                what="model construction under zero.Init, before training",
            ),
        ),
        (
            "init_param_gather",
            dict(
                where="GPU, transient at deepspeed.initialize, one parameter at a time",
                config="-",
                formula="numel x 2 (the largest: lm_head/embedding)",
                source=(
                    "deepspeed/runtime/zero/stage3.py:1504 param.all_gather() -> "
                    "partition_parameters.py:2142 _allgather_params_sequential"
                ),
                what=(
                    "each parameter gathered once while the gradient hooks are registered, then "
                    "partitioned again"
                ),
            ),
        ),
        (
            "model_linear",
            dict(
                where="GPU",
                config="-",
                formula="the model's Linear outputs and gradients",
                source=(
                    "deepspeed/runtime/zero/linear.py:83-135 (zero.Init replaces F.linear: "
                    "LinearFunctionForZeroStage3)"
                ),
                what=(
                    "model tensors (activations, activation and weight gradients) made by ZeRO-3's "
                    "Linear autograd function"
                ),
            ),
        ),
        (
            "autograd_backward",
            dict(
                where="GPU",
                config="-",
                formula="-",
                source="autograd's engine under deepspeed/runtime/engine.py backward",
                what=(
                    "model tensors: activation gradients, saved-tensor recomputation and parameter "
                    "gradients made by autograd"
                ),
            ),
        ),
        (
            "model_activation",
            dict(
                where="GPU",
                config="-",
                formula="-",
                source="transformers/models/llama, transformers/loss",
                what="model tensors: the Hugging Face model's and loss's own",
            ),
        ),
        (
            "comm_scalars",
            dict(
                where="GPU",
                config="-",
                formula="1 byte each",
                source="deepspeed/comm/torch.py:519",
                what="barrier tensors",
            ),
        ),
        (
            "driver_input",
            dict(where="-", config="-", formula="-", source="this script", what="input ids"),
        ),
        (
            "optimizer_step_host",
            dict(
                where="host (offload_optimizer)",
                config="-",
                formula=(
                    "AdamW exp_avg + exp_avg_sq: P x 8 (torch AdamW here, DeepSpeedCPUAdam in the "
                    "recipe)"
                ),
                source="torch/optim/adamw.py via deepspeed/runtime/zero/stage3.py _optimizer_step",
                what="optimizer states and the step's temporaries",
            ),
        ),
    ]
)


def llama8b_numbers(info: dict) -> dict:
    """Each ZeRO-3 buffer at Llama-3-8B, one GPU, DeepSpeed's defaults, bf16."""
    P = llama_total()
    R = DS_DEFAULTS["reduce_bucket_size"]
    order = llama_grad_order(info["grad_order"])
    assert sorted(order) == sorted(
        ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
        + [f"model.layers.{i}.{n}" for i in range(LLAMA8B["layers"]) for n in llama8b_params()[1]]
    ), "order"
    fixed = simulate_buckets(order, llama_size, R, reset_elements=True)
    buggy = simulate_buckets(order, llama_size, R, reset_elements=False)
    largest = max(llama_size(n) for n in order)
    largest_block = max(llama_size(n) for n in order if n.startswith("model.layers."))
    cats = cat_bytes(fixed, 2)
    # A bucket's gradient partitions are views of its cat buffer while partition_grads stages each.
    bucket_peaks = []
    for params, e in fixed:
        cat = e * 2 if len(params) > 1 else 0
        bucket_peaks.append(cat + max(staging_peak(llama_size(p)) for p in params))
    persistent = [
        n for n in order if llama_size(n) <= DS_DEFAULTS["stage3_param_persistence_threshold"]
    ]
    sub_groups = -(-P // DS_DEFAULTS["sub_group_size"])
    return dict(
        parameters=P,
        ipg_reduce_bucket=R * 2,
        reduce_scatter_cat_copy_max=max(cats) if cats else 0,
        reduce_scatter_cat_copies=len(cats),
        reductions_fixed=len(fixed),
        reductions_v0_17_2=len(buggy),
        reductions_v0_17_2_multi_tensor=sum(1 for p, _ in buggy if len(p) > 1),
        first_reductions=[dict(params=p, elements=e) for p, e in fixed[:3]],
        staging_peak_largest_param=staging_peak(largest),
        staging_largest_param_numel=largest,
        staging_peak_largest_block_param=staging_peak(largest_block),
        reduce_stream_peak_fixed=max(bucket_peaks),
        reduce_stream_peak_v0_17_2=max(staging_peak(llama_size(n)) for n in order),
        persistent_params=len(persistent),
        persistent_param_bytes=2 * sum(llama_size(n) for n in persistent),
        host=dict(
            bf16_param_partitions_flat=2 * P,
            fp32_master_partition=4 * P,
            fp32_grad_partition=4 * P,
            adam_states=8 * P,
            grad_partitions_flat_buffer=2 * P,
            sub_groups=sub_groups,
        ),
    )


def summarize(rec, info) -> list[dict]:
    events = [e.to_json() for e in rec.events]
    frees = {e["id"]: e for e in events if e["event"] == "free"}
    groups: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        if e["event"] != "alloc":
            continue
        e["buffer"] = classify(e)
        f = frees.get(e["id"])
        e["freed_in"] = f["phase"] if f else None
        groups[e["buffer"]].append(e)
    z = TINY_ZERO
    P = info["n_params"]
    shapes = info["param_shapes"]
    numel = {n: 1 for n in shapes}
    for n, s in shapes.items():
        for d in s:
            numel[n] *= d
    largest = max(numel.values())
    order = info["grad_order"]
    fixed = simulate_buckets(order, numel.__getitem__, z["reduce_bucket_size"], reset_elements=True)
    expected = dict(
        ipg_reduce_bucket=z["reduce_bucket_size"] * 2,
        reduce_scatter_cat_copy=max(cat_bytes(fixed, 2), default=0),
        grad_partition_gpu_copy=2 * largest,
        grad_norm_fp64=8 * min(largest, NORM_BUFFER),
        grad_partition_fp32_copy=4 * largest,
        gathered_param=2 * largest,
        bf16_param_partitions_flat=2 * P,
        fp32_master_partition=4 * P,
        fp32_grad_partition=4 * P,
        init_gradient_buffer=4 * P,  # one sub-group here
        grad_partitions_flat_buffer=2 * P,
        inf_or_nan_tracker=1,
    )
    llama = llama8b_numbers(info)
    llama_by_buffer = dict(
        ipg_reduce_bucket=llama["ipg_reduce_bucket"],
        reduce_scatter_cat_copy=llama["reduce_scatter_cat_copy_max"],
        grad_partition_gpu_copy=2 * llama["staging_largest_param_numel"],
        grad_norm_fp64=8 * min(llama["staging_largest_param_numel"], NORM_BUFFER),
        grad_partition_fp32_copy=4 * llama["staging_largest_param_numel"],
        gathered_param=2 * llama["staging_largest_param_numel"],
        bf16_param_partitions_flat=llama["host"]["bf16_param_partitions_flat"],
        fp32_master_partition=llama["host"]["fp32_master_partition"],
        fp32_grad_partition=llama["host"]["fp32_grad_partition"],
        grad_partitions_flat_buffer=llama["host"]["grad_partitions_flat_buffer"],
        optimizer_step_host=llama["host"]["adam_states"],
        inf_or_nan_tracker=1,
    )
    # Concurrency, from the event order: the reduce-side transients live together (one reduction
    # at a time; on a GPU they all sit on the reduce_and_partition_stream's pool).
    reduce_side = (
        "reduce_scatter_cat_copy",
        "grad_partition_gpu_copy",
        "grad_norm_fp64",
        "grad_partition_fp32_copy",
    )
    live, peaks, by_iter = {}, defaultdict(int), defaultdict(int)
    cls = {e["id"]: e["buffer"] for e in events if e["event"] == "alloc"}
    for e in events:
        b = cls.get(e["id"])
        if b is None:
            continue
        group = "reduce_side" if b in reduce_side else b
        if e["event"] == "alloc":
            live[e["id"]] = (group, e["bytes"])
        else:
            live.pop(e["id"], None)
        now = sum(v for g, v in live.values() if g == group)
        peaks[group] = max(peaks[group], now)
        it = e["phase"].partition("#")[2] or "init"
        by_iter[group + "#" + it] = max(by_iter[group + "#" + it], now)
    # The gathered parameters live at once, as Llama-3-8B's: each tiny weight matrix stands for
    # the Llama-3-8B one 256 times larger (the norms are persistent, never gathered).
    to_llama = {}
    for n, k in numel.items():
        if not n.endswith("norm.weight"):
            to_llama[k] = llama_size(n)
    gathered_live, gathered_best, at_loss_bwd = {}, (0, {}), None
    for e in events:
        b = cls.get(e["id"])
        if (
            e["event"] == "alloc"
            and e["op"] == "_log_softmax_backward_data"
            and e["phase"] == "backward#2"
        ):
            at_loss_bwd = dict(gathered_live)
        if b != "gathered_param":
            continue
        if e["event"] == "alloc":
            gathered_live[e["id"]] = (e["bytes"] // 2, e["phase"])
        else:
            gathered_live.pop(e["id"], None)
        total = sum(v[0] for v in gathered_live.values())
        if e["phase"].endswith("#2") and total > gathered_best[0]:
            gathered_best = (total, dict(gathered_live), e["phase"])

    param_of = info["gathered_alloc_param"]

    def llama_gathered(live):
        names = sorted((param_of[i] for i in live), key=lambda n: (n.split(".")[:3], n))
        return dict(
            tiny_bytes=2 * sum(k for k, _ in live.values()),
            llama3_8b_bytes=2 * sum(llama_size(n) for n in names),
            params=names,
        )

    gathered_peak_iter2 = dict(phase=gathered_best[2], **llama_gathered(gathered_best[1]))
    gathered_at_loss_bwd = llama_gathered(at_loss_bwd or {})
    tiny_reduce_peak = max(
        (2 * e if len(p) > 1 else 0) + max(staging_peak(numel[q]) for q in p) for p, e in fixed
    )
    config_value = dict(TINY_ZERO)
    out = []
    for name in list(BUFFERS) + sorted(set(groups) - set(BUFFERS)):
        evs = groups.get(name, [])
        meta = BUFFERS.get(name, dict(where="-", config="-", formula="-", source="-", what=name))
        frames = sorted({e["frame"] for e in evs})
        entry = OrderedDict(
            buffer=name,
            found=bool(evs),
            emulated=bool(evs) and all(e["site"].startswith("emulated:") for e in evs),
            count=len(evs),
            bytes_max=max((e["bytes"] for e in evs), default=0),
            bytes_total=sum(e["bytes"] for e in evs),
            dtypes=sorted({e["dtype"] for e in evs}),
            phases=sorted({e["phase"] for e in evs}),
            # (the phase a transient dies in is not reported: where a set of parameters is iterated
            # in address order, one init-time free lands in ds_initialize or in the first forward)
            freed_before_end=sum(1 for e in evs if e["freed_in"] not in (None, "destroy")),
            live_at_end=sum(1 for e in evs if e["freed_in"] in (None, "destroy")),
            frames=frames[:12] + ([f"... {len(frames) - 12} more"] if len(frames) > 12 else []),
            ops=sorted({e["op"] for e in evs}),
            config_key=meta["config"],
            config_value=config_value.get(meta["config"]),
            formula=meta["formula"],
            source=meta["source"],
            where_in_gpu_run=meta["where"],
            what=meta["what"],
        )
        if name in expected:
            entry["formula_bytes_tiny"] = expected[name]
            entry["formula_matches_run"] = expected[name] == entry["bytes_max"]
        if name in llama_by_buffer:
            entry["llama3_8b_bytes"] = llama_by_buffer[name]
        out.append(entry)
    out.append(
        OrderedDict(
            buffer="reduce_side_transient_peak",
            found=True,
            emulated=False,
            bytes_max=peaks["reduce_side"],
            bytes_by_iteration={
                k.split("#")[1]: v
                for k, v in sorted(by_iter.items())
                if k.startswith("reduce_side#")
            },
            formula=(
                "max over reductions of [cat copy (if > 1 tensor) + max over its parameters of 2n "
                "+ max(8 min(n, 2.5e8), 4n)] + 8 bytes per parameter (its fp64 norm, held to the "
                "step)"
            ),
            formula_bytes_tiny=tiny_reduce_peak + 8 * len(numel),
            formula_matches_run=tiny_reduce_peak + 8 * len(numel) == peaks["reduce_side"],
            llama3_8b_bytes=llama["reduce_stream_peak_fixed"] + 8 * 291,
            config_key="reduce_bucket_size",
            config_value=TINY_ZERO["reduce_bucket_size"],
            where_in_gpu_run=(
                "GPU, reduce_and_partition_stream (overlap_comm): a per-stream pool the default "
                "stream cannot reuse"
            ),
            what=(
                "the most reduce-side transients (cat copy, GPU copy, fp64 norm chunk, fp32 copy) "
                "live at once; at Llama-3-8B the lm_head's and the embedding's reductions"
            ),
            source=(
                "deepspeed/runtime/zero/stage3.py:340-341 (the stream), 1583-1585, 1648-1689, "
                "2006-2054, 1443-1457, 1960-1967; comm/coalesced_collectives.py:102-122"
            ),
        )
    )
    out.append(
        OrderedDict(
            buffer="gathered_param_peak",
            found=True,
            emulated=True,
            bytes_max=peaks["gathered_param"],
            bytes_by_iteration={
                k.split("#")[1]: v
                for k, v in sorted(by_iter.items())
                if k.startswith("gathered_param#")
            },
            steady_state_peak=gathered_peak_iter2,
            at_loss_backward_iteration2=gathered_at_loss_bwd,
            formula=(
                "the parameters gathered at once (stage3_prefetch_bucket_size, max_reuse_distance)"
            ),
            config_key="stage3_prefetch_bucket_size",
            config_value=TINY_ZERO["stage3_prefetch_bucket_size"],
            llama3_8b_bytes=gathered_peak_iter2["llama3_8b_bytes"],
            where_in_gpu_run="GPU, the all-gather stream (overlap_comm): its own pool",
            what=(
                "model parameters gathered at once: cpsim's param_gather category; llama3_8b_bytes "
                "maps each tiny matrix live at the iteration-2 peak to its Llama-3-8B size"
            ),
            source=(
                "deepspeed/runtime/zero/partitioned_param_coordinator.py:450-475 (prefetch; "
                "AVAILABLE parameters passed in the queue are marked, 470-472), 634-664 "
                "(__params_to_release: marked ones and those reused within max_reuse_distance stay)"
            ),
        )
    )
    out.append(
        OrderedDict(
            buffer="_run",
            found=True,
            note="the run's settings and what it observed (not a buffer)",
            tiny_model=TINY,
            seq=SEQ,
            zero_optimization=dict(TINY_ZERO),
            deepspeed_defaults=dict(DS_DEFAULTS),
            info={
                k: v for k, v in info.items() if k not in ("param_shapes", "gathered_alloc_param")
            },
            llama3_8b=llama,
        )
    )
    return out, events


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON list of the buffers found ('-': stdout)")
    parser.add_argument("--events", help="also write every recorded event here")
    args = parser.parse_args(argv)
    setup_env()
    with contextlib.redirect_stdout(sys.stderr):
        rec, info = run(TINY_ZERO)
        buffers, events = summarize(rec, info)
    text = json.dumps(buffers, indent=1) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w") as f:
            f.write(text)
    if args.events:
        with open(args.events, "w") as f:
            json.dump(events, f, indent=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
