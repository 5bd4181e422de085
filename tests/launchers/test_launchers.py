"""Every launcher file cpsim writes goes through the launcher's own code, on the CPU.

For each launcher and each plan of the acceptance set (the default plan, a --seq that fits,
qwen3-32b on 16 GPUs), `cpsim plan --emit LAUNCHER` writes the file, then the launcher's checker
(tests/launchers/<name>_launcher.py, one process each) loads it with the pinned launcher package
of requirements.txt: TorchTitan 0.3.0's ConfigManager, ParallelDims, update_from_config, a meta
build and one block forward and backward; DeepSpeed's DeepSpeedConfig; Accelerate's launch
validation, ParallelismConfig and DeepSpeed plugin; Megatron-Core's TransformerConfig and
parallel state; ArcticTraining's config model. A launcher that cannot be installed here keeps the
recorded-key check (tests/roundtrip/read_launcher_file.py --known-keys), and its test says why.

Environment: CPSIM_BIN (the cpsim executable; default build/cpsim).
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CPSIM = os.path.abspath(os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim")))
DATASET = "HuggingFaceH4/ultrachat_200k"

# The acceptance plans: (name, plan arguments, GPUs the launch starts).
PLANS = [
    ("default", [], 8),
    ("seq-128K", ["--seq", "128K"], 8),
    ("qwen3-32b-16gpus", ["--model", "qwen3-32b", "--gpus", "16"], 16),
]

# Launchers whose own code runs here: the checker module and the emitted file's name.
CHECKED = {
    "torchtitan": ("torchtitan_launcher.py", "cpsim_tt.py"),
    "deepspeed": ("deepspeed_launcher.py", "ds_config.json"),
    "accelerate": ("accelerate_launcher.py", "accelerate.yaml"),
    "megatron": ("megatron_launcher.py", "megatron.sh"),
    "arctic": ("arctic_launcher.py", "arctic.yaml"),
}

# Launchers whose code cannot be installed in the project's one venv: why, and the file's name.
RECORDED_KEYS_ONLY = {
    "torchtitan-0.2.2": ("TorchTitan 0.2.2 and 0.3.0 cannot share one venv (0.3.0 is pinned)",
                         "tt022.toml"),
    "torchtitan-0.2.1": ("TorchTitan 0.2.1 and 0.3.0 cannot share one venv (0.3.0 is pinned)",
                         "tt021.toml"),
    "torchtitan-main": ("TorchTitan main @ b5bcd76 is unreleased: not on PyPI", "cpsim_main.py"),
    "untied-ulysses": ("the UPipe fork of TorchTitan is not on PyPI", "untied.sh"),
    "nemo": ("NeMo's llm collection (nemo_toolkit 2.7) needs numpy 1.26 and nemo_run, 3.0 has "
             "none; megatron-bridge needs a CUDA torch", "cpsim_nemo.py"),
}


def emit(launcher, args, out):
    """Writes the launcher's file; returns the configuration the plan emitted (its JSON row)."""
    cmd = [CPSIM, "plan", "--emit", launcher, "--out", str(out), "--json", *args]
    if launcher == "arctic":
        cmd += ["--dataset", DATASET]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}{r.stdout[-800:]}"
    plan = json.loads(r.stdout)
    label = plan["emitted"]["label"]
    rows = plan["top"] + plan["best_per_method"] + plan["pareto"]
    return next(row for row in rows if row["label"] == label)


