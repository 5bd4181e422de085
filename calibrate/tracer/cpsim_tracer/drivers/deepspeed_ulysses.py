"""deepspeed-ulysses: DeepSpeed's UlyssesSPAttentionHF (ALST) around transformers'
`flash_attention_2` attention (the path cpsim's ledger was read for; shapes named "-sdpa" run
transformers' `sdpa` instead) of one Llama or Qwen3 attention layer, bf16, batch 1, rank 0 of a
C-rank group.

The wrapper is installed as ALST installs it (`UlyssesSPAttentionHF.register_with_transformers`
replaces ALL_ATTENTION_FUNCTIONS[core]), and the layer's own `forward` runs: projections, RoPE
(and Qwen3's q/k norm), the wrapper's all-to-alls around the core attention, o_proj; then its
backward.

FlashAttention-2 on the CPU: transformers 4.51.3 decides at import whether flash-attn 2 is
installed (`modeling_flash_attention_utils`: `is_flash_attn_2_available()`, which needs
`importlib.util.find_spec("flash_attn")`, a `flash_attn` distribution >= 2.1.0 in
`importlib.metadata` and `torch.cuda.is_available()` with `torch.version.cuda`; then it imports
`flash_attn.bert_padding`, `flash_attn_func`, `flash_attn_varlen_func` and
`flash_attn.layers.rotary`). None of that holds here, so transformers is imported without
`flash_attn` and `run()` sets, for the run only (mock patches), what that import would have set
with flash-attn 2.8.3 on CUDA: `modeling_flash_attention_utils.flash_attn_func` = the stand-in's
`flash_attn_func_interface` (2.8.3's signature and FlashAttnFunc), `flash_attn_varlen_func` = a
stand-in that raises (the packed path is not traced), `_flash_supports_window_size` (from the
signature, as transformers computes it), `flash_241` = True (so `deterministic` is passed, False
unless FLASH_ATTENTION_DETERMINISTIC=1), and `integrations.flash_attention._use_top_left_mask` =
False (flash-attn >= 2.1). `bert_padding` and the rotary kernel are only used with an attention
mask (which the wrapper drops) and are not set.

Which FA2 path runs: the wrapper gathers the position ids (U:294-296); transformers takes the
packed/varlen path when they are not non-decreasing (`torch.diff(position_ids) >= 0`, HFU:378),
else the plain `flash_attn_func` (HFU:412). The fake all-gather fills nothing, so the driver
fills the gathered list as UlyssesSPDataLoaderAdapter's shards of one unpacked sequence make it
(rank r: positions r*s..(r+1)*s-1): the plain path, as the ledger's upstream table assumes.

transformers 4.57 imports flash-attn at the first call instead (`lazy_import_flash_attention`,
see `_flash_attention_2_lazy`) and tests for packed sequences with `_is_packed_sequence`.

Sites: a cursor (one open `recorder.site`) moves at upstream call boundaries: the layer's
projections and RoPE are `held_through_block` (HF keeps q, k, v as locals until the wrapper
returns), the position-id all-gather and o_proj are `untracked`, `_combine_local_sequences` is
`q_exchange` until q's all-to-all returns, then `kv_exchange`; the head-major copies after it
(`rearrange(...).contiguous()`) go to the exchange of the tensor they copy; the core attention
function is `core_forward`, the rest of the wrapper `out_exchange`. Each autograd node is tagged
with the site it was made at (a TorchFunctionMode); in backward a pre-hook moves the cursor to
that site's backward counterpart before the node runs.

Rows: the ledger's row ids (docs/implementations/deepspeed-ulysses.md), "scheme:<name>" for a
tensor of cpsim's Ulysses scheme (names as in sim/src/attention_ulysses.cpp and
attention_core.cpp), and the ledger's upstream-table id (F1, F2, F7, B11) for a tensor the
ledger lists there but models in no row.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import os
import sys
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

IMPLEMENTATION = "deepspeed-ulysses"
FA2 = "flash_attention_2"
PACKAGES = ["deepspeed", "transformers", "torch", "einops"]
_FA2_AT_IMPORT = (
    "flash_attention_2 shapes: transformers' flash_attention_forward and _flash_attention_forward "
    "run as is; its import-time flash-attn checks are replaced by their outcome with flash-attn "
    "2.8.3 on CUDA (module globals patched for the run: flash_attn_func, flash_attn_varlen_func, "
    "_flash_supports_window_size, flash_241; integrations.flash_attention._use_top_left_mask)"
)
# In its place when transformers imports flash-attn at the first call (4.57).
_FA2_LAZY = (
    "flash_attention_2 shapes: transformers' flash_attention_forward and _flash_attention_forward "
    "run as is, its lazy flash-attn import (lazy_import_flash_attention) included; its "
    "is_flash_attn_2_available() is replaced by its outcome with flash-attn 2.8.3 on CUDA (True), "
    "the import takes the flash_attn stand-in's flash_attn_func and flash_attn_varlen_func (the "
    "interface's signature, no stand-in) (patched for the run, with "
    "integrations.flash_attention._use_top_left_mask = False)"
)
STAND_INS = [
    "deepspeed.comm: TorchBackend over PyTorch's fake process group (collectives return at once, "
    "outputs unfilled); DeepSpeed's CPU shared-memory comm op is not built (build_shm_op -> None)",
    "position ids: the all-gather's outputs (U:294-295) are filled, recorder paused, with the "
    "positions of each rank's shard of one unpacked sequence (r*s..(r+1)*s-1)",
    _FA2_AT_IMPORT,
    "flash_attention_2 shapes: flash_attn_func is the flash_attn stand-in's "
    "flash_attn_func_interface: v2.8.3's signature and FlashAttnFunc (saves q, k, v, out_padded, "
    "softmax_lse, rng_state; backward dq/dk/dv = empty_like of the saved q/k/v), around the "
    "stand-in kernels _flash_attn_forward/_flash_attn_backward (mha_fwd: out = empty_like(q), "
    "softmax_lse, rng_state; mha_bwd: softmax_d, dq_accum, dk/dv_expanded when GQA)",
    "sdpa shapes: transformers' sdpa_attention_forward runs as is (repeat_kv, .contiguous(), "
    "the output's transpose(1,2).contiguous()); torch.nn.functional.scaled_dot_product_attention "
    "is a stand-in for SDPA's CUDA FlashAttention-2 backend",
    "SDPA forward: PyTorch's CPU flash kernel (_scaled_dot_product_flash_attention_for_cpu), "
    "recorded as is: out [1,h,N,d] bf16 contiguous and LSE [1,h,N] fp32, the sizes and layout of "
    "CUDA flash's out (empty_like of the transposed q) and LSE; its per-thread buffers are not "
    "seen, and CUDA's rng_state/philox tensors (24 bytes) are not made",
    "SDPA backward: computed by the CPU kernel while the recorder is paused (its grads are "
    "[B,N,h,d]-major, CUDA flash's are not); recorded as CUDA flash makes them "
    "(attention_backward.cu, flash_api.cpp mha_bwd): dq/dk/dv = empty_like of the transposed "
    "q/k/v (contiguous [1,h,N,d]) kept; grad_out.transpose(1,2).contiguous() and "
    "out.transpose(1,2).contiguous() copies when not contiguous, softmax_d [1,h,N128] fp32 and "
    "dq_accum [1,N128,h,d32] fp32 (non-deterministic mha_bwd) allocated and freed in the call "
    "(source_read); cuDNN's backward makes the same dq/dk/dv layout, memory-efficient's does not",
]


def _shape(
    model: str, n: int, h: int, hkv: int, d: int, hidden: int, c: int, core: str = FA2
) -> dict:
    suffix = "" if core == FA2 else "-" + core
    return {
        "name": f"{model}-s{n}-h{h}-kv{hkv}-d{d}-c{c}{suffix}",
        "model": model,
        "core": core,
        "seq": n,
        "heads": h,
        "kv_heads": hkv,
        "head_dim": d,
        "hidden": hidden,
        "ulysses": c,
    }


# seq = N, heads = H, kv_heads = Hkv, head_dim = d, ulysses = C (the SP degree), core = the
# attention implementation under the wrapper. hidden differs from H*d and from the rank's token
# count so that the projections' gradients differ by shape. The flash_attention_2 shapes are the
# ledger's path (their traces are data/traces/deepspeed-ulysses/); the "-sdpa" ones show what
# changes with transformers' sdpa.
SHAPES = [
    _shape("llama", 128, 8, 4, 16, 96, 4),  # GQA, 2 query heads and 1 KV head per rank
    _shape("qwen3", 128, 8, 4, 32, 192, 2),  # q/k norm, 2 KV heads per rank (B8, F10 copies)
    _shape("llama", 256, 8, 2, 16, 96, 4),  # Hkv < C: KV heads replicated twice
    _shape("qwen3", 192, 6, 1, 32, 128, 2),  # MQA, Hkv < C, 3 query heads per rank
    _shape("llama", 64, 4, 4, 64, 192, 4),  # MHA, 1 query head per rank
    _shape("qwen3", 256, 16, 8, 16, 96, 2),  # 8 query and 4 KV heads per rank (GQA in the kernel)
    _shape("llama", 128, 8, 4, 16, 96, 4, "sdpa"),
    _shape("qwen3", 128, 8, 4, 32, 192, 2, "sdpa"),
]

# The backward site of a node made at a forward site.
_BACKWARD_SITE = {
    "untracked": "untracked",
    "held_through_block": "untracked",
    "q_exchange": "dq_exchange",
    "kv_exchange": "dkv_exchange",
    "core_forward": "core_backward",
    "out_exchange": "dout_exchange",
}
_HEAD_MAJOR = "sl bs hc_l hs -> bs hc_l sl hs"  # ulysses_sp.py: the copies after the all-to-all


def world_size(shape: dict) -> int:
    return shape["ulysses"]


# -- the layer and its inputs ---------------------------------------------------------------------
@contextlib.contextmanager
def _flash_attn_hidden():
    """Imports see no `flash_attn` (transformers' import-time probe would find no flash_attn
    distribution behind the runner's stand-in anyway, and on the CPU would not use it)."""
    names = [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]
    saved = {n: sys.modules.pop(n) for n in names}
    try:
        yield
    finally:
        sys.modules.update(saved)


def _import_upstream():
    with _flash_attn_hidden():
        import deepspeed.comm as ds_comm
        from deepspeed.runtime.sequence_parallel import parallel_state_sp, ulysses_sp
        from transformers import modeling_utils
        from transformers.models.llama import modeling_llama
        from transformers.models.qwen3 import modeling_qwen3
    return ds_comm, parallel_state_sp, ulysses_sp, modeling_utils, modeling_llama, modeling_qwen3


def _layer(shape: dict, modeling_llama, modeling_qwen3):
    """The attention module (bf16, training mode) and its rotary embedding."""
    if shape["model"] == "llama":
        config_cls, attn_cls = modeling_llama.LlamaConfig, modeling_llama.LlamaAttention
        rotary_cls = modeling_llama.LlamaRotaryEmbedding
    else:
        config_cls, attn_cls = modeling_qwen3.Qwen3Config, modeling_qwen3.Qwen3Attention
        rotary_cls = modeling_qwen3.Qwen3RotaryEmbedding
    config = config_cls(
        hidden_size=shape["hidden"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        intermediate_size=64,
        num_hidden_layers=1,
        attention_dropout=0.0,
        attn_implementation=shape["core"],
        torch_dtype=torch.bfloat16,
    )
    attn = attn_cls(config, layer_idx=0).to(torch.bfloat16).train()
    return attn, rotary_cls(config=config)


def _init_deepspeed_comm(ds_comm) -> None:
    """deepspeed.comm over the torch.distributed group the runner set up."""
    torch_backend = sys.modules["deepspeed.comm.torch"]
    with mock.patch.object(torch_backend, "build_shm_op", lambda: None):
        ds_comm.init_distributed(dist_backend="fake", auto_mpi_discovery=False, verbose=False)


# -- sites ----------------------------------------------------------------------------------------
class _SiteCursor:
    """One open `recorder.site()` at a time, moved from one upstream call to the next."""

    def __init__(self, recorder) -> None:
        self._recorder = recorder
        self._open = None
        self.name = "untracked"

    def move(self, name: str) -> None:
        if self._open is not None and name == self.name:
            return
        self.close()
        self._open = self._recorder.site(name)
        self._open.__enter__()
        self.name = name

    def close(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
        self._open = None
        self.name = "untracked"


def _enter_site(cursor: _SiteCursor, site: str, _grad_outputs) -> None:
    cursor.move(site)


class _NodeSites(TorchFunctionMode):
    """Tags each autograd node made under it with the backward site of the cursor's site."""

    def __init__(self, cursor: _SiteCursor) -> None:
        super().__init__()
        self._cursor = cursor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.tag(out)
        return out

    def tag(self, out) -> None:
        site = _BACKWARD_SITE[self._cursor.name]
        for t in tree_flatten(out)[0]:
            node = t.grad_fn if isinstance(t, torch.Tensor) else None
            if node is not None and "cpsim_site" not in node.metadata:
                node.metadata["cpsim_site"] = site
                node.register_prehook(functools.partial(_enter_site, self._cursor, site))


# -- the SDPA stand-in ----------------------------------------------------------------------------
def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


class _FlashSdpa(torch.autograd.Function):
    """SDPA's flash backend: the CPU kernel's forward, CUDA flash's backward allocations."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, recorder):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.recorder = causal, scale, recorder
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rec = ctx.recorder
        held = []

        def made(fn, name):
            with rec.paused():
                t = fn()
            rec.record_stand_in_output(t, name)
            return t

        # attention_backward.cu _flash_attention_backward: grad_out/out (transposed to
        # [B, N, h, d]) made contiguous before mha_bwd (a copy kernel each), dropped when it
        # returns; mha_bwd itself is one more launch.
        for t, name in ((dout, "grad_out"), (out, "out")):
            if not t.transpose(1, 2).is_contiguous():
                rec.count_stand_in_call()
                held.append(
                    made(
                        lambda t=t: t.transpose(1, 2).contiguous(),
                        f"sdpa_flash.bwd {name}.contiguous() (source_read)",
                    )
                )
        rec.count_stand_in_call()
        with rec.paused():
            grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out, lse, 0.0, ctx.causal, scale=ctx.scale
            )
        result = []
        for g, like, name in zip(grads, (q, k, v), ("dq", "dk", "dv"), strict=True):
            # mha_bwd: empty_like(q_t) keeps the transposed input's strides.
            def fill(g=g, like=like):
                buf = torch.empty_like(like.transpose(1, 2)).transpose(1, 2)
                return buf.copy_(g)

            result.append(made(fill, f"sdpa_flash.mha_bwd {name}"))
        b, h, n, d = q.shape
        n_r = _round_up(n, 128)
        d_r = _round_up(_round_up(d, 8), 32 if d <= 128 else 64)
        held.append(
            made(
                lambda: torch.empty(b, h, n_r, dtype=torch.float32),
                "sdpa_flash.mha_bwd softmax_d (source_read)",
            )
        )
        held.append(
            made(
                lambda: torch.empty(b, n_r, h, d_r, dtype=torch.float32),
                "sdpa_flash.mha_bwd dq_accum (source_read)",
            )
        )
        del held
        return (*result, None, None, None)


def _sdpa_stand_in(recorder, tagger: _NodeSites):
    def scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        assert attn_mask is None and dropout_p == 0.0 and not enable_gqa, "not traced"
        if scale is None:
            scale = query.shape[-1] ** -0.5
        out = _FlashSdpa.apply(query, key, value, is_causal, scale, recorder)
        tagger.tag(out)
        return out

    return scaled_dot_product_attention


# -- the run --------------------------------------------------------------------------------------
def _site_patches(
    stack: contextlib.ExitStack, cursor: _SiteCursor, tagger: _NodeSites, ulysses_sp, uattn
) -> None:
    """Moves the cursor at the wrapper's calls (mock patches, undone when `stack` closes)."""
    cls = ulysses_sp.UlyssesSPAttentionHF
    q_received = {}

    def forward(self, *args, **kwargs):
        cursor.move("untracked")  # position-id all-gather
        try:
            return original_forward(self, *args, **kwargs)
        finally:
            cursor.move("untracked")  # o_proj

    def combine(self, *args, **kwargs):
        cursor.move("q_exchange")
        q_received.clear()
        return original_combine(self, *args, **kwargs)

    def all_to_all(group, tensor):
        out = original_all_to_all(group, tensor)
        if cursor.name == "q_exchange" and not q_received:
            q_received["storage"] = out.untyped_storage()._cdata
            cursor.move("kv_exchange")
        return out

    def rearrange(tensor, pattern, **axes):
        if pattern == _HEAD_MAJOR:
            is_q = tensor.untyped_storage()._cdata == q_received.get("storage")
            cursor.move("q_exchange" if is_q else "kv_exchange")
        return original_rearrange(tensor, pattern, **axes)

    def core(*args, **kwargs):
        cursor.move("core_forward")
        try:
            out = original_core(*args, **kwargs)
            tagger.tag(out)  # the kernel's autograd node (an autograd.Function's output)
            return out
        finally:
            cursor.move("out_exchange")

    original_forward, original_combine = cls.forward, cls._combine_local_sequences
    original_all_to_all, original_rearrange = ulysses_sp._dim_zero_all_to_all, ulysses_sp.rearrange
    original_core = uattn.attn
    stack.enter_context(mock.patch.object(cls, "forward", forward))
    stack.enter_context(mock.patch.object(cls, "_combine_local_sequences", combine))
    stack.enter_context(mock.patch.object(ulysses_sp, "_dim_zero_all_to_all", all_to_all))
    stack.enter_context(mock.patch.object(ulysses_sp, "rearrange", rearrange))
    stack.enter_context(mock.patch.object(uattn, "attn", core))


def _position_ids_filled(stack: contextlib.ExitStack, recorder, ds_comm, s: int) -> None:
    """The position-id all-gather (U:295) returns each rank's shard of one unpacked sequence."""
    original = ds_comm.all_gather

    def all_gather(tensor_list, *args, **kwargs):
        work = original(tensor_list, *args, **kwargs)
        with recorder.paused():
            for r, t in enumerate(tensor_list):
                t.copy_(torch.arange(r * s, (r + 1) * s, dtype=t.dtype).view_as(t))
        return work

    stack.enter_context(mock.patch.object(ds_comm, "all_gather", all_gather))


def _flash_attention_2(stack: contextlib.ExitStack, recorder) -> None:
    """What transformers' import sets when flash-attn 2.8.3 is installed on CUDA (see the module
    docstring), for the run only."""
    from transformers import modeling_flash_attention_utils as hfu
    from transformers.integrations import flash_attention as hfa

    from .. import flash_stand_in

    if flash_stand_in._recorder is not recorder:  # trace.py installs it with the recorder
        flash_stand_in.install(recorder)
    func = flash_stand_in.flash_attn_func_interface
    if hasattr(hfu, "lazy_import_flash_attention"):
        _flash_attention_2_lazy(stack, hfu, flash_stand_in)
    else:
        globals_set = {
            "flash_attn_func": func,
            "flash_attn_varlen_func": flash_stand_in._not_on_cpu,  # the packed path: not traced
            "_flash_supports_window_size": "window_size" in inspect.signature(func).parameters,
            "flash_241": True,
        }
        for name, value in globals_set.items():
            stack.enter_context(mock.patch.object(hfu, name, value, create=True))
    stack.enter_context(mock.patch.object(hfa, "_use_top_left_mask", False))


def _flash_attention_2_lazy(stack: contextlib.ExitStack, hfu, flash_stand_in) -> None:
    """transformers 4.57: `_flash_attention_forward` imports flash-attn at its first call
    (`lazy_import_flash_attention` -> `_lazy_imports`, `from flash_attn import flash_attn_func,
    flash_attn_varlen_func` and `flash_attn.bert_padding`'s pad/unpad when
    `is_flash_attn_2_available()`) and passes the kernel the options `flash_attn_varlen_func`'s
    signature names. For the run: that check's outcome with flash-attn 2.8.3 on CUDA (True), the
    stand-in package's `flash_attn_func` = `flash_attn_func_interface` and
    `flash_attn_varlen_func` = one with the interface's signature that raises, and the module's
    cached imports cleared, so that its own lazy import runs and takes them."""
    fa = sys.modules["flash_attn"]
    stack.enter_context(
        mock.patch.object(fa, "flash_attn_func", flash_stand_in.flash_attn_func_interface)
    )
    stack.enter_context(
        mock.patch.object(
            fa, "flash_attn_varlen_func", flash_stand_in.flash_attn_varlen_func_interface
        )
    )
    stack.enter_context(mock.patch.object(hfu, "is_flash_attn_2_available", lambda: True))
    cached = ("_flash_fn", "_flash_varlen_fn", "_pad_fn", "_unpad_fn", "_process_flash_kwargs_fn")
    for name in cached:
        stack.enter_context(mock.patch.object(hfu, name, None))
    STAND_INS[:] = [_FA2_LAZY if line == _FA2_AT_IMPORT else line for line in STAND_INS]


def run(recorder, shape: dict) -> None:
    ds_comm, parallel_state_sp, ulysses_sp, modeling_utils, modeling_llama, modeling_qwen3 = (
        _import_upstream()
    )
    attn, rotary = _layer(shape, modeling_llama, modeling_qwen3)
    c, core = shape["ulysses"], shape["core"]
    s = shape["seq"] // c
    _init_deepspeed_comm(ds_comm)
    functions = modeling_utils.ALL_ATTENTION_FUNCTIONS
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(functions._local_mapping))
        stack.callback(parallel_state_sp._release_sequence_parallel_groups)
        ulysses_sp.UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=attn,
            core_attn_implementation=core,
            sequence_parallel_size=c,
            micro_batch_size=1,
            seq_length=shape["seq"],
            seq_length_is_variable=True,
        )
        uattn = inspect.getclosurevars(functions[core]).nonlocals["uattn"]
        cursor = _SiteCursor(recorder)
        tagger = _NodeSites(cursor)
        _site_patches(stack, cursor, tagger, ulysses_sp, uattn)
        _position_ids_filled(stack, recorder, ds_comm, s)
        if core == FA2:
            _flash_attention_2(stack, recorder)
        else:
            stack.enter_context(
                mock.patch.object(
                    torch.nn.functional,
                    "scaled_dot_product_attention",
                    _sdpa_stand_in(recorder, tagger),
                )
            )

        # Rank 0's shard: positions 0..s-1 (UlyssesSPDataLoaderAdapter), the RoPE table for them.
        position_ids = torch.arange(s).unsqueeze(0)
        probe = torch.empty(0, dtype=torch.bfloat16)
        cos, sin = rotary(probe, position_ids)
        with recorder:
            recorder.set_phase("setup")
            hidden = torch.randn(1, s, shape["hidden"], dtype=torch.bfloat16).requires_grad_()
            grad_out = torch.ones(1, s, shape["hidden"], dtype=torch.bfloat16)

            recorder.set_phase("forward")
            cursor.move("held_through_block")
            with tagger:
                out, _ = attn(hidden, (cos, sin), None, position_ids=position_ids)
            cursor.close()

            recorder.set_phase("backward")
            out.backward(grad_out)
            cursor.close()
            del out, grad_out, hidden
            for p in attn.parameters():
                p.grad = None


# -- classification -------------------------------------------------------------------------------
@functools.cache
def _site_packages() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))


