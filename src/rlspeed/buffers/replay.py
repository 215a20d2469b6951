"""Replay buffer for off-policy algorithms: preallocated circular storage on the training device.

One `add` writes the transitions of all N envs with one copy per field; `sample` draws uniform indices on
the device. Observations are stored in their own dtype (uint8 images as uint8: a quarter of float32's bytes), one
tensor per key for Dict observations; the networks convert them at their input.

Finished rows store `info["final_obs"]` as their next observation and keep `terminated` apart from
`truncated`, so a time-limit truncation is bootstrapped and a termination is not. With `n_step > 1` the buffer
stores n-step transitions: discounted reward sums cut at episode ends, the observation n steps ahead (or the
episode's last), and the discount `gamma**m` to apply to its value.

With `mask_size`, the buffer also stores `next_action_masks`: the actions allowed at each transition's next
observation (bool `[n]`), for a target that maximises over allowed actions only. The caller gives them; for a row
whose episode ended the adapters' mask is the new episode's, so DQN stores all-allowed there (see `DQN`).

The buffer sizes itself against the memory available before allocating: when the storage would not fit in the
device's free memory, it lives in pinned host memory instead (it says so) and sampled batches are copied to the device
with non-blocking transfers; when it would not fit in the host's available memory either, it refuses with the largest
capacity that fits.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import gymnasium as gym
import torch

from rlspeed.device import free_memory_bytes, synchronize
from rlspeed.envs.base import map_obs, obs_batch_size, observation_layout
from rlspeed.errors import UserError

# Leave this share of the free memory (device or host) to the networks, the batch activations and everything else.
_MEMORY_SHARE = 0.8


def available_memory_bytes(device: torch.device) -> int | None:
    """Memory that `device` can still give, in bytes, or None when it cannot tell: the device's free memory
    (`torch.cuda.mem_get_info` and its kin), and for the host Linux's MemAvailable (free memory plus what the kernel
    can reclaim: page cache), else the free physical pages."""
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as handle:
                for line in handle:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    return free_memory_bytes(device)


def _split(value: torch.Tensor | tuple[torch.Tensor, ...] | dict[str, torch.Tensor], size: int) -> list:
    """Rows split into consecutive batches of `size`; a tuple of row-aligned tensors into tuples of batches, a dict
    (Dict observations) into dicts of batches."""
    if isinstance(value, tuple):
        return list(zip(*(part.split(size) for part in value)))
    if isinstance(value, dict):
        parts = {key: part.split(size) for key, part in value.items()}
        return [{key: parts[key][i] for key in value} for i in range(len(next(iter(parts.values()))))]
    return value.split(size)


def _observation_fields(name: str, storage, value) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, storage tensor, value tensor) per observation tensor: one, or one per key (`obs.image`, ...)."""
    if isinstance(storage, dict):
        return [(f"{name}.{key}", part, value[key]) for key, part in storage.items()]
    return [(name, storage, value)]


