"""How rlspeed's processes end: with the ones that started them, and when a stop is asked for.

torchrun starts each worker in a session of its own and, killed itself with SIGKILL (which no process can catch),
leaves them training as orphans. A worker therefore asks the kernel for SIGTERM when its parent ends
(`end_with_parent`), which stops it as a scheduler's SIGTERM does: at the end of its iteration, saved. The launcher
adopts the workers that torchrun's death orphans (`adopting_orphans`), so that it can wait for them to save before it
unlocks the run directory. Other systems have neither call: there a worker outlives a torchrun killed with SIGKILL
(docs/checkpoints.md). A worker that ends saying why leaves its exit code for the launcher (`tell_launcher`). A
Ctrl-C or SIGTERM that comes while a process forks its subprocess envs is not lost (`stops_kept_while_forking`); one
that comes while a block writes waits for it to end (`stops_held`). Every block that sets signal handlers sets them
with `handlers_set`. No torch import here: the CLI asks for all this before it imports torch, or after a stop cut
torch's import short."""

from __future__ import annotations

# Handlers are set, read and put back, and the mask changed, with `_signal`'s calls, not `signal`'s (Python functions
# around them that convert handlers and signals to enums): C calls, with no frame of a wrapper between them where a
# stop's handler could run, and one module that tests replace to send a stop before an exact call.
import _signal
import contextlib
import ctypes
import hashlib
import os
import signal
import sys
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

#: the environment variable in which `python -m rlspeed._torchrun` gives its workers its process id: a worker whose
#: parent is another process by the time it asks for `end_with_parent`'s signal was orphaned already
LAUNCHER_PID_VARIABLE = "RLSPEED_TORCHRUN_PID"
#: the environment variable naming the folder where each worker of `python -m rlspeed._torchrun` (`rlspeed train
#: --nproc`) that ends having said why in its own line leaves a file (`tell_launcher`), so that the launcher ends with
#: that worker's exit code instead of torchrun's failure report under the worker's line
SAID_FOLDER_VARIABLE = "RLSPEED_WORKERS_SAID"
#: the signals that stop a command or a notebook's cell: Ctrl-C's (SIGINT), a scheduler's (SIGTERM; SLURM's --signal
#: sends SIGUSR1 or SIGUSR2 ahead of its deadline) and a closed terminal's (SIGHUP)
STOPS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
              if hasattr(signal, name))
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


def wait_for_adopted(adopted: list[int], timeout_s: float,
                     meanwhile: Callable[[list[int]], object] | None = None) -> list[int]:
    """Reap the processes `adopted` as they end, for up to `timeout_s` seconds; returns those still running.
    `meanwhile(running)`, where given, is called with those still running each time the wait goes on (every 0.1 s:
    a stop that came meanwhile is said then, not once the wait has ended)."""
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
        if meanwhile is not None:
            meanwhile(running)
        time.sleep(0.1)
    return running


