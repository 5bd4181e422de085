"""The tracer's GPU leg without a GPU: scripts/gpu-trace.sh --dry-run (the same steps on the CPU,
tiny shapes) into a temporary OUT, its manifest and outputs; and the parts of
calibrate/tracer/gpu_leg.py that only a GPU run reaches, by hand: the allocator history's
condensation and its join to the recorder, the SDPA guard, the recorder links."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tarfile
import time
from unittest import mock

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "calibrate", "tracer"))

import gpu_leg  # noqa: E402
from cpsim_tracer.recorder import AllocationRecorder  # noqa: E402

STEPS = ["wheels", "list", "traces", "baseline", "pack"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-trace")
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    t0 = time.monotonic()
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-trace.sh"), "--dry-run",
                        "--pack"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    unpacked = out / "unpacked"
    for name in ("traces.tar.gz", "baseline.tar.gz"):
        if (out / name).exists():
            with tarfile.open(out / name) as tar:
                tar.extractall(unpacked, filter="data")
    log = (out / "gpu-trace.log").read_text()
    return {"out": out, "unpacked": unpacked, "seconds": seconds, "log": log,
            "manifest": json.loads((out / "manifest.json").read_text())}


def test_dry_run_manifest(dry_run):
    m = dry_run["manifest"]
    assert m["schema"] == gpu_leg.MANIFEST_SCHEMA and m["mode"] == "dry-run"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["date"])
    assert m["device"]["name"] == "cpu (dry run)"
    for key in ("driver", "driver_cuda", "torch_cuda"):
        assert key in m["device"]
    for package in ("torch", "transformers", "deepspeed"):
        assert m["versions"][package], package
    assert [s["name"] for s in m["steps"]] == STEPS
    for s in m["steps"]:
        assert isinstance(s["seconds"], float) and s["seconds"] >= 0
        assert s["status"] in ("ok", "skipped", "partial"), (s, dry_run["log"])
    status = {s["name"]: s["status"] for s in m["steps"]}
    assert status["wheels"] == "skipped" and status["list"] == "ok"
    assert status["baseline"] == "ok", dry_run["log"]
    assert status["pack"] == "ok"
    # What a lent GPU machine hands back: at most 8 files, none deeper than two folders.
    top = sorted(p.name for p in dry_run["out"].iterdir() if p.is_file())
    assert top == ["baseline.tar.gz", "gpu-trace.log", "manifest.json", "traces.tar.gz"]
    listed = {o for o in m["outputs"] if ":" not in o}
    assert listed == set(top) - {"manifest.json"}
    assert "baseline.tar.gz:baseline/baseline.json" in m["outputs"]
    print(f"dry run: {dry_run['seconds']:.1f} s")


def test_dry_run_traces(dry_run):
    m = dry_run["manifest"]
    traces = dry_run["unpacked"] / "traces"
    listed = [line.split(":")[0] for line in (traces / "list.txt").read_text().splitlines()]
    assert listed and sorted(t["impl"] for t in m["traces"]) == sorted(listed)
    assert any(t["status"] == "ok" for t in m["traces"])
    for t in m["traces"]:
        doc = json.loads((traces / f"{t['impl']}--{t['shape']}.json").read_text())
        assert doc["schema"] == gpu_leg.TRACE_SCHEMA
        assert (doc["impl"], doc["shape"], doc["device"]) == (t["impl"], t["shape"], "cpu")
        assert doc["cuda"] is None  # no CUDA call in a dry run
        assert doc["gpu_leg"]["default_device"] == "cpu"
        assert (t["status"] == "ok") == (doc["error"] is None), doc["error"]
        if doc["error"] is None:
            trace = doc["trace"]
            assert trace["schema"] == "cpsim.alloc-trace/1"
            assert trace["implementation"] == t["impl"] and trace["shape"]["name"] == t["shape"]
            assert any(e["event"] == "alloc" for e in trace["events"])


def test_dry_run_baseline(dry_run):
    doc = json.loads((dry_run["unpacked"] / "baseline" / "baseline.json").read_text())
    assert doc["schema"] == gpu_leg.BASELINE_SCHEMA and doc["error"] is None
    assert [p["phase"] for p in doc["phases"]] == [
        "start", "build", "initialize", "forward", "backward", "step", "forward#2", "backward#2",
        "step#2"]
    assert len(doc["losses"]) == 2 and all(math.isfinite(x) and x > 0 for x in doc["losses"])
    cfg = doc["model_config"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (2, 256, 1024)
    assert cfg["rope_theta"] == 500000.0 and cfg["num_attention_heads"] == 4 * cfg[
        "num_key_value_heads"]
    params = doc["parameters"]
    assert 0 < params["frozen"] < params["total"] == params["frozen"] + params["trainable"]
    zero = doc["ds_config"]["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "cpu"
    assert doc["ds_config"]["bf16"]["enabled"] and doc["cuda"] is None


# -- the GPU-only parts, by hand -----------------------------------------------------------------
def _frames(*names):
    """An allocator stack, innermost first: the named upstream function above torch's frames."""
    torch_file = os.path.join(os.path.dirname(torch.__file__), "nn", "functional.py")
    return [{"filename": torch_file, "line": 1, "name": "f"}] + [
        {"filename": f"/x/site-packages/pkg/{n}.py", "line": 7, "name": n} for n in names]


