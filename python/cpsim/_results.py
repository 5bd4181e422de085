"""Typed results: each command's JSON answer, its keys as attributes, its tables as DataFrames."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any


def _wrap(value: Any) -> Any:
    if isinstance(value, dict):
        return Record(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class Record(Mapping):
    """A JSON object of an answer: ``r.step_time_s`` is ``r["step_time_s"]``; nested objects are
    Records, lists are lists. ``to_dict()`` gives the plain data."""

    __slots__ = ("_data",)

    def __init__(self, data: dict) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(self._data[name])
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r} (fields: {', '.join(self._data)})"
            ) from None

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._data))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={v!r}" for k, v in self._data.items() if not isinstance(v, (dict, list))
        )
        return f"{type(self).__name__}({shown})"

    def to_dict(self) -> dict:
        """The answer as plain dicts and lists (a deep copy)."""
        return json.loads(json.dumps(self._data))


def _frame(rows: list[dict]) -> Any:
    """A pandas DataFrame of JSON rows, nested objects flattened to ``a.b`` columns."""
    try:
        import pandas as pd
    except ImportError as e:  # pandas is an optional dependency of the package
        raise ImportError("tables come back as pandas DataFrames: pip install pandas") from e
    return pd.json_normalize(rows)


class Result(Record):
    """One command's answer. ``text`` is what ``cpsim ... --json`` prints for the same input, byte
    for byte; ``exit_status`` what it exits with (3: does not fit)."""

    __slots__ = ("text", "exit_status")

    def __init__(self, data: dict, text: str, exit_status: int) -> None:
        super().__init__(data)
        self.text = text
        self.exit_status = exit_status

    def to_json(self) -> str:
        """The command line's JSON output for the same input."""
        return self.text


class Simulation(Result):
    """``simulate`` of one configuration: ``fits``, ``step_time_s``, ``tokens_per_s_per_gpu``,
    ``peak_memory_bytes``, ``reserved_memory_bytes``, ``binding_constraint``,
    ``category_peak_bytes``, ``config``, ... (the keys of ``cpsim simulate --json``)."""


class PackedBatches(Result):
    """``simulate`` with ``lengths`` and ``pack``: the step over sampled packed batches per load
    balancer (``balancers``), the step with one document a sequence (``one_document``) and the
    ``recommended`` balancer (the keys of ``cpsim simulate --lengths ... --json``)."""

    @property
    def table(self) -> Any:
        """One row per load balancer (pandas DataFrame), without the per-batch lists."""
        rows = [
            {k: v for k, v in b.items() if not k.endswith("_per_batch")}
            for b in self._data["balancers"]
        ]
        return _frame(rows)


class SimulationComparison(Result):
    """``simulate`` of several methods: ``comparison`` holds one Simulation-like record each."""

    @property
    def table(self) -> Any:
        """One row per method (pandas DataFrame)."""
        return _frame(self._data["comparison"])


class MaxLen(Result):
    """``maxlen`` of one method: ``max_seq_len`` (tokens), ``binding_constraint`` one step above,
    ``step_time_s`` and ``tokens_per_s_per_gpu`` there, ``headroom_bytes``, ``implementation``, ...
    (the keys of ``cpsim maxlen --json``)."""

    @property
    def fits(self) -> bool:
        """False when not even the shortest length searched fits (exit status 3)."""
        return self.exit_status == 0


class MaxLenComparison(Result):
    """``maxlen`` of several methods: ``methods`` holds one MaxLen-like record each."""

    @property
    def table(self) -> Any:
        """One row per method (pandas DataFrame)."""
        return _frame(self._data["methods"])


class Plan(Result):
    """``plan``: ``best``, ``top``, ``pareto``, ``best_per_method``, ``why_best``, ``counts``,
    ``methods_without_fit`` and, with a launcher, ``emitted`` (the keys of
    ``cpsim plan --json``)."""

    @property
    def configurations(self) -> Any:
        """The configurations as a pandas DataFrame, one row each, best first: every configuration
        generated, with ``status`` and ``why``, when the plan was asked with ``all=True``; else the
        ``top`` ranked ones (``top=N`` for more)."""
        rows = self._data.get("all")
        return _frame(rows if rows is not None else self._data["top"])

    @property
    def files(self) -> dict[str, str]:
        """With a launcher and no ``out``: the emitted file's text and its companions', by name
        (``out`` given: the files are on disk and their texts here are empty)."""
        emitted = self._data.get("emitted")
        if emitted is None:
            return {}
        files = {emitted["file"] or "<file>": emitted["text"]}
        for companion in emitted["companions"]:
            files[companion["file"]] = companion["text"]
        return files


class Sweep(Result):
    """``sweep``: every method over a range of lengths; ``rows`` one per method and length."""

    @property
    def table(self) -> Any:
        """One row per method and length (pandas DataFrame)."""
        return _frame(self._data["rows"])


class HardwareComparison(Result):
    """The same question on several hardware profiles (``hardware=["h100-sxm-80g", "h200-141g"]``):
    ``answers`` maps each profile to its answer, the command's answer for that profile alone."""

    @property
    def answers(self) -> dict[str, Record]:
        """Each profile's answer (a Record; for a plan nothing fits on: its ``error``)."""
        return {h["hardware"]: Record(h["answer"]) for h in self._data["hardware_compared"]}

    @property
    def table(self) -> Any:
        """One row per profile (and method; for a plan, its best configuration), pandas DataFrame
        with a ``hardware`` column."""
        rows = []
        for h in self._data["hardware_compared"]:
            answer = h["answer"]
            if "comparison" in answer or "methods" in answer:
                items = answer.get("comparison", answer.get("methods"))
            elif "best" in answer:
                items = [answer["best"]]
            else:
                items = [answer]
            rows += [{"hardware": h["hardware"], **item} for item in items]
        return _frame(rows)


class Catalog(Result):
    """``models``, ``hardware`` or ``implementations``: the built-in entries."""