@pytest.mark.parametrize("plan", PLANS, ids=[p[0] for p in PLANS])
@pytest.mark.parametrize("launcher", sorted(CHECKED))
def test_the_launcher_runs_the_file(launcher, plan, tmp_path):
    name, args, gpus = plan
    checker, filename = CHECKED[launcher]
    out = tmp_path / filename
    planned = emit(launcher, args, out)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(ROOT, "build", "torch_extensions"))
    extra = []
    if launcher == "arctic":  # the model's config.json, which ArcticTraining reads from the hub
        model = args[args.index("--model") + 1] if "--model" in args else "llama3-8b"
        extra = ["--hf-config", os.path.join(ROOT, "data", "models", f"{model}.json")]
    r = subprocess.run([sys.executable, os.path.join(HERE, checker), str(out), "--gpus",
                        str(gpus), *extra], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    try:
        report = json.loads(r.stdout[r.stdout.index("{"):r.stdout.rindex("}") + 1])
    except ValueError:
        pytest.fail(f"{checker} printed no report (exit {r.returncode}):\n{r.stderr[-3000:]}")
    assert r.returncode == 0 and report["ok"], (
        f"{launcher} refused the file of plan {name}:\n{report.get('error')}\n"
        f"stages: {report.get('stages_run')}\n--- file ---\n{out.read_text()}")
    if launcher == "torchtitan":
        # TorchTitan's own model, built on the meta device, holds exactly the RoPE tables cpsim
        # counts for the recipe as run (its only buffers).
        model = args[args.index("--model") + 1] if "--model" in args else "llama3-8b"
        with open(os.path.join(ROOT, "data", "models", f"{model}.json")) as f:
            shape = json.load(f)
        blocks = shape["num_hidden_layers"] if planned["rope_cache_per_layer"] else 1
        expected = (planned["rope_cache_bytes_per_head_dim"] * shape["head_dim"] *
                    planned["seq_len"] * blocks)
        assert report["buffer_bytes"] == expected, (report["buffer_bytes"], expected)


def checked_file(checker, launcher, args, out, gpus, tmp_path):
    """Emits the file, runs the launcher's checker on it; returns (the plan's row, its report)."""
    planned = emit(launcher, [*args, "--gpus", str(gpus)], out)
    r = subprocess.run([sys.executable, os.path.join(HERE, checker), str(out), "--gpus",
                        str(gpus)], capture_output=True, text=True, cwd=tmp_path)
    report = json.loads(r.stdout[r.stdout.index("{"):r.stdout.rindex("}") + 1])
    assert r.returncode == 0 and report["ok"], (report.get("error"), out.read_text())
    return planned, report


def test_megatron_runs_the_window_of_every_layer(tmp_path):
    """A model whose layers attend within a window: the emitted flags give megatron-core's
    per-layer decision the layers cpsim simulates windowed, and a window of w keys."""
    _, report = checked_file("megatron_launcher.py", "megatron",
                             ["--model", "mistral-7b-v0.1", "--seq", "128K"],
                             tmp_path / "megatron.sh", 8, tmp_path)
    assert report["window_layers"] == "S" * 32
    assert report["window_size"] == [4095, 0]


MOE_ARGS = ["--model", "qwen3-30b-a3b", "--seq", "64K", "--ep", "8"]


def test_megatron_runs_the_experts_as_simulated(tmp_path):
    """A mixture of experts: megatron-core's config gets the experts, k, their width and the
    routing cpsim simulates, and its parallel state the EP group and expert data parallelism."""
    planned, report = checked_file("megatron_launcher.py", "megatron", MOE_ARGS,
                                   tmp_path / "megatron.sh", 16, tmp_path)
    assert " ep8" in planned["label"], planned["label"]
    assert report["experts"] == {
        "num_moe_experts": 128, "topk": 8, "ffn_hidden": 768, "pre_softmax": False,
        "shared_ffn_hidden": None, "shared_gate": False, "layer_freq": 1,
        "score_function": "softmax", "num_groups": None, "group_topk": None,
        "topk_scaling": None, "dispatcher": "alltoall", "ep_group": 8, "expert_data_parallel": 2}


def test_megatron_runs_a_gated_shared_expert(tmp_path):
    """A Qwen2-MoE config (a shared expert behind a sigmoid gate, q/k/v biases, two dense layers):
    megatron-core's config gets the shared expert's width and gate, which layers have experts,
    and the q/k/v biases only."""
    config = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
              "mlp_only_layers": [0, 1],
              "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
              "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
              "rms_norm_eps": 1e-6, "hidden_act": "silu", "max_position_embeddings": 8192,
              "tie_word_embeddings": False, "use_sliding_window": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    planned, report = checked_file("megatron_launcher.py", "megatron",
                                   ["--model", str(path), "--seq", "64K", "--ep", "4"],
                                   tmp_path / "megatron.sh", 16, tmp_path)
    assert " ep4" in planned["label"], planned["label"]
    e = report["experts"]
    assert (e["num_moe_experts"], e["topk"], e["ffn_hidden"]) == (60, 4, 1408)
    assert (e["shared_ffn_hidden"], e["shared_gate"]) == (5632, True)
    assert e["layer_freq"] == [0, 0] + [1] * 22  # its first two layers dense (mlp_only_layers)
    assert report["add_qkv_bias"] and not report["add_bias_linear"]


def test_megatron_runs_gpt_oss_as_simulated(tmp_path):
    """gpt-oss-120b: megatron-core's config gets its sinks (a learnable softmax, on TE's fused
    backend with cp_comm_type a2a), its clamped quick-GELU GLU, biases on every linear, the window
    on alternate layers, and EP across nodes."""
    args = ["--model", "gpt-oss-120b", "--seq", "64K", "--ep", "32", "--allow-data-parallel"]
    planned, report = checked_file("megatron_launcher.py", "megatron", args,
                                   tmp_path / "megatron.sh", 64, tmp_path)
    assert planned["label"].startswith("ulysses ") and " ep32" in planned["label"], planned
    assert report["softmax_type"] == "learnable"
    assert report["activation"] == {"func": "quick_gelu", "gated": True,
                                    "glu_linear_offset": 1.0, "clamp": 7.0}
    assert report["add_bias_linear"] and report["add_qkv_bias"]
    assert report["window_layers"] == "SF" * 18 and report["window_size"] == [127, 0]
    assert report["experts"]["ep_group"] == 32 and report["experts"]["topk"] == 4


def test_megatron_runs_deepseek_v3_as_simulated(tmp_path):
    """DeepSeek-V3: MLATransformerConfig gets its latent attention's ranks and widths (under CP
    with p2p or a2a+p2p, TransformerEngine's condition), the grouped sigmoid router, the dense
    first layers, and the pipeline's uneven first stage."""
    args = ["--model", "deepseek-v3", "--seq", "64K", "--ep", "8", "--allow-data-parallel"]
    planned, report = checked_file("megatron_launcher.py", "megatron", args,
                                   tmp_path / "megatron.sh", 512, tmp_path)
    assert " pp16" in planned["label"] and " ep8" in planned["label"], planned
    # YaRN as DeepSeek-V3's config.json states it (rope_scaling: factor 40, 4096, 32, 1, 1.0, 1.0)
    assert report["mla"] == {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128,
                             "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "rope_type": "yarn",
                             "yarn": {"rotary_scaling_factor": 40.0,
                                      "original_max_position_embeddings": 4096,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                      "mscale_all_dim": 1.0}}
    experts = report["experts"]
    assert experts["score_function"] == "sigmoid" and experts["topk"] == 8, experts
    assert (experts["num_groups"], experts["group_topk"], experts["topk_scaling"]) == (8, 4, 2.5)
    assert experts["shared_ffn_hidden"] == 2048 and not experts["shared_gate"]
    assert experts["layer_freq"] == [0] * 3 + [1] * 58


def test_torchtitan_runs_the_experts_as_simulated(tmp_path):
    """A mixture of experts: TorchTitan's own 30B-A3B model, built from the emitted config on the
    meta device, has the parameters cpsim counts, and its mesh the EP degree cpsim simulates."""
    planned, report = checked_file("torchtitan_launcher.py", "torchtitan", MOE_ARGS,
                                   tmp_path / "cpsim_torchtitan.py", 16, tmp_path)
    assert " ep8" in planned["label"], planned["label"]
    assert report["mesh"]["ep"] == 8 and report["mesh"]["cp"] == 16, report["mesh"]
    counted = subprocess.run([CPSIM, "models", "qwen3-30b-a3b", "--json"], capture_output=True,
                             text=True)
    assert report["params"] == json.loads(counted.stdout)["model"]["parameters"]


@pytest.mark.parametrize("plan", PLANS, ids=[p[0] for p in PLANS])
@pytest.mark.parametrize("launcher", sorted(RECORDED_KEYS_ONLY))
def test_recorded_keys_only(launcher, plan, tmp_path):
    """Not the launcher's code (see RECORDED_KEYS_ONLY for why): every key the file sets is
    defined in the launcher's source at the recorded commit, and the file reads back."""
    name, args, gpus = plan
    why, filename = RECORDED_KEYS_ONLY[launcher]
    out = tmp_path / filename
    emit(launcher, args, out)
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "roundtrip", "read_launcher_file.py"),
         launcher, str(out), "--data", os.path.join(ROOT, "data"), "--base-recipe",
         os.path.join(ROOT, "data", "recipes", "alst.json"), "--gpus", str(gpus),
         "--recipe-out", str(tmp_path / "recipe.json"), "--known-keys",
         os.path.join(ROOT, "tests", "roundtrip", "launcher_keys.json")],
        capture_output=True, text=True)
    assert r.returncode == 0, f"{launcher} ({why}), plan {name}: {r.stderr}"
    print(f"{launcher}: recorded-key check only: {why}")


