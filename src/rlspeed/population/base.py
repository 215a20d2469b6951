"""What every population class shares: members from seeds and hyperparameters (one value for all, or one per
member), generators in the state a solo run's has, `learn` (evaluations, targets, pruning, divergence, periodic
checkpoints) with its summary, and `save`/`resume` (a population's checkpoint: everything its run needs to continue).
A population class (`PPOPopulation`, the off-policy ones) provides the training and evaluation."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import inspect
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlspeed._version import __version__
from rlspeed.algos.base import (
    Algorithm,
    _field_names,
    build_config,
    check_verbose,
    checked_learn_values,
    default_eval_freq,
    read_switch,
    refuse_learn_keywords,
    refuse_schedule_functions,
    sb3_settings,
    with_saved_cnn,
)
from rlspeed.buffers import replay as replay_buffers
from rlspeed.buffers.replay import REPLAY_MEMORY_SHARE, refuse_unless_fits
from rlspeed.callbacks import next_due, resumed_due
from rlspeed.checkpoint import checkpoint_path, load_checkpoint, save_with_staged
from rlspeed.device import float32_default, set_training_threads, training_threads
from rlspeed.diagnostics import waiting
from rlspeed.distributed import warn_training_alone
from rlspeed.envs import NamesEnvErrors, atari
from rlspeed.envs.base import BatchedEnv, EnvWrapper, check_seed, observation_layout
from rlspeed.envs.gymnasium_env import resting_finished_rows
from rlspeed.errors import (
    CloseErrors,
    EncoderWarning,
    UnusedSettingWarning,
    UserError,
    close_errors_last,
    positive_whole,
    seconds,
)
from rlspeed.evaluation import (
    episode_step_limit,
    evaluation_env_cap,
    evaluation_seed,
    evaluation_waves,
    first_episode_step,
    refuse_unless_results_fit,
    return_statistics,
    warn_target_without_time_limit,
    warn_unfinished,
)
from rlspeed.files import size_text, write_atomic
from rlspeed.logging import (
    KeptWriter,
    ProgressBar,
    RunLogger,
    holds_metrics,
    metrics_line,
    print_beside_bars,
    refuse_other_metrics,
)
from rlspeed.nn import CNNEncoder, OneHotEncoder
from rlspeed.numerics import DIVERGED_ADVICE
from rlspeed.population.normalize import MemberNormalize, MemberStatistics
from rlspeed.stats import aggregate

#: the file in a run directory that `learn(run_dir=...)` writes and `rlspeed train --seeds ... --resume` reads
CHECKPOINT_NAME = "checkpoint.safetensors"


def _seed_text(seeds) -> str:
    """Seeds as a short text for messages (the first few, and how many)."""
    seeds = list(seeds or [])
    shown = ", ".join(map(str, seeds[:6]))
    return shown + (f", ... ({len(seeds)} in all)" if len(seeds) > 6 else "")


#: True within `shared_seeds`: populations built then may give members the same seed
_SHARED_SEEDS: contextvars.ContextVar[bool] = contextvars.ContextVar("shared_seeds", default=False)


@contextlib.contextmanager
def shared_seeds() -> Iterator[None]:
    """Within it, populations being built take a seed given more than once (`check_seeds` refuses it otherwise):
    members of one seed start from the same weights and draw the same env and sampling streams, so that members of
    different hyperparameters are compared on common random numbers (`rlspeed tune`'s trials and the candidates of
    its confirmation). Such a population learns without a `run_dir` (metrics.csv's columns and member files are named
    by seed): its `learn(run_dir=...)` is refused."""
    token = _SHARED_SEEDS.set(True)
    try:
        yield
    finally:
        _SHARED_SEEDS.reset(token)


def check_seeds(seeds) -> list[int]:
    """`seeds` as a list of ints (each `check_seed`'s); UserError for none, a seed given twice, or something else
    than a sequence of seeds."""
    if isinstance(seeds, (int, str)) or not isinstance(seeds, Iterable):
        raise UserError(f"seeds is the members' seeds, a list or range of ints (e.g. seeds=range(4) for 4 members), "
                        f"not {seeds!r}.")
    seeds = [check_seed(seed) for seed in seeds]
    if not seeds:
        raise UserError("A population needs at least one member: pass one or more seeds.")
    if len(set(seeds)) != len(seeds) and not _SHARED_SEEDS.get():
        repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
        raise UserError(f"Seed(s) {', '.join(map(str, repeated))} given more than once: members of a population "
                        "need distinct seeds.")
    return seeds


def _seconds(value: float | None) -> float | None:
    """A clock reading as summaries give it (a single run's too): to 0.1 ms."""
    return None if value is None else round(value, 4)


#: seconds of training between a population's tries at the scale hint until it is decided (`_hint_scale`), as a
#: solo run reads its guard once per `log_interval_s` (1 s by default): the hint comes in the first seconds, not at
#: the first evaluation
HINT_EVERY_S = 1.0

#: the refusal of `save_replay_buffer` (the keyword or the attribute) for a population that keeps no replay buffer
NO_REPLAY_TO_SAVE = ("save_replay_buffer applies to populations with a replay buffer (DQN, SAC, TD3, DDPG); this one "
                     "keeps none: leave it out.")
#: options of a solo run that a population does not have, with the value that means "not used"
_SOLO_OPTIONS = {"accelerate": "off", "strategy": None, "nan_policy": "raise", "save_replay_buffer": False}


#: the hyperparameters a population refuses by their value (`split_member_values`): read as the solo model's config
#: reads them first
_REFUSED_BY_VALUE = ("target_kl", "use_sde", "use_sde_at_warmup", "her")


def _read_value(config_cls: type, key: str, value):
    """`value` of `key` as `config_cls`'s config reads it; a per-member list (or array) element by element, one
    value where all read the same (as the config would read that one value for every member)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        return getattr(build_config(config_cls, {key: value}), key)
    read = [_read_value(config_cls, key, v) for v in value]
    return read[0] if read and all(v == read[0] for v in read) else read


def read_as_config(config_cls: type, hyperparameters: dict, member_overrides=None) -> tuple[dict, object]:
    """`hyperparameters` with Stable-Baselines3's names and options as the config's (`sb3_settings`, the solo
    model's rule: n_steps is PPO's num_steps, whose per-member rule then applies; replay_buffer_class=HerReplayBuffer
    is her=True, which populations refuse), and it and `member_overrides` with the values of `_REFUSED_BY_VALUE` that
    `config_cls` has as its config reads them (a string 'no' is False, 'none' None: their truth value refused gSDE,
    HER or target_kl the member would not use), per-member lists element by element (one value where all read the
    same); a member's override that reads as the feature off is dropped (it is what every member has). UserError, the
    model's sentence, for a value the config refuses."""
    fields = _field_names(config_cls).keys() & set(_REFUSED_BY_VALUE)
    read = sb3_settings(config_cls, hyperparameters)
    for key in fields & set(read):
        read[key] = _read_value(config_cls, key, read[key])
    if not isinstance(member_overrides, (list, tuple)):
        return read, member_overrides
    overrides_read = []
    for overrides in member_overrides:
        if isinstance(overrides, dict):
            overrides = {key: _read_value(config_cls, key, value) if key in fields else value
                         for key, value in overrides.items()}
            overrides = {key: value for key, value in overrides.items() if key not in fields or _uses(key, value)}
        overrides_read.append(overrides)
    return read, overrides_read


def _uses(key: str, value) -> bool:
    """Whether `value` of a `_REFUSED_BY_VALUE` key (read as the config reads it; a list: any member's) turns
    its feature on (target_kl: any value but None; the others: a true one)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return any(v is not None if key == "target_kl" else bool(v) for v in values)


def split_member_values(hyperparameters: dict, member_overrides, size: int, per_member: Sequence[str],
                        known: Collection[str] | None = None) -> list[dict]:
    """The K members' hyperparameter dicts: a value given as a list (or tensor) of K values is per member, allowed
    for `per_member` keys only (every other key changes shapes or the loop, so is one value for all; a key outside
    `known`, what the solo model takes, is passed on as one value, for the solo model to refuse); `net_arch` is
    one value (a list of lists would be per member: refused). `member_overrides` (K dicts) sets single members'
    values (same rule). UserError for a solo run's option populations do not have (`accelerate`, `strategy`,
    `nan_policy`, `save_replay_buffer` other than their defaults): the solo models would take it, the population
    would not."""
    # (a feature is refused where any member would have it: the values for all, or one member's override)
    given = [hyperparameters, *(overrides for overrides in member_overrides if isinstance(overrides, dict))
             ] if isinstance(member_overrides, (list, tuple)) else [hyperparameters]
    if any(_uses("target_kl", values.get("target_kl")) for values in given):
        raise UserError("Populations do not support target_kl yet (each member would stop its epochs at another "
                        "minibatch): leave it out, or train the seeds as separate runs.")
    if any(_uses(key, values.get(key)) for values in given for key in ("use_sde", "use_sde_at_warmup")):
        raise UserError("Populations do not support gSDE (use_sde) yet: remove it (a preset's: --set use_sde=false, "
                        "where the preset tuned its other values with gSDE), or train the seeds as separate runs.")
    if any(_uses("her", values.get("her")) for values in given):
        raise UserError("Populations do not support Hindsight Experience Replay (her) yet: leave it out, or train the "
                        "seeds as separate runs.")
    for key, unused in _SOLO_OPTIONS.items():
        if key == "save_replay_buffer" and key in hyperparameters:  # (off-policy populations take it themselves)
            if read_switch(key, hyperparameters[key]):
                raise UserError(NO_REPLAY_TO_SAVE)
            continue
        if key in hyperparameters and hyperparameters[key] != unused:
            raise UserError(f"Populations do not support {key}={hyperparameters[key]!r} yet: leave it out (it would "
                            "apply to no member).")
    members: list[dict] = [dict() for _ in range(size)]
    for key, value in hyperparameters.items():
        if isinstance(value, (torch.Tensor, np.ndarray)):  # (K values as an array: a list of them)
            value = value.tolist()
        values = None
        if key == "train_freq" and isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], str):
            pass  # (SB3's (4, "step"): one value, which the config reads)
        elif key == "net_arch":
            if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
                raise UserError("net_arch changes the networks' shapes, so every member of a population must share "
                                "it: pass one net_arch.")
        elif isinstance(value, (list, tuple)) and (known is None or key in known):
            if key not in per_member:
                raise UserError(f"'{key}' cannot differ across members of a population (it changes shapes or the "
                                f"training loop): pass one value; per-member values are allowed for "
                                f"{', '.join(per_member)}.")
            if len(value) != size:
                raise UserError(f"'{key}' has {len(value)} per-member values but the population has {size} members.")
            values = list(value)
        for k in range(size):
            members[k][key] = values[k] if values is not None else value
    if member_overrides is not None:
        if not (isinstance(member_overrides, (list, tuple))
                and all(isinstance(overrides, dict) or overrides is None for overrides in member_overrides)):
            raise UserError(f"member_overrides is a list of {size} dicts (or None), one per member, e.g. "
                            "[{'learning_rate': 1e-3}, {}], not " + f"{member_overrides!r}"[:80] + ".")
        if len(member_overrides) != size:
            raise UserError(f"member_overrides has {len(member_overrides)} entries but the population has {size} "
                            "members.")
        for k, overrides in enumerate(member_overrides):
            for key, value in (overrides or {}).items():
                if key not in per_member:
                    raise UserError(f"member_overrides sets '{key}', which is no per-member hyperparameter of this "
                                    f"population (one that changes shapes or the loop, or none at all); per-member "
                                    f"values are allowed for {', '.join(per_member)}.")
                members[k][key] = value
    return members


def population_env_backend(env_id: str, env_backend: str) -> str:
    """The backend a population's envs run on: `env_backend` checked, `"auto"` resolved as a solo run resolves it
    with many envs (`rlspeed.envs.resolve_backend`): the native env (`"torch"`) where the id has one, else EnvPool's
    for Atari ids where it is installed, else `"gymnasium"` (a population steps K x N rows at once, so the native env
    is the faster choice even where a solo run with few envs on a CPU takes Gymnasium's). `"envpool"`: one EnvPool
    pool per member (`MemberEnvs`), for the ids EnvPool has; `"gymnasium-async"`: one subprocess vector env per member
    (a process per env row, as the solo's), all members' stepping at once (not for Atari games)."""
    from rlspeed.envs import resolve_backend
    from rlspeed.envs.registry import NATIVE_ENVS

    if env_backend == "auto":
        return resolve_backend(env_id, "auto")
    if env_backend not in ("torch", "gymnasium", "gymnasium-async", "envpool"):
        raise UserError(f"Populations run on env_backend 'torch' (native envs), 'gymnasium', 'gymnasium-async' or "
                        f"'envpool', not '{env_backend}'.")
    if env_backend == "gymnasium-async" and atari.atari_image_id(env_id):
        raise UserError(f"Populations of Atari games run on env_backend 'envpool' or 'gymnasium', not "
                        f"'gymnasium-async' ({env_id}).")
    if env_backend == "torch" and env_id not in NATIVE_ENVS:
        raise UserError(f"'{env_id}' has no native env (those are {', '.join(NATIVE_ENVS)}): use "
                        "env_backend='gymnasium' (--env-backend gymnasium on the command line).")
    return resolve_backend(env_id, env_backend)  # (envpool: installed, and the id is one of EnvPool's)


class MemberEnvs(BatchedEnv):
    """The members' envs as one batched env: one env per member (an EnvPool pool, which takes one seed when it is
    made; Gymnasium's subprocess envs), member k's rows block k, each block the env its solo run makes with its seed.
    Envs whose steps split (`GymnasiumEnv.splits_steps`: subprocesses) step together: every member's actions are sent
    before any result is awaited. `keep(blocks)` gives the same envs (mid-episode) of some blocks, closing the
    others."""

    def __init__(self, envs: Sequence[BatchedEnv]):
        self.envs = list(envs)
        first = self.envs[0]
        self.spec, self.device, self.backend = first.spec, first.device, first.backend
        self.atari = getattr(first, "atari", False)  # (as EnvPoolEnv says it: `atari.stacked_frames` reads it)
        self._sizes = [env.num_envs for env in self.envs]
        self.num_envs = sum(self._sizes)
        self._offsets = np.cumsum([0, *self._sizes[:-1]])  # (each block's first row)

    def _joined(self, infos: list[dict]) -> dict:
        """The envs' infos as one: tensors concatenated by rows, `final_rows` (host indices) offset by block; a key
        only some envs give is dropped, but for `is_success` (given from an env's first finished episode that
        reports it on): the blocks of envs that have not reported it yet read False, as such an adapter's rows do."""
        joined: dict = {}
        for key in dict.fromkeys(key for info in infos for key in info):
            if key == "is_success":
                values = [info.get(key, torch.zeros(size, dtype=torch.bool, device=self.device))
                          for info, size in zip(infos, self._sizes)]
            elif not all(key in info for info in infos):
                continue
            else:
                values = [info[key] for info in infos]
            if key == "final_rows":
                joined[key] = np.concatenate([rows + offset for rows, offset in zip(values, self._offsets)])
            else:
                joined[key] = torch.cat(values)
        return joined

    def reset(self, seed: Sequence[int] | None = None):
        """Reset every member's env: EnvPool's were seeded when they were made (`seed` None); Gymnasium's take
        `seed`, one per row (member k's block to its env)."""
        if seed is None:
            parts = [env.reset() for env in self.envs]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"MemberEnvs.reset takes one seed per row ({self.num_envs}), got {len(seeds)}")
            parts = [env.reset(seed=seeds[offset:offset + size])
                     for env, offset, size in zip(self.envs, self._offsets, self._sizes)]
        return torch.cat([obs for obs, _ in parts]), self._joined([info for _, info in parts])

    def step(self, actions: torch.Tensor):
        """Step each member's env with its block of `actions` (subprocess envs all at once)."""
        blocks = actions.split(self._sizes)
        if all(getattr(env, "splits_steps", False) for env in self.envs):
            for env, block in zip(self.envs, blocks):
                env.step_send(block)
            parts = [env.step_receive() for env in self.envs]
        else:
            parts = [env.step(block) for env, block in zip(self.envs, blocks)]
        return (*(torch.cat([part[i] for part in parts]) for i in range(4)), self._joined([p[4] for p in parts]))

    def disrupted(self, interrupted: bool = False) -> str | None:
        """The first reason a member's env gives that it cannot go on (`BatchedEnv.disrupted`: subprocess envs closed
        after a failed step, say), or None."""
        return next(filter(None, (env.unwrapped.disrupted(interrupted=interrupted) for env in self.envs)), None)

    def keep(self, blocks: Sequence[int]) -> MemberEnvs:
        """The envs of `blocks` (positions), as they are; the others closed."""
        for i, env in enumerate(self.envs):
            if i not in blocks:
                env.close()
        return MemberEnvs([self.envs[i] for i in blocks])

    def close(self) -> None:
        for env in self.envs:
            env.close()


def generator_like_global(device: torch.device) -> torch.Generator:
    """A generator in the state torch's global generator for `device` has now."""
    generator = torch.Generator(device=device)
    if device.type == "cpu":
        generator.set_state(torch.get_rng_state())
    else:
        generator.set_state(getattr(torch, device.type).get_rng_state(device))
    return generator


def stack_leaf(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The members' `tensors` stacked along a new leading dimension, as a new leaf that takes gradients."""
    return torch.stack([t.detach() for t in tensors]).clone().requires_grad_()


def saved_like(tensors: dict[str, torch.Tensor], name: str, like: torch.Tensor,
               any_float: bool = False) -> torch.Tensor:
    """A checkpoint's tensor `tensors[name]`, checked to have `like`'s shape and dtype (ValueError otherwise, which
    `resume` reports as a file that does not fit the population). `any_float`: a float tensor of another float dtype
    is taken in `like`'s (normalisation statistics: float64 where the device has it, float32 in older checkpoints and
    on devices without float64)."""
    saved = tensors[name]
    if any_float and saved.shape == like.shape and saved.is_floating_point() and like.is_floating_point():
        return saved.to(like.dtype)
    if saved.shape != like.shape or saved.dtype != like.dtype:
        raise ValueError(f"'{name}' is {saved.dtype} {tuple(saved.shape)}, this population's {like.dtype} "
                         f"{tuple(like.shape)}")
    return saved


def _forked_generators(device: torch.device) -> contextlib.ExitStack:
    """A context that restores, on exit, every global generator a solo model's `torch.manual_seed` reseeds: the CPU's
    and each device's of every available accelerator type (manual_seed seeds all of them, whatever `device` is)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.random.fork_rng(devices=[]))  # the CPU generator
    types = {name for name in ("cuda", "xpu", "mps", "npu")
             if getattr(getattr(torch, name, None), "is_available", lambda: False)()}
    if device.type != "cpu":
        types.add(device.type)
    for name in sorted(types):
        count = getattr(torch, name).device_count() if hasattr(getattr(torch, name), "device_count") else 1
        stack.enter_context(torch.random.fork_rng(devices=list(range(count)), device_type=name))
    return stack


#: what sets the number of a population's members, as `check_members_fit` names it in a refusal, in Python: the
#: keyword (in words: the sentence reads "A population of 4 members (one per seed of seeds) ..."), an example of it
#: that asks for `{fits}` members (`{last}`: the last seed of a range from 0), and how a `{buffer}` buffer_size is given
SEEDS_KEYWORD = ("one per seed of seeds", "seeds=range({fits})", "buffer_size={buffer}")
#: the same on the command line (`rlspeed train --seeds`, which passes it to `planned_timesteps`)
SEEDS_OPTION = ("--seeds", "--seeds 0-{last}", "--set buffer_size={buffer}")

#: what the caller of a population's build knows before the members are built (`planned_timesteps`): the env steps
#: per member it will train for (the estimate of a member, `check_members_fit`, then counts the replay buffer `learn`
#: allocates), whether a long build shows its progress, the most members the caller builds populations of (None: this
#: build's), and what sets that number (`SEEDS_KEYWORD`'s form: a population made in Python names its keywords)
_BUILD_PLAN: contextvars.ContextVar[tuple[int | None, bool, int | None, tuple[str, str, str]]] = contextvars.ContextVar(
    "build_plan", default=(None, True, None, SEEDS_KEYWORD))

#: a loop that would take longer than this (seconds: a population's members built, a study's trials asked for) shows
#: a bar, or where stderr is no terminal a status line every `ProgressBar.LINE_INTERVAL_S`, while it runs
BUILD_PROGRESS_S = 10.0


class LongLoopBar:
    """Counts a loop of `total` items (`step` after each) on a bar that shows only where the loop is long: where the
    second item's time says the rest would take longer than `BUILD_PROGRESS_S` (the first's holds one-off costs), a
    bar (`ProgressBar` of `desc`, `unit`) counts them from there; `enabled=False`: never. Closes the bar on exit."""

    def __init__(self, total: int, desc: str, unit: str, enabled: bool = True):
        self.total, self.desc, self.unit, self.enabled = int(total), desc, unit, enabled
        self.done, self.bar = 0, None
        self._last = time.perf_counter()

    def __enter__(self) -> LongLoopBar:
        self._last = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.bar is not None:
            self.bar.close()

    def step(self) -> None:
        """One more item done."""
        now, self.done = time.perf_counter(), self.done + 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.done == 2 and self.enabled and (now - self._last) * (self.total - 2) > BUILD_PROGRESS_S:
            self.bar = ProgressBar(self.total, desc=self.desc, initial=2, unit=self.unit)
            self.bar.status_line()
        self._last = now


@contextlib.contextmanager
def planned_timesteps(total_timesteps: int | None, progress_bar: bool = True, *, members: int | None = None,
                      option: tuple[str, str, str] = SEEDS_KEYWORD) -> Iterator[None]:
    """Within it, populations being built know they will train for `total_timesteps` env steps per member, so that the
    estimate made after the first member (`check_members_fit`) counts an off-policy member's replay buffer: the
    `rlspeed train --seeds` of members whose replays do not fit together is refused before the others are built.
    `progress_bar=False`: no bar while a long build runs (`BUILD_PROGRESS_S`; `rlspeed train --no-progress`).
    `members`: the most members the caller will build populations of, which the first member of a smaller build (a
    probe of one) is checked as one of, before the caller commits to them (`rlspeed tune` before its first trial);
    `option`: what sets the number of members and buffer_size, named in a refusal (`SEEDS_KEYWORD`'s form: Python's
    keywords; `SEEDS_OPTION`, `rlspeed train --seeds`; tune's `--population`)."""
    token = _BUILD_PLAN.set((None if total_timesteps is None else int(total_timesteps), progress_bar,
                             None if members is None else int(members), option))
    try:
        yield
    finally:
        _BUILD_PLAN.reset(token)


def planned_total_timesteps() -> int | None:
    """The env steps per member given to `planned_timesteps` around this build, or None."""
    return _BUILD_PLAN.get()[0]


def solo_models(algo_cls: type, env_id: str, seeds: Sequence[int], members: Sequence[dict], device: torch.device,
                replay: Callable[[Any], tuple[int, float, int]] | None = None,
                **kwargs) -> tuple[list, list[torch.Generator]]:
    """The K solo models (`algo_cls(env_id, seed=seeds[k], device=device, **kwargs, **members[k])`) a population's
    members start from, and for each a generator in the state the solo run's global generator has when its training
    starts; torch's global generators (the CPU's and every accelerator's) are left as they were. `replay(first solo)`:
    each member's replay buffer (transitions, bytes per transition, bytes whatever its size), counted in
    `check_members_fit`. Where the second member's time says the rest would take longer than `BUILD_PROGRESS_S`, a bar
    counts them (unless `planned_timesteps` says no bar: `LongLoopBar`)."""
    solos, generators = [], []
    _, progress_bar, planned, option = _BUILD_PLAN.get()
    with (_forked_generators(device), warnings.catch_warnings(),
          LongLoopBar(len(seeds), "building members", "member", progress_bar) as building):
        for k, (seed, hyperparameters) in enumerate(zip(seeds, members)):
            if k == 1:  # (a setting without effect, or an encoder's cost, is said once, for the first member)
                warnings.simplefilter("ignore", UnusedSettingWarning)
                warnings.simplefilter("ignore", EncoderWarning)
            solos.append(algo_cls(env_id, seed=seed, device=device, **kwargs, **hyperparameters))
            refuse_schedule_functions(solos[-1])
            generators.append(generator_like_global(device))
            if k == 0:  # (from the first member's size, before the others are made)
                check_members_fit(solos[0], max(len(seeds), planned or 0), device,
                                  replay(solos[0]) if replay else (0, 0, 0), option)
            building.step()
    return solos, generators


def check_members_fit(solo, size: int, device: torch.device, replay: tuple[int, float, int],
                      option: tuple[str, str, str]) -> None:
    """UserError, naming `option` (what sets the number of members and buffer_size: `SEEDS_KEYWORD`'s form), and
    buffer_size where the members keep replay buffers, where `size` members like `solo` would not fit in the memory
    available: each its networks four times over (weights, gradients and Adam's two moments), its envs, what is stored
    per env (a rollout) and `replay` (an off-policy member's replay buffer: transitions, bytes per transition, bytes
    whatever its size, such as a frame pool's reserve). --seeds 0-100000 made members for hours before it ran out of
    memory."""
    name, example, buffer_example = option
    parameters = {id(p): p for value in solo._modules().values()
                  for p in (value.parameters() if isinstance(value, torch.nn.Module) else (value,))}
    num_envs = solo.config.num_envs
    fixed = (4 * sum(p.numel() * p.element_size() for p in parameters.values())
             + solo._storage_bytes_estimate(num_envs))
    transitions, row_bytes, replay_fixed = replay
    per_member = fixed + int(transitions * row_bytes) + replay_fixed
    free = replay_buffers.available_memory(device, needed=size * per_member)[0]
    if free is None or size * per_member <= REPLAY_MEMORY_SHARE * free:
        return
    if fixed > REPLAY_MEMORY_SHARE * free:
        return  # (not the number of members: a member's own settings, which `check_fits` names, are too large)

    def advice(usable: int) -> str:
        fits = int(usable) // per_member
        ways = [f"train at most {fits:,} member{'s' if fits > 1 else ''} at once (for example "
                f"{example.format(fits=fits, last=fits - 1)})"] if fits >= 1 else []
        buffer = int((usable / size - fixed - replay_fixed) // row_bytes) // num_envs * num_envs if transitions else 0
        if buffer >= num_envs:
            ways.append(f"give buffer_size {buffer:,} or less ({buffer_example.format(buffer=buffer)})")
        return ", or ".join(ways) or "not even one member fits: free memory"

    stored = f", and a replay buffer of {transitions:,} transitions" if transitions else ""
    members = f"{size:,} member{'' if size == 1 else 's'}"
    # (the refusal measures the memory again, as every refusal says it: on this path only)
    refuse_unless_fits(size * per_member, device,
                       f"A population of {members} ({name}) at {size_text(per_member)} each "
                       f"(networks, their gradients and Adam's moments, {num_envs:,} envs and their storage{stored})",
                       advice)


@torch.no_grad()
def config_tensors(solos: Sequence, keys: Iterable[str], device: torch.device) -> dict[str, torch.Tensor]:
    """Each of `keys` of the solo models' configs as a float32 tensor `[K]` on `device` (row k: solo k's value)."""
    return {key: torch.tensor([float(getattr(s.config, key)) for s in solos], device=device) for key in keys}


def member_features(encoder, obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
    """The members' network input `[K, B, features]` from observations `[K, B, ...]`: flattened float vectors
    (`encoder` None), the solo's one-hot encoding (`rlspeed.nn.OneHotEncoder`) of Discrete / MultiDiscrete indices,
    which the populations store as floats, or another encoder without parameters (`rlspeed.nn.FlattenEncoder`:
    MultiBinary, bool or integer vectors; a `MultiInputEncoder` of such parts, on Dict observations `{key: [K, B,
    ...]}`) applied to every member's rows at once. (An encoder with parameters is each member's own:
    `MemberEncoder`.)"""
    if isinstance(obs, dict):
        size, batch = next(iter(obs.values())).shape[:2]
        return encoder({key: value.flatten(0, 1) for key, value in obs.items()}).view(size, batch, -1)
    if encoder is None:
        return obs.flatten(2)
    size, batch = obs.shape[0], obs.shape[1]
    if isinstance(encoder, OneHotEncoder):
        indices = obs.reshape(size * batch, -1).long()
        return encoder(indices.squeeze(-1) if encoder.single else indices).view(size, batch, -1)
    return encoder(obs.reshape(size * batch, *obs.shape[2:])).view(size, batch, -1)


def member_grad_norms(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each member's global gradient norm `[K]` from its rows of stacked gradients `[K, ...]`, summed as
    `rlspeed.nn.clip_grad_norm` sums a solo model's (each parameter's norm, then the norm of those), without
    flattening copies of strided gradients."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim())))
                                                 for g in grads]), dim=0)


def fused_adam_members(members: Iterable[tuple[list[torch.Tensor], ...]], learning_rates: Sequence,
                       step_count: torch.Tensor, eps: float, betas: tuple[float, float]) -> None:
    """One Adam step of each member through torch's fused kernel (the one `rlspeed.nn.make_adam` gives a solo run on
    CPU and CUDA): `members[k]` holds member k's (parameters, gradients, first moments, second moments) as lists of
    views, `learning_rates[k]` its learning rate (a float or a 0-dim tensor). The kernel reads the step count,
    already advanced (as `torch.optim.Adam` advances its own before the kernel), from `step_count`."""
    for (params, grads, exp_avgs, exp_avg_sqs), rate in zip(members, learning_rates):
        torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], [step_count] * len(params), lr=rate,
                           beta1=betas[0], beta2=betas[1], weight_decay=0.0, eps=eps, amsgrad=False, maximize=False)


