#!/usr/bin/env python3
"""Read a launcher file cpsim emitted back, the way that launcher reads it, into a configuration.

The round trip of `cpsim plan --emit`: the file is parsed with the parser its launcher uses
(TorchTitan v0.2.x: tomllib; TorchTitan main's config function: Python's ast; Accelerate and
ArcticTraining: PyYAML; DeepSpeed: json; shell argument files: bash itself, sourcing them and
printing the array and the exported environment), and every key is mapped to what that launcher
does with it. Knobs the launcher has no key for are
what it does without one (TorchTitan has no checkpoint offload, tiled MLP or fused loss, ...);
knobs the launcher leaves to the training script keep the base recipe's value. The result is a
cpsim recipe file and the `cpsim simulate` flags of the configuration, written independently of
cpsim's emitters (from the launchers' documentation and source, REFERENCES.md "Launchers").

  read_launcher_file.py FORMAT FILE --data DATA_DIR --base-recipe RECIPE.json --gpus N \
      --recipe-out OUT.json

prints one `cpsim simulate` argument per line. Exits 1 naming the key it cannot read.
"""

import argparse
import json
import os
import re
import subprocess
import sys

# TorchTitan's model flavors (torchtitan/models/llama3/__init__.py, models/qwen3/__init__.py at
# v0.2.2): (layers, hidden, heads, kv heads, ffn hidden). The UPipe fork adds llama3 "32B", the
# Qwen3-32B shape run as a Llama block.
FLAVORS = {
    ("llama3", "8B"): (32, 4096, 32, 8, 14336),
    ("llama3", "70B"): (80, 8192, 64, 8, 28672),
    ("llama3", "405B"): (126, 16384, 128, 8, 53248),
    ("llama3", "32B"): (64, 5120, 64, 8, 25600),
    ("qwen3", "0.6B"): (28, 1024, 16, 8, 3072),
    ("qwen3", "1.7B"): (28, 2048, 16, 8, 6144),
    ("qwen3", "4B"): (36, 2560, 32, 8, 9728),
    ("qwen3", "8B"): (36, 4096, 32, 8, 12288),
    ("qwen3", "14B"): (40, 5120, 40, 8, 17408),
    ("qwen3", "32B"): (64, 5120, 64, 8, 25600),
    # the mixture of experts (torchtitan/models/qwen3/__init__.py _30b_a3b): the shape key holds
    # the config's intermediate_size, which the built-in's config.json carries
    ("qwen3", "30B-A3B"): (48, 2048, 32, 4, 6144),
}

DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4}


class Unreadable(Exception):
    pass


def builtin_models(data_dir):
    """Built-in models by Hugging Face id and by shape."""
    by_id, by_shape = {}, {}
    folder = os.path.join(data_dir, "models")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(folder, name)) as f:
            c = json.load(f)
        model = name[: -len(".json")]
        by_id[c.get("_name_or_path")] = model
        c = c.get("text_config", c)  # a multimodal config's decoder (Llama 4)
        shape = (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
                 c["num_key_value_heads"], c["intermediate_size"])
        by_shape.setdefault(shape, model)
    return by_id, by_shape


def model_of_shape(shape, data_dir, where):
    _, by_shape = builtin_models(data_dir)
    if shape not in by_shape:
        raise Unreadable(f"{where}: no built-in model has the shape {shape}")
    return by_shape[shape]


def source_bash(path, array):
    """Sources a shell file in bash; returns (the array's words, the exported environment)."""
    script = ('set -e; source "$1"; printf "%s\\0" "${' + array + '[@]}"; printf "\\1"; '
              'env -0')
    out = subprocess.run(["bash", "-c", script, "bash", path], check=True, capture_output=True,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}).stdout
    words_part, env_part = out.split(b"\x01", 1)
    words = [w.decode() for w in words_part.split(b"\0") if w]
    env = dict(e.decode().split("=", 1) for e in env_part.split(b"\0") if b"=" in e)
    return words, env


def options(words):
    """`--flag value` and bare `--flag` words of an argument list as a dict (bare: True)."""
    opts, i = {}, 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            raise Unreadable(f"argument '{w}' follows no flag")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            values = [words[i + 1]]
            i += 2
            while i < len(words) and not words[i].startswith("--"):
                values.append(words[i])  # --hierarchical-context-parallel-sizes 4 2
                i += 1
            opts[w] = values[0] if len(values) == 1 else values
        else:
            opts[w] = True
            i += 1
    return opts


def comment_environment(path):
    """`# environment: K=V` lines: what the header tells the user to set before launching."""
    env = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"#\s*environment:\s*(.*)$", line.strip())
            if m:
                for pair in m.group(1).split():
                    if "=" in pair:
                        k, v = pair.split("=", 1)
                        env[k] = v
    return env


def header_seq(path):
    """The length of the `# generated by cpsim: ... seq N` header, for files with no such key."""
    with open(path) as f:
        for line in f:
            m = re.search(r"generated by cpsim:.*\bseq (\d+)\b", line)
            if m:
                return int(m.group(1))
    raise Unreadable("no sequence-length key and no 'generated by cpsim' header with the length")


def expandable(env):
    return "expandable_segments:True" in env.get("PYTORCH_CUDA_ALLOC_CONF", "")


def ds_config_into(recipe, ds, bf16_default=False):
    """What DeepSpeed does with a ds_config's keys: ZeRO stage, optimizer offload, bf16, the
    sequence-parallel communication dtype (fp32 when absent)."""
    zero = ds.get("zero_optimization", {})
    recipe["sharding"]["zero_stage"] = int(zero.get("stage", 0))
    offload = zero.get("offload_optimizer", {})
    recipe["sharding"]["optimizer_offload"] = offload.get("device") == "cpu"
    bf16 = ds.get("bf16", ds.get("bfloat16", {"enabled": bf16_default}))
    if bf16.get("enabled") is not True:
        raise Unreadable("bf16.enabled is not true: cpsim's recipes compute in bf16")
    comm = ds.get("seq_parallel_communication_data_type", "fp32")
    recipe["precision"]["cp_comm_bytes"] = DTYPE_BYTES[comm]


def no_key(recipe, offload=True, tiling=True, fused_loss=None, kernel=None):
    """Knobs a launcher has no key for: what it does without one."""
    ac = recipe["activation_checkpointing"]
    if offload:
        ac["offload_to_host"] = False
    if tiling:
        recipe["tiled_mlp"] = {"enabled": False, "shards": 0}
        recipe["tiled_norm"] = False
    if fused_loss is not None:
        recipe["fused_loss"] = fused_loss
    if kernel is not None:
        recipe["attention_kernel"] = kernel


