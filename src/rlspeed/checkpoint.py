"""Safe, atomic checkpoints: tensors as safetensors, everything else as JSON in the file's metadata.

Loading never unpickles. Tensors are saved from CPU copies and load onto any device. Each checkpoint carries a digest
of its tensors and metadata (SHA-256 by default, SM3 on request), checked on load; a checkpoint holding NaN or
infinite values is refused unless asked for. A write interrupted by a kill leaves only a temporary file, which the
next save or load of that path removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rlspeed.errors import UserError

FORMAT = "rlspeed-checkpoint"
#: 2: the metadata carries a digest. Format-1 files (no digest) still load, with a warning.
FORMAT_VERSION = 2

SUFFIX = ".safetensors"

#: Digest algorithms a checkpoint can carry. SM3 (GB/T 32905) comes from OpenSSL through hashlib where it has it,
#: else from the `gmssl` package (`pip install "rlspeed[sm3]"`).
DIGESTS = ("sha256", "sm3")


def checkpoint_path(path: str | os.PathLike) -> Path:
    """The file a checkpoint path names: `path` itself if it ends in `.safetensors`, else `path` + `.safetensors`
    (appended, never replacing a suffix: `ppo_lr0.001` is `ppo_lr0.001.safetensors`)."""
    path = Path(path)
    return path if path.suffix == SUFFIX else path.with_name(path.name + SUFFIX)


class _GmsslSM3:
    """SM3 from the pure-Python `gmssl` package, behind hashlib's update/hexdigest interface."""

    def __init__(self):
        from gmssl import sm3

        self._sm3 = sm3
        self._data = bytearray()

    def update(self, data) -> None:
        self._data += memoryview(data).cast("B")

    def hexdigest(self) -> str:
        return self._sm3.sm3_hash(list(self._data))


def _hasher(algorithm: str):
    """A new hashlib-style hasher for `algorithm` (one of DIGESTS); UserError when SM3 is not available."""
    if algorithm not in DIGESTS:
        raise UserError(f"Unknown checkpoint digest '{algorithm}': use one of {', '.join(DIGESTS)}.")
    try:
        return hashlib.new(algorithm)
    except ValueError:  # OpenSSL without SM3
        pass
    try:
        return _GmsslSM3()
    except ImportError:
        raise UserError("SM3 digests need OpenSSL with SM3 or the gmssl package: pip install \"rlspeed[sm3]\".") \
            from None


