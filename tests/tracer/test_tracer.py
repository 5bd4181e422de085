"""The allocation tracer's own parts, by hand: the recorder, the flash_attn stand-in, and the
ledger check's formulas and row statuses."""

from __future__ import annotations

import gc
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "calibrate", "tracer"))

import check_ledgers  # noqa: E402
from cpsim_tracer import flash_stand_in  # noqa: E402
from cpsim_tracer.recorder import AllocationRecorder  # noqa: E402


def allocs(rec):
    return [e for e in rec.events if e.kind == "alloc"]


def test_records_new_storages_not_views_or_in_place_results():
    x = torch.ones(4, 8)  # 128 bytes, made before recording: not an allocation
    rec = AllocationRecorder()
    with rec:
        with rec.site("a"):
            y = x.exp()  # new: 128 B
            v = y.view(32)  # a view: same storage
            y.mul_(2)  # in place
            z = y.to(torch.bfloat16)  # new: 64 B
        del v, y
        gc.collect()
    a = allocs(rec)
    assert [(e.bytes, e.dtype, e.site, e.op) for e in a] == [
        (128, "float32", "a", "exp"),
        (64, "bfloat16", "a", "_to_copy"),
    ]
    frees = [e for e in rec.events if e.kind == "free"]
    assert [(e.id, e.bytes) for e in frees] == [(a[0].id, 128)]
    assert z.numel() == 32
    # Launches: exp, mul_, _to_copy; the view launches nothing.
    assert rec.op_counts == {("setup", "a"): 3}


def test_saved_tensors_live_until_backward_frees_them():
    x = torch.ones(16, requires_grad=True)
    rec = AllocationRecorder()
    with rec:
        rec.set_phase("forward")
        y = x.exp()  # saved by exp's backward
        loss = y.sum()
        del y
        gc.collect()
        assert not [e for e in rec.events if e.kind == "free"]
        rec.set_phase("backward")
        loss.backward()
    freed = {e.id for e in rec.events if e.kind == "free"}
    exp_alloc = next(e for e in rec.events if e.kind == "alloc" and e.op == "exp")
    assert exp_alloc.id in freed
    assert (
        next(e for e in rec.events if e.kind == "free" and e.id == exp_alloc.id).phase == "backward"
    )


def test_site_entries_are_numbered():
    rec = AllocationRecorder()
    with rec:
        for _ in range(2):
            with rec.site("step"):
                t = torch.zeros(4)
                del t
    a = allocs(rec)
    assert [e.site for e in a] == ["step", "step"]
    assert a[0].site_seq != a[1].site_seq


def test_stand_in_outputs_have_the_kernel_shapes_and_workspaces_are_freed():
    rec = AllocationRecorder()
    flash_stand_in.install(rec)
    b, s, h, hk, d = 1, 200, 4, 2, 16
    q = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    k = torch.randn(b, s, hk, d, dtype=torch.bfloat16)
    v = torch.randn(b, s, hk, d, dtype=torch.bfloat16)
    with rec:
        out, lse, _, rng = flash_stand_in._flash_attn_forward(q, k, v, 0.0, d**-0.5, True)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        softmax_d = flash_stand_in._flash_attn_backward(
            out, q, k, v, out, lse, dq, dk, dv, 0.0, d**-0.5, True, rng_state=rng
        )
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert lse.shape == (b, h, s) and lse.dtype == torch.float32
    assert softmax_d.shape == (b, h, 256)  # rounded up to a multiple of 128
    named = {e.stand_in: e.bytes for e in allocs(rec) if e.stand_in}
    assert named["flash_attn.mha_fwd out"] == b * s * h * d * 2
    assert named["flash_attn.mha_bwd dq_accum (source_read)"] == b * 256 * h * 32 * 4
    assert named["flash_attn.mha_bwd dk_expanded (source_read)"] == b * s * h * d * 2
    ws = [e.id for e in allocs(rec) if "source_read" in e.stand_in]
    freed = {e.id for e in rec.events if e.kind == "free"}
    assert set(ws) <= freed
    # The workspaces are live together, as inside the kernel: all allocated before any is freed.
    order = [(e.kind, e.id) for e in rec.events if e.id in ws]
    assert [k for k, _ in order] == ["alloc"] * len(ws) + ["free"] * len(ws)
    # The stand-in computes attention: compare with PyTorch's SDPA in fp32.
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(1, 2),
        k.float().repeat_interleave(2, 2).transpose(1, 2),
        v.float().repeat_interleave(2, 2).transpose(1, 2),
        is_causal=True,
    ).transpose(1, 2)
    assert torch.allclose(out.float(), ref, atol=2e-2)


