#!/usr/bin/env python3
"""Time the GEMMs of Linear layers through your own PyTorch and write cpsim raw calibration data.

For every Linear weight shape of the given models (Hugging Face config.json files, cpsim's
data/models by default: fused Q/K/V, output projection, fused gate/up, down projection, the LM
head) and token counts m = 1K … 64K (quick: 4K, 16K), three products in bf16:

  fwd    Y = X · Wᵀ         torch.nn.functional.linear(X, W), X [m, k], W [n, k]
  dgrad  dX = dY · W        torch.matmul(dY, W)
  wgrad  dW = dYᵀ · X       torch.matmul(dY.t(), X)

with warm-up, CUDA-event timing, the median of several repetitions and rotated buffers (>= 2 x
L2). Inputs are drawn as in training (activations and output gradients N(0, 1), weights
N(0, 0.02)): a GEMM's power draw, and so its clock, depends on the data. The samples are the raw
format's "gemm" entries (docs/CALIBRATION.md) with their layout; `cpsim calibrate fit` turns them
into the GEMM efficiency curve, the path users' training takes (cuBLAS as PyTorch calls it), where
`cpsim calibrate run` times cuBLASLt directly.

  python3 torch_gemm_timing.py --out gemm.json [--quick] [--models a.json,b.json]

`--selftest` writes a small file with made-up timings without importing torch (format check).
"""

import argparse
import glob
import json
import math
import os
import sys

from cpsim_script_common import TimedDevice, make_context, selftest_context, write_atomically

SCHEMA = "cpsim.calibration/1"
LAYOUTS = ("fwd", "dgrad", "wgrad")


def linear_shapes(config):
    """(n, k, origin) of a model's Linear weights: Y[m, n] = X[m, k] · W[k, n]."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads", heads))
    d = int(config.get("head_dim") or h // heads)
    f = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    name = config.get("name", config.get("_name_or_path", "model"))
    return [((heads + 2 * kv) * d, h, name + " qkv"), (h, heads * d, name + " out"),
            (2 * f, h, name + " gate+up"), (h, f, name + " down"), (vocab, h, name + " lm_head")]


def shapes_of(paths):
    """The distinct (n, k) of every model, origins joined, sorted."""
    shapes = {}
    for path in paths:
        with open(path) as f:
            config = json.load(f)
        for n, k, origin in linear_shapes(config):
            shapes.setdefault((n, k), []).append(origin)
    return [(n, k, ", ".join(o)) for (n, k), o in sorted(shapes.items())]


def token_counts(quick):
    return [4096, 16384] if quick else [1024, 4096, 16384, 65536]


def sample(m, n, k, layout, time_s):
    out = {"m": int(m), "n": int(n), "k": int(k), "time_s": float(time_s)}
    if layout != "fwd":
        out["layout"] = layout
    return out


def raw_document(context, samples):
    return json.dumps({"schema": SCHEMA, "context": context, "samples": {"gemm": samples}},
                      indent=2) + "\n"


def measure(args, paths):
    import torch

    g = TimedDevice(torch, args.device, args.quick, "torch_gemm_timing.py")
    dev, props, l2, rotation = g.dev, g.props, g.l2, g.rotation
    warmup, repetitions, timer = g.warmup, g.repetitions, g.timer
    free = torch.cuda.mem_get_info(dev)[0]
    shapes = shapes_of(paths)
    notes = ["torch " + torch.__version__, "torch CUDA " + str(torch.version.cuda),
             "models: " + ", ".join(os.path.basename(p) for p in paths),
             "inputs N(0, 1), weights N(0, 0.02), bf16"]
    samples = []
    skipped = 0

    def document():
        context = make_context(props.name, 1, torch.cuda.device_count(), torch.version.cuda, None,
                               props.multi_processor_count, props.total_memory, l2, args.quick,
                               warmup, repetitions, rotation, notes + [
                                   f"{skipped} shape(s) skipped: larger than 60 % of free memory "
                                   f"or above {args.max_flops:.0e} FLOPs"] if skipped else notes)
        return raw_document(context, samples)

    total = len(shapes) * len(token_counts(args.quick))
    done = 0
    for n, k, origin in shapes:
        for m in token_counts(args.quick):
            done += 1
            flops = 2.0 * m * n * k
            per_set = 2 * (m * k + n * k + m * n) * 2  # X, W, dY and one output, bf16
            sets = max(1, min(16, math.ceil(rotation / per_set)))
            if flops > args.max_flops or sets * per_set > 0.6 * free:
                skipped += 1
                continue
            print(f"\r[{done}/{total}] GEMM m={m} n={n} k={k} ({origin})   ", end="",
                  file=sys.stderr, flush=True)
            bufs = []
            for _ in range(sets):
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
                dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
                bufs.append((x, w, dy))
            calls = {
                "fwd": lambda i: torch.nn.functional.linear(bufs[i % sets][0], bufs[i % sets][1]),
                "dgrad": lambda i: torch.matmul(bufs[i % sets][2], bufs[i % sets][1]),
                "wgrad": lambda i: torch.matmul(bufs[i % sets][2].t(), bufs[i % sets][0]),
            }
            for layout in LAYOUTS:
                samples.append(sample(m, n, k, layout, timer.median_s(calls[layout])))
            del bufs, calls
        write_atomically(args.out, document())  # each shape as it finishes
    print(file=sys.stderr)
    return document()


def selftest_document():
    """A small document with made-up timings, for checking the format without a GPU."""
    context = selftest_context()
    samples = []
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        for m in (1024, 2048, 4096, 8192, 16384, 32768):
            for layout, rate in (("fwd", 700e12), ("dgrad", 680e12), ("wgrad", 650e12)):
                samples.append(sample(m, n, k, layout, 5e-6 + 2.0 * m * n * k / rate))
    return raw_document(context, samples)


def default_models():
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(glob.glob(os.path.join(here, "..", "..", "data", "models", "*.json")))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="raw calibration file to write (JSON)")
    p.add_argument("--quick", action="store_true", help="fewer token counts")
    p.add_argument("--models", default="",
                   help="comma-separated Hugging Face config.json files (default: cpsim's "
                        "data/models beside this script)")
    p.add_argument("--max-flops", type=float, default=4e14, help="skip larger products")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--selftest", action="store_true", help="write made-up timings, no torch")
    args = p.parse_args()
    if args.selftest:
        text = selftest_document()
    else:
        paths = [x for x in args.models.split(",") if x] or default_models()
        if not paths:
            sys.exit("torch_gemm_timing.py: no model configs (--models)")
        text = measure(args, paths)
    write_atomically(args.out, text)
    print(f"wrote {args.out}; next: cpsim calibrate fit {args.out} --out PROFILE.json")


if __name__ == "__main__":
    main()
