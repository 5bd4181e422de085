#!/usr/bin/env python3
"""`calibrate run --mpi` under a real mpirun (4 ranks on two fake nodes of 2), NCCL faked below
its calls (fake_rank_main.cpp): the unique-id broadcast per group, the node / world / one-per-node
communicators, the maximum over ranks, rank 0 alone writing, a failing rank, a hung wait
(deadline + ncclCommAbort), a rank hung outside any deadline (rank 0 writes, MPI_Abort), and
`cpsim calibrate fit` of the file filling the inter_node curves. Exit 77 (skipped) without mpirun
or without MPI in the build."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

SKIP = 77
OPS = ["all_to_all", "all_gather", "reduce_scatter", "all_reduce", "send_recv"]
SIZES = [1 << e for e in range(10, 25, 2)]


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def effective_size(op, ranks, size):
    """calibrate/include/cpsim/calibrate/run_control.hpp effective_collective_size."""
    if op == "all_to_all":
        return size // ranks // 2 * 2 * ranks
    if op in ("all_gather", "reduce_scatter"):
        return size // (2 * ranks) * 2 * ranks
    if op == "all_reduce":
        return size // 2 * 2
    return size


def expected_time(nodes, size, in_place):
    """The fake's time per call of the slowest rank (world rank 3: skew 1 + 0.25 * 3)."""
    alpha, bandwidth = (8e-6, 150e9) if nodes == 1 else (25e-6, 20e9)
    return (alpha + size / bandwidth) * 1.75 * (0.97 if in_place else 1.0)


class Runner:
    def __init__(self, args):
        self.args = args
        self.env = dict(os.environ, CPSIM_CALIBRATE_MPI_RANKS_PER_NODE="2")
        version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
        if "Open MPI" in version or "OpenRTE" in version:
            # Containers often forbid the cross-memory attach of Open MPI's shared-memory transport.
            self.env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
            self.mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4"]
        else:  # MPICH's hydra and others: no such flags
            self.mpirun = ["mpirun", "-np", "4"]

    def fake(self, name, *extra):
        work = os.path.join(self.args.work, name)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        out = os.path.join(work, "raw.json")
        start = time.monotonic()
        proc = subprocess.run(
            self.mpirun + [self.args.fake, "--out", out, "--report", work] + list(extra),
            env=self.env, capture_output=True, text=True, timeout=90)
        elapsed = time.monotonic() - start
        reports = {}
        for rank in range(4):
            path = os.path.join(work, "rank%d.txt" % rank)
            if os.path.exists(path):
                with open(path) as f:
                    reports[rank] = f.read().split("\n")
        raw = None
        if os.path.exists(out):
            with open(out) as f:
                raw = json.load(f)
        print("%s: exit %d after %.1f s" % (name, proc.returncode, elapsed))
        return proc, raw, reports, work, elapsed


def collective_record(raw):
    return next(s for s in raw["context"]["sweeps"] if s["name"] == "collectives")


