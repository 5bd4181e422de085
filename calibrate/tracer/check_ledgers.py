#!/usr/bin/env python3
"""Checks each implementation's allocation ledger (docs/implementations/<impl>.md) against the
traces of its own code (data/traces/<impl>/<shape>.json), row by row.

For every ledger row and traced shape where cpsim applies the row, the allocations the driver
classified as that row are followed through the row's phase: at each allocation inside an entry
into the row's site (one all-to-all, one ring step, ...), the bytes of the row's tensors live at
that moment. The most of them over the site's entries is compared with the row's bytes at that
shape: a row is what cpsim's op at that site holds at its peak, and where the code enters the
site several times (k and v in two all-to-alls, ring steps of different sizes) the op stands for
the largest entry. Each entry's figure is kept in the result. A row is
  traced       when every applicable shape has some and its most equals the ledger's bytes,
  differs      when one does not (or a shape has none while others have some),
  source_read  when no trace has an allocation of it (a kernel's internal workspace, a caller's
               tensors made before the traced code runs, a path the traces do not take).
A driver may trace shapes that are not what cpsim models (another rank, a rotation cpsim does not
model), to show what else the code does: such a shape says `"ledger_check": false` and why, and is
listed, not compared. The result is data/traces/<impl>/ledger_check.json, which `cpsim
implementations` reads.

    check_ledgers.py --write             recompute every ledger_check.json from the traces
    check_ledgers.py --check             fail (exit 1) when a committed ledger_check.json is stale
    check_ledgers.py --check --retrace   also run every trace again and fail when the installed
                                         code no longer allocates what the committed trace says
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACER = os.path.join(ROOT, "calibrate", "tracer", "trace.py")
SCHEMA = "cpsim.ledger-check/1"

# Which phase a site's rows are counted in (forward rows also run again in a recompute).
BACKWARD_SITES = {
    "dout_exchange",
    "core_backward",
    "grad_finish",
    "dq_exchange",
    "dkv_exchange",
    "ring_backward_step",
    "held_through_backward",
}


def parse_ledger(path: str) -> list[dict]:
    """The rows of the table under '<!-- ledger rows' in a ledger document."""
    rows = []
    with open(path) as f:
        lines = f.read().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("<!-- ledger rows"))
    for line in lines[start + 3 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append({"id": cells[0], "site": cells[1], "when": cells[2], "bytes": cells[3]})
    return rows


_TERM = re.compile(r"^(\d+)·(sHd|sHkv·d|sHkv_m·d|sH)$")


def formula_bytes(formula: str, units: dict) -> int:
    """'2·sHd + 4·sHkv·d' at the shape's element counts."""
    if formula == "0":
        return 0
    total = 0
    for term in formula.split(" + "):
        m = _TERM.match(term.strip())
        if not m:
            raise ValueError(f"ledger formula term {term!r} not understood")
        total += int(m.group(1)) * units[m.group(2)]
    return total


def shape_units(shape: dict) -> dict:
    """Element counts of one rank: s = N/C tokens, H heads, Hkv KV heads after any replication
    to the Ulysses degree (cpsim's LedgerUnits), Hkv_m the model's, d the head dimension; the
    driver states them in the shape's "ledger_units" when its ledger counts another s (FPDT: one
    chunk)."""
    if "ledger_units" in shape:
        u = shape["ledger_units"]
        s, h, hkv, d = u["s"], u["heads"], u["kv_heads"], u["head_dim"]
        hkv_m = u.get("model_kv_heads", hkv)
    else:
        c = shape.get("ulysses", 1) * shape.get("ring", 1)
        s, h, d = shape["seq"] // c, shape["heads"], shape["head_dim"]
        hkv_m = shape["kv_heads"]
        hkv = max(hkv_m, shape.get("ulysses", 1))
    return {"sHd": s * h * d, "sHkv·d": s * hkv * d, "sHkv_m·d": s * hkv_m * d, "sH": s * h}


