"""Diagnostics: `rlspeed doctor` (the device stack), `rlspeed profile` (where a training run's time goes) and the
loop's phase markers the profiler reads."""
