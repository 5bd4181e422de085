"""The package under test: build/python (the build tree's copy, what CTest runs), unless
CPSIM_INSTALLED=1 says the interpreter has it installed (scripts/python_package_check.sh)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("CPSIM_INSTALLED") != "1":
    sys.path.insert(0, os.environ.get("CPSIM_PYTHONPATH", os.path.join(ROOT, "build", "python")))
