"""A preset's run settings (`total_timesteps`, `eval_freq`, `target_return`): their keys and checks, for
`rlspeed.presets` and the RL-Zoo format's translation (`rlspeed.presets.zoo`) alike."""

from __future__ import annotations

import math

from rlspeed.errors import UserError

RUN_KEYS = ("total_timesteps", "eval_freq", "target_return")


def coerce_run_settings(run_settings: dict) -> dict:
    """total_timesteps and eval_freq as whole numbers of steps >= 1 (also 1e5, which YAML reads as a string),
    target_return as a float or None (none, off or null in a file); UserError naming the key otherwise."""
    from rlspeed.algos.base import coerce  # (torch, for the callers that train)

    out = dict(run_settings)
    for key in ("total_timesteps", "eval_freq"):
        if out.get(key) is not None:
            out[key] = coerce(key, out[key], int)
            if out[key] < 1:
                raise UserError(f"{key} must be a positive whole number of steps, got {out[key]}.")
    target = out.get("target_return")
    if isinstance(target, str) and target.strip().lower() in ("none", "off", "null"):
        out["target_return"] = None
    elif target is not None:
        try:
            value = float(target)
        except (TypeError, ValueError):
            value = math.nan
        if isinstance(target, bool) or not math.isfinite(value):
            raise UserError(f"target_return must be a number or 'none', got '{target}'.")
        out["target_return"] = value
    return out
