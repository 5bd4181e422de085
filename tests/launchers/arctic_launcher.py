"""Run a cpsim ArcticTraining recipe through ArcticTraining 0.8.0's own config code, on the CPU.

get_config (the `arctic_training` command's loader: the registered sft trainer's pydantic model,
unknown keys refused) with the world size from WORLD_SIZE, then what its trainer checks next:
sequence_parallel_size dividing the world, DeepSpeedConfig as deepspeed.initialize builds it,
DeepSpeed's UlyssesSPAttentionHF head checks and the tiled-MLP class lookup for the model's config.
Without a process group or the network: deepspeed.init_distributed is not called, and the model's
config.json comes from --hf-config (cpsim's data/models file) instead of the hub.
usage: arctic_launcher.py recipe.yaml --gpus N [--hf-config config.json]
"""

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import traceback
import types
from pathlib import Path

from launcher_check import main

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _versions() -> dict:
    out = {}
    for name in ("arctic-training", "deepspeed", "transformers", "torch", "pydantic"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _stub_hf_config(notes: list, hf_config: str | None):
    """AutoConfig.from_pretrained stand-in: local config.json if given, else the offline cache."""
    from transformers import AutoConfig, PretrainedConfig

    real = AutoConfig.from_pretrained

    def from_pretrained(name, *args, **kwargs):
        if hf_config:
            return real(hf_config, *args, **kwargs)
        try:
            return real(name, *args, **kwargs)
        except OSError:
            notes.append(f"hub: AutoConfig.from_pretrained({name!r}) needs the hub; a stub "
                         "(hidden_size=1) was used, so default zero_optimization buckets are fake")
            return PretrainedConfig(hidden_size=1, max_position_embeddings=1)

    return from_pretrained


def _deepspeed_config(ds: dict, gpus: int, sp: int) -> None:
    """DeepSpeedConfig as deepspeed.initialize builds it (mpu = Ulysses parallel_state_sp)."""
    from deepspeed.runtime import config as ds_config_mod

    fake = types.SimpleNamespace(get_rank=lambda g=None: 0, get_world_size=lambda g=None: gpus)
    mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: gpus // sp) if sp > 1 else None
    saved = ds_config_mod.dist
    ds_config_mod.dist = fake
    try:
        ds_config_mod.DeepSpeedConfig(json.loads(json.dumps(ds)), mpu=mpu)
    finally:
        ds_config_mod.dist = saved


def _tiled_mlp_class(model_type: str) -> None:
    """enable_tiled_mlp_compute's lookup of <Prefix>MLP, without monkey-patching it."""
    from arctic_training.model.tiled_compute import get_causal_lm_model_cls_prefix

    prefix, _ = get_causal_lm_model_cls_prefix(model_type)
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    getattr(module, f"{prefix}MLP")


def _ulysses_heads(hf_cfg, sp: int, config) -> None:
    """DeepSpeed's UlyssesSPAttentionHF.__init__ (the trainer's head checks), SP group faked."""
    from deepspeed.runtime.sequence_parallel import ulysses_sp

    arch = hf_cfg.get_text_config()
    fake = types.SimpleNamespace(get_world_size=lambda g=None: sp, get_rank=lambda g=None: 0)
    saved = ulysses_sp.dist, ulysses_sp.register_all_to_all_group
    ulysses_sp.dist, ulysses_sp.register_all_to_all_group = fake, lambda g: None
    try:
        ulysses_sp.UlyssesSPAttentionHF(
            attn=None, batch_size=config.micro_batch_size,
            attn_head_count=arch.num_attention_heads,
            attn_head_size=getattr(arch, "head_dim", None)
            or arch.hidden_size // arch.num_attention_heads,
            kv_head_count=arch.num_key_value_heads, num_hidden_layers=arch.num_hidden_layers,
            process_group=None, seq_length_is_variable=True)
    finally:
        ulysses_sp.dist, ulysses_sp.register_all_to_all_group = saved


def check(path: str, gpus: int, hf_config: str | None = None) -> dict:
    report = {"ok": False, "versions": _versions(), "stages_run": [], "error": None, "notes": []}
    notes, stages = report["notes"], report["stages_run"]
    cfg_path = Path(path).resolve()
    hf_config = str(Path(hf_config).resolve()) if hf_config else None
    env = {**OFFLINE, "WORLD_SIZE": str(gpus), "RANK": "0", "LOCAL_RANK": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cwd = os.getcwd()
    try:
        import deepspeed
        from transformers import AutoConfig

        from arctic_training.config.trainer import get_config

        stages.append("import")
        if importlib.util.find_spec("flash_attn") is None:
            sys.modules["flash_attn"] = types.ModuleType("flash_attn")
            notes.append("flash_attn is not installed here: ModelConfig's flash_attn import "
                         "check was satisfied by a stub module")
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            os.chdir(tmp)  # train_log_metrics_path_prep writes ./train-log-metrics.jsonl
            stack.callback(os.chdir, cwd)
            patch = {deepspeed: ("init_distributed", lambda *a, **k: None),
                     AutoConfig: ("from_pretrained", _stub_hf_config(notes, hf_config))}
            for obj, (attr, repl) in patch.items():
                stack.callback(setattr, obj, attr, getattr(obj, attr))
                setattr(obj, attr, repl)
            notes.append("TrainerConfig.init_dist: deepspeed.init_distributed() not called "
                         "(no process group); world size from WORLD_SIZE")
            config = get_config(cfg_path)
        stages.append("get_config")
        report["trainer"] = type(config).__name__
        report["model_config"] = type(config.model).__name__
        report["data_sources"] = [type(s).__name__ for s in config.data.sources]
        report["optimizer"] = type(config.optimizer).__name__
        report["world_size"] = config.world_size
        sp = config.sequence_parallel_size
        ds = config.deepspeed
        report["deepspeed"] = ds
        if gpus % sp:
            raise ValueError(f"world size {gpus} not divisible by sequence_parallel_size {sp} "
                             "(deepspeed parallel_state_sp at runtime)")
        stages.append("sp_divides_world")
        _deepspeed_config(config.deepspeed, gpus, sp)
        stages.append("deepspeed_config")
        if hf_config and sp > 1:
            _ulysses_heads(AutoConfig.from_pretrained(hf_config), sp, config)
            stages.append("ulysses_heads")
        if hf_config and config.tiled_mlp_compute:
            _tiled_mlp_class(AutoConfig.from_pretrained(hf_config).model_type)
            stages.append("tiled_mlp_class")
        elif sp > 1:
            notes.append("ulysses_heads skipped: needs the model config (hub); pass --hf-config")
        report["ok"] = True
    except Exception as exc:  # noqa: BLE001 - report whatever ArcticTraining raised
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return report


if __name__ == "__main__":
    main(check, ("--hf-config", "a local config.json instead of the hub"))
