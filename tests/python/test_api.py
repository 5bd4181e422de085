"""The Python API against the command line: for the same input every answer is the CLI's JSON,
byte for byte, and every failure the same kind and field. Over the README's examples, bad input of
each kind, a Hugging Face config as a dict, the plan's table of every configuration, and the
launcher files.

Environment: CPSIM_BIN (the cpsim executable; default build/cpsim).
"""

import csv
import errno
import io
import json
import os
import re
import shlex
import subprocess

import pytest

import cpsim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPSIM = os.path.abspath(os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim")))
ENV = {**os.environ, "CPSIM_PROGRESS": "never"}

# Each function's command and how its JSON is asked for on the command line.
FUNCTIONS = {
    "simulate": (cpsim.simulate, ["--json"]),
    "maxlen": (cpsim.maxlen, ["--json"]),
    "plan": (cpsim.plan, ["--json"]),
    "sweep": (cpsim.sweep, ["--format", "json"]),
}


def cli(args, cwd):
    return subprocess.run([CPSIM, *args], capture_output=True, text=True, cwd=cwd, env=ENV)


def keywords(args):
    """Command-line flags as the keyword arguments of the Python call (a flag without a value is
    True)."""
    out, i = {}, 0
    while i < len(args):
        assert args[i].startswith("--"), args
        name = args[i][2:].replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[name], i = args[i + 1], i + 2
        else:
            out[name], i = True, i + 1
    return out


def readme_examples():
    with open(os.path.join(ROOT, "README.md")) as f:
        block = re.search(r"## Examples\n\n```bash\n(.*?)```", f.read(), re.S).group(1)
    out = []
    for line in block.splitlines():
        words = shlex.split(line.partition("  #")[0])
        if len(words) > 1 and words[1] in FUNCTIONS and "--help" not in words:
            out.append([w for w in words[1:] if w != "--json"])
    return out


def same_answer(args, tmp_path, monkeypatch):
    """Runs one command both ways (each in a folder of its own, for the files it writes) and checks
    the Python result or exception against the CLI's output."""
    command, flags = args[0], args[1:]
    function, as_json = FUNCTIONS[command]
    (tmp_path / "cli").mkdir(parents=True)
    (tmp_path / "py").mkdir(parents=True)
    r = cli([command, *flags, *as_json], tmp_path / "cli")
    monkeypatch.chdir(tmp_path / "py")
    if r.returncode in (0, 3) and not r.stdout.lstrip().startswith('{\n  "error"'):
        result = function(**keywords(flags))
        assert result.to_json() == r.stdout  # byte for byte
        assert result.to_dict() == json.loads(r.stdout)
        assert result.exit_status == r.returncode
        for name in os.listdir(tmp_path / "cli"):
            assert (tmp_path / "py" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
        return result
    expected = json.loads(r.stdout)["error"]
    with pytest.raises(cpsim.CpsimError) as caught:
        function(**keywords(flags))
    e = caught.value
    assert (e.kind, e.field, e.exit_status) == (expected["kind"], expected["field"], r.returncode)
    assert str(e) == expected["message"]
    return e


@pytest.mark.parametrize("args", readme_examples(), ids=" ".join)
def test_readme_example_same_as_cli(args, tmp_path, monkeypatch):
    same_answer(args, tmp_path, monkeypatch)


BAD_INPUT = [
    ["simulate", "--gpus", "0"],
    ["simulate", "--seq", "12Q"],
    ["simulate", "--method", "spiral"],
    ["maxlen", "--hardware", "h100-pcie-96g"],
    ["maxlen", "--method", "ulysses", "--no-such-flag", "1"],
    ["plan", "--zero", "7"],
    ["plan", "--fixed-recipe"],
    ["plan", "--dataset", "d.jsonl"],
    ["simulate", "--model", "path/to/missing/config.json"],
    ["simulate", "--model", "qwen3-30b-a3b", "--impl", "megatron-core-cp", "--ep", "3"],
    ["simulate", "--expert-imbalance", "0.5"],
]


@pytest.mark.parametrize("args", BAD_INPUT, ids=" ".join)
def test_bad_input_same_kind_and_field(args, tmp_path, monkeypatch):
    e = same_answer(args, tmp_path, monkeypatch)
    assert isinstance(e, cpsim.InputError) and isinstance(e, ValueError)
    assert e.field and e.exit_status == 2


def test_does_not_fit_is_an_exception_for_plan_and_an_answer_for_maxlen(tmp_path, monkeypatch):
    e = same_answer(["plan", "--seq", "64M", "--method", "ring"], tmp_path / "a", monkeypatch)
    assert isinstance(e, cpsim.DoesNotFit) and e.field == "--seq" and e.exit_status == 3
    r = same_answer(
        ["maxlen", "--method", "ring", "--model", "llama3.1-405b", "--gpus", "2"],
        tmp_path / "b",
        monkeypatch,
    )
    assert isinstance(r, cpsim.MaxLen) and not r.fits and r.exit_status == 3


def test_output_error_names_the_path(tmp_path, monkeypatch):
    e = same_answer(["plan", "--emit", "deepspeed", "--out", "/dev/full"], tmp_path, monkeypatch)
    assert isinstance(e, cpsim.OutputError) and isinstance(e, OSError)
    assert e.path == "/dev/full" and e.error_number == errno.ENOSPC


def test_python_only_refusals():
    with pytest.raises(cpsim.InputError) as caught:
        cpsim.plan(format="csv")
    assert caught.value.field == "--format" and caught.value.argument == "format"
    with pytest.raises(cpsim.InputError) as caught:
        cpsim.simulate(gpus=object())
    assert caught.value.field == "--gpus"


def test_typed_results():
    r = cpsim.maxlen(model="llama3-8b", gpus=8, method="upipe")
    assert isinstance(r, cpsim.MaxLen) and r.fits
    assert r.max_seq_len > 0 and r.max_seq_len % 1024 == 0
    assert r.binding_constraint.kind == r["binding_constraint"]["kind"]
    assert "max_seq_len" in repr(r)
    with pytest.raises(AttributeError, match="no field 'max_len'"):
        _ = r.max_len
    several = cpsim.maxlen(method=["ulysses", "ring"])
    assert isinstance(several, cpsim.MaxLenComparison)
    assert list(several.table["method"]) == ["ulysses", "ring"]
    sim = cpsim.simulate(method="ulysses", seq="256K")
    assert isinstance(sim, cpsim.Simulation) and sim.fits and sim.step_time_s > 0
    assert sim.config.method == "ulysses"


def test_packed_batches_same_as_cli(tmp_path):
    args = ["simulate", "--method", "ring", "--lengths", "lognormal:median=8K,sigma=1"]
    args += ["--pack", "128K", "--batches", "8", "--seed", "2", "--json"]
    r = cpsim.simulate(
        method="ring", lengths="lognormal:median=8K,sigma=1", pack="128K", batches=8, seed=2
    )
    assert isinstance(r, cpsim.PackedBatches)
    assert r.to_json() == cli(args, tmp_path).stdout
    assert r.recommended in {b.balancer for b in r.balancers}
    assert len(r.balancers[0].step_time_s_per_batch) == 8
    assert r.balancers[0].step_time_s.p50 <= r.balancers[0].step_time_s.max


def test_same_bytes_twice():
    assert cpsim.plan(seq="256K").to_json() == cpsim.plan(seq="256K").to_json()


def test_plan_configurations_are_the_csv_rows(tmp_path):
    """`all=True`: one DataFrame row per configuration generated, in the CLI CSV's order, with its
    status."""
    p = cpsim.plan(seq="512K", all=True)
    rows = list(
        csv.DictReader(
            io.StringIO(cli(["plan", "--seq", "512K", "--format", "csv", "--all"], tmp_path).stdout)
        )
    )
    df = p.configurations
    assert len(df) == len(rows) == p.counts.generated
    assert list(df["label"]) == [r["label"] for r in rows]
    assert list(df["status"]) == [r["status"] for r in rows]
    assert (df["status"] == "fits").sum() > 0
    top = cpsim.plan(seq="512K", top=3).configurations
    assert list(top["label"]) == list(df[df["status"] == "fits"]["label"])[:0] + [
        c["label"] for c in cpsim.plan(seq="512K", top=3).to_dict()["top"]
    ]


def test_hugging_face_config_as_a_dict(tmp_path):
    """A dict is the same model as its config.json file (the name aside: the file's folder)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "intermediate_size": 2816,
        "num_hidden_layers": 4,
        "vocab_size": 32000,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(config))
    from_dict = cpsim.simulate(model=config, seq="64K").to_dict()
    from_file = cpsim.simulate(model=tmp_path / "tiny" / "config.json", seq="64K").to_dict()
    for d in (from_dict, from_file):
        d["config"].pop("model")
    assert from_dict == from_file
    bad = dict(config, num_local_experts=8)
    with pytest.raises(cpsim.InputError) as caught:
        cpsim.simulate(model=bad, seq="64K")
    assert "expert" in str(caught.value)


def test_emit_returns_the_files_or_writes_them(tmp_path, monkeypatch):
    p = cpsim.emit("accelerate", seq="128K", method="ulysses")
    files = p.files
    assert len(files) == 3 and all(text for text in files.values())
    monkeypatch.chdir(tmp_path)
    written = cpsim.emit("accelerate", out="cpsim_accelerate.yaml", seq="128K", method="ulysses")
    assert (tmp_path / "cpsim_accelerate.yaml").read_text() == files["<file>"]
    assert written.emitted.file == "cpsim_accelerate.yaml"
    for name, text in files.items():
        if name != "<file>":
            assert (tmp_path / name).read_text() == text


def test_catalogs(tmp_path):
    assert "llama3-8b" in [m.name for m in cpsim.models().models]
    gemma = cpsim.models("gemma-3-27b")  # one model in full, as the CLI shows it
    assert gemma.to_json() == cli(["models", "gemma-3-27b", "--json"], tmp_path).stdout
    layers = gemma.model.layer_types
    assert (gemma.model.sliding_window, layers.count("full_attention")) == (1024, 10)
    assert cpsim.hardware("h200-141g").name == "h200-141g"
    assert any(i.name == "yunchang-usp" for i in cpsim.implementations().implementations)
    assert cpsim.__version__


def test_hardware_side_by_side(tmp_path, monkeypatch):
    """Several profiles: the CLI's JSON, each answer that of the profile alone, and a table."""
    r = same_answer(
        [
            "maxlen",
            "--method",
            "ring,upipe",
            "--hardware",
            "h100-sxm-80g,h200-141g",
            "--gpu-hour-cost",
            "2.5",
        ],
        tmp_path,
        monkeypatch,
    )
    assert isinstance(r, cpsim.HardwareComparison)
    assert list(r.answers) == ["h100-sxm-80g", "h200-141g"]
    alone = cpsim.maxlen(method="ring,upipe", hardware="h200-141g", gpu_hour_cost=2.5)
    assert r.answers["h200-141g"].to_dict() == alone.to_dict()
    table = r.table
    assert list(table["hardware"]) == ["h100-sxm-80g"] * 2 + ["h200-141g"] * 2
    assert list(table["method"]) == ["ring", "upipe"] * 2
    assert (table["cost.per_billion_tokens"] > 0).all()
    p = cpsim.plan(seq="512K", hardware=["h100-sxm-80g", "h200-141g"])
    assert list(p.table["hardware"]) == ["h100-sxm-80g", "h200-141g"]


def test_step_time_cap_and_cost():
    free = cpsim.maxlen(method="ring")
    capped = cpsim.maxlen(method="ring", max_step_time="20min")
    assert capped.max_seq_len < free.max_seq_len and capped.step_time_s <= 1200
    assert capped.binding_constraint.kind == "step_time"
    priced = cpsim.simulate(method="ulysses", seq="512K", gpu_hour_cost=2, train_tokens="1B")
    assert priced.cost.per_step == pytest.approx(8 * priced.step_time_s / 3600 * 2)


def test_readme_python_examples_run(tmp_path, monkeypatch):
    """The README's Python block runs as written."""
    with open(os.path.join(ROOT, "README.md")) as f:
        code = re.search(r"## From Python\n.*?```python\n(.*?)```", f.read(), re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "plan_512k.csv").stat().st_size > 0
