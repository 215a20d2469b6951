"""Shared machinery of the device-native envs: N copies stepped with batched tensor ops, SAME_STEP autoreset.

A native env subclass states its constants and three pure tensor functions (`sample_state`, `dynamics`,
`observe`); this base does time limits, autoreset, `final_obs` and seeding with no Python loop over envs and no
host sync in `step`.
"""

from __future__ import annotations

import secrets

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs.base import BatchedEnv, EnvSpec, ResetResult, StepResult
from rlspeed.errors import UserError, true_or_false

_MAX_BLOCK_STEPS = 64  # per-env draws made at once (fewer kernels per step at small N) ...
_BLOCK_ELEMENTS = 1 << 18  # ... holding at most this many numbers


def observation_box(high: list[float], low: list[float] | None = None) -> gym.Space:
    """A native env's observation space: Gymnasium's env's float32 Box, bounded by `high` and `low` (-`high` where
    not given; inf where unbounded), what checkpoints and export sidecars record of it."""
    high_array = np.array(high, dtype=np.float32)
    return gym.spaces.Box(-high_array if low is None else np.array(low, dtype=np.float32), high_array,
                          dtype=np.float32)


def _int32(value: int) -> int:
    """A Python int as the signed 32-bit value with the same low 32 bits (torch int32 arithmetic wraps)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


_GOLDEN, _COUNTER_STEP = _int32(0x9E3779B9), _int32(0x85EBCA6B)
_MIX1, _MIX2 = _int32(0x21F0AAAD), _int32(0x735A2D97)


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply, "lowbias32" constants), in place on an int32 tensor.

    Logical right shifts are arithmetic shifts with the sign bits masked off; multiplies wrap.
    """
    x.bitwise_xor_((x >> 16).bitwise_and_(0xFFFF)).mul_(_MIX1)
    x.bitwise_xor_((x >> 15).bitwise_and_(0x1FFFF)).mul_(_MIX2)
    return x.bitwise_xor_((x >> 15).bitwise_and_(0x1FFFF))


