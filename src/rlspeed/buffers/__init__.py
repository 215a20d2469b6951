"""Device-resident storage: rollout storage with GAE (on-policy) and a replay buffer (off-policy).

Observations are stored in their own dtype (uint8 images as uint8, Discrete indices as int64), one tensor per key for
Dict observations;
frame-stacked images store each frame once (`FrameStackReplayBuffer`), other images each observation once
(`SharedObservationReplayBuffer`); goal-conditioned observations can relabel goals (`HerReplayBuffer`).
"""

from rlspeed.buffers.her import HerReplayBuffer
from rlspeed.buffers.replay import (
    FrameStackReplayBuffer,
    ReplayBuffer,
    SharedObservationReplayBuffer,
    frame_stacks,
    image_space,
)
from rlspeed.buffers.rollout import RolloutBuffer, allocate_observations, gae, observation_nbytes

__all__ = ["FrameStackReplayBuffer", "HerReplayBuffer", "ReplayBuffer", "SharedObservationReplayBuffer", "frame_stacks",
           "image_space", "RolloutBuffer",
           "allocate_observations", "gae", "observation_nbytes"]
