"""cpsim from Python: the simulator and memory/throughput planner for context-parallel training of
long-context Transformers, in this process, with the command line's answers.

    >>> import cpsim
    >>> r = cpsim.maxlen(model="llama3-8b", gpus=8, method="upipe")
    >>> r.max_seq_len, r.binding_constraint.text
    >>> cpsim.plan(seq="1M", all=True).configurations      # a pandas DataFrame

Keyword arguments are the flags of ``cpsim COMMAND --help`` (``allow_data_parallel=True`` is
``--allow-data-parallel``). Results carry the keys of the command's ``--json`` answer as attributes
(``.to_json()`` is that text, byte for byte); failures raise InputError, DoesNotFit, OutputError or
InternalError, each with the ``field`` (flag) the command line names.
"""

from ._api import (
    command_line,
    emit,
    hardware,
    implementations,
    maxlen,
    models,
    plan,
    run,
    simulate,
    sweep,
)
from ._cpsim import __version__
from ._errors import CpsimError, DoesNotFit, InputError, InternalError, OutputError
from ._results import (
    Catalog,
    HardwareComparison,
    MaxLen,
    MaxLenComparison,
    PackedBatches,
    Plan,
    Record,
    Result,
    Simulation,
    SimulationComparison,
    Sweep,
)

__all__ = [
    "Catalog",
    "CpsimError",
    "DoesNotFit",
    "HardwareComparison",
    "InputError",
    "InternalError",
    "MaxLen",
    "MaxLenComparison",
    "OutputError",
    "PackedBatches",
    "Plan",
    "Record",
    "Result",
    "Simulation",
    "SimulationComparison",
    "Sweep",
    "__version__",
    "command_line",
    "emit",
    "hardware",
    "implementations",
    "maxlen",
    "models",
    "plan",
    "run",
    "simulate",
    "sweep",
]
