"""Gradient clipping shared by `accelerate_step` and the algorithms' updates (re-exported by `rlspeed.nn`).

It lives here, beside the acceleration layer, so that a script importing only `accelerate_step` does not import the
policy networks and their environments (`rlspeed.nn` imports `rlspeed.envs`, a large part of a fresh process's
start).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def clip_grad_norm(params: Iterable[torch.Tensor] | torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most `max_norm`; returns the norm before clipping.

    The same maths as `torch.nn.utils.clip_grad_norm_` in a handful of foreach kernels and no host sync
    (the library version spends dozens of small ops grouping tensors by device and dtype). Parameters without a
    gradient count as zero, as there: none with one (a frozen network, a call before any backward) returns 0.
    `params` is any iterable of tensors (a list, `module.parameters()`) or one tensor, as there. The zero for no
    gradients lies on the first parameter's device (torch's lies on the CPU; `.item()` reads the same).
    """
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total
