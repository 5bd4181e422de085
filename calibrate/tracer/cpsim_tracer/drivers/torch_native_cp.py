"""PyTorch's native context parallelism (ring SDPA) as TorchTitan 0.3.0 calls it, rank 0.

What runs: TorchTitan's inner attention (`ScaledDotProductAttention`, built from its config)
wrapped by `apply_cp_to_forward` (q, k, v become DTensors sharded on the sequence), the rotate
method set with torch's `set_rotate_method`, load balancing switched by TorchTitan's `cp_shard`
(head-tail load balancer or none), and below them torch's CP dispatcher: `_sdpa_handler`, the
ring (`_templated_ring_attention` and its backward), the merger, the rotaters and the functional
collectives, all of torch 2.13's own code. Stand-ins (STAND_INS): the per-step flash kernel and
the SDPA composite's choice of it (neither has a CPU path that CP handles), an import-time Triton
module of TorchTitan, and v0.2.1's repeat_kv (made before recording). Not run: GQAttention's
projections, RoPE and its `.contiguous()` of the output (the caller's q, k, v and dout are made
before recording, as the other drivers do).

Rank 0's paths: with load balancing every causal step after the first is partial (the second half
of q against all of the block's K/V, A:466-471); without it the causal steps after the first are
skipped (A:447-449 forward, A:583-586 backward: zero gradients); non-causal attention runs full
steps (the merges and kernels of a rank whose steps are all full). The i <= rank branch (first
half of K/V, `_partial_update` of dK/dV, A:455-465 and A:604-620) is never rank 0's.

Sites: each ring step is an entry of ring_forward_step or ring_backward_step; a new entry starts
when a step waits for its K/V block (the K/V rotater's next_buffer()). What precedes the loop
(the K/V `.contiguous()` copies, the fp32 gradient accumulators) is in the first step's entry, the
return casts after the loop in the last one.

Frames: the traced package is torch itself, so an allocation's frame is the innermost one in
torch's `_context_parallel/` package outside its `_partial_update` helper (the caller says whose
chunk it updates), written `path:line:column (function)`: the column of the sub-expression, since
one line of the merger allocates several tensors. Elsewhere the recorder's own rule applies.

DTensor: the recorder sees plain tensors only. DTensor-level ops (views and the dispatch into
CP's handler) pass it by; the handler's local work is recorded by entering the recorder again
inside it. AsyncCollectiveTensor wrappers (`_c10d_functional._wrap_tensor_autograd`) and the fake
tensors of DTensor's sharding propagation hold no memory and are not recorded.

A:<line> is torch 2.13.0 torch/distributed/tensor/experimental/_context_parallel/_attention.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import types
from unittest import mock

import torch

from cpsim_tracer.recorder import SiteSwitch

IMPLEMENTATION = "torch-native-cp"
PACKAGES = ["torch", "torchtitan"]
STAND_INS = [
    "aten::_scaled_dot_product_flash_attention and its backward have no CPU kernel: a CPU kernel "
    "registered by the driver returns what the CUDA ones do (attention.cu "
    "_scaled_dot_product_flash_attention_cuda, attention_backward.cu _flash_attention_backward, "
    "flash_api.cpp mha_fwd/mha_bwd): out empty_like(q.transpose(1, 2)) bf16, softmax_lse "
    "[B, H, Sq] fp32, rng_state uint64[2], unused uint64 scalar; backward: the wrapper's "
    "grad_out.contiguous() and out.contiguous() (done for real), dq/dk/dv empty_like, "
    "softmax_d [B, H, round128(Sq)] fp32; mha_bwd's dq_accum and GQA dk/dv_expanded from source "
    "(source_read); values by PyTorch math in fp32, unrecorded; the non-deterministic path",
    "torch.nn.functional.scaled_dot_product_attention: the C++ composite picks "
    "_scaled_dot_product_flash_attention_for_cpu on CPU, which CP does not handle; the stand-in "
    "does what it does on CUDA when flash is chosen (head_dim a multiple of 8: no padding): "
    "aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)[0]",
    "torchtitan.distributed.minimal_async_ep.kernels (MoE expert-parallel Triton kernels; triton "
    "is not installed on the CPU) is an empty module so that torchtitan.models.common imports; "
    "none of it runs",
    "TorchTitan v0.2.1's repeat_kv (models/llama3/model/model.py, gone in 0.3.0), transcribed, "
    "makes K/V of H heads before recording on the kv_repeat shapes (0.3.0 passes enable_gqa)",
]


def _shape(
    seq,
    heads,
    kv_heads,
    head_dim,
    ring,
    rotate,
    *,
    causal=True,
    balance=True,
    kv_repeat=True,
    rank=0,
):
    name = f"s{seq}-h{heads}-kv{kv_heads}-d{head_dim}-r{ring}"
    name += "-ag" if rotate == "allgather" else "-a2a"
    if kv_heads != heads:
        name += "-repeat" if kv_repeat else "-gqa"
    if not causal:
        name += "-noncausal"  # CP balances causal attention only
    elif not balance:
        name += "-nolb"
    if rank:
        name += f"-rank{rank}"
    # cpsim's torch-native-cp is the last rank of a causal, load-balanced ring with the ring
    # (all-to-all) rotation and repeat_kv; the other shapes show what else runs, unchecked.
    modelled = causal and balance and kv_repeat and rotate == "alltoall" and rank == ring - 1
    why = []
    if not (causal and balance):
        why.append("cpsim models causal attention with load balancing")
    if not kv_repeat:
        why.append("cpsim models TorchTitan 0.2's repeat_kv, not enable_gqa")
    if rotate != "alltoall":
        why.append("the all-gather rotation is not modelled")
    if rank != ring - 1:
        why.append(f"rank {rank}: cpsim's rows are the last rank's (the most work with balancing)")
    return dict(
        name=name,
        rank=rank,
        ledger_check=modelled,
        ledger_check_skipped_because="; ".join(why),
        seq=seq,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ring=ring,
        rotate=rotate,
        causal=causal,
        load_balance=causal and balance,
        kv_repeat=kv_repeat,
        # cpsim's torch-native-cp counts K/V at the query heads (TorchNativeCp::shape: repeat_kv).
        ledger_units=dict(s=seq // ring, heads=heads, kv_heads=heads, head_dim=head_dim),
    )


# Named s<N>-h<H>-kv<Hkv>-d<d>-r<C>-<a2a|ag>[-repeat|-gqa][-noncausal|-nolb]. Rank 0 is traced:
# with load balancing every causal step after the first is partial (the second half of q against
# full K/V); without it the causal steps after the first are skipped (no kernel, zero gradients);
# non-causal attention (TorchTitan's Flux calls it so, without load balancing) runs full steps,
# the merges and kernels of a rank whose steps are all full.
SHAPES = [
    _shape(128, 4, 2, 16, 4, "alltoall"),  # the ledger's case: ring rotation, repeat_kv
    _shape(128, 4, 2, 16, 4, "alltoall", rank=3),  # the same, the last rank: cpsim's worst
    _shape(256, 8, 2, 32, 4, "alltoall", rank=3),  # checked: a larger head dimension, GQA 4:1
    _shape(128, 4, 4, 16, 2, "alltoall", rank=1),  # checked: MHA, two ranks
    _shape(256, 8, 2, 32, 4, "allgather"),  # TorchTitan's default rotate method
    _shape(128, 4, 4, 16, 2, "alltoall", balance=False),  # MHA, no load balancing
    _shape(256, 8, 2, 16, 4, "alltoall", kv_repeat=False),  # TorchTitan 0.3.0: enable_gqa
    _shape(64, 2, 1, 64, 2, "allgather", kv_repeat=False),  # enable_gqa, all-gather, C = 2
    _shape(128, 4, 2, 32, 4, "alltoall", causal=False),  # full steps, repeat_kv
    _shape(192, 4, 4, 16, 3, "allgather", causal=False),  # full steps, all-gather, C = 3
]


def world_size(shape: dict) -> int:
    return shape["ring"]


_CP_DIR = "torch/distributed/tensor/experimental/_context_parallel/"
_CP = _CP_DIR + "_attention.py"
_CP_HELPERS = {"_partial_update"}


# -- stand-ins -------------------------------------------------------------------------------------
def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """TorchTitan v0.2.1 models/llama3/model/model.py repeat_kv (torch.repeat_interleave(x, dim=2,
    repeats=n_rep))."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