def torchtitan_rope(recipe, model_name):
    """TorchTitan's RoPE by model: the complex product in fp32 for llama3 (model.py
    apply_rotary_emb; ComplexRoPE on main), rotate_half for qwen3 (model.py; CosSinRoPE)."""
    recipe["rope_kernel"] = {"llama3": "complex", "qwen3": "eager"}[model_name]


def torchtitan_rope_table(recipe, model_name, per_layer):
    """TorchTitan's RoPE table of every position up to the training length: complex64 [S, d/2]
    for llama3, cos and sin of [S, d] in fp32 for qwen3; one buffer on the model in v0.2.x
    (precompute_freqs_cis / precompute_rope_cache), one per block in 0.3.0 and main
    (models/common/rope.py, RoPE.__init__)."""
    recipe["rope_cache"] = {"bytes_per_head_dim": {"llama3": 4, "qwen3": 8}[model_name],
                            "per_layer": per_layer}


def compute_dtype_comm(recipe):
    recipe["precision"]["cp_comm_bytes"] = recipe["precision"]["activation_bytes"]


# ---- One reader per launcher: (flags, recipe) ---------------------------------------------------

def read_torchtitan(path, recipe, a):
    import tomllib
    with open(path, "rb") as f:
        t = tomllib.load(f)
    model = t["model"]
    shape = FLAVORS[(model["name"], model["flavor"])]
    flags = ["--model", model_of_shape(shape, a.data, "[model]")]
    par, train = t["parallelism"], t["training"]
    rotate = par.get("context_parallel_rotate_method", "allgather")  # TorchTitan's default
    if a.format == "torchtitan-0.2.2":
        # v0.2.2's training does not read the rotate method (validate.py alone does): PyTorch's
        # default rotation, the all-gather, runs.
        rotate = "allgather"
    elif "context_parallel_load_balancer" in par:
        raise Unreadable("[parallelism] context_parallel_load_balancer: new in v0.2.2")
    method = {"alltoall": "ring", "allgather": "allgather"}[rotate]
    flags += ["--method", method, "--seq", str(train["seq_len"]),
              "--cp-degree", str(par["context_parallel_degree"])]
    # PyTorch's context_parallel; cpsim models its ring rotation (its all-gather rotation runs
    # the method's scheme alone, the recipe's default).
    if method == "ring":
        flags += ["--impl", "torch-native-cp"]
    if method == "ring":
        # headtail (the default) is the zigzag layout; only None is contiguous.
        flags += ["--ring-layout", "zigzag"]
    if par.get("data_parallel_replicate_degree", 1) != 1:
        raise Unreadable("[parallelism] data_parallel_replicate_degree: HSDP is not modelled")
    tp = int(par.get("tensor_parallel_degree", 1))  # TorchTitan's TP plan is sequence parallel
    pp = int(par.get("pipeline_parallel_degree", 1))
    dp = a.gpus // (tp * int(par["context_parallel_degree"]) * pp)
    local = int(train["local_batch_size"])
    global_batch = int(train.get("global_batch_size", -1))  # -1: local batch x data parallel
    accumulation = 1 if global_batch < 0 else global_batch // (local * dp)
    if pp > 1:
        # The pipeline's micro-batches: local batch / microbatch size (pipeline_parallel.py:194).
        if accumulation != 1 or int(par.get("pipeline_parallel_microbatch_size", 1)) != 1:
            raise Unreadable("gradient accumulation over pipelined steps, or micro-batches of "
                             "several sequences: not modelled")
        micro = local
        flags += torchtitan_pipeline_flags(
            FLAVORS[(model["name"], model["flavor"])][0], pp,
            par.get("pipeline_parallel_schedule", "1F1B"),
            int(par.get("pipeline_parallel_first_stage_less_layers", 1)),
            int(par.get("pipeline_parallel_last_stage_less_layers", 1)),
            par.get("pipeline_parallel_layers_per_stage"))
    else:
        micro = accumulation
    flags += ["--tp", str(tp), "--micro-batches", str(micro)]
    # FSDP2 over dp_shard x cp; "never" keeps the gathered parameters after the forward.
    reshard = par.get("fsdp_reshard_after_forward", "default")
    recipe["sharding"]["zero_stage"] = 2 if reshard == "never" else 3
    recipe["precision"]["param_bytes"] = DTYPE_BYTES[train.get("mixed_precision_param", "bfloat16")]
    recipe["precision"]["grad_reduce_bytes"] = DTYPE_BYTES[train.get("mixed_precision_reduce",
                                                                     "float32")]
    mode = t.get("activation_checkpoint", {}).get("mode", "selective")
    recipe["activation_checkpointing"]["mode"] = mode
    no_key(recipe, fused_loss=False, kernel="sdpa")
    torchtitan_rope(recipe, model["name"])
    torchtitan_rope_table(recipe, model["name"], per_layer=False)
    compute_dtype_comm(recipe)
    recipe["allocator"]["expandable_segments"] = expandable(comment_environment(path))
    return flags


