"""DeepSpeed FPDT ("Ulysses-Offload", deepspeed/sequence/fpdt_layer.py) as Megatron-DeepSpeed runs
it with `--ds-sequence-parallel-fpdt` (ledger: docs/implementations/deepspeed-fpdt.md).

What runs: `FPDT_Attention` built as Megatron-DeepSpeed's `launch_chunk_attention` builds it
(megatron/model/transformer.py: the fused QKV weight [(H+2Hkv)d, hid] with its bias, the dense
weight [hid, Hd] and bias, gather_idx=1 as with flash-attn v2, return_bias=True, chunk_size =
`--ds-sequence-parallel-fpdt-chunk-size`), called as ParallelTransformerLayer calls it
(layernorm_output [s, 1, hid], attention_mask None, rotary_pos_emb = (cos, sin) each [N, 1, 1, d]
bf16, cpu_offloading = `--ds-sequence-parallel-fpdt-offloading`), then backward from the dense
output. With offloading and more than one chunk `_FPDTGPUOffloadingAttentionImpl_` runs, else
`_FPDTGPUAttentionImpl_` (fpdt_layer.py `FPDT_Attention.forward`). The inputs, parameters and the
output gradient are made before recording; the trace is the module call and its backward.

The QKV bias is required: both Functions add `qkv_linear_bias` to the projection and read its
`.shape` in backward (fpdt_layer.py `qkv_chunk = torch.matmul(...) + qkv_linear_bias` and
`torch.zeros(qkv_linear_bias.shape, ...)`), which fails for the None that Megatron passes with
`--disable-bias-linear`; so the traces are those of `--add-bias-linear`.

On the CPU (see STAND_INS): the CPU accelerator's `Stream` is None, so the offloading path's
`get_accelerator().Stream()` fails; the driver makes it (and `default_stream()`) a stream whose
`wait_stream`/`synchronize` do nothing (every copy is synchronous on the CPU). DeepSpeed's CPU
`pin_memory` returns its argument, so the "pinned" host copies are ordinary CPU tensors, recorded
like the device's; the site says which are host memory on a GPU (`offload:<list>`: a
SequenceChunk's host copy) and classify names them (`f2`, `scheme:*_host`, `scheme:dq_fp32_all`).
One CPU difference remains: the accelerator counts a CPU tensor as on the device
(`on_accelerator`), so `SequenceChunk` of the already-host dq buffers (backward, dq[1..n-1])
copies them once more into a second host buffer, where a GPU keeps the first.

Sites (recorder.site), innermost wins:
  fpdt_attention           the module call (FPDT_Attention.forward: output permute, dense matmul)
                           and autograd's backward of the dense matmul;
  fpdt_forward_chunk,      the Function's forward / backward (its chunk loops) outside the sites
  fpdt_backward_chunk      below;
  q_exchange, kv_exchange, each single_all_to_all, by the variable its result is assigned to;
  out_exchange, dout_exchange, dq_exchange, dkv_exchange
  core_forward             _flash_attn_forward and update_out_and_lse (one block);
  core_backward            one backward block, one entry: from the statement
                           `dq_this = torch.zeros(...)` (the block's new dq/dk/dv; a line trace
                           of the backward frame) to the return of _flash_attn_backward;
  rope:<target>            apply_rotary_pos_emb / apply_rotary_pos_emb_backward, by the variable
                           assigned (q_chunk, k_chunk, dq_accum, dk_accum, dq, dk);
  offload:<list>           SequenceChunk(...) appended or assigned to that list (its host copy);
  load:<list>[<index>]     SequenceChunk.load_to_gpu (the device copy), as the source spells it.

classify: the ledger's cpsim rows (f4, f5, f10, f13, b5, b8, b13 (dq), b13 (dk, dv)); the ids of
its section-3 table for what cpsim does not model (f1-f3, f6, f8, f14-f18, b1, b3, b4, b11, b12,
b14, b15, b17); and `scheme:<name>` for what cpsim's FPDT scheme (sim/src/attention_fpdt.cpp)
holds, named after its tensors: qkv_proj (its q + kv), a2a_q, a2a_kv (the head-sharded Q, K, V,
before and after RoPE), q_host, kv_host, fpdt_acc (fp32 output + LSE accumulator, the old one
and, from the update's final adds on, the new one),
attn_fwd_workspace (a block's out and LSE), kv_buffer (K/V fetched in forward), attn_out_h (the
output's bf16 cast), lse, a2a_out, out_host (output and LSE on the host), fpdt_out (the layer's
output), dxn, dout_slice, a2a_dout, dout_host, dq_fp32_all (dQ's fp32 chunks: on the host, or on
the device without offloading), dq_block (dQ's fp32 chunk on the device), dkv_acc,
q_chunk_buffer (a query chunk's Q, output, LSE, dOut and dQ fetched), kv_fetched,
flash_bwd_workspace, dq_h, dkv_h (dQ's, dK's, dV's bf16 casts), dq_rope, dkv_rope, a2a_dq,
a2a_dkv. Rules use the site, the frame's function and source statement, the aten op and the
tensor's layout role, never its bytes. Not classified: the fake group's barrier tensor (1 byte)
and the dense weight's gradient (autograd of the dense matmul; no FPDT row).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import importlib
import os
import re
import sys
import types

IMPLEMENTATION = "deepspeed-fpdt"
PACKAGES = ["deepspeed", "torch", "einops"]
STAND_INS = [
    "flash_attn: cpsim_tracer/flash_stand_in.py (FlashAttention-2 v2.8.3 interface; fpdt_layer.py "
    "imports flash_attn.__version__, _flash_attn_forward and _flash_attn_backward)",
    "accelerator streams: get_accelerator().Stream and default_stream() (None on the CPU "
    "accelerator) give a stream whose wait_stream/synchronize do nothing, so the offloading path "
    "runs; pinned host buffers are plain CPU tensors (the CPU accelerator's pin_memory returns "
    "its argument)",
    "deepspeed.comm: its TorchBackend over the fake process group, built without the "
    "shared-memory op (build_shm_op would JIT-compile a C++ extension)",
]


def _shape(name, seq, heads, kv_heads, head_dim, ulysses, chunk, offload=True):
    return {
        "name": name,
        "seq": seq,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "hidden": heads * head_dim,
        "ulysses": ulysses,
        "chunk": chunk,  # global tokens (--ds-sequence-parallel-fpdt-chunk-size)
        "offload": offload,  # --ds-sequence-parallel-fpdt-offloading
        # cpsim's FPDT rows count one chunk's elements on one rank (sim::ledger_units: s =
        # N / C / (N / chunk) = chunk / C tokens).
        "ledger_units": {
            "s": chunk // ulysses,
            "heads": heads,
            "kv_heads": max(kv_heads, ulysses),
            "head_dim": head_dim,
        },
    }


SHAPES = [
    _shape("s128-h8-kv8-d16-u4-c32", 128, 8, 8, 16, 4, 32),
    _shape("s192-h4-kv4-d32-u2-c64", 192, 4, 4, 32, 2, 64),
    _shape("s256-h8-kv4-d32-u2-c64", 256, 8, 4, 32, 2, 64),
    _shape("s512-h16-kv4-d16-u4-c256", 512, 16, 4, 16, 4, 256),
    _shape("s128-h8-kv8-d16-u4-c32-nooffload", 128, 8, 8, 16, 4, 32, offload=False),
    _shape("s256-h8-kv4-d32-u2-c64-nooffload", 256, 8, 4, 32, 2, 64, offload=False),
]


def world_size(shape: dict) -> int:
    return shape["ulysses"]


# -- source statements -------------------------------------------------------------------------
@functools.cache
def _statements(filename: str) -> tuple[list[tuple[int, int, ast.stmt]], str]:
    with open(filename) as f:
        text = f.read()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt):
            found.append((node.lineno, node.end_lineno or node.lineno, node))
    return found, text


@functools.cache
def _statement(filename: str, lineno: int) -> ast.stmt | None:
    """The innermost statement spanning `lineno`."""
    best = None
    for first, last, node in _statements(filename)[0]:
        if first <= lineno <= last and (best is None or last - first < best[1] - best[0]):
            best = (first, last, node)
    return best[2] if best else None


@functools.cache
def _statement_text(filename: str, lineno: int) -> str:
    node = _statement(filename, lineno)
    if node is None:
        return ""
    segment = " ".join((ast.get_source_segment(_statements(filename)[1], node) or "").split())
    return re.sub(r"\s+([)\]])", r"\1", re.sub(r"([(\[])\s+", r"\1", segment))


def _assigned_name(filename: str, lineno: int) -> str:
    """The variable (or list) the statement at `lineno` assigns or appends to."""
    node = _statement(filename, lineno)
    if isinstance(node, ast.Assign):
        target = node.targets[0]
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Name):
            return target.id
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        if isinstance(func, ast.Attribute) and func.attr == "append" and \
                isinstance(func.value, ast.Name):
            return func.value.id
    return "?"


def _caller(depth: int = 2) -> tuple[str, int]:
    f = sys._getframe(depth)
    return f.f_code.co_filename, f.f_lineno


@functools.cache
def _site_packages() -> str:
    import deepspeed

    return os.path.dirname(os.path.dirname(os.path.abspath(deepspeed.__file__)))


# -- running on the CPU ------------------------------------------------------------------------
class _HostStream:
    """The CPU's stand-in for an accelerator stream: work is synchronous, nothing to wait for."""

    def wait_stream(self, _other) -> None:
        return None

    def synchronize(self) -> None:
        return None


