"""Diagnostics: `rlspeed doctor` and the profiler."""
