"""`python -m rlspeed._torchrun ARGS`: torchrun (`python -m torch.distributed.run ARGS`) as `rlspeed train --nproc`
starts it, ending quietly where its workers stopped for a signal: a signal that stops torchrun itself (the launcher's
forwarded Ctrl-C or SIGTERM) ends it with 128 + the signal's number, and workers that all ended as interrupted runs do
(130 or 143: saved, with their own line saying so) end it with that code, instead of torchrun's traceback and failure
report under the workers' line."""
import sys

from torch.distributed.run import main

#: the exit codes of an rlspeed run stopped by Ctrl-C (130) or SIGTERM (143) after saving
INTERRUPTED_CODES = (130, 143)


def _quiet_code(error: Exception) -> int | None:
    """The exit code for `error` where it is torchrun's report of a stop (its classes' modules are internal: read by
    name), else None."""
    if type(error).__name__ == "SignalException" and getattr(error, "sigval", None) is not None:
        return 128 + int(error.sigval)
    if type(error).__name__ == "ChildFailedError":
        codes = {getattr(failure, "exitcode", None) for failure in getattr(error, "failures", {}).values()}
        if codes and codes <= set(INTERRUPTED_CODES):
            return max(codes)
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
