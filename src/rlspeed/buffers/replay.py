"""Replay buffer for off-policy algorithms: circular storage of a fixed capacity on the training device (in host
memory, pages are committed as rows are first written, as numpy's buffers are: `host_zeros`).

One `add` writes the transitions of all N envs with one copy per field; `sample` draws uniform indices on
the device. Observations are stored in their own dtype (uint8 images as uint8: a quarter of float32's bytes), one
tensor per key for Dict observations; the networks convert them at their input.

Finished rows store `info["final_obs"]` as their next observation and keep `terminated` apart from
`truncated`, so a time-limit truncation is bootstrapped and a termination is not. With `n_step > 1` the buffer
stores n-step transitions: discounted reward sums cut at episode ends, the observation n steps ahead (or the
episode's last), and the discount `gamma**m` to apply to its value.

With `mask_size`, the buffer also stores `next_action_masks`: the actions allowed at each transition's next
observation (bool `[n]`), for a target that maximises over allowed actions only. The caller gives them (for a row
whose episode ended, the mask at its final observation: see `off_policy.next_masks`).

Three layouts: `ReplayBuffer` stores each observation and next observation whole (`dense`); `FrameStackReplayBuffer`
stores frame-stacked images one frame per transition and rebuilds the stacks at sampling (`frames`);
`SharedObservationReplayBuffer` stores other uint8 or bool images once, a next observation being the next step's
observation (`observations`). `describe()` and `summary()` say which, with the bytes per transition.

The buffer sizes itself against the memory available before allocating: when the storage would not fit in the
device's free memory, it lives in pinned host memory instead (it says so): sampled batches are gathered into host
staging tensors reused from one sample to the next (pinned: no per-sample `pin_memory()`) and copied to the device
with non-blocking transfers, and new frames of the frame layout come back through the same staging; when it would not
fit in the host's available memory either, it refuses with the largest capacity that fits. The host's available
memory counts the rows the live host buffers have yet to fill as taken, so that two buffers of one process that each
fit alone are not both accepted to fill the memory together.
"""

from __future__ import annotations

import collections
import gc
import math
import os
import typing
import warnings
import weakref
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from rlspeed.device import cgroup_directories, free_memory_bytes, synchronize
from rlspeed.envs.base import map_obs, obs_batch_size, observation_layout
from rlspeed.errors import UserError
from rlspeed.files import size_text

# Leave this share of the free memory (device or host) to the networks, the batch activations and everything else.
REPLAY_MEMORY_SHARE = 0.8


#: the limits `available_memory` names, in words following the amount ("80% of the 1.0 GiB <limit>"); on the host, the
#: first of the limits that leave the least (a tie goes to the one the user set for this process)
ULIMIT = "that this process's ulimit (-v or -d) leaves"
CGROUP = "that this process's memory cgroup (a container's or job's memory limit) leaves"
HOST = "of available host memory"


def available_memory(device: torch.device, needed: int | None = None) -> tuple[int | None, str]:
    """Memory that `device` can still give, in bytes, or None when it cannot tell, and which limit sets it, in words
    following the amount (`ULIMIT`, `CGROUP`, `HOST` or 'free on cuda:0'), from one measurement: the device's free
    memory (`torch.cuda.mem_get_info` and its kin), and for the host Linux's MemAvailable (free memory plus what the
    kernel can reclaim: page cache), else the free physical pages, less what the live host replay buffers have yet to
    fill; on the host, no more than this process's memory cgroup (a container's limit: Docker's --memory,
    Kubernetes' limits) has left, nor than its own limits on address space and data (`ulimit -v`, `ulimit -d`: an
    allocation past them fails however much memory is free). Where `needed` bytes would not fit in
    `REPLAY_MEMORY_SHARE` of it, the buffers of models no longer referenced (which reference cycles keep until a
    collection: a sweep's earlier models) are collected first and the memory measured again."""
    device = torch.device(device)
    available, limit = _measure_available_memory(device)
    if (needed is not None and available is not None and needed > REPLAY_MEMORY_SHARE * available
            and device.type == "cpu" and len(_HOST_BUFFERS)):
        gc.collect()
        available, limit = _measure_available_memory(device)
    return available, limit


def refuse_unless_fits(needed: int, device: torch.device, what: str, advice: str | Callable[[int], str]) -> None:
    """The memory rule every check before an allocation follows (replay buffers, rollouts, envs, populations, sampled
    batches): UserError where `needed` bytes exceed the share of `device`'s available memory (`available_memory`)
    that one such allocation may take (`REPLAY_MEMORY_SHARE`), in one sentence: '`what` needs about X GiB, more than
    the Y GiB it may take (80% of the Z GiB <which limit>); `advice`.' The limit named is the one that set Z in
    the same measurement: the device's free memory, this process's ulimit, its memory cgroup, or the host's available
    memory. `advice` says what to change; a function of the Y bytes (an int) where it names what would fit."""
    free, limit = available_memory(device, needed=needed)
    if free is None or needed <= REPLAY_MEMORY_SHARE * free:
        return
    budget = int(REPLAY_MEMORY_SHARE * free)
    advice = advice(budget) if callable(advice) else advice
    raise UserError(f"{what} needs about {size_text(needed)}, more than the {size_text(budget)} it may take "
                    f"({REPLAY_MEMORY_SHARE:.0%} of the {size_text(free)} {limit}); {advice}.")


def _measure_available_memory(device: torch.device) -> tuple[int | None, str]:
    """`available_memory` as it stands, without a collection."""
    if device.type != "cpu":
        return free_memory_bytes(device), f"free on {device}"
    available = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        available = free_memory_bytes(device)
    # (the rows live host buffers have yet to write: their pages are committed as they fill, `host_zeros`, so the
    # machine's free memory and the cgroup's count them only later; the address-space limit counts them now)
    promised = _unwritten_host_bytes()
    measured = ((_rlimit_available_bytes(), ULIMIT), (_cgroup_minus(promised), CGROUP),
                (None if available is None else available - promised, HOST))
    limits = [(value, limit) for value, limit in measured if value is not None]
    if not limits:
        return None, HOST
    value, limit = min(limits, key=lambda pair: pair[0])  # (the first of equals)
    return max(value, 0), limit


#: live replay storage in unpinned host memory (`host_zeros`): a solo `ReplayBuffer`, a population's `MemberReplay`;
#: what each has yet to fill (its `unwritten_bytes()`) is memory promised to it
_HOST_BUFFERS: weakref.WeakSet = weakref.WeakSet()


def count_unwritten_host_storage(owner) -> None:
    """Count what `owner` (replay storage made by `host_zeros`) has yet to write, its `unwritten_bytes()`, as taken in
    later memory checks (`available_memory`), for as long as `owner` lives."""
    _HOST_BUFFERS.add(owner)


