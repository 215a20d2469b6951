"""Evaluation: a deterministic policy on an env separate from training, N episodes run side by side."""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import sys
import typing

import gymnasium as gym
import numpy as np
import torch

import rlspeed
from rlspeed.buffers.replay import refuse_unless_fits
from rlspeed.device import _current_index, float32_default, resolve_device, training_threads
from rlspeed.envs import SeedOnFirstReset, _check_env_id, atari, make_env, remakeable, resolve_backend
from rlspeed.envs.base import (
    BatchedEnv,
    EnvWrapper,
    check_seed,
    counted,
    find_episode_statistics,
    observation_layout,
    space_text,
    space_to_json,
)
from rlspeed.envs.envpool_env import check_envpool_seeds, envpool_only, gymnasium_versions
from rlspeed.envs.gymnasium_env import (
    USER_SB3_VEC_ENV,
    USER_VECTOR_ENV,
    _wrapper_layers,
    close_quietly,
    life_loss_wrappers,
    resting_finished_rows,
)
from rlspeed.envs.packages import registering_modules
from rlspeed.envs.sb3_env import VecEnvLike, is_sb3_vec_env, monitored, reported_reward_wrappers, vec_normalize_of
from rlspeed.errors import (
    UserError,
    close_errors_last,
    in_words,
    no_such_keyword,
    positive_whole,
    sb3_name_advice,
    true_or_false,
    warn_at_caller,
)
from rlspeed.logging import ProgressBar

# (the model's class is named through the package, `rlspeed.algos.Algorithm`, which typing.get_type_hints imports
# as it resolves the annotation: an import of it here would close a cycle, algos.base calling this module)
if typing.TYPE_CHECKING:
    import rlspeed.algos


def env_options(model, env_id: str | None, env_kwargs: dict | None = None) -> dict:
    """The options an env of `env_id` is made with for `model`: those its own env was made with (`spec.env_kwargs`,
    on its own id) with `env_kwargs` over them (evaluate, videos and `rlspeed eval` take the same)."""
    return {**(model.spec.env_kwargs if env_id in (None, model.env_id) else {}), **(env_kwargs or {})}


#: what sb3-contrib's use_masking, given to an evaluation (evaluate's, EvalCallback's), is told after the one that
#: evaluates
MASKING_ADVICE = ("masks as the model does (its use_masking, on by default: leave it out), and a model loaded with "
                  "PPO.load(path, use_masking=False) evaluates unmasked")

#: Stable-Baselines3's `evaluate_policy` keywords rlspeed's `evaluate` has no counterpart of, and what to write instead
SB3_EVALUATE_KEYWORDS = {
    "n_eval_episodes": "rlspeed's is episodes=N",
    "return_episode_rewards": "evaluate returns a dict whose 'returns' and 'lengths' are each episode's (its 'mean' "
                              "and 'std' their statistics)",
    "render": "rlspeed.record_video(model, path) records episodes to a video file (rlspeed eval --video)",
    "reward_threshold": "compare the result's 'mean' with it",
    "callback": "evaluate plays the episodes on the device in one loop, with no per-step call",
    "warn": "evaluate counts the env's own episodes (an SB3 VecEnv's Monitor's, where each env has one) and warns "
            "only where a wrapper changes their rewards or ends them at a lost life: leave it out",
    "use_masking": f"sb3-contrib's evaluate_policy takes it; evaluate {MASKING_ADVICE}",
}


def gym_packages(model) -> list[str]:
    """The modules that register `model`'s env id (`registering_modules`: what `save` and an export's sidecar record
    as `gym_packages`), else those the file the model was loaded from records (an id no module registered in this
    process: a file moved without its run)."""
    return registering_modules(model.env_id) or list(model.recorded_gym_packages)


def recorded_modules_advice(model) -> str:
    """Where no module registered `model`'s env id here, how to register it for the refusal naming the id
    (`unregistered_id_refusal`): import the modules the file it was loaded from records as registering it
    (`recorded_gym_packages`: a file moved without its run; Python's `load` imports none of them, docs/checkpoints.md,
    `rlspeed eval` does and says so); where they are imported and registered no such id (an id that a module other
    than its env's registers), that the file cannot name the module; "" where the file records none or the id is
    registered."""
    recorded = model.recorded_gym_packages
    if not recorded or remakeable(model.env_id):
        return ""
    many = len(recorded) > 1
    if all(module in sys.modules for module in recorded):
        return (f"{', '.join(recorded)}, which the model's file records as its env's module{'s' if many else ''}, "
                f"{'are' if many else 'is'} imported and registered no such id (another module registers it, which "
                f"the file cannot name), so {_UNRECORDED_MODULE_ADVICE}")
    return (f"the model's file records the module{'s' if many else ''} that register{'' if many else 's'} it, so "
            f"import {'them' if many else 'it'} first ({'; '.join(f'import {module}' for module in recorded)}: "
            f"loading a model imports no module; `rlspeed eval MODEL` imports {'them' if many else 'it'})")


#: how to register an env id whose module a model's file cannot name (`recorded_modules_advice`)
_UNRECORDED_MODULE_ADVICE = ("import the module that registers it first (rlspeed eval MODEL --gym-packages MODULE; an "
                            "env of a script's own moved into a module first)")


def unregistered_id_refusal(model, instead: str) -> str:
    """The refusal of a use of `model` that makes envs of its env id where nothing here registered the id (evaluate,
    a loaded model's learn): how to register it (`recorded_modules_advice` where the model's file records the modules,
    else that it names none, as `registering_modules` records none for a script's env, and
    `_UNRECORDED_MODULE_ADVICE`); then `instead`, the caller's way with an env one built ("or give it ...")."""
    how = recorded_modules_advice(model) or (
        "the model's file names no module that registers it (a script registered it, in __main__, or a module other "
        f"than its env's did: no file can name that module), so {_UNRECORDED_MODULE_ADVICE}")
    return f"This model trained on '{model.env_id}', which is not a registered id here: {how}; {instead}."


def refuse_evaluate_keywords(keywords: dict, function: typing.Callable | None = None) -> None:
    """UserError for the first of `keywords` that `function` (default `evaluate`; `Algorithm.evaluate` names
    itself) does not take: a keyword of Stable-Baselines3's `evaluate_policy` (with rlspeed's way), or a typo (the
    close names among `function`'s own parameters)."""
    import inspect

    taken = [name for name, parameter in inspect.signature(function or evaluate).parameters.items()
             if parameter.kind is not inspect.Parameter.VAR_KEYWORD and name != "self"]
    for key in keywords:
        advice = SB3_EVALUATE_KEYWORDS.get(key)
        if advice is not None:
            raise UserError(f"evaluate's '{key}' is Stable-Baselines3's; {advice}.")
        raise no_such_keyword("evaluate", key, taken)


def check_evaluated_model(model, caller: str = "evaluate", command: str = "rlspeed eval PATH") -> None:
    """UserError in one sentence where the model of `caller` (rlspeed.evaluate, rlspeed.record_video) is no rlspeed
    model (each failed at its first attribute, an AttributeError about `env_id`): a checkpoint's path, which the
    command line's `command` takes, or a Stable-Baselines3 model."""
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        raise UserError(f"{caller} takes a model, not a path ({str(model)[:80]!r}): load it first, "
                        f"rlspeed.{caller}(PPO.load(path), ...) with the model's class ({command} on the "
                        "command line).")
    if not hasattr(type(model), "act") or not hasattr(model, "spec") or not hasattr(model, "env_id"):
        sb3 = " (Stable-Baselines3's models: their own evaluate_policy)" if type(model).__module__.startswith(
            ("stable_baselines3", "sb3_contrib")) else ""
        raise UserError(f"{caller} takes an rlspeed model (PPO(...), PPO.load(path), ...), not a "
                        f"{type(model).__name__}{sb3}.")


