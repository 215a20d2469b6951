"""rlspeed: fast reinforcement learning in PyTorch on any accelerator.

Public API: `auto_accelerate`, `accelerate_step`,
`PPO`, `DQN`, `SAC`, `TD3`, `DDPG`, `make_env`, `evaluate`, `resolve_device`, `UserError`.
"""

__version__ = "0.1.0"

from rlspeed.accel import accelerate_step, auto_accelerate  # noqa: E402
from rlspeed.algos import DDPG, DQN, PPO, SAC, TD3  # noqa: E402
from rlspeed.device import resolve_device  # noqa: E402
from rlspeed.envs import make_env  # noqa: E402
from rlspeed.errors import UserError  # noqa: E402
from rlspeed.evaluation import evaluate  # noqa: E402

__all__ = ["auto_accelerate", "accelerate_step",
           "PPO", "DQN", "SAC", "TD3", "DDPG", "make_env", "evaluate", "resolve_device", "UserError", "__version__"]
