#!/usr/bin/env python3
"""Time attention kernels of your own PyTorch stack and write cpsim raw calibration data.

Times the same grid as `cpsim calibrate run` (bf16, causal and not, head_dim 128/64, heads per
launch 1..32, lengths 1K.. up to what fits a time cap, plus unequal query/key lengths), forward
and backward, with warm-up, CUDA-event timing, the median of several repetitions and rotated
buffers (>= 2 x L2), and writes the raw format "cpsim.calibration/1" (docs/CALIBRATION.md) with
kernel names:

  sdpa            torch.nn.functional.scaled_dot_product_attention (the backend PyTorch picks)
  cudnn           SDPA with the cuDNN backend forced (torch.nn.attention.sdpa_kernel)
  sdpa-flash      SDPA with its bundled FlashAttention-2 backend forced
  sdpa-efficient  SDPA with the memory-efficient backend forced
  fa2             flash_attn.flash_attn_func (FlashAttention-2), when installed
  fa3             flash_attn_interface.flash_attn_func (FlashAttention-3, Hopper), when installed

The versions of torch, its CUDA and cuDNN, and the flash-attn packages are recorded in the notes.

Then: cpsim calibrate fit RAW.json --out PROFILE.json  (the kernels replace the base profile's
entries of the same name; everything else stays the base's).

  python3 torch_attention_timing.py --out attention.json [--quick] [--kernels sdpa,cudnn,fa3]

`--selftest` writes a small file with made-up timings without importing torch (format check).
"""

import argparse
import json
import math
import sys

from cpsim_script_common import TimedDevice, make_context, selftest_context, write_atomically

SCHEMA = "cpsim.calibration/1"


# ------------------------------------------------------------------------------------------------
# Output


def raw_document(context, samples):
    return json.dumps({"schema": SCHEMA, "context": context,
                       "samples": {"attention": samples}}, indent=2) + "\n"


def sample(kernel, pass_, causal, head_dim, heads, q_len, kv_len, time_s):
    return {"kernel": kernel, "pass": pass_, "causal": bool(causal), "head_dim": int(head_dim),
            "heads": int(heads), "q_len": int(q_len), "kv_len": int(kv_len),
            "time_s": float(time_s)}


# ------------------------------------------------------------------------------------------------
# The grid (the same as calibrate/cuda/sweeps_compute.cpp)


