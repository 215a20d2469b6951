"""Device-resident storage: rollout storage with GAE (on-policy) and a replay buffer (off-policy).

Observations are stored in their own dtype (uint8 images as uint8, Discrete indices as int64), one tensor per key for
Dict observations;
frame-stacked images store each frame once (`FrameStackReplayBuffer`).
"""

from rlspeed.buffers.replay import FrameStackReplayBuffer, ReplayBuffer, frame_stacks
from rlspeed.buffers.rollout import RolloutBuffer, allocate_observations, gae, observation_nbytes

__all__ = ["FrameStackReplayBuffer", "ReplayBuffer", "frame_stacks", "RolloutBuffer",
           "allocate_observations", "gae", "observation_nbytes"]
