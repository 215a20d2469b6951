"""Deep Deterministic Policy Gradient (Lillicrap et al., 2016): TD3 with one critic, no delay and no smoothing.

The update is TD3's (`td3.py`) with these settings, as in Stable-Baselines3: a single critic regressing onto
y = r + gamma^m (1 - d) Q_target(s', mu_target(s')), and the actor following the deterministic policy gradient
-E[Q(s, mu(s))] on every critic update. Exploration noise is Gaussian or Ornstein-Uhlenbeck (`action_noise`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlspeed.algos.base import require
from rlspeed.algos.td3 import TD3, TD3Config


@dataclass
class DDPGConfig(TD3Config):
    """DDPG hyperparameters: TD3's, with one critic, no policy delay and no target policy smoothing."""

    n_critics: int = 1
    policy_delay: int = 1
    target_policy_noise: float = 0.0

    def validate(self) -> None:
        """TD3's checks, and DDPG's own settings kept (another value of them is TD3: a DDPG run would record it as
        DDPG while training TD3's update)."""
        super().validate()
        for key, value in (("n_critics", 1), ("policy_delay", 1), ("target_policy_noise", 0.0)):
            require(getattr(self, key) == value, f"DDPG has {key}={value} (got {getattr(self, key)}): for twin "
                    "critics, delayed actor updates or target policy smoothing, train td3 (rlspeed.TD3).")


class DDPG(TD3):
    """DDPG for Box action spaces.

    >>> import gymnasium
    >>> from rlspeed import DDPG
    >>> model = DDPG("Pendulum-v1", seed=0).learn(20_000)
    >>> obs, _ = gymnasium.make("Pendulum-v1").reset(seed=0)
    >>> action, _ = model.predict(obs, deterministic=True)
    """

    name = "ddpg"
    config_cls = DDPGConfig
    config: DDPGConfig
