"""What the measurement scripts in this folder share (imported from beside them): atomic output,
the raw format's context, and timing with CUDA events through PyTorch."""

import datetime
import math
import os
import statistics
import sys
import tempfile


def write_atomically(path, text):
    """Write through a temporary file and a rename: never a half-written output."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cpsim-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def driver_release():
    """The first word after "Kernel Module" that starts with a digit and holds a dot (the open
    module's line reads "... Open Kernel Module for x86_64  580.159.04 ...")."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split("Kernel Module")
    except OSError:
        return "unknown"
    for word in (words[1] if len(words) > 1 else words[0]).split():
        if word[:1].isdigit() and "." in word:
            return word
    return "unknown"


def make_context(device, gpu_count, device_count, runtime, nccl, sm_count, memory, l2, quick,
                 warmup, repetitions, rotation_bytes, notes):
    return {
        "device": device,
        "gpu_count": gpu_count,
        "device_count": device_count,
        "driver_version": driver_release(),
        "cuda_driver_version": "unknown",
        "cuda_runtime_version": runtime or "unknown",
        "nccl_version": nccl or "none",
        "cublaslt_version": "unknown",
        "sm_count": int(sm_count),
        "hbm_capacity_bytes": int(memory),
        "l2_cache_bytes": int(l2),
        "sm_clock_max_mhz": 0.0,
        "memory_clock_max_mhz": 0.0,
        "sm_clock_measured_mhz": 0.0,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpsim_version": "calibrate/scripts/torch_attention_timing.py",
        "argv": list(sys.argv),
        "quick": bool(quick),
        "method": {"timer": "torch-cuda-event", "statistic": "median", "warmup": int(warmup),
                   "repetitions": int(repetitions), "rotation_bytes": int(rotation_bytes)},
        "notes": list(notes),
    }


def selftest_context():
    """The context of a --selftest file: made-up timings, an H100-like device."""
    return make_context("selftest device (made-up timings)", 1, 1, "0.0", None, 132, 80 * 2**30,
                        50 * 2**20, True, 2, 5, 100 * 2**20,
                        ["--selftest: timings are invented, not measured"])


class Timer:
    def __init__(self, torch, warmup, repetitions, target_rep_s=2e-3, max_inner=64):
        self.torch = torch
        self.warmup = warmup
        self.repetitions = repetitions
        self.target_rep_s = target_rep_s
        self.max_inner = max_inner

    def median_s(self, launch):
        """Median seconds per call of launch(i), i counting calls (for buffer rotation)."""
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        i = 0
        start.record()
        launch(i)
        i += 1
        stop.record()
        stop.synchronize()
        estimate = max(start.elapsed_time(stop) * 1e-3, 1e-7)
        if estimate < 0.05:
            for _ in range(1, self.warmup):
                launch(i)
                i += 1
        inner = int(min(max(math.ceil(self.target_rep_s / estimate), 1), self.max_inner))
        reps = 3 if estimate > 0.25 else (5 if estimate > 0.05 else self.repetitions)
        times = []
        for _ in range(reps):
            start.record()
            for _ in range(inner):
                launch(i)
                i += 1
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e-3 / inner)
        return statistics.median(times)


class TimedDevice:
    """The GPU a script measures, with the timing settings every script uses: buffers rotated over
    at least twice the L2 (100 MiB at least), warm-up and repetitions (fewer with --quick)."""

    def __init__(self, torch, device, quick, script):
        if not torch.cuda.is_available():
            sys.exit(script + ": no CUDA device")
        self.dev = torch.device(device)
        torch.cuda.set_device(self.dev)
        self.props = torch.cuda.get_device_properties(self.dev)
        self.l2 = getattr(self.props, "L2_cache_size", 50 * 1024 * 1024)
        self.rotation = max(2 * self.l2, 100 * 1024 * 1024)
        self.warmup, self.repetitions = (2, 5) if quick else (3, 10)
        self.timer = Timer(torch, self.warmup, self.repetitions, 1e-3 if quick else 2e-3)
