"""Device-resident storage: rollout storage with GAE (on-policy) and a replay buffer (off-policy)."""

from rlspeed.buffers.replay import ReplayBuffer
from rlspeed.buffers.rollout import RolloutBuffer, gae

__all__ = ["ReplayBuffer", "RolloutBuffer", "gae"]
