"""The on-disk cache of acceleration choices, so that a search runs once per (model, inputs, device, torch version).

One small JSON file per key under ``$RLSPEED_CACHE_DIR/accel`` (default ``$XDG_CACHE_HOME/rlspeed/accel``, else
``~/.cache/rlspeed/accel``), written atomically. ``RLSPEED_CACHE_DIR=off`` disables it. A cache that cannot be read
or written is ignored: it only saves time, it never changes a result.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rlspeed._version import __version__
from rlspeed.accel.introspect import code_names, made_as
from rlspeed.device import describe

# bump when the search, its tolerances or the keys change: old choices are then ignored
# (2: keys hash the forward code of the module classes involved; 3: on CUDA, steps leave compiled candidates out
# of compile="auto" for whole-step graphs, so a cached compiled choice would skip those; 4: the hand-derived updates'
# search checks each parameter's gradient, and accelerated modules inside a step run as the step chose, so choices
# cached under the flat-gradient check, or with a module's reduced precision inside a step, may no longer pass)
SEARCH_VERSION = 4


def cache_dir() -> Path | None:
    """Where choices are stored, or None when caching is off: RLSPEED_CACHE_DIR=off, or no home directory to keep
    them under (`no_home`)."""
    configured = os.environ.get("RLSPEED_CACHE_DIR")
    if configured is not None and configured.strip().lower() in ("off", "none", "0", ""):
        return None
    if configured:
        root = Path(configured).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME")
        if no_home():
            return None
        root = (Path(base) if base else Path.home() / ".cache") / "rlspeed"
    return root / "accel"


def no_home() -> bool:
    """Whether caching is off for want of a home directory: neither RLSPEED_CACHE_DIR nor XDG_CACHE_HOME set, and
    Python cannot name this user's home (HOME unset, no passwd entry: a container's user of an arbitrary id), where
    Path.home() raised RuntimeError out of every search."""
    if os.environ.get("RLSPEED_CACHE_DIR") is not None or os.environ.get("XDG_CACHE_HOME"):
        return False
    try:
        Path.home()
    except RuntimeError:
        return True
    return False


def environment_key(device: torch.device) -> dict[str, Any]:
    """The parts of a key that describe the machine and software rather than the model."""
    key = {"device": describe(device), "device_type": device.type, "torch": torch.__version__,
           "rlspeed": __version__, "search": SEARCH_VERSION, "machine": platform.machine()}
    if device.type == "cpu":
        key["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        key["threads"] = torch.get_num_threads()
    return key


def make_key(parts: dict[str, Any]) -> str:
    """A short stable hash of the JSON form of `parts`."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def code_digest(code: Any) -> str:
    """A hash of a function's bytecode, names and constants (nested code objects included), stable across runs."""
    digest = hashlib.sha256()

    def feed_const(const: Any) -> None:
        if hasattr(const, "co_code"):
            feed(const)
        elif isinstance(const, (frozenset, tuple)):
            # a frozenset's repr order follows string hashing, which differs between processes (`x in {"a",
            # "b"}` compiles to one): sorted, so the same code gives the same key in every run
            items = sorted(const, key=repr) if isinstance(const, frozenset) else const
            digest.update(f"{type(const).__name__}(".encode())
            for item in items:
                feed_const(item)
                digest.update(b",")
            digest.update(b")")
        else:
            digest.update(repr(const).encode())

    def feed(obj: Any) -> None:
        digest.update(obj.co_code)
        digest.update(repr(obj.co_names).encode())
        for const in obj.co_consts:
            feed_const(const)

    feed(code)
    return digest.hexdigest()[:16]


def forward_digest(modules: Iterable[Any]) -> str:
    """A hash of the `forward` code of every module class among `modules` (an accelerated class counts as the user's
    class), with the class's own methods that `forward` names (``self.encode(x)``, also inside a lambda or a
    comprehension; one level). Part of the cache keys, so that a choice checked against one forward is not reused
    after the forward is edited. Deeper helpers (a method called by a helper, a module-level function) are not
    hashed: clear the cache after editing those."""
    digest = hashlib.sha256()
    seen: set[type] = set()
    for module in modules:
        cls = made_as(module)
        if cls in seen:
            continue
        seen.add(cls)
        digest.update(f"{cls.__module__}.{cls.__qualname__}:".encode())
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        if code is None:
            continue
        digest.update(code_digest(code).encode())
        for name in dict.fromkeys(code_names(code)):  # also names used in lambdas and comprehensions
            helper = inspect.getattr_static(cls, name, None)
            helper = getattr(helper, "__func__", helper)  # staticmethod / classmethod
            helper_code = getattr(helper, "__code__", None)
            if helper_code is not None and helper_code is not code:
                digest.update(f"{name}:{code_digest(helper_code)}".encode())
    return digest.hexdigest()[:16]


def load(key: str) -> dict[str, Any] | None:
    """The stored record for a key, or None (missing, unreadable, or caching off)."""
    root = cache_dir()
    if root is None:
        return None
    try:
        return json.loads((root / f"{key}.json").read_text(encoding="utf-8"))
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
