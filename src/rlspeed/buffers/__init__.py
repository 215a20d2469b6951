"""Device-resident storage: rollout storage with GAE (on-policy) and a replay buffer (off-policy).

Observations are stored in their own dtype (uint8 images as uint8, Discrete indices as int64), one tensor per key for
Dict observations.
"""

from rlspeed.buffers.replay import ReplayBuffer
from rlspeed.buffers.rollout import RolloutBuffer, allocate_observations, copy_observations, gae, observation_nbytes

__all__ = ["ReplayBuffer", "RolloutBuffer", "allocate_observations", "copy_observations", "gae", "observation_nbytes"]
