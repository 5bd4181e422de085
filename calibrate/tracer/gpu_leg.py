#!/usr/bin/env python3
"""The allocation tracer's GPU leg: the same traces with CUDA tensors and PyTorch's CUDA allocator
history beside the dispatch recorder's events, and a 1-GPU ALST baseline step under DeepSpeed.

    gpu_leg.py trace --impl NAME --shape SHAPE --device cuda --out t.json [--raw-snapshot s.gz]
    gpu_leg.py baseline --device cuda --out-dir DIR [--layers N --seq N ...]
    gpu_leg.py manifest --out-dir DIR --steps steps.tsv --mode gpu|dry-run

scripts/gpu-trace.sh runs all three (and, with --dry-run, runs them on the CPU).

trace: trace.py's `run_trace` under `torch.set_default_device(device)`, so that the factory calls
of the drivers and of the code they run (torch.randn(...), nn.Linear(...)) make CUDA tensors. On
CUDA, with `--sdpa real` (the default), torch.nn.functional.scaled_dot_product_attention stays
PyTorch's own while the trace runs (a driver's SDPA stand-in, installed by patching that name, is
refused and named in the output) and runs its flash backend, the FlashAttention-2 kernels the
stand-ins model (`--sdpa-backend`); `--sdpa stand-in` keeps the drivers' stand-ins, whose CPU
kernel calls (_scaled_dot_product_flash_attention_for_cpu and its backward) then run CUDA's flash
kernels. The flash_attn stand-in (cpsim_tracer/flash_stand_in.py) runs as on the CPU (the real
flash_attn, where installed, is named in the output but not used). DeepSpeed's accelerator is
CUDA's (DS_ACCELERATOR=cuda). torch.use_deterministic_algorithms is left off on CUDA (the
training default; trace.py turns it on for byte-identical CPU traces). The allocator's history
(torch.cuda.memory._record_memory_history) is condensed: every allocation and free with its size
and top upstream frame (the recorder's `upstream_frame` rule), joined to the recorder's events
through the storage address and the allocator's user metadata, which carries the recorder's event
count, phase and site while the trace runs.

baseline: a Llama-3-8B-shaped LlamaForCausalLM (data/models/llama3-8b.json; random bf16 weights)
under DeepSpeed ZeRO-3 as data/validation/alst-llama8b-1xh100-baseline-reading models the 1-GPU
ALST baseline (recipe alst-deepspeed): parameters and optimizer offloaded to pinned host memory,
DeepSpeed's other ZeRO-3 defaults, HF activation checkpointing per layer (reentrant), no tiled MLP,
no Liger/fused loss (the model's own loss over materialised logits), expandable segments, 32,000
tokens; one forward, backward and optimizer step (--steps: more), then torch.cuda.memory_stats(),
the phases' peaks (and the device's used memory, as NVML reads it) and the condensed allocator
history, each allocation with its phase. AdamW runs through torch on the host partitions
(DeepSpeed's `torch_adam`; `--optimizer ds-cpu-adam` JIT-builds DeepSpeedCPUAdam instead). With
offload, the host holds about 20 bytes per trainable parameter (bf16 parameter, fp32 master, bf16
and fp32 gradient partitions, fp32 Adam moments): 160 GB for all of Llama-3-8B, more than a
128 GiB machine has, hence `--trainable-layers` (frozen layers still run forward, recompute and
backward). calibrate/scripts/hf_memory_snapshot.py measures the same model without DeepSpeed: the
whole model on the GPU, each gradient dropped when accumulated, no optimizer, no host offload,
CUDA only; it has none of ZeRO-3's buffers, which is what this step is for.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import importlib.util
import json
import os
import pickle
import platform
import signal
import socket
import subprocess
import sys
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

TRACE_SCHEMA = "cpsim.gpu-leg-trace/1"
BASELINE_SCHEMA = "cpsim.gpu-leg-baseline/1"
MANIFEST_SCHEMA = "cpsim.gpu-trace-manifest/1"
HISTORY_SCHEMA = "cpsim.cuda-alloc-history/1"

# The allocator trace's actions, in the order the condensed rows number them.
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"]
METADATA_PREFIX = "cpsim "
SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math", "auto")
PACKAGES = ["torch", "transformers", "deepspeed", "yunchang", "ring-flash-attn", "flash-attn",
            "einops", "accelerate", "huggingface-hub", "tokenizers", "pydantic", "triton"]


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_json(path: str, doc) -> None:
    """Through a temporary file and a rename: never a half-written output."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def versions(names=PACKAGES) -> dict:
    import importlib.metadata as md

    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


