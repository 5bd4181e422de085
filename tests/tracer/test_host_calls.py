"""cpsim's traced framework calls per site (the SiteCalls tables in
sim/src/implementations/<impl>.cpp, docs/MODEL.md "Host issue") against the committed traces'
"op_counts" (data/traces/<impl>/<shape>.json, docs/TRACING.md): at every traced shape, each
site's count, summed over the table's rows that apply there, equals the trace's."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Implementation -> the file with its table.
TABLES = {
    "yunchang-usp": "sim/src/implementations/yunchang_usp.cpp",
    "deepspeed-ulysses": "sim/src/implementations/deepspeed_ulysses.cpp",
}
# Sites whose calls hold at Ulysses degree > 1 (the all-to-alls) and at ring degree 1 (the
# kernel's and grad_finish); the builders put the table's counts there (sim/src/step_builder.cpp,
# attention_core.cpp).
EXCHANGE_SITES = {
    "q_exchange",
    "kv_exchange",
    "out_exchange",
    "dout_exchange",
    "dq_exchange",
    "dkv_exchange",
}
CORE_SITES = {"core_forward", "core_backward", "grad_finish"}

ROW = re.compile(r"SiteCalls\{\s*LedgerSite::k(\w+),\s*CallsWhen::k(\w+),\s*(\d+)\s*\}")


def snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def table(impl: str) -> list[tuple[str, str, int]]:
    """The (site, when, calls) rows of the implementation's constexpr SiteCalls table."""
    with open(os.path.join(ROOT, TABLES[impl]), encoding="utf-8") as f:
        rows = [(snake(s), snake(w), int(n)) for s, w, n in ROW.findall(f.read())]
    assert rows, f"no SiteCalls rows in {TABLES[impl]}"
    return rows


def traces(impl: str) -> list[tuple[str, dict]]:
    folder = os.path.join(ROOT, "data", "traces", impl)
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json") and name != "ledger_check.json":
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                out.append((name, json.load(f)))
    return out


def applies(when: str, shape: dict) -> bool:
    """CallsWhen (sim/src/implementations/registry.cpp, Implementation::site_calls)."""
    u = shape["ulysses"]
    kv = shape["kv_heads"]
    kv_eff = max(kv, u)  # KV heads replicated up to the Ulysses degree (head_layout)
    return {
        "always": True,
        "heads_per_rank_above1": shape["heads"] // u > 1,
        "kv_heads_per_rank_above1": kv_eff // u > 1,
        "kv_replicated": kv_eff > kv,
    }[when]


def cases() -> list:
    return [
        pytest.param(impl, name, trace, id=f"{impl}/{name}")
        for impl in TABLES
        for name, trace in traces(impl)
    ]


@pytest.mark.parametrize("impl,name,trace", cases())
def test_table_equals_trace(impl, name, trace):
    shape = trace["shape"]
    sites = set()
    if shape["ulysses"] > 1:
        sites |= EXCHANGE_SITES
    if shape.get("ring", 1) == 1:
        sites |= CORE_SITES
    traced = {o["site"]: o["ops"] for o in trace["op_counts"] if o["phase"] != "setup"}
    rows = table(impl)
    for site in sorted(sites):
        ours = sum(n for s, w, n in rows if s == site and applies(w, shape))
        assert ours == traced.get(site, 0), (
            f"{impl} {name}: {site} traced {traced.get(site, 0)} calls, the table says {ours}"
        )


@pytest.mark.parametrize("impl", TABLES)
def test_cli_shows_the_table(impl):
    """`cpsim implementations NAME --json` lists the same rows (when the binary is built)."""
    binary = os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim"))
    if not os.path.exists(binary):
        pytest.skip(f"{binary} not built")
    out = subprocess.run(
        [binary, "implementations", impl, "--json"], check=True, capture_output=True, text=True
    ).stdout
    shown = [(r["site"], r["when"], r["calls"]) for r in json.loads(out)["traced_calls"]]
    names = {
        "always": "always",
        "heads_per_rank_above1": "h/u > 1",
        "kv_heads_per_rank_above1": "hkv/u > 1",
        "kv_replicated": "kv replicated",
    }
    assert shown == [(s, names[w], n) for s, w, n in table(impl)]