# Sites whose rows cpsim applies only at ring degree 1: with a ring part the ring scheme's ops
# replace the single kernel call and what follows it (sim/src/attention_core.cpp).
RING_DEGREE_1_SITES = {"core_forward", "core_backward", "grad_finish"}


def row_applies(row: dict, shape: dict) -> bool:
    u = shape.get("ulysses", 1)
    if shape.get("ring", 1) > 1 and row["site"] in RING_DEGREE_1_SITES:
        return False
    when = row["when"]
    if when == "always":
        return True
    if when == "u > 1":
        return u > 1
    if when == "hkv/u > 1":
        return u > 1 and shape["kv_heads"] // u > 1
    if when == "hkv/u > 1, any u":
        return shape["kv_heads"] // u > 1
    if when == "h/u > 1":
        return u > 1 and shape["heads"] // u > 1
    raise ValueError(f"ledger 'when' {when!r} not understood")


# Rows held across the block (or the backward), not the workspace of one op: their tensors are
# followed through the whole phase, as one entry.
HELD_SITES = {"held_through_block", "held_through_backward", "ring_forward_held"}


def occurrences(trace: dict, row: dict) -> list[int]:
    """Per entry into the row's site, in the row's phase: the most bytes of the row's tensors
    live at once at an allocation inside that entry (a ledger row is the workspace its op holds
    at its peak; a row's tensor made at an earlier site and still live counts too)."""
    phase = "backward" if row["site"] in BACKWARD_SITES else "forward"
    sizes: dict[int, int] = {}  # the row's live allocations: id -> bytes
    live = 0
    peak: dict[int, int] = {}
    for e in trace["events"]:
        if e["event"] == "alloc":
            if e.get("row") == row["id"] and e["phase"] == phase:
                sizes[e["id"]] = e["bytes"]
                live += e["bytes"]
            at_site = e["site"] == row["site"] or row["site"] in HELD_SITES
            if at_site and e["phase"] == phase and live > 0:
                entry = 0 if row["site"] in HELD_SITES else e["site_seq"]
                peak[entry] = max(peak.get(entry, 0), live)
        elif e["id"] in sizes:
            live -= sizes.pop(e["id"])
    return [peak[k] for k in sorted(peak)]


def check_implementation(impl: str, trace_dir: str) -> dict:
    ledger = parse_ledger(os.path.join(ROOT, "docs", "implementations", impl + ".md"))
    names = sorted(
        f for f in os.listdir(trace_dir) if f.endswith(".json") and f != "ledger_check.json"
    )
    traces = []
    for name in names:
        with open(os.path.join(trace_dir, name)) as f:
            traces.append(json.load(f))
    rows = []
    for row in ledger:
        per_shape = []
        for t in traces:
            shape = t["shape"]
            if not shape.get("ledger_check", True) or not row_applies(row, shape):
                continue
            expected = formula_bytes(row["bytes"], shape_units(shape))
            seen = occurrences(t, row)
            per_shape.append(
                {
                    "shape": shape["name"],
                    "ledger_bytes": expected,
                    "traced_bytes": max(seen) if seen else None,
                    "traced_bytes_per_entry": seen,
                }
            )
        present = [p for p in per_shape if p["traced_bytes"] is not None]
        if not present:
            status = "source_read"
        elif all(p["traced_bytes"] == p["ledger_bytes"] for p in per_shape):
            status = "traced"
        else:
            status = "differs"
        rows.append({"id": row["id"], "site": row["site"], "status": status, "shapes": per_shape})
    unclassified = []
    for t in traces:
        for e in t["events"]:
            if e["event"] == "alloc" and not e.get("row"):
                unclassified.append(
                    {
                        "shape": t["shape"]["name"],
                        "seq": e["seq"],
                        "bytes": e["bytes"],
                        "site": e["site"],
                        "phase": e["phase"],
                        "frame": e["frame"],
                    }
                )
    counts = {
        k: sum(1 for r in rows if r["status"] == k) for k in ("traced", "differs", "source_read")
    }
    return {
        "schema": SCHEMA,
        "implementation": impl,
        "packages": traces[0]["packages"] if traces else {},
        "shapes": [t["shape"]["name"] for t in traces if t["shape"].get("ledger_check", True)],
        # Traced to show what else the code does, not what cpsim models: not compared.
        "shapes_not_checked": [
            {"shape": t["shape"]["name"], "why": t["shape"]["ledger_check_skipped_because"]}
            for t in traces
            if not t["shape"].get("ledger_check", True)
        ],
        "counts": counts,
        "rows": rows,
        "unclassified_allocations": unclassified,
    }