# -- the allocator history, condensed -------------------------------------------------------------
def frame_label(frames: list[dict]) -> str:
    """The top upstream frame of an allocator trace entry's Python stack (innermost first), by the
    recorder's rule: the innermost frame of an installed package other than torch, else the
    innermost outside torch and the tracer."""
    from traceback import FrameSummary

    from cpsim_tracer.recorder import upstream_frame

    stack = [FrameSummary(f.get("filename", "?"), int(f.get("line", 0) or 0), f.get("name", "?"),
                          lookup_line=False) for f in reversed(frames or [])]
    return upstream_frame(stack) if stack else "?"


def parse_metadata(text: str) -> tuple[int, str, str] | None:
    """(recorder event count, phase, site) of the allocator metadata set while a trace runs."""
    if not text or not text.startswith(METADATA_PREFIX):
        return None
    parts = text[len(METADATA_PREFIX):].split(" ", 2)
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    return int(parts[0]), parts[1], parts[2]


def condense_history(entries: list[dict], recorder_allocs: list[dict] | None = None,
                     label=frame_label) -> dict:
    """The allocator's trace entries (one device's) as compact rows, with a summary.

    rows: [action (index into ACTIONS), block id (an alloc and its frees share it; -1 for segment
    events), size, frame (index into frames; -1 none), metadata (index into metadata; -1 none),
    recorder alloc id (-1: the recorder made no such allocation)].
    recorder_allocs: the recorder's allocations on this device, in order: {"id", "seq" (its event
    number), "ptr", "bytes"}; each is joined to the allocation at its address that was made last
    before the recorder saw it (by the metadata's event count where the entries carry it, else by
    the order of allocations at that address)."""
    frames: dict[str, int] = {}
    metas: dict[str, int] = {}
    rows = []
    live: dict[int, tuple[int, int]] = {}  # addr -> (block id, size), allocated and not freed
    allocs_at: dict[int, list[int]] = {}  # addr -> row indices of its allocations, in order
    next_id = 0
    live_bytes = peak = 0
    peak_row = -1
    reserved = reserved_peak = 0
    counts = {a: 0 for a in ACTIONS}
    have_metadata = False
    for e in entries:
        action = e.get("action")
        if action not in ACTIONS:
            continue
        counts[action] += 1
        size = int(e.get("size", 0) or 0)
        addr = e.get("addr")
        fr = e.get("frames")
        fidx = frames.setdefault(label(fr), len(frames)) if fr else -1
        meta = e.get("user_metadata") or ""
        have_metadata = have_metadata or bool(meta)
        midx = metas.setdefault(meta, len(metas)) if meta else -1
        block = -1
        if action == "alloc":
            block = next_id
            next_id += 1
            live[addr] = (block, size)
            allocs_at.setdefault(addr, []).append(len(rows))
            live_bytes += size
            if live_bytes > peak:
                peak, peak_row = live_bytes, len(rows)
        elif action == "free_requested":
            was = live.pop(addr, None)
            if was is not None:
                block = was[0]
                live_bytes -= was[1]
        elif action == "free_completed":
            rows_at = allocs_at.get(addr)
            block = rows[rows_at[-1]][1] if rows_at else -1
        elif action in ("segment_alloc", "segment_map"):
            reserved += size
            reserved_peak = max(reserved_peak, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
        rows.append([ACTIONS.index(action), block, size, fidx, midx, -1])

    meta_names = _names(metas)
    joined, method = _join(rows, allocs_at, meta_names, recorder_allocs or [], have_metadata)
    frame_names = _names(frames)
    return {
        "schema": HISTORY_SCHEMA,
        "columns": ["action", "block", "size", "frame", "metadata", "recorder_id"],
        "actions": ACTIONS,
        "frames": frame_names,
        "metadata": meta_names,
        "rows": rows,
        "counts": {k: v for k, v in counts.items() if v},
        "peak_allocated_bytes": peak,
        "peak_row": peak_row,
        "live_at_end_bytes": live_bytes,
        "reserved_growth_peak_bytes": reserved_peak,
        "join": {"method": method, "recorder_allocs": len(recorder_allocs or []),
                 "joined": joined},
        "summary": _summary(rows, frame_names, meta_names, peak_row),
    }


def _names(index: dict[str, int]) -> list[str]:
    names = [""] * len(index)
    for k, v in index.items():
        names[v] = k
    return names


def _join(rows, allocs_at, meta_names, recorder_allocs, have_metadata) -> tuple[int, str]:
    if not recorder_allocs:
        return 0, "none"
    method = "metadata" if have_metadata else "address-order"
    used_upto: dict[int, int] = {}  # addr -> position in allocs_at[addr] last joined (order join)
    joined = 0
    for r in recorder_allocs:
        candidates = allocs_at.get(r["ptr"], [])
        pick = None
        if have_metadata:
            for row_index in candidates:  # the last allocation made before the recorder saw it
                m = meta_names[rows[row_index][4]] if rows[row_index][4] >= 0 else ""
                parsed = parse_metadata(m)
                if parsed is not None and parsed[0] <= r["seq"]:
                    pick = row_index
        else:
            start = used_upto.get(r["ptr"], -1) + 1
            for pos in range(start, len(candidates)):
                if rows[candidates[pos]][2] >= r["bytes"]:
                    pick = candidates[pos]
                    used_upto[r["ptr"]] = pos
                    break
        if pick is not None and rows[pick][5] < 0:
            rows[pick][5] = r["id"]
            joined += 1
    return joined, method


def _summary(rows, frame_names, meta_names, peak_row) -> dict:
    """Allocations the recorder did not see, by (phase, site, frame) of the metadata when they
    were made (freed_within_one_call: freed before the recorder's next event, where the frees
    carry metadata); what was live at the peak, by frame."""
    unseen: dict[tuple[str, str, str], list] = {}
    pending: dict[int, tuple[tuple[str, str, str], int]] = {}  # block -> (key, alloc metadata)
    frees_have_metadata = False
    seen_bytes = unseen_bytes = 0
    for action, block, size, fidx, midx, rid in rows:
        if action == 0:
            if rid >= 0:
                seen_bytes += size
                continue
            unseen_bytes += size
            parsed = parse_metadata(meta_names[midx]) if midx >= 0 else None
            key = (parsed[1] if parsed else "", parsed[2] if parsed else "",
                   frame_names[fidx] if fidx >= 0 else "?")
            entry = unseen.setdefault(key, [0, 0, 0, 0])
            entry[0] += 1
            entry[1] += size
            entry[2] = max(entry[2], size)
            pending[block] = (key, midx)
        elif action == 1:
            frees_have_metadata = frees_have_metadata or midx >= 0
            key, alloc_midx = pending.pop(block, (None, -1))
            if key is not None and midx >= 0 and midx == alloc_midx:
                unseen[key][3] += 1
    live: dict[int, tuple[int, int]] = {}
    for action, block, size, fidx, _m, _r in rows[: peak_row + 1]:
        if action == 0:
            live[block] = (size, fidx)
        elif action == 1:
            live.pop(block, None)
    at_peak: dict[str, list[int]] = {}
    for size, fidx in live.values():
        entry = at_peak.setdefault(frame_names[fidx] if fidx >= 0 else "?", [0, 0])
        entry[0] += 1
        entry[1] += size
    return {
        "allocated_bytes_seen_by_recorder": seen_bytes,
        "allocated_bytes_not_seen_by_recorder": unseen_bytes,
        "not_seen": sorted(
            ({"phase": k[0], "site": k[1], "frame": k[2], "count": v[0], "bytes": v[1],
              "max_bytes": v[2],
              "freed_within_one_call": v[3] if frees_have_metadata else None}
             for k, v in unseen.items()),
            key=lambda d: (-d["bytes"], d["frame"])),
        "live_at_peak": sorted(([k, v[0], v[1]] for k, v in at_peak.items()),
                               key=lambda r: (-r[2], r[0])),
    }


def cuda_stats(torch) -> dict:
    stats = torch.cuda.memory_stats()
    keep = ("allocated_bytes.all.peak", "allocated_bytes.all.current",
            "reserved_bytes.all.peak", "reserved_bytes.all.current", "active_bytes.all.peak",
            "requested_bytes.all.peak", "allocation.all.allocated", "segment.all.allocated",
            "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")
    free, total = torch.cuda.mem_get_info()
    return {"stats": {k: stats[k] for k in keep if k in stats},
            "device_used_bytes": total - free, "device_total_bytes": total}


def start_history(torch, max_entries: int, context: str = "all") -> None:
    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks="python",
                                             max_entries=max_entries)