class ReplayBuffer:
    """Circular storage of `capacity` transitions; `sample(batch_size)` returns a dict of device tensors.

    Fields of a sample: `obs`, `actions`, `rewards`, `next_obs`, `terminated` (float 0/1), `discounts`
    (gamma**m, m = steps between obs and next_obs). The TD target is
    `rewards + discounts * (1 - terminated) * V(next_obs)`. `obs` and `next_obs` are dicts of tensors for Dict
    observations. Buffers made with `mask_size` add `next_action_masks` (bool `[B, n]`).

    `observation`: the observation space (`EnvSpec.observation_space`; each key stored in its dtype), or a shape
    stored as `obs_dtype`.
    """

    def __init__(self, capacity: int, num_envs: int, observation: gym.Space | tuple[int, ...],
                 action_shape: tuple[int, ...], action_dtype: torch.dtype, device: torch.device | str,
                 n_step: int = 1, gamma: float = 0.99, storage_device: torch.device | str | None = None,
                 obs_dtype: torch.dtype = torch.float32, mask_size: int | None = None):
        if capacity < num_envs:
            raise ValueError(f"buffer capacity ({capacity}) must be at least num_envs ({num_envs})")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.capacity, self.num_envs, self.n_step, self.gamma = int(capacity), int(num_envs), int(n_step), gamma
        self.device = torch.device(device)
        layout = (observation_layout(observation) if isinstance(observation, gym.Space)
                  else (tuple(observation), obs_dtype))
        parts = layout.values() if isinstance(layout, dict) else (layout,)
        obs_bytes = sum(int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
                        for shape, dtype in parts)
        action_numel = int(torch.Size(action_shape).numel())
        action_bytes = torch.empty((), dtype=action_dtype).element_size()
        bytes_per_row = 2 * obs_bytes + 4 * 3 + action_bytes * action_numel + (mask_size or 0)
        self.bytes_per_transition = bytes_per_row  # the real bytes: observations in their own dtypes
        self.nbytes = bytes_per_row * self.capacity
        if storage_device is None:
            storage_device = self.device
            free = available_memory_bytes(self.device)
            if self.device.type != "cpu" and free is not None and self.nbytes > _MEMORY_SHARE * free:
                storage_device = torch.device("cpu")
                warnings.warn(f"Replay buffer of {self.nbytes / 2**30:.2f} GiB does not fit in {self.device}'s "
                              f"free memory ({free / 2**30:.2f} GiB): keeping it in pinned host memory.",
                              stacklevel=2)
        self.storage_device = torch.device(storage_device)
        self._check_fits(bytes_per_row)
        pin = self.storage_device.type == "cpu" and self.device.type != "cpu" and torch.cuda.is_available()

        def zeros(*shape, dtype=torch.float32):
            # allocated pinned (pin_memory() on a made tensor would hold a second copy while it copies)
            return torch.zeros(self.capacity, *shape, dtype=dtype, device=self.storage_device, pin_memory=pin)

        if isinstance(layout, dict):
            self.obs = {key: zeros(*shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
            self.next_obs = {key: zeros(*shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
        else:
            self.obs = zeros(*layout[0], dtype=layout[1])
            self.next_obs = zeros(*layout[0], dtype=layout[1])
        self.actions = zeros(*action_shape, dtype=action_dtype)
        self.rewards = zeros()
        self.terminated = zeros()
        self.discounts = zeros()
        # the actions allowed at next_obs (masked envs only; None otherwise)
        self.next_action_masks = zeros(mask_size, dtype=torch.bool) if mask_size else None
        if self.n_step == 1:
            self.discounts.fill_(gamma)  # every 1-step transition discounts by gamma: written once, here
        self.pos = 0  # next row to write (host counter: advances by num_envs per add, never read from the device)
        self.size = 0
        self._rows = torch.arange(self.num_envs, device=self.storage_device)
        self._window: list[tuple[torch.Tensor, ...]] = []  # pending steps for n-step returns
        if self.n_step > 1:
            self._powers = gamma ** torch.arange(self.n_step, device=self.device, dtype=torch.float32)

    def __len__(self) -> int:
        return self.size

    def _check_fits(self, bytes_per_row: int) -> None:
        """UserError, with the largest capacity that fits, when the storage needs more than the share of the storage
        device's available memory that a buffer may take (allocating it anyway fails later, or is killed)."""
        free = available_memory_bytes(self.storage_device)
        if free is None or self.nbytes <= _MEMORY_SHARE * free:
            return
        budget = int(_MEMORY_SHARE * free)
        fits = max(budget // bytes_per_row // self.num_envs * self.num_envs, 0)
        where = "host memory" if self.storage_device.type == "cpu" else f"{self.storage_device}'s free memory"
        advice = (f"the largest replay buffer that fits is {fits:,} transitions (buffer_size={fits}, on the command "
                  f"line --set buffer_size={fits})" if fits >= self.num_envs
                  else "not even one transition per env fits: free memory or use smaller observations")
        raise UserError(f"A replay buffer of {self.capacity:,} transitions needs {self.nbytes / 2**30:.2f} GiB, more "
                        f"than the {budget / 2**30:.2f} GiB it may take ({_MEMORY_SHARE:.0%} of the available "
                        f"{where}); {advice}.")

    def describe(self) -> str:
        """Footprint and placement, e.g. 'replay buffer: 1,000,000 transitions, 76.3 MiB on cpu'."""
        where = str(self.storage_device) + (" (pinned host memory)" if self.storage_device != self.device else "")
        return f"replay buffer: {self.capacity:,} transitions, {self.nbytes / 2**20:.1f} MiB on {where}"

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
            terminated: torch.Tensor, truncated: torch.Tensor, next_action_masks: torch.Tensor | None = None) -> None:
        """Store one step of all N envs. `next_obs` is `info["final_obs"]` (the true last obs of finished rows);
        `next_action_masks` (bool `[N, n]`, buffers made with `mask_size` only) the actions allowed there."""
        self._check_masks(next_action_masks)
        if self.n_step == 1:
            self._write(obs, actions, rewards, next_obs, terminated,  # the copy converts bool to float
                        next_action_masks=next_action_masks)
            return
        terminated = terminated.to(torch.float32)
        done = torch.maximum(terminated, truncated.to(torch.float32))
        entry = (obs, actions, rewards.to(torch.float32), next_obs, terminated, done)
        self._window.append(entry if next_action_masks is None else (*entry, next_action_masks))
        if len(self._window) == self.n_step:
            self._write(*self._n_step_transition())
            self._window.pop(0)

    def extend(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
               terminated: torch.Tensor, truncated: torch.Tensor,
               next_action_masks: torch.Tensor | None = None) -> None:
        """Store T consecutive steps of all N envs (every argument `[T, N, ...]`), as T calls of `add` would, in
        the same rows: one copy per field for all of them (1-step buffers; others add step by step)."""
        self._check_masks(next_action_masks)
        steps = obs_batch_size(obs)
        if self.n_step > 1 or steps * self.num_envs > self.capacity:
            for t in range(steps):
                def row(v: torch.Tensor, t: int = t) -> torch.Tensor:
                    return v[t]

                self.add(map_obs(row, obs), actions[t], rewards[t], map_obs(row, next_obs), terminated[t],
                         truncated[t], None if next_action_masks is None else next_action_masks[t])
            return
        self._write(*(map_obs(lambda v: v.flatten(0, 1), value)
                      for value in (obs, actions, rewards, next_obs, terminated)),
                    next_action_masks=None if next_action_masks is None else next_action_masks.flatten(0, 1))

    def _check_masks(self, next_action_masks: torch.Tensor | None) -> None:
        """Masks are given exactly when the buffer stores them (a shape check on the host: no device read)."""
        if (next_action_masks is None) != (self.next_action_masks is None):
            raise ValueError("next_action_masks must be given exactly when the buffer was made with mask_size")

    def _n_step_transition(self):
        """The n-step transition starting at the oldest pending step, for all N envs at once."""
        obs, actions = self._window[0][0], self._window[0][1]
        rewards = torch.stack([w[2] for w in self._window])  # [n, N]
        next_obs = (torch.stack([w[3] for w in self._window]) if not isinstance(obs, dict)  # [n, N, ...]
                    else {key: torch.stack([w[3][key] for w in self._window]) for key in obs})
        terminated = torch.stack([w[4] for w in self._window])
        done = torch.stack([w[5] for w in self._window])
        # alive[k] = 1 while no episode end happened before step k: later steps belong to the next episode.
        alive = torch.cumprod(torch.cat((torch.ones_like(done[:1]), 1.0 - done[:-1])), dim=0)
        returns = (self._powers.unsqueeze(1) * alive * rewards).sum(0)
        last = (alive.sum(0) - 1).long()  # index of the last step used: the first done, else n - 1
        columns = torch.arange(self.num_envs, device=last.device)
        discounts = self.gamma ** (last + 1).to(torch.float32)
        last_obs = map_obs(lambda v: v[last, columns], next_obs)
        masks = None
        if self.next_action_masks is not None:  # the mask at the observation the transition bootstraps from
            masks = torch.stack([w[6] for w in self._window])[last, columns]
        return obs, actions, returns, last_obs, terminated[last, columns], discounts, masks

    def _write(self, obs, actions, rewards, next_obs, terminated, discounts=None, next_action_masks=None) -> None:
        """Write `len(obs)` (at most `capacity`) rows from `pos` on, wrapping around the end of the storage."""
        observations = (*_observation_fields("obs", self.obs, obs),
                        *_observation_fields("next_obs", self.next_obs, next_obs))
        fields = [(storage, value) for _, storage, value in observations]
        fields += [(self.actions, actions), (self.rewards, rewards), (self.terminated, terminated)]
        if discounts is not None:  # (1-step buffers hold the constant gamma from the start)
            fields.append((self.discounts, discounts))
        if next_action_masks is not None:
            fields.append((self.next_action_masks, next_action_masks))
        count = rewards.shape[0]
        source = rewards.device
        # Copies into host storage from an accelerator are asynchronous, then waited for once: the next host read
        # (the index_copy_ below, a sample) must not see rows that have not arrived. Host-to-device and same-device
        # copies need no wait (the device stream orders them).
        to_host = self.storage_device.type == "cpu" and source.type != "cpu"
        if self.pos + count <= self.capacity:  # contiguous rows: a plain copy (converts dtype and device)
            end = self.pos + count
            for storage, value in fields:
                storage[self.pos:end].copy_(value, non_blocking=True)
            if to_host:
                synchronize(source)
        else:  # the write wraps around the end of the storage
            rows = self._rows if count == self.num_envs else torch.arange(count, device=self.storage_device)
            index = (rows + self.pos) % self.capacity
            moved = [(storage, value.to(self.storage_device, non_blocking=True)) for storage, value in fields]
            if to_host:
                synchronize(source)
            for storage, value in moved:
                storage.index_copy_(0, index, value.to(storage.dtype))
        self.pos = (self.pos + count) % self.capacity
        self.size = min(self.size + count, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """A uniform batch of stored transitions, as tensors on the training device."""
        return self.sample_batches(1, batch_size, generator)[0]

    def sample_batches(self, count: int, batch_size: int, generator: torch.Generator | None = None,
                       prepare: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
                       ) -> list[dict[str, torch.Tensor]]:
        """`count` independent uniform batches, distributed as `count` calls of `sample` while the buffer does not
        change, gathered together: one index draw and one gather per field for all of them.

        `prepare`, if given, maps the gathered rows of all batches (a dict of `[count * batch_size, ...]` tensors) to
        the dict that is split into the batches; it may add fields computed for all rows at once, one value per row
        (a tensor, or a tuple of tensors that is split as a tuple).
        """
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        index = torch.randint(0, self.size, (count * batch_size,), device=self.storage_device, generator=generator)
        batch = {"obs": map_obs(lambda v: v[index], self.obs), "actions": self.actions[index],
                 "rewards": self.rewards[index], "next_obs": map_obs(lambda v: v[index], self.next_obs),
                 "terminated": self.terminated[index], "discounts": self.discounts[index]}
        if self.next_action_masks is not None:
            batch["next_action_masks"] = self.next_action_masks[index]
        if self.storage_device != self.device:
            def move(v: torch.Tensor) -> torch.Tensor:
                if v.device.type == "cpu" and torch.cuda.is_available():
                    return v.pin_memory().to(self.device, non_blocking=True)
                return v.to(self.device)

            batch = {k: map_obs(move, v) for k, v in batch.items()}
        if prepare is not None:
            batch = prepare(batch)
        if count == 1:
            return [batch]
        split = {key: _split(value, batch_size) for key, value in batch.items()}
        return [{key: split[key][i] for key in batch} for i in range(count)]
