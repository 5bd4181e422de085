#!/usr/bin/env python3
"""Runs one attention block of a CP implementation's own code as rank 0 of a C-rank group, on the
CPU, and writes every allocation and free it made (schema cpsim.alloc-trace/1).

    .venv/bin/python calibrate/tracer/trace.py --impl yunchang-usp --shape NAME --out t.json
    .venv/bin/python calibrate/tracer/trace.py --list

One trace per process: the process group (PyTorch's fake backend: collectives return at once with
the right shapes) is set up once. Each implementation is a driver in cpsim_tracer/drivers/ (see
cpsim_tracer/drivers/__init__.py for what a driver provides); docs/TRACING.md says what is traced
and what stays read from source.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SCHEMA = "cpsim.alloc-trace/1"


def main(argv: list[str] | None = None) -> int:
    from cpsim_tracer import drivers

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", help="implementation, as cpsim's --impl spells it")
    parser.add_argument("--shape", help="one of the driver's shapes (--list shows them)")
    parser.add_argument("--out", help="output JSON file ('-': standard output)")
    parser.add_argument("--list", action="store_true", help="list implementations and shapes")
    args = parser.parse_args(argv)

    if args.list:
        for name, module in sorted(drivers.all_drivers().items()):
            print(name + ": " + ", ".join(s["name"] for s in module.SHAPES))
        return 0
    if not (args.impl and args.shape and args.out):
        parser.error("--impl, --shape and --out are required (or --list)")
    try:
        module = drivers.load(args.impl)
    except KeyError as e:
        print(f"trace: --impl: {e.args[0]}", file=sys.stderr)
        return 2
    shapes = {s["name"]: s for s in module.SHAPES}
    if args.shape not in shapes:
        print(f"trace: --shape: {args.shape!r} is not one of {sorted(shapes)}", file=sys.stderr)
        return 2
    trace = run_trace(module, shapes[args.shape])
    text = json.dumps(trace, indent=1, sort_keys=True) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        tmp = args.out + ".tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, args.out)
        except OSError as e:
            print(f"trace: {args.out}: {e.strerror}", file=sys.stderr)
            return 1
    return 0


def run_trace(module, shape: dict) -> dict:
    """Sets up the recorder, the flash_attn stand-in and the process group, runs the driver."""
    from cpsim_tracer import flash_stand_in
    from cpsim_tracer.recorder import AllocationRecorder, packages

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    recorder = AllocationRecorder()
    flash_stand_in.install(recorder)

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    world = module.world_size(shape)
    rank = shape.get("rank", 0)  # the traced rank; 0 unless the shape names another
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        module.run(recorder, shape)
    finally:
        dist.destroy_process_group()

    events = [e.to_json() for e in recorder.events]
    for e in events:
        if e["event"] == "alloc":
            e["row"] = module.classify(e, shape) or ""
    return {
        "schema": SCHEMA,
        "implementation": module.IMPLEMENTATION,
        "shape": shape,
        "world_size": world,
        "rank": rank,
        "packages": packages(module.PACKAGES),
        "stand_ins": module.STAND_INS,
        "events": events,
        "op_counts": recorder.op_counts_json(),
    }


if __name__ == "__main__":
    sys.exit(main())
