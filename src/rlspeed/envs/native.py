"""Shared machinery of the device-native envs: N copies stepped with batched tensor ops, SAME_STEP autoreset.

A native env subclass states its constants and three pure tensor functions (`sample_state`, `dynamics`,
`observe`); this base does time limits, autoreset, `final_obs` and seeding with no Python loop over envs and no
host sync in `step`.
"""

from __future__ import annotations

import torch

from rlspeed.device import rules
from rlspeed.envs.base import BatchedEnv, EnvSpec

_MAX_BLOCK_STEPS = 64  # per-env draws made at once (fewer kernels per step at small N) ...
_BLOCK_ELEMENTS = 1 << 18  # ... holding at most this many numbers


def _signed(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)  # SplitMix64's increment
_MIX1, _MIX2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _mix_int(value: int) -> int:
    """SplitMix64's finaliser on a Python int (the seed), as a signed 64-bit value."""
    z = (value + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return _signed(z ^ (z >> 31))


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors: wrapping multiplies, logical shifts as arithmetic shift + mask."""
    z = z ^ ((z >> 30) & ((1 << 34) - 1))
    z = z * _MIX1
    z = z ^ ((z >> 27) & ((1 << 37) - 1))
    z = z * _MIX2
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def _to_unit(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Uniform floats in [0, 1) from the top 53 (float64) or 24 (float32 and smaller) bits of int64 values."""
    mantissa = 53 if dtype == torch.float64 else 24
    top = (bits >> (64 - mantissa)) & ((1 << mantissa) - 1)
    return top.to(dtype).mul_(2.0 ** -mantissa)


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
        # Per-env random streams: env i's draws depend only on (seed, i), so they are the same for any num_envs and
        # on any device. Counter-based (SplitMix64 on int64 tensors); where the backend keeps integers in int32
        # (NPU), one torch.Generator for all envs instead.
        self._counter_rng = rules(self.device).index_dtype == torch.int64
        self.generator = torch.Generator(device=self.device)
        self._block_steps = max(1, min(_MAX_BLOCK_STEPS, _BLOCK_ELEMENTS // max(self.num_envs * self.state_size, 1)))
        self._seed_streams(seed if seed is not None else int(torch.seed() % (2**63)))
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
        """The next per-env uniform draw `[num_envs, k]` in [low, high) (broadcast), in the state dtype."""
        if num != self.num_envs:
            raise ValueError(f"uniform() draws one row per env: num must be {self.num_envs}, got {num}.")
        # Bounds become device tensors once: building a tensor from Python numbers on an accelerator is a
        # blocking host-to-device copy, and `step` samples fresh states on every call.
        key = (repr(low), repr(high))
        if key not in self._uniform_bounds:
            low_t = torch.as_tensor(low, dtype=self.state_dtype, device=self.device)
            high_t = torch.as_tensor(high, dtype=self.state_dtype, device=self.device)
            self._uniform_bounds[key] = (low_t, high_t - low_t)
        low, width = self._uniform_bounds[key]
        return self._next_uniform().mul(width).add_(low)  # low + (high - low) * u, as numpy's uniform

    def _seed_streams(self, seed: int) -> None:
        self.generator.manual_seed(seed)
        if self._counter_rng:
            env_index = torch.arange(self.num_envs, device=self.device, dtype=torch.int64)
            self._stream_keys = _mix64(env_index.mul(_GOLDEN).add_(_mix_int(seed)))
        self._draws = 0  # per-env draws made so far (every env draws on every step)
        self._block: torch.Tensor | None = None
        self._block_pos = 0

    def _next_uniform(self) -> torch.Tensor:
        """[N, k] uniforms in [0, 1): row `_draws` of every env's stream. Drawn `_block_steps` rows at a time."""
        size = (self.num_envs, self.state_size)
        if not self._counter_rng:
            return torch.rand(size, generator=self.generator, device=self.device, dtype=self.state_dtype)
        if self._block is None or self._block_pos == self._block.shape[0]:
            steps = torch.arange(self._draws, self._draws + self._block_steps, device=self.device, dtype=torch.int64)
            counters = steps.view(-1, 1, 1) * self.state_size + torch.arange(
                self.state_size, device=self.device, dtype=torch.int64)  # [T, 1, k]
            self._block = _to_unit(_mix64(counters.mul(_GOLDEN).add(self._stream_keys.view(1, -1, 1))),
                                   self.state_dtype)
            self._block_pos = 0
        row = self._block[self._block_pos]
        self._block_pos += 1
        self._draws += 1
        return row

    def reset(self, seed: int | None = None) -> tuple[torch.Tensor, dict]:
        if seed is not None:
            self._seed_streams(int(seed))
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