def stop_history(torch, raw_path: str | None, raw_limit: int) -> tuple[list[dict], dict]:
    """The device's trace entries, and where the raw snapshot went (or why not)."""
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    dev = torch.cuda.current_device()
    traces = snap.get("device_traces") or []
    entries = traces[dev] if dev < len(traces) else []
    raw = {"path": None}
    if raw_path:
        with gzip.open(raw_path, "wb", compresslevel=4) as f:
            pickle.dump(snap, f)
        size = os.path.getsize(raw_path)
        if size > raw_limit:
            os.unlink(raw_path)
            raw = {"path": None, "dropped": f"{size} bytes gzipped, over the {raw_limit} limit"}
        else:
            raw = {"path": os.path.basename(raw_path), "bytes": size}
    return entries, raw


# -- trace ----------------------------------------------------------------------------------------
class _SdpaGuard(types.ModuleType):
    """torch.nn.functional's class while a trace runs with --sdpa real: assignments to
    scaled_dot_product_attention (a driver's stand-in) are refused and remembered."""

    real = None
    refused: list[str] = []

    def __setattr__(self, name, value):
        if name == "scaled_dot_product_attention" and value is not _SdpaGuard.real:
            what = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', value)}"
            if what not in _SdpaGuard.refused:
                _SdpaGuard.refused.append(what)
            return
        super().__setattr__(name, value)