def test_formula_and_when():
    units = check_ledgers.shape_units(
        {"seq": 64, "heads": 8, "kv_heads": 2, "head_dim": 16, "ulysses": 4}
    )
    # Hkv = 2 replicated to the Ulysses degree 4 (deepspeed-ulysses; the others refuse u > Hkv);
    # sHkv_m·d counts the model's 2.
    assert units == {
        "sHd": 16 * 8 * 16,
        "sHkv·d": 16 * 4 * 16,
        "sHkv_m·d": 16 * 2 * 16,
        "sH": 16 * 8,
    }
    assert check_ledgers.formula_bytes("2·sHd + 4·sHkv·d", units) == 2 * 2048 + 4 * 1024
    assert check_ledgers.formula_bytes("2·sHd + 4·sHkv_m·d", units) == 2 * 2048 + 4 * 512
    assert check_ledgers.formula_bytes("0", units) == 0
    with pytest.raises(ValueError):
        check_ledgers.formula_bytes("2·s", units)
    row = {"when": "hkv/u > 1"}
    assert not check_ledgers.row_applies(row, {"ulysses": 2, "kv_heads": 2})
    assert check_ledgers.row_applies(row, {"ulysses": 2, "kv_heads": 4})


def test_occurrences_are_peaks_per_site_entry_in_the_rows_phase():
    def alloc(i, row, site, phase, entry, n):
        return {
            "event": "alloc",
            "id": i,
            "row": row,
            "site": site,
            "phase": phase,
            "site_seq": entry,
            "bytes": n,
        }

    def free(i, n):
        return {"event": "free", "id": i, "bytes": n}

    trace = {
        "events": [
            alloc(1, "F1", "q_exchange", "forward", 3, 10),
            alloc(2, "F1", "q_exchange", "forward", 3, 5),  # both live: 15
            free(1, 10),
            alloc(3, "F1", "q_exchange", "forward", 3, 4),  # 9 live: the peak stays 15
            free(2, 5),
            free(3, 4),
            alloc(4, "F1", "q_exchange", "recompute", 9, 15),  # another phase
            alloc(5, "F1", "q_exchange", "forward", 4, 7),
            free(5, 7),
            alloc(6, "F1", "q_exchange", "forward", 4, 6),  # one at a time: 7
            free(6, 6),
            alloc(7, "F9", "core_forward", "forward", 5, 8),  # made before the row's site ...
            alloc(8, "F9", "out_exchange", "forward", 6, 2),  # ... and live in it: 10
            alloc(9, "", "out_exchange", "forward", 6, 100),  # not the row's
            alloc(10, "B1", "dout_exchange", "backward", 7, 1),
        ]
    }
    assert check_ledgers.occurrences(trace, {"id": "F1", "site": "q_exchange"}) == [15, 7]
    assert check_ledgers.occurrences(trace, {"id": "F9", "site": "out_exchange"}) == [10]
    assert check_ledgers.occurrences(trace, {"id": "B1", "site": "dout_exchange"}) == [1]


def test_rows_after_the_kernel_apply_at_ring_degree_1_only():
    row = {"when": "always", "site": "grad_finish"}
    assert check_ledgers.row_applies(row, {"ulysses": 2, "ring": 1})
    assert not check_ledgers.row_applies(row, {"ulysses": 2, "ring": 2})
    assert check_ledgers.row_applies({"when": "always", "site": "dq_exchange"}, {"ring": 2})


def test_held_rows_are_followed_through_their_phase():
    events = [
        {
            "event": "alloc",
            "id": 1,
            "row": "F9",
            "site": "kv_exchange",
            "phase": "forward",
            "site_seq": 2,
            "bytes": 4,
        },
        {
            "event": "alloc",
            "id": 2,
            "row": "",
            "site": "core_forward",
            "phase": "forward",
            "site_seq": 3,
            "bytes": 100,
        },
        {
            "event": "alloc",
            "id": 3,
            "row": "F9",
            "site": "core_forward",
            "phase": "forward",
            "site_seq": 3,
            "bytes": 4,
        },
        {"event": "free", "id": 1, "bytes": 4},
    ]
    row = {"id": "F9", "site": "held_through_block"}
    assert check_ledgers.occurrences({"events": events}, row) == [8]


def test_a_site_switch_opens_the_next_entry_inside_a_call():
    from cpsim_tracer.recorder import SiteSwitch

    rec = AllocationRecorder()
    sites = SiteSwitch(rec)
    with rec:
        with sites.span("core_backward"):
            a = torch.zeros(4)
            sites.switch("grad_finish")
            b = torch.zeros(4)
        c = torch.zeros(4)
    got = [(e.site, e.site_seq) for e in allocs(rec)]
    assert [s for s, _ in got] == ["core_backward", "grad_finish", "untracked"]
    assert got[0][1] != got[1][1]
    del a, b, c
