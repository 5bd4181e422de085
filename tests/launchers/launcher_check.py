"""What the launcher checkers share: a report of the stages they ran, the flags of a cpsim bash
argument file, and the command line (`CHECKER FILE --gpus N`: prints the report as JSON; exit 0
when the launcher's code accepted the file, 1 when it raised)."""

import argparse
import contextlib
import json
import re
import shlex
import sys
import traceback
from pathlib import Path


def new_report(**versions):
    return {"ok": True, "versions": versions, "stages_run": [], "error": None, "notes": []}


def stage(rep, name, fn, frames="site-packages/", cpu_limit=None):
    """Runs one step of the launcher's code; records ok, RAISED (the launcher's own exception
    with the file:line of its innermost frame under `frames`), or, when `cpu_limit(e, line)`
    names a reason, a step that cannot run on the CPU. Returns fn()'s value, or None."""
    try:
        out = fn()
        rep["stages_run"].append(f"{name}: ok")
        return out
    except Exception as e:  # the launcher's own exception, reported verbatim
        tb = traceback.extract_tb(e.__traceback__)
        f = ([x for x in tb if frames in x.filename] or tb)[-1]
        loc = f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"
        why = cpu_limit(e, f.line or "") if cpu_limit else None
        if why:
            rep["stages_run"].append(f"{name}: could not run on CPU ({why}) at {loc}")
            return None
        msg = f"{name}: {type(e).__name__}: {e} at {loc}: {(f.line or '').strip()}"
        rep["ok"], rep["error"] = False, rep["error"] or msg
        rep["stages_run"].append(f"{name}: RAISED")
        rep["notes"].append(msg)
        return None


def bash_array_flags(path):
    """The `NAME=( ... )` bash array of a cpsim flags file, as {flag: value or True}."""
    body = re.search(r"^\w+=\(\n(.*?)^\)", Path(path).read_text(), re.S | re.M).group(1)
    toks, flags = shlex.split(body, comments=True), {}
    for i, t in enumerate(toks):
        if t.startswith("--"):
            nxt = toks[i + 1] if i + 1 < len(toks) else "--"
            flags[t] = True if nxt.startswith("--") else nxt
    return flags


def main(check, *extra):
    """`CHECKER FILE --gpus N [extra options]`: runs check(path, gpus, **extra) with the
    launcher's own prints sent to stderr, prints the report, exits 0 when accepted, else 1.
    `extra`: (flag, help) pairs of optional string options passed by name."""
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--gpus", type=int, required=True)
    for flag, help_text in extra:
        ap.add_argument(flag, default=None, help=help_text)
    a = vars(ap.parse_args())
    path, gpus = a.pop("path"), a.pop("gpus")
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints op-build messages to stdout
        report = check(path, gpus, **a)
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["ok"] else 1)