def retrace(impl: str, trace_dir: str) -> list[str]:
    """Runs every committed trace again; the differences, one line each."""
    problems = []
    for name in sorted(
        f for f in os.listdir(trace_dir) if f.endswith(".json") and f != "ledger_check.json"
    ):
        path = os.path.join(trace_dir, name)
        with open(path) as f:
            committed = f.read()
        shape = json.loads(committed)["shape"]["name"]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "t.json")
            r = subprocess.run(
                [sys.executable, TRACER, "--impl", impl, "--shape", shape, "--out", out],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if r.returncode != 0:
                problems.append(f"{impl} {shape}: the tracer failed: {r.stderr.strip()[-400:]}")
                continue
            with open(out) as f:
                fresh = f.read()
        if fresh != committed:
            a, b = json.loads(committed)["events"], json.loads(fresh)["events"]
            pairs = enumerate(zip(a, b, strict=False))
            first = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
            where = os.path.relpath(path, ROOT)
            problems.append(
                f"{impl} {shape}: the code allocates differently from {where} "
                f"(first at event {first}: {a[first] if first < len(a) else 'none'} -> "
                f"{b[first] if first < len(b) else 'none'})"
            )
    return problems


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every ledger_check.json")
    mode.add_argument("--check", action="store_true", help="fail when one is stale")
    parser.add_argument("--retrace", action="store_true", help="run every trace again and compare")
    parser.add_argument("--traces", default=os.path.join(ROOT, "data", "traces"))
    parser.add_argument("--impl", action="append", help="only these implementations")
    args = parser.parse_args(argv)

    problems = []
    impls = sorted(
        d for d in os.listdir(args.traces) if os.path.isdir(os.path.join(args.traces, d))
    )
    for impl in impls:
        if args.impl and impl not in args.impl:
            continue
        trace_dir = os.path.join(args.traces, impl)
        if args.retrace:
            problems += retrace(impl, trace_dir)
        result = check_implementation(impl, trace_dir)
        path = os.path.join(trace_dir, "ledger_check.json")
        text = dumps(result)
        if args.write:
            with open(path, "w") as f:
                f.write(text)
        else:
            try:
                with open(path) as f:
                    committed = f.read()
            except OSError:
                committed = ""
            if committed != text:
                problems.append(
                    f"{os.path.relpath(path, ROOT)} is stale: run check_ledgers.py --write"
                )
        c = result["counts"]
        unclassified = len(result["unclassified_allocations"])
        print(
            f"{impl}: {len(result['shapes'])} shapes; rows traced {c['traced']}, "
            f"differ {c['differs']}, source-read {c['source_read']}; "
            f"unclassified allocations {unclassified}"
        )
        for r in result["rows"]:
            if r["status"] == "differs":
                detail = "; ".join(
                    f"{p['shape']}: ledger {p['ledger_bytes']} B, "
                    f"traced {p['traced_bytes'] if p['traced_bytes'] is not None else 'none'}"
                    for p in r["shapes"]
                )
                print(f"  row {r['id']} ({r['site']}) differs: {detail}")
    for p in problems:
        print("check_ledgers: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
