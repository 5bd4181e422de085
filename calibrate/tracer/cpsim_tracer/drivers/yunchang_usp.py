"""yunchang's LongContextAttention (Ulysses all-to-all × zigzag ring flash attention), rank 0.

Sites: the four forward all-to-alls are q_exchange, kv_exchange (k, v) and out_exchange, in call
order; in backward the first is dout_exchange, then the one whose input is the ring attention's dq
is dq_exchange and the others dkv_exchange. At ring degree 1 the ring attention's forward is
core_forward, its backward core_backward up to the return of the flash kernel and grad_finish
after it (the fp32 casts, the dK/dV send_recv, the casts back). At ring degree > 1 each ring step
is an entry of ring_forward_step (a new one when the K/V exchange of a step is waited for) or
ring_backward_step (a new one after each step's dK/dV send_recv is committed); what follows the
last step (the wait for dK/dV and the return casts) is grad_finish.

classify() maps the upstream line (yunchang 0.6.4) of each allocation, with its site, to a row of
docs/implementations/yunchang-usp.md: a table row, "scheme:<id> ..." for what the method's scheme
holds, "upstream:<id> ..." for upstream-ledger tensors that neither accounts for.
"""

from __future__ import annotations

import contextlib
import weakref
from unittest import mock

import torch

from cpsim_tracer.recorder import SiteSwitch

IMPLEMENTATION = "yunchang-usp"
PACKAGES = ["yunchang", "ring-flash-attn", "torch"]
STAND_INS = [
    "flash_attn 2.8.3 interface (_flash_attn_forward/_flash_attn_backward) replaced by "
    "cpsim_tracer.flash_stand_in: outputs recorded as the kernel's, mha_bwd workspaces "
    "(dq_accum, GQA dk/dv_expanded) from source"
]


def _shape(seq, heads, kv_heads, head_dim, ulysses, ring):
    name = f"s{seq}-h{heads}-kv{kv_heads}"
    name += f"-d{head_dim}" if head_dim != 16 else ""
    name += f"-u{ulysses}" if ulysses > 1 else ""
    name += f"-r{ring}" if ring > 1 else ""
    return dict(
        name=name,
        seq=seq,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ulysses=ulysses,
        ring=ring,
    )


# Named s<N>-h<H>-kv<Hkv>[-d<d>][-u<u>][-r<r>] (d 16, u 1, r 1 left out). yunchang needs u | Hkv;
# the zigzag ring halves each rank's N/r tokens.
SHAPES = [
    _shape(64, 8, 4, 16, 4, 1),  # Ulysses, GQA, one KV head per rank
    _shape(128, 16, 8, 32, 4, 1),  # Ulysses, GQA, two KV heads per rank
    _shape(128, 4, 2, 16, 2, 1),  # Ulysses degree 2
    _shape(128, 8, 4, 16, 2, 2),  # USP
    _shape(256, 4, 2, 64, 1, 4),  # ring only
]


def world_size(shape: dict) -> int:
    return shape["ulysses"] * shape["ring"]


