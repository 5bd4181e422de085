"""The exceptions of the Python API: the command line's failure kinds, with the flag at fault."""

from __future__ import annotations


class CpsimError(Exception):
    """A failed call. ``kind`` is the command line's (``input``, ``does_not_fit``, ``io``,
    ``internal``), ``field`` the flag or field it names (``--gpus``, ``CPSIM_DATA_DIR``, a key of a
    config.json) or None, ``argument`` that flag as the keyword argument (``gpus``) when it is one,
    ``exit_status`` what ``cpsim`` exits with for the same input."""

    kind = "internal"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        path: str | None = None,
        exit_status: int = 1,
        error_number: int = 0,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.path = path
        self.exit_status = exit_status
        self.error_number = error_number

    @property
    def argument(self) -> str | None:
        """The keyword argument of the flag at fault (``--allow-data-parallel`` ->
        ``allow_data_parallel``), None when the field is not a flag."""
        if self.field and self.field.startswith("--"):
            return self.field[2:].replace("-", "_")
        return None


class InputError(CpsimError, ValueError):
    """Bad input (the command line's exit status 2): ``field`` names the flag or field."""

    kind = "input"


class DoesNotFit(CpsimError):
    """No configuration fits (``plan``; exit status 3): ``field`` names the flag whose value nothing
    fits, the message the closest configuration."""

    kind = "does_not_fit"


class OutputError(CpsimError, OSError):
    """An output could not be written (exit status 1): ``path`` names it."""

    kind = "io"


class InternalError(CpsimError, RuntimeError):
    """An internal failure (exit status 1)."""

    kind = "internal"


_BY_KIND = {cls.kind: cls for cls in (InputError, DoesNotFit, OutputError, InternalError)}


def error_from_failure(failure: dict) -> CpsimError:
    """The exception for a failure dict of ``_cpsim.run``."""
    cls = _BY_KIND.get(failure["kind"], InternalError)
    return cls(
        failure["message"],
        field=failure["field"],
        path=failure["path"],
        exit_status=failure["exit_status"],
        error_number=failure["error_number"],
    )
