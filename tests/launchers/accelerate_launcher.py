"""Run a cpsim accelerate YAML through HF Accelerate's own launch and state code, on CPU.

Stages: `accelerate launch --config_file` argument handling (launch_command_parser,
_validate_launch_command -> load_config_from_file -> ClusterConfig); the launcher's environment
(prepare_deepspeed_cmd_env / prepare_multi_gpu_env, which write PARALLELISM_CONFIG_*); then, in that
environment as the training process sees it: ParallelismConfig() (its __post_init__ and the CP/SP
handlers check sizes, cp_comm_strategy, sp_backend, sp_attn_implementation), the DeepSpeed or
FSDP plugin (DeepSpeedPlugin loads deepspeed_config_file through HfDeepSpeedConfig), the device
mesh and ParallelismConfig._validate_accelerator on a "fake" torch.distributed group of the
emitted world size (the accelerator handed to it is a stand-in carrying num_processes,
distributed_type, is_fsdp2), and for DeepSpeed sequence parallelism what Accelerator.prepare runs:
UlyssesSPAttentionHF.register_with_transformers and DeepSpeedConfig on the filled-in ds_config.
usage: accelerate_launcher.py accelerate.yaml --gpus N
"""
import contextlib
import json
import importlib.metadata as md
import os
from types import SimpleNamespace
from unittest import mock

from launcher_check import main, new_report, stage


