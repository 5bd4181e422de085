"""cpsim's hybrid-CP schedule against Megatron-Core's own scheduler, run here on the CPU from the
pinned package (megatron-core 0.16.1, `BalancedCPScheduler.get_groups_and_subsamples`).

For each case cpsim samples and packs the batches (`simulate --balancer hybrid-cp --json`); the
documents of every step go to the upstream scheduler with the same DP x CP rank count and
max_seqlen_per_dp_cp_rank (S / C), and its rounds (per rank, the documents it runs) must be
cpsim's, document for document.

Environment: CPSIM_BIN (the cpsim executable; default build/cpsim).
"""

import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPSIM = os.path.abspath(os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim")))

hybrid_cp_schedule = pytest.importorskip("megatron.core.pipeline_parallel.hybrid_cp_schedule")

CASES = [
    # gpus, cp degree, pack, lengths, packing, batches
    (8, 8, "128K", "lognormal:median=8K,sigma=1.2", "concat", 40),
    (8, 4, "64K", "lognormal:median=2K,sigma=1.5", "greedy", 40),
    (16, 8, "128K", "lognormal:median=16K,sigma=1.0", "first-fit", 20),
    (32, 8, "256K", "lognormal:median=4K,sigma=2.0,max=256K", "concat", 10),
    # Rounds closed early by the 5 % balance slack (a slack of 15 % schedules these differently).
    (8, 8, "128K", "lognormal:median=6K,sigma=0.3", "concat", 10),
]


class _Group:
    """What BalancedCPScheduler asks of its dp_cp_group: its size."""

    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def cpsim_rounds(gpus, cp, pack, lengths, packing, batches):
    out = subprocess.run(
        [
            CPSIM,
            "simulate",
            "--model",
            "llama3-8b",
            "--method",
            "ring",
            "--impl",
            "megatron-core-cp",
            "--gpus",
            str(gpus),
            "--cp-degree",
            str(cp),
            "--lengths",
            lengths,
            "--pack",
            pack,
            "--packing",
            packing,
            "--batches",
            str(batches),
            "--balancer",
            "hybrid-cp",
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    answer = json.loads(out.stdout)
    (study,) = answer["balancers"]
    return answer["sequence_tokens"], study["cp_groups_per_batch"]


def per_rank(rounds, ranks):
    """Per round, per rank: the documents' lengths it runs, in order."""
    out = []
    for groups in rounds:
        table = [None] * ranks
        for g in groups:
            for r in range(g["first_rank"], g["first_rank"] + g["cp"]):
                table[r] = list(g["documents"])
        out.append(table)
    return out


def upstream_rounds(documents, ranks, max_tokens_per_rank):
    scheduler = hybrid_cp_schedule.BalancedCPScheduler(max_tokens_per_rank, _Group(ranks))
    samples = list(enumerate(documents))
    _, sample_id_groups = scheduler.get_groups_and_subsamples(samples, None)
    return [[[documents[i] for i in ids] for ids in group] for group in sample_id_groups]


@pytest.mark.parametrize("gpus,cp,pack,lengths,packing,batches", CASES)
def test_schedule_is_megatron_cores(gpus, cp, pack, lengths, packing, batches):
    sequence_tokens, batches_rounds = cpsim_rounds(gpus, cp, pack, lengths, packing, batches)
    ranks = gpus  # DP x CP without TP or PP
    compared, several_rounds, groups_of_sizes = 0, 0, set()
    for rounds in batches_rounds:
        ours = per_rank(rounds, ranks)
        documents = [d for groups in rounds for g in groups for d in g["documents"]]
        theirs = upstream_rounds(documents, ranks, sequence_tokens // cp)
        assert ours == theirs
        compared += len(documents)
        several_rounds += len(rounds) > 1
        groups_of_sizes.update(g["cp"] for groups in rounds for g in groups)
    # The scheduler had work to do: several documents a step, steps of several rounds, groups of
    # several sizes.
    assert compared > 2 * batches
    assert several_rounds > 0
    assert len(groups_of_sizes) > 1
