"""Records every tensor allocation and free of the code that runs under it, on the CPU.

An allocation is a new storage produced by an aten op (seen through a TorchDispatchMode); its free
is the moment that storage dies (a weak reference to it: PyTorch keeps one Python object per
storage while any tensor, autograd's saved tensors included, holds it). Views and in-place
results share a storage and are not allocations. What the recorder cannot see: memory that C++
code allocates without an aten op (a collective backend's internal buffers, a kernel's workspace),
which the stand-in kernels and the ledgers state from source.

Each event carries the site and phase the driver set (`site()`), the aten op, and the upstream
frame that made it: the innermost frame of the traced package's code (not torch, not this tracer).
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_TRACER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _target_dirs() -> tuple[str, ...]:
    """PYTHONPATH directories that hold installed distributions (`pip install --target DIR`, a
    *.dist-info inside): their packages count as installed, like site-packages' own."""
    found = []
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        try:
            names = os.listdir(entry) if entry else []
        except OSError:
            continue
        if any(name.endswith(".dist-info") for name in names):
            found.append(os.path.abspath(entry))
    return tuple(found)


_TARGET_DIRS = _target_dirs()


def _site_packages_relative(filename: str) -> str | None:
    """'deepspeed/sequence/layer.py' for a file of an installed package, None for other files."""
    marker = os.sep + "site-packages" + os.sep
    i = filename.rfind(marker)
    if i < 0:
        for root in _TARGET_DIRS:
            if filename.startswith(root + os.sep):
                return filename[len(root) + 1 :]
        return None
    return filename[i + len(marker) :]