@contextlib.contextmanager
def _real_sdpa(torch):
    functional = torch.nn.functional
    _SdpaGuard.real = functional.scaled_dot_product_attention
    _SdpaGuard.refused = []
    functional.__class__ = _SdpaGuard
    try:
        yield _SdpaGuard.refused
    finally:
        functional.__class__ = types.ModuleType


def _sdpa_backend(torch, name: str):
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]
    return sdpa_kernel([backend])


def _cpu_flash_ops_on_cuda(torch):
    """CUDA kernels for the CPU-only flash ops that SDPA stand-ins call: CUDA's flash forward and
    backward (the forward's cum_seq/rng outputs kept for the backward, by the LSE's address)."""
    lib = torch.library.Library("aten", "IMPL")
    saved: dict[int, tuple] = {}
    aten = torch.ops.aten

    def forward(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                scale=None):
        assert attn_mask is None, "gpu_leg: a mask has no flash kernel"
        r = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                     False, scale=scale)
        saved[r[1].data_ptr()] = r[2:8]
        return r[0], r[1]

    def backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                 attn_mask=None, scale=None):
        aux = saved.pop(logsumexp.data_ptr(), None)
        if aux is None:
            none = torch.empty(0, dtype=torch.int64, device=query.device)
            aux = (none, none, query.shape[2], key.shape[2], none, none)
        cum_q, cum_k, max_q, max_k, seed, offset = aux
        return tuple(aten._scaled_dot_product_flash_attention_backward(
            grad_out, query, key, value, out, logsumexp, cum_q, cum_k, max_q, max_k, dropout_p,
            is_causal, seed, offset, scale=scale))

    lib.impl("_scaled_dot_product_flash_attention_for_cpu", forward, "CUDA")
    lib.impl("_scaled_dot_product_flash_attention_for_cpu_backward", backward, "CUDA")
    return lib


@contextlib.contextmanager
def _cuda_mesh(torch):
    """init_device_mesh("cpu", ...) of a driver makes a CUDA mesh (its tensors are CUDA's)."""
    from torch.distributed import device_mesh

    original = device_mesh.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return original("cuda" if device_type == "cpu" else device_type, *args, **kwargs)

    device_mesh.init_device_mesh = init_device_mesh
    try:
        yield
    finally:
        device_mesh.init_device_mesh = original


@contextlib.contextmanager
def _recorder_links(torch, on_cuda: bool, allocs: list[dict]):
    """Notes each recorded allocation's address (and device) and, on CUDA, keeps the allocator's
    user metadata at 'cpsim <events so far> <phase> <site>' while the trace runs."""
    from cpsim_tracer.recorder import AllocationRecorder

    originals = {n: getattr(AllocationRecorder, n)
                 for n in ("_record_alloc", "_record_free", "set_phase", "site")}
    set_meta = getattr(torch.cuda.memory, "_set_memory_metadata", None) if on_cuda else None

    def mark(rec):
        if set_meta is not None:
            set_meta(f"{METADATA_PREFIX}{len(rec.events)} {rec._phase} {rec._sites[-1][0]}")

    def record_alloc(self, t, op, stand_in=""):
        before = len(self.events)
        originals["_record_alloc"](self, t, op, stand_in)
        if len(self.events) > before:
            e = self.events[-1]
            allocs.append({"id": e.id, "seq": e.seq, "bytes": e.bytes, "device": t.device.type,
                           "ptr": t.untyped_storage().data_ptr()})
        mark(self)

    def record_free(self, key, alloc_id):
        originals["_record_free"](self, key, alloc_id)
        mark(self)

    def set_phase(self, phase):
        originals["set_phase"](self, phase)
        mark(self)

    @contextlib.contextmanager
    def site(self, name):
        try:
            with originals["site"](self, name):
                mark(self)
                yield
        finally:
            mark(self)

    AllocationRecorder._record_alloc = record_alloc
    AllocationRecorder._record_free = record_free
    AllocationRecorder.set_phase = set_phase
    AllocationRecorder.site = site
    try:
        yield set_meta is not None
    finally:
        for name, fn in originals.items():
            setattr(AllocationRecorder, name, fn)
        if set_meta is not None:
            set_meta("")


