#!/usr/bin/env python3
"""Compare cpsim's Google Benchmark timings with the committed baseline.

Runs build/tests/bench/cpsim_bench_sim and cpsim_bench_planner (or reads their
--benchmark_format=json outputs given with --input), compares every benchmark's real_time with
tests/bench/baseline.json by ratio (now / baseline), prints a table (name, baseline, now, ratio)
and exits 1 when a ratio exceeds the threshold (1.20: more than 20 % slower) or a benchmark of
the baseline did not run; 0 otherwise; 2 on a usage error or when a benchmark program fails.

The baseline holds timings of one machine (named inside the file, with the date): compare only on
that machine with a Release build (the default CMAKE_BUILD_TYPE), while it is otherwise idle
(BM_PlanSeq1M evaluates on 2 threads: on a 2-core machine its real time doubles when another
process takes a core). Each benchmark runs 3 times and the median counts (--repetitions).

The baseline must be re-recorded after an intended speed-up (or slow-down) of the simulator or
planner, after adding or renaming a benchmark, or on another machine:

    python3 scripts/bench_compare.py --update

CI runs only scripts/bench_smoke.sh, which calls this script with --no-compare: CI machines differ,
so there the programs must just run and exit 0.

Examples:
    python3 scripts/bench_compare.py                        # run both programs, compare
    python3 scripts/bench_compare.py --min-time 2            # longer runs, less noise
    python3 scripts/bench_compare.py --input sim.json --input planner.json
    python3 scripts/bench_compare.py --update --machine "my laptop"
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ("cpsim_bench_sim", "cpsim_bench_planner")
BASELINE_SCHEMA = "cpsim.bench-baseline/1"
UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


class UsageError(Exception):
    """Bad arguments, unreadable files, a failing benchmark program: exit status 2."""


def real_times(report, origin):
    """{name: (real_time in seconds, time_unit)} from one --benchmark_format=json report.

    With --benchmark_repetitions the median aggregate is used; otherwise the (single) iteration
    entry. Error entries are refused."""
    if not isinstance(report, dict) or not isinstance(report.get("benchmarks"), list):
        raise UsageError(f"{origin}: not a Google Benchmark JSON report (no 'benchmarks' list)")
    iterations, medians = {}, {}
    for b in report["benchmarks"]:
        try:
            name = b["run_name"] if "run_name" in b else b["name"]
            if b.get("error_occurred"):
                raise UsageError(f"{origin}: {name}: {b.get('error_message', 'error')}")
            unit = b.get("time_unit", "ns")
            seconds = float(b["real_time"]) * UNIT_SECONDS[unit]
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"{origin}: malformed benchmark entry {b!r}: {e}") from None
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = (seconds, unit)
        else:
            iterations.setdefault(name, []).append((seconds, unit))
    out = {}
    for name, runs in iterations.items():
        runs.sort()
        out[name] = runs[len(runs) // 2]
    out.update(medians)
    return out


def run_program(path, min_time, repetitions, bench_filter):
    """Runs one benchmark program and returns its parsed JSON report."""
    if not os.access(path, os.X_OK):
        raise UsageError(f"{path}: not found (build first: cmake --build build)")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [path, f"--benchmark_out={out.name}", "--benchmark_out_format=json"]
        if min_time is not None:
            cmd.append(f"--benchmark_min_time={min_time}")
        if repetitions is not None:
            cmd.append(f"--benchmark_repetitions={repetitions}")
        if bench_filter is not None:
            cmd.append(f"--benchmark_filter={bench_filter}")
        print("bench:", " ".join(cmd), file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, stdout=sys.stderr, check=False)
        if proc.returncode != 0:
            raise UsageError(f"{os.path.basename(path)} exited with status {proc.returncode}")
        try:
            with open(out.name, encoding="utf-8") as f:
                text = f.read()
            if not text.strip() and bench_filter is not None:
                return {"benchmarks": []}  # the filter matched none of this program's benchmarks
            return json.loads(text)
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"{path}: unreadable JSON output: {e}") from None


def collect(args):
    """{name: (seconds, unit)} over every program (or input file), plus the run context."""
    results, context = {}, None
    if args.input:
        sources = []
        for path in args.input:
            try:
                with open(path, encoding="utf-8") as f:
                    sources.append((path, json.load(f)))
            except (OSError, json.JSONDecodeError) as e:
                raise UsageError(f"{path}: {e}") from None
    else:
        bench_dir = os.path.join(args.build_dir, "tests", "bench")
        sources = [(p, run_program(os.path.join(bench_dir, p), args.min_time, args.repetitions,
                                   args.filter)) for p in PROGRAMS]
    for origin, report in sources:
        for name, value in real_times(report, origin).items():
            if name in results:
                raise UsageError(f"{origin}: benchmark {name} appears twice")
            results[name] = value
        context = context or report.get("context", {})
    if not results:
        raise UsageError("no benchmark ran")
    return results, context or {}


def load_baseline(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise UsageError(f"{path}: {e} (record one with --update)") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: malformed JSON: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != BASELINE_SCHEMA:
        raise UsageError(f"{path}: schema must be {BASELINE_SCHEMA!r}")
    out = {}
    for name, entry in data.get("benchmarks", {}).items():
        try:
            seconds = float(entry["real_time_s"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"{path}: benchmarks.{name}.real_time_s must be a number") from None
        if not seconds > 0:
            raise UsageError(f"{path}: benchmarks.{name}.real_time_s must be positive")
        out[name] = (seconds, entry.get("time_unit", "s"))
    if not out:
        raise UsageError(f"{path}: no benchmarks")
    return data, out


def machine_description():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def cmake_build_type(args):
    """CMAKE_BUILD_TYPE of --build-dir ("unknown" with --input or without a CMake cache)."""
    if args.input:
        return "unknown"
    try:
        with open(os.path.join(args.build_dir, "CMakeCache.txt"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    return line.split("=", 1)[1].strip() or "unknown"
    except OSError:
        pass
    return "unknown"


def write_baseline(path, results, context, args):
    data = {
        "schema": BASELINE_SCHEMA,
        "note": ("real_time of cpsim_bench_sim and cpsim_bench_planner (Release build) on the "
                 "machine below; compare only there. Re-record with `python3 "
                 "scripts/bench_compare.py --update` after an intended speed-up or on another "
                 "machine."),
        "machine": args.machine or machine_description(),
        "date": args.date or datetime.date.today().isoformat(),
        "cpsim_build_type": cmake_build_type(args),
        "benchmark_library_build_type": context.get("library_build_type", "unknown"),
        "min_time": args.min_time,
        "repetitions": args.repetitions,
        "benchmarks": {
            name: {"real_time_s": seconds, "time_unit": unit}
            for name, (seconds, unit) in sorted(results.items())
        },
    }
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def show(seconds, unit):
    return f"{seconds / UNIT_SECONDS[unit]:.3f} {unit}"


def compare(baseline, results, threshold, filtered=False):
    """Table rows and the failures: ratios above `threshold` and baseline entries that did not
    run (unless `filtered`: then they were left out on purpose). Benchmarks that are not in the
    baseline are listed as new and never fail."""
    rows, failures = [], []
    for name in sorted(set(baseline) | set(results)):
        if name not in results and filtered:
            rows.append((name, show(*baseline[name]), "-", "-", "not run"))
        elif name not in results:
            rows.append((name, show(*baseline[name]), "-", "-", "MISSING"))
            failures.append(f"{name}: in the baseline but did not run")
        elif name not in baseline:
            rows.append((name, "-", show(*results[name]), "-", "new"))
        else:
            base, unit = baseline[name]
            now = results[name][0]
            ratio = now / base
            slow = ratio > threshold
            rows.append((name, show(base, unit), show(now, unit), f"{ratio:.3f}",
                         "REGRESSION" if slow else "ok"))
            if slow:
                failures.append(f"{name}: {ratio:.2f}x the baseline (limit {threshold:.2f}x)")
    return rows, failures


def format_table(rows):
    header = ("benchmark", "baseline", "now", "ratio", "")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = []
    for r in [header] + rows:
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in (1, 2, 3)] + [r[4]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def main(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"),
                   help="build folder with tests/bench/ (default: build); use a Release build")
    p.add_argument("--baseline", default=os.path.join(REPO, "tests", "bench", "baseline.json"))
    p.add_argument("--input", action="append", metavar="JSON",
                   help="read a --benchmark_format=json output instead of running (repeatable)")
    p.add_argument("--min-time", metavar="T",
                   help="passed as --benchmark_min_time (Google Benchmark 1.7: seconds, e.g. 0.5;"
                        " 1.8+: 0.5s)")
    p.add_argument("--repetitions", type=int, default=3, metavar="N",
                   help="passed as --benchmark_repetitions; the median is compared (default 3)")
    p.add_argument("--filter", metavar="REGEX", help="passed as --benchmark_filter")
    p.add_argument("--threshold", type=float, default=1.20,
                   help="largest allowed ratio now / baseline (default 1.20)")
    p.add_argument("--update", action="store_true",
                   help="rewrite the baseline with this run (after an intended speed-up)")
    p.add_argument("--no-compare", action="store_true",
                   help="smoke run: run and print, never fail on timings (CI)")
    p.add_argument("--machine", help="--update: machine description (default: from /proc/cpuinfo)")
    p.add_argument("--date", help="--update: date recorded (default: today)")
    p.add_argument("--self-test", action="store_true", help="run this script's unit tests")
    args = p.parse_args(argv)
    if args.self_test:
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(SelfTest)
        return 0 if unittest.TextTestRunner(verbosity=1).run(suite).wasSuccessful() else 1
    if args.threshold <= 0:
        raise UsageError("--threshold must be positive")
    if args.update and args.no_compare:
        raise UsageError("--update and --no-compare exclude each other")

    if args.update and args.filter is not None:
        raise UsageError("--update records every benchmark; drop --filter")
    if args.update and not args.input and cmake_build_type(args) != "Release":
        raise UsageError(f"{args.build_dir} is a {cmake_build_type(args)} build; record the "
                         "baseline with a Release build")
    results, context = collect(args)
    if args.update:
        write_baseline(args.baseline, results, context, args)
        print(f"bench: wrote {args.baseline} ({len(results)} benchmarks)")
        for name, value in sorted(results.items()):
            print(f"  {name}: {show(*value)}")
        return 0
    if args.no_compare:
        try:
            _, baseline = load_baseline(args.baseline)
        except UsageError as e:
            print(f"bench: warning: {e}")
            baseline = {}
        rows, _ = compare(baseline, results, float("inf"))
        print(format_table(rows))
        print(f"bench: {len(results)} benchmarks ran (timings not compared)")
        return 0
    data, baseline = load_baseline(args.baseline)
    rows, failures = compare(baseline, results, args.threshold, filtered=args.filter is not None)
    print(f"baseline: {data.get('machine', '?')}, {data.get('date', '?')}")
    print(format_table(rows))
    if failures:
        print(f"bench: {len(failures)} problem(s):")
        for f in failures:
            print(f"  {f}")
        print("bench: if the change is intended, re-record with --update")
        return 1
    print(f"bench: {len(results)} benchmarks within {args.threshold:.2f}x of the baseline")
    return 0


def _report(entries):
    """A minimal Google Benchmark JSON report: entries are (name, real_time, unit[, extra])."""
    out = []
    for e in entries:
        b = {"name": e[0], "run_name": e[0], "run_type": "iteration", "real_time": e[1],
             "cpu_time": e[1], "time_unit": e[2], "iterations": 10}
        if len(e) > 3:
            b.update(e[3])
        out.append(b)
    return {"context": {"library_build_type": "release"}, "benchmarks": out}


class SelfTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.baseline = os.path.join(self.dir.name, "baseline.json")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, report):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f)
        return path

    def run_main(self, *argv):
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                code = main(["--baseline", self.baseline, *argv])
            except UsageError:
                code = 2
        return code, out.getvalue()

    def record(self):
        a = self.write("a.json", _report([("BM_A", 10.0, "ms"), ("BM_B/3", 2000.0, "us")]))
        code, _ = self.run_main("--input", a, "--update", "--machine", "test", "--date",
                                "2026-11-22")
        self.assertEqual(code, 0)

    def test_update_writes_baseline_in_seconds(self):
        self.record()
        with open(self.baseline, encoding="utf-8") as f:
            data = json.load(f)
        self.assertEqual(data["schema"], BASELINE_SCHEMA)
        self.assertEqual(data["machine"], "test")
        self.assertEqual(data["date"], "2026-11-22")
        self.assertAlmostEqual(data["benchmarks"]["BM_A"]["real_time_s"], 0.010)
        self.assertAlmostEqual(data["benchmarks"]["BM_B/3"]["real_time_s"], 0.002)
        self.assertFalse(os.path.exists(self.baseline + ".tmp"))

    def test_within_threshold_passes(self):
        self.record()
        # 19 % slower and faster, in another unit: within the limit.
        b = self.write("b.json", _report([("BM_A", 11.9, "ms"), ("BM_B/3", 0.001, "s")]))
        code, out = self.run_main("--input", b)
        self.assertEqual(code, 0, out)
        self.assertIn("1.190", out)
        self.assertIn("0.500", out)

    def test_regression_fails_and_names_it(self):
        self.record()
        b = self.write("b.json", _report([("BM_A", 12.1, "ms"), ("BM_B/3", 2000.0, "us")]))
        code, out = self.run_main("--input", b)
        self.assertEqual(code, 1, out)
        self.assertIn("BM_A: 1.21x", out)
        self.assertNotIn("BM_B/3: ", out)
        # A looser threshold accepts it.
        code, out = self.run_main("--input", b, "--threshold", "1.5")
        self.assertEqual(code, 0, out)

    def test_missing_benchmark_fails_new_one_does_not(self):
        self.record()
        b = self.write("b.json", _report([("BM_A", 10.0, "ms"), ("BM_C", 1.0, "ms")]))
        code, out = self.run_main("--input", b)
        self.assertEqual(code, 1, out)
        self.assertIn("BM_B/3: in the baseline but did not run", out)
        self.assertIn("new", out)
        self.assertNotIn("BM_C:", out)

    def test_filter_leaves_others_out_without_failing(self):
        self.record()
        b = self.write("b.json", _report([("BM_A", 10.5, "ms")]))
        code, out = self.run_main("--input", b, "--filter", "BM_A")
        self.assertEqual(code, 0, out)
        self.assertIn("not run", out)
        b = self.write("c.json", _report([("BM_A", 13.0, "ms")]))
        code, out = self.run_main("--input", b, "--filter", "BM_A")
        self.assertEqual(code, 1, out)

    def test_no_compare_never_fails_on_timings(self):
        self.record()
        b = self.write("b.json", _report([("BM_A", 100.0, "ms")]))
        code, out = self.run_main("--input", b, "--no-compare")
        self.assertEqual(code, 0, out)
        self.assertIn("timings not compared", out)

    def test_median_aggregate_is_used_with_repetitions(self):
        self.record()
        agg = {"run_type": "aggregate", "aggregate_name": "median"}
        mean = {"run_type": "aggregate", "aggregate_name": "mean"}
        b = self.write("b.json", _report([
            ("BM_A", 50.0, "ms"), ("BM_A", 10.0, "ms"), ("BM_A", 10.0, "ms"),
            ("BM_A_median", 10.0, "ms", dict(agg, run_name="BM_A")),
            ("BM_A_mean", 23.3, "ms", dict(mean, run_name="BM_A")),
            ("BM_B/3", 2.0, "ms")]))
        code, out = self.run_main("--input", b)
        self.assertEqual(code, 0, out)

    def test_bad_inputs_are_usage_errors(self):
        code, _ = self.run_main("--input", self.write("x.json", {"benchmarks": []}), "--update")
        self.assertEqual(code, 2)
        code, _ = self.run_main("--input", self.write("v.json", {"benchmarks": []}), "--filter",
                                "BM_A", "--update")
        self.assertEqual(code, 2)
        code, _ = self.run_main("--input", self.write("y.json", {"nope": 1}))
        self.assertEqual(code, 2)
        err = _report([("BM_A", 1.0, "ms", {"error_occurred": True, "error_message": "boom"})])
        code, _ = self.run_main("--input", self.write("z.json", err))
        self.assertEqual(code, 2)
        # No baseline recorded yet.
        code, _ = self.run_main("--input", self.write("w.json", _report([("BM_A", 1.0, "ms")])))
        self.assertEqual(code, 2)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as e:
        print(f"bench_compare: {e}", file=sys.stderr)
        sys.exit(2)