def _uniform_block(counters: torch.Tensor, keys: torch.Tensor, keys_low: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
    """Uniforms in [0, 1) `[T, N, k]` from counters `[T, 1, k]` and per-env keys `[N]` (int32)."""
    high = _mix32_(counters ^ keys.view(1, -1, 1))
    if dtype != torch.float64:  # 24 random bits fill a float32 mantissa
        return (high >> 8).bitwise_and_(0xFFFFFF).to(dtype).mul_(2.0 ** -24)
    low = _mix32_(counters ^ keys_low.view(1, -1, 1))  # 26 + 27 = 53 bits for float64
    top = (high >> 6).bitwise_and_((1 << 26) - 1).to(torch.float64).mul_(2.0 ** 27)
    return top.add_((low >> 5).bitwise_and_((1 << 27) - 1).to(torch.float64)).mul_(2.0 ** -53)


def _seed_words(seed: int) -> tuple[int, int, int]:
    """Three 32-bit words from a seed of any size (SplitMix64 on the host)."""
    words = []
    z = seed & ((1 << 64) - 1)
    for _ in range(2):
        z = (z + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        y = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        y = ((y ^ (y >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
        y ^= y >> 31
        words += [_int32(y), _int32(y >> 32)]
    return words[0], words[1], words[2]


class NativeEnv(BatchedEnv):
    """Base of torch-native batched envs. `state` is settable, `[N, k]`, in gymnasium's `unwrapped.state` layout.

    `num_envs` envs on `device`. `seed` seeds each env's own random stream (env i's draws depend only on `seed` and
    i, for any `num_envs` and device; None: a seed drawn from the OS, torch's global generator untouched).
    `state_dtype=torch.float64` follows Gymnasium's float64 numpy arithmetic to ~1e-14 (torch's and numpy's
    sin/cos differ in the last digit now and then), for parity checks; the float32 default is faster.
    Observations are always float32. `compile=True` fuses the whole transition (dynamics, time limit, autoreset,
    observations) and the random draws with torch.compile: opt-in, since compiling takes seconds and whether it
    beats eager depends on the env and `num_envs` (benchmarks/native_envs.py).
    """

    backend = "torch"
    spec: EnvSpec
    without_env_objects = ("a native env's dynamics are constants (its state is settable): to change the env as "
                           "training goes, train on Gymnasium's (env_backend='gymnasium') and change its envs through "
                           "self.training_env.unwrapped.vector_env, or go on with other options between learn calls "
                           "with Algo.load(path, env_kwargs=...) (docs/callbacks.md, Curricula)")
    state_size: int

    def __init__(self, num_envs: int = 1, device: torch.device | str = "cpu", seed: int | None = None,
                 state_dtype: torch.dtype = torch.float32, compile: bool = False):
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        if not isinstance(state_dtype, torch.dtype) or not state_dtype.is_floating_point:
            raise UserError(f"state_dtype is the torch dtype of the native env's state, torch.float32 or "
                            f"torch.float64, not {state_dtype!r}.")
        compile = true_or_false("make_env(compile=...)", compile)
        self.state_dtype = state_dtype
        # Per-env random streams: env i's draws depend only on (seed, i), so they are the same for any num_envs and
        # on any device: a counter-based generator (a 32-bit hash of the env's key and the draw number, int32
        # arithmetic that every backend has), drawn `_block_steps` steps at a time.
        self._block_steps = max(1, min(_MAX_BLOCK_STEPS, _BLOCK_ELEMENTS // max(self.num_envs * self.state_size, 1)))
        # Without a seed, one is drawn from the OS: `torch.seed()` would reseed torch's global generator and so
        # change the user's own torch randomness after `torch.manual_seed`.
        self._seed_streams(seed if seed is not None else secrets.randbits(63))
        self.state = torch.zeros(self.num_envs, self.state_size, device=self.device, dtype=state_dtype)
        # whether `observe` can return the state itself (the default one on a float32 state): see `observe_kept`
        self._observe_aliases = type(self).observe is NativeEnv.observe and state_dtype == torch.float32
        self.elapsed_steps = torch.zeros(self.num_envs, device=self.device, dtype=torch.int32)
        self._uniform_bounds: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}
        max_steps = self.spec.max_episode_steps
        self._max_steps = max_steps if max_steps is not None else 2**31 - 1
        # compile=True fuses the whole transition (dynamics, time limit, autoreset, observations) with
        # torch.compile. Whether that beats eager depends on the env and the number of envs, and compiling takes
        # seconds, so it is opt-in; benchmarks/native_envs.py measures eager against compiled per env and N.
        self._transition = torch.compile(self.transition, dynamic=False) if compile else self.transition
        # compile=True also fuses the ~20 integer kernels that draw a block of random numbers into one loop.
        self._hash_block = torch.compile(_uniform_block, dynamic=False) if compile else _uniform_block

    # --- what a subclass provides -------------------------------------------------------------------
    def sample_state(self, num: int) -> torch.Tensor:
        """Fresh initial states `[num, k]` drawn with `self.uniform` (one row per env)."""
        raise NotImplementedError

    def dynamics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step: returns (next_state, reward in state dtype, terminated bool)."""
        raise NotImplementedError

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        """Observation float32 `[N, ...]` of a state. This default hands a float32 state back as is; `reset` and
        `step` copy it where the env keeps that state (`observe_kept`)."""
        return state.to(torch.float32)

    def observe_kept(self, state: torch.Tensor) -> torch.Tensor:
        """`observe` of a state the env keeps (`self.state`): never the state itself. Callers keep and may edit
        observations in place (noise, normalisation, a buffer's view), which must not change the physics."""
        obs = self.observe(state)
        return obs.clone() if self._observe_aliases else obs

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
        self.seed_row_blocks([seed])  # one block: every row from the one seed

    def seed_row_blocks(self, seeds, first_row: int = 0) -> None:
        """Restart the random streams with one seed per block of rows: rows `k * B .. (k + 1) * B - 1`
        (`B = num_envs // len(seeds)`) draw exactly what a `B`-env instance seeded with `seeds[k]` draws, so K x B
        envs stepped together reproduce K separate runs' envs (`rlspeed.population`). A later `reset(seed=...)`
        returns to one seed for all rows; `reset()` without one keeps these streams. `first_row`: each block draws
        what rows `first_row ..` of such an instance draw instead (a 1-env instance, row `first_row` of a larger one:
        a video's episode as the evaluation of that seed played it)."""
        seeds = [int(seed) for seed in seeds]
        if not seeds or self.num_envs % len(seeds):
            raise ValueError(f"seed_row_blocks: {self.num_envs} envs do not split into {len(seeds)} equal blocks.")
        block = self.num_envs // len(seeds)
        keys, keys_low = [], []
        for seed in seeds:
            first, second, third = _seed_words(seed)
            env_index = torch.arange(first_row, first_row + block, device=self.device, dtype=torch.int32)
            block_keys = _mix32_(_mix32_(env_index.mul_(_GOLDEN).add_(first)).bitwise_xor_(second))  # [B]
            keys.append(block_keys)
            keys_low.append(_mix32_(block_keys ^ third))  # a second word per draw for float64's 53 bits
        self._keys = keys[0] if len(keys) == 1 else torch.cat(keys)
        self._keys_low = keys_low[0] if len(keys_low) == 1 else torch.cat(keys_low)
        self._draws = 0  # per-env draws made so far (every env draws on every step)
        self._block: torch.Tensor | None = None
        self._block_pos = 0

    def _next_uniform(self) -> torch.Tensor:
        """[N, k] uniforms in [0, 1): draw number `_draws` of every env's stream."""
        if self._block is None or self._block_pos == self._block.shape[0]:
            self._block = self._draw_block(self._draws, self._block_steps)
            self._block_pos = 0
        row = self._block[self._block_pos]
        self._block_pos += 1
        self._draws += 1
        return row

    def _draw_block(self, first_draw: int, steps: int) -> torch.Tensor:
        """Draws `first_draw .. first_draw + steps - 1` of every env's stream: `[steps, N, k]` in the state dtype."""
        k = self.state_size
        counters = torch.arange(steps * k, device=self.device, dtype=torch.int32).add_(_int32(first_draw * k))
        counters = counters.mul_(_COUNTER_STEP).view(steps, 1, k)  # number j of env i: hash(key_i ^ j * step)
        return self._hash_block(counters, self._keys, self._keys_low, self.state_dtype)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything a resumed run needs to continue these envs exactly: states, episode step counters and the
        per-env random streams (their keys and how far they have been drawn)."""
        position = torch.tensor([self._draws, self._block_pos, 0 if self._block is None else self._block.shape[0]],
                                dtype=torch.int64, device="cpu")
        return {"native.state": self.state, "native.elapsed_steps": self.elapsed_steps, "native.keys": self._keys,
                "native.keys_low": self._keys_low, "native.draws": position}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned (ValueError for another number of envs or state size)."""
        saved = state["native.state"]
        if tuple(saved.shape) != (self.num_envs, self.state_size):
            raise ValueError(f"the saved env state has shape {tuple(saved.shape)}, these envs "
                             f"{(self.num_envs, self.state_size)}")
        self.state = saved.to(self.device, self.state_dtype).clone()
        self.elapsed_steps = state["native.elapsed_steps"].to(self.device, torch.int32).clone()
        self._keys = state["native.keys"].to(self.device, torch.int32).clone()
        self._keys_low = state["native.keys_low"].to(self.device, torch.int32).clone()
        draws, block_pos, block_steps = (int(v) for v in state["native.draws"].tolist())
        self._draws, self._block_pos = draws, block_pos
        # the block being drawn from, recomputed: its first draw is `block_pos` draws back
        self._block = None if block_steps == 0 else self._draw_block(draws - block_pos, block_steps)

    def reset(self, seed: int | None = None) -> ResetResult:
        """Draw fresh states for every env and return (obs, {}); zero the episode step counters.

        With `seed`, the per-env random streams restart from it first; without one, they continue where they are.
        """
        if seed is not None:
            self._seed_streams(int(seed))
        self.state = self.sample_state(self.num_envs)
        self.elapsed_steps.zero_()
        return self.observe_kept(self.state), {}

    def step(self, actions: torch.Tensor) -> StepResult:
        """Advance every env one step with batched tensor ops (`transition`), no host sync.

        Fresh initial states are drawn on every call and used for the rows that finish (SAME_STEP autoreset, time limit
        from `spec.max_episode_steps`); `info` is `{"final_obs": ...}`.
        """
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
        final_obs = self.observe(next_state)  # (next_state is not kept: `torch.where` below makes the new state)
        new_state = torch.where(done.unsqueeze(-1), fresh, next_state)
        new_elapsed = elapsed.masked_fill_(done, 0)
        return (self.observe_kept(new_state), reward.to(torch.float32), terminated, truncated, final_obs, new_state,
                new_elapsed)
