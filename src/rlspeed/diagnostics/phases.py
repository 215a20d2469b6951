"""Named phases of the training loop (env step, acting, buffer, update, ...) for profilers.

The algorithms wrap each phase in ``with phase("env"):``. While a torch profiler records (`rlspeed profile`, or a
user's own ``torch.profiler.profile``), a phase is a ``record_function`` range named ``rlspeed/<name>``, so traces
and `rlspeed.diagnostics.profiler` can say how much of a step each phase took. Otherwise it is a shared no-op
context: one check of the profiler's state per phase, well under a microsecond.
"""

from __future__ import annotations

import contextlib

import torch

PREFIX = "rlspeed/"
PHASES = {
    "act": "the policy's forward pass choosing actions (exploration noise included)",
    "env": "env.step (the env's own computation, autoreset, conversion to tensors)",
    "buffer": "writing transitions and episode statistics",
    "gae": "advantages and returns (on-policy algorithms)",
    "update": "gradient steps (and, off-policy, sampling the replay buffer)",
    "metrics": "reading logged metrics back (the one host sync per log interval)",
}
_NULL = contextlib.nullcontext()
_profiler_enabled = torch.autograd._profiler_enabled


def phase(name: str) -> contextlib.AbstractContextManager:
    """A ``rlspeed/<name>`` range while a torch profiler records, a no-op context otherwise."""
    if _profiler_enabled():
        return torch.profiler.record_function(PREFIX + name)
    return _NULL
