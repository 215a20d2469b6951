"""The env of `slow_envs.py`: each step waits `step_s` seconds (a simulator over a socket, a robot) and computes
almost nothing. A module of its own, so that subprocess envs (rlspeed's `gymnasium-async`, SB3's SubprocVecEnv)
import it by its id, `sleeping_env:SleepingDiscrete-v0` or `sleeping_env:SleepingBox-v0`."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

#: seconds each step waits
STEP_S = 0.005
#: steps per episode
EPISODE_STEPS = 200


class SleepingEnv(gym.Env):
    """Three observations drifting with the action, reward 1 per step; Discrete(2) or Box(-1, 1, (1,)) actions."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    metadata = {"render_modes": ["rgb_array"]}  # (SB3's make_vec_env asks for it)

    def __init__(self, continuous: bool = False, step_s: float = STEP_S, render_mode: str | None = None):
        self.render_mode = render_mode
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(2)
        self.step_s = step_s
        self._obs = np.zeros(3, np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self._obs = self.np_random.uniform(-0.1, 0.1, 3).astype(np.float32)
        return self._obs.copy(), {}

    def step(self, action):
        time.sleep(self.step_s)
        push = float(np.asarray(action).reshape(-1)[0]) - 0.5 if self.action_space.shape == () else float(action[0])
        self._obs = np.clip(self._obs * 0.9 + 0.05 * push, -1.0, 1.0).astype(np.float32)
        return self._obs.copy(), 1.0, False, False, {}

    def render(self):
        return np.zeros((8, 8, 3), np.uint8)


gym.register("SleepingDiscrete-v0", entry_point=SleepingEnv, max_episode_steps=EPISODE_STEPS)
gym.register("SleepingBox-v0", entry_point=SleepingEnv, kwargs={"continuous": True}, max_episode_steps=EPISODE_STEPS)
