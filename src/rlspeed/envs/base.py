"""The batched env contract every rlspeed env and wrapper follows (README.md, "Envs").

`reset(seed=None) -> (obs, info)` and `step(actions) -> (obs, reward, terminated, truncated, info)`, all torch
tensors on `env.device`: obs float32 `[N, ...]`, reward float32 `[N]`, terminated/truncated bool `[N]`.
Autoreset is SAME_STEP: a finished row is already reset in the returned `obs`, and `info["final_obs"]` is a
float32 `[N, ...]` tensor holding, for every row, the observation the action led to: the true last observation
for finished rows, the same as `obs` for the others. Bootstrapping a truncated episode reads it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import torch


@dataclass(frozen=True)
class EnvSpec:
    """What algorithms need to know about an env, independent of its backend."""

    env_id: str
    observation_shape: tuple[int, ...]
    action_space: gym.Space
    max_episode_steps: int | None
    reward_threshold: float | None

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, gym.spaces.Discrete)

    @property
    def obs_dim(self) -> int:
        """Size of a flattened observation (what the networks take)."""
        return int(torch.Size(self.observation_shape).numel())

    @property
    def action_dim(self) -> int:
        """Number of discrete actions, or the size of a Box action."""
        if self.discrete:
            return int(self.action_space.n)
        return int(torch.Size(self.action_space.shape).numel())


class BatchedEnv:
    """Base class of batched envs: N copies of one task stepped together, tensors in and out on `device`."""

    spec: EnvSpec
    num_envs: int
    device: torch.device
    backend: str

    def reset(self, seed: int | None = None) -> tuple[torch.Tensor, dict]:
        """Start new episodes in all N envs (reseeding them first when `seed` is given).

        Returns (obs, info): obs a float32 `[N, ...]` tensor on `device`, info a dict (empty for the built-in envs).
        """
        raise NotImplementedError

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Step all N envs with one action per env (`[N]` for Discrete, `[N, *shape]` for Box).

        Returns (obs, reward, terminated, truncated, info), tensors on `device`: obs float32 `[N, ...]`, reward float32
        `[N]`, terminated and truncated bool `[N]`. Autoreset is SAME_STEP: finished rows of `obs` are already reset,
        and `info["final_obs"]` (float32 `[N, ...]`) holds the observation each action led to, the true last one for
        finished rows.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release subprocesses or other resources (no-op by default)."""

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """Everything needed to continue exactly where the env is now, as tensors (native envs: physical state,
        step counters and random streams), or None when the backend cannot restore its episodes in progress
        (Gymnasium and Stable-Baselines3 envs: a resumed run starts them afresh)."""
        return None

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned (same kind of env, same `num_envs`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore its state.")

    @property
    def single_observation_space(self) -> gym.Space:
        return gym.spaces.Box(-float("inf"), float("inf"), self.spec.observation_shape)

    @property
    def single_action_space(self) -> gym.Space:
        return self.spec.action_space

    @property
    def unwrapped(self) -> BatchedEnv:
        return self

    def __enter__(self) -> BatchedEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EnvWrapper(BatchedEnv):
    """A batched env that forwards to an inner one; subclasses change obs, reward or info."""

    _training = True  # this wrapper's own flag behind `training`

    def __init__(self, env: BatchedEnv):
        self.env = env
        self.spec = env.spec
        self.num_envs = env.num_envs
        self.device = env.device
        self.backend = env.backend

    def reset(self, seed: int | None = None) -> tuple[torch.Tensor, dict]:
        """Reset the inner env (unchanged here; subclasses add their own work)."""
        return self.env.reset(seed=seed)

    def step(self, actions: torch.Tensor):
        """Step the inner env (unchanged here; subclasses change obs, reward or info)."""
        return self.env.step(actions)

    def close(self) -> None:
        """Close the inner env."""
        self.env.close()

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """The inner env's state plus this wrapper's own (`_own_state`, keys prefixed with the class name); None when
        the inner env's cannot be restored."""
        inner = self.env.state_dict()
        if inner is None:
            return None
        prefix = type(self).__name__ + "."
        return {**inner, **{prefix + key: value for key, value in self._own_state().items()}}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the inner env's state, then this wrapper's own."""
        self.env.load_state_dict(state)
        prefix = type(self).__name__ + "."
        own = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
        if own:
            self._load_own_state(own)

    def _own_state(self) -> dict[str, torch.Tensor]:
        """This wrapper's running tensors that exact resume needs (none by default)."""
        return {}

    def _load_own_state(self, state: dict[str, torch.Tensor]) -> None:
        for key, value in state.items():
            getattr(self, key).copy_(value)

    @property
    def unwrapped(self) -> BatchedEnv:
        return self.env.unwrapped

    @property
    def training(self) -> bool:
        """Whether the statistics of the normalisation wrappers are updated (True until set otherwise).

        Setting it on a wrapper sets it on every wrapper inside too, so `env.training = False` on what `make_env`
        returns freezes both observation and reward statistics. Reading it gives False when this wrapper or any
        wrapper inside it is frozen.
        """
        inner = self.__dict__.get("env")
        return self._training and (inner.training if isinstance(inner, EnvWrapper) else True)

    @training.setter
    def training(self, value: bool) -> None:
        self._training = bool(value)
        inner = self.__dict__.get("env")  # (a subclass may set it before EnvWrapper.__init__ has run)
        if isinstance(inner, EnvWrapper):
            inner.training = value

    @property
    def state(self):
        """The innermost env's settable state (native envs), so `env.state = x` works through wrappers."""
        return self.env.state

    @state.setter
    def state(self, value) -> None:
        self.env.state = value

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: expose the inner env's extras (e.g. `state`).
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


class EpisodeStatistics(EnvWrapper):
    """Adds `info["episode_return"]`, `info["episode_length"]` (valid where `info["done"]`) from raw rewards.

    Applied innermost by `make_env`, so returns are the env's own, before any reward normalisation. The numerics
    guard of the model training on it (`rlspeed.numerics.EnvValueGuard`, set as `numerics`) checks the env's values
    here, before anything else sees them. Everything stays on the device; nothing is read back to the host.
    """

    def __init__(self, env: BatchedEnv):
        super().__init__(env)
        self._return = torch.zeros(self.num_envs, device=self.device, dtype=torch.float32)
        self._length = torch.zeros(self.num_envs, device=self.device, dtype=torch.float32)
        self.numerics = None  # an EnvValueGuard, set by the model that trains on this env

    def reset(self, seed: int | None = None):
        """Zero the running episode totals, then reset the inner env."""
        self._return = torch.zeros_like(self._return)
        self._length = torch.zeros_like(self._length)
        obs, info = self.env.reset(seed=seed)
        if self.numerics is not None:
            obs = self.numerics.check(obs)[0]
        return obs, info

    def _own_state(self) -> dict[str, torch.Tensor]:
        return {"_return": self._return, "_length": self._length}

    def step(self, actions: torch.Tensor):
        """Step the inner env and add `info["done"]`, `info["episode_return"]` and `info["episode_length"]`.

        The totals (float32 `[N]`) are the finished episodes' where `info["done"]` is True; elsewhere they are the
        current episode's running totals, which callers should ignore.
        """
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self.numerics is not None:
            final_obs = info["final_obs"]
            obs, reward, checked_final = self.numerics.check(obs, reward, final_obs, actions)
            info["final_obs"] = obs if final_obs is obs or checked_final is None else checked_final
        done = terminated | truncated
        # Fresh tensors each step (no copies): the returned totals stay valid after later steps.
        episode_return, episode_length = self._return + reward, self._length + 1.0
        self._return, self._length = episode_return.masked_fill(done, 0.0), episode_length.masked_fill(done, 0.0)
        info["done"] = done
        info["episode_return"], info["episode_length"] = episode_return, episode_length
        return obs, reward, terminated, truncated, info