def upstream_frame(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame in an installed package other than torch: 'pkg/file.py:123 (func)'.

    Falls back to the innermost frame outside torch and this tracer (a driver's own call), then
    to the innermost frame of all."""
    fallback = None
    for frame in reversed(stack):
        path = os.path.abspath(frame.filename)
        if path.startswith(_TORCH_DIR) or path.startswith(_TRACER_DIR):
            continue
        rel = _site_packages_relative(path)
        if rel is not None:
            return f"{rel}:{frame.lineno} ({frame.name})"
        if fallback is None:
            fallback = f"{os.path.basename(path)}:{frame.lineno} ({frame.name})"
    if fallback is not None:
        return fallback
    last = stack[-1] if stack else None
    return f"{os.path.basename(last.filename)}:{last.lineno} ({last.name})" if last else "?"


# Aten ops that launch no kernel (besides views).
_NO_KERNEL = frozenset({"detach", "empty", "empty_like", "empty_strided", "alias", "lift_fresh"})


@dataclass
class Event:
    seq: int
    kind: str  # "alloc" or "free"
    id: int  # the allocation's number (an alloc and its free share it)
    bytes: int
    site: str
    phase: str
    site_seq: int = 0  # which entry into a site (each recorder.site() call is a new one)
    dtype: str = ""
    shape: tuple[int, ...] = ()
    op: str = ""
    frame: str = ""
    stand_in: str = ""  # the stand-in kernel that made it, if any

    def to_json(self) -> dict:
        d = {
            "seq": self.seq,
            "event": self.kind,
            "id": self.id,
            "bytes": self.bytes,
            "site": self.site,
            "site_seq": self.site_seq,
            "phase": self.phase,
        }
        if self.kind == "alloc":
            d.update(dtype=self.dtype, shape=list(self.shape), op=self.op, frame=self.frame)
            if self.stand_in:
                d["stand_in"] = self.stand_in
        return d


@dataclass
class _Live:
    id: int
    bytes: int


@dataclass
class AllocationRecorder(TorchDispatchMode):
    """Use as a context manager around the code to trace; read `events` afterwards."""

    events: list[Event] = field(default_factory=list)
    _live: dict[int, _Live] = field(default_factory=dict)  # StorageImpl address -> allocation
    _sites: list[tuple[str, int]] = field(default_factory=lambda: [("untracked", 0)])
    _site_entries: int = 0
    _phase: str = "setup"
    _paused: int = 0
    _next_id: int = 0
    # Framework calls that launch work, per (phase, site): every aten op dispatched except views,
    # detach and empty allocations (no kernel), plus one per stand-in kernel call.
    op_counts: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__()

    # -- where the code is -------------------------------------------------------------------
    @contextlib.contextmanager
    def site(self, name: str):
        """Events inside carry `name` as their site (nested sites: the innermost)."""
        self._site_entries += 1
        self._sites.append((name, self._site_entries))
        try:
            yield
        finally:
            self._sites.pop()

    def set_phase(self, phase: str) -> None:
        self._phase = phase

    @contextlib.contextmanager
    def paused(self):
        """Allocations inside are not recorded (a stand-in kernel's own arithmetic)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    # -- recording ---------------------------------------------------------------------------
    def _record_alloc(self, t: torch.Tensor, op: str, stand_in: str = "") -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self._live or st.nbytes() == 0:
            return
        self._next_id += 1
        live = _Live(self._next_id, st.nbytes())
        self._live[key] = live
        frame = upstream_frame(traceback.extract_stack()[:-3])
        self.events.append(
            Event(
                seq=len(self.events),
                kind="alloc",
                id=live.id,
                bytes=live.bytes,
                site=self._sites[-1][0],
                phase=self._phase,
                site_seq=self._sites[-1][1],
                dtype=str(t.dtype).replace("torch.", ""),
                shape=tuple(t.shape),
                op=op,
                frame=frame,
                stand_in=stand_in,
            )
        )
        weakref.finalize(st, self._record_free, key, live.id)

    def _record_free(self, key: int, alloc_id: int) -> None:
        live = self._live.get(key)
        if live is None or live.id != alloc_id:
            return
        del self._live[key]
        self.events.append(
            Event(
                seq=len(self.events),
                kind="free",
                id=alloc_id,
                bytes=live.bytes,
                site=self._sites[-1][0],
                phase=self._phase,
                site_seq=self._sites[-1][1],
            )
        )

    def _count_op(self) -> None:
        key = (self._phase, self._sites[-1][0])
        self.op_counts[key] = self.op_counts.get(key, 0) + 1

    def count_stand_in_call(self) -> None:
        """A stand-in kernel's call: one launch, whatever the stand-in computes meanwhile."""
        self._count_op()

    def record_stand_in_output(self, t: torch.Tensor, stand_in: str) -> None:
        """A stand-in kernel's output, made while paused: recorded as the kernel's allocation."""
        self._record_alloc(t, op=stand_in, stand_in=stand_in)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._paused:
            return out
        if not (func.is_view or func.overloadpacket.__name__ in _NO_KERNEL):
            self._count_op()
        inputs = {
            a.untyped_storage()._cdata
            for a in tree_flatten((args, kwargs))[0]
            if isinstance(a, torch.Tensor) and a.device.type != "meta"
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                if t.untyped_storage()._cdata not in inputs:
                    self._record_alloc(t, op=str(func.overloadpacket.__name__))
        return out

    # -- summaries ---------------------------------------------------------------------------
    def op_counts_json(self) -> list[dict]:
        return [
            {"phase": phase, "site": site, "ops": n}
            for (phase, site), n in sorted(self.op_counts.items())
        ]

    def live_bytes(self) -> int:
        return sum(live.bytes for live in self._live.values())


class SiteSwitch:
    """A site that hooks inside an upstream call end and replace by the next one (a ring step's
    end opens the next step; a kernel's return opens the code after it)."""

    def __init__(self, recorder: AllocationRecorder):
        self.recorder = recorder
        self._open: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def span(self, name: str):
        """Marks `name` until switch() names the next site, or the block ends."""
        self.switch(name)
        try:
            yield
        finally:
            self._open.close()
            self._open = None

    def switch(self, name: str) -> None:
        if self._open is not None:
            self._open.close()
        self._open = contextlib.ExitStack()
        self._open.enter_context(self.recorder.site(name))


def packages(names: list[str]) -> dict[str, str]:
    """Installed versions of the named distributions (absent ones omitted)."""
    import importlib.metadata as md

    found = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in names:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return found
