"""`failing_rank_env:FailingRank-v0`: CartPole whose step raises on the torchrun rank named by FAILING_RANK after
FAILING_AFTER steps of one env (the other ranks train on), for the tests of how a distributed run ends when one
process's env fails."""
import os

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class FailingRank(CartPoleEnv):
    steps = 0

    def step(self, action):
        self.steps += 1
        if os.environ.get("RANK") == os.environ.get("FAILING_RANK") and \
                self.steps > int(os.environ.get("FAILING_AFTER", "300")):
            raise RuntimeError("sensor cable unplugged")
        return super().step(action)


gym.register("FailingRank-v0", entry_point=FailingRank, max_episode_steps=500)
