"""Tuned hyperparameters per (algorithm, env id), shipped as YAML files in this package."""

from __future__ import annotations

from importlib import resources

import yaml

RUN_KEYS = ("total_timesteps", "eval_freq", "target_return")


def load_preset(algo: str, env_id: str) -> dict:
    """The preset for `env_id`, else the algorithm's `default` entry (no merging); {} when none ship."""
    path = resources.files(__package__) / f"{algo}.yaml"
    if not path.is_file():
        return {}
    presets = yaml.safe_load(path.read_text()) or {}
    if env_id not in presets and env_id.startswith("rlspeed/"):  # the Gymnasium view of a native env: same task
        env_id = env_id[len("rlspeed/"):]
    return dict(presets.get(env_id, presets.get("default", {})))


def split_run_settings(preset: dict) -> tuple[dict, dict]:
    """Separate run settings (total_timesteps, eval_freq, target_return) from algorithm hyperparameters."""
    run = {k: preset[k] for k in RUN_KEYS if k in preset}
    hyper = {k: v for k, v in preset.items() if k not in RUN_KEYS}
    return run, hyper
