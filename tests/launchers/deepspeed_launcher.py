"""Run a cpsim ds_config (and its Megatron-DeepSpeed flags) through DeepSpeed's own code, on CPU.

DeepSpeedConfig reads the JSON on a "fake" torch.distributed group of the emitted world size, with
the mpu its consumer passes: Megatron-DeepSpeed's (dp = world / tp*pp*sp) when a *.megatron-
deepspeed.sh sits beside the JSON, else DeepSpeed's parallel_state_sp (ALST / HF Ulysses). With
--ds-sequence-parallel-fpdt, deepspeed/sequence/fpdt_layer.py runs forward/backward at a tiny shape
on a one-rank gloo group with the weights and biases Megatron-DeepSpeed builds for the flags; steps
that need CUDA (streams, flash-attn) are reported as not runnable on CPU. Nothing is monkeypatched.
usage: deepspeed_launcher.py ds_config.json --gpus N [--flags X.megatron-deepspeed.sh]
"""
import contextlib
import functools
import importlib.metadata as md
import inspect
import os
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import launcher_check
from launcher_check import bash_array_flags, main, new_report

# the launcher's innermost frame names where it raised
stage = functools.partial(launcher_check.stage, frames="/deepspeed/")


def _fpdt_cpu_limit(e, line):
    from deepspeed.accelerator import get_accelerator
    from deepspeed.sequence import fpdt_layer
    if fpdt_layer._flash_attn_forward is None and (
            (isinstance(e, ImportError) and "flash-attn" in str(e))
            or (isinstance(e, NameError) and "flash_attn" in str(e))):
        return "reached flash-attn, which is not installed: a CUDA-only package"
    if isinstance(e, TypeError) and "Stream()" in line and get_accelerator().Stream is None:
        return "the CPU accelerator has no streams: get_accelerator().Stream is None"
    return None