def _load_trace_py():
    """calibrate/tracer/trace.py (by its path: the standard library has a `trace` module)."""
    spec = importlib.util.spec_from_file_location("cpsim_trace", os.path.join(HERE, "trace.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cmd_trace(args) -> int:
    doc = {"schema": TRACE_SCHEMA, "date": utc_now(), "device": args.device,
           "impl": args.impl, "shape": args.shape, "gpu_leg": {}, "trace": None, "cuda": None,
           "seconds": None, "error": None}
    try:
        _trace(args, doc)
    except Exception:  # noqa: BLE001 - recorded: the output says what failed
        doc["error"] = doc["error"] or traceback.format_exc()[-4000:]
    write_json(args.out, doc)
    print(f"gpu_leg: {args.impl} {args.shape}: {'failed' if doc['error'] else 'ok'} "
          f"({doc['seconds']} s)", file=sys.stderr)
    if doc["error"]:
        print(doc["error"], file=sys.stderr)
    return 1 if doc["error"] else 0


def _trace(args, doc) -> None:
    on_cuda = args.device == "cuda"
    real_flash = importlib.util.find_spec("flash_attn") is not None
    if on_cuda:
        os.environ["DS_ACCELERATOR"] = args.ds_accelerator
        if args.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from cpsim_tracer import drivers

    settings = doc["gpu_leg"]
    settings.update({
        "default_device": args.device,
        "ds_accelerator": os.environ.get("DS_ACCELERATOR"),
        "flash_attn": ("installed, not used: the tracer's stand-in runs (run_trace installs it)"
                       if real_flash else "absent: the tracer's stand-in runs"),
        "deterministic_algorithms": ("as trace.py sets them (on)" if not on_cuda or
                                     args.deterministic else "off (the training default)"),
    })
    tracer = _load_trace_py()
    module = drivers.load(args.impl)
    shapes = {s["name"]: s for s in module.SHAPES}
    if args.shape not in shapes:
        raise ValueError(f"--shape {args.shape!r} is not one of {sorted(shapes)}")
    if on_cuda:
        settings["device_name"] = torch.cuda.get_device_name()
        settings["sdpa"] = args.sdpa
        settings["sdpa_backend"] = args.sdpa_backend

    allocs: list[dict] = []
    refused = None
    with contextlib.ExitStack() as stack:
        if on_cuda:
            stack.enter_context(_cuda_mesh(torch))
            stack.callback(_cpu_flash_ops_on_cuda(torch)._destroy)
            stack.enter_context(_sdpa_backend(torch, args.sdpa_backend))
            refused = stack.enter_context(_real_sdpa(torch)) if args.sdpa == "real" else None
            if not args.deterministic:
                stack.enter_context(_no_deterministic(torch))
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            start_history(torch, args.max_entries)
        has_meta = stack.enter_context(_recorder_links(torch, on_cuda, allocs))
        torch.set_default_device(args.device)
        t0 = time.perf_counter()
        try:
            doc["trace"] = tracer.run_trace(module, shapes[args.shape])
        except Exception:  # noqa: BLE001 - recorded; the allocator history is still written
            doc["error"] = traceback.format_exc()[-4000:]
        finally:
            torch.set_default_device(None)
        doc["seconds"] = round(time.perf_counter() - t0, 3)
        if on_cuda:
            torch.cuda.synchronize()
            entries, raw = stop_history(torch, args.raw_snapshot, args.raw_limit)
            cuda_allocs = [a for a in allocs if a["device"] == "cuda"]
            doc["cuda"] = {
                "allocated_before_bytes": before,
                "memory": cuda_stats(torch),
                "user_metadata": has_meta,
                "raw_snapshot": raw,
                "max_entries": args.max_entries,
                "history": condense_history(entries, cuda_allocs),
                "recorder_allocs_off_cuda": len(allocs) - len(cuda_allocs),
            }
            if refused is not None:
                settings["sdpa_stand_ins_refused"] = list(refused)


@contextlib.contextmanager
def _no_deterministic(torch):
    original = torch.use_deterministic_algorithms
    torch.use_deterministic_algorithms = lambda *a, **k: None
    try:
        yield
    finally:
        torch.use_deterministic_algorithms = original


# -- baseline -------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_config(args) -> dict:
    with open(args.model) as f:
        cfg = json.load(f)
    keep = {k: v for k, v in cfg.items() if k not in ("name", "source", "_name_or_path")}
    for key, value in (("num_hidden_layers", args.layers), ("hidden_size", args.hidden),
                       ("intermediate_size", args.intermediate),
                       ("num_attention_heads", args.heads), ("num_key_value_heads", args.kv_heads),
                       ("vocab_size", args.vocab)):
        if value:
            keep[key] = value
    if args.hidden or args.heads:
        keep["head_dim"] = keep["hidden_size"] // keep["num_attention_heads"]
    keep["max_position_embeddings"] = max(keep.get("max_position_embeddings", 0), args.seq)
    keep["use_cache"] = False
    return keep


def ds_config(args) -> dict:
    """alst-deepspeed's ZeRO-3 as the 1-GPU baseline case sets it: stage 3 with parameter and
    optimizer offload (pinned), everything else DeepSpeed's defaults (contiguous gradients, a
    5e8-element reduce bucket, prefetch and persistence thresholds), bf16, AdamW."""
    on_cuda = args.device == "cuda"
    opt_params = {"lr": 1e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    if args.optimizer == "torch-adamw":
        opt_params["torch_adam"] = True
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": on_cuda},
            "offload_optimizer": {"device": "cpu", "pin_memory": on_cuda},
        },
        "optimizer": {"type": "AdamW", "params": opt_params},
        "zero_force_ds_cpu_optimizer": args.optimizer == "ds-cpu-adam",
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def _host_bytes() -> dict:
    out = {}
    try:
        import psutil

        out["rss_bytes"] = psutil.Process().memory_info().rss
        out["host_available_bytes"] = psutil.virtual_memory().available
    except ImportError:
        pass
    return out


def cmd_baseline(args) -> int:
    on_cuda = args.device == "cuda"
    os.makedirs(args.out_dir, exist_ok=True)
    out_json = os.path.join(args.out_dir, "baseline.json")
    os.environ["DS_ACCELERATOR"] = "cuda" if on_cuda else "cpu"
    if on_cuda:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(_free_port()))):
        os.environ.setdefault(key, value)
    config = llama_config(args)
    doc = {"schema": BASELINE_SCHEMA, "date": utc_now(), "argv": sys.argv, "device": args.device,
           "case": "alst-llama8b-1xh100-baseline-reading (recipe alst-deepspeed)",
           "model_config": config, "seq": args.seq, "phases": [], "error": None,
           "settings": {
               "attention": "sdpa (PyTorch's flash backend where it applies; the recipe's "
                            "flash-attn 2 is not installed on the GPU machine)",
               "activation_checkpointing": "HF gradient checkpointing per layer, "
                                           "use_reentrant=True, not offloaded",
               "loss": "the model's own (labels=input_ids): materialised logits, fp32 upcast; "
                       "no Liger, no tiled MLP or loss",
               "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
               "optimizer": {"torch-adamw": "torch.optim.AdamW on the host partitions "
                                            "(DeepSpeed's torch_adam; no cpu_adam build)",
                             "ds-cpu-adam": "DeepSpeedCPUAdam (JIT-built cpu_adam)"}[
                                 args.optimizer],
               "trainable_layers": args.trainable_layers,
           },
           "ds_config": ds_config(args)}

    def save():
        write_json(out_json, doc)

    def stop(signum, frame):  # `timeout` stops the step: unwind, so the history is still written
        raise TimeoutError("SIGTERM: the step's time limit ran out here")

    signal.signal(signal.SIGTERM, stop)
    save()
    try:
        _baseline(args, doc, save)
    except Exception:  # noqa: BLE001 - recorded
        doc["error"] = traceback.format_exc()[-4000:]
        save()
        print(doc["error"], file=sys.stderr)
        return 1
    save()
    return 0


