"""A stand-in for the `flash_attn` package (FlashAttention-2, 2.8.3's Python interface), whose
CUDA kernels have no CPU path.

The traced code imports `flash_attn.flash_attn_interface` and calls `_flash_attn_forward`,
`_flash_attn_backward` (and the varlen ones) by keyword from their parameter names
(ring-flash-attention builds its keyword arguments from the signature), so the names and defaults
below are those of flash-attention v2.8.3 `flash_attn/flash_attn_interface.py`.

Per call, what the real interface and kernel allocate, and how the stand-in shows it:
  - the interface's `maybe_contiguous` copies (a non-unit last stride): done for real, so traced;
  - the kernel's outputs (`mha_fwd` in csrc/flash_attn/flash_api.cpp: out = empty_like(q),
    softmax_lse [B, H, S] fp32, rng_state [2] int64; `mha_bwd`: dq/dk/dv when the caller passes
    none, softmax_d [B, H, round128(S)] fp32): made with the attention computed in fp32 by
    PyTorch's math while the recorder is paused, then recorded as the stand-in's allocations;
  - the kernel's internal workspaces, freed before it returns (`mha_bwd`: dq_accum
    [B, round128(S), H, round32(d)] fp32 (rounded as flash_api.cpp rounds head_size);
    dk_expanded/dv_expanded [B, Sk, H, d] when H != Hkv): read from source, recorded as allocated
    and freed inside the call with `source_read` in their stand-in name.
"""

from __future__ import annotations

import math
import sys
import types

import torch

from .recorder import AllocationRecorder

VERSION = "2.8.3"
_recorder: AllocationRecorder | None = None


def _round_multiple(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _head_size_rounded(d: int) -> int:
    # flash_api.cpp: head_size <= 192 ? round_multiple(head_size, 32) : 256
    return _round_multiple(d, 32) if d <= 192 else 256


def maybe_contiguous(x):
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def _math_attention(q, k, v, softmax_scale, causal):
    """out [B, S, H, d] and lse [B, H, S] of softmax attention, in fp32 (GQA by repetition)."""
    b, s, h, d = q.shape
    hk = k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    scores = qf @ kf.transpose(-1, -2) * softmax_scale
    if causal:
        sk = k.shape[1]
        mask = torch.ones(s, sk, dtype=torch.bool).tril(sk - s)
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    lse = torch.nan_to_num(lse, neginf=0.0)
    p = torch.exp(scores - lse.unsqueeze(-1))
    return (p @ vf).transpose(1, 2), lse, p


def _record(t, name):
    if _recorder is not None:
        _recorder.record_stand_in_output(t, name)


def _workspaces(buffers):
    """Kernel-internal buffers read from source, live together inside the call: each is
    (shape, dtype, name); all are allocated, then all freed, before the call returns."""
    if _recorder is None:
        return
    with _recorder.paused():
        made = [(torch.empty(shape, dtype=dtype), name) for shape, dtype, name in buffers]
    for t, name in made:
        _recorder.record_stand_in_output(t, name + " (source_read)")
    del t
    made.clear()


def _flash_attn_forward(
    q,
    k,
    v,
    dropout_p,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    alibi_slopes=None,
    return_softmax=False,
):
    q, k, v = [maybe_contiguous(x) for x in (q, k, v)]
    if _recorder is not None:
        _recorder.count_stand_in_call()
    with _paused():
        o, lse, _ = _math_attention(q, k, v, softmax_scale, causal)
        out = torch.empty_like(q)
        out.copy_(o)
        softmax_lse = lse.contiguous()
        rng_state = torch.zeros(2, dtype=torch.int64)
        p = torch.empty(0, dtype=q.dtype)
    _record(out, "flash_attn.mha_fwd out")
    _record(softmax_lse, "flash_attn.mha_fwd softmax_lse")
    _record(rng_state, "flash_attn.mha_fwd rng_state")
    return out, softmax_lse, p, rng_state


def _flash_attn_backward(
    dout,
    q,
    k,
    v,
    out,
    softmax_lse,
    dq,
    dk,
    dv,
    dropout_p,
    softmax_scale,
    causal,
    window_size_left=-1,
    window_size_right=-1,
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    rng_state=None,
):
    dout, q, k, v, out = [maybe_contiguous(x) for x in (dout, q, k, v, out)]
    if _recorder is not None:
        _recorder.count_stand_in_call()
    b, s, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    made = []
    with _paused():
        qf = q.detach().float().requires_grad_()
        kf = k.detach().float().requires_grad_()
        vf = v.detach().float().requires_grad_()
        with torch.enable_grad():
            o, _, _ = _math_attention(qf, kf, vf, softmax_scale, causal)
            gq, gk, gv = torch.autograd.grad(o, (qf, kf, vf), dout.float())
        for name, buf, g, like in (("dq", dq, gq, q), ("dk", dk, gk, k), ("dv", dv, gv, v)):
            if buf is None:
                buf = torch.empty_like(like)
                made.append((buf, name))
            buf.copy_(g)
            if name == "dq":
                dq = buf
            elif name == "dk":
                dk = buf
            else:
                dv = buf
        softmax_d = torch.empty(b, h, _round_multiple(s, 128), dtype=torch.float32)
        softmax_d.zero_()
    # mha_bwd allocates its outputs (dq/dk/dv when not given, softmax_d) before its workspaces.
    for buf, name in made:
        _record(buf, f"flash_attn.mha_bwd {name}")
    _record(softmax_d, "flash_attn.mha_bwd softmax_d")
    buffers = [
        (
            (b, _round_multiple(s, 128), h, _head_size_rounded(d)),
            torch.float32,
            "flash_attn.mha_bwd dq_accum",
        )
    ]
    if hk != h:
        buffers.append(((b, sk, h, d), q.dtype, "flash_attn.mha_bwd dk_expanded"))
        buffers.append(((b, sk, h, d), q.dtype, "flash_attn.mha_bwd dv_expanded"))
    _workspaces(buffers)
    return softmax_d


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **_):
    """Forward and backward through the stand-ins (autograd.Function as the interface's)."""
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return _FlashAttnFunc.apply(q, k, v, scale, causal)