def grid(quick, max_seq):
    head_dims = [128] if quick else [128, 64]
    heads = [1, 4, 16, 32] if quick else [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    cap = max_seq or (16384 if quick else 1048576)
    lengths = []
    s = 1024
    while s <= cap:
        lengths.append(s)
        s *= 2
    rect = []
    for s in ([2048] if quick else [1024, 4096, 16384]):
        rect += [(s, 2 * s), (2 * s, s), (s, 4 * s)]
    return head_dims, heads, lengths, rect


def fwd_flops(q_len, kv_len, heads, head_dim, causal):
    visible = (max(0, kv_len - q_len) + kv_len) / 2.0 if causal else float(kv_len)
    return 4.0 * q_len * visible * heads * head_dim


# ------------------------------------------------------------------------------------------------
# Timing with PyTorch


# sdpa: PyTorch's own dispatch; cudnn, sdpa-flash, sdpa-efficient: SDPA with that backend forced;
# fa2, fa3: the flash-attn packages.
KERNELS = ("sdpa", "cudnn", "sdpa-flash", "sdpa-efficient", "fa2", "fa3")


def kernels_available(torch, wanted):
    out = {}
    import torch.nn.functional as F

    if "sdpa" in wanted:
        try:
            from torch.nn.attention.bias import causal_lower_right
        except ImportError:  # older PyTorch: no bottom-right mask for q_len != kv_len
            causal_lower_right = None

        def sdpa(q, k, v, causal):
            # (1, heads, len, d); PyTorch's is_causal is top-left aligned: use the bottom-right
            # bias when the lengths differ, as cpsim and FlashAttention do.
            if causal and q.shape[2] != k.shape[2]:
                if causal_lower_right is None:
                    return None
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]))
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        out["sdpa"] = (sdpa, "bhsd")
    # SDPA with one backend forced (torch.nn.attention.sdpa_kernel, PyTorch >= 2.3): cuDNN's
    # fused attention is the kernel recipes call `cudnn`; PyTorch's bundled FlashAttention-2 and
    # its memory-efficient kernel get names of their own. A backend that refuses a shape ("No
    # available kernel") skips that point.
    forced = {"cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION",
              "sdpa-efficient": "EFFICIENT_ATTENTION"}
    if any(name in wanted for name in forced):
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:  # older PyTorch
            SDPBackend = None
        if SDPBackend is not None:
            try:
                from torch.nn.attention.bias import causal_lower_right as lower_right
            except ImportError:
                lower_right = None
            for name, backend_name in forced.items():
                backend = getattr(SDPBackend, backend_name, None)
                if name not in wanted or backend is None:
                    continue

                def forced_call(q, k, v, causal, backend=backend):
                    with sdpa_kernel(backend):
                        try:
                            if causal and q.shape[2] != k.shape[2]:
                                if lower_right is None:
                                    return None
                                return F.scaled_dot_product_attention(
                                    q, k, v, attn_mask=lower_right(q.shape[2], k.shape[2]))
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        except RuntimeError as e:
                            if "No available kernel" in str(e):
                                return None
                            raise

                out[name] = (forced_call, "bhsd")
    if "fa2" in wanted:
        try:
            from flash_attn import flash_attn_func as fa2

            out["fa2"] = (lambda q, k, v, causal: fa2(q, k, v, causal=causal), "bshd")
        except ImportError:
            pass
    if "fa3" in wanted:
        try:
            from flash_attn_interface import flash_attn_func as fa3

            def fa3_call(q, k, v, causal):
                r = fa3(q, k, v, causal=causal)
                return r[0] if isinstance(r, tuple) else r

            out["fa3"] = (fa3_call, "bshd")
        except ImportError:
            pass
    return out


