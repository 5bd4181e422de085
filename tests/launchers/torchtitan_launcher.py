"""Run a cpsim-emitted TorchTitan config module through TorchTitan 0.3.0's own code on the CPU.

check(path, gpus) repeats what `torchtitan.train` does with the file before it touches a GPU:
ConfigManager.parse_args (calls the config function; tyro rebuilds the dataclasses, so their
__post_init__ checks run), ParallelDims.from_config plus the device mesh on TorchTitan's own fake
process group (its comm.mode="fake_backend" dry run), Trainer.__init__'s sequence-length check,
the model config's update_from_config, the meta-device build and parameter count. Then it shards
the real-length input with TorchTitan's cp_shard, and runs one shrunk transformer block of the
emitted class through the emitted activation checkpointing on the CPU.
usage: torchtitan_launcher.py FILE --gpus N   (prints a JSON report; exit 0 accepted, 1 rejected)
"""

import argparse
import contextlib
import dataclasses
import importlib.machinery
import importlib.util
import inspect
import io
import json
import os
import re
import sys
import time
import traceback
import types

import torch
from torch.nn.attention.flex_attention import _DEFAULT_SPARSE_BLOCK_SIZE as FLEX_BLOCK

# the tiny block: model dim, heads, kv heads, head dim, ffn hidden, tokens, vocabulary
_D, _H, _KV, _HD, _FF, _S, _V = 64, 4, 2, 16, 128, 16, 256
_TRITON_MODULE = "torchtitan.distributed.minimal_async_ep.kernels"


class _Absent:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent()

    def __call__(self, *args, **kwargs):
        return _Absent()


def _import_torchtitan(notes: list) -> str:
    # 0.3.0 imports the Triton kernels of MinimalAsyncEP whenever a model is imported; CPU
    # torch has no triton. Stand in for that one module: its kernels only run with EP on CUDA.
    if _TRITON_MODULE not in sys.modules and importlib.util.find_spec("triton") is None:
        stub = types.ModuleType(_TRITON_MODULE)
        stub.__spec__ = importlib.machinery.ModuleSpec(_TRITON_MODULE, None)
        stub.__getattr__ = _Absent().__getattr__
        sys.modules[_TRITON_MODULE] = stub
        notes.append(f"no triton here: {_TRITON_MODULE} stubbed (MinimalAsyncEP only)")
    import torchtitan
    import torchtitan.trainer  # noqa: F401

    return torchtitan.__version__


def _load(path: str, notes: list) -> tuple[str, str]:
    """Register the file as a module; return (module name, config function name)."""
    stem = path.rsplit("/", 1)[-1].split(".")[0]
    from torchtitan.models import _supported_models

    name = re.sub(r"\W", "_", stem)
    if name != stem or not name.isidentifier() or name in _supported_models:
        name = "cpsim_" + name
        notes.append(f"file stem {stem!r} is not an importable module name; loaded as {name}")
    loader = importlib.machinery.SourceFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    sys.modules[name] = module
    loader.exec_module(module)
    with open(path) as f:
        header = re.search(r"^#.*\bCONFIG=(\w+)", f.read(), re.M)
    from torchtitan.trainer import Trainer

    fns = [n for n, f in inspect.getmembers(module, inspect.isfunction)
           if f.__module__ == name and inspect.signature(f).return_annotation is Trainer.Config]
    fn = header.group(1) if header else fns[0] if len(fns) == 1 else "cpsim_config"
    return name, fn


