"""One driver per traced implementation. A driver module provides:

  IMPLEMENTATION: str        cpsim's name for it (`--impl`)
  PACKAGES: list[str]        the distributions whose versions the trace records
  STAND_INS: list[str]       what runs as a stand-in instead of the real code, one line each
  SHAPES: list[dict]         at least three; each has "name" and the sizes the driver reads
                             (seq = global tokens N, heads H, kv_heads Hkv, head_dim d, ulysses u,
                             ring r, chunk, ...; keep them small: a trace runs in seconds)
  world_size(shape) -> int   the ranks of the (fake) process group; the trace is rank 0's
  run(recorder, shape)       builds the implementation's module from its installed package and
                             runs one block's attention: forward (recorder.set_phase("forward")),
                             the recompute where the implementation's checkpointing runs one
                             ("recompute"), backward ("backward"); wraps the upstream calls in
                             recorder.site(NAME) with cpsim's ledger site names
                             (held_through_block, q_exchange, kv_exchange, core_forward,
                             out_exchange, dout_exchange, core_backward, grad_finish,
                             dq_exchange, dkv_exchange, ring_forward_step, ring_backward_step)
  classify(event, shape) -> str | None
                             the ledger row (docs/implementations/<impl>.md) or scheme tensor
                             ("scheme:<what>") an allocation event is, None when unknown: by its
                             site, frame (package/file.py:line) and shape, never by its bytes
"""

from __future__ import annotations

import importlib

_MODULES = {
    "yunchang-usp": "yunchang_usp",
    "deepspeed-ulysses": "deepspeed_ulysses",
    "deepspeed-fpdt": "deepspeed_fpdt",
    "torch-native-cp": "torch_native_cp",
}


def load(name: str):
    if name not in _MODULES:
        raise KeyError(f"{name!r} has no driver (traced: {', '.join(sorted(_MODULES))})")
    return importlib.import_module(f"cpsim_tracer.drivers.{_MODULES[name]}")


def all_drivers() -> dict:
    found = {}
    for name in _MODULES:
        try:
            found[name] = load(name)
        except ImportError:
            continue
    return found
