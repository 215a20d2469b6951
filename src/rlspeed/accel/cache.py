"""The on-disk cache of acceleration choices, so that a search runs once per (model, inputs, device, torch version).

One small JSON file per key under ``$RLSPEED_CACHE_DIR/accel`` (default ``$XDG_CACHE_HOME/rlspeed/accel``, else
``~/.cache/rlspeed/accel``), written atomically. ``RLSPEED_CACHE_DIR=off`` disables it. A cache that cannot be read
or written is ignored: it only saves time, it never changes a result.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

import rlspeed
from rlspeed.device import describe

SEARCH_VERSION = 1  # bump when the search or its tolerances change: old choices are then ignored


def cache_dir() -> Path | None:
    """Where choices are stored, or None when caching is off."""
    configured = os.environ.get("RLSPEED_CACHE_DIR")
    if configured is not None and configured.strip().lower() in ("off", "none", "0", ""):
        return None
    if configured:
        root = Path(configured).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME")
        root = (Path(base) if base else Path.home() / ".cache") / "rlspeed"
    return root / "accel"


def environment_key(device: torch.device) -> dict[str, Any]:
    """The parts of a key that describe the machine and software rather than the model."""
    key = {"device": describe(device), "device_type": device.type, "torch": torch.__version__,
           "rlspeed": rlspeed.__version__, "search": SEARCH_VERSION, "machine": platform.machine()}
    if device.type == "cpu":
        key["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        key["threads"] = torch.get_num_threads()
    return key


def make_key(parts: dict[str, Any]) -> str:
    """A short stable hash of the JSON form of `parts`."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(key: str) -> dict[str, Any] | None:
    """The stored record for a key, or None (missing, unreadable, or caching off)."""
    root = cache_dir()
    if root is None:
        return None
    try:
        return json.loads((root / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def store(key: str, record: dict[str, Any]) -> bool:
    """Write a record atomically (temporary file, fsync, rename); False when it could not be written."""
    root = cache_dir()
    if root is None:
        return False
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=root, prefix=f".{key}.", suffix=".tmp", delete=False) as handle:
            json.dump(record, handle, indent=1, default=str)
            handle.flush()
            os.fsync(handle.fileno())
            temporary = handle.name
        os.replace(temporary, root / f"{key}.json")
        return True
    except OSError:
        return False
