"""rlspeed: fast reinforcement learning in PyTorch on any accelerator.

Public API: `auto_accelerate`, `accelerate_step`, `load` (a saved model of any algorithm),
`PPO`, `A2C`, `RecurrentPPO`, `DQN`, `SAC`, `TD3`, `DDPG`, `make_env`, `evaluate`, `record_video`, `resolve_device`,
`UserError`; callbacks for `learn` (`BaseCallback`, `CallbackList`, `EvalCallback`, `CheckpointCallback`,
`StopTrainingOnRewardThreshold`, `StopTrainingOnNoModelImprovement`, `EveryNTimesteps`; all in `rlspeed.callbacks`).

The names load on first use (PEP 562), so that `import rlspeed.cli` (the `rlspeed` command: `--help`, a bad
argument) does not import torch first, and Ctrl-C during that import ends as the command's "interrupted".
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING

from rlspeed._version import __version__

if TYPE_CHECKING:  # (what the names are, for type checkers and the API docs; at run time `__getattr__` loads them)
    from rlspeed.accel import accelerate_step, auto_accelerate
    from rlspeed.algos import A2C, DDPG, DQN, PPO, SAC, TD3, RecurrentPPO, load
    from rlspeed.callbacks import (
        BaseCallback,
        CallbackList,
        CheckpointCallback,
        EvalCallback,
        EveryNTimesteps,
        StopTrainingOnNoModelImprovement,
        StopTrainingOnRewardThreshold,
    )
    from rlspeed.device import resolve_device
    from rlspeed.envs import make_env
    from rlspeed.errors import UserError
    from rlspeed.evaluation import evaluate
    from rlspeed.video import record_video

#: each public name and the module it comes from
_SOURCES = {
    "auto_accelerate": "rlspeed.accel", "accelerate_step": "rlspeed.accel",
    **dict.fromkeys(["PPO", "A2C", "RecurrentPPO", "DQN", "SAC", "TD3", "DDPG", "load"], "rlspeed.algos"),
    **dict.fromkeys(["BaseCallback", "CallbackList", "EvalCallback", "CheckpointCallback",
                     "StopTrainingOnRewardThreshold", "StopTrainingOnNoModelImprovement", "EveryNTimesteps"],
                    "rlspeed.callbacks"),
    "make_env": "rlspeed.envs", "evaluate": "rlspeed.evaluation", "record_video": "rlspeed.video",
    "resolve_device": "rlspeed.device", "UserError": "rlspeed.errors",
}

__all__ = ["auto_accelerate", "accelerate_step", "load", "PPO", "A2C", "RecurrentPPO", "DQN", "SAC", "TD3", "DDPG",
           "make_env", "evaluate", "record_video", "resolve_device", "UserError", "__version__", "BaseCallback",
           "CallbackList", "EvalCallback", "CheckpointCallback", "StopTrainingOnRewardThreshold",
           "StopTrainingOnNoModelImprovement", "EveryNTimesteps"]


def _lazy_getattr(name: str):
    """A public name, imported from its module on first use (then kept as a module attribute); a subpackage
    (`rlspeed.algos`, ...) is imported as `import rlspeed.algos` would."""
    source = _SOURCES.get(name)
    if source is None:
        if not name.startswith("_"):
            from rlspeed.errors import peer_algorithm_advice, sb3_name_advice

            advice = peer_algorithm_advice(name) if name[:1].isupper() else None
            text = sb3_name_advice(name) if advice is None else (
                advice if advice.startswith("rlspeed has no") else f"rlspeed has no {name}: {advice}")
            if text is not None:
                raise _advice_error(f"{text}.", __name__, sys._getframe(1))
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'rlspeed' has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    try:
        module = importlib.import_module(source)
    except AttributeError as error:  # (else `from rlspeed import PPO` reports only "cannot import name 'PPO'")
        raise ImportError(f"importing {source} (for rlspeed.{name}) failed: {error}", name=source) from error
    value = getattr(module, name)
    globals()[name] = value
    return value


if not TYPE_CHECKING:  # (for type checkers only the names imported above exist: a misspelt one is an error)
    __getattr__ = _lazy_getattr


def _advice_error(text: str, module: str, frame) -> Exception:
    """The error for a name `module` lacks, saying `text` (what to use instead), where `frame` asked for it: an
    ImportError under `from module import name`, which turns an AttributeError into a bare "cannot import name";
    an AttributeError otherwise, which hasattr and getattr with a default keep."""
    if _importing_from(frame):
        return ImportError(text, name=module)
    return AttributeError(text)


def _importing_from(frame) -> bool:
    """Whether `frame` is executing a `from ... import name` (its current instruction IMPORT_FROM)."""
    import dis

    try:
        return dis.opname[frame.f_code.co_code[frame.f_lasti]] == "IMPORT_FROM"
    except (IndexError, AttributeError):  # (an interpreter that lays out frames otherwise)
        return False


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