def _run_fpdt(rep, fl):
    import torch
    from deepspeed.sequence import fpdt_layer as F
    sp, bias = int(fl.get("--ds-sequence-parallel-size", 1)), "--disable-bias-linear" not in fl
    nh, seq = int(fl["--num-attention-heads"]), int(fl["--seq-length"])
    nkv, chunk = int(fl.get("--num-key-value-heads", nh)), int(
        fl.get("--ds-sequence-parallel-fpdt-chunk-size", 65536))
    local, n_attn, ffn_chunk = seq // sp, seq // chunk, chunk // sp // 2
    rep["notes"].append(
        f"full shape, by FPDT's own formulas: {local} local tokens, {n_attn} attention chunks"
        f" (remainder {local % max(n_attn, 1)}), FFN chunk {ffn_chunk} (remainder"
        f" {local % max(ffn_chunk, 1)}); heads % sp = {nh % sp}, kv heads % sp = {nkv % sp}")
    if min(n_attn, ffn_chunk) < 1 or local % n_attn or local % ffn_chunk or nh % sp:
        rep["ok"] = False
        rep["error"] = rep["error"] or "FPDT chunking does not divide the full shape (see notes)"
    src = inspect.getsource(F).splitlines()
    pat = re.compile(r"\+ (qkv_linear_bias|b1)\b|(qkv_linear_bias|b1|b2)\.shape|bias_gelu\(")
    rep["notes"].append("fpdt_layer.py lines using the biases or GELU: " + "; ".join(
        f"{i}: {s.strip()[:72]}" for i, s in enumerate(src, 1) if pat.search(s)))
    # tiny shape: same GQA ratio and bias / swiglu / rope settings, sequence-parallel world size 1
    dt = torch.bfloat16 if "--bf16" in fl else torch.float16 if "--fp16" in fl else torch.float32
    kvt, d, h, ffn, toks, c = 2, 8, 32, 48, 8, 4
    nht, glu = kvt * max(nh // nkv, 1), "--swiglu" in fl
    spg = torch.distributed.new_group([0])
    torch.manual_seed(0)

    def par(*shape):
        return torch.nn.Parameter(torch.randn(*shape, dtype=dt) * 0.05)
    # Megatron-DeepSpeed's launch_chunk_attention: biases only with add_bias_linear
    qkv_w, dense_w = par(nht * d + 2 * kvt * d, h), par(h, nht * d)
    qkv_b, dense_b = (par(nht * d + 2 * kvt * d), par(h)) if bias else (None, None)
    cfg = SimpleNamespace(kv_channels=d, num_attention_heads=nht, num_key_value_heads=kvt,
                          hidden_size=h, attention_dropout=0.0)
    gather = 1 if ("--use-flash-attn-v2" in fl or "--use-flash-attn-v1" in fl) else 0
    offload = "--ds-sequence-parallel-fpdt-offloading" in fl
    stage(rep, "FPDT_Attention.__init__", lambda: F.FPDT_Attention(
        cfg, qkv_w, qkv_b, dense_w, dense_b, spg, gather_idx=gather, return_bias=True,
        chunk_size=c, enable_offloading=offload), cpu_limit=_fpdt_cpu_limit)
    rope = None
    if "--use-rotary-position-embeddings" in fl:
        theta = float(fl.get("--rotary-position-embeddings-theta", 10000))
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        emb = torch.cat([torch.outer(torch.arange(toks, dtype=torch.float32), inv)] * 2, -1)
        rope = (emb.cos()[:, None, None].to(dt), emb.sin()[:, None, None].to(dt))
    x = torch.randn(toks, 1, h, dtype=dt, requires_grad=True)
    n_t = toks * torch.distributed.get_world_size(spg) // c  # as FPDT_Attention.forward counts

    def attn(impl):  # FPDT_Attention.forward's call, with the layer's norm output stood in by x*1
        return lambda: impl.apply(x * 1.0, None, None, rope, spg, 2, gather, h, nht * d, d,
                                  kvt * d, qkv_w, qkv_b, 0.0, n_t, offload)
    impls = [F._FPDTGPUAttentionImpl_]
    if offload and n_t > 1:  # the path FPDT_Attention.forward takes for these flags
        impls.insert(0, F._FPDTGPUOffloadingAttentionImpl_)
    for impl in impls:  # on "could not run on CPU", fall back to the stream-free forward
        out = stage(rep, f"{impl.__name__}.forward", attn(impl), cpu_limit=_fpdt_cpu_limit)
        if out is not None:
            stage(rep, f"{impl.__name__}.backward", out.float().sum().backward,
                  cpu_limit=_fpdt_cpu_limit)
        if "could not run on CPU" not in rep["stages_run"][-1]:
            break
    # the MLP as Megatron-DeepSpeed's ParallelMLP hands it to FPDT_FFN (w1 is [2*ffn, h] for swiglu)
    w1, w2 = par(ffn * (2 if glu else 1), h), par(h, ffn)
    b1, b2 = (par(w1.shape[0]), par(h)) if bias else (None, None)
    ffn_c = c // torch.distributed.get_world_size(spg) // 2

    def ffn_run(b1_, b2_, add):
        out, _ = F.FPDT_FFN.apply(x * 1.0, w1, b1_, w2, b2_, add, ffn_c)
        out.float().sum().backward()
    stage(rep, "FPDT_FFN forward+backward", lambda: ffn_run(b1, b2, bias))
    if glu and not bias:  # would --swiglu run once biases exist?
        stage(rep, "FPDT_FFN with --swiglu, biases supplied (probe)",
               lambda: ffn_run(par(w1.shape[0]), par(h), True))


def check(path: str, gpus: int, flags: str = None) -> dict:
    rep = new_report()
    for pkg in ("deepspeed", "torch", "flash-attn"):
        with contextlib.suppress(md.PackageNotFoundError):
            rep["versions"][pkg] = None
            rep["versions"][pkg] = md.version(pkg)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import hjson
    import torch.distributed as tdist
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys as nodup
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as psp
    cfg = stage(rep, "load JSON (DeepSpeed's hjson loader)", lambda: hjson.loads(
        Path(path).read_text(), object_pairs_hook=nodup))
    flags_path = flags or re.sub(r"\.[^./]*$", "", path) + ".megatron-deepspeed.sh"
    fl = bash_array_flags(flags_path) if os.path.exists(flags_path) else None
    rep["notes"].append(f"Megatron-DeepSpeed flags: {flags_path if fl else 'none found'}")
    if cfg is None:
        return rep
    tdist.init_process_group("fake", rank=0, world_size=gpus)
    try:
        dist.init_distributed(dist_backend="fake", auto_mpi_discovery=False, verbose=False)
        mpu, sp = None, int(cfg.get("sequence_parallel_size", 1))
        if fl:  # Megatron-DeepSpeed: deepspeed.initialize(mpu=mpu, config=<dict>)
            tp = int(fl.get("--tensor-model-parallel-size", 1))
            pp = 1 if "--no-pipeline-parallel" in fl else int(
                fl.get("--pipeline-model-parallel-size", 1))
            sp = int(fl.get("--ds-sequence-parallel-size", 1))
            if gpus % (tp * pp * sp):
                rep["notes"].append(f"{gpus} GPUs not divisible by tp*pp*sp = {tp * pp * sp}")
            mpu = SimpleNamespace(  # what DeepSpeed reads of Megatron-DeepSpeed's parallel_state
                get_data_parallel_world_size=lambda: gpus // (tp * pp * sp),
                get_sequence_parallel_world_size=lambda: sp,
                get_tensor_model_parallel_rank=lambda: 0,
                get_tensor_model_parallel_world_size=lambda: tp,
                get_tensor_model_parallel_group=lambda: None)
        elif sp > 1:  # ALST / HF / accelerate: the mpu is DeepSpeed's parallel_state_sp
            psp._release_sequence_parallel_groups()
            mpu = stage(rep, "parallel_state_sp.initialize_sequence_parallel",
                         lambda: (psp.initialize_sequence_parallel(sp), psp)[1])
        ds = stage(rep, "DeepSpeedConfig", lambda: DeepSpeedConfig(cfg, mpu=mpu))
        if ds is not None:
            rep["notes"].append(
                f"DeepSpeedConfig: world_size {ds.world_size}, train_batch_size "
                f"{ds.train_batch_size}, micro {ds.train_micro_batch_size_per_gpu}, zero stage "
                f"{ds.zero_optimization_stage}")
        if fl and "--deepspeed-activation-checkpointing" in fl:  # Megatron-DeepSpeed's call
            stage(rep, "deepspeed.checkpointing.configure", lambda: deepspeed.checkpointing.
                   configure(mpu, partition_activations="--partition-activations" in fl,
                             contiguous_checkpointing="--contigious-checkpointing" in fl,
                             num_checkpoints=int(fl["--num-layers"]),
                             checkpoint_in_cpu="--checkpoint-in-cpu" in fl))
        for flag, val in [("--zero-stage", cfg.get("zero_optimization", {}).get("stage")),
                          ("--ds-sequence-parallel-size", cfg.get("sequence_parallel_size")),
                          ("--micro-batch-size", cfg.get("train_micro_batch_size_per_gpu")),
                          ("--deepspeed_config", os.path.basename(path))]:
            if fl and flag in fl and val is not None and Path(str(fl[flag])).name != str(val):
                rep["notes"].append(f"mismatch: {flag} {fl[flag]} vs ds_config {val}")
        if fl and "--ds-sequence-parallel-fpdt" in fl:
            tdist.destroy_process_group()
            store = tdist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
            tdist.init_process_group("gloo", store=store, rank=0, world_size=1)
            _run_fpdt(rep, fl)
    finally:
        psp._release_sequence_parallel_groups()
        if tdist.is_initialized():
            tdist.destroy_process_group()
    return rep


if __name__ == "__main__":
    main(check, ("--flags", "*.megatron-deepspeed.sh (default: beside path)"))