# TorchTitan 0.3.0's and main's baseline config functions (torchtitan/models/{llama3,qwen3}/
# config_registry.py, 0.3.0 and @ b5bcd76): the flavor each one builds with model_registry.
MAIN_BASELINES = {
    "llama3_8b": ("llama3", "8B"), "llama3_70b": ("llama3", "70B"),
    "llama3_405b": ("llama3", "405B"), "qwen3_0_6b": ("qwen3", "0.6B"),
    "qwen3_1_7b": ("qwen3", "1.7B"), "qwen3_14b": ("qwen3", "14B"),
    "qwen3_32b": ("qwen3", "32B"), "qwen3_30b_a3b": ("qwen3", "30B-A3B"),
}
# ParallelismConfig / TrainingConfig defaults (torchtitan/config/configs.py @ b5bcd76) for the
# fields a config function leaves alone.
MAIN_DEFAULTS = {
    "parallelism.data_parallel_replicate_degree": 1, "parallelism.pipeline_parallel_degree": 1,
    "parallelism.tensor_parallel_degree": 1, "parallelism.context_parallel_degree": 1,
    "parallelism.fsdp_reshard_after_forward": "default",
    "parallelism.context_parallel_load_balancer": "headtail",
    "parallelism.pipeline_parallel_schedule": "1F1B", "parallelism.num_pp_microbatches": 1,
    "parallelism.pipeline_parallel_first_stage_less_layers": 1,
    "parallelism.pipeline_parallel_last_stage_less_layers": 1,
    "parallelism.pipeline_parallel_layers_per_stage": None,
    "training.num_tokens_per_train_step": -1, "training.mixed_precision_param": "bfloat16",
    "training.mixed_precision_reduce": "float32", "training.enable_cpu_offload": False,
    "parallelism.expert_parallel_degree": 1, "training.disable_cuda_graphs": False,
}
# 0.3.0's (torchtitan/config/configs.py of the 0.3.0 wheel): sequences, not tokens, per batch.
RELEASE_DEFAULTS = {
    "parallelism.data_parallel_replicate_degree": 1, "parallelism.pipeline_parallel_degree": 1,
    "parallelism.tensor_parallel_degree": 1, "parallelism.context_parallel_degree": 1,
    "parallelism.fsdp_reshard_after_forward": "default",
    "parallelism.context_parallel_load_balancer": "headtail",
    "parallelism.pipeline_parallel_schedule": "1F1B",
    "parallelism.pipeline_parallel_microbatch_size": 1,
    "parallelism.pipeline_parallel_first_stage_less_layers": 1,
    "parallelism.pipeline_parallel_last_stage_less_layers": 1,
    "parallelism.pipeline_parallel_layers_per_stage": None,
    "training.global_batch_size": -1, "training.mixed_precision_param": "bfloat16",
    "training.mixed_precision_reduce": "float32", "training.enable_cpu_offload": False,
    "training.disable_cuda_graphs": False, "parallelism.expert_parallel_degree": 1,
}
# The RoPE maximum of the baselines' model_registry (models/llama3/__init__.py,
# models/qwen3/__init__.py): update_from_config refuses a longer training length.
REGISTRY_ROPE_MAXIMUM = {"llama3": 131072, "qwen3": 40960}


def rope_loop(st):
    """`for layer in config.model_spec.model.layers: layer.attention.rope =
    dataclasses.replace(layer.attention.rope, FIELD=N)` as ("rope.FIELD", N); else None."""
    import ast
    if not (isinstance(st, ast.For) and ast.unparse(st.iter) == "config.model_spec.model.layers"
            and len(st.body) == 1 and isinstance(st.body[0], ast.Assign)):
        return None
    var = ast.unparse(st.target)
    assign = st.body[0]
    call = assign.value
    if (len(assign.targets) != 1 or ast.unparse(assign.targets[0]) != f"{var}.attention.rope"
            or not isinstance(call, ast.Call) or ast.unparse(call.func) != "dataclasses.replace"
            or [ast.unparse(x) for x in call.args] != [f"{var}.attention.rope"]
            or len(call.keywords) != 1):
        return None
    return f"rope.{call.keywords[0].arg}", call.keywords[0].value


def function_assignments(path, name):
    """The statements of function `name` of a Python module, read with Python's ast (the module
    is not imported) up to its return: (line, target as text, value node), each a single
    assignment or the loop raising every block's RoPE maximum (rope_loop)."""
    import ast
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise Unreadable(f"no function {name}")
    out = []
    for st in fn.body:
        if isinstance(st, ast.Return):
            break
        if rope_loop(st) is not None:
            out.append((st.lineno, *rope_loop(st)))
            continue
        if not isinstance(st, ast.Assign) or len(st.targets) != 1:
            raise Unreadable(f"line {st.lineno}: not a single assignment")
        out.append((st.lineno, ast.unparse(st.targets[0]), st.value))
    return out


def main_config_function(path, defaults):
    """The `cpsim_config` function of a TorchTitan 0.3.0 or main config module, read with
    Python's ast (no torchtitan import): (baseline function, {"section.field": value},
    activation checkpoint)."""
    import ast
    baseline, fields, ac = None, {}, "unset"
    for line, target, value in function_assignments(path, "cpsim_config"):
        if target == "config" and isinstance(value, ast.Call) and not value.args:
            baseline = ast.unparse(value.func)
        elif target == "config.activation_checkpoint":
            # FullAC.Config() / SelectiveAC.Config() / None (torchtitan/distributed/
            # activation_checkpoint.py: FullAC, per-op SelectiveAC; None applies no policy)
            ac = {"FullAC.Config()": "full", "SelectiveAC.Config()": "selective",
                  "None": "none"}.get(ast.unparse(value))
            if ac is None:
                raise Unreadable(f"line {line}: activation_checkpoint {ast.unparse(value)}")
        elif target.startswith("config."):
            fields[target[len("config."):]] = ast.literal_eval(value)
        elif target.startswith("rope."):
            fields[target] = ast.literal_eval(value)
        else:
            raise Unreadable(f"line {line}: assignment to {target}")
    if baseline not in MAIN_BASELINES:
        raise Unreadable(f"baseline {baseline}: not a known config_registry function")
    return baseline, {**defaults, **fields}, ac


def release_batch(f, seq, dp, pp):
    """0.3.0: local_batch_size sequences per data-parallel rank; with PP split into
    local_batch_size / pipeline_parallel_microbatch_size micro-batches (trainer.py:124-135), else
    global_batch_size / (local x dp) steps of gradient accumulation."""
    local = int(f["training.local_batch_size"])
    if pp > 1:
        if int(f["parallelism.pipeline_parallel_microbatch_size"]) != 1:
            raise Unreadable("pipeline micro-batches of several sequences: not modelled")
        if not f["training.disable_cuda_graphs"]:
            raise Unreadable("training.disable_cuda_graphs: 0.3.0's CUDA graphs refuse PP")
        return local
    if local != 1:
        raise Unreadable("training.local_batch_size: not one sequence per micro-batch")
    global_batch = int(f["training.global_batch_size"])
    return 1 if global_batch < 0 else global_batch // dp


def main_batch(f, seq, dp, pp):
    """main: token budgets; num_pp_microbatches per step and data-parallel rank with PP
    (trainer.py:409-414); -1: one micro-batch per data-parallel rank; else gradient accumulation
    fills the step."""
    if int(f["training.num_tokens_per_microbatch_per_dp_rank"]) != seq:
        raise Unreadable("num_tokens_per_microbatch_per_dp_rank: not one sequence per micro-batch")
    pp_micro = int(f["parallelism.num_pp_microbatches"]) if pp > 1 else 1
    step_tokens = int(f["training.num_tokens_per_train_step"])
    micro = pp_micro if step_tokens < 0 else step_tokens // (seq * dp)
    if pp > 1 and micro != pp_micro:
        raise Unreadable("gradient accumulation over pipelined steps: not modelled")
    return micro


