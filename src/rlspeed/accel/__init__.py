"""Acceleration as a layer: choose device, precision, compilation and graph capture by measuring, then apply it.

Two entry points:

* `auto_accelerate(model)` accelerates a module in place (same object, same parameters, same state_dict keys).
* `accelerate_step(loss_fn, optimizer)` returns an accelerated update step (forward, loss, backward, optimizer step);
  most of the speed-up of RL training is here.

Precisions: ``fp32``; ``bf16-matmul`` on CPUs with native bf16 (fp32 tensors, matmuls computed in bf16 by oneDNN
on AMX/AVX512-BF16 -- elementwise maths such as tanh-squashed log-probs keep fp32, which is what makes it pass where
bf16 autocast does not); ``tf32`` on CUDA (the same with TF32); ``bf16`` autocast; ``fp16`` autocast with a
GradScaler (steps only).

How a strategy is chosen (`search.py`): the candidates allowed by the request and the device (`strategy.py`) are
each run once from the same RNG seed and compared with fp32 eager (reduced precisions: relative output error
< 2e-2, gradient cosine > 0.99 and gradient norm error < 5e-2 for every parameter; compiled fp32: 1e-3 / 0.9999),
then timed in interleaved rounds. The fastest that passes wins if the median of its round-paired speed-ups over
eager fp32 is >= 1.11x (10% less time), its best round is also faster, and fresh confirmation rounds agree;
otherwise eager fp32 stays, so small models pay only the per-call dispatch. Compiled candidates (only
where compile is allowed: CUDA/NPU for "auto", anywhere for True) are compiled only in the precision that won
eagerly. A module's kind of call without a cached choice runs fp32 eager until its calls have taken long enough for
the search to cost at most 3% of that time (`module.SEARCH_COST_SHARE`), so the line does not slow a short script
down; a step (`accelerate_step`) waits by the same rule. Choices are cached per (model structure, input shapes,
device, torch version) under ``$RLSPEED_CACHE_DIR/accel`` (default ``$XDG_CACHE_HOME/rlspeed/accel``, else
``~/.cache/rlspeed/accel``). ``RLSPEED_ACCELERATE`` forces a strategy: ``off`` / ``fp32``, ``bf16-matmul``,
``tf32``, ``bf16``, ``fp16``, ``compile``, ``graphs`` or
combinations like ``bf16+compile``.
"""

from rlspeed.accel.module import AcceleratedModule, auto_accelerate, unaccelerate
from rlspeed.accel.report import AccelReport, Decision, Trial
from rlspeed.accel.step import AcceleratedStep, accelerate_step
from rlspeed.accel.strategy import ENV_VAR, Strategy

__all__ = ["auto_accelerate", "accelerate_step", "unaccelerate", "AcceleratedModule", "AcceleratedStep",
           "AccelReport", "Decision", "Trial", "Strategy", "ENV_VAR"]