def _installed_root(path: str) -> str:
    """The directory 'pkg/file.py' is installed under: where the imported `pkg` is (a package
    on PYTHONPATH comes before site-packages' own), else torch's site-packages."""
    module = sys.modules.get(path.split("/", 1)[0])
    file = getattr(module, "__file__", None)
    if file and os.path.basename(file) == "__init__.py":
        return os.path.dirname(os.path.dirname(os.path.abspath(file)))
    return _site_packages()


def _source(frame: str) -> tuple[str, str, str]:
    """('pkg/file.py', 'function', 'source line') of a recorded frame 'pkg/file.py:N (function)'."""
    where, _, func = frame.partition(" (")
    path, _, line = where.rpartition(":")
    if not line.isdigit():
        return path, func.rstrip(")"), ""
    text = linecache.getline(os.path.join(_installed_root(path), path), int(line)).strip()
    return path, func.rstrip(")"), text


def _dims(shape: dict) -> dict:
    """s tokens per rank, repeat_kv's factor at the kernel (KV heads replicated to one per rank
    when C > Hkv), H*d."""
    c = shape["ulysses"]
    h, hk = shape["heads"] // c, max(shape["kv_heads"], c) // c
    return {"s": shape["seq"] // c, "n_rep": h // hk, "q": shape["heads"] * shape["head_dim"]}


def classify(event: dict, shape: dict) -> str | None:
    """The row of an allocation, by phase, site, upstream frame (its source line), op and shape."""
    phase, site, op = event["phase"], event["site"], event["op"]
    if phase == "setup":  # the layer's input and its output's gradient
        return {"randn": "scheme:xn", "ones": "scheme:dh1"}.get(op)
    if phase == "forward":
        if event.get("stand_in", "").startswith("flash_attn.mha_fwd "):
            # mha_fwd's out (F14, empty_like(q): head-major), softmax_lse (F15), rng_state (F16)
            kind = event["stand_in"].split(" ")[1]
            return {"out": "scheme:attn_out_h", "softmax_lse": "scheme:lse"}.get(kind, "F16")
        path, func, text = _source(event["frame"])
        return _classify_forward(site, op, path, func, text, event["dtype"])
    return _classify_backward(site, op, event, _dims(shape))


def _classify_forward(site, op, path, func, text, dtype) -> str | None:
    if path.endswith("modeling_flash_attention_utils.py") and (
        "torch.diff" in text or func == "_is_packed_sequence"
    ):
        # HFU:378, the packed-sequence test on the gathered position ids (diff, >=, all; in
        # transformers 4.57 `_is_packed_sequence`: arange + min, -, abs, sum, bool):
        # in no row and not in the ledger's upstream table.
        return "upstream:packed_check"
    if path.endswith("ulysses_sp.py"):
        if "position_ids" in text:
            return "F2" if "torch.cat" in text else "F1"
        if "repeat_interleave" in text:
            return "F7"
        if "rearrange(input" in text:  # the all-to-all's input copy
            return "F4-F6" if site == "q_exchange" else "F8-F10"
        if "rearrange(query_layer" in text:
            return "F4-F6"
        if "rearrange(key_layer" in text or "rearrange(value_layer" in text:
            # U:311-312, with more than one KV head per rank: FA2 saves these head-major copies
            # in place of the all-to-all outputs they replace (freed at once): the scheme's K/V.
            return "scheme:F10 head-major k, v (saved; replace the all-to-all outputs)"
        if func == "_partition_global_sequence":
            return "scheme:a2a_out" if "output" in text else "F18"
        if "context_layer" in text:
            return "F18"
        return None
    if path.endswith("sequence/layer.py") and op == "dim_zero_all_to_all":
        return {
            "q_exchange": "scheme:a2a_q",
            "kv_exchange": "scheme:a2a_kv",
            "out_exchange": "F20",
        }.get(site)
    if path.endswith("sdpa_attention.py"):
        if op.startswith("_scaled_dot_product"):
            return "scheme:attn_out_h" if dtype == "bfloat16" else "scheme:lse"
        if "attn_output" in text:  # the output's transpose(1, 2).contiguous(): the context copy
            return "F18"
        if func == "repeat_kv" or "key" in text or "value" in text:
            return "scheme:kv_repeated"
        return None
    if "/modeling_" in path:
        if func == "apply_rotary_pos_emb" and op == "add":
            return "F0"  # q_embed, k_embed
        if func in ("apply_rotary_pos_emb", "rotate_half"):
            return "scheme:rope"
        if "v_proj(" in text:
            return "F0"  # value_states, held like q and k
        if "q_proj(" in text:
            return "scheme:q"
        if "k_proj(" in text:
            return "scheme:kv"
        if "o_proj(" in text:
            return "scheme:attn_out"
        if "hidden_states" in text:  # Qwen3RMSNorm on q and k
            return "scheme:qk_norm"
    return None


def _classify_backward(site, op, event, dims) -> str | None:
    shape, frame = event["shape"], event["frame"]
    if event.get("stand_in"):
        name = event["stand_in"].split(" ")[1]
        if name == "dq":
            return "scheme:dq_h"
        if name in ("dk", "dv"):
            # sdpa, with repeat_kv before the kernel: the repeated K/V's gradient, before the
            # group sum. FlashAttention-2 takes GQA in the kernel: dk/dv have the KV heads (B3).
            sdpa = event["stand_in"].startswith("sdpa_flash")
            return "scheme:dkv_repeated" if sdpa and dims["n_rep"] > 1 else "scheme:dkv_h"
        return "scheme:attn_bwd_workspace"
    in_all_to_all = "sequence/layer.py" in frame
    if site == "dout_exchange":
        if in_all_to_all:
            return "B1" if op == "clone" else "scheme:a2a_dout"
        return None
    if site == "dq_exchange":
        if in_all_to_all and op == "clone":
            return "B9"
        return "scheme:a2a_dq"  # the all-to-all's output, the local-layout reshape copy (B10)
    if site == "dkv_exchange":
        if in_all_to_all and op == "clone":
            return "B8"
        if op == "sum":
            return "B11"  # repeat_interleave's backward: the replicas summed to the model's heads
        return "scheme:a2a_dkv"
    if site == "core_backward":
        return "scheme:dkv_h" if op == "sum" else None  # repeat_kv's backward: the group sum
    if site == "untracked":
        if len(shape) == 2 and shape[0] != dims["s"]:
            return "scheme:grads"  # projection weights
        if op == "sum" and all(n == 1 for n in shape[:-1]):
            return "scheme:grads"  # q/k norm weights
        if op == "mm" and shape[-1] == dims["q"]:
            return "scheme:dout"  # o_proj's input gradient (B0)
        return "scheme:qkv_bwd"  # RoPE, q/k norm and projection backward, down to dxn
    return None