def _ulysses(rep, pc):
    """What Accelerator._prepare_deepspeed runs for sp_backend=deepspeed, sp_size > 1."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as psp
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers import LlamaConfig
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as fns
    impl = pc.sp_handler.sp_attn_implementation or "sdpa"
    # the model is the user's: a stand-in whose heads divide by sp, loaded with that attention
    n = pc.sp_size
    cfg = LlamaConfig(hidden_size=16 * n, num_attention_heads=n, num_key_value_heads=n,
                      num_hidden_layers=1, intermediate_size=16)
    cfg._attn_implementation = impl
    saved = {k: dict(getattr(fns, k)) for k in ("_global_mapping", "_local_mapping")
             if hasattr(fns, k)}
    psp._release_sequence_parallel_groups()
    try:
        return stage(rep, f"UlyssesSPAttentionHF.register_with_transformers({impl!r})", lambda:
                      UlyssesSPAttentionHF.register_with_transformers(
                          model_name_or_path=SimpleNamespace(config=cfg),
                          core_attn_implementation=impl, sequence_parallel_size=n,
                          micro_batch_size=1,
                          seq_length=pc.sp_handler.sp_seq_length,
                          seq_length_is_variable=pc.sp_handler.sp_seq_length_is_variable,
                          disable_in_eval=True))
    finally:
        for k, v in saved.items():  # the registration rebinds an attention entry: undo it
            getattr(fns, k).clear()
            getattr(fns, k).update(v)


def training_args(rep, path):
    """The trainer's arguments beside the YAML, as train.py reads them: transformers'
    HfArgumentParser(TrainingArguments) (parse_json_file's parse_dict: unknown keys refused)."""
    from transformers import HfArgumentParser, TrainingArguments

    args_path = os.path.splitext(path)[0] + ".training_args.json"
    if not os.path.exists(args_path):
        rep["notes"].append(f"no trainer's arguments beside the YAML ({args_path})")
        return
    with open(args_path) as f:
        values = json.load(f)
    if values.get("bf16"):
        # TrainingArguments refuses bf16 without a GPU that has it (training_args.py:1747)
        values["bf16"] = False
        rep["notes"].append("bf16 parsed as False: this CPU has no bf16 GPU")
    parsed = stage(rep, "HfArgumentParser(TrainingArguments).parse_dict",
                   lambda: HfArgumentParser(TrainingArguments).parse_dict(values))
    if parsed:
        a = parsed[0]
        rep["notes"].append(f"TrainingArguments: gradient_checkpointing {a.gradient_checkpointing}"
                            f" {a.gradient_checkpointing_kwargs}, use_liger_kernel "
                            f"{a.use_liger_kernel}, bf16 {a.bf16}")


def check(path: str, gpus: int) -> dict:
    rep = new_report()
    training_args(rep, path)
    for pkg in ("accelerate", "deepspeed", "transformers", "torch"):
        with contextlib.suppress(md.PackageNotFoundError):
            rep["versions"][pkg] = None
            rep["versions"][pkg] = md.version(pkg)
    import torch.distributed as tdist
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
    conf = stage(rep, "load_config_from_file", lambda: load_config_from_file(path))
    if conf is None:
        return rep
    rep["notes"].append(f"{type(conf).__name__}: distributed_type {conf.distributed_type.value}, "
                        f"num_processes {conf.num_processes}, num_machines {conf.num_machines}")
    if conf.num_processes != gpus:
        rep["notes"].append(f"num_processes {conf.num_processes} != --gpus {gpus}")
    args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
    res = stage(rep, "accelerate launch: _validate_launch_command", lambda:
                 _validate_launch_command(args))
    if res is None:
        return rep
    args, defaults, mp_from_config = res
    if args.use_deepspeed:  # as launch_command does before deepspeed_launcher
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        env = stage(rep, "prepare_deepspeed_cmd_env", lambda: prepare_deepspeed_cmd_env(args)[1])
    else:
        env = stage(rep, "prepare_multi_gpu_env", lambda: prepare_multi_gpu_env(args))
    if env is None:
        return rep
    rep["notes"].append("launcher env: " + ", ".join(
        f"{k}={v}" for k, v in sorted(env.items())
        if k.startswith(("PARALLELISM_CONFIG_", "ACCELERATE_USE", "ACCELERATE_DEEPSPEED_CONFIG",
                         "ACCELERATE_MIXED", "FSDP_VERSION")) and os.environ.get(k) != v))
    cwd = os.getcwd()
    # the training process's view; a relative deepspeed_config_file is resolved against the
    # launch directory, taken here to be the YAML's folder (where cpsim writes both files)
    with mock.patch.dict(os.environ, env, clear=True):
        os.chdir(os.path.dirname(os.path.abspath(path)))
        tdist.init_process_group("fake", rank=0, world_size=gpus)
        try:
            pc, plugin, dtype = None, None, DistributedType.MULTI_GPU
            if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true":
                pc = stage(rep, "ParallelismConfig() from PARALLELISM_CONFIG_*", ParallelismConfig)
            mp = env.get("ACCELERATE_MIXED_PRECISION", "no")
            if env.get("ACCELERATE_USE_DEEPSPEED") == "true":
                dtype = DistributedType.DEEPSPEED

                def ds_plugin():
                    p = DeepSpeedPlugin()
                    p.set_mixed_precision(mp)
                    p.select(_from_accelerator_state=True)
                    return p
                plugin = stage(rep, "DeepSpeedPlugin (HfDeepSpeedConfig of the ds_config)",
                                ds_plugin)
            elif env.get("ACCELERATE_USE_FSDP") == "true":
                dtype = DistributedType.FSDP
                plugin = stage(rep, "FullyShardedDataParallelPlugin",
                                FullyShardedDataParallelPlugin)
                if plugin is not None and mp != "no":
                    plugin.set_mixed_precision(mp)
            if pc is not None:
                stage(rep, "ParallelismConfig.get_device_mesh('cpu')",
                       lambda: pc.get_device_mesh("cpu"))
                fsdp2 = dtype == DistributedType.FSDP and getattr(plugin, "fsdp_version", 1) == 2
                acc = SimpleNamespace(num_processes=gpus, distributed_type=dtype, is_fsdp2=fsdp2,
                                      multi_device=dtype == DistributedType.MULTI_GPU and gpus > 1,
                                      is_main_process=True)
                stage(rep, "ParallelismConfig._validate_accelerator",
                       lambda: pc._validate_accelerator(acc))
            sp = pc.sp_size if pc is not None and pc.sp_backend == "deepspeed" else 1
            wants_pc = env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true"
            if dtype == DistributedType.DEEPSPEED and plugin is not None and (pc or not wants_pc):
                os.environ.setdefault("DS_ACCELERATOR", "cpu")
                import deepspeed.comm as dist
                dist.init_distributed(dist_backend="fake", auto_mpi_discovery=False, verbose=False)
                mpu = _ulysses(rep, pc) if sp > 1 else None
                if sp > 1 and mpu is None:
                    rep["notes"].append("DeepSpeedConfig not run: it needs the SP mpu")
                    return rep
                gas = plugin.get_value("gradient_accumulation_steps")
                gas = 1 if gas in (None, "auto") else gas
                # Accelerator._prepare_deepspeed's fill-in, for a dataloader batch of 1 per device
                fill = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": gas,
                        "train_batch_size": gas * gpus // sp, "gradient_clipping": 1.0}

                def ds_config():
                    from deepspeed.runtime.config import DeepSpeedConfig
                    plugin.deepspeed_config_process(must_match=False, **fill)
                    cfg = plugin.deepspeed_config
                    if sp > 1:
                        cfg["train_batch_size"] = 1 * gas * pc.data_parallel_size
                    return DeepSpeedConfig(cfg, mpu=mpu)
                ds = stage(rep, "DeepSpeedConfig of the filled-in ds_config", ds_config)
                if ds is not None:
                    rep["notes"].append(f"DeepSpeedConfig: world_size {ds.world_size}, zero stage"
                                        f" {ds.zero_optimization_stage}, bf16 "
                                        f"{ds.bfloat16_config.enabled}")
        finally:
            os.chdir(cwd)
            if tdist.is_initialized():
                tdist.destroy_process_group()
            with contextlib.suppress(ImportError):
                from deepspeed.runtime.sequence_parallel import parallel_state_sp
                parallel_state_sp._release_sequence_parallel_groups()
    return rep


if __name__ == "__main__":
    main(check)
