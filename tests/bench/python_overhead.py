"""What a Python call costs over the same work in the command line: for each question, the median
wall time of (a) `cpsim ...` as a process, (b) the engine in process without the Python layer
(`cpsim._cpsim.run`), (c) the Python API call (`cpsim.maxlen(...)`: flags, the call, the JSON
parsed into a typed result), run alternately so that drift affects all three alike. Prints the
ratios (c)/(a) and (c)/(b). A timing, not a test: run by hand, after the build.

    PYTHONPATH=build/python .venv/bin/python tests/bench/python_overhead.py [--repeats 15]
"""

import argparse
import os
import statistics
import subprocess
import time

import cpsim
from cpsim import _cpsim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPSIM = os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim"))

QUESTIONS = [
    ("maxlen --method upipe", cpsim.maxlen, {"method": "upipe"}),
    ("simulate --seq 1M", cpsim.simulate, {"seq": "1M"}),
    ("maxlen --method all", cpsim.maxlen, {"method": "all"}),
    ("plan", cpsim.plan, {}),
    ("plan --seq 512K --all", cpsim.plan, {"seq": "512K", "all": True}),
]


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    os.environ["CPSIM_PROGRESS"] = "never"  # the in-process calls read it too
    env = dict(os.environ)
    print(
        f"{'question':<24} {'CLI process':>12} {'engine':>10} {'Python':>10} "
        f"{'Py/CLI':>7} {'Py/engine':>9}"
    )
    for name, function, flags in QUESTIONS:
        argv = cpsim.command_line(name.split()[:1], flags) + (
            ["--format", "json"] if name.startswith("sweep") else ["--json"]
        )
        cli_s, engine_s, python_s = [], [], []
        process = [CPSIM, *argv]
        for _ in range(args.repeats):
            cli_s.append(timed(lambda p=process: subprocess.run(p, capture_output=True, env=env)))
            engine_s.append(timed(lambda a=argv: _cpsim.run(a)))
            python_s.append(timed(lambda f=function, k=flags: f(**k)))
        a, b, c = (statistics.median(x) for x in (cli_s, engine_s, python_s))
        print(
            f"{name:<24} {a * 1e3:>10.1f}ms {b * 1e3:>8.1f}ms {c * 1e3:>8.1f}ms "
            f"{c / a:>7.3f} {c / b:>9.3f}"
        )


if __name__ == "__main__":
    main()