def _init_deepspeed_comm() -> None:
    """deepspeed.comm over the process group the runner made (comm.py init_distributed: a torch
    group already initialised gets a TorchBackend and no launcher discovery)."""
    import deepspeed.comm as ds_dist

    if ds_dist.is_initialized():
        return
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    build_shm_op = ds_torch.build_shm_op
    ds_torch.build_shm_op = lambda: None
    try:
        ds_dist.init_distributed(dist_backend="fake", auto_mpi_discovery=False, verbose=False)
    finally:
        ds_torch.build_shm_op = build_shm_op


class _Patches:
    """Attribute replacements, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[tuple[object, str, object, bool]] = []

    def set(self, obj, name: str, value) -> None:
        own = vars(obj) if isinstance(obj, type) else obj.__dict__
        self._undo.append((obj, name, own.get(name), name in own))
        setattr(obj, name, value)

    def restore(self) -> None:
        for obj, name, old, had in reversed(self._undo):
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)
        self._undo.clear()


class _BlockSite:
    """The backward block's site: opened at the statement `dq_this = torch.zeros(...)` (a line
    trace of the Function's backward frame only), closed when _flash_attn_backward returns."""

    _OPENS = re.compile(r"^dq_this = torch\.zeros\(")

    def __init__(self, recorder, code) -> None:
        self._recorder = recorder
        self._code = code
        self._stack = contextlib.ExitStack()
        self._open = False
        self._previous = None

    def _line(self, frame, event, _arg):
        if event == "line" and not self._open and \
                self._OPENS.match(_statement_text(frame.f_code.co_filename, frame.f_lineno)):
            self._stack.enter_context(self._recorder.site("core_backward"))
            self._open = True
        return self._line

    def _call(self, frame, event, _arg):
        if event == "call" and frame.f_code is self._code:
            return self._line
        return None

    @property
    def is_open(self) -> bool:
        return self._open

    def close(self) -> None:
        if self._open:
            self._stack.close()
            self._open = False

    def __enter__(self):
        self._previous = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._previous)
        self.close()
        return False