def _metadata_bytes(metadata: dict) -> bytes:
    """The metadata as the digest sees it: canonical JSON without the digest itself."""
    body = {key: value for key, value in metadata.items() if key != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def tensor_digest(tensors: dict[str, torch.Tensor], metadata: dict, algorithm: str = "sha256") -> str:
    """The hex digest of `tensors` (name, dtype, shape and bytes of each, in name order) and of `metadata` (less its
    `digest` entry), as stored in a checkpoint's metadata and checked by `load_checkpoint`."""
    hasher = _hasher(algorithm)
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        hasher.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        if tensor.numel():
            hasher.update(tensor.reshape(-1).view(torch.uint8).numpy())
    hasher.update(_metadata_bytes(metadata))
    return hasher.hexdigest()


def _temporary_files(path: Path) -> list[Path]:
    """Temporary files of interrupted writes of `path` whose writing process is gone (a running writer's file is
    kept: its name holds the writer's process id)."""
    stale = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        parts = tmp.name[len(path.name) + 2:].split(".")
        pid = int(parts[0]) if parts and parts[0].isdigit() else None
        if pid is not None and pid != os.getpid():
            try:
                os.kill(pid, 0)
                continue  # that process still runs: it may be writing this file now
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        elif pid == os.getpid():
            continue
        stale.append(tmp)
    return stale


def remove_stale_temporary_files(path: str | os.PathLike) -> list[Path]:
    """Delete what interrupted writes of the checkpoint `path` left behind; returns the files removed."""
    removed = []
    for tmp in _temporary_files(checkpoint_path(path)):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def save_checkpoint(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict,
                    digest: str = "sha256") -> Path:
    """Write `tensors` and JSON-serialisable `metadata` to `checkpoint_path(path)` atomically (temp file, fsync,
    rename); returns that path.

    The metadata gets a `digest` entry ({"algorithm", "value"}: `digest` is "sha256" or "sm3") that `load_checkpoint`
    checks. A write that fails (a full disk, a file-size limit, no permission) is a UserError and leaves an existing
    checkpoint at `path` as it was.
    """
    path = checkpoint_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"Cannot write the checkpoint '{path}': {error.strerror or error}.") from None
    remove_stale_temporary_files(path)
    cpu = {}
    seen: set[int] = set()
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        # safetensors refuses tensors that share memory: views of one flat buffer, one tensor under two names.
        if tensor.untyped_storage().data_ptr() in seen or tensor.untyped_storage().nbytes() != tensor.nbytes:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        cpu[name] = tensor
    header = json.loads(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, **metadata}))  # as load reads it
    header["digest"] = {"algorithm": digest, "value": tensor_digest(cpu, header, digest)}
    payload = st_save(cpu, metadata={"rlspeed": json.dumps(header)})
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as error:
        raise UserError(f"Cannot write the checkpoint '{path}' ({error.strerror or error}); an earlier checkpoint "
                        "there is unchanged.") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(path: str | os.PathLike, device: torch.device | str = "cpu", verify: bool = True,
                    allow_nonfinite: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint written by `save_checkpoint` (`path` as given, or `checkpoint_path(path)` when `path` does
    not exist); returns (tensors on `device`, metadata).

    UserError naming the file when it is not a readable rlspeed checkpoint, when its digest does not match its
    contents (`verify=False` skips that check), when a model's metadata lacks what loading needs, or when a tensor
    holds NaN or infinite values (`allow_nonfinite=True` accepts them).
    """
    path = Path(path)
    if not path.exists():
        path = checkpoint_path(path)
    if not path.exists():
        raise UserError(f"Checkpoint '{path}' does not exist.")
    remove_stale_temporary_files(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"Cannot read the checkpoint '{path}': {error.strerror or error}.") from None
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        metadata = json.loads(header.get("__metadata__", {}).get("rlspeed", "{}"))
    except (SafetensorError, ValueError, AttributeError, json.JSONDecodeError) as error:
        raise UserError(f"'{path}' is not a readable rlspeed checkpoint ({error}).") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise UserError(f"'{path}' is a safetensors file but not an rlspeed checkpoint.")
    version = metadata.get("version", 0)
    if not isinstance(version, int):
        raise UserError(f"'{path}' has an unreadable format version {version!r}: the file is damaged.")
    if version > FORMAT_VERSION:
        raise UserError(f"'{path}' was written by a newer rlspeed (format {metadata['version']}); upgrade rlspeed.")
    if verify:
        _verify_digest(path, tensors, metadata)
    if "algo" in metadata:
        check_model_metadata(path, metadata)
    if not allow_nonfinite:
        _check_finite(path, tensors)
    return {name: t.to(device) for name, t in tensors.items()}, metadata


def _verify_digest(path: Path, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    digest = metadata.get("digest")
    if digest is None and metadata.get("version") == 1:
        warnings.warn(f"'{path}' was written before checkpoints carried a digest: its integrity is not checked "
                      "(save it again to add one).", stacklevel=3)
        return
    if digest is None:
        raise UserError(f"'{path}' carries no digest, so its integrity cannot be checked; load it with verify=False "
                        "if you trust it.")
    if not (isinstance(digest, dict) and digest.get("algorithm") in DIGESTS and isinstance(digest.get("value"), str)):
        raise UserError(f"'{path}' has an unreadable digest entry {digest!r}: the file is damaged.")
    if tensor_digest(tensors, metadata, digest["algorithm"]) != digest["value"]:
        raise UserError(f"'{path}' does not match its {digest['algorithm'].upper()} digest: the file was changed or "
                        "damaged after it was written; load it with verify=False only if you trust its contents.")


def _check_finite(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    bad = [name for name, tensor in tensors.items()
           if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all())]
    if bad:
        shown = ", ".join(sorted(bad)[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise UserError(f"'{path}' holds NaN or infinite values (in {shown}): the run it comes from diverged; "
                        "load it with allow_nonfinite=True to inspect it anyway.")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shape_ok(value) -> bool:
    return isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)


def _bounds_ok(value) -> bool:
    """A Box bound as JSON: a number or (nested) lists of numbers (JSON has no infinity: inf is written as a float
    by Python's json, which reads it back as one)."""
    if isinstance(value, list):
        return all(_bounds_ok(v) for v in value)
    return _is_number(value) and not (isinstance(value, float) and math.isnan(value))


def _action_space_problem(space) -> str | None:
    if not isinstance(space, dict):
        return "action_space is not an object"
    if space.get("type") == "discrete":
        return None if _is_int(space.get("n")) and space["n"] >= 1 else "a discrete action_space needs n >= 1"
    if space.get("type") == "box":
        for key in ("shape", "low", "high"):
            if key not in space:
                return f"the box action_space has no '{key}'"
        if not _shape_ok(space["shape"]):
            return "the box action_space's shape is not a list of sizes"
        if not (_bounds_ok(space["low"]) and _bounds_ok(space["high"])):
            return "the box action_space's low/high are not numbers"
        if "dtype" in space and not isinstance(space["dtype"], str):
            return "the box action_space's dtype is not a name"
        return None
    return f"action_space has unknown type {space.get('type')!r}"


def check_model_metadata(path: str | os.PathLike, metadata: dict) -> None:
    """UserError naming `path` unless a model checkpoint's metadata has what `Algorithm.load` reads, of the right
    kinds (algo, env_id, config, observation_shape, action_space, optimizers, num_timesteps, ...)."""
    problem = None
    required = {"algo": str, "env_id": str, "config": dict, "observation_shape": list, "action_space": dict}
    for key, kind in required.items():
        if key not in metadata:
            problem = f"it has no '{key}'"
            break
        if not isinstance(metadata[key], kind):
            problem = f"'{key}' is not a {kind.__name__}"
            break
    if problem is None:
        optional = {"num_timesteps": _is_int, "seed": lambda v: v is None or _is_int(v),
                    "env_backend": lambda v: isinstance(v, str), "optimizers": lambda v: isinstance(v, dict),
                    "max_episode_steps": lambda v: v is None or _is_int(v),
                    "reward_threshold": lambda v: v is None or _is_number(v),
                    "schedule": lambda v: v is None or (isinstance(v, list) and len(v) == 2
                                                        and all(_is_number(x) for x in v))}
        for key, ok in optional.items():
            if key in metadata and not ok(metadata[key]):
                problem = f"'{key}' has an unreadable value {metadata[key]!r}"
                break
    if problem is None and not _shape_ok(metadata["observation_shape"]):
        problem = "'observation_shape' is not a list of sizes"
    if problem is None:
        problem = _action_space_problem(metadata["action_space"])
    if problem is None:
        for name, groups in metadata.get("optimizers", {}).items():
            if not (isinstance(groups, list) and all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                                     for g in groups)):
                problem = f"the state of optimizer '{name}' is unreadable"
                break
    if problem is not None:
        raise UserError(f"'{path}' is not a usable model checkpoint: {problem} (the file was edited or damaged).")