class _FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        out, lse, _, rng = _flash_attn_forward(q, k, v, 0.0, scale, causal)
        ctx.save_for_backward(q, k, v, out, lse, rng)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rng = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _flash_attn_backward(
            dout, q, k, v, out, lse, dq, dk, dv, 0.0, ctx.scale, ctx.causal, rng_state=rng
        )
        return dq, dk, dv, None, None


def flash_attn_func_interface(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """v2.8.3's `flash_attn_func` with its signature (callers probe it: transformers looks for
    `window_size`) and its FlashAttnFunc's allocations around the kernel stand-ins: the head-dim
    pad copies when d % 8 != 0 (done for real), `save_for_backward(q, k, v, out_padded,
    softmax_lse, rng_state)` when grad is enabled and an input requires it, out = a view of
    out_padded; in backward dq, dk, dv = `torch.empty_like` of the saved q, k, v (recorded as
    `flash_attn_interface.FlashAttnFunc.backward dq|dk|dv`, made like the interface's, so that
    each keeps its role), the dout pad copy, the kernel (`_flash_attn_backward`). Traced only
    with dropout 0, no window, softcap, ALiBi or returned probabilities."""
    traced = (
        dropout_p == 0.0
        and tuple(window_size) == (-1, -1)
        and softcap == 0.0
        and alibi_slopes is None
        and not return_attn_probs
    )
    if not traced:
        raise NotImplementedError("cpsim tracer: flash_attn_func option without a stand-in")
    return _FlashAttnFuncInterface.apply(
        q, k, v, softmax_scale, causal, deterministic, torch.is_grad_enabled()
    )


def _pad_head_dim(x, head_size_og):
    return torch.nn.functional.pad(x, [0, 8 - head_size_og % 8])


class _FlashAttnFuncInterface(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, deterministic, is_grad_enabled):
        is_grad = is_grad_enabled and any(x.requires_grad for x in (q, k, v))
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        head_size_og = q.size(3)
        if head_size_og % 8 != 0:
            q, k, v = (_pad_head_dim(x, head_size_og) for x in (q, k, v))
        out_padded, softmax_lse, _, rng_state = _flash_attn_forward(
            q, k, v, 0.0, softmax_scale, causal
        )
        if is_grad:
            ctx.save_for_backward(q, k, v, out_padded, softmax_lse, rng_state)
            ctx.softmax_scale, ctx.causal, ctx.deterministic = softmax_scale, causal, deterministic
        return out_padded[..., :head_size_og]

    @staticmethod
    def backward(ctx, dout, *args):
        q, k, v, out, softmax_lse, rng_state = ctx.saved_tensors
        grads = []
        for name, like in (("dq", q), ("dk", k), ("dv", v)):
            with _paused():
                buf = torch.empty_like(like)
            _record(buf, f"flash_attn_interface.FlashAttnFunc.backward {name}")
            grads.append(buf)
        dq, dk, dv = grads
        head_size_og = dout.size(3)
        dout_padded = dout
        if head_size_og % 8 != 0:
            dout_padded = _pad_head_dim(dout, head_size_og)
        _flash_attn_backward(
            dout_padded,
            q,
            k,
            v,
            out,
            softmax_lse,
            dq,
            dk,
            dv,
            0.0,
            ctx.softmax_scale,
            ctx.causal,
            deterministic=ctx.deterministic,
            rng_state=rng_state,
        )
        dq, dk, dv = (g[..., : dout.shape[-1]] for g in (dq, dk, dv))
        return dq, dk, dv, None, None, None, None


def flash_attn_varlen_func_interface(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """The interface's `flash_attn_varlen_func` signature, without a stand-in (the packed path is
    not traced). Its signature matters: transformers 4.57's `lazy_import_flash_attention` passes
    the unpacked kernel too only the options (dropout_p, window_size, softcap, deterministic,
    s_aux) that this function's parameters name."""
    raise NotImplementedError("cpsim tracer: flash_attn_varlen_func has no stand-in yet")


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _paused():
    return _recorder.paused() if _recorder is not None else _NullContext()


def _not_on_cpu(*_args, **_kwargs):
    raise NotImplementedError("cpsim tracer: this flash_attn entry point has no stand-in yet")


def _module(name: str, is_package: bool = False) -> types.ModuleType:
    """A module with a spec, as an imported one has: `importlib.util.find_spec(name)` raises
    ValueError for a module in sys.modules whose `__spec__` is None (transformers 4.57 calls it
    for "flash_attn" when its flash-attention path first runs). No distribution metadata comes
    with it, so `importlib.metadata.version("flash_attn")` still finds none."""
    import importlib.machinery  # here: a line above would move the recorded stand-in frames

    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=is_package)
    if is_package:
        module.__path__ = []  # a package, so `import flash_attn.flash_attn_interface` works
    return module


def install(recorder: AllocationRecorder | None) -> None:
    """Puts the stand-in in sys.modules as `flash_attn` (before the traced package imports it)."""
    global _recorder
    _recorder = recorder
    pkg = _module("flash_attn", is_package=True)
    pkg.__version__ = VERSION
    iface = _module("flash_attn.flash_attn_interface")
    for name in (
        "_flash_attn_forward",
        "_flash_attn_backward",
        "flash_attn_func",
        "maybe_contiguous",
    ):
        setattr(iface, name, globals()[name])
        setattr(pkg, name, globals()[name])
    for name in (
        "_flash_attn_varlen_forward",
        "_flash_attn_varlen_backward",
        "flash_attn_varlen_func",
        "flash_attn_qkvpacked_func",
        "flash_attn_kvpacked_func",
        "flash_attn_varlen_qkvpacked_func",
        "flash_attn_varlen_kvpacked_func",
        "flash_attn_with_kvcache",
    ):
        setattr(iface, name, _not_on_cpu)
        setattr(pkg, name, _not_on_cpu)
    pkg.flash_attn_interface = iface
    # bert_padding: (un)padding around the varlen kernel, used with an attention mask only.
    bert_padding = _module("flash_attn.bert_padding")
    for name in ("pad_input", "unpad_input", "index_first_axis"):
        setattr(bert_padding, name, _not_on_cpu)
    pkg.bert_padding = bert_padding
    sys.modules["flash_attn"] = pkg
    sys.modules["flash_attn.flash_attn_interface"] = iface
    sys.modules["flash_attn.bert_padding"] = bert_padding
    assert math  # noqa: S101 (used by drivers through this module's namespace)