def read_torchtitan_main(path, recipe, a):
    release = a.format == "torchtitan"  # 0.3.0; else main @ b5bcd76
    baseline, f, ac = main_config_function(path, RELEASE_DEFAULTS if release else MAIN_DEFAULTS)
    if ac == "unset":
        raise Unreadable("activation_checkpoint: the baseline's policy is not read")
    flags = ["--model", model_of_shape(FLAVORS[MAIN_BASELINES[baseline]], a.data, baseline)]
    if f["parallelism.data_parallel_replicate_degree"] != 1:
        raise Unreadable("parallelism.data_parallel_replicate_degree: HSDP is not modelled")
    length_field = "training.seq_len" if release else "training.max_context_length"
    seq = int(f[length_field])
    name = MAIN_BASELINES[baseline][0]
    rope = f.get("rope.max_seq_len" if release else "rope.max_context_length",
                 REGISTRY_ROPE_MAXIMUM[name])
    if seq > rope:
        raise Unreadable(f"{length_field} {seq} exceeds the RoPE maximum {rope}")
    cp = int(f["parallelism.context_parallel_degree"])
    tp = int(f["parallelism.tensor_parallel_degree"])
    pp = int(f["parallelism.pipeline_parallel_degree"])
    dp = a.gpus // (tp * cp * pp)
    micro = (release_batch if release else main_batch)(f, seq, dp, pp)
    pipeline = torchtitan_pipeline_flags(
        FLAVORS[MAIN_BASELINES[baseline]][0], pp, f["parallelism.pipeline_parallel_schedule"],
        int(f["parallelism.pipeline_parallel_first_stage_less_layers"]),
        int(f["parallelism.pipeline_parallel_last_stage_less_layers"]),
        f["parallelism.pipeline_parallel_layers_per_stage"])
    # Main's only CP attention is FlexAttention with K/V all-gathered (no rotate key); the
    # headtail balancer is the zigzag layout, None contiguous.
    layout = "contiguous" if f["parallelism.context_parallel_load_balancer"] is None else "zigzag"
    flags += ["--method", "allgather", "--seq", str(seq), "--cp-degree", str(cp),
              "--ring-layout", layout, "--tp", str(tp), "--micro-batches", str(micro)] + pipeline
    ep = int(f["parallelism.expert_parallel_degree"])
    if ep > 1:
        flags += ["--ep", str(ep)]
    reshard = f["parallelism.fsdp_reshard_after_forward"]
    recipe["sharding"]["zero_stage"] = 2 if reshard == "never" else 3
    recipe["sharding"]["optimizer_offload"] = bool(f["training.enable_cpu_offload"])
    recipe["precision"]["param_bytes"] = DTYPE_BYTES[f["training.mixed_precision_param"]]
    recipe["precision"]["grad_reduce_bytes"] = DTYPE_BYTES[f["training.mixed_precision_reduce"]]
    recipe["activation_checkpointing"]["mode"] = ac
    # ChunkedLossWrapper (the baselines' loss) never holds the full logits: the fused loss. The
    # flex kernel has no curves: the base recipe's kernel stays.
    no_key(recipe, fused_loss=True)
    torchtitan_rope(recipe, name)
    torchtitan_rope_table(recipe, name, per_layer=True)
    compute_dtype_comm(recipe)
    recipe["allocator"]["expandable_segments"] = expandable(comment_environment(path))
    return flags


def read_untied_ulysses(path, recipe, a):
    words, env = source_bash(path, "UNTIED_ULYSSES_ARGS")
    o = options(words)
    ulysses = int(o["--parallelism.context_parallel_ulysses_degree"])
    ring = int(o["--parallelism.context_parallel_degree"])
    impl = o["--model.attn_impl"]
    parts = impl.split("_")
    kind = parts[0]
    flags = ["--model", model_of_shape(FLAVORS[(o["--model.name"], o["--model.flavor"])], a.data,
                                       "--model.flavor"),
             "--seq", o["--training.seq_len"], "--cp-degree", str(ulysses * ring),
             "--ulysses-degree", str(ulysses), "--ring-degree", str(ring)]
    if kind == "upipe":
        flags += ["--method", "upipe", "--impl", "untied-ulysses-upipe"]
    elif kind == "usp":
        flags += ["--method", "usp" if ring > 1 else "ulysses", "--impl", "yunchang-usp"]
    else:
        raise Unreadable(f"--model.attn_impl {impl}: not read back")
    if ring > 1:
        flags += ["--ring-layout", "zigzag"]  # the fork's ring is always load-balanced
    recipe["attention_kernel"] = "fa3" if "fa3" in parts else "fa2"
    ac = recipe["activation_checkpointing"]
    ac["mode"] = o["--activation_checkpoint.mode"]
    ac["offload_to_host"] = "offload" in parts
    tiled = "tiled" in parts
    recipe["tiled_mlp"] = {"enabled": tiled, "shards": 0}
    recipe["tiled_norm"] = tiled
    recipe["fused_loss"] = True  # Liger's fused linear cross-entropy, always on in the fork
    torchtitan_rope(recipe, o["--model.name"])  # the UPipe op rotates with its own kernel
    torchtitan_rope_table(recipe, "llama3", per_layer=False)  # the fork's freqs_cis buffer
    reshard = o.get("--parallelism.fsdp_reshard_after_forward", "default")
    recipe["sharding"]["zero_stage"] = 2 if reshard == "never" else 3
    recipe["sharding"]["optimizer_offload"] = "--training.enable_cpu_offload" in o
    compute_dtype_comm(recipe)
    recipe["allocator"]["expandable_segments"] = expandable(env)
    return flags


