"""Every command of the README's Examples block runs: it exits 0, or with the status its comment
states ("exits 3: ..."). Commands naming a placeholder file (path/to/...) are checked for their
refusal of the missing file instead (exit 2).

Environment: CPSIM_BIN (the cpsim executable; default build/cpsim).
"""

import os
import re
import shlex
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPSIM = os.path.abspath(os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim")))


def examples():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    block = re.search(r"## Examples\n\n```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no Examples block"
    out = []
    for line in block.group(1).splitlines():
        command, _, comment = line.partition("  #")
        if command.strip():
            status = re.search(r"exits (\d)", comment)
            out.append((command.strip(), int(status.group(1)) if status else 0))
    return out


@pytest.mark.parametrize("command,status", examples(), ids=[c for c, _ in examples()])
def test_readme_example(command, status, tmp_path):
    words = shlex.split(command)
    assert words[0] == "./build/cpsim", command
    if any("path/to/" in w for w in words):
        status = 2  # the placeholder file does not exist: refused naming it
    r = subprocess.run([CPSIM, *words[1:]], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == status, f"{command}: exit {r.returncode}\n{r.stderr}{r.stdout[-600:]}"
