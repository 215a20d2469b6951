"""Shared machinery of the device-native envs: N copies stepped with batched tensor ops, SAME_STEP autoreset.

A native env subclass states its constants and three pure tensor functions (`sample_state`, `dynamics`,
`observe`); this base does time limits, autoreset, `final_obs` and seeding with no Python loop over envs and no
host sync in `step`.
"""

from __future__ import annotations

import torch

from rlspeed.envs.base import BatchedEnv, EnvSpec


class NativeEnv(BatchedEnv):
    """Base of torch-native batched envs. `state` is settable, `[N, k]`, in gymnasium's `unwrapped.state` layout.

    `state_dtype=torch.float64` follows Gymnasium's float64 numpy arithmetic to ~1e-14 (torch's and numpy's
    sin/cos differ in the last digit now and then), for parity checks; the float32 default is faster.
    Observations are always float32.
    """

    backend = "torch"
    spec: EnvSpec
    state_size: int

    def __init__(self, num_envs: int = 1, device: torch.device | str = "cpu", seed: int | None = None,
                 state_dtype: torch.dtype = torch.float32, compile: bool = False):
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.state_dtype = state_dtype
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed if seed is not None else int(torch.seed() % (2**63)))
        self.state = torch.zeros(self.num_envs, self.state_size, device=self.device, dtype=state_dtype)
        self.elapsed_steps = torch.zeros(self.num_envs, device=self.device, dtype=torch.int32)
        self._uniform_bounds: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}
        max_steps = self.spec.max_episode_steps
        self._max_steps = max_steps if max_steps is not None else 2**31 - 1
        # compile=True fuses the whole transition (dynamics, time limit, autoreset, observations) with
        # torch.compile. Measured on a CPU: 1.2-1.7x for CartPole at 4,096 envs, slower for Pendulum/MountainCar;
        # compiling takes seconds (benchmarks/native_envs.py).
        self._transition = torch.compile(self.transition, dynamic=False) if compile else self.transition

    # --- what a subclass provides -------------------------------------------------------------------
    def sample_state(self, num: int) -> torch.Tensor:
        """Fresh initial states `[num, k]` drawn with `self.generator`."""
        raise NotImplementedError

    def dynamics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step: returns (next_state, reward in state dtype, terminated bool)."""
        raise NotImplementedError

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        """Observation float32 `[N, ...]` of a state."""
        return state.to(torch.float32)

    # --- the contract ---------------------------------------------------------------------------------
    def uniform(self, num: int, low, high) -> torch.Tensor:
        """Uniform samples `[num, k]` in [low, high) (broadcast), in the state dtype, from this env's generator."""
        # Bounds become device tensors once: building a tensor from Python numbers on an accelerator is a
        # blocking host-to-device copy, and `step` samples fresh states on every call.
        key = (repr(low), repr(high))
        if key not in self._uniform_bounds:
            low_t = torch.as_tensor(low, dtype=self.state_dtype, device=self.device)
            high_t = torch.as_tensor(high, dtype=self.state_dtype, device=self.device)
            self._uniform_bounds[key] = (low_t, high_t - low_t)
        low, width = self._uniform_bounds[key]
        size = (num, self.state_size)
        noise = torch.rand(size, generator=self.generator, device=self.device, dtype=self.state_dtype)
        return noise.mul_(width).add_(low)  # low + (high - low) * u, as numpy's uniform (no fused multiply-add)

    def reset(self, seed: int | None = None) -> tuple[torch.Tensor, dict]:
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self.state = self.sample_state(self.num_envs)
        self.elapsed_steps.zero_()
        return self.observe(self.state), {}

    def step(self, actions: torch.Tensor):
        fresh = self.sample_state(self.num_envs)  # drawn every step so that no row-dependent branch is needed
        obs, reward, terminated, truncated, final_obs, self.state, self.elapsed_steps = self._transition(
            self.state, self.elapsed_steps, actions, fresh)
        return obs, reward, terminated, truncated, {"final_obs": final_obs}

    def transition(self, state: torch.Tensor, elapsed_steps: torch.Tensor, actions: torch.Tensor,
                   fresh: torch.Tensor):
        """The pure step: (obs, reward, terminated, truncated, final_obs, next state, next elapsed steps)."""
        next_state, reward, terminated = self.dynamics(state, actions)
        elapsed = elapsed_steps + 1
        truncated = elapsed >= self._max_steps
        done = terminated | truncated
        final_obs = self.observe(next_state)
        new_state = torch.where(done.unsqueeze(-1), fresh, next_state)
        new_elapsed = elapsed.masked_fill_(done, 0)
        return (self.observe(new_state), reward.to(torch.float32), terminated, truncated, final_obs, new_state,
                new_elapsed)
