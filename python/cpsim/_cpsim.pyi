"""cpsim's engine in process (the extension module)."""

__version__: str

def run(args: list[str]) -> tuple[int, bytes, dict | None]:
    """Runs ``cpsim ARGS...`` in this process: (exit status, standard output, failure or None); a
    failure has the keys exit_status, kind, field, path, message, error_number."""