def measure(args):
    import torch

    g = TimedDevice(torch, args.device, args.quick, "torch_attention_timing.py")
    dev, props, l2, rotation = g.dev, g.props, g.l2, g.rotation
    warmup, repetitions, timer = g.warmup, g.repetitions, g.timer
    cap_s = 0.05 if args.quick else 0.6
    wanted = args.kernels.split(",")
    unknown = [k for k in wanted if k not in KERNELS]
    if unknown:
        sys.exit("torch_attention_timing.py: --kernels: unknown " + ", ".join(unknown) +
                 "; known: " + ",".join(KERNELS))
    kernels = kernels_available(torch, wanted)
    if not kernels:
        sys.exit("torch_attention_timing.py: none of the requested kernels is available")
    head_dims, heads_list, lengths, rect = grid(args.quick, args.max_seq)
    samples = []
    notes = ["torch " + torch.__version__, "torch CUDA " + str(torch.version.cuda),
             "kernels: " + ", ".join(sorted(kernels))]
    try:
        notes.append("cuDNN " + str(torch.backends.cudnn.version()))
    except Exception:  # noqa: BLE001 - informational only
        pass
    for module in ("flash_attn", "flash_attn_interface", "flash_attn_3"):
        try:
            mod = __import__(module)
            notes.append(module + " " + str(getattr(mod, "__version__", "(no __version__)")))
        except ImportError:
            pass

    def run_shape(name, fn, layout, d, h, q_len, kv_len, causal):
        per_set = 2 * d * h * (3 * q_len + 2 * kv_len) * 2  # q, k, v, o, do (+ grads)
        sets = max(1, min(64, math.ceil(rotation / per_set)))
        shape_q = (1, h, q_len, d) if layout == "bhsd" else (1, q_len, h, d)
        shape_k = (1, h, kv_len, d) if layout == "bhsd" else (1, kv_len, h, d)
        bufs = []
        for _ in range(sets):
            q = torch.randn(shape_q, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(shape_k, device=dev, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(shape_k, device=dev, dtype=torch.bfloat16, requires_grad=True)
            bufs.append((q, k, v, torch.randn(shape_q, device=dev, dtype=torch.bfloat16)))
        if fn(*bufs[0][:3], causal) is None:
            return None
        with torch.no_grad():
            t_fwd = timer.median_s(lambda i: fn(*bufs[i % sets][:3], causal))
        outs = [fn(q, k, v, causal) for (q, k, v, _) in bufs]

        def bwd(i):
            q, k, v, do = bufs[i % sets]
            torch.autograd.grad(outs[i % sets], (q, k, v), do, retain_graph=True)

        t_bwd = timer.median_s(bwd)
        del outs, bufs
        return t_fwd, t_bwd

    nccl = None
    try:
        v = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001 - NCCL is optional here
        nccl = None

    def document():
        context = make_context(props.name, 1, torch.cuda.device_count(), torch.version.cuda, nccl,
                               props.multi_processor_count, props.total_memory, l2, args.quick,
                               warmup, repetitions, rotation, notes)
        return raw_document(context, samples)

    total = len(kernels) * len(head_dims) * 2 * len(lengths) * len(heads_list)
    done = 0
    for name, (fn, layout) in sorted(kernels.items()):
        # Each finished kernel is written at once: a run cut short keeps what it measured.
        if samples:
            write_atomically(args.out, document())
        for d in head_dims:
            for causal in (False, True):
                rate = 50e12
                stop = False
                for s in lengths:
                    for hi, h in enumerate(heads_list):
                        done += 1
                        if stop or 5.0 * fwd_flops(s, s, h, d, causal) / rate > cap_s:
                            stop = stop or hi == 0
                            break
                        print(f"\r[{done}/{total}] {name} d{d} {'causal' if causal else 'full'} "
                              f"h{h} S {s}   ", end="", file=sys.stderr, flush=True)
                        try:
                            r = run_shape(name, fn, layout, d, h, s, s, causal)
                        except torch.cuda.OutOfMemoryError:
                            stop = stop or hi == 0
                            torch.cuda.empty_cache()
                            break
                        if r is None:
                            continue
                        t_fwd, t_bwd = r
                        rate = max(1e12, fwd_flops(s, s, h, d, causal) / t_fwd)
                        samples.append(sample(name, "fwd", causal, d, h, s, s, t_fwd))
                        samples.append(sample(name, "bwd", causal, d, h, s, s, t_bwd))
        for (q_len, kv_len) in rect:
            for causal in (False, True):
                try:
                    r = run_shape(name, fn, layout, 128, 16, q_len, kv_len, causal)
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
                if r is not None:
                    samples.append(sample(name, "fwd", causal, 128, 16, q_len, kv_len, r[0]))
                    samples.append(sample(name, "bwd", causal, 128, 16, q_len, kv_len, r[1]))
    print(file=sys.stderr)
    return document()


def selftest_document():
    """A small document with made-up timings, for checking the format without a GPU."""
    context = selftest_context()
    samples = []
    for pass_, rate in (("fwd", 400e12), ("bwd", 300e12)):
        for causal in (False, True):
            for s in (1024, 2048, 4096, 8192):
                for h in (1, 16, 32):
                    flops = fwd_flops(s, s, h, 128, causal) * (1.0 if pass_ == "fwd" else 2.5)
                    samples.append(sample("sdpa", pass_, causal, 128, h, s, s, 5e-6 + flops / rate))
    return raw_document(context, samples)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="raw calibration file to write (JSON)")
    p.add_argument("--quick", action="store_true", help="fewer points")
    p.add_argument("--kernels", default=",".join(KERNELS),
                   help="comma-separated, of: " + ",".join(KERNELS))
    p.add_argument("--max-seq", type=int, default=0, help="longest length (tokens) to try")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--selftest", action="store_true", help="write made-up timings, no torch")
    args = p.parse_args()
    text = selftest_document() if args.selftest else measure(args)
    write_atomically(args.out, text)
    print(f"wrote {args.out}; next: cpsim calibrate fit {args.out} --out PROFILE.json")


if __name__ == "__main__":
    main()