def _round_multiple(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _probabilities(q_t, k_t, scale, causal):
    """fp32 softmax of BSHD views (GQA by repetition): P [B, H, Sq, Sk], lse [B, H, Sq]."""
    h, hk = q_t.shape[2], k_t.shape[2]
    qf = q_t.float().transpose(1, 2)
    kf = k_t.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    scores = qf @ kf.transpose(-1, -2) * scale
    if causal:
        sq, sk = q_t.shape[1], k_t.shape[1]
        mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)  # bottom-right, as flash
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.nan_to_num(torch.logsumexp(scores, dim=-1), neginf=0.0)
    return torch.exp(scores - lse.unsqueeze(-1)), lse


def _heads(x_t, h):
    """BSHD view -> fp32 [B, H, S, d], K/V heads repeated to h."""
    return x_t.float().transpose(1, 2).repeat_interleave(h // x_t.shape[2], dim=1)


def _fold(g, hk):
    """[B, H, S, d] gradient of repeated K/V heads -> BSHD [B, S, Hk, d] (summed per group)."""
    b, h, sk, d = g.shape
    return g.reshape(b, hk, h // hk, sk, d).sum(2).transpose(1, 2)


class _FlashKernels:
    """CPU kernels for aten::_scaled_dot_product_flash_attention(_backward): the CUDA kernels'
    outputs, recorded under the stand-in's names; the arithmetic unrecorded."""

    FWD = "aten._scaled_dot_product_flash_attention (CUDA stand-in)"
    BWD = "aten._scaled_dot_product_flash_attention_backward (CUDA stand-in)"

    def __init__(self, recorder):
        self.recorder = recorder

    def _record(self, t: torch.Tensor, what: str) -> None:
        self.recorder.record_stand_in_output(t, what)

    def _workspace(self, shape, dtype, what: str) -> None:
        with self.recorder.paused():
            w = torch.empty(shape, dtype=dtype)
        self._record(w, what + " (source_read)")
        del w

    def forward(
        self,
        query,
        key,
        value,
        dropout_p=0.0,
        is_causal=False,
        return_debug_mask=False,
        *,
        scale=None,
    ):
        q_t, k_t, v_t = (x.transpose(1, 2) for x in (query, key, value))
        b, sq, h, d = q_t.shape
        scale = scale if scale is not None else 1.0 / math.sqrt(d)
        with self.recorder.paused():
            p, lse = _probabilities(q_t, k_t, scale, is_causal)
            o = (p @ _heads(v_t, h)).transpose(1, 2)
            out = torch.empty_like(q_t)  # mha_fwd: out = empty_like(q), q the BSHD view
            out.copy_(o)
            softmax_lse = torch.empty(b, h, sq, dtype=torch.float32)
            softmax_lse.copy_(lse)
            rng_state = torch.empty(2, dtype=torch.uint64)
            unused = torch.empty((), dtype=torch.uint64)
            debug_attn_mask = torch.empty(0, dtype=query.dtype)
            del p, o, lse
        self._record(out, self.FWD + " out")
        self._record(softmax_lse, self.FWD + " softmax_lse")
        self._record(rng_state, self.FWD + " rng_state")
        self._record(unused, self.FWD + " unused")
        return (
            out.transpose(1, 2),
            softmax_lse,
            None,
            None,
            sq,
            k_t.shape[1],
            rng_state,
            unused,
            debug_attn_mask,
        )

    def backward(
        self,
        grad_out,
        query,
        key,
        value,
        out,
        logsumexp,
        cum_seq_q,
        cum_seq_k,
        max_q,
        max_k,
        dropout_p,
        is_causal,
        philox_seed,
        philox_offset,
        *,
        scale=None,
    ):
        # _scaled_dot_product_flash_attention_backward_cuda: BSHD views of everything.
        q_t, k_t, v_t, dout_t, out_t = (
            x.transpose(1, 2) for x in (query, key, value, grad_out, out)
        )
        b, sq, h, d = q_t.shape
        sk, hk = k_t.shape[1], k_t.shape[2]
        scale = scale if scale is not None else 1.0 / math.sqrt(d)
        # _flash_attention_backward: "CUDA code assumes that dout is contiguous".
        with self.recorder.paused():
            contiguous_grad_out = dout_t.contiguous()
            contiguous_out = out_t.contiguous()
        if contiguous_grad_out.data_ptr() != dout_t.data_ptr():
            self._record(contiguous_grad_out, self.BWD + " grad_out.contiguous()")
        if contiguous_out.data_ptr() != out_t.data_ptr():
            self._record(contiguous_out, self.BWD + " out.contiguous()")
        # mha_bwd: dq, dk, dv = empty_like(q, k, v); softmax_d; dq_accum; GQA expanded dk/dv.
        with self.recorder.paused():
            dq, dk, dv = torch.empty_like(q_t), torch.empty_like(k_t), torch.empty_like(v_t)
            softmax_d = torch.zeros(b, h, _round_multiple(sq, 128), dtype=torch.float32)
        self._record(dq, self.BWD + " dq")
        self._record(dk, self.BWD + " dk")
        self._record(dv, self.BWD + " dv")
        self._record(softmax_d, self.BWD + " softmax_d")
        head_size_rounded = _round_multiple(d, 32) if d <= 192 else 256
        self._workspace(
            (b, _round_multiple(sq, 128), h, head_size_rounded),
            torch.float32,
            self.BWD + " dq_accum",
        )
        if hk != h:
            self._workspace((b, sk, h, d), q_t.dtype, self.BWD + " dk_expanded")
            self._workspace((b, sk, h, d), q_t.dtype, self.BWD + " dv_expanded")
        with self.recorder.paused():  # FlashAttention-2's backward, in fp32
            p, _ = _probabilities(q_t, k_t, scale, is_causal)
            do = contiguous_grad_out.float().transpose(1, 2)
            dp = do @ _heads(v_t, h).transpose(-1, -2)
            ds = p * (dp - (do * contiguous_out.float().transpose(1, 2)).sum(-1, keepdim=True))
            dq.copy_((ds @ _heads(k_t, h) * scale).transpose(1, 2))
            dk.copy_(_fold(ds.transpose(-1, -2) @ q_t.float().transpose(1, 2) * scale, hk))
            dv.copy_(_fold(p.transpose(-1, -2) @ do, hk))
            del p, do, dp, ds
        del contiguous_grad_out, contiguous_out, softmax_d
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def _sdpa_composite(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """attention.cpp scaled_dot_product_attention, CUDA, backend flash_attention (flash takes
    K/V of fewer heads as they are): the fused op's output."""
    if attn_mask is not None or query.shape[-1] % 8:
        raise NotImplementedError("cpsim tracer: only the unpadded, maskless flash path")
    return torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, dropout_p, is_causal, False, scale=scale
    )[0]


def _stub_module(name: str) -> types.ModuleType:
    """A module whose every public attribute is a callable placeholder (Triton's decorators
    and type annotations evaluate at import)."""

    class _Any:
        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Any()

        def __call__(self, *args, **kwargs):
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]
            return _Any()

        def __getitem__(self, key):
            return _Any()

    module = types.ModuleType(name)

    def module_getattr(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Any()

    module.__getattr__ = module_getattr
    return module


def _import_torchtitan():
    kernels = "torchtitan.distributed.minimal_async_ep.kernels"
    if importlib.util.find_spec("triton") is None and kernels not in sys.modules:
        sys.modules[kernels] = _stub_module(kernels)
    from torchtitan.distributed.context_parallel import apply_cp_to_forward, cp_shard
    from torchtitan.models.common.attention import ScaledDotProductAttention

    return apply_cp_to_forward, cp_shard, ScaledDotProductAttention


# -- recording ------------------------------------------------------------------------------------
_Sites = SiteSwitch  # span(): a site entry; switch(): the next entry inside it


def _local_only_mode(recorder):
    """A dispatch mode above the recorder: DTensor ops pass it by unrecorded (their handlers
    enter the recorder again for the local work); AsyncCollectiveTensor wraps and what runs under
    a FakeTensorMode (DTensor's sharding propagation) hold no memory and are not recorded."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    wrap_op = torch.ops._c10d_functional._wrap_tensor_autograd.default
    fake_key = torch._C._TorchDispatchModeKey.FAKE

    class _LocalOnly(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            if any(issubclass(t, DTensor) for t in types_):
                with _disable_current_modes():
                    return func(*args, **kwargs)
            if func is wrap_op or torch._C._get_dispatch_mode(fake_key) is not None:
                with recorder.paused():
                    return func(*args, **kwargs)
            if any(issubclass(t, AsyncCollectiveTensor) for t in types_):
                raise NotImplementedError(f"cpsim tracer: {func} on an AsyncCollectiveTensor")
            return func(*args, **kwargs)

    return _LocalOnly()


def _cp_frame(original):
    """The recorder's frame rule with torch's CP package as the traced code: its innermost frame
    outside the `_partial_update` helper (the caller says whose chunk it updates), with the
    column of the sub-expression (one line of the merger allocates several tensors)."""
    from cpsim_tracer.recorder import _site_packages_relative

    def frame(stack):
        f = sys._getframe(1)
        while f is not None:
            code = f.f_code
            rel = _site_packages_relative(os.path.abspath(code.co_filename))
            if rel is not None and rel.startswith(_CP_DIR) and code.co_name not in _CP_HELPERS:
                col = list(code.co_positions())[f.f_lasti // 2][2]
                return f"{rel}:{f.f_lineno}:{col} ({code.co_name})"
            f = f.f_back
        return original(stack)

    return frame


def run(recorder, shape: dict) -> None:
    from cpsim_tracer import recorder as recorder_module
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    apply_cp_to_forward, cp_shard, ScaledDotProductAttention = _import_torchtitan()
    aten = torch.ops.aten
    c, n = shape["ring"], shape["seq"]
    s, h, hkv, d = n // c, shape["heads"], shape["kv_heads"], shape["head_dim"]

    # TorchTitan's setup: the CP mesh, the attention module wrapped for CP, the batch sharded
    # (which switches CP's load balancing), the rotate method (torch's API; TorchTitan 0.3.0
    # leaves torch's default, allgather).
    mesh = init_device_mesh("cpu", (c,), mesh_dim_names=("cp",))
    attention = ScaledDotProductAttention.Config().build()
    apply_cp_to_forward([attention], mesh)
    tokens = torch.arange(n).unsqueeze(0)
    cp_shard(mesh, (tokens,), None, "headtail" if shape["load_balance"] else None)
    cp.set_rotate_method(shape["rotate"])

    local_only = _local_only_mode(recorder)
    sites = _Sites(recorder)

    handlers = DTensor._op_dispatcher._custom_op_handlers
    flash_ops = (
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_backward.default,
    )
    real_handlers = {op: handlers[op] for op in flash_ops}

    def recorded_handler(op_call, args, kwargs):
        with recorder, local_only:
            return real_handlers[op_call](op_call, args, kwargs)

    real_ring, real_ring_bwd = cp._templated_ring_attention, cp._templated_ring_attention_backward
    real_create_rotater = cp._create_rotater
    step_site = {"name": ""}

    def ring(*args, **kwargs):
        step_site["name"] = "ring_forward_step"
        with sites.span("ring_forward_step"):
            return real_ring(*args, **kwargs)

    def ring_backward(*args, **kwargs):
        step_site["name"] = "ring_backward_step"
        with sites.span("ring_backward_step"):
            return real_ring_bwd(*args, **kwargs)

    def create_rotater(pg, seq_dim, method=None):
        rotater = real_create_rotater(pg, seq_dim, method)
        # The K/V rotater (the dK/dV one is made ALL_TO_ALL explicitly). A flag, not a wrapper
        # bound to the instance: a reference cycle would keep its buffers alive until a GC.
        rotater.cpsim_kv_rotater = method is None
        return rotater

    def rotater_next_buffer(real):
        def next_buffer(self):
            if self.cpsim_kv_rotater:
                sites.switch(step_site["name"])
            return real(self)

        return next_buffer

    q = torch.randn(1, s, h, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, s, hkv, d, dtype=torch.bfloat16)
    v = torch.randn(1, s, hkv, d, dtype=torch.bfloat16)
    if shape["kv_repeat"]:
        k, v = _repeat_kv(k, h // hkv), _repeat_kv(v, h // hkv)
    k.requires_grad_()
    v.requires_grad_()
    dout = torch.randn(1, s, h, d, dtype=torch.bfloat16)

    kernels = _FlashKernels(recorder)
    with contextlib.ExitStack() as patches:
        lib = torch.library.Library("aten", "IMPL")
        patches.callback(lib._destroy)
        lib.impl("_scaled_dot_product_flash_attention", kernels.forward, "CPU")
        lib.impl("_scaled_dot_product_flash_attention_backward", kernels.backward, "CPU")
        for op in flash_ops:
            patches.enter_context(mock.patch.dict(handlers, {op: recorded_handler}))
        patches.enter_context(
            mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", _sdpa_composite)
        )
        patches.enter_context(mock.patch.object(cp, "_templated_ring_attention", ring))
        patches.enter_context(
            mock.patch.object(cp, "_templated_ring_attention_backward", ring_backward)
        )
        patches.enter_context(mock.patch.object(cp, "_create_rotater", create_rotater))
        for rotater_class in (cp._AllToAllRotater, cp._AllGatherRotater):
            real_next = rotater_class.next_buffer
            patches.enter_context(
                mock.patch.object(rotater_class, "next_buffer", rotater_next_buffer(real_next))
            )
        patches.enter_context(
            mock.patch.object(
                recorder_module, "upstream_frame", _cp_frame(recorder_module.upstream_frame)
            )
        )
        with recorder, local_only:
            recorder.set_phase("forward")
            # GQAttention's call (models/common/attention.py:996-1003), without its .contiguous()
            out = attention(
                q, k, v, scale=None, enable_gqa=k.shape[2] != h, is_causal=shape["causal"]
            )
            recorder.set_phase("backward")
            # autograd.grad, not backward(): the leaves' AccumulateGrad would copy the gradients
            # into their layout, which the model's q, k, v (not leaves) never do.
            grads = torch.autograd.grad(out, (q, k, v), dout)
            del out, grads


# -- classification -------------------------------------------------------------------------------
# torch 2.13.0 torch/distributed/tensor/experimental/_context_parallel/_attention.py, (line,
# column) of the expression that allocates -> ledger row or scheme tensor
# (docs/implementations/torch-native-cp.md: the table's ids, or "upstream:<section 3 id>" for what
# only its section 3 names, or "scheme:<tensor>" for cpsim's ring scheme, attention_core.cpp).
_FORWARD_LINES = {
    (418, 10): "upstream:F3 key.contiguous() (BHSD copy of the BSHD view), until step 1",
    (419, 12): "upstream:F3 value.contiguous() (BHSD copy of the BSHD view), until step 1",
    (438, 22): "F4+F7",  # next_kv = torch.cat([key.flatten(), value.flatten()])
    (265, 23): "scheme:kv_block",  # _AllToAllRotater: permute_tensor's receive buffer
    (289, 38): "upstream:F5 all-gathered K/V (C blocks, kept to the end of the ring)",
    (186, 54): "F11+F13",  # out - block_out
    (224, 14): "scheme:attn_out_h",  # results(): self._out.to(bf16), saved for backward
    (189, 28): "scheme:ring_out_acc",  # _partial_update(self._lse, ...): torch.cat, the new LSE
    (197, 28): "scheme:ring_out_acc",  # _partial_update(self._out, ...): torch.cat, the new out
}
_MERGE_LSE_TEMPS = "upstream:F13 merger LSE temporaries (fp32 [B, H, sq, 1])"
# block_lse - lse; F.logsigmoid(lse - block_lse) and its lse - block_lse
_MERGE_LSE_TEMP_POSITIONS = {(186, 34), (187, 24), (187, 37)}
_PARTIAL_HALF = "upstream:F14 merged half before _partial_update's torch.cat"
_BACKWARD_LINES = {
    (513, 17): "scheme:ring_dq_acc",  # grad_query = zeros_like(query, fp32)
    (514, 15): "scheme:ring_dkv_acc",  # grad_key
    (515, 17): "scheme:ring_dkv_acc",  # grad_value
    (517, 10): "upstream:B3 key.contiguous() again, until step 1",
    (518, 12): "upstream:B3 value.contiguous() again, until step 1",
    (533, 22): "B6",  # next_kv = torch.cat([key.flatten(), value.flatten()]), held to the next
    (289, 38): "upstream:B4 re-gathered K/V (C blocks, kept to the end of the ring)",
    (568, 20): "B7",  # logsumexp.chunk(2, dim=seq_dim)[1].contiguous()
    (584, 26): "upstream:skipped step's zero dQ (fp32)",
    (585, 24): "upstream:skipped step's zero dK (fp32)",
    (586, 26): "upstream:skipped step's zero dV (fp32)",
    (605, 27): "B14+B15",  # i <= rank: grad_key = _partial_update(...), a torch.cat (B15)
    (613, 29): "B14+B15",  # i <= rank: grad_value = _partial_update(...) (B15)
    (625, 23): "B14+B15",  # next_grad_kv = torch.cat([grad_key.flatten(), ...]) (fp32)
    (625, 34): "upstream:B14 grad_key.flatten() copy (a BSHD-strided accumulator)",
    (625, 54): "upstream:B14 grad_value.flatten() copy (a BSHD-strided accumulator)",
    (632, 25): "upstream:B16 dQ partial update: torch.cat, the new fp32 accumulator",
    (645, 17): "scheme:dq_h",  # grad_query.to(query.dtype)
    (646, 19): "scheme:dkv_h",  # dkv_rotater.next_buffer().to(key.dtype)
}
_STAND_IN_ROWS = {
    _FlashKernels.FWD + " out": "scheme:block_out",
    _FlashKernels.FWD + " softmax_lse": "F9",  # held by `logsumexp` into the next step
    _FlashKernels.FWD + " rng_state": "upstream:F10 philox seed/offset",
    _FlashKernels.FWD + " unused": "upstream:F10 philox seed/offset",
    _FlashKernels.BWD + " dq": "B8",  # held by grad_query_ etc. into the next step
    _FlashKernels.BWD + " dk": "B8",
    _FlashKernels.BWD + " dv": "B8",
    _FlashKernels.BWD + " softmax_d": "scheme:flash_bwd_workspace softmax_d",
    _FlashKernels.BWD + " dq_accum (source_read)": "scheme:flash_bwd_workspace dq_accum",
    _FlashKernels.BWD + " dk_expanded (source_read)": "scheme:flash_bwd_workspace dk_expanded",
    _FlashKernels.BWD + " dv_expanded (source_read)": "scheme:flash_bwd_workspace dv_expanded",
    _FlashKernels.BWD + " grad_out.contiguous()": "upstream:B13 grad_out.contiguous()",
    _FlashKernels.BWD + " out.contiguous()": "upstream:B13 out.contiguous()",
}


def _cp_position(frame: str) -> tuple[int, int] | None:
    """(line, column) of a frame in CP's _attention.py, None for other frames."""
    location = frame.split(" ", 1)[0]
    if not location.startswith(_CP + ":"):
        return None
    line, _, col = location[len(_CP) + 1 :].partition(":")
    return int(line), int(col) if col else -1


def classify(event: dict, shape: dict) -> str | None:
    if event.get("stand_in"):
        if event["stand_in"] == _FlashKernels.FWD + " softmax_lse" and event["site_seq"] == 1:
            # The first step's LSE is the merger's LSE accumulator itself: step() upcasts it with
            # a no-op lse.to(float32) (A:215, already fp32) and _merge_one keeps it as
            # self._lse = block_lse (A:164, an unsqueeze view) until the next merge rebinds it:
            # the LSE part of cpsim's ring_out_acc (attention_core.cpp ring_forward: acc, nr·hq·d
            # fp32 + hq·nr fp32), as the first step's out.to(float32) (A:214) is its output part.
            return "scheme:ring_out_acc"
        return _STAND_IN_ROWS.get(event["stand_in"])
    pos = _cp_position(event["frame"])
    if pos is None:
        return None
    s = shape["seq"] // shape["ring"]
    if event["phase"] == "backward":
        if pos == (265, 23):  # _AllToAllRotater's receive buffer: K/V (bf16) or dK/dV (fp32)
            return "scheme:ring_dkv_acc" if event["dtype"] == "float32" else "scheme:kv_block"
        return _BACKWARD_LINES.get(pos)
    if pos == (214, 18):  # step(): out.to(float32); the first step's becomes the accumulator
        # run() enters no site before the forward's ring: its step i is site entry i + 1.
        return "scheme:ring_out_acc" if event["site_seq"] == 1 else "F11+F13"
    if pos in ((186, 18), (187, 18)):  # the merged out / LSE: the accumulator, or a half of it
        return "scheme:ring_out_acc" if event["shape"][2] == s else _PARTIAL_HALF
    if pos == (186, 24):  # F.sigmoid(block_lse - lse) * (out - block_out)
        return "F11+F13" if event["op"] == "mul" else _MERGE_LSE_TEMPS
    if pos in _MERGE_LSE_TEMP_POSITIONS:
        return _MERGE_LSE_TEMPS
    return _FORWARD_LINES.get(pos)
