"""cpsim side by side with SimuMax on mixture-of-experts configurations both tools express.

SimuMax (MooreThreads/SimuMax, an analytical model of Megatron-LM training) is run from a checkout
given by path, in this project's Python environment (its imports need numpy, pandas, sympy and
tabulate, which the environment has); cpsim from its executable. Each case is one Megatron-LM run:
megatron-core-cp (TransformerEngine CP) with the distributed optimizer (ZeRO-1, fp32 master weights,
gradients and Adam states), full recomputation of every block, the MoE all-to-all dispatcher,
expert TP 1, TP 1, PP 1, one sequence per step, on B200 (SimuMax's b200_bf16_ceperm system, cpsim's
b200 profile). Compared per GPU: parameters, model states, activation peak (peak minus model
states), peak, step time, and the MoE block's forward FLOPs.

usage: python scripts/compare_simumax.py --simumax PATH [--cpsim build/cpsim] [--json OUT]
Prints a Markdown table (docs/SIMUMAX_COMPARISON.md holds one with the explanation of every
difference over 5 %).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024**3

# SimuMax model configs of the built-in models (docs/model.md's fields); Mixtral's is SimuMax's own
# configs/models/mixtral-8x7b.json with the same values.
SIMUMAX_MODELS = {
    "mixtral-8x7b": {
        "model_type": "moe",
        "model_name": "mixtral_8x7b",
        "hidden_size": 4096,
        "head_num": 32,
        "kv_head_num": 8,
        "head_size": 128,
        "intermediate_size": 14336,
        "layer_num": 32,
        "expert_num": 8,
        "topk": 2,
        "vocab_size": 32000,
        "use_swiglu": True,
    },
    "qwen3-30b-a3b": {
        "model_type": "moe",
        "model_name": "qwen3_30b_a3b",
        "hidden_size": 2048,
        "head_num": 32,
        "kv_head_num": 4,
        "head_size": 128,
        "intermediate_size": 6144,
        "moe_ffn_hidden_size": 768,
        "layer_num": 48,
        "expert_num": 128,
        "topk": 8,
        "vocab_size": 151936,
        "use_swiglu": True,
    },
}

# (label, model, GPUs, CP degree, CP method, EP degree, sequence length). SimuMax models CP as
# all-to-all only ("cp_comm_type p2p not implemented yet"), and TransformerEngine's a2a needs the
# CP degree to divide the KV heads.
CASES = [
    ("Mixtral-8x7B, 16 GPUs, EP 8, CP 2 a2a, 32K", "mixtral-8x7b", 16, 2, "a2a", 8, 32768),
    ("Mixtral-8x7B, 32 GPUs, EP 8, CP 8 a2a, 256K", "mixtral-8x7b", 32, 8, "a2a", 8, 262144),
    ("Qwen3-30B-A3B, 8 GPUs, EP 8, CP 4 a2a, 64K", "qwen3-30b-a3b", 8, 4, "a2a", 8, 65536),
    ("Qwen3-30B-A3B, 16 GPUs, EP 16, CP 4 a2a, 128K", "qwen3-30b-a3b", 16, 4, "a2a", 16, 131072),
]


def gib(text):
    """SimuMax prints GiB-based sizes with the suffix GB (1 GB = 2**30 bytes there)."""
    value, unit = text.split()
    scale = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}[unit]
    return float(value) * scale / GIB


def seconds(text):
    value, unit = text.split()
    return float(value) * {"ms": 1e-3, "s": 1.0, "us": 1e-6}[unit]


def run_simumax(path, model, gpus, cp, comm, ep, seq, workdir):
    sys.path.insert(0, path)
    from simumax.core.config import ModelConfig, StrategyConfig, SystemConfig
    from simumax.core.perf_llm import PerfLLM

    layers = SIMUMAX_MODELS[model]["layer_num"]
    strategy = {
        "seq_len": seq,
        "micro_batch_size": 1,
        "micro_batch_num": 1,
        "dtype": "bf16",
        "world_size": gpus,
        "tp_size": 1,
        "pp_size": 1,
        "ep_size": ep,
        "etp_size": 1,
        "cp_size": cp,
        "cp_comm_type": comm,
        "moe_dispatcher_policy": "all2all",
        "enable_sequence_parallel": False,
        "interleaving_size": 1,
        "zero_state": 1,
        "enable_dropout": False,
        "use_fused_norm": True,
        "use_math_sdp": False,
        "use_flash_sdp": True,
        "use_fp32_accum_grad": True,
        "enable_recompute": True,
        "recompute_granularity": "full_block",
        "recompute_layer_num": layers,
        "mem_factor": 0.94,
    }
    strategy_file = os.path.join(workdir, "strategy.json")
    model_file = os.path.join(workdir, "model.json")
    with open(strategy_file, "w") as f:
        json.dump(strategy, f)
    with open(model_file, "w") as f:
        json.dump(SIMUMAX_MODELS[model], f)
    perf = PerfLLM()
    perf.configure(
        strategy_config=StrategyConfig.init_from_config_file(strategy_file),
        model_config=ModelConfig.init_from_config_file(model_file),
        system_config=SystemConfig.init_from_config_file(
            os.path.join(path, "configs", "system", "b200_bf16_ceperm.json")
        ),
    )
    cwd = os.getcwd()
    os.chdir(workdir)  # SimuMax writes its result folders into the working directory
    try:
        perf.run_estimate()
        mem = json.loads(str(perf.analysis_mem()))
        cost = json.loads(str(perf.analysis_cost()))
    finally:
        os.chdir(cwd)
    chunk = perf.model_chunk_dict["first_stage_chunk"]
    loss_cache = sum(
        m._act_info.activation_mem_cache
        for m in chunk.children_ordered_module
        if type(m).__name__ == "ParallelCE"
    )
    detail = mem["model_mem_detail"]
    weight_gib = gib(detail["dense"]["detail"]["weight_bytes"]) + gib(
        detail["moe"]["detail"]["weight_bytes"]
    )
    return {
        "params_per_gpu": weight_gib * GIB / 2,  # bf16 weights
        "model_states_gib": gib(mem["model_mem"]),
        "activation_gib": gib(mem["peak_mem"]) - gib(mem["model_mem"]),
        "peak_gib": gib(mem["peak_mem"]),
        "step_s": seconds(cost["duration_time_per_iter"]),
        "breakdown": cost["breakdown_result"],
        "params": cost["param_numel_info"],
        "peak_path": mem.get("peak_path"),
        "forward_cache_gib": gib(mem["fwd_activation_cache_per_micro_batch"]),
        "loss_cache_gib": loss_cache / GIB,  # the cross-entropy's saved logits, in that cache
    }


def run_cpsim(binary, model, gpus, cp, comm, ep, seq):
    method = {"a2a": "ulysses", "p2p": "ring"}[comm]
    cmd = [
        binary,
        "simulate",
        "--model",
        model,
        "--hardware",
        "b200",
        "--gpus",
        str(gpus),
        "--gpus-per-node",
        "8",
        "--method",
        method,
        "--cp-degree",
        str(cp),
        "--impl",
        "megatron-core-cp",
        "--ep",
        str(ep),
        "--seq",
        str(seq),
        "--zero",
        "1",
        "--optimizer-offload",
        "off",
        "--ac",
        "full",
        "--ac-offload",
        "off",
        "--tiled-mlp",
        "off",
        "--fused-loss",
        "off",
        "--attention-kernel",
        "cudnn",
        "--json",
    ]
    if comm == "p2p":
        cmd += ["--ring-degree", str(cp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    out = json.loads(r.stdout)
    at_peak = out["memory_breakdown_bytes"]
    states = at_peak["model_states"] / GIB
    peak = out["peak_memory_bytes"] / GIB
    return {
        "model_states_gib": states,
        "activation_gib": peak - states,
        "peak_gib": peak,
        "step_s": out["step_time_s"],
        "at_peak_gib": {k: v / GIB for k, v in at_peak.items()},
        "peak_op": out["peak"]["op"],
        "stream_busy_s": out["stream_busy_s"],
        "exposed_non_compute_s": out["exposed_non_compute_s"],
        "command": " ".join(cmd[1:]),
    }


def table(rows):
    lines = ["| case | quantity | SimuMax | cpsim | cpsim / SimuMax |", "|---|---|---:|---:|---:|"]
    for r in rows:
        sm, cs = r["simumax"], r["cpsim"]
        for key, name, unit in (
            ("model_states_gib", "model states", "GiB"),
            ("activation_gib", "peak - model states", "GiB"),
            ("peak_gib", "peak", "GiB"),
            ("step_s", "step time", "s"),
        ):
            ratio = cs[key] / sm[key] if sm[key] else float("nan")
            lines.append(
                f"| {r['case']} | {name} | {sm[key]:.2f} {unit} | {cs[key]:.2f} {unit} "
                f"| {ratio:.3f} |"
            )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--simumax", required=True, help="a SimuMax checkout")
    ap.add_argument("--cpsim", default=os.path.join(ROOT, "build", "cpsim"))
    ap.add_argument("--json", help="write every number here")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for label, model, gpus, cp, comm, ep, seq in CASES:
            sm = run_simumax(os.path.abspath(a.simumax), model, gpus, cp, comm, ep, seq, work)
            cs = run_cpsim(a.cpsim, model, gpus, cp, comm, ep, seq)
            rows.append({"case": label, "simumax": sm, "cpsim": cs})
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
