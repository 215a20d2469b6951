"""Ready algorithms with an SB3-like API. `ALGORITHMS` maps CLI names to classes."""

from rlspeed.algos.base import Algorithm
from rlspeed.algos.ppo import PPO, PPOConfig

ALGORITHMS: dict[str, type[Algorithm]] = {"ppo": PPO}

__all__ = ["Algorithm", "PPO", "PPOConfig", "ALGORITHMS"]