def has_parameters(module) -> bool:
    """Whether `module` (an encoder, or None) has parameters: then each member has its own (`MemberEncoder`)."""
    return module is not None and any(True for _ in module.parameters())


class _MemberLinear(torch.autograd.Function):
    """`x @ weight^T + bias` of every member (`x` `[K, B, in]`, `weight` `[K, out, in]` as `nn.Linear` holds it,
    `bias` `[K, out]`) whose weight gradient comes out in the weight's own layout (`g^T @ x`): autograd of
    `baddbmm(bias, x, weight^T)` gives it transposed, and every later pass over it (clipping, the optimiser's copy)
    then reads it with a large stride."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, _bias = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class MemberEncoder:
    """The members' own copies of a parameterised observation encoder (`rlspeed.nn.CNNEncoder`: each member's
    convolutions and linear layer, initialised as its solo model's) applied to all members in one call, on the
    members' stacked parameters. The population holds the stacked parameters (`stack`: leaves `[K, ...]` in `names`'
    order; the solo's state dict names them `<encoder's prefix>.<name>`) and passes them to every call.

    How the convolutions run (`mode`, chosen here): `grouped`, `torch.func.vmap` of the solo's encoder module over the
    stacked parameters (one grouped convolution of K groups per layer: one call instead of K, which wins where small
    images make a convolution's cost its call overhead); or `per-member`, the solo's module called once per member
    with its parameters, in the solo's memory layout (K ordinary convolutions, which win where large images make
    them arithmetic-bound: oneDNN's grouped convolution is slower than K channels-last ones). `per-member` for the
    Nature and strided CNNs on a CPU (their strided layers make them arithmetic-bound), `grouped` elsewhere;
    `benchmarks/member_encoder.py` re-measures both modes at each image size."""

    def __init__(self, encoders: Sequence[torch.nn.Module], mode: str | None = None):
        first = encoders[0]
        if mode is None:
            cpu = next(first.parameters()).device.type == "cpu"
            mode = "per-member" if isinstance(first, CNNEncoder) and first.arch != "small" and cpu else "grouped"
        if mode not in ("per-member", "grouped"):
            raise ValueError(f"MemberEncoder mode is 'per-member' or 'grouped', not {mode!r}")
        if mode == "per-member" and not isinstance(first, CNNEncoder):
            raise ValueError(f"MemberEncoder runs per member CNN encoders only, not a {type(first).__name__}")
        #: `per-member` or `grouped` (class docstring; `mode` None: the rule there)
        self.mode = mode
        module = copy.deepcopy(first)
        for part in module.modules():  # (vmap cannot read a memory format: the batched call takes any)
            if hasattr(part, "input_format"):
                part.input_format = torch.preserve_format
        self.module, self.kind = module, encoders[0].kind
        self.names = [name for name, _ in module.named_parameters()]
        # a CNN encoder's linear layer runs outside vmap, as one batched product of the members' weights: vmap's
        # linear copies the weight gradient into its layout on every backward (a large part of the update, measured
        # by benchmarks/population_cnn.py)
        self._split = isinstance(module, CNNEncoder)
        self._linear = [self.names.index("linear.0.weight"), self.names.index("linear.0.bias")] if self._split else []
        if self._split:
            module.forward = module.conv_features  # (the vmapped call: the convolutions only)
        #: positions in `names` (and in the stacked parameters) of what the vmapped call takes
        self._vmapped = [i for i in range(len(self.names)) if i not in self._linear]
        self._vmapped_names = [self.names[i] for i in self._vmapped]
        self._batched = torch.func.vmap(self._one)
        if self.mode == "per-member":  # (the solo's module as it is: its memory layout for the convolutions' input)
            self._member_module = copy.deepcopy(first)
            self._member_module.forward = self._member_module.conv_features

    def stack(self, encoders: Sequence[torch.nn.Module], trainable: bool = True) -> list[torch.Tensor]:
        """The members' encoders' parameters stacked `[K, ...]` (new leaves; `trainable=False` for targets)."""
        return [torch.stack([dict(e.named_parameters())[name].detach().contiguous() for e in encoders])
                .requires_grad_(trainable) for name in self.names]

    def _one(self, params: tuple[torch.Tensor, ...], obs: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.module, dict(zip(self._vmapped_names, params)), (obs,))

    def __call__(self, params: Sequence[torch.Tensor], obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        """Features `[K, B, features_dim]` of observations `[K, B, *observation shape]` (Dict observations: a dict of
        them), member k's by `params`' row k (stacked parameters laid out as `params`)."""
        if self.mode == "per-member":
            x = torch.stack([torch.func.functional_call(
                self._member_module, {name: params[i][k] for name, i in zip(self._vmapped_names, self._vmapped)},
                (obs[k],)) for k in range(obs.shape[0])])
        else:
            x = self._batched(tuple(params[i] for i in self._vmapped), obs)
        if not self._split:
            return x
        weight, bias = (params[i] for i in self._linear)  # (x: the convolutions' output [K, B, flat])
        return torch.relu(_MemberLinear.apply(x, weight, bias))


class PackedObservations(EnvWrapper):
    """Dict observations as one flat float32 row each (the keys of `layout`, `observation_layout`'s, in its order,
    each flattened and cast: uint8, bool and small integer values are exact in float32), also in `info["final_obs"]`:
    what a population's rollout and replay store, index and cut like float vectors. `unpack_observations` gives the
    dict back in the keys' own shapes and dtypes for the members' encoder."""

    def __init__(self, env: BatchedEnv, layout: dict[str, tuple]):
        super().__init__(env)
        self.layout = layout

    def _pack(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([obs[key].reshape(obs[key].shape[0], -1).to(torch.float32) for key in self.layout], dim=1)

    def _info(self, info: dict) -> dict:
        return {**info, "final_obs": self._pack(info["final_obs"])} if "final_obs" in info else info

    def reset(self, seed=None):
        obs, info = self.env.reset(seed=seed)
        return self._pack(obs), self._info(info)

    def step(self, actions: torch.Tensor):
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        return self._pack(obs), rewards, terminated, truncated, self._info(info)


#: the largest integer float32 holds exactly (`PackedObservations` stores integer keys as float32)
_EXACT_IN_FLOAT32 = 2**24


def check_packable(space, env_id: str) -> None:
    """UserError naming the key when a Dict observation's integer key can hold values float32 does not keep exactly
    (beyond 2**24), which `PackedObservations` would round."""
    import gymnasium as gym

    for key, sub in space.spaces.items():
        if isinstance(sub, gym.spaces.Discrete):  # (values start .. start + n - 1)
            largest = max(abs(int(sub.start)), abs(int(sub.start) + int(sub.n) - 1))
        elif isinstance(sub, gym.spaces.MultiDiscrete):
            largest = int(np.max(np.maximum(np.abs(sub.start), np.abs(sub.start + sub.nvec - 1))))
        elif isinstance(sub, gym.spaces.Box) and np.issubdtype(sub.dtype, np.integer):
            largest = int(max(np.max(np.abs(sub.low)), np.max(np.abs(sub.high))))
        else:  # (float keys are float32 already; bool and MultiBinary keys are 0 or 1)
            continue
        if largest > _EXACT_IN_FLOAT32:
            raise UserError(f"{env_id}'s observation key '{key}' ({sub}) can hold integers beyond 2**24, which a "
                            "population's packed float32 rows would round: wrap the env to rescale that key, or train "
                            "the seeds as separate runs.")


def packed_width(layout: dict[str, tuple]) -> int:
    """The length of a `PackedObservations` row."""
    return sum(math.prod(shape) for shape, _dtype in layout.values())


def packed_float_keys(layout: dict[str, tuple]) -> tuple[tuple[str, tuple[int, ...], int, int], ...]:
    """The float keys of a `PackedObservations` row, as `(key, shape, first column, end column)` in the row's order:
    what observation normalisation normalises (`MemberStatistics.float_keys`), as a solo run's `DictRunningMeanStd`."""
    keys, start = [], 0
    for key, (shape, dtype) in layout.items():
        end = start + math.prod(shape)
        if dtype == torch.float32:
            keys.append((key, tuple(shape), start, end))
        start = end
    return tuple(keys)


def unpack_observations(rows: torch.Tensor, layout: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """Packed rows `[..., packed_width]` (`PackedObservations`) as `{key: [..., *shape]}` in each key's dtype."""
    sizes = [math.prod(shape) for shape, _dtype in layout.values()]
    lead = rows.shape[:-1]
    return {key: part.reshape(*lead, *shape).to(dtype)
            for (key, (shape, dtype)), part in zip(layout.items(), rows.split(sizes, dim=-1))}


class _PrintedRows:
    """`learn`'s metrics rows printed on stderr as lines (`verbose=2`, as a solo model's), and passed on to the run's
    logger where there is one: `RunLogger`'s `log`, `last_row` and `close`."""

    def __init__(self, name: str, logger: RunLogger | None):
        self.name, self.logger = name, logger
        self.last_row: dict | None = None if logger is None else logger.last_row

    def log(self, row: dict) -> None:
        print_beside_bars(metrics_line(self.name, row), file=sys.stderr)
        self.last_row = row
        if self.logger is not None:
            self.logger.log(row)

    def close(self, keep_writer: bool = False) -> None:
        if self.logger is not None:
            self.logger.close(keep_writer=keep_writer)


class EvaluationStopped(Exception):
    """An evaluation left unfinished for a stop request (`first_episode_returns`' `stop`)."""


def first_episode_returns(env, obs: torch.Tensor, policy: Callable, masks: torch.Tensor | None = None,
                          stop: Callable[[], bool] | None = None, max_steps: int | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(return, finished, succeeded, length) of each env row's first episode, `[rows]` each (a row still running at the
    step limit: its return and length so far, not finished; succeeded: its last info's `is_success`, None where the env
    reports no success), stepping `env` (episode statistics in `info`) with `policy(obs)` from observations `obs`;
    with the first action `masks`, `policy(obs, masks)` with each step's `info["action_mask"]`. Evaluation, outside the
    training clock: a host read every 64 steps ends the loop once every row has finished. `stop()`, where given, is
    asked as often: EvaluationStopped where it says to stop (a signal during a final evaluation). The step limit:
    `max_steps`, else the env's time limit, else `UNLIMITED_EPISODE_STEPS` (as `rlspeed.evaluate`'s). Native envs and
    EnvPool step all rows in one call, subprocess envs at once, and Gymnasium's in-process envs step each row's env only
    until its first episode ends (`resting_rows_env`; benchmarks/evaluation_rows.py times it)."""
    limit = episode_step_limit(env, max_steps)
    returns = torch.zeros(obs.shape[0], device=obs.device)
    lengths = torch.zeros(obs.shape[0], device=obs.device, dtype=torch.int64)
    finished = torch.zeros(obs.shape[0], dtype=torch.bool, device=obs.device)
    succeeded = None
    with resting_finished_rows(env) as resting:  # (rows whose first episode ended: not stepped there)
        for step in range(1, limit + 1):
            obs, _, _, _, info = env.step(policy(obs) if masks is None else policy(obs, masks))
            masks = info["action_mask"] if masks is not None else None
            newly_done, returns, lengths, succeeded = first_episode_step(info, finished, returns, lengths, succeeded)
            # (resting rows: a host read at each step some row finished, which then also ends the loop once all have)
            if resting is not None and bool(newly_done.any()):  # ok-sync: evaluation, an env stepped on the host
                if bool(finished.all()):  # ok-sync: evaluation
                    break
                resting.rest_rows(finished)
            if step % 64 == 0:
                if bool(finished.all()):  # ok-sync: evaluation, outside the training clock
                    break
                if stop is not None and stop():
                    raise EvaluationStopped
    return (torch.where(finished, returns, info["episode_return"]), finished, succeeded,
            torch.where(finished, lengths, info["episode_length"]))


def final_steps(member: dict, stop: str, num_timesteps: int) -> int:
    """The step count a member's final evaluation is seeded with (`evaluation_seed(seed, "final", steps)`): its solo
    run's, the steps it trained. `member` is its summary entry (`pruned_at`, `diverged_at`, `steps_to_target`): a
    member pruned or diverged trained to that step (a pruned member's solo run is the one stopped there), one that
    reached its target with `stop="each"` froze there, as its solo run stops there; any other trained the
    population's `num_timesteps`."""
    for key in ("pruned_at", "diverged_at"):
        if member.get(key) is not None:
            return int(member[key])
    if stop == "each" and member.get("steps_to_target") is not None:
        return int(member["steps_to_target"])
    return int(num_timesteps)


@dataclasses.dataclass
class _LoopProgress:
    """What a `learn` loop has measured so far (members by original index), and when its next evaluation and
    checkpoint are due: what its checkpoints save as `progress` (`snapshot`) and a resumed loop continues from
    (`from_checkpoint`)."""

    eval_freq: int
    next_eval: int
    checkpoint_freq: int | None
    next_checkpoint: int | None
    time_to_target_s: list[float | None]
    steps_to_target: list[int | None]
    reached: list[bool]
    #: each member's `[[steps, eval_mean], ...]`
    curves: list[list[list[float]]]
    #: member -> {"pruned_at": steps} or {"diverged_at": steps}
    left: dict[int, dict]
    #: each member's `[[steps, confirming evaluation's mean], ...]`: every evaluation that reached the target
    confirmations: list[list[list[float]]] = dataclasses.field(default_factory=list)
    #: beside each member's `confirmations`, each one's episodes cut short at the step limit
    confirmations_unfinished: list[list[int | None]] = dataclasses.field(default_factory=list)
    #: beside each member's `confirmations`, each one's episodes (the eval_episodes of the learn that made it)
    confirmations_episodes: list[list[int | None]] = dataclasses.field(default_factory=list)
    train_wall_s: float = 0.0
    #: this process's CPU time in training (on a shared machine the wall clock also counts others)
    train_cpu_s: float = 0.0
    #: env steps of the members in the computation, summed
    member_steps: int = 0

    @classmethod
    def start(cls, size: int, num_timesteps: int, eval_freq: int, checkpoint_freq: int | None) -> _LoopProgress:
        """A new loop of `size` members at `num_timesteps`: nothing measured, the first evaluation and checkpoint
        due at the next multiple of their frequencies (`next_due`)."""
        return cls(eval_freq=eval_freq, next_eval=next_due(num_timesteps, eval_freq), checkpoint_freq=checkpoint_freq,
                   next_checkpoint=next_due(num_timesteps, checkpoint_freq) if checkpoint_freq else None,
                   time_to_target_s=[None] * size, steps_to_target=[None] * size, reached=[False] * size,
                   curves=[[] for _ in range(size)], left={}, confirmations=[[] for _ in range(size)],
                   confirmations_unfinished=[[] for _ in range(size)],
                   confirmations_episodes=[[] for _ in range(size)])

    @classmethod
    def from_checkpoint(cls, saved: dict, size: int, num_timesteps: int, eval_freq: int,
                        checkpoint_freq: int | None) -> _LoopProgress:
        """The resumed loop: the checkpoint's progress `saved` (a `snapshot`), its next evaluation and checkpoint
        where the frequencies are this call's (`resumed_due`; else as in a new loop). UserError for a
        progress that does not read."""
        progress = cls.start(size, num_timesteps, eval_freq, checkpoint_freq)
        try:
            progress.time_to_target_s = list(saved["time_to_target_s"])
            progress.steps_to_target = list(saved["steps_to_target"])
            progress.reached, progress.curves = [bool(r) for r in saved["reached"]], [list(c) for c in saved["curves"]]
            progress.left = {int(k): dict(entry) for k, entry in saved["left"]}
            progress.train_wall_s, progress.train_cpu_s = float(saved["train_wall_s"]), float(saved["train_cpu_s"])
            progress.member_steps = int(saved["member_steps"])
            if "confirmations" in saved:  # (checkpoints written before they were recorded have none)
                progress.confirmations = [list(c) for c in saved["confirmations"]]
                # (older checkpoints' confirmations: None episodes cut short, not known; -1 where an rlspeed that
                # wrote their unknown count so saved them again)
                progress.confirmations_unfinished = [[None if cut is None or cut < 0 else int(cut) for cut in c]
                                                     for c in saved.get("confirmations_unfinished", [
                                                         [None] * len(c) for c in progress.confirmations])]
                # (None: a checkpoint of an rlspeed that did not record them)
                progress.confirmations_episodes = [[None if episodes is None else int(episodes) for episodes in c]
                                                   for c in saved.get("confirmations_episodes", [
                                                       [None] * len(c) for c in progress.confirmations])]
            progress.next_eval = resumed_due(saved, "eval", eval_freq, num_timesteps)
            if checkpoint_freq:
                progress.next_checkpoint = resumed_due(saved, "checkpoint", checkpoint_freq, num_timesteps)
        except (KeyError, TypeError, ValueError) as error:
            raise UserError(f"The resumed checkpoint's learn-loop progress is unreadable ({error}): the file was "
                            "edited or damaged.") from None
        if len(progress.curves) != size:
            raise UserError("The resumed checkpoint's learn-loop progress has the wrong number of members: the "
                            "file was edited or damaged.")
        return progress

    def snapshot(self) -> dict:
        """The progress as a checkpoint's JSON holds it (its lists are this object's, not copies)."""
        return {"eval_freq": self.eval_freq, "next_eval": self.next_eval, "checkpoint_freq": self.checkpoint_freq,
                "next_checkpoint": self.next_checkpoint, "time_to_target_s": self.time_to_target_s,
                "steps_to_target": self.steps_to_target, "reached": self.reached, "curves": self.curves,
                "confirmations": self.confirmations, "confirmations_unfinished": self.confirmations_unfinished,
                "confirmations_episodes": self.confirmations_episodes,
                "left": sorted(self.left.items()),
                "train_wall_s": self.train_wall_s, "train_cpu_s": self.train_cpu_s, "member_steps": self.member_steps}


def _not_an_env_id(env) -> str:
    """The sentence refusing `env` where a population takes an env id: for an env of the user's own (a
    `BatchedEnv`, its class or a function making one), what to do instead."""
    if isinstance(env, type):
        what, own = f"the class {env.__name__}", issubclass(env, BatchedEnv)
    elif callable(env):  # (a function making an env: the only use of a callable here)
        what, own = f"the function {getattr(env, '__name__', type(env).__name__)}", True
    else:
        what, own = f"a {type(env).__name__}", isinstance(env, BatchedEnv)
    said = ("A population takes an env id (a native env's, or a registered Gymnasium or EnvPool id, `module:EnvId` "
            "importing its module: it makes each member's envs from it with the member's seed, as its solo run "
            f"would), not {what}")
    if not own:
        return said + "."
    return (said + ": an env of your own (a batched env, or a function making one) cannot be a population's yet; "
            "register a Gymnasium env under an id (gymnasium.register) for a population on it, or train each seed "
            "as its own run.")


class PopulationBase:
    """`learn`, `save`/`resume` and `write_summary` of every population class. A subclass sets `algo_name`,
    `algo_cls` and `per_member`, builds its members from `_solo_members` (which sets `env_id`, `seeds`, `size`,
    `device`, `env_backend`, `generators`, `config` and `member_hyperparameters`), sets `update_path` and
    `update_reason`, `alive` (original indices of the members in the computation, in row order) and `num_timesteps`
    (env steps per member), and provides `_begin`, `train_iteration`, `_finite_members`, `evaluate(seeds, episodes,
    members)`, `remove(members)` and, for checkpoints, `_state` and `_load_state`.

    The env rows (`_make_env`, `_reset`, `_env_rows`) are shared: one env of K x N rows, member k's block of N rows
    its solo run's envs; `_env_rows` reads the training env `_env`, its observations `_obs` and `config.num_envs`."""

    algo_name = ""
    #: the solo algorithm whose runs the members are
    algo_cls: type
    #: the hyperparameters that may differ across members
    per_member: tuple[str, ...] = ()
    #: whether the population applies an env's action masks (`use_masking`), as its solo algorithm does
    supports_action_masks = False
    _masking = False  # whether this run applies them (decided when the env starts: `_start_env`)
    _metrics_dir: Path | None = None  # the run directory whose metrics.csv `learn` last wrote (`_metrics_logger`)
    _metrics_since: tuple[int, float] | None = None  # (member steps, training clock) at the last metrics row
    _tensorboard: KeptWriter | None = None  # (its TensorBoard writer from one learn call to the next, once made)
    #: the members' own encoders where they have parameters (images, Dict observations), else None
    _member_encoder: MemberEncoder | None = None
    #: True: non-finite members are looked for after every iteration; False: every `eval_freq` steps (where an
    #: iteration is a few env steps, a host read per iteration would cost more than it saves)
    check_divergence_every_iteration = False
    #: torch's threads while `learn` runs (the members' `num_threads`; None: `rlspeed.device.set_training_threads`'
    #: default)
    num_threads: int | None = None
    #: what `learn` prints on stderr where its `progress_bar` is not given, as a solo model's `verbose`: 0 nothing,
    #: 1 the progress bar, 2 the bar and each metrics row (an evaluation's, training's end) as a line
    verbose: int = 1
    #: whether the members learn from a replay buffer (which `save_replay_buffer` saves with checkpoints)
    keeps_replay_buffer = False
    _checkpoint_replay = False
    #: the members still in the computation (original indices, in their rows' order)
    alive: list[int]
    #: env steps each member has trained
    num_timesteps: int
    #: what the last `learn` returned
    summary: dict[str, Any]

    def __repr__(self) -> str:
        # (what a notebook shows for a population, as a solo model's repr: the members' seeds (a long range shortened),
        # how many still train where some left, and the env steps each has run; getattr: a debugger may show one
        # whose constructor raised)
        seeds = list(getattr(self, "seeds", ()))
        shown = repr(seeds) if len(seeds) <= 8 else f"[{', '.join(map(str, seeds[:3]))}, ..., {seeds[-1]}]"
        size, alive = len(seeds), getattr(self, "alive", None)
        training = f", training={len(alive)}" if alive is not None and len(alive) != size else ""
        num_envs = getattr(getattr(self, "config", None), "num_envs", None)
        envs = "" if num_envs is None else f", num_envs={num_envs}"
        return (f"{type(self).__name__}({getattr(self, 'env_id', None)!r}, members={size}, seeds={shown}{training}"
                f"{envs}, device={str(getattr(self, 'device', None))!r}, "
                f"num_timesteps={getattr(self, 'num_timesteps', 0)})")

    @property
    def save_replay_buffer(self) -> bool:
        """Whether checkpoints also write the replay buffer, beside them (`<name>.replay.safetensors`), for exact
        resume; True is refused, as the keyword is, where the population keeps no replay buffer (PPO, A2C), as a solo
        model's attribute is."""
        return self._checkpoint_replay

    @save_replay_buffer.setter
    def save_replay_buffer(self, value: bool) -> None:
        value = read_switch("save_replay_buffer", value)  # ('no' is False, as a model reads it)
        if value and not self.keeps_replay_buffer:
            raise UserError(NO_REPLAY_TO_SAVE)
        self._checkpoint_replay = value

    # --- what a population class provides ----------------------------------------------------------------------
    def _check_start_fits(self, total_timesteps: int) -> None:
        """UserError where what the coming `learn(total_timesteps)` allocates as it starts does not fit (`check_fits`),
        asked before that learn writes or builds anything; populations without a replay buffer have nothing to
        check."""

    def _begin(self, total_timesteps: int, schedule_start: int) -> None:
        """Before the loop of a `learn` call of `total_timesteps` more env steps per member, whose schedules run from
        `schedule_start` (this call's first step, or 0 with `reset_num_timesteps=False`) to its end."""

    def train_iteration(self) -> int:
        """One training iteration of every member in the computation; returns the env steps each ran."""
        raise NotImplementedError

    def _finite_members(self) -> torch.Tensor:
        """Device flags `[len(alive)]`: whether each member in the computation still has finite parameters (and
        optimiser state); `_drop_diverged` reads them."""
        raise NotImplementedError

    def _member_hyperparameters(self, k: int) -> dict:
        """Member k's values of the per-member hyperparameters, as its summary entry gives them."""
        return dict(self.member_hyperparameters[k])

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's (original index) parameters, named as the solo algorithm names them: the current ones while
        it trains, those it left with after it left."""
        raise NotImplementedError

    def member_statistics(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's (original index) normalisation statistics, named as a solo run's checkpoint names them
        (`obs_rms.mean`, `obs_rms.var`, `obs_rms.count`, `return_rms.*`): the current ones while it trains, those it
        left with after it left; empty without normalisation."""
        if self._normalization is None:
            return {}
        if k in self.alive:
            return self._normalization.solo_state(self.alive.index(k))
        return self._final_normalization.solo_state(k)

    # --- observation and reward normalisation (`rlspeed.population.normalize`) ----------------------------------
    #: the normalisation statistics of the members in the computation (`MemberNormalize` updates them), and every
    #: member's as it left (rows of members still training are stale): None without normalize_obs and
    #: normalize_reward (`_start_normalization`)
    _normalization: MemberStatistics | None = None
    _final_normalization: MemberStatistics | None = None
    #: whether the training env hands out the env's own observations and rewards while it updates the statistics
    #: (`MemberNormalize.hand_out_raw`): the off-policy populations, whose replay normalises each sampled batch
    _hands_out_raw = False

    def _start_normalization(self) -> None:
        """Statistics for every member where the config asks for `normalize_obs` or `normalize_reward`: fresh ones,
        or given members' own (`_given_statistics`, each named as its checkpoint names them: UserError for one
        missing or of another shape)."""
        cfg = self.config
        observations, rewards = bool(cfg.normalize_obs), bool(cfg.normalize_reward)
        if observations or rewards:
            # (Dict observations: their float keys, as a solo run normalises them)
            float_keys = None if self._packed is None else packed_float_keys(self._packed)
            self._normalization = MemberStatistics.fresh(self.size, tuple(self.spec.observation_shape), observations,
                                                         rewards, self.device, float_keys)
            for k, tensors in enumerate(self._given_statistics or ()):  # (given members: their own)
                try:
                    self._normalization.set_solo_state(k, tensors)
                except KeyError as missing:
                    raise UserError(f"Member {self.seeds[k]}'s model holds no {missing.args[0]} statistics.") from None
                except ValueError as error:
                    raise UserError(f"Member {self.seeds[k]}'s {error}.") from None
            self._final_normalization = self._normalization.rows(torch.arange(self.size, device=self.device))
        self._given_statistics = None  # (read once)

    def _normalized_env(self, env, rows_per_member: int, members: Sequence[int] | None):
        """`env` in the population's observation/reward normalisation where it has one (`normalize_obs`,
        `normalize_reward`): `members` None, the training env of the members in the computation (statistics updated;
        `_hands_out_raw`: the env's own values handed out); else an evaluation env for `members` (original indices;
        each member's statistics as it left, or now, frozen). Without normalisation: `env` as it is."""
        if self._normalization is None:
            return env
        if members is None:
            training = MemberNormalize(env, rows_per_member, self._normalization, self.hyper["gamma"],
                                       **self._normalization_clips())
            training.hand_out_raw = self._hands_out_raw
            return training
        self._store_alive_statistics()
        index = torch.tensor(list(members), device=self.device, dtype=torch.long)
        evaluation = MemberNormalize(env, rows_per_member, self._final_normalization.rows(index),
                                     **self._normalization_clips())
        evaluation.training = False
        return evaluation

    def _normalization_clips(self) -> dict[str, float]:
        """`MemberNormalize`'s clips: the config's `normalize_obs_clip` and `normalize_reward_clip`."""
        return {"obs_clip": self.config.normalize_obs_clip, "reward_clip": self.config.normalize_reward_clip}

    def _store_alive_statistics(self) -> None:
        """Copy the statistics of the members in the computation into the store of every member's."""
        if self.alive and self._normalization is not None:
            self._final_normalization.store(torch.tensor(self.alive, device=self.device), self._normalization)

    def _keep_statistics(self, keep_positions: Sequence[int]) -> None:
        """Members leave: the statistics of those not at `keep_positions` (positions in `alive`) go to the store of
        every member's, and the statistics in the computation keep the others."""
        if self._normalization is None:
            return
        gone = [i for i in range(len(self.alive)) if i not in set(keep_positions)]
        gone_members = torch.tensor([self.alive[i] for i in gone], device=self.device, dtype=torch.long)
        self._final_normalization.store(gone_members,
                                        self._normalization.rows(torch.tensor(gone, device=self.device,
                                                                              dtype=torch.long)))
        self._normalization = self._normalization.rows(torch.tensor(list(keep_positions), device=self.device,
                                                                    dtype=torch.long))

    def _statistics_state(self) -> dict[str, torch.Tensor]:
        """The statistics for a checkpoint (`norm.*`: the members' in the computation, `final_norm.*`: every
        member's as it left); none without normalisation."""
        if self._normalization is None:
            return {}
        return {f"{prefix}.{key}": value for prefix, stats in (("norm", self._normalization),
                                                                ("final_norm", self._final_normalization))
                for key, value in stats.tensors().items()}

    def _load_statistics(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what `_statistics_state` saved (`saved_like` each, any float dtype)."""
        if self._normalization is not None:
            for prefix, stats in (("norm", self._normalization), ("final_norm", self._final_normalization)):
                for key, value in stats.tensors().items():
                    setattr(stats, key, saved_like(tensors, f"{prefix}.{key}", value, any_float=True).clone())

    def _member_checkpoint(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters named as a solo checkpoint of `algo_cls` names them (`member_state`'s names, where
        those are the checkpoint's)."""
        return self.member_state(k)

    def member_model(self, k: int) -> Algorithm:
        """Member k (original index) as a solo model of `algo_cls`: built with its seed and hyperparameters, holding
        its parameters (now, or as it left) and normalisation statistics, so `predict`, `evaluate`, `save` and the
        export methods work as on any solo model (its optimiser state starts afresh; `num_timesteps` is 0).
        torch's global random generators are left as they were."""
        if not 0 <= int(k) < self.size:
            raise UserError(f"Member {k} is outside 0..{self.size - 1} (original indices).")
        k = int(k)
        hyperparameters = {**dataclasses.asdict(self.config), **self.member_hyperparameters[k]}
        with _forked_generators(self.device), warnings.catch_warnings():
            warnings.simplefilter("ignore", UnusedSettingWarning)  # (said when the population was made)
            warnings.simplefilter("ignore", EncoderWarning)
            model = self.algo_cls(self.env_id, seed=self.seeds[k], device=self.device, env_backend=self.env_backend,
                                  env_kwargs=self.env_kwargs or None, verbose=self.verbose, **hyperparameters)
        model._restore_tensors({**self._member_checkpoint(k), **self.member_statistics(k)}, {})
        # (a member of a run that applied its env's action masks trained with them: its file says so, and `export`
        # then adds the mask input, as for a solo run's model)
        model._saved_with_action_masks = bool(self._masking)
        model._asked_for_masks = False  # (the population's config, use_masking's default included, asked for nothing)
        return model

    def evaluate(self, seeds: Sequence[int] | None = None, episodes: int = 10, members: Sequence[int] | None = None,
                 max_steps: int | None = None) -> torch.Tensor:
        """Mean return over `episodes` deterministic episodes of each of `members` (original indices; default: those
        in the computation), as a float64 host tensor `[len(members)]` (each formed as `rlspeed.evaluate`'s `mean`,
        `return_statistics`): member `members[j]` on an env seeded `seeds[j]`, as `rlspeed.evaluate` seeds one
        (default: each member's final-evaluation seed now, `rlspeed.evaluation.evaluation_seed(seed, "final",
        num_timesteps)`, as a solo run's). Members out of the computation are evaluated with the parameters they
        left with. An episode runs at most `max_steps` steps (default: the env's
        time limit, or `rlspeed.evaluation.UNLIMITED_EPISODE_STEPS` where it has none, as `rlspeed.evaluate`); one
        still running then counts with its return so far, with a warning. UserError for an index outside the
        population or another number of seeds. An env's close() error after the episodes is raised after them with
        the means in its `result`, as `rlspeed.evaluate` raises one with its result."""
        raise NotImplementedError

    def _check_members(self, members: Sequence[int]) -> None:
        """UserError for a member index outside the population (`evaluate(members=...)`)."""
        bad = [k for k in members
               if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < self.size]
        if bad:
            raise UserError(f"members takes indices 0-{self.size - 1} of this population of {self.size}, got "
                            f"{bad[0]!r}.")

    def _evaluation_seeds(self, seeds: Sequence[int] | None, members: Sequence[int]) -> list[int]:
        """`evaluate`'s env seeds, one per member evaluated: `seeds` (UserError for another count), or by default
        each member's final-evaluation seed at the population's step count (as `rlspeed train` seeds a solo run's)."""
        if seeds is None:
            return [evaluation_seed(self.seeds[k], "final", self.num_timesteps) for k in members]
        seeds = [int(seed) for seed in seeds]
        if len(seeds) != len(members):
            raise UserError(f"evaluate takes one seed per member evaluated: {len(members)} members, {len(seeds)} "
                            "seeds (or leave seeds out: each member's final-evaluation seed).")
        return seeds

    def remove(self, members: Iterable[int]) -> None:
        """Take `members` (original indices) out of the computation (a member that reached its target, was pruned
        or diverged): their rows of every stacked tensor are cut out and their parameters kept as they are now, for
        `member_state`, `member_model` and the final evaluation. Members already out are ignored."""
        raise NotImplementedError

    # --- members -----------------------------------------------------------------------------------------------
    def _planned_replay(self, solo) -> tuple[int, float, int]:
        """The transitions, bytes per transition and bytes whatever its size of the replay buffer each member like
        `solo` (the first) will hold for the planned steps (`planned_timesteps`), for `check_members_fit`: none here
        (no replay buffer)."""
        return 0, 0, 0

    def _solo_members(self, algo_cls: type, env_id: str, seeds: Sequence[int], member_overrides,
                      device: str | torch.device, env_backend: str, hyperparameters: dict,
                      models: Sequence | None = None) -> list:
        """The K solo models the members start from (`solo_models`; `models`: the constructor's `members`, checked by
        `_given_solos`), after setting what every population takes from its arguments: `seeds` (checked),
        `env_backend` (resolved), `env_id`, `size`, `device`, `generators`, `config` (the solos') and
        `member_hyperparameters` (each member's values of `per_member`). UserError for an algorithm other than the
        class's."""
        if algo_cls is not self.algo_cls:
            given = getattr(algo_cls, "__name__", algo_cls)
            if given == self.algo_cls.__name__:  # (a subclass of the same name: say which is which)
                given = (f"{algo_cls.__module__}.{algo_cls.__qualname__} (a class of its own, whose loss or networks "
                         "the population's batched update would not run)")
            raise UserError(f"{type(self).__name__} trains rlspeed's {self.algo_cls.__name__}, not {given}.")
        if not isinstance(env_id, str):
            raise UserError(_not_an_env_id(env_id))
        self.seeds = seeds = check_seeds(seeds)
        # (the population's, as a solo model's: what its learn prints; the members' models get it, `member_model`)
        # (one built without it takes a resumed checkpoint's, as a loaded solo model takes its file's)
        self._verbose_given = "verbose" in hyperparameters
        self.verbose = check_verbose(hyperparameters.pop("verbose", 1))
        if hyperparameters.pop("tensorboard_log", None) is not None:  # (the members would hold it and write nothing)
            raise UserError("A population takes no tensorboard_log (a solo model's directory of numbered runs): its "
                            "learn(run_dir=DIR) writes the members' metrics and TensorBoard events in DIR.")
        from rlspeed.envs import backend_for_options, check_env_kwargs

        #: the options of every member's Gymnasium env (`env_kwargs`, as a solo run takes them; Gymnasium's envs;
        #: given members' where none are given, as their other settings)
        self.env_kwargs = check_env_kwargs(hyperparameters.pop("env_kwargs", None) if not models or "env_kwargs" in
                                           hyperparameters else getattr(getattr(models[0], "spec", None),
                                                                        "env_kwargs", None))
        try:  # (checkpoints and config.yaml record them)
            json.dumps(self.env_kwargs, allow_nan=False)
        except (TypeError, ValueError):
            raise UserError(f"A population's env_kwargs are recorded in its checkpoints, so they must be JSON values "
                            f"(numbers, strings, lists, dicts); got {self.env_kwargs!r:.100}.") from None
        if models and env_backend == "auto":  # (given members: their backend, as their other settings)
            env_backend = getattr(models[0], "env_backend", env_backend)
        self.env_backend = population_env_backend(env_id, backend_for_options(self.env_kwargs, env_backend, env_id))
        from rlspeed.device import resolve_device

        self.env_id, self.size, self.device = env_id, len(seeds), resolve_device(device)
        #: the members' solo models' normalisation statistics where they were given (`members`), each named as its
        #: checkpoint names them, for `_start_normalization`; None: fresh ones
        self._given_statistics = None
        if models is not None:
            solos = self._given_solos(models, hyperparameters, member_overrides)
            self.generators = [generator_like_global(self.device) for _ in solos]
            self._given_statistics = [{name: value for name, value in solo._state_tensors().items()
                                       if name.startswith(("obs_rms.", "return_rms."))} for solo in solos]
        else:
            # (what the solo model takes: its hyperparameters and its constructor's own arguments)
            known = set(_field_names(algo_cls.config_cls))
            known |= set(inspect.signature(algo_cls.__init__).parameters)
            hyperparameters, member_overrides = read_as_config(algo_cls.config_cls, hyperparameters,
                                                               member_overrides)
            members = split_member_values(hyperparameters, member_overrides, self.size, self.per_member, known)
            # K solo models: their initial weights, and the state their global generator has when training starts
            solos, self.generators = solo_models(self.algo_cls, env_id, seeds, members, self.device,
                                                 replay=self._planned_replay, env_backend=self.env_backend,
                                                 env_kwargs=self.env_kwargs or None)
        self._env_spec = solos[0].spec  # (the members' env: its time limit, `learn`'s note on a target)
        layout = observation_layout(solos[0].spec.observation_space)
        #: Dict observations' layout (`{key: (shape, dtype)}`): the envs pack them into flat rows
        #: (`PackedObservations`); None for one tensor
        self._packed = layout if isinstance(layout, dict) else None
        if self._packed is not None:
            check_packable(solos[0].spec.observation_space, env_id)
        #: one observation's shape where it is one tensor (images: how `member_observations` unflattens the rows)
        self._observation_shape = None if self._packed else tuple(solos[0].spec.observation_shape)
        #: an Atari game: the solo's preprocessed envs, its training transforms and its evaluation games (`_make_env`;
        #: the solo models registered ale-py's ids where it is one, so from here `is_atari` can tell)
        self._atari = atari.is_atari(env_id)
        self.config = solos[0].config
        #: env steps per member of one training iteration, as each member's solo model takes them
        #: (`Algorithm.steps_per_iteration`): `learn` trains whole iterations
        self.steps_per_iteration = solos[0].steps_per_iteration
        self.num_threads = solos[0].num_threads
        #: each member's values of the per-member hyperparameters (original indices)
        self.member_hyperparameters = [{key: getattr(s.config, key) for key in self.per_member} for s in solos]
        return solos

    def _given_solos(self, models: Sequence, hyperparameters: dict, member_overrides) -> list:
        """`members`' models as the solos the members start as, checked to be one population's members: one of
        `algo_cls` per seed of `seeds` (each made with that seed) on this population's env and options and on its
        device and env backend, alike in every setting but the per-member ones and in num_threads, holding no
        schedule function (`refuse_schedule_functions`, as built members), and no settings given besides them (the
        models' are the population's). UserError saying which is not so."""
        solos = list(models)
        if [type(solo) for solo in solos] != [self.algo_cls] * self.size or [
                getattr(solo, "seed", None) for solo in solos] != self.seeds:
            raise UserError(f"members takes one {self.algo_cls.__name__} model per seed of seeds, each made with that "
                            f"seed ({self.seeds}).")
        if hyperparameters or member_overrides is not None:
            raise UserError("A population given its members takes their settings: give no hyperparameters or "
                            f"member_overrides (got {', '.join(sorted(hyperparameters)) or 'member_overrides'}).")

        def shared(solo) -> tuple:
            settings = dataclasses.asdict(solo.config)
            return (solo.env_id, solo.env_backend, solo.spec.env_kwargs or {}, solo.device, solo.num_threads,
                    {key: value for key, value in settings.items() if key not in self.per_member})

        first = solos[0]
        if (first.env_id, first.spec.env_kwargs or {}, first.device) != (self.env_id, self.env_kwargs or {},
                                                                           self.device):
            def where(env_id: str, options: dict | None, device) -> str:
                return f"{env_id}{f' with env_kwargs {options}' if options else ''} on {device}"

            raise UserError(f"The members' env or device ({where(first.env_id, first.spec.env_kwargs, first.device)}) "
                            f"is not the population's ({where(self.env_id, self.env_kwargs, self.device)}).")
        if first.env_backend != self.env_backend:  # (the population's env rows would not be the models' envs)
            raise UserError(f"The members run on env_backend={first.env_backend!r}, the population on "
                            f"{self.env_backend!r}: give the population env_backend={first.env_backend!r}.")
        differing = next((solo.seed for solo in solos[1:] if shared(solo) != shared(first)), None)
        if differing is not None:
            raise UserError(f"The members are not one population's: seed {differing}'s env, backend, device, "
                            f"num_threads or shared settings differ from seed {first.seed}'s.")
        for solo in solos:  # (as `solo_models` refuses them: the stacked update would train at the start value)
            refuse_schedule_functions(solo)
        return solos

    # --- env rows ----------------------------------------------------------------------------------------------
    @close_errors_last("the members' mean returns")
    def _mean_returns(self, seeds: Sequence[int], episodes: int, policy: Callable[[torch.Tensor], torch.Tensor],
                      members: Sequence[int], max_steps: int | None = None) -> torch.Tensor:
        """Mean return `[len(seeds)]` (host tensor) of `episodes` episodes per seed, block j on an env seeded
        `seeds[j]` as `rlspeed.evaluate` seeds one (an env of `len(seeds) x episodes` rows, made for this call, for
        `members`: see `_normalized_env`; in waves of at most `evaluation_env_cap` rows, as `rlspeed.evaluate` runs
        more episodes than that: `evaluation_waves`), actions from `policy(obs)` (its rows: each member's episodes of
        the wave): each row's first episode (`first_episode_returns`, at most `max_steps` steps)."""
        max_steps = positive_whole("max_steps", max_steps)
        plan = (episodes, len(seeds))  # (what an evaluation keeps is fixed by these: checked where they change)
        if getattr(self, "_results_fit", None) != plan:
            refuse_unless_results_fit(*plan)  # (a RuntimeError of torch's past int64 rows otherwise)
            self._results_fit = plan
        backend = self._evaluation_env_backend(episodes, seeds)
        # (where the members apply the env's action masks, the policy takes (obs, masks))
        applies = self.supports_action_masks and getattr(self.config, "use_masking", False)
        waves: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
        for first, count in evaluation_waves(episodes, evaluation_env_cap(backend), len(seeds)):
            env = None
            try:
                env = self._make_env(count, seeds, members, backend, first_row=first)
                obs, info = self._reset(env, count, [seed + first for seed in seeds])
                masks = info.get("action_mask") if applies else None
                wave = first_episode_returns(env, obs, policy, masks, self._evaluation_stop, max_steps)
            finally:
                if env is not None:
                    env.close()
            waves.append(tuple(None if part is None else part.view(len(seeds), count) for part in wave))
        # (each member's episodes in order, wave after wave: the rows of one env of them all)
        returns, finished, lengths = (torch.cat([wave[part] for wave in waves], 1).flatten() for part in (0, 1, 3))
        succeeded = None if all(wave[2] is None for wave in waves) else torch.cat(
            [torch.zeros_like(wave[1]) if wave[2] is None else wave[2] for wave in waves], 1).flatten()
        #: each evaluated member's episodes still running at the step limit (counted with their returns so far, as
        #: `rlspeed.evaluate` counts them, with its warning), the last `evaluate`'s, by position
        self.last_unfinished = (~finished).view(len(seeds), episodes).sum(1).tolist()  # ok-sync: evaluation
        if sum(self.last_unfinished):
            warn_unfinished(sum(self.last_unfinished), len(seeds) * episodes, episode_step_limit(env, max_steps),
                            time_limit=True, in_training=True)
        #: each evaluated member's share of successful episodes among the finished ones (None: not known), where
        #: the env reports `info["is_success"]` (goal envs), else None; the last `evaluate`'s, by position
        self.last_success_rates = None
        if succeeded is not None:
            done = finished.view(len(seeds), episodes).sum(1).cpu()  # ok-sync: evaluation
            wins = succeeded.view(len(seeds), episodes).sum(1).cpu()
            self.last_success_rates = [float(w) / float(d) if d > 0 else None for w, d in zip(wins, done)]
        #: each evaluated member's episodes, as `rlspeed.evaluate`'s result lists them: their returns (float64),
        #: lengths (env steps) and, where the env reports `is_success` (else None), successes; the last `evaluate`'s,
        #: by position
        self.last_episodes = {
            "returns": returns.view(len(seeds), episodes).cpu().double().tolist(),  # ok-sync: evaluation
            "lengths": lengths.view(len(seeds), episodes).cpu().tolist(),
            "successes": None if succeeded is None else succeeded.view(len(seeds), episodes).cpu().tolist()}
        # (each member's mean and std as `rlspeed.evaluate` forms them, from the same float64 episode returns: a
        # member's numbers equal `rlspeed eval`'s of its saved model)
        statistics = [return_statistics(row) for row in self.last_episodes["returns"]]
        #: each evaluated member's standard deviation of its episodes' returns (population, as `rlspeed.evaluate`'s
        #: `std`), the last `evaluate`'s, by position
        self.last_return_stds = [std for _, std in statistics]
        return torch.tensor([mean for mean, _ in statistics], dtype=torch.float64, device="cpu")

    def _evaluation_env_backend(self, rows_per_member: int, seeds: Sequence[int]) -> str:
        """The backend of an evaluation env of `rows_per_member` rows per seed: the one the solo model's evaluation
        takes, but in this process where that is one subprocess per env (members x episodes processes, 320 for 32
        members' 10 episodes)."""
        from rlspeed.envs import backend_for_options, import_env_module, resolve_backend
        from rlspeed.evaluation import evaluation_backend

        backend = evaluation_backend(self.env_id, self.env_backend, rows_per_member, self.device)
        if backend == "gymnasium-async":  # (with env options: Gymnasium's, which takes them)
            options = backend_for_options(self.env_kwargs or {}, "auto")
            backend = resolve_backend(import_env_module(self.env_id), options, len(seeds) * rows_per_member,
                                      self.device)
        return backend

    def _make_env(self, rows_per_member: int, seeds: Sequence[int], members: Sequence[int] | None = None,
                  backend: str | None = None, first_row: int = 0):
        """An env of `rows_per_member` rows per seed whose block k is an env seeded `seeds[k]` (not reset yet), in
        the population's normalisation (`_normalized_env`: `members` None for the training env, else the members an
        evaluation env serves), on `backend` (default: the training env's, or `_evaluation_env_backend`'s). A native
        env's and EnvPool's blocks start as rows `first_row ..` of such an env (an evaluation's later wave; Gymnasium's
        envs take their seeds at reset: `_reset`)."""
        from rlspeed.envs import import_env_module
        from rlspeed.envs.base import EpisodeStatistics
        from rlspeed.envs.gymnasium_env import GymnasiumEnv
        from rlspeed.envs.registry import NATIVE_ENVS

        env_id = import_env_module(self.env_id)  # (`module:EnvId`, as the solo runs' make_env takes it: Gymnasium's id)
        if backend is None:
            backend = (self.env_backend if members is None
                       else self._evaluation_env_backend(rows_per_member, seeds))
        if backend == "gymnasium":
            kind = atari.AtariGymnasiumEnv if self._atari else GymnasiumEnv
            env = EpisodeStatistics(kind(env_id, num_envs=len(seeds) * rows_per_member, device=self.device,
                                         env_kwargs=self.env_kwargs))
        elif backend in ("envpool", "gymnasium-async"):
            from rlspeed.envs.envpool_env import EnvPoolEnv

            def member_env(seed: int) -> BatchedEnv:  # (Gymnasium's envs take their seeds at reset: `_reset`)
                if backend == "envpool":
                    return EnvPoolEnv(env_id, num_envs=rows_per_member, device=self.device, seed=seed + first_row,
                                      env_kwargs=self.env_kwargs)
                return GymnasiumEnv(env_id, num_envs=rows_per_member, device=self.device, vectorization="async",
                                    env_kwargs=self.env_kwargs)

            parts: list = []
            try:
                for seed in seeds:
                    parts.append(member_env(seed))
            except BaseException:
                for part in parts:  # (the pools and processes made so far)
                    part.close()
                raise
            env = EpisodeStatistics(MemberEnvs(parts))
        else:
            native = NATIVE_ENVS[env_id](num_envs=len(seeds) * rows_per_member, device=self.device, seed=0)
            native.seed_row_blocks(seeds, first_row=first_row)
            env = EpisodeStatistics(native)
        # (outermost: an exception from inside the env names it, as a single run's envs do)
        return NamesEnvErrors(self._normalized_env(self._packed_env(self._atari_env(env, members is not None)),
                                                   rows_per_member, members))

    def _atari_env(self, env, evaluation: bool):
        """An Atari game's env (under its episode statistics) as a solo run has it (`rlspeed.envs.make_env`,
        `rlspeed.evaluate`): for training, a lost life ends the learner's episode and rewards are clipped
        (`AtariTraining`, as the config's `episodic_life` and `clip_rewards` ask); for evaluation, FIRE at every start
        and lost life where the game waits for it (`for_evaluation`). Other envs as they are."""
        if not self._atari:
            return env
        return atari.for_evaluation(env) if evaluation else atari.AtariTraining(env, self.config.episodic_life,
                                                                                 self.config.clip_rewards)

    def _packed_env(self, env):
        """`env` with Dict observations packed into flat rows (`PackedObservations`); others as they are."""
        return env if self._packed is None else PackedObservations(env, self._packed)

    def member_observations(self, rows: torch.Tensor, unflatten: bool) -> torch.Tensor | dict[str, torch.Tensor]:
        """Stored observation rows `[K, B, flat]` as the members' encoder takes them: Dict observations unpacked
        (`{key: [K, B, *shape]}`), images (`unflatten`: members with their own CNN) in their shape, others as they
        are."""
        if self._packed is not None:
            return unpack_observations(rows, self._packed)
        if unflatten:
            return rows.reshape(*rows.shape[:2], *self._observation_shape)
        return rows

    def _reset(self, env, rows_per_member: int, seeds: Sequence[int]) -> tuple[torch.Tensor, dict]:
        """(first observations, info) of a `_make_env` env: a native env's streams and the EnvPool pools are already
        seeded per block; Gymnasium envs are reset with seed `seeds[k] + i` for member k's env i (as
        `make_env(seed=seeds[k])` seeds a solo's)."""
        if env.backend == "gymnasium":  # (in one process, or one subprocess env per member: `MemberEnvs`)
            return env.reset(seed=[seed + i for seed in seeds for i in range(rows_per_member)])
        return env.reset()

    def _start_env(self) -> None:
        """Make and reset the training env of the members in the computation (`_env`, its observations `_obs`, its
        action masks `_action_mask` where the run applies them: `_masking`, PPO's with `use_masking`). UserError
        where the env gives action masks and `use_masking` is on for a population that does not apply them."""
        seeds = [self.seeds[k] for k in self.alive]
        env = self._make_env(self.config.num_envs, seeds)
        obs, info = self._reset(env, self.config.num_envs, seeds)
        if getattr(self.config, "use_masking", False) and getattr(env.unwrapped, "has_action_masks", False):
            if not self.supports_action_masks:
                env.close()
                raise UserError(f"{self.env_id} gives action masks, which {self.algo_cls.__name__} populations do "
                                "not apply yet: pass use_masking=False (members then choose among all actions), or "
                                "train the seeds as separate runs.")
            self._start_masking()
            self._action_mask = info["action_mask"]
        self._env, self._obs = env, obs
        self._attach_env_guard()

    def _drop_interrupted_env(self) -> None:
        """After a learn a KeyboardInterrupt cut short (Jupyter's stop button, a second Ctrl-C), or subprocess envs
        that cannot go on (`BatchedEnv.disrupted`: closed after a failed step), the training env is made again and
        its episodes start afresh, as a single model's are (`Algorithm._drop_disrupted_env`): a rollout cut short
        left the observations held behind the envs' own, and subprocess envs may be out of step with their pipes, or
        closed, failing every later step. The members go on (weights, step counts, replay)."""
        interrupted, self._learn_interrupted = self._learn_interrupted, False
        if self._env is None:
            return
        disrupted = getattr(self._env.unwrapped, "disrupted", None)
        if interrupted or (callable(disrupted) and disrupted() is not None):
            env, self._env, self._obs = self._env, None, None
            env.close()

    def _start_masking(self) -> None:
        """The run applies the env's action masks from now on (see `supports_action_masks`)."""
        self._masking = True

    def _keep_members(self, rows: list[int]) -> None:
        """After a subclass's `remove` cut its stacked tensors down to the members at `rows` (positions in `alive`):
        `alive`, `generators`, the training env's rows and observations follow."""
        self.alive = [self.alive[i] for i in rows]
        self.generators = [self.generators[i] for i in rows]
        if self._env is not None:
            if self._masking:  # (the action masks valid for the kept rows' observations)
                envs = self.config.num_envs
                self._action_mask = self._action_mask.view(-1, envs, self._action_mask.shape[-1])[rows].flatten(0, 1)
            self._env, self._obs = self._env_rows(rows)
            self._attach_env_guard()  # (the kept rows' env: checked from here on)

    def _env_rows(self, rows: list[int]):
        """(env, observations) of the training env cut down to the row blocks of the members at `rows` (positions
        in the env's current blocks; `alive` already lists the members kept): the envs continue exactly (states,
        step counters, episode totals and random streams are carried over). No rows: (None, None), the env closed."""
        if not rows:
            self._env.close()
            return None, None
        envs = self.config.num_envs
        index = (torch.tensor(rows, device=self.device, dtype=torch.long).unsqueeze(1) * envs
                 + torch.arange(envs, device=self.device)).flatten()
        if self.env_backend in ("gymnasium", "gymnasium-async", "envpool"):
            return self._kept_rows(index.tolist(), rows), self._obs[index]
        state = self._env.state_dict()  # (per env row, normalisation's running returns included)
        position = state.pop("native.draws")  # (how far the streams are drawn: the same for every row)
        state = {key: value[index] for key, value in state.items()}
        state["native.draws"] = position
        env = self._make_env(envs, [self.seeds[k] for k in self.alive])
        env.load_state_dict(state)
        return env, self._obs[index]

    def _kept_rows(self, index: list[int], blocks: list[int]):
        """The Gymnasium or EnvPool training env cut down to the env rows `index` (the row blocks `blocks`): the
        same env objects (mid-episode, their random generators where they are), Gymnasium's in a new synchronous
        vector env, EnvPool's pools of the blocks kept (`MemberEnvs.keep`); the others are closed. The wrappers'
        per-row state (episode totals, Atari lives, normalisation's running returns) follows the rows."""
        import gymnasium as gym

        from rlspeed.envs.base import EpisodeStatistics
        from rlspeed.envs.gymnasium_env import GymnasiumEnv

        outer = self._env.env  # (under `_make_env`'s NamesEnvErrors)
        old, lives = outer, None
        while not isinstance(old, EpisodeStatistics):  # (under the normalisation wrapper, where there is one)
            if isinstance(old, atari.AtariTraining):
                lives = old._lives  # (each game's lives at its last step: a drop from them is a lost life)
            old = old.env
        if isinstance(old.env, MemberEnvs):
            inner = old.env.keep(blocks)
        else:
            envs = list(old.env.vector_env.envs)
            kept = set(index)
            for i, env in enumerate(envs):
                if i not in kept:
                    env.close()
            if self._atari:
                inner = atari.AtariGymnasiumEnv(self.env_id, device=self.device, envs=[envs[i] for i in index])
            else:
                vector = gym.vector.SyncVectorEnv([lambda env=envs[i]: env for i in index],
                                                  autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, copy=False)
                inner = GymnasiumEnv(self.env_id, vector_env=vector, device=self.device)
            # (a fresh adapter learns that the env gives masks at a reset, and this one continues without one)
            inner.has_action_masks = old.env.has_action_masks
        new = EpisodeStatistics(inner)
        rows = torch.tensor(index, device=self.device, dtype=torch.long)
        new._return, new._length = old._return[rows], old._length[rows]  # (the running episode totals)
        training = self._atari_env(new, evaluation=False)
        if lives is not None:
            training._lives = lives[rows]
        packed = self._packed_env(training)
        wrapped = self._normalized_env(packed, self.config.num_envs, None)
        if wrapped is not packed:  # (the wrapper's running returns, per env row)
            wrapped._returns.copy_(outer._returns[rows])
        return NamesEnvErrors(wrapped)

    # --- checkpoints -------------------------------------------------------------------------------------------
    def _state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The class's own state for a checkpoint: (tensors, JSON) — stacked parameters of the members in the
        computation, those every member left with, optimiser state, per-member hyperparameters, counters."""
        raise NotImplementedError

    def _load_state(self, tensors: dict[str, torch.Tensor], values: dict) -> None:
        """Restore what `_state` returned, onto a population already cut down to the checkpoint's members."""
        raise NotImplementedError

    def _save_replay(self, path: Path) -> dict | None:
        """Off-policy populations with `save_replay_buffer`: write the replay buffer beside the checkpoint `path` and
        return what the checkpoint records about it; None: nothing written."""
        return None

    def _load_replay(self, path: Path, saved: dict | None) -> None:
        """After `resume` restored the rest: fill the replay buffer from what `_save_replay` wrote (off-policy)."""

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint of the whole population (safetensors + JSON metadata, atomic, with a digest; see
        `rlspeed.checkpoint`) to `path` and return the file's path: the class's state (`_state`), each member's
        generator, the training env's state and observations where the backend can restore them (native envs), the
        members in the computation, `num_timesteps`, and the learn loop's progress (next evaluation and checkpoint,
        each member's curve, reached / pruned / diverged, times) as `learn` records it for its own checkpoints
        (`progress`; None outside `learn`). `resume` continues from it. Call it between `learn` calls, or let `learn`
        write checkpoints: a save from within `on_eval` would pair this moment's parameters with the last
        checkpoint's progress."""
        if not isinstance(path, (str, os.PathLike)):
            raise UserError(f"save takes a file's path (a str or pathlib.Path), not {path!r}.")
        own_tensors, own = self._state()
        tensors = {f"state.{key}": value for key, value in own_tensors.items()}
        for row, k in enumerate(self.alive):
            tensors[f"generator.{k}"] = self.generators[row].get_state()
        obs = getattr(self, "_obs", None)
        env_state = self._env.state_dict() if self._env is not None and isinstance(obs, torch.Tensor) else None
        if env_state is not None:
            tensors.update({f"env.{key}": value for key, value in env_state.items()})
            tensors["obs"] = obs
        metadata = {"population": {
            "algo": self.algo_name, "env_id": self.env_id, "seeds": self.seeds, "env_backend": self.env_backend,
            "env_kwargs": self.env_kwargs, "config": dataclasses.asdict(self.config),
            "member_hyperparameters": [self._member_hyperparameters(k) for k in range(self.size)],
            "alive": list(self.alive), "num_timesteps": self.num_timesteps, "state": own,
            "verbose": check_verbose(self.verbose), "env": {"restorable": env_state is not None}, "loop": self.progress,
            "replay_buffer": self._save_replay(checkpoint_path(path)),
            "rlspeed_version": __version__, "torch_version": torch.__version__}}
        replay = metadata["population"]["replay_buffer"]
        return save_with_staged(path, tensors, metadata, replay["file"] if replay is not None else None)

    def resume(self, path: str | Path, verify: bool = True) -> None:
        """Continue the run the checkpoint at `path` (`save`, or `learn(run_dir=...)`'s) was written from, on this
        newly built population (same algorithm, env, seeds and hyperparameters: anything else is a UserError):
        parameters, optimiser state, generators, the members in the computation, `num_timesteps`, the envs' episodes
        in progress where the backend can restore them (native envs; Gymnasium envs start fresh episodes, with a
        warning), the checkpoint's `verbose` where this population was built without one (as a solo model's `load`
        takes its file's), and for the next `learn` the loop's progress. That `learn`'s `total_timesteps` counts from
        the checkpoint's `num_timesteps`: pass what is left of the run's budget. On the CPU with native envs a
        resumed run ends bitwise as the uninterrupted run (tests/test_population_resume.py). `verify=False` skips the
        digest check.

        Non-finite values are accepted: a member that diverged keeps its last parameters (it is never evaluated)."""
        tensors, meta = load_checkpoint(path, device=self.device, verify=verify, allow_nonfinite=True)
        saved = meta.get("population")
        if not isinstance(saved, dict):
            what = (f"a checkpoint of a single {meta['algo']} run (resume it without --seeds)" if "algo" in meta
                    else "not a population checkpoint")
            raise UserError(f"'{path}' is {what}, so this population cannot resume from it.")
        self._check_same_run(path, saved)
        alive = [int(k) for k in saved.get("alive", [])]
        if self.num_timesteps or len(self.alive) != self.size or not set(alive) <= set(self.alive):
            raise UserError(f"Resume '{path}' on a newly built population (this one has trained already).")
        if self._env is not None:
            self._env.close()
        self._env, self._obs = None, None
        self.remove([k for k in range(self.size) if k not in alive])
        try:
            self._load_state({key[6:]: value for key, value in tensors.items() if key.startswith("state.")},
                             saved.get("state") or {})
            for row, k in enumerate(self.alive):
                self.generators[row].set_state(tensors[f"generator.{k}"].cpu())  # ok-sync: once, at resume
            self.num_timesteps = int(saved["num_timesteps"])
            if not self._verbose_given and saved.get("verbose") is not None:  # (older checkpoints have none)
                self.verbose = check_verbose(saved["verbose"])
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise UserError(f"'{path}' does not fit this population ({str(error).splitlines()[0][:200]}): the file "
                            "was edited or damaged.") from None
        env_state = {key[4:]: value for key, value in tensors.items() if key.startswith("env.")}
        restored = False
        if self.alive and env_state and "obs" in tensors and self.env_backend == "torch":
            seeds = [self.seeds[k] for k in self.alive]
            self._env = self._make_env(self.config.num_envs, seeds)
            # (an env with action masks restarts: the masks valid for the saved observations are not saved)
            restored = not getattr(self._env.unwrapped, "has_action_masks", False)
            if restored:
                self._env.load_state_dict(env_state)
                self._obs = tensors["obs"].clone()
                self._attach_env_guard()
            else:
                self._env.close()
                self._env = None
        if self.alive and not restored and self.num_timesteps:  # (a population saved before training had none)
            why = ("envs with action masks start their episodes afresh (their masks are not saved)"
                   if self.env_backend == "torch" and env_state else
                   f"{self.env_backend} envs cannot restore their episodes in progress or random streams (native envs "
                   "without action masks can)" if self.env_backend != "torch" else
                   "the checkpoint holds no env state")
            warnings.warn(f"Resuming from '{path}': {why}, so training continues from fresh episodes and is not "
                          "identical to the uninterrupted run.", stacklevel=2)
        file = Path(path) if Path(path).exists() else checkpoint_path(path)
        self._load_replay(file, saved.get("replay_buffer"))
        self.progress = saved.get("loop") or None
        self._resumed = True
        self._metrics_dir = file.resolve().parent  # (its run's directory, whose metrics.csv its learn continues)

    def _check_same_run(self, path, saved: dict) -> None:
        """UserError unless the checkpoint's run (`saved`: its metadata) is this population's: algorithm, env, seeds,
        env backend, shared hyperparameters and each member's."""
        mine = {"algorithm": self.algo_name, "env": self.env_id, "seeds": self.seeds}
        theirs = {"algorithm": saved.get("algo"), "env": saved.get("env_id"), "seeds": saved.get("seeds")}
        differ = [name for name in mine if mine[name] != theirs[name]]
        if differ:
            raise UserError(f"'{path}' is a checkpoint of {theirs['algorithm']} on {theirs['env']} with seeds "
                            f"{_seed_text(theirs['seeds'])}, not of this population ({mine['algorithm']} on "
                            f"{mine['env']} with seeds {_seed_text(self.seeds)}): resume with the same "
                            f"{' and '.join(differ)}.")
        if (saved.get("env_kwargs") or {}) != json.loads(json.dumps(self.env_kwargs)):
            raise UserError(f"'{path}' was trained with the env options {saved.get('env_kwargs') or {}}, this "
                            f"population has {self.env_kwargs}: resume with the same env_kwargs.")
        if saved.get("env_backend") != self.env_backend:
            raise UserError(f"'{path}' was trained on env_backend={saved.get('env_backend')!r}, this population runs "
                            f"on {self.env_backend!r}: resume with env_backend={saved.get('env_backend')!r} "
                            f"(rlspeed train's --env-backend {saved.get('env_backend')}).")
        config = json.loads(json.dumps(dataclasses.asdict(self.config)))
        members = json.loads(json.dumps([self._member_hyperparameters(k) for k in range(self.size)]))
        saved = {**saved, "config": with_saved_cnn(saved.get("config") or {}, config, self.spec.observation_space)}
        shared = sorted(key for key in set(config) | set(saved["config"])
                        if key not in self.per_member and config.get(key) != saved["config"].get(key))
        per_member = sorted({key for k, values in enumerate(saved.get("member_hyperparameters") or [])
                             for key, value in values.items() if members[k].get(key) != value})
        if shared or per_member:
            key = (shared or per_member)[0]
            saved_value = ((saved.get("config") or {}).get(key) if shared else
                           [values.get(key) for values in saved["member_hyperparameters"]])
            raise UserError(f"'{path}' was trained with {key}={saved_value!r}, this population has "
                            f"{config.get(key) if shared else [m.get(key) for m in members]!r}: resume with the "
                            "checkpoint's hyperparameters.")

    # --- the loop ----------------------------------------------------------------------------------------------
    #: the learn loop's progress as the last checkpoint saved it (after `resume`: the checkpoint's; None outside a
    #: `learn` with checkpoints): next evaluation and checkpoint, each member's curve, reached, pruned / diverged, times
    progress: dict | None = None
    _resumed = False
    _learn_interrupted = False  # a KeyboardInterrupt left the last learn (`_drop_interrupted_env`)
    last_success_rates: list[float | None] | None = None  # (`_mean_returns`)
    #: a stop request that ends an evaluation unfinished (`learn`'s final one: a signal need not wait for its games)
    _evaluation_stop: Callable[[], bool] | None = None
    last_return_stds: list[float] | None = None  # (`_mean_returns`)
    last_unfinished: list[int] | None = None  # (`_mean_returns`)
    last_episodes: dict[str, list[list] | None] | None = None  # (`_mean_returns`)

    #: the training env's `rlspeed.numerics.EnvValueGuard` (`raise` policy: steps checked a block at a time), on the
    #: innermost `EpisodeStatistics`, as a single run's guard sits (`_attach_env_guard`)
    _env_guard = None

    def _attach_env_guard(self) -> None:
        """Check the training env's observations and rewards for NaN and infinity as a single run does (its
        `EnvValueGuard`, read with the divergence flags); a new env (members left) gets a new guard."""
        from rlspeed.envs.base import clear_reward_flags, find_episode_statistics
        from rlspeed.numerics import EnvValueGuard

        stats = find_episode_statistics(self._env) if self._env is not None else None
        self._env_guard = None
        if stats is not None:
            stats.numerics = self._env_guard = EnvValueGuard(stats.num_envs, stats.device, "raise")
            clear_reward_flags(self._env)  # (marked before this guard counted)

    def _env_error(self, own: int, first: int) -> None:
        """NonFiniteEnvError (a `UserError`) naming the member whose env returned a NaN or infinite observation or
        reward (`own` env rows did, the first one `first`): a population stops, as a single run with
        `nan_policy="raise"` does (a member trained on such values would only show up as diverged). Rows a diverged
        policy sent non-finite actions first are not the env's doing (the guard tells them apart)."""
        from rlspeed.numerics import NonFiniteEnvError, has_wide_floats

        member = self.alive[first // self.config.num_envs]
        space = getattr(getattr(self._env, "spec", None), "observation_space", None)
        raise NonFiniteEnvError(self.env_id, first, self.num_timesteps, own, member=(member, self.seeds[member]),
                                wide_floats=has_wide_floats(space),
                                wide_rewards=bool(getattr(getattr(self._env, "unwrapped", None), "rewards_overflowed",
                                                         False)))

    def _env_value_flags(self) -> torch.Tensor | None:
        """[env rows whose own observation or reward was NaN or infinite, the first such row] on the device, since the
        last check (the training env's guard); None without one."""
        return None if self._env_guard is None else self._env_guard.summary()[:2]

    #: whether the scale hint was decided (`_hint_scale`: once per population, for all its members)
    _scale_hinted = False

    def _env_scale(self) -> torch.Tensor | None:
        """[the largest |reward|, the largest |observation value|] of the training env's first steps, on the device
        (NaN where not measured yet: `rlspeed.numerics.EnvValueGuard.scale`, the steps it keeps measured here);
        None without a guard."""
        if self._env_guard is None:
            return None
        self._env_guard.flush()
        return self._env_guard.scale

    def _hint_scale(self, stacklevel: int = 4) -> None:
        """The solo runs' scale hint (`rlspeed.numerics.scale_hint`), once per population: every member shares the
        env and its normalisation settings, so one warning speaks for all of them."""
        from rlspeed.numerics import scale_hint

        scale = None if self._scale_hinted else self._env_scale()
        if scale is None:
            return
        reward, observed = scale.tolist()  # ok-sync: until the first steps are measured, once per population
        if math.isnan(reward):
            return
        self._scale_hinted = True
        hint = scale_hint(reward, observed, bool(getattr(self.config, "normalize_obs", False)),
                          bool(getattr(self.config, "normalize_reward", False)),
                          f"the first steps of the population's envs (all {len(self.alive)} members')",
                          "each member")
        if hint is not None:
            warnings.warn(hint, UserWarning, stacklevel=stacklevel)

    def _drop_diverged(self, left: dict[int, dict]) -> None:
        finite = self._finite_members()
        env = self._env_value_flags()
        self._hint_scale()
        # (one host read: the members' finite flags, then [env rows with their own non-finite values, the first])
        read = torch.cat([finite.long(), env.long()] if env is not None else [finite.long()])
        values = read.tolist()  # ok-sync: once per divergence check
        flags, env_values = values[:len(self.alive)], values[len(self.alive):]
        if env_values and env_values[0] > 0:
            self._env_error(env_values[0], env_values[1])
        diverged = [k for k, ok in zip(self.alive, flags) if not ok]
        if not diverged:
            return
        for k in diverged:
            left[k] = {"diverged_at": self.num_timesteps}
        warnings.warn(f"Population member(s) {', '.join(map(str, diverged))} (seed(s) "
                      f"{', '.join(str(self.seeds[k]) for k in diverged)}) diverged (non-finite parameters) by step "
                      f"{self.num_timesteps} and were dropped (the others continue): to keep such members, "
                      f"{DIVERGED_ADVICE}.", stacklevel=3)
        self.remove(diverged)

    def check_fits(self, total_timesteps: int) -> None:
        """UserError where what `learn(total_timesteps)` would allocate when it starts does not fit in memory, for
        callers that must know before (the CLI, before it makes a run directory). Populations without a replay
        buffer have nothing to check."""

    def learn(self, total_timesteps: int, target_return: float | None = None, eval_freq: int | None = None,
              eval_episodes: int = 10, stop: str = "each", confirm_target: bool = True,
              on_eval: Callable[[int, dict[int, float]], Iterable[int] | None] | None = None,
              run_dir: str | Path | None = None, checkpoint_freq: int | None = None,
              stop_requested: Callable[[], bool] | None = None, progress_bar: bool | None = None,
              checkpoint_interval_s: float | None = None, evaluate_pruned: bool = True,
              **unknown: Any) -> dict[str, Any]:
        """Train every member for `total_timesteps` env steps each, or until every member has reached
        `target_return` in evaluation (deterministic, `eval_episodes` episodes, every `eval_freq` steps per member,
        by default a 40th of `total_timesteps` and at least 2,048 as in a model's `learn`, excluded from the training
        clock; a reaching evaluation is confirmed on fresh episode seeds as `Algorithm.learn` confirms one, unless
        `confirm_target=False`).

        `stop="each"`: a member that reached its target leaves the computation and stops being counted;
        `stop="all"`: it keeps training with the others until all have reached.

        `on_eval(num_timesteps, means)`, called after each evaluation (evaluations run when a target, `on_eval` or
        `eval_freq` is given) with the evaluated means of the members in the population at that evaluation (original
        indices, including those that reached the target at it), returns the members to prune (an iterable of
        original indices, or None): they leave the computation and their summary entry says `"pruned_at":
        num_timesteps`. Members that already left (those that reached the target with `stop="each"` among them) are
        ignored. `evaluate_pruned=False`: pruned members get no final evaluation (`final_eval` None; they are left out
        of its aggregate), for a caller whose pruned members' results are their last evaluation (`rlspeed tune`).

        A member whose parameters stop being finite is dropped with a warning (`"diverged_at"` in its entry, no
        final evaluation); the others are untouched. Members are checked after every iteration where
        `check_divergence_every_iteration`, else every `eval_freq` steps.

        Checkpoints: with `run_dir`, `run_dir/checkpoint.safetensors` (`save`) is written atomically every
        `checkpoint_freq` env steps per member, between iterations (none is due once training ends), so a crash
        loses at most that many steps: `resume` continues from it; with `checkpoint_interval_s` (seconds), also once
        that long has passed since the last one (at most a twentieth of the time spent saving: an interval of at least
        20 saves' time), so a slow env's run loses at most about that much time (`rlspeed train --seeds` without
        --checkpoint-freq: every 60 s). `stop_requested()`, where given, is asked after
        every iteration; True: the checkpoint is written (with `run_dir`) and KeyboardInterrupt raised (the CLI's
        Ctrl-C and SIGTERM); asked once the last iteration is done, True skips the final evaluation.

        Right after `resume`, the loop continues where the checkpoint's left it (evaluations, curves, members that
        reached, were pruned or diverged, training times, the schedules' span) and `total_timesteps` counts from its
        `num_timesteps`; from a checkpoint `save` wrote between learn calls, a new loop starts, as a new call does.

        `progress_bar`: a bar over the env steps per member (as a solo `learn`'s), with the members still training
        (False: no bar; None: the population's `verbose` decides, as a solo model's: a bar unless it is 0, and at 2
        each metrics row, those metrics.csv gets with `run_dir`, printed as a line).

        `total_timesteps=0` (a model's `learn(0)`, Stable-Baselines3's) trains and evaluates nothing: the members and
        their step counts stay as they are, and the summary has no final evaluation (each `final_eval` None); a
        `run_dir` holding a metrics.csv it would not continue is refused all the same, as by a model's `learn(0)`.

        A further call goes on from the step count the last one ended at; its schedules (PPO's and A2C's annealing,
        DQN's exploration) run over its own steps, or, with Stable-Baselines3's `reset_num_timesteps=False`, over the
        whole step count from 0, as a solo model's `learn` runs them.

        Returns the summary dict (`write_summary` writes it as summary.json): per-member time and steps to target,
        final evaluation and `"curve"` (`[[steps, eval_mean], ...]`, every evaluation of it), and the aggregates
        (median, IQM and their 95% bootstrap intervals, `rlspeed.stats`)."""
        if "callback" in unknown and unknown["callback"] is None:  # (no callback, as a model's learn takes it)
            del unknown["callback"]
        if "callback" in unknown:  # (a model's learn takes one: a ported single-model script passes it here too)
            raise UserError("A population's learn takes no callback (a model's learn does): on_eval=fn(num_timesteps, "
                            "means) runs after each evaluation (it returns the members to prune), run_dir with "
                            "checkpoint_freq writes checkpoints, and member_model(k) is member k's model after it.")
        # (SB3's way to continue, as a model's learn takes it: the schedules then span the whole step count from 0)
        whole_count_schedules = unknown.get("reset_num_timesteps", True) is False
        if whole_count_schedules:
            del unknown["reset_num_timesteps"]
        if "verbose" in unknown:  # (SB3's learn has none either: a model takes it, so a population does)
            raise UserError(f"A population's learn takes no verbose: give it when the population is made "
                            f"(Population({self.algo_cls.__name__}, env_id, seeds, verbose=0) trains without output), "
                            "or learn(progress_bar=False) for one call without a bar.")
        refuse_learn_keywords(unknown, self.algo_cls.config_cls, f"Population({self.algo_cls.__name__}, env_id, seeds",
                              PopulationBase.learn)
        verbose = check_verbose(self.verbose)  # (also one set on the population since)
        if progress_bar is None:
            progress_bar = verbose >= 1
        (total_timesteps, eval_freq, eval_episodes, checkpoint_freq, progress_bar,
         confirm_target) = checked_learn_values(total_timesteps, target_return, eval_freq, eval_episodes,
                                                checkpoint_freq, progress_bar, confirm_target, zero_steps=True,
                                                members=max(len(self.alive), 1))
        warn_target_without_time_limit(self._env_spec, target_return)
        if stop not in ("each", "all"):
            raise UserError(f"stop must be 'each' or 'all', got '{stop}'.")
        if not isinstance(evaluate_pruned, bool):
            raise UserError(f"evaluate_pruned must be True or False, got {evaluate_pruned!r}.")
        # members are evaluated towards a target, for `on_eval`, or where an evaluation frequency is given
        evaluating = target_return is not None or on_eval is not None or eval_freq is not None
        if checkpoint_freq is not None and run_dir is None:
            raise UserError(f"checkpoint_freq={checkpoint_freq} needs a run_dir to write the checkpoints to.")
        checkpoint_interval_s = seconds("checkpoint_interval_s", checkpoint_interval_s)
        if checkpoint_interval_s is not None and run_dir is None:
            raise UserError(f"checkpoint_interval_s={checkpoint_interval_s:g} needs a run_dir to write the checkpoints "
                            "to.")
        if run_dir is not None and len(set(self.seeds)) != len(self.seeds):  # (`shared_seeds`' populations)
            raise UserError(f"A population whose seeds repeat ({_seed_text(self.seeds)}) learns without a run_dir: "
                            "its metrics.csv columns and member files are named by seed.")
        if run_dir is not None:  # (also for learn(0), as a model's learn refuses it)
            self._refuse_other_metrics(Path(run_dir))
        if total_timesteps == 0:  # (a model's learn(0), SB3's: nothing trains or is evaluated, the counts stay)
            interval = eval_freq if eval_freq is not None else default_eval_freq(total_timesteps)
            self.summary = self._summary(_LoopProgress.start(self.size, self.num_timesteps, interval, None),
                                         target_return, eval_episodes, stop, evaluate=False)
            return self.summary
        warn_training_alone("a population", "a population trains all its members in one process, so start this "
                            "script without torchrun")
        # (float32 tensors while it trains, also under a caller's float64 default dtype; tensors autograd can train,
        # with gradients on, also inside a caller's torch.no_grad() or torch.inference_mode(), whose modes its exit
        # gives back); an env's close() error, an evaluation env's say, raised once training is done (`CloseErrors`)
        with float32_default(), torch.inference_mode(False), CloseErrors() as close_errors:
            self._check_start_fits(int(total_timesteps))  # (before metrics.csv and the envs)
            logger = self._metrics_logger(run_dir, evaluating)
            if verbose >= 2 and progress_bar:  # (each row printed, and written where there is a run_dir;
                # learn(progress_bar=False) silences the call, rows too, as a solo model's)
                logger = _PrintedRows(f"{self.algo_name} x{self.size}", logger)
            saved = self.progress if self._resumed else None
            if eval_freq is None:  # (a model's rule; a resumed loop keeps its own, as a resumed model's does)
                kept = saved.get("eval_freq") if isinstance(saved, dict) else None
                eval_freq = (kept if isinstance(kept, int) and not isinstance(kept, bool) and kept > 0
                             else default_eval_freq(total_timesteps))
            self._resumed, self.progress = False, None
            self._drop_interrupted_env()
            self._begin(int(total_timesteps), 0 if whole_count_schedules else self.num_timesteps)
            end = self.num_timesteps + int(total_timesteps)
            loop = (_LoopProgress.start(self.size, self.num_timesteps, eval_freq, checkpoint_freq) if saved is None else
                    _LoopProgress.from_checkpoint(saved, self.size, self.num_timesteps, eval_freq, checkpoint_freq))
            self._metrics_since = (loop.member_steps, loop.train_wall_s)  # (a resumed loop's counts go on from there)
            bar = ProgressBar(end - self.num_timesteps, enabled=progress_bar,
                              desc=f"{self.algo_name} {self.env_id} x{self.size}")
            threads_before, grad_before = torch.get_num_threads(), torch.is_grad_enabled()  # (given back, as a model's)
            raising = True  # (TensorBoard's writer is kept for the next call where this one returns)
            try:
                set_training_threads(self.num_threads)  # (as a solo model's learn)
                self._learn_loop(loop, end, eval_freq, evaluating, target_return, eval_episodes, stop, confirm_target,
                                 on_eval, run_dir, stop_requested, bar, logger, checkpoint_interval_s)
                raising = False
            except KeyboardInterrupt:
                self._learn_interrupted = True
                # (what the members reached so far, in the finished summary's form, without its final evaluation)
                self.summary = self._summary(loop, target_return, eval_episodes, stop, final=False)
                raise
            finally:
                torch.set_num_threads(threads_before)
                torch.set_grad_enabled(grad_before)
                bar.close()
                if logger is not None:
                    if logger.last_row is None or logger.last_row["timesteps"] != self.num_timesteps:
                        logger.log(self._metrics_row(loop))  # (where training ended or stopped, between evaluations)
                    logger.close(keep_writer=not raising)
            self.progress = None
            # (a stop asked for as the last iteration ended: the training is done, its final evaluation skipped)
            skip_final = stop_requested is not None and stop_requested()
            self._evaluation_stop = stop_requested  # (one that comes during the final evaluation skips it too)
            # (the final evaluation on the members' threads too, as `summarize`'s: on the caller's count it started
            # torch's OpenMP threads, which a process forked after it (a sweep's Pool worker) hung on)
            set_training_threads(self.num_threads)
            try:
                self.summary = self._summary(loop, target_return, eval_episodes, stop, evaluate=not skip_final,
                                             evaluate_pruned=evaluate_pruned)
            except EvaluationStopped:
                self.summary = self._summary(loop, target_return, eval_episodes, stop, evaluate=False)
            finally:
                self._evaluation_stop = None
                torch.set_num_threads(threads_before)
            close_errors.raise_first()
            return self.summary

    def _refuse_other_metrics(self, run_dir: Path) -> None:
        """UserError where `run_dir` holds a metrics.csv this population's `learn` does not continue: another run's,
        or its own run's that it left for another run_dir (`refuse_other_metrics`); a population that has trained
        continues its run's file (the run it last wrote to, or was resumed from)."""
        own = self._metrics_dir == run_dir.resolve()
        if holds_metrics(run_dir) and not (self.num_timesteps and own):
            refuse_other_metrics(run_dir, "population", self.num_timesteps, self._metrics_dir,
                                 self.__dict__.get("_left_runs", {}).get(run_dir.resolve()))

    def _metrics_logger(self, run_dir: str | Path | None, evaluating: bool) -> RunLogger | None:
        """`learn`'s metrics.csv (and TensorBoard events) in `run_dir`, which `_refuse_other_metrics` let it write
        to: a row per evaluation, each member's mean and episodes cut short at the step limit in columns
        `eval_mean/seed_S` and `eval_unfinished/seed_S` of its own, and one where training ends."""
        if run_dir is None:
            return None
        run_dir = Path(run_dir)
        left = self.__dict__.setdefault("_left_runs", {})  # (run directories it wrote before: the step it left at)
        # (a file an earlier rlspeed began keeps its column `eval_unfinished`, all members' cut episodes summed, with
        # its rows' values; the rows written from here on leave it empty)
        columns = (("members", *(f"eval_mean/seed_{seed}" for seed in self.seeds),
                    *(f"eval_unfinished/seed_{seed}" for seed in self.seeds)) if evaluating else ("members",))
        if self._tensorboard is None:
            self._tensorboard = KeptWriter()
        logger = RunLogger(run_dir, continue_from=self.num_timesteps or None, columns=columns, plot=False,
                           kept=self._tensorboard)
        if self._metrics_dir is not None and self._metrics_dir != run_dir.resolve():
            left[self._metrics_dir] = self.num_timesteps
        self._metrics_dir = run_dir.resolve()
        return logger

    def _metrics_row(self, loop: _LoopProgress, means: dict[int, float] | None = None) -> dict:
        """A metrics.csv row at this step: the training clock, the env steps per second of all members since the
        previous row (of this `learn` call), the members training, and `means` (member -> evaluated mean) in their
        seeds' columns, with `eval_unfinished/seed_S`, each evaluated member's episodes cut short at the step
        limit."""
        steps, wall = self._metrics_since or (0, 0.0)
        self._metrics_since = (loop.member_steps, loop.train_wall_s)
        # (`last_unfinished` is of the members evaluated, in the order of `means`)
        cut = {f"eval_unfinished/seed_{self.seeds[k]}": int(count)
               for k, count in zip(means or {}, self.last_unfinished or [0] * len(means or {}))}
        return {"timesteps": self.num_timesteps, "train_wall_s": loop.train_wall_s,
                "sps": (loop.member_steps - steps) / max(loop.train_wall_s - wall, 1e-9), "members": len(self.alive),
                **{f"eval_mean/seed_{self.seeds[k]}": mean for k, mean in (means or {}).items()}, **cut}

    def finish_resumed(self, target_return: float | None = None, eval_episodes: int = 10,
                       stop: str = "each") -> dict[str, Any]:
        """The summary `learn` ends with (a final evaluation of every member that did not diverge, each member's
        entry, the aggregates), without training: for a population `resume`d from a checkpoint that holds its whole
        budget (a run stopped as its last iteration ended, or killed before its summary was written). The loop's
        measurements (curves, steps and time to target) are the checkpoint's. `target_return`, `eval_episodes` and
        `stop` are `learn`'s (give those of the run being finished). Returns the summary dict, as `learn` does;
        UserError for a population that was not resumed."""
        if not self._resumed:
            raise UserError("finish_resumed ends a population resumed from a checkpoint (resume(path)): this one was "
                            "not; learn trains it.")
        if stop not in ("each", "all"):
            raise UserError(f"stop must be 'each' or 'all', got '{stop}'.")
        eval_episodes = positive_whole("eval_episodes", eval_episodes)
        saved, self._resumed, self.progress = self.progress, False, None
        loop = (_LoopProgress.start(self.size, self.num_timesteps, 10_000, None) if saved is None else
                _LoopProgress.from_checkpoint(saved, self.size, self.num_timesteps, 10_000, None))
        grad_before = torch.is_grad_enabled()
        try:
            with training_threads(self.num_threads), float32_default():
                self.summary = self._summary(loop, target_return, eval_episodes, stop)
        finally:
            torch.set_grad_enabled(grad_before)
        return self.summary

    def _learn_loop(self, loop: _LoopProgress, end: int, eval_freq: int, evaluating: bool, target_return, eval_episodes,
                    stop: str, confirm_target: bool, on_eval, run_dir, stop_requested, bar: ProgressBar,
                    logger: RunLogger | _PrintedRows | None = None, checkpoint_interval_s: float | None = None) -> None:
        """`learn`'s iterations until `end` env steps per member, the target, or no member left."""
        clock_start, cpu_start = time.perf_counter(), time.process_time()
        last_checkpoint, checkpoint_cost = clock_start, 0.0  # (`checkpoint_interval_s`)
        # (training clock, busy seconds and member steps from here, until the note on in-process envs that wait is
        # decided, `waiting_advice`; None: not asked)
        noting = ((loop.train_wall_s, waiting.busy_seconds(), loop.member_steps)
                  if self.env_backend == "gymnasium" and not waiting.noted else None)
        hint_tried = clock_start  # (`HINT_EVERY_S`)
        while self.num_timesteps < end and self.alive:
            training = len(self.alive)
            before = self.num_timesteps
            loop.member_steps += self.train_iteration() * training
            bar.update(self.num_timesteps - before, members=len(self.alive))
            if not self._scale_hinted and time.perf_counter() - hint_tried >= HINT_EVERY_S:
                self._hint_scale(stacklevel=3)  # (the line in `learn`, as from `_drop_diverged`)
                hint_tried = time.perf_counter()
            due = self.num_timesteps >= loop.next_eval or self.num_timesteps >= end
            if due or self.check_divergence_every_iteration:
                self._drop_diverged(loop.left)
            loop.train_wall_s += time.perf_counter() - clock_start  # (evaluations and checkpoints are not training)
            loop.train_cpu_s += time.process_time() - cpu_start
            if noting is not None and loop.train_wall_s - noting[0] >= waiting.MEASURED_S:
                waiting.note_if_waiting(self.env_id, waiting.busy_seconds() - noting[1], loop.train_wall_s - noting[0],
                                        loop.member_steps - noting[2], training * self.config.num_envs,
                                        "--env-backend gymnasium-async (env_backend='gymnasium-async')")
                noting = None
            finished = False
            if due:
                loop.next_eval = next_due(self.num_timesteps, eval_freq)
                if evaluating and self.alive:
                    finished = self._evaluation_point(loop, target_return, eval_episodes, stop, confirm_target,
                                                      on_eval, logger)
            if finished or self.num_timesteps >= end or not self.alive:
                break
            requested = stop_requested is not None and stop_requested()
            if run_dir is not None:
                now = time.perf_counter()
                timed = checkpoint_interval_s is not None and (
                    now - last_checkpoint >= max(checkpoint_interval_s, 20 * checkpoint_cost))
                if self._checkpoint_if_due(loop, run_dir, requested or timed):
                    last_checkpoint = time.perf_counter()
                    checkpoint_cost = last_checkpoint - now
            if requested:
                raise KeyboardInterrupt
            clock_start, cpu_start = time.perf_counter(), time.process_time()

    def _evaluate_during_learn(self, seeds: Sequence[int], episodes: int, members: Sequence[int]) -> torch.Tensor:
        """`learn`'s evaluations during training (curves, confirmations, `on_eval`): `evaluate`'s, except that a
        population may act there through its members' batched networks (one product per layer, not one per member),
        whose float32 rounding can differ from their solo models' in the last bit (`OffPolicyPopulation`'s); the
        final evaluation, which `rlspeed eval MEMBER --seed S` repeats digit for digit, is `evaluate`'s."""
        return self.evaluate(seeds, episodes, members)

    def _evaluation_point(self, loop: _LoopProgress, target_return: float | None, eval_episodes: int, stop: str,
                          confirm_target: bool, on_eval: Callable | None,
                          logger: RunLogger | _PrintedRows | None = None) -> bool:
        """One evaluation of the members in the computation (`learn`'s, at `num_timesteps`): each one's mean goes on
        its curve; with a target, those that reach it for the first time (confirmed on fresh episode seeds with
        `confirm_target`) are marked reached at the training clock and, with `stop="each"`, leave the computation;
        then `on_eval` prunes. Returns True when a target is set and every member in the computation has reached
        it."""
        members = list(self.alive)
        means = self._evaluate_during_learn([evaluation_seed(self.seeds[k], "learn", self.num_timesteps)
                                             for k in members],
                                            eval_episodes, members).tolist()
        unfinished = self.last_unfinished  # (this evaluation's, which `on_eval` reads: not a confirmation's)
        for k, mean in zip(members, means):
            loop.curves[k].append([self.num_timesteps, mean])
        if logger is not None:  # (the members' means before any leaves: "members" counts those evaluated)
            logger.log(self._metrics_row(loop, dict(zip(members, means))))
        if target_return is not None:
            hits = [k for k, mean in zip(members, means) if not loop.reached[k] and mean >= target_return]
            if confirm_target and hits:
                confirming = self._evaluate_during_learn(
                    [evaluation_seed(self.seeds[k], "confirm", self.num_timesteps) for k in hits], eval_episodes,
                    hits).tolist()
                for k, mean, cut in zip(hits, confirming, self.last_unfinished or [0] * len(hits)):
                    loop.confirmations[k].append([self.num_timesteps, mean])
                    loop.confirmations_unfinished[k].append(cut)
                    loop.confirmations_episodes[k].append(eval_episodes)
                hits = [k for k, mean in zip(hits, confirming) if mean >= target_return]
            for k in hits:
                loop.reached[k] = True
                loop.time_to_target_s[k], loop.steps_to_target[k] = loop.train_wall_s, self.num_timesteps
            if stop == "each":  # (before on_eval: a member that reached its target is not also pruned)
                self.remove(hits)
        if on_eval is not None:
            self.last_unfinished = unfinished
            self._prune(on_eval(self.num_timesteps, dict(zip(members, means))), loop.left)
        return target_return is not None and all(loop.reached[k] for k in self.alive)

    def _checkpoint_if_due(self, loop: _LoopProgress, run_dir: str | Path, requested: bool) -> bool:
        """Between `learn`'s iterations: write `run_dir`'s checkpoint (`save`, with the loop's progress) when
        the step count reached the next multiple of `checkpoint_freq` (`next_due`) or one is
        `requested` (a stop, or the time since the last one); whether it was written."""
        due = loop.next_checkpoint is not None and self.num_timesteps >= loop.next_checkpoint
        if not (requested or due):
            return False
        if due:
            loop.next_checkpoint = next_due(self.num_timesteps, loop.checkpoint_freq)
        self.progress = loop.snapshot()
        self.save(Path(run_dir) / CHECKPOINT_NAME)
        return True

    def _summary(self, loop: _LoopProgress, target_return: float | None, eval_episodes: int, stop: str,
                 final: bool = True, evaluate: bool = True, evaluate_pruned: bool = True) -> dict:
        """`learn`'s summary after its loop: a final evaluation of every member that did not diverge, each member's
        entry and the aggregates; `final` False (an interrupted loop): the same keys, `"interrupted": True`, and no
        final evaluation (each member's `final_eval` and the aggregate's None); `evaluate` False (a finished loop
        whose final evaluation a stop request skipped): no final evaluation either; `evaluate_pruned` False: none for
        the members pruned."""
        unscored = {"diverged_at"} if evaluate_pruned else {"diverged_at", "pruned_at"}
        scored = ([k for k in range(self.size) if unscored.isdisjoint(loop.left.get(k, {}))]
                  if final and evaluate else [])
        final_seeds = {k: evaluation_seed(self.seeds[k], "final", final_steps(
            {**loop.left.get(k, {}), "steps_to_target": loop.steps_to_target[k]}, stop, self.num_timesteps))
            for k in scored}
        final_means = (self.evaluate([final_seeds[k] for k in scored], eval_episodes, scored).tolist()
                       if scored else [])
        finals_by_member = dict(zip(scored, final_means))
        rates = dict(zip(scored, self.last_success_rates)) if scored and self.last_success_rates else {}
        stds = dict(zip(scored, self.last_return_stds)) if scored and self.last_return_stds else {}
        cut = dict(zip(scored, self.last_unfinished)) if scored and self.last_unfinished else {}
        members = []
        for k, seed in enumerate(self.seeds):
            entry = {"seed": seed, "hyperparameters": self._member_hyperparameters(k),
                     "time_to_target_s": _seconds(loop.time_to_target_s[k]),
                     "steps_to_target": loop.steps_to_target[k],
                     # (the seed: `rlspeed eval MEMBER --seed S` repeats the evaluation)
                     "final_eval": ({"mean": finals_by_member[k], "std": stds.get(k), "episodes": eval_episodes,
                                     "seed": final_seeds[k], "deterministic": True,
                                     **({"success_rate": rates[k]} if rates.get(k) is not None else {}),
                                     **({"unfinished": cut[k]} if cut.get(k) else {})}
                                    if k in finals_by_member else None),
                     "curve": loop.curves[k], "confirmations": loop.confirmations[k],
                     "confirmations_unfinished": loop.confirmations_unfinished[k],
                     "confirmations_episodes": loop.confirmations_episodes[k]}
            entry.update(loop.left.get(k, {}))
            members.append(entry)
        finals = [mean for mean in finals_by_member.values() if math.isfinite(mean)]
        reached_steps = [s for s in loop.steps_to_target if s is not None]
        reached_times = [_seconds(t) for t in loop.time_to_target_s if t is not None]
        exits = loop.left.values()
        return {
            "algo": self.algo_name, "env_id": self.env_id, "population": self.size, "seeds": self.seeds,
            "device": str(self.device), "env_backend": self.env_backend,
            "update": {"implementation": self.update_path, "reason": self.update_reason},
            # (a single run's `accelerate` entry: populations train without the acceleration layer)
            "accelerate": {"precision": "fp32", "compile": "off"},
            # (how the members' own encoders run: `MemberEncoder.mode`; None without one)
            "member_encoder": None if self._member_encoder is None else self._member_encoder.mode, "stop": stop,
            "total_timesteps": self.num_timesteps, "train_wall_s": _seconds(loop.train_wall_s),
            "train_cpu_s": _seconds(loop.train_cpu_s),
            "sps": round(loop.member_steps / loop.train_wall_s, 1) if loop.train_wall_s > 0 else 0.0,
            "target_return": target_return,
            "reached": sum(loop.reached), "pruned": sum("pruned_at" in v for v in exits),
            "diverged": sum("diverged_at" in v for v in exits), "interrupted": not final, "members": members,
            "aggregate": {"final_eval": aggregate(finals) if finals else None,
                          # (goal envs: each member's final success rate, aggregated as the returns are)
                          **({"final_success_rate": aggregate([r for r in rates.values() if r is not None])}
                             if any(r is not None for r in rates.values()) else {}),
                          "steps_to_target": aggregate(reached_steps) if reached_steps else None,
                          "time_to_target_s": aggregate(reached_times) if reached_steps else None},
        }

    def _prune(self, returned, left: dict[int, dict]) -> None:
        """Take out the members `on_eval` returned (original indices, or None), each marked `pruned_at`."""
        size = self.size
        try:
            pruned = [int(k) for k in (() if returned is None else returned)]
        except (TypeError, ValueError):
            raise UserError(f"on_eval must return the members to prune as a list of indices (or None), got "
                            f"{returned!r}.") from None
        unknown = [k for k in pruned if not 0 <= k < size]
        if unknown:
            raise UserError(f"on_eval returned member(s) {', '.join(map(str, unknown))}, outside "
                            f"0..{size - 1}: return original member indices.")
        pruned = [k for k in pruned if k in self.alive]
        for k in pruned:
            left[k] = {"pruned_at": self.num_timesteps}
        self.remove(pruned)

    def close(self) -> None:
        """Close the members' training envs (subprocesses, EnvPool's threads) and the TensorBoard events file its
        `learn` calls into a run directory wrote on. The population stays usable (evaluate, save, write_summary); a
        later `learn` makes new envs, whose episodes start afresh. Closing twice is a no-op.
        `with Population(...) as population:` closes it at the block's end."""
        if self._tensorboard is not None:
            self._tensorboard.close()
        env, self._env, self._obs = self._env, None, None
        if env is not None:
            env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def write_summary(self, path: str | Path) -> Path:
        """Write the last `learn`'s summary as JSON (summary.json) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.summary, indent=2, ensure_ascii=False))  # (UTF-8, whole or not at all)
        return path
