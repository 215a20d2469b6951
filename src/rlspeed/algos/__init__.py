"""Ready algorithms with an SB3-like API. `ALGORITHMS` maps CLI names to classes."""

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

__all__ = ["Algorithm", "PPO", "PPOConfig", "A2C", "A2CConfig", "DQN", "DQNConfig", "SAC", "SACConfig", "TD3",
           "TD3Config", "DDPG", "DDPGConfig", "RecurrentPPO", "RecurrentPPOConfig", "ALGORITHMS"]
