"""Exclusive file locks a process holds while it works on something another process must not touch at the same time
(a run directory, a tune study). No torch import here: the CLI takes them before it imports torch."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

from rlspeed.errors import Busy


def hold_lock(path: Path, held: dict, busy: str) -> None:
    """Take an exclusive lock (`flock`) on the file `path` and keep its handle in `held` (keyed by the resolved path:
    the lock lasts while the handle stays open, at most the process's life; `let_go` ends it); nothing when this
    process holds it already. `Busy` (a UserError) saying `busy` when another process holds it. Without fcntl
    (Windows), where the file cannot be opened (the caller's own checks say why), or on a filesystem without locks
    (Lustre mounted without flock, some NFS: a warning says so), nothing is locked."""
    key = str(Path(path).resolve())
    if key in held:
        return
    try:
        import fcntl
    except ImportError:
        return
    while True:
        try:  # (never through a symlink planted in the run directory, and never truncating: the file's content is
            # unused, only its lock counts; read-only, so that others of the group may lock it too)
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
            handle = os.fdopen(fd, "r")  # noqa: SIM115 (held open while the lock lasts)
        except OSError:
            if os.path.islink(path):
                warnings.warn(f"'{path}' is a symlink: it is not followed, and nothing stops another rlspeed process "
                              "from using the same directory at the same time (remove the link).", stacklevel=2)
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            handle.close()
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise Busy(busy) from None
            warnings.warn(f"cannot lock '{path}' ({error.strerror or error}: the filesystem has no file locks): "
                          "nothing stops another rlspeed process from using the same directory at the same time.",
                          stacklevel=2)
            return
        if _names(path, handle):
            held[key] = handle
            return
        # (the holder it waited on removed the file as it let go (`let_go`): the lock is the file's at `path` now)
        handle.close()


def _names(path: Path, handle) -> bool:
    """Whether `path` is still the file `handle` holds open (not removed, nor made anew, since it was opened)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    opened = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def let_go(key: str, held: dict, remove: bool = False) -> None:
    """Let go of the lock `hold_lock` keeps in `held` under `key`; `remove`: delete its file first, while it is still
    held. (Safe for every `hold_lock`: one that opened the file before it was deleted and locks it after finds it
    no longer at its path, and opens the path again.) A file that cannot be deleted (another user's directory)
    stays."""
    handle = held.pop(key)
    try:
        if remove and _names(Path(key), handle):
            os.unlink(key)
    except OSError:
        pass
    finally:
        handle.close()
