"""The parts of calibrate/scripts/hf_memory_snapshot.py that need no GPU and no PyTorch."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "calibrate", "scripts"))

import hf_memory_snapshot as h  # noqa: E402


def frame(path, line, name):
    return {"filename": path, "line": line, "name": name}


def main():
    assert h.parse_len("16K") == 16384
    assert h.parse_len("1M") == 1048576
    assert h.parse_len("3000") == 3000

    model = frame("/x/site-packages/transformers/models/llama/modeling_llama.py", 64, "forward")
    torch_fn = frame("/x/site-packages/torch/nn/functional.py", 3504, "cross_entropy")
    assert h.frame_label([model, torch_fn]) == \
        "llama/modeling_llama.py:64 forward <- nn/functional.py:3504 cross_entropy / " \
        "nn/functional.py:3504 cross_entropy"
    assert h.frame_label([]) == ""

    # alloc a (100), alloc b (50): peak 150 with both live; free a; alloc c (120): 170 is the
    # new peak with b and c; free b, c. A free of an address never allocated in the trace (a
    # block from before the recording) changes nothing.
    a, b, c = [model], [torch_fn], []
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": a},
        {"action": "alloc", "addr": 2, "size": 50, "frames": b},
        {"action": "free_requested", "addr": 1, "size": 100, "frames": a},
        {"action": "free_completed", "addr": 1, "size": 100, "frames": a},
        {"action": "free_completed", "addr": 99, "size": 1000, "frames": c},
        {"action": "alloc", "addr": 3, "size": 120, "frames": c},
        {"action": "free_completed", "addr": 2, "size": 50, "frames": b},
        {"action": "free_completed", "addr": 3, "size": 120, "frames": c},
    ]
    got = h.condense_trace(trace)
    assert got["peak_step_bytes"] == 170, got
    assert got["peak_event"] == 4, got  # the fifth kept event: c's allocation
    assert got["live_at_peak"] == [["", 1, 120], [h.frame_label(b), 1, 50]], got["live_at_peak"]
    assert len(got["events"]) == 7, got["events"]
    assert h.condense_trace([])["peak_step_bytes"] == 0
    print("hf_memory_snapshot_test: ok")


if __name__ == "__main__":
    main()
