"""How the processes of `rlspeed train --nproc` end with the ones that started them (Linux).

torchrun starts each worker in a session of its own and, killed itself with SIGKILL (which no process can catch),
leaves them training as orphans. A worker therefore asks the kernel for SIGTERM when its parent ends
(`end_with_parent`), which stops it as a scheduler's SIGTERM does: at the end of its iteration, saved. The launcher
adopts the workers that torchrun's death orphans (`adopting_orphans`), so that it can wait for them to save before it
unlocks the run directory. Other systems have neither call: there a worker outlives a torchrun killed with SIGKILL
(docs/checkpoints.md). No torch import here: the CLI asks for it before it imports torch."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: the environment variable in which `python -m rlspeed._torchrun` gives its workers its process id: a worker whose
#: parent is another process by the time it asks for `end_with_parent`'s signal was orphaned already
LAUNCHER_PID_VARIABLE = "RLSPEED_TORCHRUN_PID"
_PR_SET_PDEATHSIG = 1  # (linux/prctl.h)
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """prctl(option, value) on Linux; False where it is not there or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # (a libc without prctl)
        return False


def end_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Have the kernel send this process `signum` when its parent ends (Linux; False elsewhere). Where the parent is
    known (`LAUNCHER_PID_VARIABLE`) and has ended already, before the request was made, the signal is sent now."""
    if not _prctl(_PR_SET_PDEATHSIG, int(signum)):
        return False
    expected = os.environ.get(LAUNCHER_PID_VARIABLE, "")
    if expected.isdigit() and os.getppid() != int(expected):
        os.kill(os.getpid(), signum)
    return True


def stop_ending_with_parent() -> None:
    """Undo `end_with_parent` once its signal (or another stop) has come: the kernel sends it again each time the
    thread of the parent's that this process was handed to ends (a torchrun killed with SIGKILL ends thread by thread,
    seen a second later on a busy machine), and a repeat after the stop would cut the save short."""
    if sys.platform.startswith("linux"):
        _prctl(_PR_SET_PDEATHSIG, 0)


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name: state, parent, process group, session, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children() -> set[int]:
    """This process's children (Linux: read from /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(_stat(int(stat.parent.name))[1]) == os.getpid():
                found.add(int(stat.parent.name))
    return found


def _runs_in_own_session(pid: int, words: tuple[str, ...]) -> bool:
    """Whether the process `pid` leads a session of its own and its command line holds `words` in a row."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        leads = int(_stat(pid)[3]) == pid
    except (OSError, ValueError, IndexError):
        return False
    return leads and any(tuple(arguments[index:index + len(words)]) == words for index in range(len(arguments)))


@contextlib.contextmanager
def adopting_orphans(words: tuple[str, ...]) -> Iterator[list[int]]:
    """Within the block this process adopts its descendants whose parent ends (Linux: a child subreaper; elsewhere
    the block changes nothing). The list yielded is filled as the block ends with the adopted processes that lead a
    session of their own and whose command line holds `words` (torchrun's workers: not what a worker started, an env's
    process, W&B's service, which ends as it will), for `wait_for_adopted`."""
    adopted: list[int] = []
    before = _children() if sys.platform.startswith("linux") else set()
    adopting = _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield adopted
    finally:
        if adopting:
            adopted.extend(sorted(pid for pid in _children() - before if _runs_in_own_session(pid, words)))
            _prctl(_PR_SET_CHILD_SUBREAPER, 0)


def wait_for_adopted(adopted: list[int], timeout_s: float) -> list[int]:
    """Reap the processes `adopted` as they end, for up to `timeout_s` seconds; returns those still running."""
    deadline = time.monotonic() + timeout_s
    running = list(adopted)
    while running:
        for pid in list(running):
            try:
                ended, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # (reaped by another, or not a child)
                ended = pid
            if ended == pid:
                running.remove(pid)
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return running
