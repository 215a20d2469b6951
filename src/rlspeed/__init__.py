"""rlspeed: fast reinforcement learning in PyTorch on any accelerator.

Public API: `auto_accelerate`, `accelerate_step`,
`PPO`, `A2C`, `RecurrentPPO`, `DQN`, `SAC`, `TD3`, `DDPG`, `make_env`, `evaluate`, `record_video`, `resolve_device`,
`UserError`; callbacks for `learn` (`BaseCallback`, `CallbackList`, `EvalCallback`, `CheckpointCallback`,
`StopTrainingOnRewardThreshold`, `StopTrainingOnNoModelImprovement`, `EveryNTimesteps`; all in `rlspeed.callbacks`).
"""

from rlspeed._version import __version__
from rlspeed.accel import accelerate_step, auto_accelerate
from rlspeed.algos import A2C, DDPG, DQN, PPO, SAC, TD3, RecurrentPPO
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

__all__ = ["auto_accelerate", "accelerate_step", "PPO", "A2C", "RecurrentPPO", "DQN", "SAC", "TD3", "DDPG", "make_env",
           "evaluate", "record_video", "resolve_device", "UserError", "__version__", "BaseCallback", "CallbackList",
           "EvalCallback", "CheckpointCallback", "StopTrainingOnRewardThreshold", "StopTrainingOnNoModelImprovement",
           "EveryNTimesteps"]