def _baseline(args, doc, save) -> None:
    on_cuda = args.device == "cuda"
    import torch

    if not on_cuda:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    import deepspeed

    doc["versions"] = versions()
    doc["cuda"] = None
    cfg = dict(doc["model_config"])
    ds_cfg = doc["ds_config"]
    from unittest import mock

    import deepspeed.comm.torch  # noqa: F401 - its module, not the `torch` it imports

    ds_torch_comm = sys.modules["deepspeed.comm.torch"]
    # The CPU accelerator JIT-builds a shared-memory comm op here (a C++ build, minutes on two
    # cores) that one rank never uses.
    with mock.patch.object(ds_torch_comm, "build_shm_op", lambda: None):
        deepspeed.init_distributed(dist_backend="nccl" if on_cuda else "gloo",
                                   auto_mpi_discovery=False, verbose=False)
    if on_cuda:
        torch.cuda.set_device(0)
        doc["device_name"] = torch.cuda.get_device_name()

    def phase(name, t0):
        entry = {"phase": name, "seconds": round(time.perf_counter() - t0, 3)}
        entry.update(_host_bytes())
        if on_cuda:
            torch.cuda.synchronize()
            entry["allocated_bytes"] = torch.cuda.memory_allocated()
            entry["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            entry["reserved_bytes"] = torch.cuda.memory_reserved()
            entry["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            free, total = torch.cuda.mem_get_info()
            entry["device_used_bytes"] = total - free  # as NVML counts: context, NCCL, cuBLAS too
            torch.cuda.reset_peak_memory_stats()
        doc["phases"].append(entry)
        save()
        print(f"gpu_leg baseline: {name} {entry['seconds']} s", file=sys.stderr, flush=True)
        return time.perf_counter()

    def meta(name):
        if on_cuda and hasattr(torch.cuda.memory, "_set_memory_metadata"):
            torch.cuda.memory._set_memory_metadata(f"{METADATA_PREFIX}0 {name} baseline")

    t = phase("start", time.perf_counter())
    if on_cuda:
        start_history(torch, args.max_entries, context="alloc")
    try:
        _baseline_step(args, doc, cfg, ds_cfg, phase, meta, t)
    finally:  # the allocator's history also when the step failed (an OOM, say)
        if on_cuda:
            _baseline_history(torch, args, doc)
        save()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _baseline_step(args, doc, cfg, ds_cfg, phase, meta, t) -> None:
    import deepspeed
    import torch
    import transformers
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    meta("build")
    hf_ds = HfDeepSpeedConfig(ds_cfg)  # noqa: F841 - kept alive: transformers sees ZeRO-3
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    cls = getattr(transformers, doc["model_config"]["architectures"][0])
    try:
        model = cls._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    except TypeError:
        model = cls._from_config(config, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    layers = list(model.model.layers)
    frozen = 0
    if args.trainable_layers != "all":
        for layer in layers[: max(len(layers) - int(args.trainable_layers), 0)]:
            for p in layer.parameters():
                p.requires_grad_(False)
                frozen += p.ds_numel if hasattr(p, "ds_numel") else p.numel()
    numel = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    doc["parameters"] = {"total": numel, "frozen": frozen, "trainable": numel - frozen}
    t = phase("build", t)

    meta("initialize")
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                           config=ds_cfg)
    ids = torch.randint(0, config.vocab_size, (1, args.seq), device=engine.device)
    t = phase("initialize", t)
    doc["losses"] = []
    for i in range(1, args.steps + 1):  # step 2 on: DeepSpeed prefetches by its module trace
        suffix = "" if i == 1 else f"#{i}"
        meta("forward" + suffix)
        loss = engine(input_ids=ids, labels=ids).loss
        t = phase("forward" + suffix, t)
        meta("backward" + suffix)
        engine.backward(loss)
        t = phase("backward" + suffix, t)
        meta("step" + suffix)
        engine.step()
        t = phase("step" + suffix, t)
        doc["losses"].append(float(loss.detach().float().cpu()))
        del loss
    meta("")


def _baseline_history(torch, args, doc) -> None:
    try:
        if hasattr(torch.cuda.memory, "_set_memory_metadata"):
            torch.cuda.memory._set_memory_metadata("")
        raw_path = (os.path.join(args.out_dir, "baseline-snapshot.pickle.gz")
                    if args.raw_snapshot else None)
        entries, raw = stop_history(torch, raw_path, args.raw_limit)
        history = condense_history(entries)
        write_json(os.path.join(args.out_dir, "baseline-history.json"), history)
        phases = doc["phases"]
        doc["cuda"] = {
            "memory_stats": torch.cuda.memory_stats(),
            "memory": cuda_stats(torch),
            "peak_allocated_bytes": max(p.get("peak_allocated_bytes", 0) for p in phases),
            "peak_reserved_bytes": max(p.get("peak_reserved_bytes", 0) for p in phases),
            "history": {"file": "baseline-history.json", "entries": len(entries),
                        "max_entries": args.max_entries, "raw_snapshot": raw,
                        "counts": history["counts"],
                        "peak_allocated_bytes": history["peak_allocated_bytes"],
                        "live_at_peak_top": history["summary"]["live_at_peak"][:40],
                        "by_phase_and_frame_top": history["summary"]["not_seen"][:60]},
        }
    except Exception:  # noqa: BLE001 - recorded beside the step's own error, if any
        doc["history_error"] = traceback.format_exc()[-2000:]


# -- manifest -------------------------------------------------------------------------------------
def _nvidia_smi() -> dict:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        name, driver, memory = [s.strip() for s in r.stdout.splitlines()[0].split(",")]
        cuda = ""
        r2 = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        for word in r2.stdout.split("CUDA Version:")[1:2]:
            cuda = word.split()[0]
        return {"name": name, "driver": driver, "memory": memory, "driver_cuda": cuda}
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        return {}


def cmd_manifest(args) -> int:
    doc = {"schema": MANIFEST_SCHEMA, "date": utc_now(), "mode": args.mode,
           "host": platform.node(), "python": sys.executable, "pythonpath":
           os.environ.get("PYTHONPATH", ""), "steps": [], "outputs": []}
    smi = _nvidia_smi()
    device = {"name": smi.get("name"), "driver": smi.get("driver"),
              "driver_cuda": smi.get("driver_cuda"), "memory": smi.get("memory")}
    try:
        import torch

        device["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            device["name"] = device["name"] or torch.cuda.get_device_name(0)
            device["cudnn"] = torch.backends.cudnn.version()
    except Exception as e:  # noqa: BLE001 - recorded
        device["torch_error"] = repr(e)[:400]
    if args.mode == "dry-run":
        device["name"] = device["name"] or "cpu (dry run)"
    doc["device"] = device
    doc["versions"] = versions()
    with open(args.steps) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 3:
                doc["steps"].append({"name": parts[0], "status": parts[1],
                                     "seconds": float(parts[2]),
                                     "detail": parts[3] if len(parts) > 3 else ""})
    doc["traces"] = []
    if args.traces_status and os.path.exists(args.traces_status):
        with open(args.traces_status) as f:
            for line in f:
                impl, shape, status, seconds = (line.rstrip("\n").split("\t") + [""] * 4)[:4]
                doc["traces"].append({"impl": impl, "shape": shape, "status": status,
                                      "seconds": float(seconds or 0)})
    for base, _dirs, files in os.walk(args.out_dir):
        for name in sorted(files):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, args.out_dir)
            if rel == "manifest.json" or name.endswith(".tmp"):
                continue
            doc["outputs"].append(rel)
            if name.endswith(".tar.gz"):
                import tarfile

                with tarfile.open(path) as tar:
                    doc["outputs"] += [rel + ":" + m.name for m in tar.getmembers() if m.isfile()]
    doc["outputs"].sort()
    write_json(os.path.join(args.out_dir, "manifest.json"), doc)
    return 0


# -- command line ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("trace", help="one trace with the allocator's history beside it")
    p.add_argument("--impl", required=True)
    p.add_argument("--shape", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--sdpa", choices=("real", "stand-in"), default="real")
    p.add_argument("--sdpa-backend", choices=SDPA_BACKENDS, default="flash")
    p.add_argument("--ds-accelerator", default="cuda", help="DS_ACCELERATOR on CUDA")
    p.add_argument("--deterministic", action="store_true",
                   help="keep trace.py's deterministic algorithms on CUDA")
    p.add_argument("--max-entries", type=int, default=200_000)
    p.add_argument("--raw-snapshot", help="also write the raw snapshot, gzipped pickle")
    p.add_argument("--raw-limit", type=int, default=4 << 20, help="bytes; larger is dropped")

    b = sub.add_parser("baseline", help="the 1-GPU ALST baseline step under DeepSpeed ZeRO-3")
    b.add_argument("--out-dir", required=True)
    b.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    b.add_argument("--model", default=os.path.join(ROOT, "data", "models", "llama3-8b.json"))
    b.add_argument("--seq", type=int, default=32000)
    for name in ("layers", "hidden", "intermediate", "heads", "kv-heads", "vocab"):
        b.add_argument("--" + name, type=int, default=0, help="override the model config's")
    b.add_argument("--trainable-layers", default="all",
                   help="'all', or how many of the last layers train (the others are frozen; "
                        "the embedding, final norm and head always train)")
    b.add_argument("--optimizer", choices=("torch-adamw", "ds-cpu-adam"), default="torch-adamw")
    b.add_argument("--steps", type=int, default=1, help="training steps (forward, backward, "
                   "optimizer step each); DeepSpeed prefetches parameters from the second on")
    b.add_argument("--max-entries", type=int, default=400_000)
    b.add_argument("--raw-snapshot", action="store_true")
    b.add_argument("--raw-limit", type=int, default=12 << 20, help="bytes; larger is dropped")

    m = sub.add_parser("manifest", help="gpu-trace.sh's manifest.json")
    m.add_argument("--out-dir", required=True)
    m.add_argument("--steps", required=True, help="TSV: name, status, seconds, detail")
    m.add_argument("--mode", default="gpu")
    m.add_argument("--traces-status", help="TSV: impl, shape, status, seconds")

    args = parser.parse_args(argv)
    return {"trace": cmd_trace, "baseline": cmd_baseline, "manifest": cmd_manifest}[
        args.command](args)


if __name__ == "__main__":
    sys.exit(main())