def read_megatron_deepspeed(sh_path, recipe, a):
    words, env = source_bash(sh_path, "CPSIM_MEGATRON_DEEPSPEED_FLAGS")
    o = options(words)
    ds_path = o["--deepspeed_config"]
    if not os.path.isabs(ds_path):
        ds_path = os.path.join(os.path.dirname(sh_path), os.path.basename(ds_path))
    with open(ds_path) as f:
        ds = json.load(f)
    ds_config_into(recipe, ds)
    if "--ds-sequence-parallel-fpdt" not in o:
        raise Unreadable("--ds-sequence-parallel-fpdt missing: not an FPDT run")
    sp = int(o["--ds-sequence-parallel-size"])
    shape = (int(o["--num-layers"]), int(o["--hidden-size"]), int(o["--num-attention-heads"]),
             int(o["--num-key-value-heads"]), int(o["--ffn-hidden-size"]))
    flags = ["--model", model_of_shape(shape, a.data, "model flags"), "--method", "fpdt",
             "--impl", "deepspeed-fpdt", "--seq", o["--seq-length"], "--cp-degree", str(sp),
             "--fpdt-chunk", o["--ds-sequence-parallel-fpdt-chunk-size"],
             "--fpdt-offload", "on" if "--ds-sequence-parallel-fpdt-offloading" in o else "off",
             "--micro-batches", str(ds.get("gradient_accumulation_steps", 1))]
    if int(o["--zero-stage"]) != recipe["sharding"]["zero_stage"]:
        raise Unreadable("--zero-stage disagrees with the ds_config's zero_optimization.stage")
    ac = recipe["activation_checkpointing"]
    ac["mode"] = "full" if "--checkpoint-activations" in o else "none"
    ac["offload_to_host"] = "--checkpoint-in-cpu" in o
    if "--use-flash-attn-v2" in o:
        recipe["attention_kernel"] = "fa2"
    recipe["allocator"]["expandable_segments"] = expandable(env)
    return flags


def read_deepspeed(path, recipe, a):
    sh = os.path.splitext(path)[0] + ".megatron-deepspeed.sh"
    if os.path.exists(sh):
        return read_megatron_deepspeed(sh, recipe, a)
    raise Unreadable("a ds_config alone names no model or length (the training script does)")


def read_accelerate(path, recipe, a):
    import yaml
    with open(path) as f:
        y = yaml.safe_load(f)
    p = y["parallelism_config"]
    gpus = int(y["num_processes"])
    flags = ["--gpus", str(gpus), "--seq", str(header_seq(path))]
    ds_file = y.get("deepspeed_config", {}).get("deepspeed_config_file")
    if p.get("parallelism_config_sp_backend") == "deepspeed":
        sp = int(p["parallelism_config_sp_size"])
        flags += ["--method", "ulysses", "--impl", "deepspeed-ulysses", "--cp-degree", str(sp)]
        kernel = {"flash_attention_3": "fa3", "flash_attention_2": "fa2", "sdpa": "sdpa"}
        recipe["attention_kernel"] = kernel[p["parallelism_config_sp_attn_implementation"]]
        if not os.path.isabs(ds_file):
            ds_file = os.path.join(os.path.dirname(path), os.path.basename(ds_file))
        with open(ds_file) as f:
            ds = json.load(f)
        ds_config_into(recipe, ds)
        flags += ["--micro-batches", str(ds.get("gradient_accumulation_steps", 1))]
    else:
        flags += ["--tp", str(p.get("parallelism_config_tp_size", 1))]
        strategy = p["parallelism_config_cp_comm_strategy"]
        method = {"alltoall": "ring", "allgather": "allgather"}[strategy]
        flags += ["--method", method, "--cp-degree", str(p["parallelism_config_cp_size"])]
        if method == "ring":
            flags += ["--impl", "torch-native-cp", "--ring-layout", "zigzag"]
        recipe["attention_kernel"] = "sdpa"
        compute_dtype_comm(recipe)
        if y.get("distributed_type") != "FSDP":
            raise Unreadable("torch CP without distributed_type FSDP: not read back")
        fsdp = y.get("fsdp_config", {})
        # FSDP2 keeps the gathered parameters after the forward when it does not reshard.
        reshard = fsdp.get("fsdp_reshard_after_forward", True)
        recipe["sharding"]["zero_stage"] = 3 if reshard not in (False, "false", "NO_SHARD") else 2
        recipe["sharding"]["param_offload"] = bool(fsdp.get("fsdp_offload_params", False))
        ac = recipe["activation_checkpointing"]
        ac["mode"] = "full" if fsdp.get("fsdp_activation_checkpointing", False) else "none"
        if y.get("mixed_precision") != "bf16":
            raise Unreadable("mixed_precision is not bf16: cpsim's recipes compute in bf16")
    # Accelerate and Transformers have no checkpoint offload or tiled MLP; Hugging Face
    # checkpointing (per block) and Liger's fused loss are the trainer's arguments, in the JSON
    # beside the YAML (TrainingArguments: gradient_checkpointing, use_liger_kernel).
    no_key(recipe)
    with open(os.path.splitext(path)[0] + ".training_args.json") as f:
        trainer = json.load(f)
    if trainer.get("gradient_checkpointing"):
        ac = recipe["activation_checkpointing"]
        if ac["mode"] != "selective":  # HF's per-block checkpointing; selective is model code
            ac["mode"] = "full"
        ac["reentrant"] = trainer.get("gradient_checkpointing_kwargs", {}).get("use_reentrant",
                                                                                True)
    elif p.get("parallelism_config_sp_backend") == "deepspeed":
        recipe["activation_checkpointing"]["mode"] = "none"
    recipe["fused_loss"] = bool(trainer.get("use_liger_kernel", False))
    recipe["allocator"]["expandable_segments"] = expandable(comment_environment(path))
    return flags


def megatron_pipeline_flags(o, pp):
    """Megatron-LM's pipeline flags (training/arguments.py @ d98e8a6): P stages, the interleaved
    schedule's V (--num-virtual-stages-per-pipeline-rank; --num-layers-per-virtual-pipeline-stage
    gives it as blocks per chunk), uneven first/last stages."""
    if pp == 1:
        return []
    flags = ["--pp", str(pp)]
    v = o.get("--num-virtual-stages-per-pipeline-rank")
    if v is None and "--num-layers-per-virtual-pipeline-stage" in o:
        v = int(o["--num-layers"]) // pp // int(o["--num-layers-per-virtual-pipeline-stage"])
    if v is not None and int(v) > 1:
        flags += ["--pp-schedule", "interleaved", "--virtual-stages", str(v)]
    for flag, ours in (("--decoder-first-pipeline-num-layers", "--pp-first-stage-layers"),
                       ("--decoder-last-pipeline-num-layers", "--pp-last-stage-layers")):
        if flag in o:
            flags += [ours, o[flag]]
    if "--no-overlap-p2p-communication" in o:
        raise Unreadable("--no-overlap-p2p-communication: interleaving with blocking P2P is not "
                         "modelled")
    return flags