class _Sites:
    """The phase, and a site that hooks inside an upstream call switch to the next one."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.phase = "setup"
        self._switch = SiteSwitch(recorder)
        self.switchable = self._switch.span
        self.switch = self._switch.switch

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.recorder.set_phase(phase)


def run(recorder, shape: dict) -> None:
    import yunchang
    from yunchang import LongContextAttention
    from yunchang.comm import all_to_all as a2a
    from yunchang.kernels import AttnType
    from yunchang.ring import zigzag_ring_flash_attn as zz

    u, r = shape["ulysses"], shape["ring"]
    s = shape["seq"] // (u * r)
    h, hkv, d = shape["heads"], shape["kv_heads"], shape["head_dim"]
    yunchang.set_seq_parallel_pg(u, r, 0, u * r)
    attn = LongContextAttention(ring_impl_type="zigzag", attn_type=AttnType.FA)

    # The caller's tensors, made before recording (the ledger's F0 and B0).
    q = torch.randn(1, s, h, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, s, hkv, d, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, s, hkv, d, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(1, s, h, d, dtype=torch.bfloat16)

    sites = _Sites(recorder)
    calls = {"forward": 0, "backward": 0}
    ring_dq = [lambda: None]  # a weak reference to the ring attention's dq, once returned

    def exchange_site(inp: torch.Tensor) -> str:
        n = calls[sites.phase]
        calls[sites.phase] += 1
        if sites.phase == "forward":
            return ("q_exchange", "kv_exchange", "kv_exchange", "out_exchange")[n]
        if n == 0:
            return "dout_exchange"
        return "dq_exchange" if inp is ring_dq[0]() else "dkv_exchange"

    real_a2a = a2a.all_to_all_4D

    def all_to_all_4D(inp, *args, **kwargs):
        with recorder.site(exchange_site(inp)):
            return real_a2a(inp, *args, **kwargs)

    real_fwd, real_bwd = zz.zigzag_ring_flash_attn_forward, zz.zigzag_ring_flash_attn_backward

    def ring_forward(*args, **kwargs):
        with sites.switchable("core_forward" if r == 1 else "ring_forward_step"):
            return real_fwd(*args, **kwargs)

    def ring_backward(*args, **kwargs):
        with sites.switchable("core_backward" if r == 1 else "ring_backward_step"):
            grads = real_bwd(*args, **kwargs)
        ring_dq[0] = weakref.ref(grads[0])
        return grads

    real_select = zz.select_flash_attn_impl

    def select_flash_attn_impl(*args, **kwargs):
        kernel = real_select(*args, **kwargs)
        if r > 1 or sites.phase != "backward":
            return kernel

        def kernel_then_grad_finish(*kargs, **kkwargs):
            result = kernel(*kargs, **kkwargs)
            sites.switch("grad_finish")
            return result

        return kernel_then_grad_finish

    class RingComm(zz.RingComm):
        """Marks ring steps: forward's K/V wait, backward's dK/dV commit (the second comm)."""

        made = {"forward": 0, "backward": 0}

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.index = RingComm.made[sites.phase]  # backward: 0 kv_comm, 1 d_kv_comm
            RingComm.made[sites.phase] += 1
            self.commits = 0

        def wait(self):
            super().wait()
            if r > 1 and sites.phase == "forward":
                sites.switch("ring_forward_step")

        def commit(self):
            super().commit()
            self.commits += 1
            if r > 1 and sites.phase == "backward" and self.index == 1:
                sites.switch("ring_backward_step" if self.commits < r else "grad_finish")

    patches = [
        (a2a, "all_to_all_4D", all_to_all_4D),
        (zz, "zigzag_ring_flash_attn_forward", ring_forward),
        (zz, "zigzag_ring_flash_attn_backward", ring_backward),
        (zz, "select_flash_attn_impl", select_flash_attn_impl),
        (zz, "RingComm", RingComm),
    ]
    with contextlib.ExitStack() as stack:
        for module, name, replacement in patches:
            stack.enter_context(mock.patch.object(module, name, replacement))
        with recorder:
            sites.set_phase("forward")
            out = attn(q, k, v, causal=True)
            sites.set_phase("backward")
            out.backward(dout)
            del out
            q.grad = k.grad = v.grad = None


# Upstream lines of yunchang 0.6.4 (file, line) -> what allocates there.
_A2A = "yunchang/comm/all_to_all.py"
_ZZ = "yunchang/ring/zigzag_ring_flash_attn.py"
_RU = "yunchang/ring/utils.py"

# all_to_all_4D, per site: its copies (the table's rows) and its result (the scheme's tensor).
# Scatter 2 (q, k, v, dout): the input copy at :48; the receive buffer at :51 is the result (the
# .contiguous() at :65 copies nothing at batch 1). Scatter 1 (out, dq, dk, dv): the input copy at
# :82 and the receive buffer at :86; the result is the .contiguous() at :100.
_EXCHANGE_ROWS = {
    "q_exchange": ("F1", "scheme:F2 q all-to-all output"),
    "kv_exchange": ("F3+F5", "scheme:F4/F6 k, v all-to-all outputs"),
    "dout_exchange": ("B1", "scheme:B2 dout all-to-all output"),
    "out_exchange": ("F27+F28", "scheme:F29 block output"),
    "dq_exchange": ("B15+B16 (dq)", "scheme:B17 d_query"),
    "dkv_exchange": (("B15 (dk, dv)", "B16 (dk, dv)"), "scheme:B17 d_key, d_value"),
}
_A2A_COPIES = {48, 82, 86}
_A2A_INPUT_COPY = 82  # scatter 1's input copy; :86 is its receive buffer
_A2A_RESULT = {51, 65, 100}

_STAND_IN_ROWS = {
    "flash_attn.mha_fwd out": "F9+F14",
    "flash_attn.mha_fwd softmax_lse": "scheme:F10/F25 kernel softmax_lse (fp32)",
    "flash_attn.mha_fwd rng_state": "upstream:F11 rng_state",
    "flash_attn.mha_bwd softmax_d": "scheme:B7 softmax_d",
    "flash_attn.mha_bwd dq_accum (source_read)": "scheme:B8 dq_accum",
    "flash_attn.mha_bwd dk_expanded (source_read)": "scheme:B9 dk_expanded",
    "flash_attn.mha_bwd dv_expanded (source_read)": "scheme:B9 dv_expanded",
}

_LINE_ROWS = {
    (_RU, 40): "F9+F14",  # out = block_out.to(torch.float32), the first merge
    (_ZZ, 74): "scheme:F24 out.to(q.dtype)",
    (_ZZ, 107): "B3",  # softmax_lse1 = softmax_lse.chunk(2, dim=2)[1].contiguous()
    (_ZZ, 111): "scheme:B4 dq_buffer",
    (_ZZ, 112): "scheme:B5 dk_buffer",
    (_ZZ, 113): "scheme:B5 dv_buffer",
    (_ZZ, 147): "B11",
    (_ZZ, 148): "B12",
    (_ZZ, 149): "B12",
    (_ZZ, 183): "scheme:B14 return casts",
}


def _frame_line(frame: str) -> tuple[str, int]:
    location = frame.split(" ", 1)[0]
    path, _, line = location.rpartition(":")
    return path, int(line) if line.isdigit() else -1


def classify(event: dict, shape: dict) -> str | None:
    """The row (table, scheme or upstream ledger) of an allocation, by its site and line."""
    path, line = _frame_line(event["frame"])
    site, phase = event["site"], event["phase"]
    if event.get("stand_in"):
        return _STAND_IN_ROWS.get(event["stand_in"])
    if path == _A2A and site in _EXCHANGE_ROWS:
        copy_row, result_row = _EXCHANGE_ROWS[site]
        if line in _A2A_COPIES:
            if isinstance(copy_row, tuple):  # the input copy and the receive buffer apart
                return copy_row[0] if line == _A2A_INPUT_COPY else copy_row[1]
            return copy_row
        if line in _A2A_RESULT:
            return result_row
        return None
    if path == _RU and line == 94:  # RingComm.send_recv: torch.empty_like(to_send)
        if phase == "backward" and event["dtype"] == "float32":
            return "B13"  # next_dk, next_dv
        return "scheme:F8 next_k, next_v" if phase == "forward" else "scheme:B6 next_k, next_v"
    if path == _RU and line == 44:  # _update_out_and_lse (TorchScript) on the q1 half, steps >= 1
        return "upstream:F16-F23 _update_out_and_lse temporaries"
    return _LINE_ROWS.get((path, line))
