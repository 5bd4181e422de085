#!/usr/bin/env python3
"""Measure what a Hugging Face causal LM's training step allocates on one GPU.

For each sequence length: one forward with labels (the model's own loss) and one backward, with
activation checkpointing, random weights built from a config file (cpsim's data/models/*.json are
Hugging Face config.json files). Gradients are dropped as soon as each is accumulated (a hook sets
param.grad to None), which stands in for ZeRO-3 moving them off the GPU; no optimizer step runs.
Recorded per length (bytes, PyTorch's caching allocator counters):

  static_bytes            allocated before the step (weights and buffers)
  forward_peak_bytes      peak during the forward and the loss
  after_forward_bytes     allocated after the forward (what the backward starts from)
  backward_peak_bytes     peak during the backward
  reserved_peak_bytes     the allocator's reserved peak over the step
  layer_forward_bytes     allocated at each decoder layer's exit in the forward

For one length (--snapshot-len) the allocator's event history is condensed: every allocation and
free of the step with the Python frame that made it, and the blocks live at the step's peak. With
--profile-len, one step runs under torch.profiler and the GPU kernels' total time is listed (which
attention backend ran, and what the step spends its time on).

  python3 hf_memory_snapshot.py --model data/models/llama3-8b.json --lens 8K,16K,32K \
      --snapshot-len 16K --profile-len 8K --out hf-memory.json

The output, "cpsim.memory-snapshot/1", is read by a person or a test; it is a measurement of one
software stack (torch, transformers, their versions are recorded), not a model.
"""

import argparse
import datetime
import json
import sys
import time
import traceback

from cpsim_script_common import write_atomically

SCHEMA = "cpsim.memory-snapshot/1"


def write_document(path, doc):
    write_atomically(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def parse_len(text):
    t = text.strip().upper()
    if t.endswith("K"):
        return int(t[:-1]) * 1024
    if t.endswith("M"):
        return int(t[:-1]) * 1024 * 1024
    return int(t)


def build_model(torch, config_path, attn, layers):
    import transformers

    with open(config_path) as f:
        cfg = json.load(f)
    keep = {k: v for k, v in cfg.items() if k not in ("name", "source", "_name_or_path")}
    if layers:
        keep["num_hidden_layers"] = layers
    config = transformers.AutoConfig.for_model(keep.pop("model_type"), **keep)
    config.use_cache = False
    try:
        config._attn_implementation = attn
    except Exception:  # noqa: BLE001 - newer transformers: set through the constructor below
        pass
    cls = getattr(transformers, cfg["architectures"][0])
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        try:
            model = cls._from_config(config, attn_implementation=attn, dtype=torch.bfloat16)
        except TypeError:
            model = cls._from_config(config, attn_implementation=attn, torch_dtype=torch.bfloat16)
    torch.set_default_dtype(torch.float32)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    return model, config


def decoder_layers(model):
    for name in ("model.layers", "transformer.h"):
        obj = model
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
            return list(obj)
        except AttributeError:
            continue
    return []


def one_step(torch, model, seq, layer_marks):
    ids = torch.randint(0, model.config.vocab_size, (1, seq), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    static = torch.cuda.memory_allocated()
    layer_marks.clear()
    t0 = time.perf_counter()
    out = model(input_ids=ids, labels=ids)
    loss = out.loss
    del out
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    fwd_peak = torch.cuda.max_memory_allocated()
    after_fwd = torch.cuda.memory_allocated()
    forward_marks = list(layer_marks)
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    bwd_peak = torch.cuda.max_memory_allocated()
    stats = torch.cuda.memory_stats()
    del loss, ids
    return {
        "seq": seq,
        "static_bytes": static,
        "forward_peak_bytes": fwd_peak,
        "after_forward_bytes": after_fwd,
        "backward_peak_bytes": bwd_peak,
        "after_backward_bytes": torch.cuda.memory_allocated(),
        "reserved_peak_bytes": stats.get("reserved_bytes.all.peak", 0),
        "layer_forward_bytes": forward_marks,
        "forward_s": t1 - t0,
        "backward_s": t2 - t1,
    }


def frame_label(frames):
    """The model-code frames of an allocation (transformers), then the torch frames at both ends."""
    def short(fr):
        name = fr.get("filename", "")
        return "/".join(name.split("/")[-2:]) + ":" + str(fr.get("line", 0)) + " " + fr.get(
            "name", "")

    model = [short(fr) for fr in frames if "transformers/" in fr.get("filename", "")]
    torch_frames = [short(fr) for fr in frames if "torch/" in fr.get("filename", "")]
    if len(model) > 6:
        model = model[:3] + ["..."] + model[-3:]
    ends = torch_frames[:1] + torch_frames[-1:] if torch_frames else []
    return " | ".join(model) + (" <- " + " / ".join(ends) if ends else "")


def condense_trace(trace):
    """Allocations and frees of an allocator trace (torch.cuda.memory._snapshot()'s device_traces
    entry) with the frame that made each, and the blocks live at the peak of their running sum."""
    labels = {}
    events = []
    live = {}
    live_bytes = 0
    peak = (0, -1, {})
    for e in trace:
        action = e.get("action")
        if action not in ("alloc", "free_completed"):
            continue
        idx = labels.setdefault(frame_label(e.get("frames", [])), len(labels))
        size = int(e.get("size", 0))
        if action == "alloc":
            live[e["addr"]] = (size, idx)
            live_bytes += size
            events.append([1, size, idx])
            if live_bytes > peak[0]:
                peak = (live_bytes, len(events) - 1, dict(live))
        else:
            was = live.pop(e["addr"], None)
            if was is not None:
                live_bytes -= was[0]
            events.append([0, size, idx])
    names = [None] * len(labels)
    for k, v in labels.items():
        names[v] = k
    at_peak = {}
    for size, idx in peak[2].values():
        entry = at_peak.setdefault(names[idx], [0, 0])
        entry[0] += 1
        entry[1] += size
    return {
        "frames": names,
        "events": events,
        "peak_step_bytes": peak[0],
        "peak_event": peak[1],
        "live_at_peak": sorted(([k, v[0], v[1]] for k, v in at_peak.items()),
                               key=lambda r: (-r[2], r[0])),
    }


def condensed_history(torch, model, seq):
    """Every allocation and free of one step, with the frame that made it, and the peak's blocks."""
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=400000)
    try:
        one_step(torch, model, seq, [])
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0] if snap.get("device_traces") else []
    doc = {"seq": seq,
           "note": "bytes of blocks allocated during the step (the weights were allocated before "
                   "and are not listed); sizes are the allocator's rounded block sizes"}
    doc.update(condense_trace(trace))
    return doc


