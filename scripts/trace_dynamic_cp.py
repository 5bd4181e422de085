"""Trace Megatron-LM's dynamic-CP scheduler (its `dev` branch, not in a megatron-core release) on
the documents of cpsim's sampled steps, for cpsim's test of its own port
(DynamicCp.ScheduleIsTheTracedUpstreamSchedule).

The scheduler's functions are read from a Megatron-LM checkout given by path (a git directory or
a work tree) and run as they are; nothing of them is written out but their answers. Each case:
cpsim samples and packs the steps (`simulate --balancer dynamic-cp --json`), the upstream
`DefaultDynamicCPScheduler` loop (sorted longest first, `next_hdp_group_packing_aware` until no
document is left) schedules every step's documents, and the trace keeps the documents and, per
micro-batch and rank, the documents' lengths.

    python scripts/trace_dynamic_cp.py --checkout PATH [--commit SHA] [--cpsim build/cpsim]
"""

import argparse
import ast
import datetime
import json
import os
import subprocess
from functools import lru_cache
from math import ceil, log2
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "megatron/core/datasets/data_schedule_utils.py"
FUNCTIONS = ("dcp_gpus_needed", "next_hdp_group_packing_aware")
CONSTANT = "_DYNAMIC_CP_WORKLOAD_CAP_DELTA"
OUT = os.path.join(ROOT, "data", "schedules", "megatron-dynamic-cp.json")

CASES = [
    # gpus, cp degree, pack, lengths, packing, batches
    (8, 8, "128K", "lognormal:median=8K,sigma=1.2", "concat", 30),
    (8, 4, "64K", "lognormal:median=2K,sigma=1.5", "greedy", 30),
    (16, 8, "128K", "lognormal:median=16K,sigma=1.0", "first-fit", 20),
    (32, 8, "256K", "lognormal:median=4K,sigma=2.0,max=256K", "concat", 10),
    (8, 8, "128K", "lognormal:median=6K,sigma=0.3", "concat", 10),
]


def upstream_source(checkout, commit):
    if os.path.isfile(os.path.join(checkout, SOURCE)):
        with open(os.path.join(checkout, SOURCE), encoding="utf-8") as f:
            return f.read()
    return subprocess.run(
        ["git", f"--git-dir={checkout}", "show", f"{commit}:{SOURCE}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def upstream_scheduler(source):
    """The scheduler's functions and constant from `source`, compiled on their own."""
    tree = ast.parse(source)
    keep = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS)
        or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == CONSTANT for t in node.targets)
        )
    ]
    assert len(keep) == len(FUNCTIONS) + 1, "the scheduler's functions moved"
    namespace = {
        "lru_cache": lru_cache,
        "ceil": ceil,
        "log2": log2,
        "Dict": Dict,
        "List": List,
        "Optional": Optional,
        "Tuple": Tuple,
    }
    exec(compile(ast.Module(body=keep, type_ignores=[]), SOURCE, "exec"), namespace)
    return namespace["next_hdp_group_packing_aware"]


def schedule(next_group, documents, ranks, max_tokens_per_rank):
    """DefaultDynamicCPScheduler.get_groups_and_subsamples without pipeline stages."""
    pending = sorted(enumerate(documents), key=lambda x: x[1], reverse=True)
    rounds = []
    while pending:
        _, pending, _, ids = next_group(pending, ranks, max_tokens_per_rank, 1)
        rounds.append([[documents[i] for i in per_rank] for per_rank in ids])
    return rounds


def cpsim_steps(cpsim, gpus, cp, pack, lengths, packing, batches):
    args = [cpsim, "simulate", "--model", "llama3-8b", "--method", "ring"]
    args += ["--impl", "megatron-core-cp", "--gpus", str(gpus), "--cp-degree", str(cp)]
    args += ["--lengths", lengths, "--pack", pack, "--packing", packing]
    args += ["--batches", str(batches), "--balancer", "dynamic-cp", "--json"]
    answer = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    (study,) = answer["balancers"]
    steps = []
    for rounds in study["cp_groups_per_batch"]:
        steps.append([d for groups in rounds for g in groups for d in g["documents"]])
    return answer["sequence_tokens"], steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", required=True, help="Megatron-LM git directory or work tree")
    parser.add_argument("--commit", default="d48bd6be0a85cc0d6d3cc71e8750cf357cc6bdb1")
    parser.add_argument("--cpsim", default=os.path.join(ROOT, "build", "cpsim"))
    parser.add_argument("--out", default=OUT)
    a = parser.parse_args()
    next_group = upstream_scheduler(upstream_source(a.checkout, a.commit))
    cases = []
    for gpus, cp, pack, lengths, packing, batches in CASES:
        sequence_tokens, steps = cpsim_steps(a.cpsim, gpus, cp, pack, lengths, packing, batches)
        max_tokens_per_rank = sequence_tokens // cp
        for documents in steps:
            cases.append(
                {
                    "ranks": gpus,
                    "max_tokens_per_rank": max_tokens_per_rank,
                    "documents": documents,
                    "rounds": schedule(next_group, documents, gpus, max_tokens_per_rank),
                }
            )
    trace = {
        "source": {
            "repository": "NVIDIA/Megatron-LM",
            "branch": "dev",
            "commit": a.commit,
            "file": SOURCE,
            "functions": list(FUNCTIONS),
            "loop": "megatron/core/datasets/data_schedule.py DefaultDynamicCPScheduler."
            "get_groups_and_subsamples (min_cp_size 1, no virtual pipeline stages)",
        },
        "traced_on": datetime.date.today().isoformat(),
        "how": "scripts/trace_dynamic_cp.py: documents sampled by cpsim, scheduled by the "
        "upstream functions; rounds are micro-batches, each a list per rank of the lengths of "
        "the documents it runs packed",
        "cases": cases,
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"))
        f.write("\n")
    print(f"{len(cases)} steps traced to {a.out}")


if __name__ == "__main__":
    main()