def _unwritten_host_bytes() -> int:
    """Bytes the live host replay buffers (`_HOST_BUFFERS`) will commit as they fill the rows they have not written."""
    return int(sum(buffer.unwritten_bytes() for buffer in list(_HOST_BUFFERS)))


def _cgroup_minus(promised: int) -> int | None:
    """What the memory cgroup leaves (`_cgroup_available_bytes`) less `promised` bytes, or None without a limit."""
    left = _cgroup_available_bytes()
    return None if left is None else left - promised


def _rlimit_available_bytes() -> int | None:
    """What this process's soft limits leave for a new allocation, or None without one: RLIMIT_AS (`ulimit -v`) less
    its virtual size, and RLIMIT_DATA (`ulimit -d`, which counts private writable mappings since Linux 4.7: every
    large allocation) less its data size (`/proc/self/status`'s VmSize and VmData)."""
    try:
        import resource
    except ImportError:  # (Windows)
        return None
    try:
        with open("/proc/self/status") as handle:
            status = dict(line.split(":", 1) for line in handle if ":" in line)
    except OSError:
        return None
    left = []
    for name, used in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        try:
            limit = resource.getrlimit(getattr(resource, name))[0]
            if limit != resource.RLIM_INFINITY and limit >= 0 and used in status:
                left.append(max(int(limit) - int(status[used].split()[0]) * 1024, 0))
        except (AttributeError, OSError, ValueError, IndexError):
            continue
    return min(left) if left else None


#: where Linux mounts the cgroup hierarchies (a test points it elsewhere)
CGROUP_ROOT = "/sys/fs/cgroup"
_NO_LIMIT = 2**60  # (cgroup v1 writes "no limit" as a page-rounded 2**63 - 1)


def _cgroup_available_bytes() -> int | None:
    """What the memory cgroups' limits leave (limit - usage, page cache it can reclaim not counted as used), or None
    without a limit: the least over this process's cgroup and those above it (`rlspeed.device.cgroup_directories`: a
    SLURM job's limit is on a cgroup below the root) of cgroup v2's memory.max / memory.current, else v1's
    memory.limit_in_bytes / usage_in_bytes."""
    for controller, limit_file, usage_file, reclaimable in (
            (None, "memory.max", "memory.current", "inactive_file"),
            ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")):
        left = [value for directory in cgroup_directories(CGROUP_ROOT, controller)
                if (value := _memory_left(directory, limit_file, usage_file, reclaimable)) is not None]
        if left:
            return min(left)
    return None


def _memory_left(directory: str, limit_file: str, usage_file: str, reclaimable: str) -> int | None:
    """One memory cgroup's limit less its usage (less the page cache it can reclaim), or None without a limit."""
    try:
        with open(os.path.join(directory, limit_file)) as handle:
            text = handle.read().strip()
        if text == "max" or int(text) >= _NO_LIMIT:
            return None
        limit = int(text)
        with open(os.path.join(directory, usage_file)) as handle:
            usage = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    try:
        with open(os.path.join(directory, "memory.stat")) as handle:
            stats = dict(line.split() for line in handle if line.strip())
        usage -= int(stats.get(reclaimable, 0))
    except (OSError, ValueError):
        pass
    return max(limit - usage, 0)


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


def host_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed host tensor whose pages the OS commits when they are first written: numpy's zeros (calloc: fresh
    pages read as zeros untouched), where torch.zeros writes every byte at once. A replay buffer of a million rows then
    takes the memory of the rows it holds, not its capacity, until it fills."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype, device="cpu").element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).reshape(shape)


def storage_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
                  pin: bool = False) -> torch.Tensor:
    """Zeroed replay storage on `device`: `host_zeros` in unpinned host memory (committed as rows are written), else
    torch.zeros (device memory, or pinned host memory feeding an accelerator)."""
    if torch.device(device).type == "cpu" and not pin:
        return host_zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)


