"""Output helpers shared by the measurement scripts in this folder (imported from beside them)."""

import os
import tempfile


def write_atomically(path, text):
    """Write through a temporary file and a rename: never a half-written output."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cpsim-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
