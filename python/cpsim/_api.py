"""The commands as functions. Each keyword argument is the command line's flag of the same name
(``seq="1M"`` is ``--seq 1M``, ``allow_data_parallel=True`` is ``--allow-data-parallel``, a list is
joined with commas, None leaves the flag out), so every flag of ``cpsim COMMAND --help`` is
accepted and an unknown one is an InputError naming it. The same parser, checks and engine run in
this process, so each answer is the command line's ``--json`` answer for the same input."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from . import _cpsim
from ._errors import InputError, error_from_failure
from ._results import (
    Catalog,
    HardwareComparison,
    MaxLen,
    MaxLenComparison,
    PackedBatches,
    Plan,
    Result,
    Simulation,
    SimulationComparison,
    Sweep,
)

# Flags the functions set themselves: every answer is JSON.
_RESERVED = {"json", "format"}


def _flag_value(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, os.PathLike):
        return [flag, os.fspath(value)]
    if isinstance(value, str):
        return [flag, value]
    if isinstance(value, (int, float)):
        return [flag, repr(value)]
    if isinstance(value, Sequence):
        return [flag, ",".join(str(v) for v in value)]
    raise InputError(
        f"{flag}: a {type(value).__name__} is not a flag value (str, int, float, bool, path or "
        "a list of them)",
        field=flag,
        exit_status=2,
    )


def command_line(command: Sequence[str], flags: Mapping[str, Any]) -> list[str]:
    """The arguments of ``cpsim`` for a command and keyword arguments (without ``--json``)."""
    args = list(command)
    for name, value in flags.items():
        if name in _RESERVED:
            raise InputError(
                f"--{name}: the Python API always answers with JSON objects (tables: .table, "
                ".configurations; the exact JSON text: .to_json())",
                field=f"--{name}",
                exit_status=2,
            )
        args += _flag_value(name, value)
    return args


def run(*args: str) -> tuple[int, str]:
    """Runs ``cpsim ARGS...`` in this process as the command line would: (exit status, standard
    output). A failure raises the CpsimError of its kind."""
    status, output, failure = _cpsim.run([str(a) for a in args])
    if failure is not None:
        raise error_from_failure(failure)
    return status, output.decode()


def _answer(args: list[str]) -> tuple[dict, str, int]:
    status, text = run(*args)
    return json.loads(text), text, status


def _typed(data: dict, text: str, status: int, cls: type[Result]) -> Result:
    """The answer as `cls`, or, for several hardware profiles, as a HardwareComparison."""
    if "hardware_compared" in data:
        return HardwareComparison(data, text, status)
    return cls(data, text, status)


class _ModelFile:
    """``model`` as the command line takes it: a built-in name or a config.json path stay as they
    are; a dict (a Hugging Face config) is written to a temporary config.json for the call."""

    def __init__(self, flags: dict) -> None:
        self._flags = flags
        self._dir: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> dict:
        model = self._flags.get("model")
        if isinstance(model, Mapping):
            self._dir = tempfile.TemporaryDirectory(prefix="cpsim-model-")
            path = os.path.join(self._dir.name, "config.json")
            with open(path, "w") as f:
                json.dump(dict(model), f)
            return {**self._flags, "model": path}
        return self._flags

    def __exit__(self, *exc: object) -> None:
        if self._dir is not None:
            self._dir.cleanup()


def simulate(
    **flags: Any,
) -> Simulation | SimulationComparison | HardwareComparison | PackedBatches:
    """One training step of a configuration (``cpsim simulate``): step time, throughput, peak GPU
    and host memory and why. Several methods (``method="ulysses,ring"`` or a list) give a
    SimulationComparison, several hardware profiles a HardwareComparison. A configuration that
    does not fit is an answer (``fits`` False, ``exit_status`` 3), not an exception. With
    ``lengths`` and ``pack`` (packed documents): a PackedBatches, the step-time distribution per
    load balancer."""
    with _ModelFile(flags) as f:
        data, text, status = _answer(command_line(["simulate"], f) + ["--json"])
    if "balancers" in data:
        return PackedBatches(data, text, status)
    return _typed(data, text, status, SimulationComparison if "comparison" in data else Simulation)


def maxlen(**flags: Any) -> MaxLen | MaxLenComparison | HardwareComparison:
    """The longest sequence that fits (``cpsim maxlen``) for ``method`` (several: a
    MaxLenComparison; several hardware profiles: a HardwareComparison), the binding constraint one
    step above, step time and headroom there; ``max_step_time="1h"`` caps the step time."""
    with _ModelFile(flags) as f:
        data, text, status = _answer(command_line(["maxlen"], f) + ["--json"])
    return _typed(data, text, status, MaxLenComparison if "methods" in data else MaxLen)


def plan(**flags: Any) -> Plan | HardwareComparison:
    """The best configurations (``cpsim plan``): the longest context, or with ``seq`` the fastest at
    that length; ``all=True`` keeps every configuration generated (``.configurations``). No
    configuration fitting raises DoesNotFit naming the flag."""
    with _ModelFile(flags) as f:
        data, text, status = _answer(command_line(["plan"], f) + ["--json"])
    return _typed(data, text, status, Plan)


def emit(launcher: str, out: str | os.PathLike | None = None, **flags: Any) -> Plan:
    """The plan of what ``launcher`` runs and its settings file (``cpsim plan --emit LAUNCHER``):
    written to ``out`` (and the files it needs beside it), or, without ``out``, returned as text in
    ``.files``."""
    return plan(emit=launcher, out=out, **flags)


def sweep(**flags: Any) -> Sweep:
    """Every method over a range of lengths (``cpsim sweep``): ``.table`` one row per method and
    length."""
    with _ModelFile(flags) as f:
        data, text, status = _answer(command_line(["sweep"], f) + ["--format", "json"])
    return Sweep(data, text, status)


def _catalog(command: str, name: str | None) -> Catalog:
    args = [command] + ([name] if name is not None else []) + ["--json"]
    data, text, status = _answer(args)
    return Catalog(data, text, status)


def models(name: str | None = None) -> Catalog:
    """The built-in models (``cpsim models``): ``.models``; one model (built-in name or a
    config.json path) in full as cpsim reads it: ``.model``."""
    return _catalog("models", name)


def hardware(name: str | None = None) -> Catalog:
    """The hardware profiles (``cpsim hardware``): ``.hardware``; one profile in full by name."""
    return _catalog("hardware", name)


def implementations(name: str | None = None) -> Catalog:
    """The CP implementations and their ledgers (``cpsim implementations``); one by name."""
    return _catalog("implementations", name)
