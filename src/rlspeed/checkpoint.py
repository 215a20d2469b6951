"""Safe, atomic checkpoints: tensors as safetensors, everything else as JSON in the file's metadata.

Loading never unpickles. Tensors are saved from CPU copies and load onto any device.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rlspeed.errors import UserError

FORMAT = "rlspeed-checkpoint"
FORMAT_VERSION = 1


SUFFIX = ".safetensors"


def checkpoint_path(path: str | os.PathLike) -> Path:
    """The file a checkpoint path names: `path` itself if it ends in `.safetensors`, else `path` + `.safetensors`
    (appended, never replacing a suffix: `ppo_lr0.001` is `ppo_lr0.001.safetensors`)."""
    path = Path(path)
    return path if path.suffix == SUFFIX else path.with_name(path.name + SUFFIX)


def save_checkpoint(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict) -> Path:
    """Write `tensors` and JSON-serialisable `metadata` to `checkpoint_path(path)` atomically (temp file, fsync,
    rename); returns that path."""
    path = checkpoint_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cpu = {}
    seen: set[int] = set()
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        # safetensors refuses tensors that share memory: views of one flat buffer, one tensor under two names.
        if tensor.untyped_storage().data_ptr() in seen or tensor.untyped_storage().nbytes() != tensor.nbytes:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        cpu[name] = tensor
    header = {"format": FORMAT, "version": FORMAT_VERSION, **metadata}
    payload = st_save(cpu, metadata={"rlspeed": json.dumps(header)})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(path: str | os.PathLike,
                    device: torch.device | str = "cpu") -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint written by `save_checkpoint` (`path` as given, or `checkpoint_path(path)` when `path` does
    not exist); returns (tensors on `device`, metadata)."""
    path = Path(path)
    if not path.exists():
        path = checkpoint_path(path)
    if not path.exists():
        raise UserError(f"Checkpoint '{path}' does not exist.")
    data = path.read_bytes()
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        metadata = json.loads(header.get("__metadata__", {}).get("rlspeed", "{}"))
    except (SafetensorError, ValueError, json.JSONDecodeError) as error:
        raise UserError(f"'{path}' is not a readable rlspeed checkpoint ({error}).") from None
    if metadata.get("format") != FORMAT:
        raise UserError(f"'{path}' is a safetensors file but not an rlspeed checkpoint.")
    if metadata.get("version", 0) > FORMAT_VERSION:
        raise UserError(f"'{path}' was written by a newer rlspeed (format {metadata['version']}); upgrade rlspeed.")
    return {name: t.to(device) for name, t in tensors.items()}, metadata