def _exchange_site(target: str) -> str:
    for prefix, site in (("grad_global_attn_output", "dout_exchange"), ("dq", "dq_exchange"),
                         ("dk", "dkv_exchange"), ("dv", "dkv_exchange"), ("q_", "q_exchange"),
                         ("k_", "kv_exchange"), ("v_", "kv_exchange"),
                         ("all2all_output", "out_exchange"), ("output", "out_exchange")):
        if target.startswith(prefix):
            return site
    return "all_to_all"


_LOAD = re.compile(r"^(\w+)\[([^\]]*)\]\.load_to_gpu\(\)$")


def _load_site(filename: str, lineno: int) -> str:
    m = _LOAD.match(_statement_text(filename, lineno))
    return f"load:{m.group(1)}[{m.group(2)}]" if m else "load:?"


def _install(recorder, fpdt, patches: _Patches) -> None:
    """Sites around fpdt_layer.py's calls (module globals and class attributes, undone after)."""
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    if accel.Stream is None:  # the CPU accelerator's Stream property
        patches.set(type(accel), "Stream", property(lambda _self: _HostStream))
        patches.set(accel, "default_stream", lambda device_index=None: _HostStream())

    def at_site(fn, name_of):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with recorder.site(name_of(*_caller())):
                return fn(*args, **kwargs)

        return wrapped

    def exchange_site(f, ln):
        return _exchange_site(_assigned_name(f, ln))

    def rope_site(f, ln):
        return "rope:" + _assigned_name(f, ln)

    patches.set(fpdt, "single_all_to_all", at_site(fpdt.single_all_to_all, exchange_site))
    for name in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_backward"):
        patches.set(fpdt, name, at_site(getattr(fpdt, name), rope_site))
    for name in ("_flash_attn_forward", "update_out_and_lse"):
        patches.set(fpdt, name, at_site(getattr(fpdt, name), lambda f, ln: "core_forward"))

    blocks: list[_BlockSite] = []
    flash_backward = fpdt._flash_attn_backward

    @functools.wraps(flash_backward)
    def flash_backward_site(*args, **kwargs):
        if any(block.is_open for block in blocks):  # the block's entry goes on to here
            try:
                return flash_backward(*args, **kwargs)
            finally:
                for block in blocks:
                    block.close()
        with recorder.site("core_backward"):
            return flash_backward(*args, **kwargs)

    patches.set(fpdt, "_flash_attn_backward", flash_backward_site)

    chunk = fpdt.SequenceChunk
    init, load = chunk.__init__, chunk.load_to_gpu

    @functools.wraps(init)
    def chunk_init(self, *args, **kwargs):
        with recorder.site("offload:" + _assigned_name(*_caller())):
            init(self, *args, **kwargs)

    @functools.wraps(load)
    def chunk_load(self):
        with recorder.site(_load_site(*_caller())):
            load(self)

    patches.set(chunk, "__init__", chunk_init)
    patches.set(chunk, "load_to_gpu", chunk_load)

    for impl in (fpdt._FPDTGPUAttentionImpl_, fpdt._FPDTGPUOffloadingAttentionImpl_):
        forward, backward = impl.forward, impl.backward

        def forward_site(*args, _fn=forward, **kwargs):
            with recorder.site("fpdt_forward_chunk"):
                return _fn(*args, **kwargs)

        def backward_site(*args, _fn=backward, **kwargs):
            block = _BlockSite(recorder, _fn.__code__)
            blocks.append(block)
            try:
                with recorder.site("fpdt_backward_chunk"), block:
                    return _fn(*args, **kwargs)
            finally:
                blocks.remove(block)

        patches.set(impl, "forward", staticmethod(functools.wraps(forward)(forward_site)))
        patches.set(impl, "backward", staticmethod(functools.wraps(backward)(backward_site)))


