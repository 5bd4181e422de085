"""cpsim's allocation tracer: runs a CP implementation's own code on the CPU as one rank and
records every allocation it makes (docs/TRACING.md)."""
