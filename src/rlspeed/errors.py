"""Errors a user can cause (`UserError`: the CLI prints its message as one sentence and exits with code 2) and an
env's own failure (`EnvStepError`: one sentence, exit code 1). No torch import here: the CLI handles both before it
imports torch."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user asked for (bad env id, bad hyperparameter, missing device, bad checkpoint)."""

    def _render_traceback_(self) -> list[str]:
        """What IPython and Jupyter show instead of a traceback (their hook): the message, which says what to do,
        without the frames of rlspeed's internals; the error it was raised from, where there is one, below it."""
        lines = [f"{type(self).__name__}: {self}"]
        cause = self.__cause__
        if cause is not None:
            lines.append(f"(raised from {type(cause).__name__}: {cause})")
        return lines


class UnusedSettingWarning(UserWarning):
    """A hyperparameter that changes nothing on the env it is given for (say `cnn_features_dim` without images):
    said when a model is made, not again when one is loaded or a population's member models are rebuilt."""


class EnvStepError(RuntimeError):
    """An env raised inside `reset` or `step`: the message names the env and the call; the env's own exception is
    chained (`__cause__`) with its traceback."""

    def __init__(self, env_id: str, backend: str, call: str, error: BaseException):
        self.env_id, self.call, self.error = env_id, call, error
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        super().__init__(f"The env '{env_id}' ({backend} backend) raised {type(error).__name__} in {call}()"
                         + (f": {detail}" if detail else ""))