# The FPDT file cpsim wrote until it refused FPDT: Megatron-DeepSpeed flags for a bias-free SwiGLU
# Llama block. DeepSpeed's own FPDT layers raise on it (the qkv bias is None); without
# --disable-bias-linear and --swiglu, its FFN runs: the block it trains has biases and a plain
# GELU MLP, which is why no launcher runs cpsim's FPDT (sim/src/methods/fpdt.cpp).
FPDT_FLAGS = """CPSIM_MEGATRON_DEEPSPEED_FLAGS=(
  --deepspeed --deepspeed_config {ds} --zero-stage 3 --no-pipeline-parallel
  --ds-sequence-parallel-size 8 --ds-sequence-parallel-fpdt
  --ds-sequence-parallel-fpdt-chunk-size 65536 --ds-sequence-parallel-fpdt-offloading
  --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
  --num-key-value-heads 8 --kv-channels 128 {block}--normalization rmsnorm
  --seq-length 1048576 --max-position-embeddings 1048576
  --use-rotary-position-embeddings --no-position-embedding
  --rotary-position-embeddings-theta 500000 --micro-batch-size 1 --bf16 --use-flash-attn-v2
)
"""
DS_CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
             "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
             "sequence_parallel_size": 8}


@pytest.mark.parametrize("block,runs", [("--swiglu --disable-bias-linear ", False), ("", True)],
                         ids=["llama-block", "biased-gelu-block"])
def test_deepspeed_fpdt_trains_only_biased_gelu_blocks(block, runs, tmp_path):
    ds = tmp_path / "fpdt.json"
    ds.write_text(json.dumps(DS_CONFIG))
    flags = tmp_path / "fpdt.megatron-deepspeed.sh"
    flags.write_text(FPDT_FLAGS.format(ds=ds, block=block))
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(ROOT, "build", "torch_extensions"))
    r = subprocess.run([sys.executable, os.path.join(HERE, "deepspeed_launcher.py"), str(ds),
                        "--gpus", "8", "--flags", str(flags)], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    assert (r.returncode == 0) == runs, r.stdout[-3000:] + r.stderr[-2000:]
    if not runs:
        assert "fpdt_layer.py" in r.stdout and "NoneType" in r.stdout, r.stdout[-3000:]