#: host memory an evaluation keeps per episode, in bytes: its return and length in the result (a float and an int
#: object, 24 and 28 bytes) and a list slot each in the returns, lengths, successes and each env row's quota (8 bytes
#: each), with room for the lists' growth
EVALUATION_BYTES_PER_EPISODE = 96


def refuse_unless_results_fit(episodes: int, members: int = 1,
                              option: str = "episodes=N; --episodes N on the command line") -> None:
    """UserError (`refuse_unless_fits`, on the host), naming the episodes that fit and the `option` that sets them,
    where what an evaluation of `episodes` episodes (of each of a population's `members`) keeps of each
    (`EVALUATION_BYTES_PER_EPISODE`) would not fit in memory."""
    per_count = members * EVALUATION_BYTES_PER_EPISODE
    each = f" of each of {members:,} members" if members > 1 else ""
    refuse_unless_fits(episodes * per_count, torch.device("cpu"),
                       f"An evaluation of {episodes:,} episodes{each} (each one's return and length, kept in its "
                       "result)", lambda budget: f"evaluate at most {budget // per_count:,} episodes{each} at once "
                                                 f"({option})")


#: the steps an evaluation episode runs at most where neither `max_steps` nor the env's time limit says (a continuing
#: env's episodes never end): it then counts with the return collected so far
UNLIMITED_EPISODE_STEPS = 10_000


#: what `warn_unfinished` tells to do (`_unfinished_advice`): `evaluate(max_steps=N)` runs longer (learn's evaluations
#: and EvalCallback take no `max_steps`); an env made from an id takes a time limit as an option (the model's
#: `env_kwargs` reach its evaluations)
RUN_LONGER = "evaluate(max_steps=N) runs them longer"
TIME_LIMIT = ("env_kwargs={'max_episode_steps': N}, or --env-kwargs max_episode_steps=N on the command line, gives the "
              "env a time limit of N steps")
#: `TIME_LIMIT` in a command line's terms, the one way it has to run them longer (it has no max_steps)
_CLI_TIME_LIMIT = "--env-kwargs max_episode_steps=N gives the env a time limit of N steps"


def episode_step_limit(env: BatchedEnv, max_steps: int | None) -> int:
    """The steps an evaluation episode runs at most: `max_steps`, else the env's time limit, else
    `UNLIMITED_EPISODE_STEPS`."""
    return max_steps if max_steps is not None else (env.spec.max_episode_steps or UNLIMITED_EPISODE_STEPS)


def _unfinished_advice(time_limit: bool, in_training: bool) -> str:
    """How to run an evaluation's unfinished episodes longer: `RUN_LONGER`, and for an env made from an id
    (`time_limit`) `TIME_LIMIT`, which holds in training too where `in_training` (a population's evaluations); inside
    the `rlspeed` command (`in_words`) the time limit alone, in its terms (the command line has no max_steps)."""
    if not time_limit:
        return RUN_LONGER
    where = ", in training too" if in_training else ""
    return in_words(f"{_CLI_TIME_LIMIT}{where}", f"{RUN_LONGER}; {TIME_LIMIT}{where}")


def warn_unfinished(unfinished: int, episodes: int, limit: int, time_limit: bool, unstarted: int = 0,
                    in_training: bool = False) -> None:
    """The warning of an evaluation whose `unfinished` of `episodes` episodes were still running after `limit` steps
    (and `unstarted` never started within them: a vector env of the caller's), with how to run them longer
    (`_unfinished_advice`: `time_limit` where the env was made from an id, `in_training` where that limit is the
    training env's too)."""
    warn_at_caller(f"evaluate: {unfinished} of {episodes} episodes were still running after {limit} steps; they count "
                   "with the return collected so far" + (
                       f", and {unstarted} did not start within the {limit} steps per episode the evaluation runs"
                       if unstarted else "") + f" ({_unfinished_advice(time_limit, in_training)}).", UserWarning)


def warn_target_without_time_limit(spec, target_return: float | None) -> None:
    """The warning of a target on an env without a time limit (a continuing task, or one whose untrained policy never
    ends an episode): its evaluations count episodes cut at the step limit, so the target must be on that scale
    (said in a command line's terms inside the `rlspeed` command: `in_words`)."""
    if target_return is not None and spec.max_episode_steps is None:
        warn_at_caller(f"{spec.env_id} has no time limit: an evaluation episode still running after "
                       f"{UNLIMITED_EPISODE_STEPS:,} steps counts with the return collected by then, so "
                       + in_words(f"the target {target_return:g}", f"target_return {target_return:g}")
                       + f" is compared with such returns where episodes do not end "
                       f"({in_words(_CLI_TIME_LIMIT, TIME_LIMIT)}).", UserWarning)