def _tiny_model(model_config, notes: list):
    """The emitted model config shrunk to one block of the emitted block class."""
    from torchtitan.models.common.attention import FusedQKVLinear, GQAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config

    rep = dataclasses.replace
    layer = model_config.layers[0]
    att, ffn = layer.attention, layer.feed_forward
    if not isinstance(att, GQAttention.Config) or ffn is None:
        notes.append(f"block of {type(layer).__qualname__} not shrinkable here (MoE or non-GQA)")
        return None
    att = make_gqa_config(
        dim=_D, n_heads=_H, n_kv_heads=_KV, head_dim=_HD if att.head_dim else None,
        wqkv_param_init=att.wo.param_init, wo_param_init=att.wo.param_init,
        inner_attention=att.inner_attention, rope=rep(att.rope, dim=_HD, max_seq_len=_S),
        fuse_qkv=isinstance(att.qkv_linear, FusedQKVLinear.Config),
        qk_norm=rep(att.qk_norm, normalized_shape=_HD) if att.qk_norm else None)
    ffn = make_ffn_config(dim=_D, hidden_dim=_FF, w1_param_init=ffn.w1.param_init,
                          w2w3_param_init=ffn.w2.param_init)
    block = rep(layer, attention=att, feed_forward=ffn,
                attention_norm=rep(layer.attention_norm, normalized_shape=_D),
                ffn_norm=rep(layer.ffn_norm, normalized_shape=_D))
    return rep(model_config, dim=_D, vocab_size=_V, layers=[block],
               tok_embeddings=rep(model_config.tok_embeddings, num_embeddings=_V, embedding_dim=_D),
               norm=rep(model_config.norm, normalized_shape=_D),
               lm_head=rep(model_config.lm_head, in_features=_D, out_features=_V))


