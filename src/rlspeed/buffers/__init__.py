"""Device-resident storage: rollout storage with GAE for on-policy algorithms."""

from rlspeed.buffers.rollout import RolloutBuffer, gae

__all__ = ["RolloutBuffer", "gae"]
