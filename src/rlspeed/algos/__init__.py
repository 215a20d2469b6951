"""Ready algorithms with an SB3-like API. `ALGORITHMS` maps CLI names to classes; `load` rebuilds whichever
algorithm's model a file holds."""

from __future__ import annotations

import os
import typing
from pathlib import Path

import torch

from rlspeed.algos.a2c import A2C, A2CConfig
from rlspeed.algos.base import Algorithm
from rlspeed.algos.ddpg import DDPG, DDPGConfig
from rlspeed.algos.dqn import DQN, DQNConfig
from rlspeed.algos.ppo import PPO, PPOConfig
from rlspeed.algos.recurrent_ppo import RecurrentPPO, RecurrentPPOConfig
from rlspeed.algos.sac import SAC, SACConfig
from rlspeed.algos.td3 import TD3, TD3Config

ALGORITHMS: dict[str, type[Algorithm]] = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "sac": SAC, "td3": TD3, "ddpg": DDPG,
                                        "recurrent_ppo": RecurrentPPO}



def load(path: str | os.PathLike[str] | Path, device: str | torch.device = "auto", env: typing.Any = None,
         **options: typing.Any) -> Algorithm:
    """The model saved at `path` (a file `save` or a run wrote, or a run directory: its model.safetensors), as an
    instance of the class that saved it, whichever algorithm that is: `Algorithm.load`, which `PPO.load` and the
    others are when the file holds their algorithm (a subclass of the user's when its module is imported, else the
    rlspeed algorithm it derives from, with a warning). `device` and `env` are `Algorithm.load`'s, and so are
    `options` (`verify`, `allow_nonfinite`, hyperparameter overrides). A user's algorithm of its own name is its class
    where its module is imported, else the rlspeed algorithm it derives from (the file records it), with a warning. A
    file that is not an rlspeed model (another library's, a population's checkpoint, a replay buffer) or of a class of
    no rlspeed algorithm's that is not imported is a UserError."""
    return Algorithm.load(path, device=device, env=env, **options)


__all__ = ["load", "Algorithm", "PPO", "PPOConfig", "A2C", "A2CConfig", "DQN", "DQNConfig", "SAC", "SACConfig", "TD3",
           "TD3Config", "DDPG", "DDPGConfig", "RecurrentPPO", "RecurrentPPOConfig", "ALGORITHMS"]