def profiled_kernels(torch, model, seq):
    from torch.profiler import ProfilerActivity, profile

    one_step(torch, model, seq, [])  # warm-up at this length
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        one_step(torch, model, seq, [])
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append([ev.key[:160], int(ev.count), float(t) * 1e-6])
    rows.sort(key=lambda r: -r[2])
    return {"seq": seq, "kernels_by_gpu_time": rows[:60],
            "gpu_time_total_s": sum(r[2] for r in rows)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face config.json (cpsim data/models)")
    p.add_argument("--lens", default="8K,16K,32K")
    p.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, flash_attention_2…)")
    p.add_argument("--layers", type=int, default=0, help="override num_hidden_layers")
    p.add_argument("--snapshot-len", default="")
    p.add_argument("--profile-len", default="")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch
    import transformers

    doc = {"schema": SCHEMA,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "argv": sys.argv, "device": torch.cuda.get_device_name(0),
           "device_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
           "torch": torch.__version__, "torch_cuda": str(torch.version.cuda),
           "transformers": transformers.__version__,
           "set_up": "random weights in bf16 on the GPU; activation checkpointing "
                     "(use_reentrant=False); the model's own loss with labels=input_ids; "
                     "each gradient dropped when accumulated; no optimizer",
           "steps": [], "errors": []}
    model, config = build_model(torch, args.model, args.attn, args.layers)
    doc["attn_implementation"] = getattr(config, "_attn_implementation", args.attn)
    doc["num_hidden_layers"] = config.num_hidden_layers
    marks = []
    for layer in decoder_layers(model):
        layer.register_forward_hook(
            lambda m, i, o: marks.append(torch.cuda.memory_allocated()) if torch.is_grad_enabled()
            else None)
    write_document(args.out, doc)
    for key, fn in (("profile", profiled_kernels), ("snapshot", condensed_history)):
        text = args.profile_len if key == "profile" else args.snapshot_len
        if not text:
            continue
        try:
            doc[key] = fn(torch, model, parse_len(text))
        except Exception:  # noqa: BLE001 - recorded
            doc["errors"].append({key: traceback.format_exc()[-2000:]})
        torch.cuda.empty_cache()
        write_document(args.out, doc)
        print(f"hf_memory_snapshot: {key} done", file=sys.stderr, flush=True)
    for text in args.lens.split(","):
        seq = parse_len(text)
        try:
            doc["steps"].append(one_step(torch, model, seq, marks))
        except torch.cuda.OutOfMemoryError as e:
            doc["steps"].append({"seq": seq, "out_of_memory": str(e).split("\n")[0][:400],
                                 "peak_bytes_before_failure": torch.cuda.max_memory_allocated()})
        except Exception:  # noqa: BLE001 - recorded, the next length still runs
            doc["errors"].append({"seq": seq, "error": traceback.format_exc()[-2000:]})
        torch.cuda.empty_cache()
        write_document(args.out, doc)
        print(f"hf_memory_snapshot: {seq} done", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