def check_normal(runner):
    proc, raw, reports, work, _ = runner.fake("normal")
    check(proc.returncode == 0, "normal run exits %d: %s %s" % (proc.returncode, proc.stdout,
                                                                 proc.stderr))
    check(raw is not None, "normal run wrote no file")
    mpi = raw["context"]["mpi"]
    check(mpi["ranks"] == 4 and mpi["nodes"] == 2 and mpi["ranks_per_node"] == 2,
          "context.mpi %s" % mpi)
    check(raw["context"]["gpu_count"] == 4, "gpu_count %s" % raw["context"]["gpu_count"])
    check(collective_record(raw)["status"] == "done", "status %s" % collective_record(raw))
    check(not os.path.exists(os.path.join(work, "raw.json.tmp")), "temporary file left")

    # Rank 0 alone writes: the context, then after each of the 3 groups.
    for rank in range(4):
        check(rank in reports, "rank %d wrote no report" % rank)
        writes = [line for line in reports[rank] if line.startswith("writes ")]
        check(writes == ["writes %d" % (4 if rank == 0 else 0)],
              "rank %d: %s" % (rank, writes))

    # Unique ids: every group's ranks hold the id its root (group rank 0) made and broadcast.
    expected_ids = {
        0: {0: ("fake-id:0:0", 2, 0), 1: ("fake-id:0:0", 2, 1),
            2: ("fake-id:2:0", 2, 0), 3: ("fake-id:2:0", 2, 1)},   # each node
        1: {r: ("fake-id:0:1", 4, r) for r in range(4)},             # all ranks
        2: {0: ("fake-id:0:2", 2, 0), 2: ("fake-id:0:2", 2, 1),
            1: ("fake-id:1:0", 2, 0), 3: ("fake-id:1:0", 2, 1)},   # one rank per node
    }
    for rank in range(4):
        opens = [line.split() for line in reports[rank] if line.startswith("open ")]
        check(len(opens) == 3, "rank %d opened %d groups" % (rank, len(opens)))
        for _, group, ranks, group_rank, uid in opens:
            want = expected_ids[int(group)][rank]
            check((uid, int(ranks), int(group_rank)) == want,
                  "rank %d group %s: id %s ranks %s rank %s, expected %s" %
                  (rank, group, uid, ranks, group_rank, want))

    # Samples: every group, op, size, both halves; time = the slowest rank's.
    samples = raw["samples"]["collectives"]
    keys = set()
    for s in samples:
        nodes = s.get("nodes", 1)
        in_place = s.get("in_place", False)
        keys.add((s["ranks"], nodes, s["op"], s["size_bytes"], in_place))
        want = expected_time(nodes, s["size_bytes"], in_place)
        check(abs(s["time_s"] / want - 1.0) < 1e-9,
              "%s: time %.9g, expected the slowest rank's %.9g" % (s, s["time_s"], want))
    want_keys = set()
    for ranks, nodes in ((2, 1), (4, 2), (2, 2)):
        for op in OPS:
            for size in SIZES:
                eff = effective_size(op, ranks, size)
                if eff > 0:
                    for in_place in (False, True):
                        want_keys.add((ranks, nodes, op, eff, in_place))
    check(keys == want_keys, "sample set differs: missing %s, extra %s" %
          (sorted(want_keys - keys)[:5], sorted(keys - want_keys)[:5]))
    return os.path.join(work, "raw.json")


def check_fit(runner, raw_path):
    profile = os.path.join(os.path.dirname(raw_path), "profile.json")
    proc = subprocess.run([runner.args.cpsim, "calibrate", "fit", raw_path, "--out", profile],
                          capture_output=True, text=True, timeout=60)
    check(proc.returncode == 0, "fit exits %d: %s %s" % (proc.returncode, proc.stdout,
                                                         proc.stderr))
    check("collectives.inter_node: no samples across nodes" not in proc.stdout,
          "fit kept inter_node from the base:\n" + proc.stdout)
    with open(profile) as f:
        p = json.load(f)
    check(p["node"]["gpus_per_node"]["value"] == 2, "gpus_per_node %s" % p["node"]["gpus_per_node"])
    for span, bandwidth, ranks in (("inter_node", 20e9, 4), ("intra_node", 150e9, 2)):
        for op in OPS:
            curve = p["collectives"][span][op]
            source = curve["peak_busbw_bytes_per_s"]["source"]
            check(source.startswith("measured"), "%s.%s source: %s" % (span, op, source))
            check(("%d ranks" % ranks) in source, "%s.%s not from %d ranks: %s" %
                  (span, op, ranks, source))
            # The fake is pure alpha-beta: busbw = bandwidth x busbw factor / the slowest rank's
            # skew.
            n = ranks
            factor = {"all_reduce": 2 * (n - 1) / n, "send_recv": 1.0}.get(op, (n - 1) / n)
            peak = curve["peak_busbw_bytes_per_s"]["value"]
            want = bandwidth * factor / 1.75
            check(abs(peak / want - 1.0) < 0.01, "%s.%s peak busbw %.4g, expected about %.4g" %
                  (span, op, peak, want))
        # The one-rank-per-node group is a per-group curve of the inter-node span.
        if span == "inter_node":
            by = p["collectives"][span]["all_gather"].get("by_ranks", {})
            check("2" in by, "inter_node.all_gather.by_ranks: %s" % list(by))


