"""`python -m rlspeed._torchrun ARGS`: torchrun (`python -m torch.distributed.run ARGS`) as `rlspeed train --nproc`
starts it, ending quietly where its workers stopped saying why: a signal that stops torchrun itself (the launcher's
forwarded Ctrl-C or SIGTERM) ends it with 128 + the signal's number, and workers whose first failure ended saying why
in its own line (a bad input, 2; an env's error, 1; a saved interrupted run, 130 or 143), the others ending with a line
of their own or by torchrun's signal, end it with that worker's code, instead of torchrun's traceback and failure
report under the workers' lines. A worker that ends any other way (an uncaught exception, a crash) keeps torchrun's
report."""
import logging
import os
import shutil
import signal
import sys
import tempfile

from torch.distributed.run import main

from rlspeed.files import forget_ended_processes_folders, process_folder_prefix
from rlspeed.lifetime import LAUNCHER_PID_VARIABLE, SAID_FOLDER_VARIABLE, workers_said

#: the exit codes of an rlspeed command that said why it ended, in one line: a bad input (2), a run stopped by Ctrl-C
#: (130) or SIGTERM (143) after saving (read where a worker left no file in the launcher's folder: one that ended
#: before its command could write it, or workers started by another launcher)
SAID_CODES = (2, 130, 143)
#: how torchrun ends the other workers once one has ended (their exit codes: minus the signal's number; Windows has
#: no SIGKILL)
_ENDED_BY_TORCHRUN = tuple(-int(getattr(signal, name)) for name in ("SIGTERM", "SIGINT", "SIGKILL")
                           if hasattr(signal, name))


def _quiet_code(error: Exception, said: dict[int, tuple[str, int, int, bool]] | None = None) -> int | None:
    """The exit code for `error` where it is torchrun's report of a stop, or of workers whose first failure said why it
    ended (`said`, process id -> (attempt, rank, code, follows), from `workers_said`; or one of `SAID_CODES`: a bad
    input found by the workers is exit code 2, as without --nproc), the others saying why too or ending by torchrun's
    signal; else None: torchrun's report stays (its classes' modules are internal: read by name). A worker that ended
    because another did (`follows`: its group broken) gives way to one that said why it ended itself."""
    said = said or {}
    if type(error).__name__ == "SignalException" and getattr(error, "sigval", None) is not None:
        return 128 + int(error.sigval)
    if type(error).__name__ == "ChildFailedError" and hasattr(error, "get_first_failure"):

        def told(failure) -> int | None:
            if getattr(failure, "pid", None) in said:
                return said[failure.pid][2]
            code = getattr(failure, "exitcode", None)
            return code if code in SAID_CODES else None

        def follows(failure) -> bool:
            return said.get(getattr(failure, "pid", None), ())[3:] == (True,)

        failures = getattr(error, "failures", {}).values()
        first = error.get_first_failure()[1]
        causes = [failure for failure in failures if told(failure) is not None and not follows(failure)]
        first = told(causes[0] if causes and follows(first) else first)
        if first is not None and all(told(failure) is not None or getattr(failure, "exitcode", None)
                                     in _ENDED_BY_TORCHRUN for failure in failures):
            return first
    return None


def _quiet_torchrun_logs() -> None:
    """torchrun's own log lines about ending workers ("Sending process ... closing signal", "failed (exitcode: ...)")
    repeat what the workers said, or its failure report says: off (its loggers set their levels one by one), unless
    LOGLEVEL asks torchrun for its log (`LOGLEVEL=INFO`: its rendezvous and restarts, to debug them)."""
    if os.environ.get("LOGLEVEL"):
        return
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


#: the name of a launcher's folder starts with this, then its process id and machine (`process_folder_prefix`)
FOLDER_PREFIX = "rlspeed-workers-"


def launcher_folder() -> str:
    """A new folder in the temp directory for this launcher's workers (what they said, torchrun's logs), removed
    as the launcher ends; the folders of launchers killed before they could remove theirs (SIGKILL) go first."""
    forget_ended_processes_folders(FOLDER_PREFIX)
    return tempfile.mkdtemp(prefix=process_folder_prefix(FOLDER_PREFIX))


if __name__ == "__main__":
    folder = launcher_folder()
    os.environ[SAID_FOLDER_VARIABLE] = folder  # (the workers inherit it)
    os.environ[LAUNCHER_PID_VARIABLE] = str(os.getpid())  # (each worker's parent: `end_with_parent`)
    # torchrun's log directory goes into this folder, removed with it: without one torchrun made a torchelastic_*
    # directory in the temp directory at each launch and left it there (a --log-dir or PET_LOG_DIR given stands)
    if not os.environ.get("PET_LOG_DIR") and not any(arg.startswith(("--log-dir", "--log_dir"))
                                                     for arg in sys.argv[1:]):
        sys.argv[1:1] = ["--log-dir", os.path.join(folder, "torchelastic")]
    _quiet_torchrun_logs()
    try:
        main()
    except Exception as stop:
        code = _quiet_code(stop, workers_said(folder))
        if code is None:
            raise
        sys.stderr.flush()
        sys.exit(code)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