def torchtitan_pipeline_flags(layers, pp, schedule, first_less, last_less, layers_per_stage):
    """TorchTitan's pipeline fields (config/job_config.py:360-418 @ 73a0e69, configs.py:180-236 @
    b5bcd76) as cpsim's stages: the split of distributed/pipeline_parallel.py
    generate_llm_fqn_per_model_part over S = P (1F1B) or P x V (Interleaved1F1B) stages."""
    if pp == 1:
        return []
    if schedule == "1F1B":
        s, v = pp, 1
    elif schedule == "Interleaved1F1B":
        if layers_per_stage is None:
            v = 2  # pipeline_parallel.py:111-115: two stages per rank by default
        else:
            v = -(-(layers + first_less + last_less) // layers_per_stage) // pp
        s = pp * v
    else:
        raise Unreadable(f"pipeline_parallel_schedule {schedule}: not modelled")
    effective = layers + first_less + last_less
    if effective % s != 0:
        raise Unreadable("pipeline stages of unequal size beyond the first/last: not modelled")
    per_stage = effective // s
    if v > 1 and (first_less or last_less):
        raise Unreadable("uneven interleaved stages: not modelled")
    flags = ["--pp", str(pp)]
    if v > 1:
        flags += ["--pp-schedule", "interleaved", "--virtual-stages", str(v)]
    if first_less:
        flags += ["--pp-first-stage-layers", str(per_stage - first_less)]
    if last_less:
        flags += ["--pp-last-stage-layers", str(per_stage - last_less)]
    return flags


def read_megatron(path, recipe, a):
    words, env = source_bash(path, "MEGATRON_ARGS")
    o = options(words)
    shape = (int(o["--num-layers"]), int(o["--hidden-size"]), int(o["--num-attention-heads"]),
             int(o.get("--num-query-groups", o["--num-attention-heads"])),
             int(o["--ffn-hidden-size"]))
    cp = int(o["--context-parallel-size"])
    comm = o.get("--cp-comm-type", "p2p")
    # Megatron-Core through TransformerEngine; its all_gather CP is cpsim's scheme alone.
    impl = "none" if comm == "all_gather" else "megatron-core-cp"
    flags = ["--model", model_of_shape(shape, a.data, "model flags"), "--impl", impl,
             "--seq", o["--seq-length"], "--cp-degree", str(cp)]
    tp = int(o["--tensor-model-parallel-size"])
    pp = int(o.get("--pipeline-model-parallel-size", 1))
    if tp > 1 and "--sequence-parallel" not in o:
        raise Unreadable("tensor parallelism without --sequence-parallel: not modelled")
    flags += megatron_pipeline_flags(o, pp)
    dp = a.gpus // (tp * cp * pp)
    global_batch = int(o.get("--global-batch-size", int(o["--micro-batch-size"]) * dp))
    flags += ["--tp", str(tp),
              "--micro-batches", str(global_batch // (int(o["--micro-batch-size"]) * dp))]
    if "--num-experts" in o:
        flags += ["--ep", o.get("--expert-model-parallel-size", "1")]
    if comm == "p2p":
        flags += ["--method", "ring", "--ring-layout", "zigzag"]  # Megatron's CP load balancing
    elif comm == "a2a":
        flags += ["--method", "ulysses"]
    elif comm == "all_gather":
        flags += ["--method", "allgather"]
    elif comm == "a2a+p2p":
        u, r = o["--hierarchical-context-parallel-sizes"]
        flags += ["--method", "usp", "--ulysses-degree", u, "--ring-degree", r,
                  "--ring-layout", "zigzag"]
    else:
        raise Unreadable(f"--cp-comm-type {comm}: not read back")
    recipe["sharding"]["zero_stage"] = 1 if "--use-distributed-optimizer" in o else 0
    recipe["precision"]["fp8"] = "--fp8-format" in o
    recipe["sharding"]["optimizer_offload"] = False
    ac = recipe["activation_checkpointing"]
    ac["mode"] = o.get("--recompute-granularity", "none")
    no_key(recipe, fused_loss=False)
    # Megatron-Core fuses RoPE unless --no-rope-fusion (arguments.py); unfused it is rotate_half.
    recipe["rope_kernel"] = "eager" if "--no-rope-fusion" in o else "fused"
    if o.get("--attention-backend") == "flash" and recipe["attention_kernel"] not in ("fa2", "fa3"):
        recipe["attention_kernel"] = "fa2"
    compute_dtype_comm(recipe)
    recipe["allocator"]["expandable_segments"] = expandable(env)
    return flags


def read_arctic(path, recipe, a):
    import yaml
    with open(path) as f:
        y = yaml.safe_load(f)
    by_id, _ = builtin_models(a.data)
    name = y["model"]["name_or_path"]
    if name not in by_id:
        raise Unreadable(f"model.name_or_path {name}: no built-in model has this id")
    if not y["data"].get("sources"):
        raise Unreadable("data.sources is empty: ArcticTraining refuses to start")
    sp = int(y["sequence_parallel_size"])
    flags = ["--model", by_id[name], "--method", "ulysses", "--impl", "deepspeed-ulysses",
             "--seq", str(y["data"]["max_length"]), "--cp-degree", str(sp)]
    # ArcticTraining adds bfloat16.enabled when the model's dtype is bf16 (its default;
    # arctic_training/config/trainer.py, config/model.py at b28638e).
    ds_config_into(recipe, y.get("deepspeed", {}), bf16_default=y["model"].get("dtype", "bf16")
                   in ("bf16", "bfloat16", "torch.bfloat16", "bfloat"))
    flags += ["--micro-batches", str(y.get("gradient_accumulation_steps", 1))]
    ac = recipe["activation_checkpointing"]
    ac["mode"] = "full"  # ArcticTraining checkpoints every block
    ac["offload_to_host"] = bool(y.get("activation_checkpoint_cpu_offload", False))
    tiled = bool(y.get("tiled_mlp_compute", False))
    recipe["tiled_mlp"] = {"enabled": tiled, "shards": 0}
    if y["model"].get("type") == "liger":
        recipe["fused_loss"] = True
        recipe["rope_kernel"] = "fused"  # AutoLigerKernelForCausalLM applies Liger's RoPE too
    else:
        recipe["rope_kernel"] = "eager"  # the Hugging Face model's rotate_half
    kernel = {"flash_attention_2": "fa2", "sdpa": "sdpa"}
    recipe["attention_kernel"] = kernel[y["model"].get("attn_implementation", "sdpa")]
    recipe["allocator"]["expandable_segments"] = expandable(comment_environment(path))
    return flags


# NeMo 2.0's pretrain recipes and their model configs (nemo/collections/llm/recipes/<module>.py,
# gpt/model/llama.py and qwen3.py at v2.4.0 @ 2381f42): (layers, hidden, heads, query groups,
# ffn hidden).
NEMO_RECIPES = {
    "llama2_7b": (32, 4096, 32, 32, 11008),
    "llama3_8b": (32, 4096, 32, 8, 14336),
    "llama3_70b": (80, 8192, 64, 8, 28672),
    "llama31_405b": (126, 16384, 128, 8, 53248),
    "qwen3_4b": (36, 2560, 32, 8, 9728),
    "qwen3_8b": (36, 4096, 32, 8, 12288),
    "qwen3_14b": (40, 5120, 40, 8, 17408),
    "qwen3_32b": (64, 5120, 64, 8, 25600),
}

# What the recipes leave as NeMo and Megatron-Core define it when the file does not set a field
# (MegatronStrategy.__init__, MegatronMixedPrecision.__init__, TransformerConfig @ 03f7793).
NEMO_DEFAULTS = {
    "trainer.strategy.num_layers_in_first_pipeline_stage": None,
    "trainer.strategy.num_layers_in_last_pipeline_stage": None,
    "trainer.plugins.fp8": None,
}


def nemo_recipe_function(path, defaults=True):
    """The `cpsim_recipe` function of a NeMo recipe module, read with Python's ast (no NeMo
    import): (recipe module, factory keyword arguments, {"field.path": value}); a value that is
    not a literal (torch.bfloat16, AttnBackend.flash) as its source text."""
    import ast
    module, factory, fields = None, {}, {}
    for line, target, value in function_assignments(path, "cpsim_recipe"):
        if target == "recipe" and isinstance(value, ast.Call) and not value.args:
            call = ast.unparse(value.func)
            if not call.endswith(".pretrain_recipe"):
                raise Unreadable(f"line {line}: {call} is not a pretrain recipe")
            module = call[: -len(".pretrain_recipe")]
            factory = {k.arg: ast.literal_eval(k.value) for k in value.keywords}
        elif target.startswith("recipe."):
            try:
                fields[target[len("recipe."):]] = ast.literal_eval(value)
            except ValueError:
                fields[target[len("recipe."):]] = ast.unparse(value)
        else:
            raise Unreadable(f"line {line}: assignment to {target}")
    if module not in NEMO_RECIPES:
        raise Unreadable(f"recipe {module}: not a known NeMo pretrain recipe")
    return module, factory, {**NEMO_DEFAULTS, **fields} if defaults else fields


def read_nemo(path, recipe, a):
    module, factory, f = nemo_recipe_function(path)
    if factory.get("num_nodes", 1) * factory.get("num_gpus_per_node", 8) != a.gpus:
        raise Unreadable("num_nodes x num_gpus_per_node: not the GPUs launched")
    flags = ["--model", model_of_shape(NEMO_RECIPES[module], a.data, module)]
    seq = int(f["data.seq_length"])
    # NeMo does not sync the model's sequence length with the data's (recipes/llama3_8b.py).
    if int(f["model.config.seq_length"]) != seq:
        raise Unreadable("model.config.seq_length differs from data.seq_length")
    if int(f["data.micro_batch_size"]) != 1:
        raise Unreadable("data.micro_batch_size: more than one sequence per micro-batch")
    tp = int(f["trainer.strategy.tensor_model_parallel_size"])
    pp = int(f["trainer.strategy.pipeline_model_parallel_size"])
    cp = int(f["trainer.strategy.context_parallel_size"])
    if tp > 1 and f["trainer.strategy.sequence_parallel"] is not True:
        raise Unreadable("tensor parallelism without sequence_parallel: not modelled")
    if pp > 1 and f["trainer.strategy.pipeline_dtype"] != "torch.bfloat16":
        raise Unreadable("pipeline_dtype: NeMo needs it with PP > 1 (api.py _validate_config)")
    dp = a.gpus // (tp * cp * pp)
    micro = int(f["data.global_batch_size"]) // dp
    flags += ["--seq", str(seq), "--cp-degree", str(cp), "--tp", str(tp),
              "--micro-batches", str(micro)]
    if pp > 1:
        flags += ["--pp", str(pp)]
        v = f["trainer.strategy.virtual_pipeline_model_parallel_size"]
        if v is not None and int(v) > 1:
            flags += ["--pp-schedule", "interleaved", "--virtual-stages", str(v)]
        for key, ours in (("num_layers_in_first_pipeline_stage", "--pp-first-stage-layers"),
                          ("num_layers_in_last_pipeline_stage", "--pp-last-stage-layers")):
            if f["trainer.strategy." + key] is not None:
                flags += [ours, str(f["trainer.strategy." + key])]
    # Megatron-Core through TransformerEngine (TE's p2p when cp_comm_type is None); its all_gather
    # CP is cpsim's scheme alone.
    comm = f.get("model.config.cp_comm_type") or "p2p"
    method = {
        "p2p": ["--method", "ring", "--ring-layout", "zigzag"],
        "a2a": ["--method", "ulysses"],
        "all_gather": ["--method", "allgather"],
    }.get(comm)
    if method is None:
        raise Unreadable(f"cp_comm_type {comm}: not read back")
    flags += method + ["--impl", "none" if comm == "all_gather" else "megatron-core-cp"]
    granularity = f["model.config.recompute_granularity"]
    if granularity == "full" and (f["model.config.recompute_method"] != "uniform" or
                                  f["model.config.recompute_num_layers"] != 1):
        raise Unreadable("full recompute other than uniform over 1 layer: not modelled")
    recipe["activation_checkpointing"]["mode"] = granularity or "none"
    plugins = {k: f.get("trainer.plugins." + k) for k in
               ("fp8", "fp8_recipe", "fp8_amax_history_len", "fp8_amax_compute_algo",
                "fp8_param_gather")}
    if plugins["fp8"] is not None and plugins != {
            "fp8": "hybrid", "fp8_recipe": "delayed", "fp8_amax_history_len": 1024,
            "fp8_amax_compute_algo": "max", "fp8_param_gather": False}:
        raise Unreadable(f"FP8 settings {plugins}: not TransformerEngine's delayed scaling as "
                         "modelled")
    recipe["precision"]["fp8"] = plugins["fp8"] is not None
    fp32_reduce = f["trainer.plugins.grad_reduce_in_fp32"]
    if f["trainer.strategy.ddp.grad_reduce_in_fp32"] != fp32_reduce:
        raise Unreadable("grad_reduce_in_fp32 differs between the plugin and the DDP config")
    recipe["precision"]["grad_reduce_bytes"] = 4 if fp32_reduce else 2
    recipe["sharding"]["zero_stage"] = 1 if f["optim.config.use_distributed_optimizer"] else 0
    recipe["sharding"]["optimizer_offload"] = False
    no_key(recipe, fused_loss=False)
    recipe["rope_kernel"] = "fused" if f.get("model.config.apply_rope_fusion") else "eager"
    backend = f.get("model.config.attention_backend", "AttnBackend.auto")
    if backend == "AttnBackend.fused":
        recipe["attention_kernel"] = "cudnn"
    elif backend == "AttnBackend.flash":
        if recipe["attention_kernel"] not in ("fa2", "fa3"):
            recipe["attention_kernel"] = "fa2"
    else:
        raise Unreadable(f"attention_backend {backend}: the backend TE picks is not read")
    compute_dtype_comm(recipe)
    recipe["allocator"]["expandable_segments"] = expandable(comment_environment(path))
    return flags


# ---- The keys a file sets, as its launcher names them -------------------------------------------

def key_paths(tree, prefix=""):
    """Dotted paths of the leaves of a parsed TOML/YAML/JSON tree ("parallelism.tp_size")."""
    if isinstance(tree, dict):
        out = []
        for k, v in tree.items():
            out += key_paths(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
        return out
    return []


def flags_of(words):
    return sorted({w for w in words if w.startswith("--")})


def file_keys(fmt, path):
    """{part: [keys]}: every key or flag the emitted file (and the files it names) sets."""
    if fmt in ("torchtitan-0.2.2", "torchtitan-0.2.1"):
        import tomllib
        with open(path, "rb") as f:
            return {"toml": key_paths(tomllib.load(f))}
    if fmt in ("accelerate", "arctic"):
        import yaml
        with open(path) as f:
            y = yaml.safe_load(f)
        out = {"yaml": key_paths(y)}
        ds = None
        if fmt == "accelerate":
            ds = y.get("deepspeed_config", {}).get("deepspeed_config_file")
        if ds:
            if not os.path.isabs(ds):
                ds = os.path.join(os.path.dirname(path), os.path.basename(ds))
            with open(ds) as f:
                out["ds_config"] = key_paths(json.load(f))
        return out
    if fmt == "deepspeed":
        with open(path) as f:
            out = {"ds_config": key_paths(json.load(f))}
        sh = os.path.splitext(path)[0] + ".megatron-deepspeed.sh"
        if os.path.exists(sh):
            out["args"] = flags_of(source_bash(sh, "CPSIM_MEGATRON_DEEPSPEED_FLAGS")[0])
        return out
    if fmt in ("torchtitan", "torchtitan-main"):
        import ast
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        keys = set()
        for node in ast.walk(tree):
            for target in node.targets if isinstance(node, ast.Assign) else []:
                parts = []
                while isinstance(target, ast.Attribute):
                    parts.insert(0, target.attr)
                    target = target.value
                if isinstance(target, ast.Name) and target.id == "config" and parts:
                    keys.add(".".join(parts))
        return {"config": sorted(keys)}
    if fmt == "nemo":
        _, factory, fields = nemo_recipe_function(path, defaults=False)
        return {"recipe": sorted(list(fields) + [f"pretrain_recipe.{k}" for k in factory])}
    array = {"megatron": "MEGATRON_ARGS", "untied-ulysses": "UNTIED_ULYSSES_ARGS"}[fmt]
    return {"args": flags_of(source_bash(path, array)[0])}


def check_known_keys(fmt, path, known_path):
    """Keys the file sets that the launcher's source at the recorded commit does not define."""
    with open(known_path) as f:
        known = json.load(f)[fmt]
    unknown = []
    for part, keys in file_keys(fmt, path).items():
        listed = known["parts"].get(part, {})
        unknown += [f"{part}: {k}" for k in keys if k not in listed]
    return unknown


READERS = {
    "torchtitan": read_torchtitan_main,
    "torchtitan-0.2.2": read_torchtitan,
    "torchtitan-0.2.1": read_torchtitan,
    "torchtitan-main": read_torchtitan_main,
    "untied-ulysses": read_untied_ulysses,
    "deepspeed": read_deepspeed,
    "accelerate": read_accelerate,
    "megatron": read_megatron,
    "arctic": read_arctic,
    "nemo": read_nemo,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("format", choices=sorted(READERS))
    ap.add_argument("file")
    ap.add_argument("--data", required=True, help="cpsim's data/ folder (built-in models)")
    ap.add_argument("--base-recipe", required=True, help="the recipe the user trains with")
    ap.add_argument("--gpus", type=int, required=True, help="GPUs the launch command starts")
    ap.add_argument("--recipe-out", required=True)
    ap.add_argument(
        "--known-keys", help="tests/roundtrip/launcher_keys.json: refuse keys not in it"
    )
    ap.add_argument("--list-keys", action="store_true", help="print the file's keys and exit")
    a = ap.parse_args()
    if a.list_keys:
        print(json.dumps(file_keys(a.format, a.file)))
        return 0
    if a.known_keys:
        unknown = check_known_keys(a.format, a.file, a.known_keys)
        if unknown:
            print(f"read_launcher_file: {a.format} {a.file}: keys its source does not define: "
                  + ", ".join(unknown), file=sys.stderr)
            return 1
    with open(a.base_recipe) as f:
        recipe = json.load(f)
    recipe["name"] = "read-back-" + a.format
    # FP8 as cpsim simulates it is TransformerEngine's: only Megatron-LM's --fp8-format sets it.
    recipe["precision"]["fp8"] = False
    recipe.setdefault("allocator", {})
    recipe["precision"].setdefault("cp_comm_bytes", recipe["precision"]["activation_bytes"])
    try:
        flags = READERS[a.format](a.file, recipe, a)
    except (Unreadable, KeyError) as e:
        print(f"read_launcher_file: {a.format} {a.file}: {e}", file=sys.stderr)
        return 1
    if "--gpus" not in flags:
        flags = ["--gpus", str(a.gpus)] + flags
    with open(a.recipe_out, "w") as f:
        json.dump(recipe, f, indent=2)
    print("\n".join(flags + ["--recipe", a.recipe_out]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