def test_condense_history_joins_the_recorder_by_metadata():
    def e(action, addr, size, meta="", frames=()):
        d = {"action": action, "addr": addr, "size": size, "user_metadata": meta}
        if frames:
            d["frames"] = list(frames)
        return d

    entries = [
        e("segment_alloc", 0x1000, 2 << 20),
        e("alloc", 0x1000, 512, "cpsim 0 forward q_exchange", _frames("a2a")),  # recorder id 1
        e("alloc", 0x2000, 1024, "cpsim 1 forward core_forward", _frames("kernel")),  # workspace
        e("free_requested", 0x2000, 1024, "cpsim 1 forward core_forward"),
        e("free_completed", 0x2000, 1024, "cpsim 1 forward core_forward"),
        e("alloc", 0x2000, 1024, "cpsim 1 forward core_forward", _frames("kernel")),  # id 2
        e("free_requested", 0x1000, 512, "cpsim 3 backward untracked"),
        e("alloc", 0x1000, 512, "cpsim 4 backward untracked", _frames("late")),  # after id 3
    ]
    recorder = [{"id": 1, "seq": 0, "ptr": 0x1000, "bytes": 500},
                {"id": 2, "seq": 1, "ptr": 0x2000, "bytes": 1000},
                {"id": 3, "seq": 2, "ptr": 0x3000, "bytes": 8}]  # never on the device
    h = gpu_leg.condense_history(entries, recorder)
    allocs = [r for r in h["rows"] if h["actions"][r[0]] == "alloc"]
    assert [r[5] for r in allocs] == [1, -1, 2, -1]
    assert h["join"] == {"method": "metadata", "recorder_allocs": 3, "joined": 2}
    assert h["frames"][allocs[1][3]] == "pkg/kernel.py:7 (kernel)"
    assert h["peak_allocated_bytes"] == 512 + 1024 + 1024 - 1024
    assert h["reserved_growth_peak_bytes"] == 2 << 20
    s = h["summary"]
    assert s["allocated_bytes_seen_by_recorder"] == 1536
    workspace = next(n for n in s["not_seen"] if n["frame"] == "pkg/kernel.py:7 (kernel)")
    assert (workspace["phase"], workspace["site"], workspace["count"]) == (
        "forward", "core_forward", 1)
    assert workspace["freed_within_one_call"] == 1
    frees = [r for r in h["rows"] if h["actions"][r[0]] == "free_requested"]
    assert [r[1] for r in frees] == [allocs[1][1], allocs[0][1]]


def test_condense_history_without_metadata_joins_by_address_order():
    entries = [{"action": "alloc", "addr": 0x10, "size": 256, "frames": _frames("w")},
               {"action": "free_requested", "addr": 0x10, "size": 256},
               {"action": "alloc", "addr": 0x10, "size": 1024, "frames": _frames("t")}]
    h = gpu_leg.condense_history(entries, [{"id": 7, "seq": 0, "ptr": 0x10, "bytes": 1000}])
    assert h["join"]["method"] == "address-order" and h["join"]["joined"] == 1
    assert [r[5] for r in h["rows"]] == [-1, -1, 7]
    assert h["summary"]["not_seen"][0]["freed_within_one_call"] is None


def test_sdpa_guard_keeps_torch_sdpa_and_names_the_stand_in():
    functional = torch.nn.functional
    real = functional.scaled_dot_product_attention

    def stand_in(*args, **kwargs):
        raise AssertionError("not called")

    with gpu_leg._real_sdpa(torch) as refused:
        with mock.patch.object(functional, "scaled_dot_product_attention", stand_in):
            assert functional.scaled_dot_product_attention is real
        assert refused == [f"{__name__}.{stand_in.__qualname__}"]
    with mock.patch.object(functional, "scaled_dot_product_attention", stand_in):
        assert functional.scaled_dot_product_attention is stand_in
    assert functional.scaled_dot_product_attention is real


def test_recorder_links_note_addresses_and_restore_the_recorder():
    original = AllocationRecorder._record_alloc
    allocs = []
    x = torch.ones(8)
    with gpu_leg._recorder_links(torch, False, allocs) as has_metadata:
        rec = AllocationRecorder()
        with rec:
            with rec.site("core_forward"):
                y = x.exp()
    assert not has_metadata
    assert AllocationRecorder._record_alloc is original
    assert [(a["bytes"], a["device"]) for a in allocs] == [(32, "cpu")]
    assert allocs[0]["ptr"] == y.untyped_storage().data_ptr()
    assert allocs[0]["id"] == rec.events[0].id


def test_the_cpu_flash_ops_take_cuda_kernels_and_give_them_back():
    lib = gpu_leg._cpu_flash_ops_on_cuda(torch)  # registers without a GPU
    lib._destroy()