def _run_block(config, tiny, notes: list, stage) -> None:
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    rep = dataclasses.replace
    tokens = torch.randint(0, _V, (1, _S), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(_S).unsqueeze(0)
    inner = tiny.layers[0].attention.inner_attention
    ac = config.activation_checkpoint
    ac_name = type(ac).__qualname__ if ac is not None else "no AC"

    def build(model_config):
        model = model_config.build()
        model.init_states()
        if ac is not None:  # as parallelize_fn does it: ac_config.build(...).apply(model)
            ac.build(dump_folder=config.dump_folder).apply(model)
        return model

    if isinstance(inner, FlexAttention.Config):
        stage(f"block forward, {type(inner).__qualname__} (compiled for the CPU), {ac_name}")
        model = build(tiny)
        with torch.no_grad():
            model(tokens, positions, model.get_attention_masks(positions))
        notes.append("FlexAttention has no backward on the CPU (torch raises NotImplementedError):"
                     " forward+backward ran with torchtitan's ScaledDotProductAttention, causal,"
                     " without the document mask")
        att = rep(tiny.layers[0].attention, inner_attention=ScaledDotProductAttention.Config())
        tiny = rep(tiny, layers=[rep(tiny.layers[0], attention=att)])
        inner = att.inner_attention
    stage(f"block forward+backward, {type(inner).__qualname__}, {ac_name}")
    model = build(tiny)
    masks = None if isinstance(inner, ScaledDotProductAttention.Config) else (
        model.get_attention_masks(positions))
    model(tokens, positions, masks).float().pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    if missing:
        raise RuntimeError(f"no gradient reached {missing}")
    notes.append(f"tiny block: dim {_D}, {_H} heads, {_KV} kv heads, ffn {_FF}, seq {_S}")


def check(path: str, gpus: int) -> dict:
    report = {"ok": False, "torchtitan_version": None, "stages_run": [], "error": None,
              "params": None, "notes": []}
    notes, stages = report["notes"], report["stages_run"]
    current = ["import torchtitan"]

    def stage(name: str) -> None:
        stages.append(current[0])
        current[0] = name

    pd_module = device_type = None
    try:
        report["torchtitan_version"] = _import_torchtitan(notes)
        from torchtitan.config import TORCH_DTYPE_MAP, ConfigManager
        from torchtitan.distributed import ParallelDims, full_dtensor
        from torchtitan.distributed import parallel_dims as pd_module
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.distributed.context_parallel import cp_shard
        from torchtitan.models.common.attention import FlexAttention
        from torchtitan.tools import utils

        stage("load module")
        name, fn = _load(path, notes)
        stage(f"ConfigManager.parse_args --module {name} --config {fn}")
        text = io.StringIO()  # tyro reports a failed __post_init__ on stderr, then exits 2
        try:
            with contextlib.redirect_stderr(text):
                config = ConfigManager().parse_args(["--module", name, "--config", fn])
        except SystemExit as e:
            box = text.getvalue().partition("╭")[2].split("For full helptext")[0]
            raise RuntimeError(" ".join(re.sub(r"[│╮╰╯─]", " ", box).split())) from e
        sys.stderr.write(text.getvalue())
        if not os.path.exists(config.hf_assets_path):
            notes.append(f"hf_assets_path {config.hf_assets_path} absent here (a warning only)")

        stage(f"ParallelDims.from_config + device mesh, world_size {gpus} (fake process group)")
        if not torch.distributed.is_initialized():
            dist_utils.init_fake_mode(gpus, "fake_backend", rank=0)
        device_type, pd_module.device_type = pd_module.device_type, "cpu"
        dims = ParallelDims.from_config(config.parallelism, gpus)
        mesh = dims.world_mesh  # builds and validates every mesh axis
        notes.append(f"mesh of {mesh.size()} ranks: dp_replicate {dims.dp_replicate}, dp_shard "
                     f"{dims.dp_shard}, cp {dims.cp}, tp {dims.tp}, pp {dims.pp}, ep {dims.ep}")
        report["mesh"] = {"dp_shard": dims.dp_shard, "cp": dims.cp, "tp": dims.tp,
                          "pp": dims.pp, "ep": dims.ep}

        stage("Trainer.__init__ sequence-length check")
        seq = config.training.seq_len  # the expression below is Trainer.__init__'s
        divisor = (dims.tp if config.parallelism.enable_sequence_parallel else 1) * (
            2 * dims.cp if dims.cp > 1 else 1)
        if seq % divisor != 0:
            raise ValueError(f"Training sequence length ({seq}) must be divisible by {divisor} "
                             "for the configured sequence/context parallelism.")
        dist_utils.set_spmd_backend(config.parallelism.spmd_backend)

        stage("model_config.update_from_config(config=config)")
        model_config = config.model_spec.model
        model_config.update_from_config(config=config)
        if config.override.imports:
            from torchtitan.config import apply_overrides

            apply_overrides(config.override, config)
        config._validate_cuda_graphs()

        stage("model_config.build() on the meta device")
        with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
            model = model_config.build()
        model.verify_module_protocol()
        report["params"] = int(model_config.get_nparams_and_flops(model, seq)[0])
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        report["buffer_bytes"] = int(buffers)
        notes.append(f"non-parameter buffers (RoPE caches) per rank: {buffers / 2**30:.2f} GiB")
        if config.parallelism.spmd_backend in ("full_dtensor", "spmd_types"):
            full_dtensor.validate_config(dims, model)  # parallelize_fn's first step
        del model

        if dims.cp > 1:
            balancer = config.parallelism.context_parallel_load_balancer
            stage(f"cp_shard of the {seq}-token input over cp {dims.cp}, balancer {balancer}")
            ids = torch.arange(seq).unsqueeze(0)
            if balancer != "ptrr":
                cp_shard(dims.get_mesh("cp"), (ids, ids, ids), None, balancer)
            else:
                notes.append("ptrr balancer: not sharded here (needs the full-length BlockMask)")
            inner = model_config.first_attention.inner_attention
            if isinstance(inner, FlexAttention.Config) and seq % (dims.cp * FLEX_BLOCK):
                raise NotImplementedError(  # torch's _create_cp_block_mask, which cp_shard calls
                    f"Q_LEN {seq} is not divisible by CP mesh world size {dims.cp} * "
                    f"BLOCK_SIZE {FLEX_BLOCK}. This is not supported yet. ")

        tiny = _tiny_model(model_config, notes)
        if tiny is not None:
            _run_block(config, tiny, notes, stage)
        stages.append(current[0])
        report["ok"] = True
    except (Exception, SystemExit) as e:
        detail = str(e) or traceback.extract_tb(e.__traceback__)[-1].line  # a bare assert
        report["error"] = f"{current[0]}: {type(e).__name__}: {detail}"
    finally:
        if device_type is not None:
            pd_module.device_type = device_type
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path")
    parser.add_argument("--gpus", type=int, required=True)
    args = parser.parse_args()
    start = time.perf_counter()
    report = check(args.path, args.gpus)
    report["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