def _one_env_vector(env: gym.Env) -> gym.vector.VectorEnv:
    """A Gymnasium vector env of the one env `env` (as Stable-Baselines3's evaluate_policy wraps a single env in a
    DummyVecEnv): it runs every episode in turn, unseeded as any env a caller passes, and stays open."""
    return gym.vector.SyncVectorEnv([lambda: env], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def _close_evaluation_env(env, failure: BaseException | None) -> None:
    """Close the env an evaluation made; where the evaluation failed (`failure`: an env's step error, say), an error
    the env's close() raises too is dropped: the first error is the one to show."""
    if failure is None:
        env.close()  # (a batched env's close says its envs' close() errors by `close_envs`'s rule)
    else:
        close_quietly(env)


def as_evaluation_env(env, caller: str):
    """What `caller` (`evaluate`, `EvalCallback`) evaluates on for `env`, the one rule of which envs can be evaluated:
    None or an env id as given, a vector env (Gymnasium's or Stable-Baselines3's) or an env `rlspeed.make_env` made as
    it is, and a single `gymnasium.Env` (a Stable-Baselines3 `Monitor` around one too) as a Gymnasium vector env of
    one, as Stable-Baselines3 wraps one; UserError in one sentence for anything else."""
    if isinstance(env, gym.Env):
        return _one_env_vector(env)
    if env is not None and not isinstance(env, (BatchedEnv, gym.vector.VectorEnv)) and not is_sb3_vec_env(env):
        _check_env_id(env, caller, also=", a single gymnasium.Env, an env rlspeed.make_env made")
    return env


@close_errors_last("the evaluation's result, every episode's score")
def evaluate(model: rlspeed.algos.Algorithm,
             env_id: str | BatchedEnv | gym.vector.VectorEnv | VecEnvLike | gym.Env | None = None,
             episodes: int = 10, seed: int | None = None,
             deterministic: bool = True, backend: str = "auto", device: str | torch.device | None = None,
             max_steps: int | None = None, env_kwargs: dict[str, typing.Any] | None = None,
             progress_bar: bool = False, **stable_baselines3: typing.Any) -> dict[str, typing.Any]:
    """Run `episodes` episodes of `model` (in parallel, one per env row of an env this call makes; in waves of
    `evaluation_env_cap(backend)` envs where they are more, each episode seeded as in one env of them all) and return
    their returns.

    Returns ``{"mean", "std", "episodes", "returns", "lengths", "unfinished", "seed", "deterministic"}`` (`lengths`:
    each episode's env steps; `deterministic`: the policy's mode, as `rlspeed eval --json` names it),
    and ``"successes"`` (per episode, whether its last info said ``is_success``) with ``"success_rate"`` (their share of
    the finished episodes) where the env reports ``info["is_success"]`` (or, where it gives none, ``info["success"]``:
    docs/envs.md's success flags). The env is new (seeded with `seed`; for the
    model's own env id made with the options its env had, `model.spec.env_kwargs`), not the training env, and rewards
    are the env's own (no normalisation). `env_id` may also be a vector env you built (or a single `gymnasium.Env`,
    run as a vector env of one, as Stable-Baselines3's `evaluate_policy` takes it), or an env `rlspeed.make_env` made
    (its envs share the episodes as Stable-Baselines3's `evaluate_policy` spreads them: row i counts its first
    `(episodes + i) // num_envs`), which this call resets and leaves open: give a separate instance built
    as the training env was, not the training env itself, and without rlspeed's normalisation (the model normalises
    observations with its own frozen statistics; an env made with `normalize_obs=True` is refused); a model training
    on Stable-Baselines3's `VecNormalize` is evaluated on a `VecNormalize(eval_env, training=False,
    norm_reward=False)` holding its statistics (an env id is refused for it); a VecNormalize in an env you pass,
    rlspeed's reward normalisation (`make_env(..., normalize_reward=True)`), or Gymnasium's `NormalizeObservation`
    and `NormalizeReward` around it or its envs is not updated by the evaluation, `training=True` or not (Gymnasium's
    inside subprocess envs, out of reach, are, with a warning; one whose statistics have seen no observation, which
    then hand the policy raw observations, is warned of too: copy the training env's statistics into it).
    `env_kwargs` are options of the env an id names (`gymnasium.make(env_id, **env_kwargs)`): on the model's own id
    they replace those of its recorded options they name (evaluating a variant of the training env).
    Observations are normalised by the model's frozen statistics when it was trained with observation normalisation.
    `backend="auto"` on the model's own env id uses the backend it trained with, so `rlspeed.evaluate(model, seed=s)`
    equals `model.evaluate(seed=s)`. Where the env gives action masks (`info["action_mask"]`) and the model takes them
    (its `use_masking`), the deterministic policy is masked too: it never picks a masked action. Atari games that wait
    for FIRE (Breakout, Pong, ...) get it as the first action of every game and after every lost life, in place of the
    policy's (`rlspeed.envs.atari.FireToStart`; training envs never do). Episodes still running after `max_steps`
    (default: the env's time limit, else 10,000) count with the return they had collected by then, with a warning
    (Python shows it once per place: `unfinished`, how many they were, 0 where none, says it of every call).
    `device`: where the evaluation env and the policy's inputs live (default: the model's device). `progress_bar`:
    a bar over the episodes finished (long evaluations: Atari games, many episodes), as `learn`'s over its steps,
    with the steps run toward the limit.
    The policy acts on the model's `num_threads`, as in `learn`'s evaluations (a CPU's sums depend on the thread count),
    and the caller's count is given back.

    `seed` also seeds a stochastic policy's samples (`deterministic=False`), drawn from a random stream of the
    evaluation's own: the same seed gives the same returns, and an evaluation leaves torch's random generators (and
    so the training that follows) as they were; in waves, the wave from episode k draws from a stream seeded
    `seed + k`, so those samples also depend on the cap (`evaluation_env_cap`), not on the seed alone. Episode i of
    an env this call makes is seeded `seed + i` (in one batch or in waves alike), so `seed + episodes` may be at most
    2**63. Without a seed one is drawn; the result's ``"seed"`` repeats it (None for a vector env you built, which
    this call does not seed then).

    Where the close() of the env this call makes raises once the episodes are played, the scores are not lost: the
    `rlspeed.errors.EnvStepError` naming the env and close() is raised after the evaluation, with this call's result
    in its ``result`` (``except EnvStepError as error: error.result["mean"]``; its message says so, and counts the
    close() errors of other envs, which its ``others`` hold); inside `learn` (its evaluations) the error is raised
    at learn's end, as `rlspeed eval` prints the scores first. Where the evaluation itself fails, its own error is
    raised and the close() error dropped.
    """
    refuse_evaluate_keywords(stable_baselines3)
    check_evaluated_model(model)
    deterministic = true_or_false("evaluate(deterministic=...)", deterministic)
    progress_bar = true_or_false("evaluate(progress_bar=...)", progress_bar)
    if isinstance(seed, bool):  # (Stable-Baselines3's evaluate_policy(model, env, 10, False): deterministic, there)
        raise UserError(f"evaluate's seed is a whole number, not {seed} (evaluate_policy's fourth argument is "
                        f"deterministic, evaluate's is seed): write deterministic={seed}.")
    seed = None if seed is None else check_seed(seed, limit_bits=63)  # (a model's seed plus evaluation offsets)
    max_steps = positive_whole("max_steps", max_steps)
    episodes = positive_whole("episodes", episodes, needed_by="evaluate")  # (10.0 and 1e1 too, as the CLI takes)
    refuse_unless_results_fit(episodes)  # (before the per-episode lists: a bare MemoryError otherwise)
    env_id = as_evaluation_env(env_id, "evaluate")  # (a single env, as SB3's evaluate_policy takes it: one env row)
    size = getattr(env_id, "num_envs", None)  # (a vector env the user built: its envs run the episodes in parallel)
    if seed is not None and size is None and seed + episodes > 2**63:  # (in one batch or in waves alike)
        raise UserError(f"evaluate seeds episode i with seed + i, below 2**63: a seed of {seed} leaves room for "
                        f"{2**63 - seed} episodes, not {episodes}.")
    # Episodes each env row counts, as Stable-Baselines3's evaluate_policy spreads them ((episodes + i) // size for
    # row i: every row's first episodes, so that short episodes are not over-counted); one each where `episodes` is
    # the env's size, the only case of an env this call makes.
    quotas = [(episodes + row) // size for row in range(size)] if size is not None else [1] * episodes
    own_env = env_id in (None, model.env_id)
    if env_kwargs is not None and not isinstance(env_id or model.env_id, str):
        raise UserError("evaluate takes env_kwargs with an env id; this env is already built, so give its options "
                        "where you make it.")
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise UserError(f"env_kwargs must be a dict of the env's options, got {type(env_kwargs).__name__}.")
    asked = backend
    env_id = env_id or model.env_id
    if own_env and env_id in (USER_VECTOR_ENV, USER_SB3_VEC_ENV):
        raise UserError("This model trained on a vector env you built, which has no id to make it again: give an env "
                        "with the same spaces to evaluate on " + in_words(
                            "(rlspeed eval MODEL --env ID, a registered id).",
                            "(rlspeed.evaluate(model, env, episodes=env.num_envs), and EvalCallback(env) instead of "
                            "eval_freq; rlspeed eval MODEL --env ID, a registered id, on the command line)."))
    if own_env and isinstance(env_id, str) and not remakeable(env_id) and envpool_only(env_id):
        raise UserError(f"This model trained on EnvPool's '{env_id}', an env rlspeed makes again only from a "
                        "Gymnasium id: " + in_words(
                            "evaluate it on the Gymnasium id of an env with the same spaces: rlspeed eval MODEL "
                            f"--env ID ({gymnasium_versions(env_id)}).",
                            f"evaluate it on an env you make, rlspeed.evaluate(model, make_env('{env_id}', "
                            "num_envs=N, backend='envpool', seed=S), episodes=N) (and EvalCallback(env) instead of "
                            "eval_freq)."))
    if own_env and isinstance(env_id, str) and not remakeable(env_id):
        raise UserError(unregistered_id_refusal(model, in_words(
            "or evaluate it on a registered id of an env with the same spaces: rlspeed eval MODEL --env ID",
            "or, for an env you built, pass one: rlspeed.evaluate(model, env, episodes=env.num_envs) (and "
            "EvalCallback(env) instead of eval_freq)")))
    device = device if device is not None else model.device
    if backend == "auto" and own_env:
        backend = evaluation_backend(env_id, model.env_backend, episodes, device)
    if seed is None and size is None:  # (an env this call makes, from an id: seeded; a caller's env stays as it is)
        seed = secrets.randbelow(max(1, 2**31 - episodes))  # (episode i gets seed + i, below 2**31: EnvPool's limit)
    # Atari games that wait for FIRE get it at every start and lost life (`atari.for_evaluation`; an env made here:
    # `_evaluation_env`)
    if isinstance(env_id, BatchedEnv):  # (one `make_env` made: used as it is, seeded by `seed` where given)
        check_evaluation_env(model, env_id)
        env = counted(env_id)  # (a batched env of the user's own: checked and counted as in training)
        env = atari.for_evaluation(env if seed is None else SeedOnFirstReset(env, seed))
    else:  # (the model's own env id: made with the options it trained with, `spec.env_kwargs`)
        if isinstance(env_id, str):
            check_evaluation_env(model, env_id)
        options = env_options(model, env_id, env_kwargs)
        if options and backend not in ("gymnasium", "gymnasium-async", "envpool"):  # (EnvPool: `envpool_options`)
            if asked not in ("auto", "gymnasium", "gymnasium-async", "envpool"):
                whose = "The env options" if env_kwargs else "This model's env was made with options"
                raise UserError(f"{whose} ({', '.join(options)}), which only Gymnasium's envs take: evaluate it with "
                                f"backend='gymnasium' (--env-backend gymnasium on the command line), not "
                                f"'{asked}'.")
            backend = "gymnasium"  # (env options are Gymnasium's envs': `auto` may pick another)
        backend = resolve_backend(env_id, backend, episodes, resolve_device(device)) if size is None else backend
        if backend == "envpool" and size is None:  # (up front: in waves, a later wave's seeds would pass the limit)
            check_envpool_seeds(seed, episodes)
        if size is None and episodes > evaluation_env_cap(backend):  # (the backend make_env would run them on)
            return _evaluate_in_waves(model, env_id, episodes, seed, deterministic, backend, device, max_steps,
                                      options, progress_bar)
        env = _evaluation_env(env_id, episodes if size is None else size, device, seed, backend, options)
    limit = episode_step_limit(env, max_steps)
    spread = max(quotas) > 1 or min(quotas) < 1  # (a vector env of the caller's, other than one episode per env)
    bar = ProgressBar(episodes, enabled=progress_bar, desc=f"evaluate {env.spec.env_id}", unit="episode")
    # the normalisation statistics of an env the caller passed stay as they were (`_frozen_normalization`)
    thaw = failure = None
    try:
        thaw = _frozen_normalization(env_id) if not isinstance(env_id, str) else None
        _check_compatible(model, env)
        _warn_reward_wrappers(env_id)
        _warn_life_episodes(env_id)
        with _evaluating(model, env, seed, deterministic):
            if spread:
                spread = _spread_episodes(model, env, quotas, limit, deterministic, bar)
                return _spread_result(spread, episodes, limit, seed, deterministic)
            played = _first_episodes(model, env, limit, deterministic, bar, progress_bar)
    except BaseException as error:
        failure = error
        raise
    finally:
        bar.close()
        if thaw is not None:
            thaw(failure)
        if isinstance(env_id, str):  # (an env the caller passed in stays open: it is theirs, reset by this call)
            _close_evaluation_env(env, failure)
    if played["unfinished"]:
        warn_unfinished(played["unfinished"], episodes, limit, time_limit=isinstance(env_id, str))
    return _result(**played, seed=seed, deterministic=deterministic)


def _evaluation_env(env_id, num_envs: int, device, seed: int | None, backend: str, options: dict) -> BatchedEnv:
    """The env `evaluate` plays on: `num_envs` envs of `env_id` (or the caller's vector env) on `backend`, already
    resolved, seeded by `seed` on their first reset. Atari: whole games with raw rewards (`evaluation=True`: no
    training transforms), and games that wait for FIRE get it at every start and lost life
    (`rlspeed.envs.atari.FireToStart`)."""
    return atari.for_evaluation(make_env(env_id, num_envs=num_envs, device=device, seed=seed, backend=backend,
                                         evaluation=True, env_kwargs=options))


@contextlib.contextmanager
def _evaluating(model, env: BatchedEnv, seed: int | None, deterministic: bool):
    """What an evaluation's episodes run under: a stochastic policy's own random stream, seeded by `seed` (the
    caller's generators, training's, are left as they were); the model's thread count, as `model.evaluate` and learn's
    evaluations (a CPU's sums depend on it, and torch's default count starts OpenMP threads a process forked afterwards
    hangs on); float32 tensors where the caller made float64 torch's default dtype. Each context is entered inside the
    block's ``with``: one that raises on entry leaves those entered before it exited."""
    with contextlib.ExitStack() as stack:
        if not deterministic:
            stack.enter_context(_own_random_stream(model, env.device, seed, env.num_envs))
        stack.enter_context(training_threads(getattr(model, "num_threads", None)))
        stack.enter_context(float32_default())
        yield


def first_episode_step(info: dict, finished: torch.Tensor, returns: torch.Tensor, lengths: torch.Tensor,
                       succeeded: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """One step's record of each row's first episode, from the step's `info` (`done`, `episode_return`,
    `episode_length`, `is_success` where the env reports it): (the rows whose first episode ended at this step, the
    returns, lengths and successes with theirs); `finished` is updated in place (every row that has ended one)."""
    newly_done = info["done"] & ~finished
    returns = torch.where(newly_done, info["episode_return"], returns)
    lengths = torch.where(newly_done, info["episode_length"], lengths)
    if "is_success" in info:
        succeeded = (torch.zeros_like(finished) if succeeded is None else succeeded) | (newly_done & info["is_success"])
    finished |= info["done"]
    return newly_done, returns, lengths, succeeded


def _first_episodes(model, env: BatchedEnv, limit: int, deterministic: bool, bar: ProgressBar, progress_bar: bool,
                    reset_seed: int | None = None) -> dict:
    """Each env row's first episode of `model` on `env` (reset here, with `reset_seed` where given), for `limit` steps
    at most: `_result`'s keywords ("returns", "lengths", "unfinished": the episodes still running at `limit` steps,
    counted with the return and length they had then; "successes": where the env reports ``is_success``, each
    episode's, else None). `bar` counts the finished episodes (with the steps run toward the limit: `progress_bar`)."""
    episodes = env.num_envs
    returns = torch.zeros(episodes, device=env.device)
    lengths = torch.zeros(episodes, device=env.device, dtype=torch.int64)
    finished = torch.zeros(episodes, dtype=torch.bool, device=env.device)
    running, running_lengths = returns, lengths
    succeeded = None  # (an env reporting info["is_success"]: each first episode's)
    obs, info = env.reset(seed=reset_seed)
    check_every = 64 if env.backend == "torch" else 1
    acting = _Acting(model, env, deterministic)
    with resting_finished_rows(env) as resting:  # (rows whose first episode ended: not stepped there)
        for step in range(1, limit + 1):
            obs, info = acting.step(obs, info)
            newly_done, returns, lengths, succeeded = first_episode_step(info, finished, returns, lengths, succeeded)
            if resting is not None and bool(newly_done.any()):  # ok-sync: evaluation, an env stepped on the host
                resting.rest_rows(finished)
            # the running return and length of rows still in their first episode
            running, running_lengths = info["episode_return"], info["episode_length"]
            # Device-native envs are checked every few steps only, to avoid a host sync per step.
            if step % check_every == 0:
                done = int(finished.sum())  # (one host read, as `finished.all()` was)
                # (the steps toward the limit: episodes that end late, or never, left the bar at 0/N as if hung)
                bar.update(done - bar.bar.n, step=f"{step:,}/{limit:,}" if progress_bar else None)
                if done == episodes:
                    break
    # (the last steps since a check: a Pendulum's episodes all end at step 200, between two checks)
    bar.update(int(finished.sum()) - bar.bar.n)
    unfinished = int((~finished).sum())
    if unfinished:
        returns = torch.where(finished, returns, running)
        lengths = torch.where(finished, lengths, running_lengths)
    return {"returns": returns.cpu().tolist(), "lengths": [int(n) for n in lengths.cpu().tolist()],
            "unfinished": unfinished, "successes": None if succeeded is None else succeeded.cpu().tolist()}


#: subprocess envs an evaluation runs at once, per CPU core (and at least `MIN_SUBPROCESS_EVALUATION_ENVS`): more
#: episodes run in waves of that many (`evaluation_env_cap`)
SUBPROCESS_EVALUATION_ENVS_PER_CPU = 4
MIN_SUBPROCESS_EVALUATION_ENVS = 16
#: Gymnasium's in-process envs an evaluation runs at once: more episodes run in waves of that many. A count, not a
#: size: a wave takes that many times one env's memory
GYMNASIUM_EVALUATION_ENVS = 10_000
#: native torch env rows an evaluation runs at once (a row is its state tensors' and the policy batch's row): more
#: episodes run in waves of that many (a wave takes that many rows' memory)
NATIVE_EVALUATION_ENVS = 1_000_000
#: EnvPool's envs an evaluation runs at once (in-process C++ envs, each with its emulator and frame buffers): more
#: episodes run in waves of that many, a wave taking that many envs' memory (EnvPool seeds env i with `seed + i`, as
#: Gymnasium)
ENVPOOL_EVALUATION_ENVS = 1_000


#: what `evaluation_seed` derives a seed for: evaluations during training (curves, targets), the fresh episodes that
#: confirm a target, a run's final evaluation, an `EvalCallback`'s evaluations, `rlspeed eval RUN_DIR`'s of a
#: population's members (its num_timesteps: the command's --seed)
EVALUATION_KINDS = ("learn", "confirm", "final", "callback", "members")
#: `evaluation_seed`'s seeds lie below this: an evaluation of up to as many episodes seeds them all below 2**31
#: (EnvPool's limit)
EVALUATION_SEED_RANGE = 2**30


def evaluation_seed(seed: int | None, kind: str, num_timesteps: int = 0) -> int:
    """The env seed a run of `seed` (None: 0) evaluates on for an evaluation of `kind` (one of `EVALUATION_KINDS`)
    after `num_timesteps` steps: drawn by numpy's `SeedSequence` from (seed, kind, num_timesteps), below
    `EVALUATION_SEED_RANGE`. Episode i is seeded with it + i, so runs of neighbouring seeds evaluate on unrelated
    start states (a seed plus an offset gave seeds s and s + 1 nine of ten episodes in common: correlated scores),
    while the same seed, kind and step count give the same seed in a solo run and in a population's member alike.
    Two evaluations of 10 episodes share an episode seed with probability about 2e-8."""
    entropy = [0 if seed is None else check_seed(seed, limit_bits=63), EVALUATION_KINDS.index(kind),
               int(num_timesteps)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] % EVALUATION_SEED_RANGE)


def evaluation_env_cap(backend: str) -> int | float:
    """The envs an evaluation on `backend` makes at once at most: for subprocess envs (`gymnasium-async`, one worker
    process each) `SUBPROCESS_EVALUATION_ENVS_PER_CPU` per CPU core, at least `MIN_SUBPROCESS_EVALUATION_ENVS`; for
    Gymnasium's in-process envs `GYMNASIUM_EVALUATION_ENVS`; for native torch envs `NATIVE_EVALUATION_ENVS`; for
    EnvPool's `ENVPOOL_EVALUATION_ENVS`; no cap for other backends (math.inf)."""
    if backend == "gymnasium":
        return GYMNASIUM_EVALUATION_ENVS
    if backend == "torch":
        return NATIVE_EVALUATION_ENVS
    if backend == "envpool":
        return ENVPOOL_EVALUATION_ENVS
    if backend != "gymnasium-async":
        return math.inf
    return max(MIN_SUBPROCESS_EVALUATION_ENVS, SUBPROCESS_EVALUATION_ENVS_PER_CPU * (os.cpu_count() or 1))


def evaluation_waves(episodes: int, cap: int | float, members: int = 1) -> typing.Iterator[tuple[int, int]]:
    """(first, count) of each wave an evaluation of `episodes` episodes (of each of a population's `members`) runs in,
    one after the other, with at most `cap` env rows at once (`evaluation_env_cap`; at least one episode of each
    member a wave): its episodes `first .. first + count - 1`, which start as those of one env of them all (the wave
    from episode `first` seeded `seed + first`, a native env's rows as rows `first ..`)."""
    per_wave = max(1, int(min(cap, members * episodes)) // members)
    for first in range(0, episodes, per_wave):
        yield first, min(per_wave, episodes - first)


def _evaluate_in_waves(model, env_id: str, episodes: int, seed: int, deterministic: bool, backend: str, device,
                       max_steps: int | None, options: dict, progress_bar: bool) -> dict:
    """`evaluate` of more episodes than `evaluation_env_cap(backend)` envs on `backend` (resolved): in waves of at
    most that many envs, one after the other, the wave from episode k reset with seed `seed + k` (Gymnasium and EnvPool
    seed env i with `seed + i`; a native env's rows restart as rows k .. of one env seeded `seed`,
    `seed_row_blocks`), so each episode starts as in one env of `episodes` rows, and a stochastic policy draws from a
    stream seeded `seed + k` (on every backend). The full waves share one env (subprocess workers started once), the
    last, smaller one gets its own: every wave's envs and draws are those of an env of its size. The result joins the
    waves' in episode order, with one warning for the unfinished episodes of all waves."""
    native = backend == "torch"
    played = {"returns": [], "lengths": [], "unfinished": 0, "successes": []}
    bar = ProgressBar(episodes, enabled=progress_bar, desc=f"evaluate {env_id}", unit="episode")  # (one, by wave)
    env = limit = failure = None
    try:
        for first, count in evaluation_waves(episodes, evaluation_env_cap(backend)):
            wave_seed = seed + first  # (its stream's; a native env's rows draw from `seed`, as rows `first` ..)
            if env is None or env.num_envs != count:
                if env is not None:
                    env.close()
                env = None  # (closed: not closed again where the next one fails to start)
                env = _evaluation_env(env_id, count, device, None if native else wave_seed, backend, options)
                limit = episode_step_limit(env, max_steps)
                _check_compatible(model, env)
            if native:  # (row i of the wave draws as row `first + i` of one env of all the episodes)
                env.unwrapped.seed_row_blocks([seed], first_row=first)
            with _evaluating(model, env, wave_seed, deterministic):
                wave = _first_episodes(model, env, limit, deterministic, ProgressBar(count, enabled=False), False,
                                       reset_seed=None if native else wave_seed)
            for key in ("returns", "lengths", "unfinished"):
                played[key] += wave[key]
            played["successes"] += wave["successes"] or []
            bar.update(count)
    except BaseException as error:
        failure = error
        raise
    finally:
        bar.close()
        if env is not None:
            _close_evaluation_env(env, failure)
    if played["unfinished"]:
        warn_unfinished(played["unfinished"], episodes, limit, time_limit=True)
    if len(played["successes"]) < episodes:
        played["successes"] = None
    return _result(**played, seed=seed, deterministic=deterministic)


def return_statistics(values: typing.Sequence[float]) -> tuple[float, float]:
    """(mean, standard deviation) of episode returns `values` (Python floats), as `evaluate` reports them: summed in
    float64 in episode order, the population's deviation (`std` of numpy's default). A population's evaluations
    (`rlspeed.population`) use it too, so a member's numbers equal `evaluate`'s of its saved model, digit for digit."""
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


class _Acting:
    """`model`'s policy stepping `env` in an evaluation: masked where the env gives action masks and the model takes
    them; a recurrent policy (RecurrentPPO) carries its state from step to step, reset where a whole episode starts
    (`info["done"]`, as in training: not at a lost life that a wrapper, SB3's `EpisodicLifeEnv`, makes the learner's
    episode end in, the game going on)."""

    def __init__(self, model, env, deterministic: bool):
        self.model, self.env, self.deterministic = model, env, deterministic
        self.masking = getattr(model, "supports_action_masks", False) and getattr(model.config, "use_masking", False)
        self.recurrent, self.state, self.episode_start = hasattr(model, "act_with_state"), None, None

    def step(self, obs, info: dict) -> tuple:
        """(obs, info) after one step of every env row from `obs` and the last step's `info`."""
        masks = {"action_masks": info["action_mask"]} if self.masking and "action_mask" in info else {}
        if self.recurrent:
            actions, self.state = self.model.act_with_state(obs, self.state, self.episode_start,
                                                            deterministic=self.deterministic, **masks)
        else:
            actions = self.model.act(obs, deterministic=self.deterministic, **masks)
        # (the env may live on another device than the model (`device=`; act moves obs): a no-op when they share)
        obs, _reward, terminated, truncated, info = self.env.step(actions.to(self.env.device))
        # (whole episodes, as the training rollout resets the state: not at a lost life where a wrapper ends the
        # learner's episode and the game goes on)
        self.episode_start = info.get("done", terminated | truncated)
        return obs, info


def _spread_episodes(model, env, quotas: list[int], limit: int, deterministic: bool, bar) -> dict:
    """Run `model` on `env` (a vector env of the caller's, reset here) until each row i finished `quotas[i]` episodes
    (its first ones; later ones are not counted), or until `limit` steps per episode of the largest quota have passed.
    An episode still running at `limit` steps counts then, unfinished, with the return it collected so far (as
    `evaluate` counts one; the row's env plays it out uncounted, as one row of a vector env cannot be reset alone).
    Returns {"returns", "lengths", "successes" (None where the env never reported is_success), "unfinished"}: the
    episodes in row order, each row's first ones."""
    acting = _Acting(model, env, deterministic)
    rows: list[list[tuple[float, int, bool | None]]] = [[] for _ in quotas]
    counted = [False] * len(quotas)  # (the row's running episode was counted, unfinished, at `limit` steps)
    reported, unfinished = False, 0
    obs, info = env.reset()
    for _ in range(limit * max(quotas)):
        obs, info = acting.step(obs, info)
        # (one host read each step: a caller's vector env steps on the host anyway)
        done, at_limit = torch.stack((info["done"], info["episode_length"] >= limit)).cpu()
        at_limit &= ~done
        if not done.any() and not at_limit.any():
            continue
        returns, lengths = info["episode_return"].cpu().tolist(), info["episode_length"].cpu().tolist()
        success = info["is_success"].cpu().tolist() if "is_success" in info else None
        reported = reported or success is not None
        for row in done.nonzero().flatten().tolist():
            if counted[row]:  # (its end, played out after it was counted)
                counted[row] = False
            elif len(rows[row]) < quotas[row]:
                rows[row].append((returns[row], int(lengths[row]), None if success is None else bool(success[row])))
                bar.update(1)
        for row in at_limit.nonzero().flatten().tolist():
            if not counted[row] and len(rows[row]) < quotas[row]:
                rows[row].append((returns[row], int(lengths[row]), False))
                counted[row], unfinished = True, unfinished + 1
                bar.update(1)
        if all(len(kept) >= quota for kept, quota in zip(rows, quotas)):
            break
    episodes = [episode for kept in rows for episode in kept]
    return {"returns": [float(r) for r, _, _ in episodes], "lengths": [n for _, n, _ in episodes],
            "successes": [bool(s) for _, _, s in episodes] if reported else None, "unfinished": unfinished}


def _spread_result(spread: dict, episodes: int, limit: int, seed: int | None, deterministic: bool) -> dict:
    """`evaluate`'s result from `_spread_episodes`' episodes (with its warning for unfinished ones)."""
    values, unfinished = spread["returns"], spread["unfinished"]
    if unfinished or len(values) < episodes:
        warn_unfinished(unfinished, episodes, limit, time_limit=False, unstarted=episodes - len(values))
    return _result(values, spread["lengths"], unfinished, spread["successes"], seed, deterministic)


def _result(returns: list[float], lengths: list[int], unfinished: int, successes: list[bool] | None,
            seed: int | None, deterministic: bool) -> dict:
    """`evaluate`'s result of the episodes of `returns` and `lengths` (`unfinished` of them still running at the step
    limit); with `successes` and their share of the finished episodes where the env reports ``is_success``, and the
    `seed` and the policy's mode (`deterministic`), as `rlspeed eval --json` prints them."""
    mean, std = return_statistics(returns)
    result = {"mean": mean, "std": std, "episodes": len(returns), "returns": returns, "lengths": lengths,
              "unfinished": unfinished, "seed": seed, "deterministic": deterministic}
    if successes is not None:
        result["successes"] = successes
        if unfinished < len(returns):
            result["success_rate"] = sum(successes) / (len(returns) - unfinished)
    return result


@contextlib.contextmanager
def _own_random_stream(model, env_device: torch.device, seed: int | None, num_envs: int):
    """torch's generators of the CPU and the devices involved forked for the block (restored after it), and seeded
    from `seed` (or drawn when there is none); a gSDE policy's exploration matrices drawn from that stream for
    `num_envs` envs (the model's own put back after: they were drawn from the caller's generator, so a seed did not
    repeat the samples)."""
    from rlspeed.sde import SDENoise

    model_device = model.device
    noises = list({id(noise): noise for value in vars(model).values() if isinstance(value, torch.nn.Module)
                   for noise in value.modules() if isinstance(noise, SDENoise)}.values())
    held = [(noise.standard_draws, noise.exploration, noise.standard_draws.clone(), noise.exploration.clone())
            for noise in noises]
    devices = {device for device in (torch.device(model_device), torch.device(env_device)) if device.type != "cpu"}
    kinds = {device.type for device in devices}
    device_type = kinds.pop() if len(kinds) == 1 else "cuda"
    module = getattr(torch, device_type, None)
    indices = sorted({device.index if device.index is not None else _current_index(device_type)
                      for device in devices if device.type == device_type})
    with torch.random.fork_rng(devices=indices, device_type=device_type):
        value = seed if seed is not None else secrets.randbelow(2**31)
        # (only the generators forked: `torch.manual_seed` would also reseed every other device's, left so after)
        torch.default_generator.manual_seed(value)
        generators = getattr(module, "default_generators", None)
        for index in indices:
            if generators is not None:
                generators[index].manual_seed(value)
            else:  # (a backend with one device and no generator list: MPS)
                module.manual_seed(value)
        try:
            for noise in noises:
                noise.resample(num_envs)
            yield
        finally:
            for noise, (draws, exploration, draws_then, exploration_then) in zip(noises, held):
                draws.copy_(draws_then)  # (resample may have drawn into the model's own tensors in place)
                exploration.copy_(exploration_then)
                noise.standard_draws, noise.exploration = draws, exploration


def _warn_reward_wrappers(env) -> None:
    """A warning where a vector env the caller built changes its rewards (Gymnasium's NormalizeReward, ...), or the
    envs inside it do (a `SyncVectorEnv` of wrapped envs): the returns evaluate reports are then the changed rewards',
    not the env's own. In a batched env the layers over its `EpisodeStatistics` (rlspeed's reward normalisation, as
    `make_env(..., normalize_reward=True)` puts it there) change no reported return."""
    if isinstance(env, BatchedEnv):
        env = find_episode_statistics(env) or env
    changers = reported_reward_wrappers(env)
    if changers:
        warn_at_caller(f"evaluate: this vector env's rewards pass through {', '.join(changers)}, so the returns "
                       "reported are the changed rewards' sums, not the env's own: evaluate on an env without it.",
                       UserWarning)


def _warn_life_episodes(env) -> None:
    """A warning where a vector env the caller built ends an episode at each lost life and no SB3 Monitor under that
    wrapper counts whole games: the episodes evaluate reports are then lives, not games (as Stable-Baselines3's
    `evaluate_policy` warns of an env without Monitor)."""
    enders = life_loss_wrappers(env, below_monitor=is_sb3_vec_env(env) and monitored(env))
    if enders:
        warn_at_caller(f"evaluate: this vector env ends an episode at each lost life ({', '.join(enders)}), so each "
                       "episode reported is one life, not a whole game: evaluate on an env without it, or with SB3's "
                       "Monitor inside it around each env (make_atari_env puts it there), whose games are counted.",
                       UserWarning)


def evaluation_backend(env_id: str, trained_on: str, episodes: int, device: str | torch.device) -> str:
    """The backend an evaluation of `episodes` episodes on a model's own env id runs on (`evaluate`'s `"auto"`): the
    one it trained on where that is the native, Gymnasium or subprocess one (the same seed then gives the same
    episodes; an env slow enough to train in subprocesses evaluates in them too, its episodes side by side and its
    resets in parallel), else `auto`'s choice for that many envs on `device` (`rlspeed.envs.resolve_backend`)."""
    if trained_on in ("torch", "gymnasium", "gymnasium-async"):
        return trained_on
    return resolve_backend(env_id, "auto", episodes, resolve_device(device))


#: Gymnasium's running-statistics wrappers, single-env and vector: their `update_running_mean` freezes them
_GYMNASIUM_NORMALISERS = (gym.wrappers.NormalizeObservation, gym.wrappers.NormalizeReward,
                          gym.wrappers.vector.NormalizeObservation, gym.wrappers.vector.NormalizeReward)


def _normaliser_statistics() -> dict[str, str]:
    """The statistics of Gymnasium's single-env normalisers, by the wrapper's class name, and of their subclasses in
    this process (a subprocess env's wrappers are known by their names, from its `str()`: a subclass of the caller's
    by its own): one attribute name each, which no other of them has, so that a subprocess env's `get_attr` /
    `set_attr` of it reaches that wrapper (the outermost that has the attribute)."""
    statistics = {}
    wrappers = gym.wrappers
    for base, attribute in ((wrappers.NormalizeObservation, "obs_rms"), (wrappers.NormalizeReward, "return_rms")):
        classes = [base]
        while classes:
            cls = classes.pop()
            statistics.setdefault(cls.__name__, attribute)
            classes.extend(cls.__subclasses__())
    return statistics


def _passed_vector_env(env):
    """The Gymnasium or SB3 vector env inside a batched env `make_env` made of one, else `env` itself."""
    return getattr(env, "vector_env", None) or getattr(env, "vec_env", None) or env


def _gymnasium_normalisers(env) -> tuple[list, list[str]]:
    """Gymnasium's `NormalizeObservation` and `NormalizeReward` (single-env and vector) around a vector env the caller
    passed (a Gymnasium or SB3 one, or a batched env `make_env` made of one) or around the envs inside it: those in
    this process, each once; and the names of those inside subprocess envs (read from their `str()`), which no call
    reaches one by one (`set_attr` sets only the outermost wrapper of each env that has the attribute)."""
    inner = _passed_vector_env(env)
    found, unreached, statistics = {}, [], _normaliser_statistics()
    for name, wrapper in _wrapper_layers(inner):
        if isinstance(wrapper, _GYMNASIUM_NORMALISERS):
            found[id(wrapper)] = wrapper
        elif wrapper is None and name in statistics and name not in unreached:
            unreached.append(name)
    return list(found.values()), unreached


def _kept_subprocess_statistics(env, names: list[str]) -> tuple[list[typing.Callable[[], None]], bool]:
    """For Gymnasium's normalisers `names` inside the subprocess envs of a Gymnasium `AsyncVectorEnv` in `env`: their
    statistics read now and (the callables returned) written back after the evaluation, and the outermost normaliser
    of each env frozen meanwhile (`set_attr`, which sets the outermost wrapper that has the attribute). Also whether
    every normaliser is frozen (one per env), else the inner ones' statistics move during the evaluation. ([], False)
    where they cannot be reached so (an SB3 SubprocVecEnv, whose `set_attr` sets the outermost wrapper whether it has
    the attribute or not; a name twice in one env, whose inner statistics no `set_attr` reaches; envs of other
    wrappers than each other). The error of envs that cannot answer is raised, at the first call as at a later one (a
    worker that raised is shut down by Gymnasium: no evaluation runs on its envs), after what was changed is put back
    where it can be (a warning says what was not: the others' `set_attr` fails too)."""
    from rlspeed.envs.gymnasium_env import _subprocess_chains, _subprocess_env

    inner = _passed_vector_env(env)
    workers = _subprocess_env(inner)
    chains = _subprocess_chains(inner) if isinstance(workers, gym.vector.AsyncVectorEnv) else None
    if not chains:
        return [], False
    statistics = _normaliser_statistics()
    layers = [[name for name in re.findall(r"<(\w+)", chain) if name in statistics] for chain in chains]
    # (a worker asked for an attribute its env lacks raises, and Gymnasium then shuts every worker down: a wrapper of
    # another package under a normaliser's name is asked first whether it has them)
    if any(len({statistics[name] for name in names_in}) != len(names_in) or set(names_in) != set(names)
           for names_in in layers):
        return [], False
    restore: list[typing.Callable[[], None]] = []
    try:
        if not all(all(workers.call("has_wrapper_attr", statistics[name])) for name in names):
            return [], False
        for name in names:
            attribute = statistics[name]
            kept = list(workers.get_attr(attribute))
            restore.append(lambda attribute=attribute, kept=kept: workers.set_attr(attribute, kept))
        flags = list(workers.get_attr("update_running_mean"))
        restore.append(lambda: workers.set_attr("update_running_mean", flags))
        workers.set_attr("update_running_mean", False)
    except BaseException as error:  # (envs that cannot answer, or a Ctrl-C: what was changed is put back)
        _put_back(list(reversed(restore)), error)
        raise
    return restore, all(len(names_in) <= 1 for names_in in layers)


def _frozen_gymnasium_statistics(env) -> list[typing.Callable[[], None]]:
    """Freeze Gymnasium's normalisation wrappers in `env` (`_gymnasium_normalisers`; as Gymnasium's docs suggest for
    evaluation), each until the callable returned for it puts its `update_running_mean` back. A warning first where
    observations pass through one that has seen none (an env made for evaluation: frozen empty statistics hand the
    policy raw observations), or through one inside subprocess envs (updated by the evaluation)."""
    normalisers, unreached = _gymnasium_normalisers(env)
    observations = (gym.wrappers.NormalizeObservation, gym.wrappers.vector.NormalizeObservation)
    if any(isinstance(wrapper, observations) and np.all(wrapper.obs_rms.count < 1) for wrapper in normalisers):
        warn_at_caller("evaluate: this vector env's observations pass through Gymnasium's NormalizeObservation, whose "
                       "statistics have seen no observation yet, and the evaluation leaves them as they are (frozen), "
                       "so the policy sees raw observations, not normalised ones as in training: copy the training "
                       "env's statistics into it first (each wrapper's obs_rms, as SB3's sync_envs_normalization "
                       "copies VecNormalize's), or train with normalize_obs=True, which keeps them in the model.",
                       UserWarning)
    restore, all_frozen = _kept_subprocess_statistics(env, unreached) if unreached else ([], True)
    try:
        _warn_unfrozen_subprocess_statistics(unreached, bool(restore), all_frozen)
    except BaseException as error:  # (warnings as errors: the workers are not left frozen)
        _put_back(restore, error)
        raise
    for wrapper in normalisers:
        restore.append(lambda wrapper=wrapper, own=wrapper.update_running_mean:
                       setattr(wrapper, "update_running_mean", own))
        wrapper.update_running_mean = False
    return restore


def _warn_unfrozen_subprocess_statistics(unreached: list[str], reached: bool, all_frozen: bool) -> None:
    """The warnings of `_frozen_gymnasium_statistics` for Gymnasium's normalisers `unreached` inside subprocess envs:
    none reached (`reached` False), or not all of them frozen."""
    if unreached and not reached:
        warn_at_caller(f"evaluate: this vector env's subprocess envs pass through Gymnasium's {', '.join(unreached)}, "
                       "whose running statistics the evaluation cannot freeze in their processes, so its observations "
                       "and rewards update them: evaluate on a SyncVectorEnv of such envs, whose statistics are left "
                       "as they were.", UserWarning)
    elif not all_frozen:
        warn_at_caller(f"evaluate: this vector env's subprocess envs pass through Gymnasium's {', '.join(unreached)}, "
                       "of which only the outermost in each env can be frozen in their processes: the others' "
                       "statistics move with the evaluation's observations (and are put back after it), so the "
                       "policy's observations differ from a frozen evaluation's: evaluate on a SyncVectorEnv of such "
                       "envs, or with one normalisation wrapper in each env.", UserWarning)


def _put_back(restore: list[typing.Callable[[], None]], failure: BaseException | None = None) -> bool:
    """Run every callable of `restore`, in order, also where one raises: the first error is raised after all ran, or,
    where the caller is failing with `failure` already (a Ctrl-C while subprocess envs step leaves them unable to take
    a `set_attr`), a warning says what was not put back and `failure` goes on. Whether something was not put back."""
    errors = []
    for undo in restore:
        try:
            undo()
        except Exception as error:  # noqa: BLE001  (the others are put back all the same)
            errors.append(error)
    if errors and failure is None:
        raise errors[0]
    if errors:
        warn_at_caller(f"evaluate: {len(errors)} of the env's normalisation settings or statistics could not be put "
                       f"back after the evaluation stopped ({type(failure).__name__}): {errors[0]}", UserWarning)
    return bool(errors)


def _frozen_normalization(env) -> typing.Callable[[BaseException | None], None]:
    """Freeze the running statistics of the normalisation in `env`, an env the caller passed to an evaluation (an SB3
    VecNormalize; rlspeed's `NormalizeReward`, whose statistics are the model's own where `env` is its training env;
    Gymnasium's `NormalizeObservation` and `NormalizeReward`, `_frozen_gymnasium_statistics`): an evaluation's
    observations and returns are not training data. Returns what puts every flag back as it was (`_put_back`: given
    the error the evaluation stops with, if any)."""
    restore = _frozen_gymnasium_statistics(env)
    normalizer = vec_normalize_of(env)
    if normalizer is not None:
        restore.append(lambda training=normalizer.training: setattr(normalizer, "training", training))
        normalizer.training = False
    wrapper = env
    while isinstance(wrapper, EnvWrapper):  # (each wrapper's own flag: `training` would set those inside too)
        own = wrapper.__dict__.get("_training")
        restore.append(lambda wrapper=wrapper, own=own: wrapper.__dict__.pop("_training") if own is None
                       else setattr(wrapper, "_training", own))
        wrapper._training = False
        wrapper = wrapper.__dict__.get("env")

    def thaw(failure: BaseException | None = None) -> None:
        _put_back(restore, failure)

    return thaw


def check_evaluation_env(model, env) -> None:
    """UserError where evaluating `model` on `env` (an env `make_env` made, or an env id) would show the policy
    observations in another scale than it trains on: an env that normalises its observations itself (the model
    normalises them with its own frozen statistics, or trained on raw ones), or an env made from an id for a model
    training on a Stable-Baselines3 VecNormalize that normalises observations (the env would give raw ones)."""
    from rlspeed.envs import NormalizeObservation
    from rlspeed.envs.base import find_wrapper

    if isinstance(env, BatchedEnv) and find_wrapper(env, NormalizeObservation) is not None:
        why = ("the model normalises them again with its own statistics (frozen for evaluation)"
               if getattr(model, "obs_rms", None) is not None else "the model trained on raw observations")
        raise UserError(f"This evaluation env normalises its observations itself (make_env(..., normalize_obs=True)), "
                        f"and {why}: evaluate on an env made without normalize_obs (or by its id).")
    if isinstance(env, str) and getattr(model, "trained_on_vec_normalize_obs", False):
        raise UserError(f"This model trains on a Stable-Baselines3 VecNormalize that normalises its observations, "
                        f"which an env made from '{env}' does not: evaluate on VecNormalize(eval_env, training=False, "
                        "norm_reward=False) holding the training statistics (EvalCallback(eval_env) copies them at "
                        "each evaluation; sync_envs_normalization does it by hand).")


def _check_compatible(model, env) -> None:
    """UserError unless `env` has the observations (shapes and dtypes, per key) and action space `model` was trained
    on."""
    trained, given = model.spec, env.spec
    differ = space_mismatch(trained, given)
    if not differ:
        if _other_bounds(trained.action_space, given.action_space):  # (the same shapes; other Box bounds)
            warn_at_caller(f"evaluate: {given.env_id}'s action bounds (low {given.action_space.low}, high "
                           f"{given.action_space.high}) differ from those this model trained with (low "
                           f"{trained.action_space.low}, high {trained.action_space.high}), to which its actions are "
                           "scaled or clipped: the returns are those of another task (evaluate on an env made as the "
                           "training env was, e.g. with the same RescaleAction).", UserWarning)
        return
    spaces = {what: (space_text(getattr(given, f"{space}_space")), space_text(getattr(trained, f"{space}_space")))
              for what, space in (("observations", "observation"), ("actions", "action"))}
    raise UserError(f"{given.env_id} does not fit this model, trained on {trained.env_id}: "
                    + "; ".join(f"its {what} are {spaces[what][0]}, the model's {spaces[what][1]}" for what in differ)
                    + ".")


def check_evaluation_spaces(model, env) -> None:
    """UserError, the one `evaluate` says at its first episode, where `env` (an env object to evaluate on: a vector env,
    a single env as `as_evaluation_env` wraps it, an env `make_env` made; an id or None passes) lacks the observations
    or actions `model` trained on: `EvalCallback` checks before training, not at its first evaluation."""
    if env is not None and not isinstance(env, str):
        _check_compatible(model, env if isinstance(env, BatchedEnv) else make_env(env, device=model.device,
                                                                                  evaluation=True))


def _other_bounds(trained, given) -> bool:
    """Whether two Box action spaces of one shape have other bounds (values compared, whatever their dtypes)."""
    if not isinstance(trained, gym.spaces.Box) or not isinstance(given, gym.spaces.Box):
        return False
    return not (np.array_equal(np.asarray(trained.low, np.float64), np.asarray(given.low, np.float64))
                and np.array_equal(np.asarray(trained.high, np.float64), np.asarray(given.high, np.float64)))


def space_mismatch(trained, given, action_bounds: bool = False) -> list[str]:
    """What of `given` (an EnvSpec) one model trained on `trained` cannot take: "observations" (shapes and dtypes per
    key), "actions" (a Box's shape; with `action_bounds`, its bounds too, which actions are scaled to)."""
    same_actions = (space_to_json(trained.action_space) == space_to_json(given.action_space) if action_bounds
                    else _action_signature(trained.action_space) == _action_signature(given.action_space))
    return [what for what, same in (
        ("observations", _observation_signature(trained.observation_space) == _observation_signature(
            given.observation_space)), ("actions", same_actions)) if not same]


def _action_signature(space) -> object:
    """What an action space must share with another for one policy to act in both: a Box's shape (its bounds may
    differ), the other spaces as they are."""
    import gymnasium as gym

    return ("box", tuple(space.shape)) if isinstance(space, gym.spaces.Box) else space_to_json(space)


def _observation_signature(space) -> object:
    """What an observation space must share with another for one model to take both: shapes and dtypes per key, and
    the sizes of Discrete-like spaces (their one-hot width); a Box's bounds may differ."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict):
        return {key: _observation_signature(sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Box):
        return observation_layout(space)
    return space_to_json(space)


if not typing.TYPE_CHECKING:  # (for type checkers a misspelt name stays an error)
    def __getattr__(name: str):
        """Stable-Baselines3's `evaluate_policy`, asked of this module as of its own: what to write instead, an
        ImportError under `from rlspeed.evaluation import evaluate_policy` as under `from rlspeed import ...`."""
        text = sb3_name_advice(name) if name == "evaluate_policy" else None
        if text is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        raise rlspeed._advice_error(f"{text}.", __name__, sys._getframe(1))