class _HostStaging:
    """Host tensors, one per name, that host storage feeding an accelerator moves data through, reused from call to
    call: `take` gathers storage rows into one, `receive` copies device data into one, `to_device` copies gathered
    fields to the device. Pinned (`pin`, CUDA) they make both copies asynchronous without a per-call `pin_memory()`;
    a tensor is never written while the device may still be reading it (`to_device` records when its copies are done
    and the next `take` waits for that)."""

    def __init__(self, device: torch.device, pin: bool):
        self.device, self.pin = device, pin
        self.tensors: dict[str, torch.Tensor] = {}
        self._read = None  # CUDA event: the last `to_device` copies out of the staging tensors are done

    def _hold(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The first `shape[0]` rows of the staging tensor `name`, (re)allocated when it is too small or of another
        row shape or dtype."""
        held = self.tensors.get(name)
        if held is None or held.shape[0] < shape[0] or held.shape[1:] != shape[1:] or held.dtype != dtype:
            # (on the host by name: the caller's default device may be another, `torch.set_default_device("cuda")`)
            held = self.tensors[name] = torch.empty(shape, dtype=dtype, device="cpu", pin_memory=self.pin)
        return held[:shape[0]]

    def take(self, name: str, storage: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """`storage[index]` (host storage, int64 host index), written into the staging tensor `name`."""
        if self._read is not None:
            self._read.synchronize()  # (the previous sample's copies: long done unless samples come back to back)
            self._read = None
        return torch.index_select(storage, 0, index, out=self._hold(name, (index.shape[0], *storage.shape[1:]),
                                                                     storage.dtype))

    def receive(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """`value` copied into the staging tensor `name`, asynchronously where it is pinned: the caller synchronizes
        `value`'s device before reading it."""
        held = self._hold(name, tuple(value.shape), value.dtype)
        held.copy_(value, non_blocking=self.pin)
        return held

    def to_device(self, batch: dict) -> dict:
        """The gathered fields (staging tensors, dicts of them for Dict observations) as new tensors on the device."""
        moved = {key: map_obs(lambda v: v.to(self.device, non_blocking=self.pin, copy=True), value)
                 for key, value in batch.items()}
        if self.pin:
            self._read = torch.cuda.Event()
            self._read.record(torch.cuda.current_stream(self.device))
        return moved


def _take(name: str, storage: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`storage[index]`: a gather into a new tensor (`_HostStaging.take`'s counterpart without staging)."""
    return storage[index]


def check_masks_given(next_action_masks: torch.Tensor | None, stored: torch.Tensor | None) -> None:
    """Masks are given to `add` exactly when the buffer stores them (`stored`: its masks' storage, else None): a
    check on the host, no device read."""
    if (next_action_masks is None) != (stored is None):
        raise ValueError("next_action_masks must be given exactly when the buffer was made with mask_size")


def window_entry(obs, actions, rewards, next_obs, terminated, truncated, next_action_masks=None) -> tuple:
    """One step pending for n-step returns: (obs, actions, rewards, next_obs, terminated, done[, next_action_masks]),
    the rewards and flags as float32 (done: terminated or truncated, where the return stops)."""
    terminated = terminated.to(torch.float32)
    done = torch.maximum(terminated, truncated.to(torch.float32))
    entry = (obs, actions, rewards.to(torch.float32), next_obs, terminated, done)
    return entry if next_action_masks is None else (*entry, next_action_masks)


class ReplayBuffer:
    """Circular storage of `capacity` transitions; `sample(batch_size)` returns a dict of device tensors.

    Fields of a sample: `obs`, `actions`, `rewards`, `next_obs`, `terminated` (float 0/1), `discounts`
    (gamma**m, m = steps between obs and next_obs). The TD target is
    `rewards + discounts * (1 - terminated) * V(next_obs)`. `obs` and `next_obs` are dicts of tensors for Dict
    observations. Buffers made with `mask_size` add `next_action_masks` (bool `[B, n]`).

    `observation`: the observation space (`EnvSpec.observation_space`; each key stored in its dtype), or a shape
    stored as `obs_dtype`. `num_envs`: the rows of one step, `[num_envs, ...]` tensors in `add` (`capacity` is at
    least that); `action_shape` and `action_dtype`: one env's action; `device`: where samples are returned;
    `storage_device`: where transitions are kept (default `device`, or pinned host memory, with a warning, where the
    buffer would take more of the device's free memory than it can spare); `n_step` and `gamma`: n-step returns
    (1: one-step transitions); `mask_size`: the number of actions whose masks are stored (None: no masks).
    ValueError for a `capacity` below `num_envs` or an `n_step` below 1.
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
        action_numel = int(torch.Size(action_shape).numel())
        action_bytes = torch.empty((), dtype=action_dtype).element_size()
        # the fields every layout stores per row: rewards, terminated, discounts, the action, the next mask
        self._row_bytes = 4 * 3 + action_bytes * action_numel + (mask_size or 0)
        self.nbytes = self._storage_bytes(layout)
        # the real bytes, observations in their own dtypes (a whole number for the dense layout)
        per_row = self.nbytes / self.capacity
        self.bytes_per_transition = int(per_row) if per_row.is_integer() else per_row
        if storage_device is None:
            storage_device = self.device
            free = available_memory(self.device)[0]
            if self.device.type != "cpu" and free is not None and self.nbytes > REPLAY_MEMORY_SHARE * free:
                storage_device = torch.device("cpu")
                warnings.warn(f"Replay buffer of {size_text(self.nbytes)} does not fit in {self.device}'s free "
                              f"memory ({size_text(free)}): keeping it in pinned host memory.", stacklevel=2)
        self.storage_device = torch.device(storage_device)
        self._check_fits()
        self._pin = self.storage_device.type == "cpu" and self.device.type != "cpu" and torch.cuda.is_available()
        # host storage feeding an accelerator: samples (and the frame layout's new frames) go through reused staging
        self._staging = (_HostStaging(self.device, self._pin)
                         if self.storage_device.type == "cpu" and self.device.type != "cpu" else None)
        self._allocate_observations(layout)
        if self.storage_device.type == "cpu" and not self._pin:
            count_unwritten_host_storage(self)  # (its memory is committed as it fills)
        self.actions = self._zeros(*action_shape, dtype=action_dtype)
        self.rewards = self._zeros()
        self.terminated = self._zeros()
        self.discounts = self._zeros()
        # the actions allowed at next_obs (masked envs only; None otherwise)
        self.next_action_masks = self._zeros(mask_size, dtype=torch.bool) if mask_size else None
        if self.n_step == 1:
            self.discounts.fill_(gamma)  # every 1-step transition discounts by gamma: written once, here
        self.pos = 0  # next row to write (host counter: advances by num_envs per add, never read from the device)
        self.size = 0
        self._rows = torch.arange(self.num_envs, device=self.storage_device)
        self._window: list[tuple[torch.Tensor, ...]] = []  # pending steps for n-step returns
        if self.n_step > 1:
            self._powers = gamma ** torch.arange(self.n_step, device=self.device, dtype=torch.float32)

    #: How observations are stored (`describe`, `summary`): whole observations, twice per row
    layout = "dense"

    def _storage_bytes(self, layout) -> int:
        """Bytes the storage will take: here an observation and a next observation per row, each in its dtype."""
        return (2 * layout_nbytes(layout) + self._row_bytes) * self.capacity

    def _zeros(self, *shape, dtype=torch.float32, rows: int | None = None) -> torch.Tensor:
        """Zeroed storage of `rows` (default: capacity) rows, allocated pinned where it is host memory feeding an
        accelerator (pin_memory() on a made tensor would hold a second copy while it copies). Unpinned host storage
        is memory the OS commits as rows are written (`host_zeros`), as Stable-Baselines3's numpy buffers are."""
        return storage_zeros((self.capacity if rows is None else rows, *shape), dtype, self.storage_device, self._pin)

    def _allocate_observations(self, layout) -> None:
        """`obs` and `next_obs` storage: one tensor each, or one per key of Dict observations."""
        if isinstance(layout, dict):
            self.obs = {key: self._zeros(*shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
            self.next_obs = {key: self._zeros(*shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
        else:
            self.obs = self._zeros(*layout[0], dtype=layout[1])
            self.next_obs = self._zeros(*layout[0], dtype=layout[1])

    def __len__(self) -> int:
        return self.size

    def unwritten_bytes(self) -> int:
        """Bytes of host storage this buffer has yet to write (its pages not committed yet: `host_zeros`)."""
        return int(self.nbytes * (1 - min(self.size, self.capacity) / self.capacity))

    def _nbytes_at(self, capacity: int) -> int:
        """The bytes this layout would take at another `capacity` (the dense layout: the same bytes per row)."""
        return int(capacity * self.bytes_per_transition)

    def _check_fits(self) -> None:
        """UserError (`refuse_unless_fits`), with the largest capacity that fits, when the storage needs more than the
        share of the storage device's available memory that a buffer may take (allocating it anyway fails later, or is
        killed)."""
        def advice(budget: int) -> str:
            # (bytes per row and bytes whatever the capacity: the frame layouts' pool holds frames beyond one per row)
            fixed = self._nbytes_at(0)
            per_row = max((self._nbytes_at(16 * self.num_envs) - fixed) / (16 * self.num_envs), 1e-9)
            fits = max(int(max(budget - fixed, 0) // per_row) // self.num_envs * self.num_envs, 0)
            while fits >= self.num_envs and self._nbytes_at(fits) > budget:  # (a whole number of frames: round down)
                fits -= self.num_envs
            return (f"the largest replay buffer that fits is {fits:,} transitions (buffer_size={fits}, on the command "
                    f"line --set buffer_size={fits})" if fits >= self.num_envs
                    else "not even one transition per env fits: free memory or use smaller observations")

        refuse_unless_fits(self.nbytes, self.storage_device, f"A replay buffer of {self.capacity:,} transitions",
                           advice)

    def describe(self) -> str:
        """Footprint, placement and layout, e.g. 'replay buffer: 1,000,000 transitions, 76.3 MiB on cpu, 80 bytes
        per transition (dense: observation and next observation stored whole)'."""
        where = str(self.storage_device) + (" (pinned host memory)" if self.storage_device != self.device else "")
        return (f"replay buffer: {self.capacity:,} transitions, {self.nbytes / 2**20:.1f} MiB on {where}, "
                f"{self.bytes_per_transition:,.0f} bytes per transition ({self._layout_text()})")

    def _layout_text(self) -> str:
        return "dense: observation and next observation stored whole"

    def summary(self) -> dict[str, typing.Any]:
        """The replay buffer's layout and footprint as JSON-ready values (for summary.json)."""
        return {"layout": self.layout, "capacity": self.capacity, "bytes_per_transition": self.bytes_per_transition,
                "nbytes": self.nbytes, "storage_device": str(self.storage_device)}

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
            terminated: torch.Tensor, truncated: torch.Tensor, next_action_masks: torch.Tensor | None = None,
            reset_rows=None) -> None:
        """Store one step of all N envs: `obs`, `actions`, `rewards` and `next_obs` as `[N, ...]` tensors, with
        `terminated` (the episode ended in a terminal state: no bootstrap from `next_obs`) and `truncated` (it ended
        otherwise, a time limit: bootstrapped) `[N]` bool or 0/1; an n-step return stops at either. `next_obs` is
        `info["final_obs"]` (the true last obs of finished rows); `next_action_masks` (bool `[N, n]`, buffers made
        with `mask_size` only) the actions allowed there. `reset_rows` (the adapters' host `info["final_rows"]`: the
        rows the env restarted) matters to the frame layout only (`FrameStackReplayBuffer`)."""
        self._check_step(actions, rewards)
        check_masks_given(next_action_masks, self.next_action_masks)
        if self.n_step == 1:
            self._write(obs, actions, rewards, next_obs, terminated,  # the copy converts bool to float
                        next_action_masks=next_action_masks)
            return
        self._window.append(window_entry(obs, actions, rewards, next_obs, terminated, truncated, next_action_masks))
        if len(self._window) == self.n_step:
            self._write(*self._n_step_transition())
            self._window.pop(0)

    def extend(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
               terminated: torch.Tensor, truncated: torch.Tensor,
               next_action_masks: torch.Tensor | None = None, reset_rows: list | None = None) -> None:
        """Store T consecutive steps of all N envs (every argument `[T, N, ...]`; `reset_rows` one entry per step),
        as T calls of `add` would, in the same rows: one copy per field for all of them (dense 1-step buffers;
        others add step by step)."""
        check_masks_given(next_action_masks, self.next_action_masks)
        steps = obs_batch_size(obs)
        if self.n_step > 1 or steps * self.num_envs > self.capacity or self.layout != "dense":
            for t in range(steps):
                def row(v: torch.Tensor, t: int = t) -> torch.Tensor:
                    return v[t]

                self.add(map_obs(row, obs), actions[t], rewards[t], map_obs(row, next_obs), terminated[t],
                         truncated[t], None if next_action_masks is None else next_action_masks[t],
                         None if reset_rows is None else reset_rows[t])
            return
        self._write(*(map_obs(lambda v: v.flatten(0, 1), value)
                      for value in (obs, actions, rewards, next_obs, terminated)),
                    next_action_masks=None if next_action_masks is None else next_action_masks.flatten(0, 1))

    def _check_step(self, actions, rewards) -> None:
        """UserError unless `add` got torch tensors of one step of all `num_envs` envs (a shape check on the host)."""
        if not (isinstance(actions, torch.Tensor) and isinstance(rewards, torch.Tensor)):
            raise UserError("ReplayBuffer.add takes torch tensors [num_envs, ...] in the order obs, actions, rewards, "
                            "next_obs, terminated, truncated (not NumPy arrays, nor Stable-Baselines3's order obs, "
                            "next_obs, action, reward, done, infos): convert them with torch.as_tensor.")
        if tuple(rewards.shape) != (self.num_envs,) or actions.shape[:1] != (self.num_envs,):
            raise UserError(f"ReplayBuffer.add stores one step of all {self.num_envs} envs the buffer was made for: "
                            f"rewards of shape ({self.num_envs},) and actions of {self.num_envs} rows, got "
                            f"{tuple(rewards.shape)} and {tuple(actions.shape)}.")

    def _n_step_transition(self):
        """The n-step transition starting at the oldest pending step, for all N envs at once."""
        obs, actions = self._window[0][0], self._window[0][1]
        rewards = torch.stack([w[2] for w in self._window])  # [n, N] (fewer steps: `_flush_window`)
        next_obs = (torch.stack([w[3] for w in self._window]) if not isinstance(obs, dict)  # [n, N, ...]
                    else {key: torch.stack([w[3][key] for w in self._window]) for key in obs})
        terminated = torch.stack([w[4] for w in self._window])
        done = torch.stack([w[5] for w in self._window])
        # alive[k] = 1 while no episode end happened before step k: later steps belong to the next episode.
        alive = torch.cumprod(torch.cat((torch.ones_like(done[:1]), 1.0 - done[:-1])), dim=0)
        returns = (self._powers[:len(self._window)].unsqueeze(1) * alive * rewards).sum(0)
        last = (alive.sum(0) - 1).long()  # index of the last step used: the first done, else n - 1
        columns = torch.arange(last.shape[0], device=last.device)
        discounts = self.gamma ** (last + 1).to(torch.float32)
        last_obs = map_obs(lambda v: v[last, columns], next_obs)
        masks = None
        if self.next_action_masks is not None:  # the mask at the observation the transition bootstraps from
            masks = torch.stack([w[6] for w in self._window])[last, columns]
        return obs, actions, returns, last_obs, terminated[last, columns], discounts, masks

    def storage_tensors(self) -> dict[str, torch.Tensor]:
        """The storage tensors by name, as checkpoints hold them: one per field, one per key of Dict observations
        (`obs.image`, ...); no `next_action_masks` in unmasked buffers."""
        tensors = {}
        for name in ("obs", "next_obs", "actions", "rewards", "terminated", "discounts", "next_action_masks"):
            storage = getattr(self, name)
            if isinstance(storage, dict):
                tensors.update({f"{name}.{key}": part for key, part in storage.items()})
            elif storage is not None:
                tensors[name] = storage
        return tensors

    def _stored_rows(self) -> int:
        """Rows 0..k-1 of the storage that hold transitions (all rows that were ever written)."""
        return self.size

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        """What a checkpoint keeps (`save_replay_buffer`): the written rows of every storage tensor and the steps
        still waiting for their n-step return (tensors), and the write position and counts (JSON values)."""
        rows = self._stored_rows()
        tensors = {name: storage[:rows] for name, storage in self.storage_tensors().items()}
        for step, entry in enumerate(self._window):  # n-step transitions still waiting for their later steps
            for i, value in enumerate(entry):
                if isinstance(value, dict):  # Dict observations: one tensor per key
                    tensors.update({f"window.{step}.{i}.{key}": part for key, part in value.items()})
                else:
                    tensors[f"window.{step}.{i}"] = value
        return tensors, {"pos": self.pos, "size": self.size, "rows": rows, "capacity": self.capacity,
                         "window": len(self._window), "layout": self.layout, "n_step": self.n_step, "gamma": self.gamma,
                         "num_envs": self.num_envs}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict) -> str | None:
        """Restore `state_dict`'s output (`tensors` on any device, and `meta`, its JSON values); returns why it
        cannot (another layout, other observation keys, shapes or dtypes that do not convert without loss), else None.
        The dense layout takes a buffer of another capacity too: its newest transitions, oldest first from row 0 (as
        many as fit)."""
        storage = self.storage_tensors()
        missing = set(storage) - set(tensors)
        if meta.get("layout", "dense") == self.layout and missing == {"next_action_masks"}:
            return ("it holds no action masks, and this model's env gives them (make the buffer with mask_size, "
                    "the number of actions)")
        layout = meta.get("layout", "dense")
        if layout == "dense" != self.layout:  # (a ReplayBuffer of demonstrations, for an image env's model)
            return (f"it stores observations whole (a ReplayBuffer's dense layout), and this model's buffer stores "
                    f"{'each frame' if self.layout == 'frames' else 'each observation'} once: make the model with "
                    "frame_dedup=False (--set frame_dedup=false) to take it")
        if layout != self.layout or missing:
            return "it holds another replay layout or other observation keys than this model's"
        capacity = int(meta.get("capacity", self.capacity))
        if capacity != self.capacity and self.layout != "dense":
            return f"it holds a buffer of {capacity:,} transitions, and this one takes {self.capacity:,}"
        for name, target in storage.items():
            source = tensors[name]
            if tuple(source.shape[1:]) != tuple(target.shape[1:]):
                return (f"its {name} rows have shape {tuple(source.shape[1:])}, and this model's "
                        f"{tuple(target.shape[1:])}")
            if source.dtype.is_floating_point and not target.dtype.is_floating_point:
                return f"its {name} holds {source.dtype} values, and this model stores {target.dtype}"
        if meta.get("n_step", self.n_step) != self.n_step:
            return f"it holds {meta['n_step']}-step transitions, and this model takes {self.n_step}-step ones"
        if self.n_step > 1 and meta.get("gamma", self.gamma) != self.gamma:
            return (f"its {self.n_step}-step returns were summed with gamma {meta['gamma']}, and this model's gamma is "
                    f"{self.gamma}")
        rows, pos, size = int(meta.get("rows", meta["size"])), int(meta["pos"]), int(meta["size"])
        order = None
        if capacity != self.capacity:  # (the newest rows that fit, oldest first: a full ring's oldest is at pos)
            kept = min(size, self.capacity)
            order = (torch.arange(size - kept, size, device="cpu") + pos - size) % capacity  # (not the default device)
            rows = size = kept
            pos = size % self.capacity
        with torch.no_grad():
            for name, target in storage.items():
                source = tensors[name]
                target[:rows].copy_(source if order is None else source[order.to(source.device)])
            if self.n_step == 1:  # (one-step rows discount by this model's gamma, whichever the saved run had)
                self.discounts.fill_(self.gamma)
        self.pos, self.size = pos, size

        def entry(step: int, i: int):
            name = f"window.{step}.{i}"
            if name in tensors:  # (copies: the tensors given may be views of a file, `load_checkpoint(mapped=True)`)
                return tensors[name].to(self.device, copy=True)
            return {key[len(name) + 1:]: value.to(self.device, copy=True) for key, value in tensors.items()
                    if key.startswith(name + ".")}

        width = 6 if self.next_action_masks is None else 7  # (masked runs: the next mask last)
        self._window = [tuple(entry(step, i) for i in range(width)) for step in range(int(meta.get("window", 0)))]
        if int(meta.get("num_envs", self.num_envs)) != self.num_envs:  # (steps waiting for their n-step return
            self.restart_episodes()  # continue only in as many envs as they came from)
        return None

    def restart_episodes(self) -> None:
        """The envs were reset outside the step loop (or the next steps added do not continue the last ones: a
        demonstration added by hand): steps still waiting for their n-step return would be joined to the new
        episodes' rewards. In the dense layout they are stored now, each with the return of the steps after it
        (`_flush_window`); the frame layouts drop them."""
        if self.layout == "dense":
            self._flush_window()
        self._window.clear()

    def _flush_window(self) -> None:
        """Store the steps waiting for their n-step return, each as an m-step transition (m < n) over the steps
        after it: ending where its episode ended, else bootstrapping from the last step's next observation, as a
        truncated episode does."""
        while self._window:
            self._write(*self._n_step_transition())
            self._window.pop(0)

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

    def gather(self, index: torch.Tensor, staging: _HostStaging | None = None) -> dict[str, torch.Tensor]:
        """The transitions in storage rows `index` (int64 on the storage device), on the storage device: new tensors,
        or with `staging` (host storage) the staging tensors, which the next sample overwrites."""
        take = _take if staging is None else staging.take
        batch = {}
        for name in ("obs", "actions", "rewards", "next_obs", "terminated", "discounts", "next_action_masks"):
            storage = getattr(self, name)
            if isinstance(storage, dict):  # Dict observations: one tensor per key
                batch[name] = {key: take(f"{name}.{key}", part, index) for key, part in storage.items()}
            elif storage is not None:
                batch[name] = take(name, storage, index)
        return batch

    def _relabel(self, batch: dict, index: torch.Tensor, generator: torch.Generator | None) -> dict:
        """The sampled `batch` (rows `index` of the storage) as training takes it: unchanged here; Hindsight
        Experience Replay gives some rows other goals (`rlspeed.buffers.her.HerReplayBuffer`)."""
        return batch

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """`batch_size` stored transitions drawn uniformly (with replacement; from `generator` where given, else
        torch's global generator), as a dict of tensors on `device` (the fields in the class docstring).
        RuntimeError when the buffer is empty."""
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
        # the stored rows are the `size` rows before `pos` (ring order); all of them in rows 0..size-1 unless the
        # frame layout gave up its oldest rows (`FrameStackReplayBuffer`)
        start = 0 if self.size == self.capacity else (self.pos - self.size) % self.capacity
        if start:
            index = (index + start) % self.capacity
        if self._staging is not None:  # host storage: gathered into the staging tensors, copied from there
            batch = self._staging.to_device(self.gather(index, self._staging))
        else:
            batch = self.gather(index)
            if self.storage_device != self.device:
                batch = {key: map_obs(lambda v: v.to(self.device), value) for key, value in batch.items()}
        batch = self._relabel(batch, index, generator)
        if prepare is not None:
            batch = prepare(batch)
        if count == 1:
            return [batch]
        split = {key: _split(value, batch_size) for key, value in batch.items()}
        return [{key: split[key][i] for key in batch} for i in range(count)]


class FrameStackReplayBuffer(ReplayBuffer):
    """The replay buffer for frame-stacked images (uint8 `[k, H, W]`, the last k frames of an episode, newest last,
    as Atari's `FrameStackObservation` gives them): each frame is stored once, in a pool of frames, and the rows
    hold the pool indices of their observation's and next observation's k frames (int32 `[k]` each), from which
    `gather` rebuilds the stacks. Where the dense layout keeps 2k frames per transition, this keeps one (the newest
    frame of its next observation) plus, per restarted episode, the k frames of its first observation, as given:
    stacks are rebuilt exactly, across episode starts (whatever the env padded them with), wrap-around and n-step
    returns, with no host read per step.

    It relies on what frame stacking guarantees: a next observation is the observation shifted by one frame with a
    new frame last (checked on the first step), and a row's next step starts from its next observation unless the
    env restarted it (`add`'s `reset_rows`; without them, every row that terminated or truncated counts as
    restarted, which costs only memory). Frames of restarted episodes come from a reserve of the pool
    (`capacity // 16` frames beyond one per row); if episodes restart so often that it runs out, the oldest
    transitions are given up (`evicted` counts them, `describe` says so) rather than overwritten in place.
    """

    layout = "frames"
    #: Extra pool frames for the first observations of restarted episodes, as a share of the capacity
    RESERVE_SHARE = 1 / 16

    def __init__(self, capacity: int, num_envs: int, observation: gym.spaces.Box,
                 action_shape: tuple[int, ...], action_dtype: torch.dtype, device: torch.device | str,
                 n_step: int = 1, gamma: float = 0.99, storage_device: torch.device | str | None = None,
                 mask_size: int | None = None):
        self.stack, self._frame_shape, self._frame_dtype = self._frames_of(observation)
        self.pool_size = self.pool_frames(capacity, num_envs, self.stack, n_step)
        super().__init__(capacity, num_envs, observation, action_shape, action_dtype, device, n_step=n_step,
                         gamma=gamma, storage_device=storage_device, mask_size=mask_size)
        self._frames_written = 0  # frames ever written to the pool (host counter); frame f lives in slot f % pool_size
        self._stack_slots: torch.Tensor | None = None  # pool slots of each env's current observation [N, k]
        self._stack_serials: np.ndarray | None = None  # the same frames' numbers (host, to know what is still used)
        self._restarted: np.ndarray | None = None  # rows whose next observation starts an episode (host)
        # the oldest frame number each pending step and each written block of rows (oldest first) still uses
        self._pending_floors: list[int] = []
        self._floors: collections.deque[list[int]] = collections.deque()  # [oldest frame used, rows]
        self._written_rows = 0  # rows 0..k-1 of the storage ever written
        self.evicted = 0  # transitions given up because the pool's reserve ran out
        self._checked = False

    @staticmethod
    def _frames_of(observation) -> tuple[int, tuple[int, ...], torch.dtype]:
        """(frames per observation, a frame's shape, its dtype) of the observations this layout stores."""
        if not frame_stacks(observation):
            raise ValueError(f"FrameStackReplayBuffer stores uint8 [k, H, W] frame stacks, not {observation}")
        return int(observation.shape[0]), tuple(int(d) for d in observation.shape[1:]), torch.uint8

    @classmethod
    def pool_frames(cls, capacity: int, num_envs: int, stack: int, n_step: int) -> int:
        """Frames the pool holds: one per row, plus those a row's data may still need besides (the pending n-step
        steps and the stacks' older frames: k + n_step steps of every env, each step writing up to k + 1 frames), plus
        the reserve for restarted episodes."""
        return int(capacity + (stack + 1) * (stack + n_step) * num_envs + int(capacity * cls.RESERVE_SHARE))

    @classmethod
    def planned_nbytes(cls, capacity: int, num_envs: int, observation: gym.spaces.Box, action_bytes: int,
                       n_step: int = 1, mask_size: int | None = None) -> int:
        """The bytes a buffer made with these arguments allocates (`nbytes`), without making it; `action_bytes`:
        one action's (its element size times its length)."""
        stack, frame_shape, dtype = cls._frames_of(observation)
        pool = cls.pool_frames(capacity, num_envs, stack, n_step)
        return cls._layout_bytes(capacity, pool, stack, _bytes(frame_shape, dtype),
                                 4 * 3 + action_bytes + (mask_size or 0))

    @staticmethod
    def _layout_bytes(capacity: int, pool: int, stack: int, frame_bytes: int, row_bytes: int) -> int:
        """The frame layout's bytes: `pool` frames of `frame_bytes` each, and per row the int32 pool indices of two
        stacks of `stack` frames and the other fields (`row_bytes`: reward, flags, action, mask)."""
        return pool * frame_bytes + (2 * stack * 4 + row_bytes) * capacity

    @classmethod
    def planned_terms(cls, num_envs: int, observation: gym.spaces.Box, action_bytes: int, n_step: int = 1,
                      mask_size: int | None = None) -> tuple[float, int]:
        """`planned_nbytes` as bytes per transition and bytes whatever the capacity: `per_row * capacity + fixed`
        is never less than it (the reserve's frames are a whole number), and equal where the capacity is a
        multiple of 16."""
        fixed = cls.planned_nbytes(0, num_envs, observation, action_bytes, n_step, mask_size)
        return (cls.planned_nbytes(16, num_envs, observation, action_bytes, n_step, mask_size) - fixed) / 16, fixed

    def _storage_bytes(self, layout) -> int:
        return self._nbytes_at(self.capacity)

    def _nbytes_at(self, capacity: int) -> int:
        return self._layout_bytes(capacity, self.pool_frames(capacity, self.num_envs, self.stack, self.n_step),
                                  self.stack, _bytes(self._frame_shape, self._frame_dtype), self._row_bytes)

    def _allocate_observations(self, layout) -> None:
        # `obs` and `next_obs` hold pool indices; `frames` the pool
        self.frames = self._zeros(*self._frame_shape, dtype=self._frame_dtype, rows=self.pool_size)
        self.obs = self._zeros(self.stack, dtype=torch.int32)
        self.next_obs = self._zeros(self.stack, dtype=torch.int32)

    def _layout_text(self) -> str:
        text = self._stored_text()
        if self.evicted:
            text += (f"; {self.evicted:,} transitions given up early because episodes restarted more often than the "
                     "frame reserve allows")
        return text

    def _stored_text(self) -> str:
        return f"frames: each frame stored once, stacks of {self.stack} rebuilt at sampling"

    def summary(self) -> dict[str, typing.Any]:
        return {**super().summary(), "frames_per_stack": self.stack, "pool_frames": self.pool_size,
                "evicted": self.evicted}

    # --- writing ---------------------------------------------------------------------------------------------
    def _new_frames(self, count: int) -> tuple[torch.Tensor, np.ndarray]:
        """Pool slots (int64 on the training device) and frame numbers (host) for `count` new frames, after giving
        up the oldest stored rows whose frames they would overwrite."""
        first = self._frames_written
        self._frames_written += count
        overwritten_below = self._frames_written - self.pool_size  # frames numbered below this are overwritten
        while self._floors and self._floors[0][0] < overwritten_below:
            _, rows = self._floors.popleft()
            self.size -= rows
            self.evicted += rows
        pending = self._pending_floors + ([] if self._stack_serials is None else [int(self._stack_serials.min())])
        if pending and min(pending) < overwritten_below:  # (the pool is sized so that this cannot happen)
            raise RuntimeError("frame pool too small for the pending steps")
        serials = np.arange(first, first + count, dtype=np.int64)
        slots = (torch.arange(count, device=self.device) + first) % self.pool_size
        return slots, serials

    def _put_frames(self, pieces: list[tuple[torch.Tensor, np.ndarray, torch.Tensor]]) -> None:
        """Write new frames (slots, frame numbers, frames `[n, H, W]` per piece) to their pool slots. Host storage
        feeding an accelerator: each piece's frames come over in one asynchronous copy into reused (pinned) staging,
        all waited for once, and the slots are the frame numbers' (host) rather than a copy of the device's."""
        if self._staging is None:
            for slots, _, frames in pieces:
                self.frames.index_copy_(0, slots.to(self.storage_device), frames.to(self.storage_device))
            return
        staged = [(torch.from_numpy(serials % self.pool_size), self._staging.receive(f"frames.{i}", frames))
                  for i, (_, serials, frames) in enumerate(pieces)]
        synchronize(pieces[0][2].device)  # the copies have arrived before the host reads them
        for slots, frames in staged:
            self.frames.index_copy_(0, slots, frames)

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
            terminated: torch.Tensor, truncated: torch.Tensor, next_action_masks: torch.Tensor | None = None,
            reset_rows=None) -> None:
        """Store one step of all N envs (see `ReplayBuffer.add`): the newest frame of each next observation, and
        the whole first observation of rows the env restarted on the previous step."""
        self._check_step(actions, rewards)
        if not self._checked:  # once: the observations are frame stacks (a next one is the obs shifted by a frame)
            if not torch.equal(next_obs[:, :-1], obs[:, 1:]):  # ok-sync (first step only)
                raise ValueError("these observations are not frame stacks (a next observation is not the observation "
                                 "shifted by one frame): use the dense replay layout (frame_dedup=False)")
            self._checked = True
        # 1. rows whose observation starts an episode (or that the buffer has not seen): all k frames, as given
        fresh = np.arange(self.num_envs) if self._stack_slots is None else self._restarted
        pieces = []  # the new frames, written together at the end of step 2
        if fresh is not None and len(fresh):
            slots, serials = self._new_frames(len(fresh) * self.stack)
            slots, serials = slots.view(len(fresh), self.stack), serials.reshape(len(fresh), self.stack)
            rows = torch.as_tensor(fresh, device=self.device)
            pieces.append((slots.flatten(), serials.reshape(-1), obs[rows.to(obs.device)].flatten(0, 1)))
            if self._stack_slots is None:
                self._stack_slots, self._stack_serials = slots, serials
            else:
                self._stack_slots = self._stack_slots.index_copy(0, rows, slots)
                self._stack_serials[fresh] = serials
        # 2. every row's next observation: its observation's frames but the oldest, and one new frame
        obs_slots, obs_serials = self._stack_slots, self._stack_serials
        slots, serials = self._new_frames(self.num_envs)
        pieces.append((slots, serials, next_obs[:, -1]))
        self._put_frames(pieces)
        self._stack_slots = torch.cat((obs_slots[:, 1:], slots.unsqueeze(1)), dim=1)
        self._stack_serials = np.concatenate((obs_serials[:, 1:], serials[:, None]), axis=1)
        if reset_rows is None:  # not told which rows restarted: every finished one (exact, a few frames more)
            reset_rows = torch.nonzero(terminated | truncated).flatten().cpu().numpy()  # ok-sync (no host rows)
        self._restarted = np.asarray(reset_rows, dtype=np.int64)
        self._pending_floors.append(int(obs_serials.min()))
        super().add(obs_slots.to(torch.int32), actions, rewards, self._stack_slots.to(torch.int32), terminated,
                    truncated, next_action_masks)
        if len(self._pending_floors) >= self.n_step:  # (the n-step window was written, or is still filling)
            self._pending_floors = self._pending_floors[-(self.n_step - 1):] if self.n_step > 1 else []

    def _write(self, obs, actions, rewards, next_obs, terminated, discounts=None, next_action_masks=None) -> None:
        count = rewards.shape[0]
        # the rows this write overwrites were the oldest stored ones: they leave the record of frames in use (a block
        # may go in part, when the capacity is not a multiple of the rows per write)
        overwritten = self.size + count - self.capacity
        while overwritten > 0:
            oldest = self._floors[0]
            gone = min(overwritten, oldest[1])
            oldest[1] -= gone
            overwritten -= gone
            if oldest[1] == 0:
                self._floors.popleft()
        super()._write(obs, actions, rewards, next_obs, terminated, discounts, next_action_masks)
        self._floors.append([self._pending_floors[0], count])
        self._written_rows = min(self._written_rows + count, self.capacity)

    def restart_episodes(self) -> None:
        """The envs were reset outside the step loop: pending n-step steps are dropped, and the next observation of
        every row is stored whole."""
        super().restart_episodes()
        self._pending_floors = []
        self._stack_slots = self._stack_serials = self._restarted = None

    # --- reading ---------------------------------------------------------------------------------------------
    def gather(self, index: torch.Tensor, staging: _HostStaging | None = None) -> dict[str, torch.Tensor]:
        """The transitions in storage rows `index`, with their observation stacks rebuilt from the frame pool (see
        `ReplayBuffer.gather` for `staging`)."""
        batch = super().gather(index, staging)  # obs and next_obs: the pool slots of their frames [B, k]
        take = _take if staging is None else staging.take
        for name in ("obs", "next_obs"):
            slots = batch[name]
            frames = take(f"{name}.frames", self.frames, slots.flatten().long())
            batch[name] = frames.view(*slots.shape, *self.frames.shape[1:])
        return batch

    def _stored_rows(self) -> int:
        return self._written_rows

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        """`ReplayBuffer.state_dict` plus the frames in use and the pool's counters. A restored buffer stores the
        next observation of every row whole, as after `restart_episodes` (the env may have restarted meanwhile)."""
        tensors, meta = super().state_dict()
        tensors["frames"] = self.frames[:min(self._frames_written, self.pool_size)]
        meta.update(frames_written=self._frames_written, floors=[list(f) for f in self._floors],
                    pending_floors=list(self._pending_floors), evicted=self.evicted, pool_size=self.pool_size)
        return tensors, meta

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict) -> str | None:
        if meta.get("layout") == self.layout and meta.get("pool_size") != self.pool_size:
            return "its frame pool has another size (other num_envs or n_step)"
        reason = super().load_state_dict(tensors, meta)
        if reason is not None:
            return reason
        frames = tensors["frames"]
        with torch.no_grad():
            self.frames[:len(frames)].copy_(frames)
        self._frames_written = int(meta["frames_written"])
        self._floors = collections.deque([int(a), int(b)] for a, b in meta["floors"])
        self._pending_floors = [int(f) for f in meta["pending_floors"]]
        self._written_rows, self.evicted = int(meta["rows"]), int(meta["evicted"])
        self._stack_slots = self._stack_serials = self._restarted = None
        self._checked = True
        return None


class SharedObservationReplayBuffer(FrameStackReplayBuffer):
    """The replay buffer for images that are not frame stacks (uint8 or bool `[H, W, C]` or `[C, H, W]`: MinAtar,
    a camera; `image_space`): each observation is stored once, a transition's next observation being the next
    step's observation of its row, as Stable-Baselines3's `optimize_memory_usage` stores them, but exactly across
    episode starts and wrap-around: a row restarted by its env stores its first observation too
    (`FrameStackReplayBuffer` with one-frame stacks, the whole observation being the frame). The pool holds a
    quarter more observations than rows, for those first observations (episodes of 4 steps or more on average fit
    without giving up rows): about 5/8 of the dense layout's bytes.

    It relies on a row's next step starting from its next observation unless the env restarted the row, which the
    batched env contract gives (same-step autoreset, `final_obs`); the second step checks it, and refuses an env
    that breaks it (use `frame_dedup=False`).
    """

    layout = "observations"
    RESERVE_SHARE = 1 / 4

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._previous_next: torch.Tensor | None = None  # the first step's next observations, for the check

    @staticmethod
    def _frames_of(observation) -> tuple[int, tuple[int, ...], torch.dtype]:
        if not image_space(observation):
            raise ValueError(f"SharedObservationReplayBuffer stores uint8 or bool images, not {observation}")
        return 1, tuple(int(d) for d in observation.shape), observation_layout(observation)[1]

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
            terminated: torch.Tensor, truncated: torch.Tensor, next_action_masks: torch.Tensor | None = None,
            reset_rows=None) -> None:
        """Store one step of all N envs (see `ReplayBuffer.add`): each next observation, and the first observation
        of rows the env restarted on the previous step."""
        self._check_step(actions, rewards)
        if self._previous_next is not None:  # second step only: rows carried on start where they ended
            carried = np.setdiff1d(np.arange(self.num_envs), self._restarted)
            rows = torch.as_tensor(carried, device=obs.device)
            if not torch.equal(obs[rows], self._previous_next[rows]):  # ok-sync (second step only)
                raise ValueError("these observations do not continue from the previous step's next observations: "
                                 "use the dense replay layout (frame_dedup=False)")
            self._previous_next = None
        elif self._stack_slots is None and not self._checked:
            self._previous_next = next_obs.clone()
        super().add(obs.unsqueeze(1), actions, rewards, next_obs.unsqueeze(1), terminated, truncated,
                    next_action_masks, reset_rows)

    def restart_episodes(self) -> None:
        super().restart_episodes()
        self._previous_next = None  # (the envs restarted: nothing continues from the steps before)

    def _stored_text(self) -> str:
        return "observations: each stored once, a next observation being the next step's observation"

    def summary(self) -> dict[str, typing.Any]:
        summary = super().summary()
        del summary["frames_per_stack"]
        return summary

    def gather(self, index: torch.Tensor, staging: _HostStaging | None = None) -> dict[str, torch.Tensor]:
        batch = super().gather(index, staging)
        return {**batch, "obs": batch["obs"].squeeze(1), "next_obs": batch["next_obs"].squeeze(1)}


def _bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return int(np.prod(shape)) * torch.empty((), dtype=dtype, device="cpu").element_size()


def layout_nbytes(layout) -> int:
    """Bytes of one observation of an `observation_layout` (all keys of a Dict's)."""
    parts = layout.values() if isinstance(layout, dict) else (layout,)
    return sum(_bytes(shape, dtype) for shape, dtype in parts)


def image_space(observation) -> bool:
    """Whether an observation space is a uint8 or bool image Box (rank 3, channels first or last). Frame stacks are
    images too; where the env says its channels are consecutive frames (`rlspeed.envs.atari.stacked_frames`),
    `FrameStackReplayBuffer` stores them in fewer bytes."""
    return (isinstance(observation, gym.spaces.Box) and len(observation.shape) == 3
            and np.dtype(observation.dtype) in (np.uint8, np.bool_))


def frame_stacks(observation) -> bool:
    """Whether an observation space is a uint8 `[k, H, W]` Box with k > 1 (the shape of frame-stacked images; whether
    its channels really are consecutive frames is the env's to say, see `rlspeed.envs.atari.stacked_frames`)."""
    return (isinstance(observation, gym.spaces.Box) and len(observation.shape) == 3 and observation.shape[0] > 1
            and np.dtype(observation.dtype) == np.uint8)
