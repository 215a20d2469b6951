"""`python -m rlspeed._torchrun ARGS`: torchrun (`python -m torch.distributed.run ARGS`) as `rlspeed train --nproc`
starts it, ending quietly where its workers stopped for a signal: a signal that stops torchrun itself (the launcher's
forwarded Ctrl-C or SIGTERM) ends it with 128 + the signal's number, and workers that ended saying why in their own
line (a bad input, 2; a saved interrupted run, 130 or 143) end it with that code, instead of torchrun's traceback and
failure report under the workers' line."""
import signal
import sys

from torch.distributed.run import main

#: the exit codes of an rlspeed command that said why it ended, in one line: a bad input (2), a run stopped by Ctrl-C
#: (130) or SIGTERM (143) after saving
SAID_CODES = (2, 130, 143)
#: how torchrun ends the other workers once one has ended (their exit codes: minus the signal's number)
_ENDED_BY_TORCHRUN = tuple(-int(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL))


def _quiet_code(error: Exception) -> int | None:
    """The exit code for `error` where it is torchrun's report of a stop, or of workers whose first failure said why it
    ended (`SAID_CODES`: a bad input found by the workers is exit code 2, as without --nproc), the others ending with
    it; else None: torchrun's report stays (its classes' modules are internal: read by name)."""
    if type(error).__name__ == "SignalException" and getattr(error, "sigval", None) is not None:
        return 128 + int(error.sigval)
    if type(error).__name__ == "ChildFailedError" and hasattr(error, "get_first_failure"):
        first = getattr(error.get_first_failure()[1], "exitcode", None)
        codes = {getattr(failure, "exitcode", None) for failure in getattr(error, "failures", {}).values()}
        if first in SAID_CODES and codes <= {*SAID_CODES, *_ENDED_BY_TORCHRUN}:
            return first
    return None


if __name__ == "__main__":
    try:
        main()
    except Exception as stop:
        code = _quiet_code(stop)
        if code is None:
            raise
        sys.stderr.flush()
        sys.exit(code)