# -- the run -----------------------------------------------------------------------------------
def _build(shape: dict):
    """FPDT_Attention with Megatron-DeepSpeed's parameters (launch_chunk_attention), its input,
    RoPE tables and the gradient of its output."""
    import torch
    import torch.distributed as tdist
    from deepspeed.sequence.fpdt_layer import FPDT_Attention

    dt = torch.bfloat16
    n_tok, h, hk, d = shape["seq"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    hid, u = shape["hidden"], shape["ulysses"]
    config = types.SimpleNamespace(kv_channels=d, num_attention_heads=h, num_key_value_heads=hk,
                                   hidden_size=hid, attention_dropout=0.0)

    def param(*size):
        return torch.nn.Parameter(torch.randn(*size, dtype=dt) * 0.02)

    module = FPDT_Attention(config, param((h + 2 * hk) * d, hid), param((h + 2 * hk) * d),
                            param(hid, h * d), param(hid), sequence_process_group=tdist.group.WORLD,
                            gather_idx=1, scatter_idx=2, return_bias=True,
                            chunk_size=shape["chunk"], enable_offloading=shape["offload"])
    x = torch.randn(n_tok // u, 1, hid, dtype=dt, requires_grad=True)
    angle = torch.arange(n_tok, dtype=torch.float32)[:, None] * 0.01 * torch.arange(1, d + 1)
    rope = (angle.cos().to(dt).reshape(n_tok, 1, 1, d), angle.sin().to(dt).reshape(n_tok, 1, 1, d))
    dy = torch.randn(n_tok // u, 1, hid, dtype=dt)
    return module, x, rope, dy


def run(recorder, shape: dict) -> None:
    _init_deepspeed_comm()
    from deepspeed.sequence import fpdt_layer

    patches = _Patches()
    gc.collect()
    gc.disable()  # frees at the reference drops, the same in every run
    try:
        _install(recorder, fpdt_layer, patches)
        module, x, rope, dy = _build(shape)
        with recorder:
            recorder.set_phase("forward")
            with recorder.site("fpdt_attention"):
                out, bias = module(x, None, None, rope, cpu_offloading=shape["offload"])
            recorder.set_phase("backward")
            with recorder.site("fpdt_attention"):
                out.backward(dy)
            del out, bias
            gc.collect()
            for t in (x, *module.parameters(), module.qkv_linear_weight,
                      module.qkv_linear_bias, module.qkv_dense_weight, module.qkv_dense_bias):
                t.grad = None
            gc.collect()
    finally:
        patches.restore()
        gc.enable()


# -- classification ----------------------------------------------------------------------------
_FRAME = re.compile(r"(.+):(\d+) \((.+)\)$")
_FPDT = "deepspeed/sequence/fpdt_layer.py"
_LAYER = "deepspeed/sequence/layer.py"
_EXCHANGE_ROWS = {"q_exchange": "f4", "kv_exchange": "f5", "out_exchange": "f13",
                  "dout_exchange": "b5", "dq_exchange": "b13 (dq)",
                  "dkv_exchange": "b13 (dk, dv)"}
_EXCHANGE_RESULTS = {"q_exchange": "scheme:a2a_q", "kv_exchange": "scheme:a2a_kv",
                     "out_exchange": "scheme:a2a_out", "dout_exchange": "scheme:a2a_dout",
                     "dq_exchange": "scheme:a2a_dq", "dkv_exchange": "scheme:a2a_dkv"}
# single_all_to_all with batch_dim_idx 0 (layer.py _generate_layout_params): the permute
# post_func applies to the receive buffer, by direction (scatter_idx 2: heads scattered).
_POST_PERMUTE = {"q_exchange": (1, 0, 2, 3, 4), "kv_exchange": (1, 0, 2, 3, 4),
                 "dout_exchange": (1, 0, 2, 3, 4), "out_exchange": (1, 2, 0, 3, 4),
                 "dq_exchange": (1, 2, 0, 3, 4), "dkv_exchange": (1, 2, 0, 3, 4)}
_FLASH = {"flash_attn.mha_fwd out": "scheme:attn_fwd_workspace",
          "flash_attn.mha_fwd softmax_lse": "scheme:attn_fwd_workspace",
          "flash_attn.mha_fwd rng_state": "f8"}
# A SequenceChunk's host copy, by the list it goes to (site offload:<list>).
_HOST = {"layernorm_output_cpu": "f2", "global_q": "scheme:q_host", "global_k": "scheme:kv_host",
         "global_v": "scheme:kv_host", "global_o": "scheme:out_host",
         "global_lse": "scheme:out_host", "grad_global_attn_output": "scheme:dout_host",
         "dq": "scheme:dq_fp32_all"}
# _update_out_and_lse (fpdt_layer.py): `new_lse = lse + log1p(exp(block_lse - lse))`, then
# `out = exp(lse - new_lse) * out + exp(block_lse - new_lse) * block_out`. Its two final adds make
# the new accumulator (output and LSE), held to the next update as the old one was
# (scheme:fpdt_acc); the rest (the fp32 block output, the two products, the LSE-sized terms) is f10.
_UPDATE_NEW_ACCUMULATOR_OP = "add"
_BWD_QUERY_LISTS = ("dq", "global_q", "attn_output", "lse", "grad_global_attn_output")
_ROPE_RESULTS = (("q_chunk", "scheme:a2a_q"), ("k_chunk", "scheme:a2a_kv"),
                 ("dq", "scheme:dq_rope"), ("dk", "scheme:dkv_rope"))
# fpdt_layer.py statements (whitespace collapsed) -> what they allocate; (pattern, op or None).
_FORWARD = [
    (r"^qkv_chunk = torch\.matmul\(", "add", "scheme:qkv_proj"),
    (r"^qkv_chunk = torch\.matmul\(", None, "f1"),  # the matmul before the bias add
    (r"^[qkv]_chunk = qkv_chunk\[", None, "f3"),
    (r"^global_o\.append\(SequenceChunk\(cur_attn_output\.to\(", None, "f14"),
    (r"^all2all_output = single_all_to_all\(cur_attn_output\.to\(", None, "scheme:attn_out_h"),
    (r"^global_o\[i\] = global_o\[i\]\.to\(", None, "scheme:attn_out_h"),
    (r"^output\[i\] = single_all_to_all\(global_o\[i\]\.to\(", None, "scheme:attn_out_h"),
    (r"^global_lse\.append\(SequenceChunk\(cur_attn_lse\[", None, "scheme:lse"),
    (r"^global_lse\[i\] = global_lse\[i\]\[", None, "scheme:lse"),
    (r"^(final_)?output = torch\.cat\(", None, "scheme:fpdt_out"),
    (r"^output = output\.flatten\(2\)", None, "f17"),
    (r"^output = torch\.matmul\(output, self\.qkv_dense_weight", None, "f18"),
]
_BACKWARD = [
    (r"^grad_layernorm_output = \[", None, "scheme:dxn"),
    (r"^grad_qkv_linear_(weight|bias) = torch\.zeros", None, "b3"),
    (r"grad_output\[:, (:chunk_size|st:ed)\]\.contiguous\(\)", None, "scheme:dout_slice"),
    (r"^dq = \[SequenceChunk\(", "zeros", "scheme:dq_block"),  # dq[0] on the device
    (r"^dq = \[SequenceChunk\(", "empty", "scheme:dq_fp32_all"),  # dq[1..] on the host
    (r"^d[kv]_accum = torch\.zeros", None, "scheme:dkv_acc"),
    (r"^dq = \[torch\.zeros", None, "scheme:dq_fp32_all"),
    (r"^d[kv] = \[torch\.zeros", None, "scheme:dkv_acc"),
    (r"^d[qkv]_this = torch\.zeros", None, "b8"),
    (r"\.add_\(d[qkv]_this\.to\(torch\.float\)\)", None, "b11"),
    (r"^(dq_accum|dq\[i\]) = ", "_to_copy", "scheme:dq_h"),
    (r"^(d[kv]_accum|d[kv]\[i\]) = ", "_to_copy", "scheme:dkv_h"),
    (r"^grad_qkv_linear_(weight|bias)\[.*\]\.add_\(", None, "b14"),
    (r"^grad_layernorm_output\[i\]\.add_\(", None, "b15"),
    (r"^return torch\.cat\(", None, "b17"),
]


def _permute_copies(dims: list[int], perm: tuple[int, ...]) -> bool:
    """Whether `.permute(perm).contiguous()` of a contiguous tensor of `dims` copies: not when
    the dims of size > 1 keep their order."""
    if len(dims) != len(perm):
        return True
    moved = [i for i in perm if dims[i] != 1]
    return moved != sorted(moved)


def _match(rules, text: str, op: str) -> str | None:
    for pattern, rule_op, row in rules:
        if (rule_op is None or rule_op == op) and re.search(pattern, text):
            return row
    return None


def classify(event: dict, shape: dict) -> str | None:
    frame = event.get("frame", "")
    if frame.startswith("_compile.py:") and event["site"] == "fpdt_attention":
        # The dense (output projection) weight's gradient, made by autograd under torch's
        # dynamo-disable wrapper (no upstream frame): one of the model's gradients.
        if event["phase"] == "backward" and event["shape"] == [shape["hidden"], shape["hidden"]]:
            return "scheme:dense weight gradient (the model's gradients)"
    m = _FRAME.match(frame)
    if not m:
        return None
    if m.group(1) == "deepspeed/comm/torch.py" and m.group(3) == "barrier":
        # c10d's barrier makes a one-element tensor (fpdt_layer.py's barriers after each block).
        return "upstream:barrier tensor (c10d, 1 element)"
    rel, lineno, func = m.group(1), int(m.group(2)), m.group(3)
    site, op, phase = event["site"], event["op"], event["phase"]
    if event.get("stand_in"):
        name = event["stand_in"]
        if name.startswith("flash_attn.mha_bwd") and (
                name.endswith("(source_read)") or name.endswith("softmax_d")):
            return "scheme:flash_bwd_workspace"  # dq_accum, softmax_d, GQA dk/dv_expanded
        return _FLASH.get(name)  # (FPDT passes mha_bwd its dq, dk, dv: none made there)
    if rel == _LAYER:
        return _classify_layer(func, site, op, event["shape"])
    if rel != _FPDT:
        return _classify_autograd(event, shape)
    if func == "__init__" and site.startswith("offload:"):
        return _HOST.get(site[len("offload:"):])  # SequenceChunk's host copy
    if func == "load_to_gpu" and site.startswith("load:"):
        return _classify_load(site[len("load:"):], phase)
    if site.startswith("rope:"):
        return _classify_rope(site, op, "b12")
    if func == "_update_out_and_lse":
        return "scheme:fpdt_acc" if op == _UPDATE_NEW_ACCUMULATOR_OP else "f10"
    if func == "update_out_and_lse":
        return "scheme:fpdt_acc"
    text = _statement_text(os.path.join(_site_packages(), rel), lineno)
    return _match(_FORWARD if phase == "forward" else _BACKWARD, text, op)


def _classify_layer(func: str, site: str, op: str, dims: list[int]) -> str | None:
    if site in _EXCHANGE_ROWS:
        if func == "pre_all2all_fun":
            return _EXCHANGE_ROWS[site]  # input_t: the permuted copy sent
        if func == "single_all_to_all":  # the receive buffer: the result when post_func is a view
            if _permute_copies(dims, _POST_PERMUTE[site]):
                return _EXCHANGE_ROWS[site]
            return _EXCHANGE_RESULTS[site]
        if func == "post_func":
            return _EXCHANGE_RESULTS[site]
        return None
    if site.startswith("rope:") and func in ("apply_rotary_pos_emb", "_rotate_half"):
        return _classify_rope(site, op, "f6")
    return None


def _classify_rope(site: str, op: str, temporary: str) -> str | None:
    """RoPE (layer.py apply_rotary_pos_emb, fpdt_layer.py apply_rotary_pos_emb_backward): the
    final add is the result (`t = (t * cos) + (rotate_half(t) * sin)`), the rest transients."""
    if op != "add":
        return temporary
    target = site[len("rope:"):]
    for prefix, row in _ROPE_RESULTS:
        if target.startswith(prefix):
            return row
    return None


def _classify_load(where: str, phase: str) -> str | None:
    name, index = where.split("[", 1)
    if name == "layernorm_output":
        return "b4"
    if phase == "forward":
        if index == "0]":  # chunk 0 fetched at the forward's last block, kept to the backward
            return "f15"
        return "scheme:kv_buffer"
    if name in ("global_k", "global_v"):
        return "scheme:kv_fetched"
    if name in _BWD_QUERY_LISTS:
        return "scheme:q_chunk_buffer"
    return None


def _classify_autograd(event: dict, shape: dict) -> str | None:
    """No DeepSpeed frame: autograd's backward of the dense matmul (FPDT_Attention.forward). Its
    input gradient is the Function's grad_output (b1): [tokens, H*d], token dim first; the dense
    weight's gradient [hid, H*d] is no FPDT row (SHAPES keep tokens per rank != hidden)."""
    dims = event["shape"]
    if event["phase"] == "backward" and event["site"] == "fpdt_attention" and \
            event["op"] == "mm" and dims[0] == shape["seq"] // shape["ulysses"]:
        return "b1"
    return None
