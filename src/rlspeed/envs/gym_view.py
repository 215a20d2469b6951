"""A single-env Gymnasium view of each native env, registered as `rlspeed/<id>` (e.g. `rlspeed/CartPole-v1`).

`gymnasium.make("rlspeed/CartPole-v1")` gives an ordinary `gymnasium.Env` (numpy in and out, float64-free
observations, Gymnasium's spaces) backed by the torch implementation with one row, so that
`gymnasium.utils.env_checker.check_env` and users' Gymnasium code work with it. The time limit is added by
Gymnasium's registration (`max_episode_steps`), as for the original ids.
"""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs.packages import install_command
from rlspeed.envs.registry import NATIVE_ENVS


class NativeGymEnv(gym.Env):
    """One native env as a `gymnasium.Env`; the native env's own time limit is switched off (TimeLimit does it).

    `native_id`: the Gymnasium id of the native env (a key of `NATIVE_ENVS`); `state_dtype`: its state's torch dtype,
    by name (float64, as Gymnasium's numpy arithmetic; observations are float32 all the same); `render_mode`: None,
    "human" or "rgb_array", drawn by Gymnasium's env of the same id (which needs pygame).
    """

    # Rendering is Gymnasium's own: the registered env of the same id, made with the render mode, draws this state.
    # It needs pygame (gymnasium[classic-control]); without it no render mode is advertised (check_env then skips
    # them, as it did before rendering existed here). render_fps is set per env from Gymnasium's env.
    metadata = {"render_modes": ["human", "rgb_array"] if importlib.util.find_spec("pygame") else [],
                "render_fps": 30}

    def __init__(self, native_id: str, state_dtype: str = "float64", render_mode: str | None = None):
        if render_mode is not None and render_mode not in ("human", "rgb_array"):
            raise gym.error.Error(f"render_mode={render_mode!r} is not one of rlspeed/{native_id}'s: human, rgb_array.")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise gym.error.DependencyNotInstalled(
                f"render_mode={render_mode!r} for rlspeed/{native_id} is drawn by Gymnasium's {native_id}, which needs "
                f"pygame (modes: human, rgb_array): {install_command('pygame')}.")
        self._env = NATIVE_ENVS[native_id](num_envs=1, device="cpu", seed=0, state_dtype=getattr(torch, state_dtype))
        self._env._max_steps = 2**31 - 1  # truncation comes from gymnasium's TimeLimit wrapper
        original = gym.make(native_id, render_mode=render_mode)  # the same spaces as Gymnasium's registered env
        self.observation_space, self.action_space = original.observation_space, original.action_space
        self.metadata = {**self.metadata, "render_fps": original.metadata.get("render_fps", 30)}
        self.render_mode = render_mode
        self._renderer = original.unwrapped if render_mode is not None else None
        if self._renderer is None:
            original.close()

    @property
    def state(self) -> np.ndarray:
        """The state in Gymnasium's `unwrapped.state` layout (float64 numpy array)."""
        return self._env.state[0].numpy().astype(np.float64)

    @state.setter
    def state(self, value) -> None:
        self._env.state = torch.as_tensor(np.asarray(value), dtype=self._env.state_dtype).reshape(1, -1)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Gymnasium's reset. With a seed, `options={"row": i}` starts from the state row i of the native env of
        many rows seeded with `seed` starts from: the episode `evaluate(model, seed=seed)` plays as its episode i."""
        super().reset(seed=seed)
        row = int((options or {}).get("row", 0))
        if seed is None and not hasattr(self, "_seeded"):
            seed = int(self.np_random.integers(2**31))
        self._seeded = True
        self._last_u = None  # (no torque yet: Gymnasium's Pendulum draws none after a reset)
        if seed is not None and row:
            self._env.seed_row_blocks([seed], first_row=row)
            seed = None
        obs, _ = self._env.reset(seed=seed)
        if self.render_mode == "human":
            self.render()
        return obs[0].numpy(), {}

    def step(self, action):
        if isinstance(self.action_space, gym.spaces.Discrete):
            actions = torch.as_tensor([int(action)])
        else:
            actions = torch.as_tensor(np.asarray(action, dtype=np.float32)).reshape(1, -1)
            # (the torque Gymnasium's Pendulum keeps to draw: the action clipped to its bounds)
            self._last_u = float(np.clip(actions[0, 0].item(), self.action_space.low[0], self.action_space.high[0]))
        next_state, reward, terminated = self._env.dynamics(self._env.state, actions)
        self._env.state = next_state
        obs = self._env.observe_kept(next_state)[0].numpy()
        if self.render_mode == "human":
            self.render()
        return obs, float(reward[0]), bool(terminated[0]), False, {}

    def render(self):
        """A frame of this state drawn by Gymnasium's env of the same id (None without a render mode)."""
        if self._renderer is None:
            return None
        self._renderer.state = self.state
        self._renderer.last_u = getattr(self, "_last_u", None)  # (Pendulum draws the last torque as an arrow)
        return self._renderer.render()

    def close(self) -> None:
        """Close the renderer (its window, for render_mode="human")."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


def register_native_envs() -> None:
    """Register `rlspeed/<id>` for every native env (idempotent)."""
    for env_id, cls in NATIVE_ENVS.items():
        name = f"rlspeed/{env_id}"
        if name in gym.registry:
            continue
        gym.register(id=name, entry_point="rlspeed.envs.gym_view:NativeGymEnv", kwargs={"native_id": env_id},
                     max_episode_steps=cls.spec.max_episode_steps, reward_threshold=cls.spec.reward_threshold)