def _attempt() -> str:
    """Which of torchrun's attempts this process belongs to (0, then one more per restart)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def tell_launcher(code: int, follows: bool = False) -> None:
    """Where this worker of `python -m rlspeed._torchrun` ends with `code` (not 0) after saying why in its own line:
    leave that in the launcher's folder (`SAID_FOLDER_VARIABLE`), as `ATTEMPT RANK CODE` in a file named after this
    process's id, which torchrun's failure report gives; `follows`: it ended because another process did
    (`PeerEnded`), whose code is the run's. The first word of a process stands. The file appears whole (written
    under another name, then linked to its own, which fails where the process has said a word already): a peer that
    reads it once (`peers_said`) never finds it empty. Elsewhere nothing."""
    folder = os.environ.get(SAID_FOLDER_VARIABLE)
    if not (code and folder):
        return
    word = f"{_attempt()} {os.environ.get('RANK', '0')} {int(code)}" + (" follows" if follows else "")
    said, draft = Path(folder, str(os.getpid())), Path(folder, f".{os.getpid()}.draft")  # (no process id: not read)
    with contextlib.suppress(OSError):
        try:
            with draft.open("w") as file:
                file.write(word)
            os.link(draft, said)
        except FileExistsError:  # (said already)
            pass
        except OSError:  # (a file system without hard links: created, then written)
            with said.open("x") as file:
                file.write(word)
        finally:
            draft.unlink(missing_ok=True)


def workers_said(folder: str | os.PathLike) -> dict[int, tuple[str, int, int, bool]]:
    """What `tell_launcher` left in `folder`: process id -> (attempt, rank, exit code, whether it followed another's
    end)."""
    said = {}
    with contextlib.suppress(OSError):
        for path in Path(folder).iterdir():
            with contextlib.suppress(OSError, ValueError):
                attempt, rank, code, *follows = path.read_text().split()
                said[int(path.name)] = (attempt, int(rank), int(code), follows == ["follows"])
    return said


def peers_said() -> dict[int, int]:
    """The processes of this attempt that have ended saying why (`tell_launcher`), not because another did: rank ->
    exit code."""
    folder = os.environ.get(SAID_FOLDER_VARIABLE)
    if not folder:
        return {}
    return {rank: code for attempt, rank, code, follows in workers_said(folder).values()
            if attempt == _attempt() and not follows}


def _shared_folder() -> Path | None:
    """A folder that the workers of this attempt on this machine share: the launcher's (`SAID_FOLDER_VARIABLE`, for
    `rlspeed train --nproc`), else, under torchrun started by hand, the attempt's folder in torchrun's log directory
    (the folder above each worker's own, which torchrun names in TORCHELASTIC_ERROR_FILE:
    `.../attempt_N/LOCAL_RANK/error.json`); None where neither is known."""
    folder = os.environ.get(SAID_FOLDER_VARIABLE)
    if folder:
        return Path(folder)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and "TORCHELASTIC_RUN_ID" in os.environ:
        attempt = Path(error_file).parent.parent
        if attempt.name.startswith("attempt_"):
            return attempt
    return None


def first_to_say(line: str) -> bool:
    """Whether this worker of torchrun (`rlspeed train --nproc`, or torchrun started by hand) is the first of its
    attempt on this machine to say `line`: each claims the line in a folder they share (`_shared_folder`) before it
    prints it, so that a refusal every process finds alike (a bad input) is printed once, not once per process;
    lines that differ are all printed. True elsewhere, and where the folder cannot be written."""
    folder = _shared_folder()
    if folder is None:
        return True
    lines = folder / "lines"  # (beside the workers' files: `workers_said` reads none from a folder)
    name = f"{_attempt()}-{hashlib.sha256(line.encode('utf-8', 'replace')).hexdigest()[:32]}"
    try:
        lines.mkdir(exist_ok=True)
        Path(lines, name).open("x").close()
    except FileExistsError:
        return False
    except OSError:  # (a folder that cannot be written, or gone: the line is printed)
        pass
    return True


@contextlib.contextmanager
def stops_kept_while_forking(undo: Callable[[], object] | None = None) -> Iterator[None]:
    """Within the block (subprocess envs' workers forked), a Ctrl-C or SIGTERM that comes during a fork still stops the
    command: its handler ran in an at-fork hook (logging's `_releaseLock`), where Python reports what a handler raises
    as "Exception ignored in ..." and goes on, so the KeyboardInterrupt (or the CLI's `Terminated`) was lost and
    training went on. Such a stop is kept (`sys.unraisablehook`) and raised as the block ends, after `undo()` (which
    closes what the block made); one raised elsewhere in the block (a worker that never answers) stops it as always.
    Outside the main thread nothing changes."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept: list[BaseException] = []
    previous = sys.unraisablehook

    def keep_stops(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and not kept:
            kept.append(unraisable.exc_value)
        elif not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous(unraisable)

    sys.unraisablehook = keep_stops
    try:
        yield
    finally:
        sys.unraisablehook = previous
    if kept:
        if undo is not None:
            undo()
        raise kept[0].with_traceback(None)


@contextlib.contextmanager
def _signals_waiting(signums) -> Iterator[None]:
    """Within the block `signums` wait for this thread (`signal.pthread_sigmask`; where the system has none, as on
    Windows, nothing changes): one that comes meanwhile is handled as the block ends, by the handler then set."""
    if not signums or not hasattr(_signal, "pthread_sigmask"):
        yield
        return
    # (the mask is read before any signal is blocked and blocked inside the try: a stop whose handler raises as the
    # blocking call returns, handled by another thread meanwhile, must not leave the signals blocked for good)
    before = _signal.pthread_sigmask(_signal.SIG_BLOCK, ())
    try:
        _signal.pthread_sigmask(_signal.SIG_BLOCK, signums)
        yield
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, before)


#: how many times `_put_back` tries to set the handlers back: a stop's handler raises at most once per stop, while
#: an error of the calls themselves (not a stop's) would come at every try
_PUT_BACK_TRIES = 100


def _put_back(previous: dict[int, typing.Any]) -> None:
    """Set each handler of `previous` (signal -> handler) again, the signals waiting meanwhile (`_signals_waiting`).
    A handler that raises as its stop comes meanwhile (the process's other threads still take stops that this one
    holds back; Python runs the handler in this one, wherever it is then) does not keep the others from going back:
    all is tried again (those back already are skipped), up to `_PUT_BACK_TRIES` times, and the first error is
    raised once they are all back."""
    raised: BaseException | None = None
    for _ in range(_PUT_BACK_TRIES):
        try:
            with _signals_waiting(tuple(previous)):
                for signum, handler in previous.items():
                    if _signal.getsignal(signum) != handler:
                        _signal.signal(signum, handler)
            break
        except BaseException as error:  # noqa: BLE001 (a stop's handler: raised below, once all are back)
            raised = raised or error
    if raised is not None:
        # An error raised from a variable of this frame must not stay in it: its traceback holds the frame, which
        # holds it, and the cycle would keep the caller's block (a generator, holding what it set) until the cyclic
        # garbage collector runs.
        try:
            raise raised
        finally:
            raised = None


@contextlib.contextmanager
def handlers_set(handler, signums: tuple[int, ...] = STOPS,
                 replaced: dict[int, typing.Any] | None = None) -> Iterator[None]:
    """`handler` for `signums` within the block, the handlers from before it back as it ends, whether or not it
    raised: how rlspeed sets signal handlers, in blocks that nest. A signal the process was started ignoring (SIGHUP
    under nohup, SIGINT in a shell's background job) stays ignored; one whose handler Python did not set (None: set
    outside Python) is left as it is, since it could not be put back. Outside the main thread, where signals cannot
    be set, nothing changes. The signals wait while the handlers are set and while they are put
    back (`_signals_waiting`, where the system has `signal.pthread_sigmask`): one that comes meanwhile meets either
    the block's handlers or those from before it, all set. Where it is handled meanwhile all the same (Windows, or the
    process's other threads taking it) and its handler raises, the handlers set so far are put back, all of them.
    `replaced`, where given, is filled as they are set with the handlers from before the block (signal -> handler, as
    `_signal` gives it) that `handler` replaced. A block left without its `with` statement's end (a stop whose
    handler raised in contextlib's frames as the block was entered or left, a few bytecodes that no mask covers, or
    where another thread took the signal: the block's generator is closed when that stop is dropped, maybe after the
    blocks around it have ended) puts back only the handlers that are still its own: the others are a later block's,
    or those that the blocks around it put back. Until then its handlers stay set (what a second stop meets)."""
    handler = int(handler) if isinstance(handler, signal.Handlers) else handler  # (`_signal` takes no enum)
    previous: dict[int, typing.Any] = {} if replaced is None else replaced
    try:  # (set inside the try: a stop whose handler raises between two of them puts back those set so far)
        with _signals_waiting(signums):
            for signum in signums:
                current = _signal.getsignal(signum)
                if current is None or current == signal.SIG_IGN:
                    continue
                # (kept before it is replaced: a stop whose handler raises as the call returns, before its result
                # could be kept, would leave `handler` set for good)
                previous[signum] = current
                try:
                    _signal.signal(signum, handler)
                except ValueError:  # (not the main thread, where none can be set: none is)
                    del previous[signum]
                    break
        yield
    except GeneratorExit:  # (closed, not ended by its `with` statement)
        previous = {signum: before for signum, before in previous.items() if _signal.getsignal(signum) == handler}
        raise
    finally:
        _put_back(previous)


def resend_first_stop(came: list[int]) -> None:
    """Raise the first stop of `came` (a list `stops_held` filled) again, to the handler now set, as it would have
    come outside the block: Python's KeyboardInterrupt for Ctrl-C, the `rlspeed` command's `Terminated`, the signal's
    default action (the process ends) where nothing handles it. Nothing where the list is empty."""
    if came:
        signal.raise_signal(came[0])


def _pass_on(handler, signum: int, frame) -> None:
    """What `handler` (as `_signal` gives it: a function, or SIG_DFL) does with the stop `signum`: the function's call,
    or the signal's default action (the process ends)."""
    if callable(handler):
        handler(signum, frame)
    else:
        _signal.signal(signum, handler)
        signal.raise_signal(signum)


@contextlib.contextmanager
def stops_held(arrived: Callable[[int], object] | None = None,
               waiting: Callable[[], bool] | None = None) -> Iterator[list[int]]:
    """Within the block a stop (`STOPS`) waits: each that comes is added to the list yielded, after `arrived(signum)`
    where given, and the handlers from before the block are back as it ends, whether or not it raised
    (`handlers_set`); the caller acts on the list then (`resend_first_stop`). With `waiting`, a stop waits only while
    `waiting()` holds (a frame's write, in a recording whose block this is); one that comes otherwise goes at once to
    the handler from before the block, as without it. A stop the process ignores stays ignored, and one whose handler
    Python did not set (None) is left as it is. Outside the main thread, where signals cannot be set, nothing changes
    and the list stays empty."""
    came: list[int] = []
    replaced: dict[int, typing.Any] = {}

    def hold(signum, frame) -> None:
        if arrived is not None:
            arrived(signum)
        if waiting is None or waiting():
            came.append(signum)
        else:
            _pass_on(replaced[signum], signum, frame)

    with handlers_set(hold, STOPS, replaced=replaced):
        yield came