def check_failing_rank(runner):
    proc, raw, reports, _, _ = runner.fake("fail", "--fail", "2:1:all_gather:4096")
    check(proc.returncode == 1, "a failing rank: exit %d" % proc.returncode)
    record = collective_record(raw)
    check(record["status"] == "failed", "status %s" % record["status"])
    notes = " ".join(record["notes"])
    check("rank 2" in notes and "asynchronous NCCL error" in notes and "ncclCommAbort" in notes,
          "notes: %s" % notes)
    check("skipped: 2 ranks, one per node" in notes, "later group not skipped: %s" % notes)
    kinds = {(s["ranks"], s.get("nodes", 1), s["op"]) for s in raw["samples"]["collectives"]}
    check((4, 2, "all_to_all") in kinds and (2, 1, "send_recv") in kinds,
          "samples before the failure lost: %s" % kinds)
    gathers = {s["size_bytes"] for s in raw["samples"]["collectives"]
               if (s["ranks"], s.get("nodes", 1), s["op"]) == (4, 2, "all_gather")}
    check(gathers == {1024}, "all_gather sizes kept: %s (1 KiB came before the failure)" % gathers)
    check((4, 2, "reduce_scatter") not in kinds and (2, 2, "all_to_all") not in kinds,
          "samples after the failure: %s" % kinds)
    for rank in range(4):
        check("abort 1" in reports.get(rank, []), "rank %d did not abort group 1" % rank)


def check_hung_wait(runner):
    proc, raw, reports, _, elapsed = runner.fake("hang", "--hang", "3:2:send_recv:1048576")
    check(proc.returncode == 1, "a hung wait: exit %d" % proc.returncode)
    check(elapsed < 30, "a hung wait took %.0f s" % elapsed)
    record = collective_record(raw)
    check(record["status"] == "timed_out", "status %s" % record["status"])
    notes = " ".join(record["notes"])
    check("rank 3" in notes and "timed out (not complete after 1 s)" in notes, "notes: %s" % notes)
    for rank in range(4):
        check("abort 2" in reports.get(rank, []), "rank %d did not abort group 2" % rank)


def check_blocked_rank(runner):
    proc, raw, _, _, elapsed = runner.fake("block", "--block", "1:0:all_reduce:65536")
    check(proc.returncode != 0, "a blocked rank exits 0")
    check(elapsed < 30, "a blocked rank took %.0f s (the agreement deadline is 2 s)" % elapsed)
    check(raw is not None, "rank 0 wrote nothing before MPI_Abort")
    record = collective_record(raw)
    check(record["status"] == "timed_out", "status %s" % record["status"])
    notes = " ".join(record["notes"])
    check("not every rank answered" in notes and "MPI_Abort" in notes, "notes: %s" % notes)
    check(any(s["op"] == "reduce_scatter" for s in raw["samples"]["collectives"]),
          "samples before the hang lost")


def check_cli(runner):
    """cpsim itself under mpirun: without a usable CUDA backend every rank refuses, rank 0 says
    why in one line."""
    out = os.path.join(runner.args.work, "cli.json")
    proc = subprocess.run(runner.mpirun + [runner.args.cpsim, "calibrate", "run", "--mpi", "--out",
                                           out, "--collective-timeout", "5"],
                          env=runner.env, capture_output=True, text=True, timeout=90)
    # mpirun's own lines may land inside the error line: count, do not parse lines.
    check(proc.returncode == 2, "cpsim --mpi without a usable GPU backend exits %d" %
          proc.returncode)
    check(proc.stderr.count("cpsim: error:") == 1 and "--mpi: rank 0, 1, 2, 3: " in proc.stderr,
          "expected one error naming every rank: %s" % proc.stderr)
    check(not os.path.exists(out), "a file was written")
    # Nodes of 3 and 1 ranks: refused on every rank before any GPU is opened.
    uneven = dict(runner.env, CPSIM_CALIBRATE_MPI_RANKS_PER_NODE="3")
    proc = subprocess.run(runner.mpirun + [runner.args.cpsim, "calibrate", "run", "--mpi", "--out",
                                           out],
                          env=uneven, capture_output=True, text=True, timeout=90)
    check(proc.returncode == 2 and proc.stderr.count("cpsim: error:") == 1 and
          "--mpi: the nodes run between 1 and 3 ranks" in proc.stderr,
          "uneven nodes: exit %d, %s" % (proc.returncode, proc.stderr))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fake", required=True)
    parser.add_argument("--cpsim", required=True)
    parser.add_argument("--have-mpi", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    if args.have_mpi.upper() not in ("ON", "1", "TRUE"):
        print("skipped: this build has no MPI (calibrate run --mpi not built)")
        return SKIP
    if shutil.which("mpirun") is None:
        print("skipped: no mpirun on PATH")
        return SKIP
    os.makedirs(args.work, exist_ok=True)
    runner = Runner(args)
    raw_path = check_normal(runner)
    check_fit(runner, raw_path)
    check_failing_rank(runner)
    check_hung_wait(runner)
    check_blocked_rank(runner)
    check_cli(runner)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
