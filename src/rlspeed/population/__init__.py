"""Populations: K independent agents (seeds and per-member hyperparameters) trained in one process as one batched
model. `Population(ALGO, env_id, seeds=...)` picks the implementation for the algorithm class; each module states
what it covers. See docs/population.md."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rlspeed.algos.base import Algorithm
from rlspeed.errors import UserError
from rlspeed.population.a2c import PER_MEMBER_A2C, A2CPopulation
from rlspeed.population.base import PopulationBase
from rlspeed.population.offpolicy import (
    PER_MEMBER_DQN,
    PER_MEMBER_SAC,
    PER_MEMBER_TD3,
    DDPGPopulation,
    DQNPopulation,
    SACPopulation,
    TD3Population,
)
from rlspeed.population.ppo import PER_MEMBER, SHARED_ONLY, PPOPopulation

#: algorithm class name -> the population class that trains it (the one list: `Population`, `rlspeed train --seeds`
#: and `rlspeed tune` read it)
IMPLEMENTATIONS: dict[str, type] = {"PPO": PPOPopulation, "A2C": A2CPopulation, "SAC": SACPopulation,
                                     "TD3": TD3Population, "DDPG": DDPGPopulation, "DQN": DQNPopulation}


def Population(algo_cls: type[Algorithm], env_id: str, seeds: Iterable[int],  # noqa: N802 (a class-like factory)
               **kwargs: Any) -> PopulationBase:
    """K members of `algo_cls` on `env_id`, one per seed of `seeds` (distinct), as one batched model: `.learn(...)`
    trains them all and returns the summary (per-member results and aggregates). Keywords are those of the population
    class for the algorithm (`PPOPopulation`, `A2CPopulation`, ...): hyperparameters (one value, or a list of K for
    the per-member ones), `member_overrides`, `members` (solo models, one per seed, to start from), `env_backend`,
    `save_replay_buffer` (off-policy), `verbose` (what `learn` prints, as a solo model's: 0, 1 or 2) and `device`,
    which is "cpu" unless given (a solo model's "auto" picks the accelerator; a population is placed where you say:
    `device="cuda"`)."""
    if not isinstance(algo_cls, type):  # (a name: the class is what members are made of)
        named = {name.lower(): name for name in IMPLEMENTATIONS}.get(str(algo_cls).lower())
        every = ", ".join(f"rlspeed.{n}" for n in sorted(IMPLEMENTATIONS))
        classes = f"rlspeed.{named}" if named else f"one of {every}"
        raise UserError(f"Population takes the algorithm's class ({classes}), not {algo_cls!r}.")
    name = algo_cls.__name__
    implementation = IMPLEMENTATIONS.get(name)
    if implementation is None:
        # (a user's subclass, its own loss, encoder or networks; rlspeed's own subclasses, RecurrentPPO's, are not)
        base = None if algo_cls.__module__.startswith("rlspeed.") else next(
            (klass.__name__ for klass in algo_cls.__mro__[1:] if klass.__module__.startswith("rlspeed.")
             and klass.__name__ in IMPLEMENTATIONS), None)
        if base is not None:
            raise UserError(f"Populations train rlspeed's own {base}, not {name}, a subclass of it: the batched "
                            "members run rlspeed's networks and update, not the subclass's overrides (its encoder, "
                            f"loss or networks); train {name} solo, one model per seed.")
        raise UserError(f"Populations cover {', '.join(sorted(IMPLEMENTATIONS))} so far, not {name}.")
    if "seed" in kwargs:
        raise UserError("A population's members take their seeds from seeds=[...] (one per member), not seed=.")
    return implementation(algo_cls, env_id, seeds, **kwargs)


def _population_of_models(models: Sequence[Algorithm], files: Sequence[dict[str, torch.Tensor]]) -> PopulationBase:
    """The population whose members are `models` (solo models of one rlspeed algorithm, as loaded from member files;
    `files`: each one's tensors as a checkpoint names them, `Algorithm._state_tensors`), to evaluate them as one
    batch (its `evaluate`): the population class's `members`. UserError, saying why, where they are not one
    population's members (another class, env, backend, device or seed, settings other than the per-member ones that
    differ) or where the population built does not hold exactly those tensors."""
    first = models[0]
    implementation = IMPLEMENTATIONS.get(type(first).__name__)
    # (a class of the user's own of the same name: the population's build refuses it, `_given_solos`)
    if implementation is None or any(type(model) is not type(first) for model in models):
        raise UserError("The members are not all models of one algorithm a population trains.")
    seeds = [model.seed for model in models]
    with warnings.catch_warnings():  # (training's notes: the members were trained already)
        warnings.simplefilter("ignore")
        # (their env backend and options, as every other setting, the population takes from them)
        population = implementation(type(first), first.env_id, seeds, device=first.device, verbose=0, members=models)
    for k, tensors in enumerate(files):  # (what the batched evaluation plays with is what the files hold)
        held = {**population._member_checkpoint(k), **population.member_statistics(k)}
        if any(name not in tensors or not torch.equal(tensors[name].to(value.device, value.dtype), value)
               for name, value in held.items()):
            raise UserError(f"Member {seeds[k]}'s population does not hold its file's tensors.")
    return population


__all__ = ["A2CPopulation", "DDPGPopulation", "DQNPopulation", "IMPLEMENTATIONS", "PER_MEMBER", "PER_MEMBER_A2C",
           "PER_MEMBER_DQN", "PER_MEMBER_SAC", "PER_MEMBER_TD3", "PPOPopulation", "Population", "SACPopulation",
           "SHARED_ONLY", "TD3Population"]
