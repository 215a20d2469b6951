"""An env whose steps wait (a simulator over a socket, a robot): each step sleeps 1 ms and does almost no work."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class SlowEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, step_s: float = 0.001):
        self.step_s = step_s

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        time.sleep(self.step_s)
        return np.full(2, float(action) - 0.5, np.float32), 1.0, False, False, {}


gym.register("SlowSleeping-v0", entry_point=SlowEnv, max_episode_steps=20)
