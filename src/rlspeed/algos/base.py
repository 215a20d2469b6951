"""What every rlspeed algorithm shares: config validation, the learn loop (logging, evaluation, target, timing),
predict, save and load. An algorithm file holds only its own maths: `_setup`, `_train_iteration`, `policy`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import glob
import importlib
import importlib.util
import inspect
import io
import json
import math
import numbers
import os
import pickle
import random
import re
import secrets
import sys
import threading
import time
import types
import typing
import warnings
from collections.abc import Callable, Collection
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from rlspeed._version import __version__
from rlspeed.activations import activation_name, check_activation, is_torch_nn_class, refusal_name
from rlspeed.buffers.her import goal_strategy_name
from rlspeed.buffers.replay import ReplayBuffer, layout_nbytes, refuse_unless_fits
from rlspeed.callbacks import CallbackLike, CallbackRuns, next_due, resumed_due
from rlspeed.checkpoint import (
    beside,
    checkpoint_path,
    load_checkpoint,
    refuse_non_model,
    run_model,
    save_with_staged,
)
from rlspeed.device import (
    check_num_threads,
    float32_default,
    flush_denormal_enabled,
    resolve_device,
    rules,
    set_flush_denormal,
    set_training_threads,
    statistics_dtype,
    training_threads,
)
from rlspeed.diagnostics import waiting
from rlspeed.diagnostics.phases import phase
from rlspeed.distributed import DistributedStrategy, single_process, warn_training_alone
from rlspeed.env_options import tuple_paths, with_tuples
from rlspeed.envs import (
    BACKENDS,
    BatchedEnv,
    NormalizeObservation,
    NormalizeReward,
    RunningMeanStd,
    _check_env_id,
    backend_for_options,
    env_spec,
    make_env,
    normalised,
    remakeable,
    resolve_backend,
    seeded,
)
from rlspeed.envs.base import (
    EnvSpec,
    Observation,
    check_seed,
    constructor_defaults,
    counted,
    find_episode_statistics,
    find_wrapper,
    foreign_space_problem,
    integer_range,
    map_obs,
    numpy_dtype,
    obs_batch_size,
    observation_layout,
    recorded_env_kwargs,
    registered_variant,
    space_from_json,
    space_text,
    space_to_json,
    tuple_positions,
)
from rlspeed.envs.gymnasium_env import (
    USER_SB3_VEC_ENV,
    USER_VECTOR_ENV,
    check_action_masks,
    close_quietly,
    normalising_wrappers,
    single_env_id,
)
from rlspeed.envs.sb3_env import VecEnvLike, is_sb3_vec_env, reported_reward_wrappers, vec_normalize_of
from rlspeed.envs.wrappers import CLIP, observation_statistics
from rlspeed.errors import (
    SEED_ADVICE,
    CloseErrors,
    EncoderWarning,
    OtherEnvOptionsWarning,
    UnusedSettingWarning,
    UserError,
    first_line,
    infinite_advice,
    is_true_or_false,
    no_such_keyword,
    positive_whole,
    refuse_past_int64,
    refuse_replay_saving,
    running_command,
    seconds,
    true_or_false,
    warn_at_caller,
)
from rlspeed.evaluation import gym_packages, recorded_modules_advice, unregistered_id_refusal
from rlspeed.export import default_export_module, random_observations
from rlspeed.export import export as export_policy
from rlspeed.files import local_path
from rlspeed.logging import (
    KeptWriter,
    ProgressBar,
    RunLogger,
    bar_evaluation,
    holds_metrics,
    metrics_line,
    print_beside_bars,
    refuse_other_metrics,
)
from rlspeed.nn import (
    ENCODERS,
    NATURE_CNN_MIN_SIDE,
    OWN_ENCODER,
    STRIDED_CNN_MIN_SIDE,
    Encoder,
    acting,
    acting_mode,
    box_channels_first,
    cnn_arch,
    encoder_from_config,
    image_channels_first,
    image_shape,
    image_side,
    of_rlspeed,
    optimizers_without_dynamo,
)
from rlspeed.numerics import DivergedError, NumericsGuard
from rlspeed.policy_kwargs import SB3_CONTRIB_LSTM_LAYOUT, Collected, is_rlspeeds_lstm_layout, translate_policy_kwargs

# (imported when the module runs, not only for type checkers: `typing.get_type_hints(PPO.learn)` resolves it)
if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

#: what `predict` takes as observations and action masks: numpy arrays, (nested) lists or tuples of numbers, numbers,
#: tensors, or a dict of them per key (Dict observations); numpy in gives numpy out, tensors in give tensors out
ArrayLike: typing.TypeAlias = np.ndarray | np.generic | typing.Sequence[typing.Any] | float
ObservationLike: typing.TypeAlias = ArrayLike | torch.Tensor | typing.Mapping[str, typing.Any]

# The normalisation statistics a model holds, each with the config flag that turns it on
_STATISTICS = (("obs_rms", "normalize_obs"), ("return_rms", "normalize_reward"))


#: Stable-Baselines3 keywords with no rlspeed hyperparameter of that name, and what to write instead
SB3_KEYWORDS = {
    "policy_kwargs": "it is taken where each of its options is a setting of rlspeed's networks, which rlspeed "
                     "takes as plain keywords",
    "tensorboard_log": "it is a model's argument, not a hyperparameter (Algo(env, tensorboard_log=DIR): each learn "
                       "call writes its run, TensorBoard events included, in DIR/<ALGO>_N as SB3 numbers them); "
                       "elsewhere rlspeed writes the events (where the tensorboard package is installed) in the "
                       "run's directory, beside metrics.csv and the checkpoint: give that directory (learn(run_dir="
                       "DIR); rlspeed train: --out DIR)",
    "action_noise": "rlspeed's TD3 and DDPG take their exploration noise as action_noise='normal' (or "
                    "'ornstein-uhlenbeck', 'none') with action_noise_std=its sigma; SAC explores by sampling its "
                    "own policy and adds no noise to it (SB3's default action_noise=None is taken)",
    "create_eval_env": "evaluation uses a separate env already (learn(target_return=...), rlspeed.evaluate)",
    "_init_setup_model": "rlspeed builds the model when it is made",
    "policy": "rlspeed builds the networks from the env's spaces: write Algo(env, ...) without a policy (net_arch=..., "
              "activation=... shape them)",
    "replay_buffer_class": "rlspeed's off-policy algorithms have one replay buffer of their own, which stores frame "
                           "stacks and large images compactly by itself (frame_dedup); for Hindsight Experience "
                           "Replay write her=True (replay_buffer_class=HerReplayBuffer is taken as that)",
    "replay_buffer_kwargs": "rlspeed's replay buffer takes buffer_size, n_step and frame_dedup as hyperparameters, "
                            "and HerReplayBuffer's options as her=True, n_sampled_goal=4, "
                            "goal_selection_strategy='future'",
    "optimize_memory_usage": "rlspeed's replay stores frame stacks one frame per transition, and other uint8 or bool "
                             "images once per transition where storing them twice would take 1 GiB or more, by "
                             "itself (frame_dedup=True, the default), exactly across episode ends; smaller image "
                             "buffers and vector observations are stored whole (model.report() says which)",
    "stats_window_size": "metrics.csv and the progress bar average the episodes that finished in each log interval "
                         "(learn(log_interval_s=...))",
    "features_extractor_class": "rlspeed picks the encoder from the observation space (encoder='auto', or 'cnn' or "
                                "'mlp'), and an encoder of your own is what a subclass's _make_encoder returns (or "
                                "part of its _build_policy override, for a whole network; docs/algorithms.md)",
    "features_extractor_kwargs": "the CNN's features_dim is cnn_features_dim=N, and an encoder of your own takes "
                                 "its options in a subclass's _make_encoder override (docs/algorithms.md)",
    "share_features_extractor": "PPO's, A2C's and RecurrentPPO's actor and critic share one encoder, and SAC's, "
                                "TD3's and DDPG's actor and critics have one each (SB3's defaults), which no setting "
                                "changes",
    **dict.fromkeys(("optimizer_class", "optimizer_kwargs"),
                    "rlspeed trains with Adam (its eps: adam_eps for DQN, SAC, TD3 and DDPG; A2C's RMSprop: "
                    "use_rms_prop, rms_prop_eps), and another optimizer or its options go in a subclass's "
                    "_make_optimizer override (PPO, A2C, RecurrentPPO) or its _setup (docs/algorithms.md)"),
    "target_update_interval": "only DQN takes it; rlspeed's SAC and DDPG move their target networks after every "
                              "gradient step, TD3 after every policy_delay critic updates (tau sets how far), as "
                              "SB3's do",
    "norm_obs_keys": "VecNormalize's choice of Dict keys has no counterpart: normalize_obs=True normalises every "
                     "float key of a Dict observation and passes the others (images, indices) as they are, in solo "
                     "runs and populations alike",
    **dict.fromkeys(("rollout_buffer_class", "rollout_buffer_kwargs"),
                    "rlspeed's on-policy algorithms have one rollout buffer of their own (model.buffer, [num_steps, "
                    "num_envs] tensors), which no setting replaces"),
}

#: `SB3_KEYWORDS` at the values that ask for nothing (Stable-Baselines3's defaults, as a script or a generated
#: config writes them out): taken, changing nothing (`build_config`); any other value is refused with their advice
SB3_NOTHING = {"tensorboard_log": (None,), "policy_kwargs": (None, {}), "_init_setup_model": (True,),
               "create_eval_env": (False,), "optimize_memory_usage": (False,), "replay_buffer_class": (None,),
               "replay_buffer_kwargs": (None, {}), "rollout_buffer_class": (None,), "rollout_buffer_kwargs": (None, {}),
               "stats_window_size": (100,), "action_noise": (None,)}
#: `SB3_NOTHING` for one algorithm's keyword: SAC's (and its subclasses') targets move after every gradient step, as
#: SB3's SAC's default target_update_interval=1 asks
SB3_NOTHING_OF = {"SACConfig": {"target_update_interval": (1,)}}


@functools.cache
def _sb3_nothing(config_cls: type) -> dict[str, tuple]:
    """`SB3_NOTHING` with `SB3_NOTHING_OF`'s entries for `config_cls`'s algorithm (its own, or the first of its
    bases that has one)."""
    return {**SB3_NOTHING, **_of_algorithm(SB3_NOTHING_OF, config_cls, {})}


def _of_algorithm(table: dict[str, typing.Any], config_cls: type, default: typing.Any) -> typing.Any:
    """`table`'s entry (keyed by config class name) for `config_cls`: its own, or the first of its bases that has one;
    `default` where none has."""
    return next((table[base.__name__] for base in config_cls.__mro__ if base.__name__ in table), default)


def is_sb3_default(value: object, default: object) -> bool:
    """Whether `value` is `SB3_NOTHING`'s `default` as a script may write it: None as None, a bool as a bool (numpy's
    too: True is no 1), a dict as an equal dict, a number as an equal number of any numeric type (numpy's scalars,
    100.0 for 100) but a bool."""
    if default is None or isinstance(default, bool):
        return value is default or (isinstance(value, np.bool_) and bool(value) is default)
    if isinstance(default, dict):
        return isinstance(value, dict) and value == default
    return _real(value) and value == default


@functools.cache
def _field_names(config_cls: type) -> typing.Mapping[str, None]:
    """The names of `config_cls`'s fields in their order (as a read-only mapping's keys), read once per config class
    (`build_config` and `sb3_settings` read them for every config a population builds, member by member)."""
    return types.MappingProxyType(dict.fromkeys(field.name for field in dataclasses.fields(config_cls)))

#: Stable-Baselines3's constructor names that rlspeed spells otherwise, with rlspeed's name for each in the
#: algorithms that have it (the first of them the config has): taken as that name, and saved under it
#: (`rlspeed_names`: the constructor, load's overrides and `--set` read them through it)
SB3_NAMES = {"n_steps": ("num_steps", "n_step")}  # (rollout length on-policy; n-step returns off-policy, as in SB3)


def rlspeed_names(config_cls: type, values: dict) -> dict:
    """`values` with Stable-Baselines3's names (`SB3_NAMES`) as rlspeed's for `config_cls`'s algorithm: PPO's
    n_steps=64 is num_steps=64, DQN's n_steps=3 n_step=3. UserError where both names are given."""
    fields = _field_names(config_cls)
    renamed = dict(values)
    for sb3_name, names in SB3_NAMES.items():
        ours = next((name for name in names if name in fields), None)
        if sb3_name not in values or ours is None:
            continue
        if ours in values:
            raise UserError(f"{sb3_name}={values[sb3_name]!r} and {ours}={values[ours]!r} both set {ours} "
                            f"({sb3_name} is Stable-Baselines3's name for it): give one of them.")
        renamed = {(ours if key == sb3_name else key): value for key, value in renamed.items()}
    return renamed

#: CleanRL's script arguments (ppo.py, dqn.py, sac_continuous_action.py, td3_continuous_action.py) that are no
#: rlspeed hyperparameter, with the setting that does their work (`build_config`'s refusal names it)
CLEANRL_NAMES = {
    "clip_coef": "PPO's clip range is clip_range",
    "num_minibatches": "rlspeed takes the minibatch size: batch_size = num_envs * num_steps / num_minibatches",
    "norm_adv": "advantage normalisation is normalize_advantage",
    "clip_vloss": "clip_range_vf=X clips the value loss (CleanRL's clip_vloss clips it at its clip_coef: give that "
                  "number); clip_range_vf=null leaves it unclipped",
    "target_network_frequency": "DQN's is target_update_interval (env steps, as CleanRL counts); SAC and DDPG move "
                                "their targets every gradient step, TD3 every policy_delay critic updates, by tau",
    "start_e": "DQN's starting epsilon is exploration_initial_eps",
    "end_e": "DQN's final epsilon is exploration_final_eps",
    "alpha": "SAC's entropy coefficient is ent_coef: a number holds it fixed, ent_coef=auto (the default) tunes it",
    "autotune": "SAC tunes its entropy coefficient with ent_coef=auto (the default); ent_coef=X holds it at X",
    "policy_frequency": "TD3's critic updates per actor update are policy_delay; SAC updates its actor with every "
                        "critic update",
    "exploration_noise": "TD3's and DDPG's exploration noise std is action_noise_std (with action_noise=normal)",
    **dict.fromkeys(("policy_lr", "q_lr"), "one learning_rate trains the actor, the critics and SAC's entropy "
                                           "coefficient (as SB3's does)"),
    "torch_deterministic": "runs on a CPU with the same seed repeat exactly; on a GPU, call "
                           "torch.use_deterministic_algorithms(True) before making the model",
    "capture_video": "rlspeed train --video-every N records evaluation videos (rlspeed eval --video one)",
    **dict.fromkeys(("track", "wandb_project_name", "wandb_entity"), "rlspeed train --track --wandb-project NAME "
                                                                      "[--wandb-entity NAME] logs to W&B"),
    "env_id": "the env is the command's second word, rlspeed train ALGO ENV_ID (Python: the model's first argument)",
    "cuda": ("the device is --device (Python: device=...): auto, the default, takes CUDA where it is there, "
             "cpu leaves it out"),
    "exp_name": "a run's directory is --out DIR (default runs/<algo>-<env>-<seed>-<time>)",
    "save_model": "every run saves its model, RUN_DIR/model.safetensors (Python: model.save(path))",
}


#: Stable-Baselines3 model attributes rlspeed's models lack, with what to use instead (`Algorithm.__getattr__`)
SB3_ATTRIBUTES = {
    **dict.fromkeys(("get_env", "env"), "rlspeed models make their envs in learn: model.make_training_env() makes "
                                        "one like them, rlspeed.make_env(model.env_id) another, model.evaluate() "
                                        "plays episodes and model.close() closes them"),
    "set_env": "give the env when making or loading the model (Algo(env, ...), Algo.load(path, env=...))",
    "set_random_seed": SEED_ADVICE,
    "get_parameters": "model.policy.state_dict() holds the policy's weights, model.save(path) the whole model (whose "
                      "networks model.set_parameters(path) takes)",
    "replay_buffer": "the model's storage is model.buffer (once learn made it): len(model.buffer) transitions (SB3's "
                     "size()), model.buffer.sample(n) a dict of obs, actions, rewards, next_obs, terminated and "
                     "discounts tensors (SB3's observations, ..., dones fields), model.buffer.storage_tensors() "
                     "the storage by field; transitions of your own (demonstrations, before the first learn too) go "
                     "in through an rlspeed.buffers.ReplayBuffer you fill and give to model.load_replay_buffer(buffer)",
    "rollout_buffer": "the model's storage is model.buffer (once learn made it): the last rollout's [num_steps, "
                      "num_envs] tensors obs, actions, log_probs, values, rewards, terminated and dones (SB3's "
                      "advantages and returns are computed in the update and not kept)",
    "get_vec_normalize_env": "normalize_obs=True / normalize_reward=True keep the statistics in the model",
    "q_net": "DQN's network is model.q_network (its target: model.q_target)",
    "q_net_target": "DQN's target network is model.q_target",
    **dict.fromkeys(("exploration_rate", "exploration_schedule"),
                    "DQN's exploration rate at a step is model.epsilon(timesteps): linear from "
                    "model.config.exploration_initial_eps to exploration_final_eps over exploration_fraction of each "
                    "learn call (predict(deterministic=False) explores with exploration_final_eps)"),
    "lr_schedule": "the learning rate is model.config.learning_rate, decayed linearly to 0 over each learn call "
                   "where model.config.anneal_lr is True, or a schedule function of progress_remaining given as "
                   "learning_rate when the model is made or loaded (PPO(env, learning_rate=f), PPO.load(path, "
                   "learning_rate=f))",
    **dict.fromkeys(("logger", "set_logger"), "learn(run_dir=DIR) writes the metrics (metrics.csv, and TensorBoard "
                                              "logs where the tensorboard package is installed) in DIR, and a "
                                              "callback's self.logger.record(key, value) adds a column of its own "
                                              "to them"),
    "n_steps": "an on-policy model's rollout length is model.config.num_steps (an off-policy model collects "
               "model.config.train_freq steps between updates, and DQN's n-step returns are model.config.n_step)",
    "target_update_interval": SB3_KEYWORDS["target_update_interval"],
    "n_envs": "the number of envs is model.config.num_envs",
    "policy_kwargs": "the network's options are hyperparameters in model.config (model.config.net_arch, "
                     "model.config.activation, ...)",
    "ent_coef_optimizer": "SAC trains its entropy coefficient (model.log_alpha, with ent_coef=None) with the actor "
                          "and critics, in model.optimizer",
    **dict.fromkeys(("log_ent_coef", "ent_coef_tensor"),
                    "SAC's entropy coefficient is model.log_alpha.exp() (learnt with ent_coef=None, else fixed at "
                    "model.config.ent_coef)"),
    "ep_info_buffer": "a callback's self.metrics['episode_return'] is the mean return of the training episodes that "
                      "ended since the previous metrics row (metrics.csv's episode_return column)",
}


#: Stable-Baselines3's schedule attributes, which its users set on a model between learn calls: set on an rlspeed
#: model, each would be a new attribute nothing reads (`Algorithm.__setattr__` refuses it with `SB3_ATTRIBUTES`'
#: advice)
SB3_SCHEDULE_ATTRIBUTES = ("exploration_rate", "exploration_schedule", "lr_schedule")


#: Hyperparameters whose None means "tuned automatically", which Stable-Baselines3 spells "auto", each with the
#: hyperparameter that takes X in its "auto_X" (SAC's entropy coefficient: tuned, starting at X), or None
AUTO_VALUES = {"ent_coef": "ent_coef_init", "target_entropy": None}


#: hyperparameters that shape the networks a checkpoint's weights belong to: `load` refuses another value for them
_ARCHITECTURE_KEYS = ("net_arch", "activation", "dueling", "n_critics", "use_sde", "full_std", "use_expln", "encoder",
                      "cnn_features_dim", "cnn", "lstm_hidden_size", "n_lstm_layers", "shared_lstm",
                      "enable_critic_lstm")
#: hyperparameters every algorithm takes only when the model is built, besides those (its optimiser and its update
#: step are made then): `learn` refuses a value set on `model.config` since (`Algorithm._check_built_settings`)
_BUILT_KEYS = ("max_grad_norm", "adam_eps", "rms_prop_eps", "use_rms_prop")


def _planned_parameters(model) -> list[torch.Tensor] | None:
    """The parameters rlspeed's own `model.optimizer`, not built yet (`Algorithm._ensure_optimizer`), will hold
    (`_optimized_parameters`); None where it is built, or where a subclass's code builds it (then only building it
    tells)."""
    if (model.__dict__.get("_optimizer_deferred") and "optimizer" not in model.__dict__
            and all(getattr(type(model), hook, _planned_parameters).__module__.startswith("rlspeed.")
                    for hook in ("_setup_optimizer", "_make_optimizer", "_optimizers"))):
        return getattr(model, model._optimized_parameters)
    return None


def _trained_parameters(model) -> set[int]:
    """The ids of the parameters the model's optimisers hold (of rlspeed's own not built yet, those they will hold:
    a subclass's are built to see)."""
    planned = _planned_parameters(model)
    if planned is not None:
        return {id(p) for p in planned}
    return {id(p) for optimizer in model._optimizers().values() for group in optimizer.param_groups
            for p in group["params"]}


@functools.cache
def _config_names(algorithm: type) -> frozenset[str]:
    """The hyperparameter names of an algorithm class (its config's fields; none for a class without one)."""
    config_cls = getattr(algorithm, "config_cls", None)
    return frozenset(f.name for f in dataclasses.fields(config_cls)) if config_cls is not None else frozenset()


#: whether this thread is inside `Algorithm.__reduce_ex__`'s torch.save (a model pickles attribute by attribute there)
_TORCH_PICKLING = threading.local()


def _may_read_config(function: Callable, owner: type) -> bool:
    """Whether `function` (a subclass's `_make_encoder`) may read the model's config: the name `config` in its code,
    in the code it nests (lambdas, comprehensions, inner functions) or in the code of what it names: methods of
    `owner` and its bases (`super()._make_encoder`), functions and module attributes of its module, classes' `__init__`
    of its module, and what their code names in turn where they are of `function`'s module (others are read, not
    followed); a decorated function's own (`__wrapped__`, a decorator's closure: `@torch.no_grad()`) too. A static
    reading that errs towards yes: a setting is said to do nothing only where no code that `function` reaches names
    `config` (an attribute, a global or the string: `getattr(self, "config")`); yes where `function` has no code to
    read (a `functools.partialmethod`)."""
    if not isinstance(getattr(function, "__code__", None), types.CodeType):
        return True
    home = getattr(function, "__module__", None)
    seen: set[int] = set()
    todo: list = [function]
    while todo:
        item = todo.pop()
        item = getattr(item, "fget", None) or getattr(item, "__func__", None) or item  # (properties, classmethods)
        if isinstance(item, type):
            item = vars(item).get("__init__") if item.__module__ == home else None
        code = getattr(item, "__code__", None)
        if not isinstance(code, types.CodeType) or id(code) in seen:
            continue
        todo += [item.__wrapped__] if hasattr(item, "__wrapped__") else []  # (a decorated function: its own code)
        for cell in getattr(item, "__closure__", None) or ():  # (a decorator without functools.wraps holds it here)
            with contextlib.suppress(ValueError):  # (an empty cell)
                todo.append(cell.cell_contents)
        scope = getattr(item, "__globals__", {})
        follow = getattr(item, "__module__", None) == home
        codes = [code]
        while codes:
            code = codes.pop()
            seen.add(id(code))
            if "config" in code.co_names or "config" in code.co_consts:
                return True
            codes += [const for const in code.co_consts if isinstance(const, types.CodeType)]
            if follow:
                modules = [scope[name] for name in code.co_names if isinstance(scope.get(name), types.ModuleType)]
                for name in code.co_names:
                    todo += [vars(base)[name] for base in owner.__mro__ if name in vars(base)
                             and not name.startswith("__")]
                    todo += [scope[name]] if name in scope else []
                    todo += [vars(module)[name] for module in modules if name in vars(module)]
    return False


def _picklable(value) -> bool:
    """Whether `value` pickles (with torch's pickler, as a model's attributes do)."""
    try:
        torch.save(value, io.BytesIO())
    except Exception:  # noqa: BLE001 (whatever its pickling raises: it does not pickle)
        return False
    return True


def _unpickle_model(data: bytes) -> Algorithm:
    """A model `Algorithm.__reduce_ex__` pickled, whose networks' followers then follow it (`_own_modules`)."""
    with torch.inference_mode(False):  # (trainable tensors, also unpickled inside a caller's inference_mode)
        model = torch.load(io.BytesIO(data), weights_only=False)
    model._own_modules()
    return model


def _network_keys(config, observation_space: gym.Space | None) -> list[str]:
    """The settings that decide what a config's saved weights compute, which load and resume keep: the
    `_ARCHITECTURE_KEYS` less gSDE's options where use_sde is off (they build nothing), plus normalize_images where
    the observations hold uint8 images (it decides the scale the encoder's weights were trained on)."""
    idle = () if getattr(config, "use_sde", False) else getattr(config, "needs_sde", ())
    keys = [key for key in _ARCHITECTURE_KEYS if key not in idle]
    leaves = _leaf_spaces(observation_space) if observation_space is not None else []
    if any(image_channels_first(space) is not None and np.dtype(space.dtype) == np.uint8 for space in leaves):
        keys.append("normalize_images")
    return keys


def _weights_keys(config, observation_space: gym.Space | None) -> list[str]:
    """`_network_keys` plus normalize_obs: what another model's weights must share with a model's for it to take them
    (`set_parameters`): weights trained on normalised observations compute other things on raw ones."""
    return [*_network_keys(config, observation_space), *(["normalize_obs"] if hasattr(config, "normalize_obs") else [])]


def with_saved_cnn(config: dict, fields: Collection[str], space: gym.Space | None) -> dict:
    """A checkpoint's saved config with the `cnn` its CNNs were built with where the file predates the setting: the
    rule of then, `nature_or_small`, where an image of its observations (`space`; None: float vectors) is 16 to 35
    pixels a side (where `auto` builds the strided CNN instead), else `auto` (the same networks). `fields`: the config
    class's."""
    if "cnn" not in fields or "cnn" in config:
        return config
    sides = [image_side(leaf) for leaf in (_leaf_spaces(space) if space is not None else [])]
    between = any(side is not None and STRIDED_CNN_MIN_SIDE <= side < NATURE_CNN_MIN_SIDE for side in sides)
    return {**config, "cnn": "nature_or_small" if between else "auto"}


def _cnn_archs(config, space: gym.Space | None) -> tuple[str, ...]:
    """The CNN architecture (`cnn_arch`) each image of `space` gets under `config`'s encoder and cnn, in key order:
    what decides a model's CNNs, which `cnn` values alike in it build alike (auto and nature at 40x40)."""
    images = _images(config, space) if space is not None and config.encoder != "mlp" else []  # (mlp: no CNN)
    return tuple(cnn_arch(config.cnn, *image_shape(image)[1:]) for image in images)


def _same_networks(key: str, saved, given, space: gym.Space | None) -> bool:
    """Whether the configs `saved` and `given` (load's and resume's: the `_network_keys` before `key` alike) build the
    same networks in `key` for observations of `space`: the same value, or for `cnn` the same architecture for each
    image."""
    if getattr(given, key) == getattr(saved, key):
        return True
    return key == "cnn" and _cnn_archs(given, space) == _cnn_archs(saved, space)


def saved_config(config_cls: type, config: dict, space: gym.Space | None):
    """A checkpoint's saved config (`config`, its metadata's) as `config_cls` builds it: with the `cnn` its CNNs were
    built with where the file predates the setting (`with_saved_cnn`, for observations of `space`), less settings
    the class does not have. UserError where a value is not one the class takes."""
    fields = _field_names(config_cls)
    config = with_saved_cnn(config, fields, space)
    return build_config(config_cls, {key: value for key, value in config.items() if key in fields})


class SavedNetworks(typing.NamedTuple):
    """The networks a model file holds, read once from its checkpoint metadata (`saved_networks`): the rule of
    `set_parameters` and `--init-from` for which models take its weights."""

    #: the file's saved config as the algorithm's config class builds it (`saved_config`)
    config: typing.Any
    #: the observation space the file records (None: float vectors of an older file)
    space: gym.Space | None
    #: the settings its weights need a model to share (`_weights_keys`), by name, as its config holds them
    settings: dict

    def mismatch(self, config) -> str | None:
        """The first of `settings` whose networks `config` (a model's) does not build as the file's, None where it
        takes the file's weights (`_same_networks`, as `load` and resume: a `cnn` of another name that builds each
        image the same CNN takes them)."""
        for key in self.settings:
            try:
                if not _same_networks(key, self.config, config, self.space):
                    return key
            except UserError:  # (a CNN the file's images are too small for: not the file's)
                return key
        return None


def saved_networks(algo_cls: type, meta: dict) -> SavedNetworks:
    """The networks of a model file of `algo_cls` (`meta`: its checkpoint metadata)."""
    space = space_from_json(meta["observation_space"]) if "observation_space" in meta else None
    config = saved_config(algo_cls.config_cls, meta["config"], space)
    return SavedNetworks(config, space, {key: getattr(config, key) for key in _weights_keys(config, space)
                                         if key in _config_names(algo_cls)})


#: short names people type for a hyperparameter (`--set lr=...`): the one they mean, for the "did you mean" hint
_SHORT_NAMES = {"lr": "learning_rate", "bs": "batch_size", "epochs": "n_epochs", "envs": "num_envs",
                "lambda": "gae_lambda", "clip": "clip_range", "entropy": "ent_coef", "grad_clip": "max_grad_norm",
                "n_steps": "num_steps", "n_envs": "num_envs"}  # (and Stable-Baselines3's names for rlspeed's)


#: the constructor's arguments that are no hyperparameters, with the `rlspeed train` flag for each (a preset file or
#: `--set` naming one is told where it goes)
MODEL_ARGUMENTS = {"seed": "--seed N", "device": "--device cuda", "env_backend": "--env-backend NAME",
                   "env_kwargs": "--env-kwargs KEY=VALUE", "num_threads": "--threads N",
                   "accelerate": "--accelerate auto", "nan_policy": "--nan-policy mask",
                   "save_replay_buffer": "--save-replay-buffer", "verbose": "--quiet (verbose=0)"}
#: `learn`'s arguments that presets and the command line hold beside the hyperparameters (`split_run_settings`)
_RUN_KEYWORDS = ("total_timesteps", "target_return", "eval_freq", "eval_episodes", "checkpoint_freq", "run_dir")

#: keywords people try for several agents at once (the issue's `PPO(..., population=K)`), which a Population is
_POPULATION_KEYS = ("population", "population_size", "seeds", "n_seeds", "num_seeds", "n_agents", "num_agents")


#: SB3's `train_freq=(n, "step")` / `(n, "episode")` written as text (`--set "train_freq=(1, episode)"`)
_TRAIN_FREQ_TUPLE = re.compile(r"[(\[]\s*(\d+)\s*,\s*['\"]?(\w+)['\"]?\s*[)\]]")


@functools.cache
def config_type_hints(config_cls: type) -> dict[str, typing.Any]:
    """`typing.get_type_hints(config_cls)`, resolved once per config class (a population builds a config per
    member, and every learn reads them again in `coerce_in_place`)."""
    return typing.get_type_hints(config_cls)


def _owner_name(config_cls: type) -> str:
    """The algorithm a config class is of, as messages name it: `PPOConfig` -> "PPO" (a class named just `Config`:
    that name)."""
    return config_cls.__name__.removesuffix("Config") or config_cls.__name__


#: SB3's commonest `policy_kwargs` options as rlspeed's keywords, each named where the algorithm has it
_NETWORK_KEYWORDS = {"net_arch": "[64, 64]", "activation": "'tanh'", "log_std_init": "...", "n_critics": "...",
                     "lstm_hidden_size": "..."}


@functools.cache
def _algo_name(config_cls: type) -> str:
    """rlspeed's CLI name of the algorithm whose config `config_cls` is, or derives from (a subclass's own config is
    of that algorithm): "ppo", "recurrent_ppo". Read once per config class: rlspeed's algorithms, all it looks
    among, are defined when `rlspeed.algos` is imported, before any call."""
    names = {algo_cls.config_cls: name for name, algo_cls in _algorithm_classes().items()}
    return next((names[base] for base in config_cls.__mro__ if base in names),
                re.sub(r"(?<=[a-z])(?=[A-Z])", "_", _owner_name(config_cls)).lower())


def sb3_policy_kwargs(config_cls: type, values: dict) -> dict:
    """`values` with Stable-Baselines3's `policy_kwargs` dict as the hyperparameters it names, by the rule RL-Zoo's
    translation follows (`rlspeed.policy_kwargs.translate_policy_kwargs`): PPO's dict(net_arch=[64, 64],
    activation_fn=nn.ReLU) is net_arch=[64, 64], activation='relu', saved under those names. Taken only where every
    option builds what SB3 builds (each a setting the config has); otherwise `values` is left to `build_config`'s
    refusal, which names each option's keyword or why there is none. UserError where a setting it makes is also
    given as a keyword."""
    kwargs = values.get("policy_kwargs")
    if not isinstance(kwargs, dict) or not kwargs:
        return values
    fields = _field_names(config_cls)
    read = Collected()
    translate_policy_kwargs(_algo_name(config_cls), kwargs, read)
    if read.refused or any(key not in fields for key in read.hyper):
        return values
    given = [key for key in read.hyper if key in values]
    if given:
        raise UserError(f"policy_kwargs sets {', '.join(given)}, and "
                        f"{', '.join(f'{key}={values[key]!r}' for key in given)} is given too: give one of them.")
    made = {**read.hyper, **({"net_arch": kwargs["net_arch"]} if "net_arch" in read.hyper else {})}
    # (SB3's net_arch as written: build_config's one rule for its dict forms, as for the keyword)
    return {**{key: value for key, value in values.items() if key != "policy_kwargs"}, **made}


#: Stable-Baselines3's HerReplayBuffer options at the values that are what rlspeed's Hindsight Experience Replay does
#: (its defaults): taken, changing nothing; n_sampled_goal and goal_selection_strategy are rlspeed's settings
_SB3_HER_DEFAULTS = {"handle_timeout_termination": True, "copy_info_dict": False, "optimize_memory_usage": False}


def sb3_her(config_cls: type, values: dict) -> dict:
    """`values` with Stable-Baselines3's replay_buffer_class=HerReplayBuffer (the class, or its name) as her=True and
    its replay_buffer_kwargs n_sampled_goal and goal_selection_strategy as those settings, where the config has
    `her`; other options are left to `build_config`'s refusal. UserError for an option rlspeed's HER has not, or a
    setting also given as a keyword."""
    buffer_class = values.get("replay_buffer_class")
    name = buffer_class if isinstance(buffer_class, str) else getattr(buffer_class, "__name__", None)
    if name != "HerReplayBuffer" or "her" not in _field_names(config_cls):
        return values
    options = values.get("replay_buffer_kwargs") or {}
    if not isinstance(options, dict):
        raise UserError(f"replay_buffer_kwargs={options!r}: expected a dict of HerReplayBuffer's options "
                        "(n_sampled_goal, goal_selection_strategy).")
    other = [f"{key}={item!r}" for key, item in options.items() if key not in ("n_sampled_goal",
             "goal_selection_strategy") and not (key in _SB3_HER_DEFAULTS and item is _SB3_HER_DEFAULTS[key])]
    if other:
        raise UserError(f"replay_buffer_kwargs {', '.join(other)}: rlspeed's Hindsight Experience Replay takes "
                        "n_sampled_goal and goal_selection_strategy (future, final or episode), and handles time "
                        "limits and info dicts as SB3's defaults do.")
    made = {"her": True, **{key: item for key, item in options.items() if key not in _SB3_HER_DEFAULTS}}
    given = [key for key in made if key in values]
    if given:
        raise UserError(f"replay_buffer_class=HerReplayBuffer sets {', '.join(given)}, and "
                        f"{', '.join(f'{key}={values[key]!r}' for key in given)} is given too: give one of them.")
    rest = {key: value for key, value in values.items() if key not in ("replay_buffer_class", "replay_buffer_kwargs")}
    return {**rest, **made}


#: hyperparameters that rlspeed decays linearly to 0 over a learn call, each with the switch that does it
SB3_SCHEDULED = {"learning_rate": "anneal_lr", "clip_range": "anneal_clip"}
#: the algorithms (by config class) whose switches decay their hyperparameter at Stable-Baselines3's progress (the step
#: count after each collection), so that its LinearSchedule(start, 0, 1.0) is that switch: the off-policy learning
#: rates. On-policy anneal_lr and anneal_clip decay at CleanRL's progress (the count before each rollout), one
#: update's worth above SB3's schedule (`sb3_schedules`)
SB3_PROGRESS_OF = {"OffPolicyConfig": ("learning_rate",)}
#: Stable-Baselines3's deprecated schedule functions (`stable_baselines3.common.utils`), by qualified name, with the
#: names of the arguments they keep: their values are read from the function's closure, the arguments as given
_SB3_SCHEDULE_FUNCTIONS = {"get_linear_fn.<locals>.func": ("start", "end", "end_fraction"),
                           "constant_fn.<locals>.func": ("val",),
                           "get_schedule_fn.<locals>.<lambda>": ("value_schedule",)}


def sb3_schedule(schedule: object) -> tuple[float, float, float] | None:
    """Stable-Baselines3's schedule `schedule` as the (start, end, end_fraction) of its documented arguments:
    `ConstantSchedule(val)` and `constant_fn(val)` as (val, val, 1.0), `LinearSchedule(start, end, end_fraction)` and
    `get_linear_fn(...)` as theirs, `FloatSchedule(x)` and `get_schedule_fn(x)` as x's (a number: constant). None for
    anything else, a function of one's own above all: what it returns is not known without calling it at every
    progress point."""
    kind = type(schedule)
    if kind.__module__.startswith("stable_baselines3.") and kind.__name__ in ("FloatSchedule", "ConstantSchedule",
                                                                             "LinearSchedule"):
        arguments = {name: getattr(schedule, name, None) for name in ("value_schedule", "val", "start", "end",
                                                                      "end_fraction")}
    elif (isinstance(schedule, types.FunctionType) and schedule.__module__ == "stable_baselines3.common.utils"
          and schedule.__qualname__ in _SB3_SCHEDULE_FUNCTIONS):
        kept = dict(zip(schedule.__code__.co_freevars, schedule.__closure__ or ()))
        arguments = {name: kept[name].cell_contents for name in _SB3_SCHEDULE_FUNCTIONS[schedule.__qualname__]
                     if name in kept}
    else:
        return None
    inner = arguments.get("value_schedule")
    if inner is not None:  # (FloatSchedule's and get_schedule_fn's: a number, or a schedule)
        return (inner, inner, 1.0) if _real(inner) else sb3_schedule(inner)
    if arguments.get("val") is not None:
        arguments = {"start": arguments["val"], "end": arguments["val"], "end_fraction": 1.0}
    read = tuple(arguments.get(name) for name in ("start", "end", "end_fraction"))
    return tuple(float(value) for value in read) if all(_real(value) for value in read) else None


def _real(value: object) -> bool:
    """Whether `value` is a real number (numpy's too) that is no bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def sb3_schedules(config_cls: type, values: dict) -> dict:
    """`values` with Stable-Baselines3's schedule objects (`sb3_schedule`) as the settings that do what they do here:
    a constant one as its value, held (its switch in `SB3_SCHEDULED` off: learning_rate=ConstantSchedule(3e-4) is
    learning_rate=3e-4, anneal_lr=False, PPO's default being on); off-policy, a learning rate's linear schedule to 0
    over the whole run (`LinearSchedule(start, 0, 1.0)`) as its start with anneal_lr on, which decays it at the same
    progress (each learn call's, or with learn's reset_num_timesteps=False the model's whole step count, as SB3's
    progress_remaining). UserError for that schedule where the switch decays at another progress (on-policy: said,
    with the settings for rlspeed's decay) or where the switch is also given otherwise; other schedules are left to
    the config's refusal."""
    fields = _field_names(config_cls)
    at_sb3s_progress = _of_algorithm(SB3_PROGRESS_OF, config_cls, ())
    made = {}
    for key, value in values.items():
        read = sb3_schedule(value) if key in fields and callable(value) else None
        if read is None:
            continue
        (start, end, end_fraction), switch = read, SB3_SCHEDULED.get(key)
        switch = switch if switch in fields else None
        if start == end and end_fraction > 0:
            taken = {key: start, **({switch: False} if switch else {})}
        elif end == 0 and end_fraction == 1 and switch:
            if key not in at_sb3s_progress:
                raise UserError(f"{key}={value!r}: {_owner_name(config_cls)}'s {switch}=True decays {key} linearly to "
                                "0 at CleanRL's progress (the step count before each rollout), one update's worth "
                                f"above this schedule's value at every update; give {key}={start:g}, {switch}=True "
                                "for that decay.")
            taken = {key: start, switch: True}
        else:
            continue
        if switch in values:
            try:
                agrees = _read_bool(values[switch]) is taken[switch]
            except ValueError:
                agrees = True  # (the config's own refusal of the value)
            if not agrees:
                raise UserError(f"{key}={value!r} {'decays' if taken[switch] else 'holds'} {key} ({switch}="
                                f"{taken[switch]}), and {switch}={values[switch]!r} is given too: give one of them.")
        made.update(taken)
    return {**values, **made}


#: the settings a model takes a schedule function for, as Stable-Baselines3 does: learning_rate everywhere, PPO's
#: clip_range and clip_range_vf (`own_schedules`)
SCHEDULE_FUNCTION_KEYS = ("learning_rate", "clip_range", "clip_range_vf")


def own_schedules(config_cls: type, values: dict) -> tuple[dict, dict]:
    """(`values` with each schedule function given for one of `SCHEDULE_FUNCTION_KEYS` that `config_cls` has as its
    value at progress_remaining=1, which the optimisers start with as SB3's do, and its switch in `SB3_SCHEDULED`
    (anneal_lr, anneal_clip) off; the functions by setting). A schedule function is any callable of
    progress_remaining (1 at the start of learn, 0 at its end) that returns a number: one of one's own
    (`def linear_schedule(initial_value)` of SB3's docs), or a schedule object of SB3's that `sb3_schedules` has no
    setting for; the model calls it at every update (`Algorithm._call_schedules`). UserError for a function that
    returns no number >= 0, or a switch also given on."""
    fields = _field_names(config_cls)
    made, functions = {}, {}
    for key in SCHEDULE_FUNCTION_KEYS:
        function = values.get(key)
        if key not in fields or not callable(function) or isinstance(function, type):
            continue
        try:  # (ConstantSchedule's value, off-policy LinearSchedule(start, 0, 1.0)'s anneal_lr: that setting says it)
            if not callable(sb3_schedules(config_cls, {key: function})[key]):
                continue
        except UserError:
            pass  # (a schedule that anneal_lr or anneal_clip would decay at another progress: called, as SB3 does)
        switch = _schedule_switch(key, config_cls)
        if switch in values:
            try:
                on = _read_bool(values[switch])
            except ValueError:
                on = False  # (the config's own refusal of the value)
            if on:
                raise UserError(f"{key}={schedule_name(function)} is a schedule, called at every update, and "
                                f"{switch}={values[switch]!r} would decay {key} too: give one of them.")
        made.update({key: schedule_value(key, function, 1.0), **({switch: False} if switch else {})})
        functions[key] = function
    return {**values, **made}, functions


def _schedule_switch(key: str, config_cls: type) -> str | None:
    """The setting that decays `key` linearly (`SB3_SCHEDULED`: anneal_lr, anneal_clip) where `config_cls` has it."""
    switch = SB3_SCHEDULED.get(key)
    return switch if switch in _field_names(config_cls) else None


def refuse_schedule_functions(member: typing.Any) -> None:
    """UserError in one sentence for a population's member model made with schedule functions (`own_schedules`), or
    loaded from a file saved with them that were given neither again nor as a number (`_schedules_missing`, which a
    solo learn refuses): the population's stacked update calls none of them, and would train at their start value."""
    algo = type(member).__name__
    for key, name in member._schedule_names().items():
        switch = _schedule_switch(key, member.config_cls)
        decay = f"; {switch}=True decays it linearly to 0 over each learn call" if switch else ""
        instead = (f"load the member with one, {algo}.load(path, {key}=...)" if key not in member._schedule_functions
                   else f"or train the models one by one, {algo}(env, {key}=...)")
        raise UserError(f"{key}={name}: a population trains its members in one stacked update, which calls no "
                        f"schedule function: give a number{decay} ({instead}).")


def schedule_name(function: Callable) -> str:
    """A schedule function as a sentence names it: a function by its qualified name, an object by its repr."""
    return function.__qualname__ if isinstance(function, types.FunctionType) else repr(function)


def schedule_value(key: str, function: Callable, progress: float) -> float:
    """What the schedule function `function` given for `key` returns at `progress` (progress_remaining), as a float;
    UserError where it raises or returns no finite number >= 0 (a learning rate or clip range below 0 turns the
    update around)."""
    try:
        value = function(progress)
    except Exception as error:
        raise UserError(f"{key}={schedule_name(function)} raised {type(error).__name__} ({first_line(error)[:200]}) "
                        f"at progress_remaining={progress:g}: a schedule takes the progress remaining (1 at the start "
                        "of learn, 0 at its end) and returns a number.") from error
    if not _real(value) or not math.isfinite(value) or value < 0:
        raise UserError(f"{key}={schedule_name(function)} returned {value!r} at progress_remaining={progress:g}: "
                        "a schedule returns a finite number >= 0.")
    return float(value)


def missing_schedules_words(missing: dict) -> tuple[str, str, str]:
    """A refusal's words for the schedule functions `missing` ({setting: name}) that a model file was saved with and
    that were not given again: ('s' for several or '', 'key=name, ...', 'key=..., ...')."""
    return ("s" * (len(missing) > 1), ", ".join(f"{key}={name}" for key, name in missing.items()),
            ", ".join(f"{key}=..." for key in missing))


def _saved_schedule_functions(meta: dict, given: typing.Container[str]) -> dict:
    """The schedule functions a model file was saved with (`Algorithm.save`) that are not among `given` (settings
    given a value or a function again), {setting: name}; {} for none."""
    saved = meta.get("schedule_functions")
    return {key: str(name) for key, name in saved.items() if key not in given} if isinstance(saved, dict) else {}


def sb3_settings(config_cls: type, values: dict) -> dict:
    """`values` with Stable-Baselines3's names and options as rlspeed's settings for `config_cls`'s algorithm:
    n_steps (`rlspeed_names`), policy_kwargs (`sb3_policy_kwargs`), replay_buffer_class=HerReplayBuffer
    (`sb3_her`), TD3/DDPG's action noise objects (`sb3_action_noise`) and schedule objects (`sb3_schedules`), to be
    saved under rlspeed's names. One rule for the constructor (`build_config`), load's overrides (before they meet
    the file's settings) and `--set` (over a preset's settings)."""
    return sb3_schedules(config_cls, sb3_action_noise(config_cls, sb3_her(config_cls, sb3_policy_kwargs(
        config_cls, rlspeed_names(config_cls, values)))))


def _policy_keywords(policy_kwargs: object, config_cls: type, fields: typing.Container[str]) -> str:
    """The network's keywords the algorithm of `config_cls` (whose field names are `fields`) has, and SB3's
    `policy_kwargs` as the keywords to write instead (" (net_arch=[64, 64], ...): here activation='leaky_relu',
    net_arch=[32]"), by the rule RL-Zoo's translation follows (`rlspeed.policy_kwargs`) for that algorithm: the
    settings it has, then the options it has not, each reason (as the translation refuses them) once."""
    named = [f"{key}={example}" for key, example in _NETWORK_KEYWORDS.items() if key in fields]
    keywords = f" ({', '.join(named)})" if named else ""
    if not isinstance(policy_kwargs, dict):
        return keywords
    owner = _owner_name(config_cls)
    read = Collected()
    translate_policy_kwargs(_algo_name(config_cls), policy_kwargs, read)
    written = [f"{key}={value!r}" for key, value in sorted(read.hyper.items()) if key in fields]
    # (each rule said once, after the options it refuses: "policy_kwargs.optimizer_class=..., ...optimizer_kwargs=...:
    # rlspeed's ppo builds its own optimizer")
    refused: dict[str, list[str]] = {}
    for key, shown, rule in read.refused + [(read.origin[key], repr(value), f"{owner} has no {key}")
                                            for key, value in read.hyper.items() if key not in fields]:
        refused.setdefault(rule.removesuffix("."), []).append(f"{key}={shown}")
    return keywords + (f": here {', '.join(written)}" if written else "") + "".join(
        f"; {', '.join(options)}: {rule}" for rule, options in refused.items())


def sb3_action_noise(config_cls: type, values: dict) -> dict:
    """`values` with Stable-Baselines3's NormalActionNoise(mean=0, sigma) or OrnsteinUhlenbeckActionNoise(mean=0,
    sigma, theta, dt) object for `action_noise` as the settings that make that noise here (action_noise='normal',
    action_noise_std=sigma; OU's ou_theta and ou_dt), where the config has them and sigma is one value for every
    action dimension (other objects are left to the config's refusal); UserError where a setting it makes is also
    given otherwise."""
    noise = values.get("action_noise")
    kind = type(noise).__name__
    if (kind not in ("NormalActionNoise", "OrnsteinUhlenbeckActionNoise")
            or not type(noise).__module__.startswith("stable_baselines3") or "action_noise_std" not in
            _field_names(config_cls)):
        return values
    # (SB3 keeps the arguments in private attributes only, named after them: read where they are, said where not)
    kept = ("_mu", "_sigma", "_theta", "_dt") if kind == "OrnsteinUhlenbeckActionNoise" else ("_mu", "_sigma")
    lost = [name for name in kept if not hasattr(noise, name)]
    if lost:
        settings = ("action_noise='ornstein-uhlenbeck', action_noise_std=SIGMA, ou_theta=THETA, ou_dt=DT"
                    if kind == "OrnsteinUhlenbeckActionNoise" else "action_noise='normal', action_noise_std=SIGMA")
        raise UserError(f"action_noise={kind}(...): this Stable-Baselines3's {kind} keeps its arguments elsewhere "
                        f"than rlspeed reads them (no {', '.join(lost)}); give the settings instead: {settings}.")
    mean, sigma = np.asarray(noise._mu), np.asarray(noise._sigma)
    if sigma.size == 0 or np.any(mean != 0) or np.any(sigma != sigma.flat[0]):
        return values
    made = {"action_noise": "normal", "action_noise_std": float(sigma.flat[0])}
    if kind == "OrnsteinUhlenbeckActionNoise":
        if getattr(noise, "initial_noise", None) is not None:
            return values
        made.update(action_noise="ornstein-uhlenbeck", ou_theta=float(noise._theta), ou_dt=float(noise._dt))
    given = [key for key in made if key != "action_noise" and key in values and values[key] != made[key]]
    if given:
        raise UserError(f"action_noise={kind}(...) sets {', '.join(f'{key}={made[key]!r}' for key in given)}, and "
                        f"{', '.join(f'{key}={values[key]!r}' for key in given)} is given too: give one of them.")
    return {**values, **made}


def build_config(config_cls: type, overrides: dict, processes: int = 1) -> typing.Any:
    """A config dataclass from defaults + overrides; one clear sentence for unknown keys or bad values. With several
    `processes` to train it (torchrun's), a config's `check_processes` (PPO's batch_size) goes first, so that the
    sizes a refusal advises pass the rules of one process and of several."""
    fields = _field_names(config_cls)
    hints = config_type_hints(config_cls)
    overrides = sb3_settings(config_cls, overrides)
    nothing = _sb3_nothing(config_cls)
    values = {}
    # (auto_X last: it sets the value it names, ent_coef_init, whatever comes first, also over a saved config's)
    for key, value in sorted(overrides.items(), key=lambda item: item[0] in AUTO_VALUES):
        refused = getattr(config_cls, "refused", {})
        if key in SB3_CONTRIB_LSTM_LAYOUT and key in refused and is_rlspeeds_lstm_layout(key, value):
            continue  # (sb3-contrib's layout option at the value that describes this network: nothing to set)
        if key in refused:
            raise UserError(f"'{key}' is not an option of {config_cls.__name__}: {refused[key]}.")
        if key not in fields:
            if key in _POPULATION_KEYS:
                owner = _owner_name(config_cls)
                raise UserError(f"'{key}' is not a hyperparameter of {owner}: several agents trained at once are a "
                                f"population, rlspeed.population.Population({owner}, env_id, seeds=range(K), ...) "
                                "(docs/population.md; rlspeed train ... --seeds 0-31).")
            if key in nothing and any(is_sb3_default(value, default) for default in nothing[key]):
                continue  # (as Stable-Baselines3's default: nothing to set)
            if key in SB3_KEYWORDS:
                raise UserError(f"'{key}' is Stable-Baselines3's keyword; {SB3_KEYWORDS[key]}"
                                f"{_policy_keywords(value, config_cls, fields) if key == 'policy_kwargs' else ''}.")
            if key in MODEL_ARGUMENTS:
                owner = _owner_name(config_cls)
                raise UserError(f"'{key}' is an argument of the model, not a hyperparameter: {owner}(env, {key}=X) "
                                f"in Python, {MODEL_ARGUMENTS[key]} on rlspeed train's command line.")
            if key in _RUN_KEYWORDS:  # (a preset's run settings, or the CLI's flags: learn's arguments here)
                call = "total_timesteps=..." if key == "total_timesteps" else f"total_timesteps, {key}=..."
                raise UserError(f"'{key}' is a setting of the run, not of the model: give it to learn "
                                f"(model.learn({call})); rlspeed.presets.split_run_settings separates a preset's "
                                "run settings from its hyperparameters.")
            if key in CLEANRL_NAMES:
                raise UserError(f"'{key}' is CleanRL's argument, not a hyperparameter here; {CLEANRL_NAMES[key]}.")
            named = _SHORT_NAMES.get(key.lower(), key.replace("-", "_").lower())
            owner = _owner_name(config_cls)
            # (an alias of another algorithm's setting with a close name here, n_steps for DQN's n_step: that name)
            close_here = _close_names(key, list(fields)) if named not in fields and named != key else []
            others = "" if named in fields or close_here else _other_owners(named, config_cls)
            # (a key of another algorithm is named as such, not guessed at)
            close = [named] if named in fields else close_here or ([] if others else _close_names(key, list(fields)))
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            if others:
                hint = f" {named} is a setting of {others}; {owner} has none.{hint}"
            elif not close:
                hint = f" Valid: {', '.join(sorted(fields))}."
            raise UserError(f"Unknown hyperparameter '{key}' for {owner}.{hint}")
        if (key in AUTO_VALUES and isinstance(value, str) and value.lower().startswith("auto")
                and type(None) in typing.get_args(hints[key])):
            values[key], start = None, value[4:].removeprefix("_")  # (None: tuned automatically, as SB3's "auto")
            if start:
                if AUTO_VALUES[key] is None:
                    raise UserError(f"Hyperparameter '{key}' got {value!r}: expected auto or a number.")
                try:
                    values[AUTO_VALUES[key]] = coerce(key, start, float)
                except UserError:
                    raise UserError(f"Hyperparameter '{key}' got {value!r}: expected auto, auto_X with a number X "
                                    "(auto_0.1), or a number.") from None
            continue
        written = _TRAIN_FREQ_TUPLE.fullmatch(value.strip()) if key == "train_freq" and isinstance(value, str) else None
        if written:  # (SB3's tuple as text, from --set or a YAML file: "(1, 'episode')" is read as that tuple)
            value = (int(written[1]), written[2])
        if key == "train_freq" and isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], str):
            if value[1] == "episode":  # SB3's (n, "step") / (n, "episode")
                raise UserError(f"train_freq={tuple(value)!r}: rlspeed's train_freq counts env steps (per env); "
                                "there is no per-episode training frequency, give a number of steps.")
            if value[1] != "step":
                raise UserError(f"train_freq={tuple(value)!r}: its unit is 'step' (or SB3's 'episode', which rlspeed "
                                f"has not); give ({value[0]}, 'step') or the number {value[0]}.")
            value = value[0]
        if key == "net_arch" and isinstance(value, (list, tuple)) and any(isinstance(v, dict) for v in value):
            if len(value) != 1:  # SB3 1.x: [shared widths..., dict(pi=[...], vf=[...])]
                raise UserError(f"net_arch={list(value)}: rlspeed's actor and critic share no layers; give one list "
                                f"of layer widths for both (net_arch=[64, 64]), or {_OWN_NETWORKS}.")
            value = value[0]  # SB3 1.x: [dict(pi=[...], vf=[...])], the dict form below
        if key == "net_arch" and isinstance(value, dict):  # SB3 2.x: dict(pi=[...], vf=[...]) (or qf= off-policy)
            value = _shared_widths(value, config_cls)
        if key == "goal_selection_strategy":  # (SB3's GoalSelectionStrategy.FUTURE, or "FUTURE" as SB3 reads it)
            value = goal_strategy_name(value)
        if key == "activation" and isinstance(value, str):  # (torch's class names: "LeakyReLU", "nn.Tanh")
            value = activation_name(value)
        values[key] = coerce(key, value, hints[key])
    config = config_cls(**values)
    if processes > 1 and hasattr(config, "check_processes"):
        config.check_processes(processes)
    config.validate()
    return config


def coerce_in_place(config) -> None:
    """`config`'s values as `build_config` takes them (`coerce`: None for a named choice is its "none", "3e-4" a
    number), set in place; UserError naming the hyperparameter for a value of the wrong kind. For values set on
    `model.config` after the model was built, which `validate` then compares as the constructor's (it raised
    TypeError on a string, and refused TD3's action_noise=None, which the constructor takes as "none"). A name set
    there that is no hyperparameter (a misspelling: nothing would read it) is refused with the constructor's
    sentence, and SAC's "auto" and "auto_X" are taken as the constructor takes them."""
    hints = config_type_hints(type(config))
    names = {field.name for field in dataclasses.fields(config)}
    for key, value in list(vars(config).items()):
        if key not in names and not key.startswith("_"):
            ours = next((name for name in SB3_NAMES.get(key, ()) if name in names), None)
            if ours is not None:  # (the constructor takes SB3's name; the config has only rlspeed's)
                raise UserError(f"model.config.{key} = ... changes nothing: {key} is Stable-Baselines3's name, and "
                                f"the model's setting is model.config.{ours}.")
            try:
                build_config(type(config), {key: value})  # (it refuses every name it does not have)
            except UserError as error:
                raise UserError(f"model.config.{key} = ... changes nothing: {error}") from None
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in AUTO_VALUES and isinstance(value, str) and value.strip().lower().startswith("auto"):
            taken = build_config(type(config), {field.name: value.strip()})
            for name in (field.name, AUTO_VALUES[field.name]):
                if name is not None and name in vars(taken) and (name == field.name or value.strip()[4:]):
                    setattr(config, name, getattr(taken, name))
            continue
        taken = coerce(field.name, value, hints[field.name])
        if taken is not value:
            setattr(config, field.name, taken)


def _close_names(key: str, names: list[str]) -> list[str]:
    """Up to three of `names` that `key` looks like a misspelling of: close as a whole (difflib), and each of its
    words (split at "_") close to a word of the name, or, for a key without "_", close to the name without them. A
    shared first word alone is no likeness: normalize_obs is not a misspelling of normalize_images. Where none is,
    the closest whose last word is the key's (update_epochs: n_epochs)."""
    def close(a: str, b: str, cutoff: float) -> bool:
        return difflib.SequenceMatcher(None, a, b).ratio() >= cutoff

    def like(word: str, part: str) -> bool:
        return close(word, part, 0.75) or (min(len(word), len(part)) >= 3
                                           and (word.startswith(part) or part.startswith(word)))

    def words_match(name: str) -> bool:
        words, parts = [word for word in key.lower().split("_") if word], name.split("_")
        if len(words) == 1:
            return close(words[0], name.replace("_", ""), 0.75)
        return (all(any(like(word, part) for part in parts) for word in words)  # (a misspelling, or words left out)
                or all(any(like(word, part) for word in words) for part in parts))  # (words added: activation_fn)

    candidates = difflib.get_close_matches(key, names, n=6)
    found = [name for name in candidates if words_match(name)][:3]
    if not found:  # (the same thing named otherwise, by its last word: update_epochs for n_epochs)
        last = key.lower().rpartition("_")[2]
        found = [name for name in candidates if "_" in key and name.rpartition("_")[2] == last][:1]
    return found


def _takes(config_cls: type, key: str) -> bool:
    """Whether `config_cls` takes hyperparameter `key`: one of its fields, or sb3-contrib's LSTM layout option it
    takes at the value of its layout (`build_config`)."""
    refused = getattr(config_cls, "refused", {})
    if key in SB3_CONTRIB_LSTM_LAYOUT:
        return key in refused
    return key in _field_names(config_cls) and key not in refused


def _other_owners(key: str, config_cls: type) -> str:
    """The other algorithms whose config takes hyperparameter `key` (`_takes`), as "PPO, A2C and SAC" ('' for
    none)."""
    owners = sorted(algo.__name__ for algo in _algorithm_classes().values()
                    if algo.config_cls is not config_cls and _takes(algo.config_cls, key))
    return ", ".join(owners[:-1]) + f" and {owners[-1]}" if len(owners) > 1 else "".join(owners)


_FLOAT32_MAX = float(np.finfo(np.float32).max)

#: The least memory each env of these backends takes besides its buffers (`Algorithm._check_envs_fit`): a Gymnasium
#: env object and its Python state; an env process of its own (a Python interpreter) for gymnasium-async
ENV_OBJECT_BYTES = {"gymnasium": 16 * 2**10, "gymnasium-async": 20 * 2**20}
#: on/off words a bool hyperparameter takes as text: what YAML 1.1 reads as a bool unquoted (so a quoted 'off' in a
#: file, or anneal_lr="off" in Python, is what --set anneal_lr=off is), and 1 or 0; any case, spaces around ignored
_BOOL_TEXT = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _read_bool(value: typing.Any) -> bool:
    """`value` as the config reads a bool: True or False (numpy's, 1 or 0 too), or its text (`_BOOL_TEXT`, any case);
    ValueError otherwise (a list, a mapping or 2.5 is no on/off value: bool() would take it as one)."""
    if isinstance(value, str):
        if value.strip().lower() not in _BOOL_TEXT:
            raise ValueError
        return _BOOL_TEXT[value.strip().lower()]
    if is_true_or_false(value):
        return bool(value)
    raise ValueError


#: how to have networks the settings do not make (the end of a refusal)
_OWN_NETWORKS = ("build the networks in a subclass (PPO and A2C: its _build_policy, SAC, TD3 and DDPG: its _setup; "
                 "docs/algorithms.md)")


def _shared_widths(net_arch: dict, config_cls: type):
    """SB3 2.x's `net_arch=dict(pi=[...], vf=[...])` (`qf=` for SAC, TD3 and DDPG) as rlspeed's one list of widths
    for both networks: UserError unless it names exactly this algorithm's two networks with the same widths (SB3 gives
    a network left out no hidden layers, and ignores a key its algorithm lacks: taking either silently would build
    other networks than SB3 does)."""
    fields = _field_names(config_cls)
    if "exploration_fraction" in fields:  # (DQN: one Q-network)
        raise UserError(f"net_arch={net_arch}: DQN's Q-network takes one list of layer widths (net_arch=[64, 64]), "
                        "as SB3's DQN does.")
    keys = {"pi", "vf"} if "gae_lambda" in fields else {"pi", "qf"}
    if set(net_arch) != keys:
        raise UserError(f"net_arch={net_arch}: SB3's dict form names this algorithm's actor and critic, "
                        f"dict({', '.join(f'{k}=[...]' for k in sorted(keys))}), and rlspeed takes it where both are "
                        "the same widths; give them, or one list for both (net_arch=[64, 64]).")
    if len({repr(list(w) if isinstance(w, (list, tuple)) else w) for w in net_arch.values()}) != 1:
        raise UserError(f"net_arch={net_arch}: rlspeed's actor and critic take one list of layer widths "
                        f"(net_arch=[64, 64]); for different widths, {_OWN_NETWORKS}.")
    return next(iter(net_arch.values()))


def coerce(key: str, value, hint):
    """`value` as type `hint`, accepting YAML/CLI spellings (1e5 for an int when whole, lists for tuples);
    UserError naming `key` for the wrong kind (hyperparameters, and the CLI's run settings)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    # (none or null as text, `--set target_kl=None` or a file's 'none': the option off, as Python's None; not where
    # None is the automatic value, SAC's ent_coef, which 'none' could be read as switching off)
    if (isinstance(value, str) and value.strip().lower() in ("none", "null") and type(None) in args
            and key not in AUTO_VALUES):
        return None
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        hint = next(a for a in args if a is not type(None))
        origin = typing.get_origin(hint)
    try:
        if hint is bool:
            return _read_bool(value)
        if hint is int:  # also 1e6 / "1e6" (YAML 1.1 reads a float without a dot as a string) when whole
            if isinstance(value, (bool, np.bool_)):
                raise ValueError
            number = value
            if not isinstance(value, numbers.Integral):
                number = float(value)  # (NumPy and torch scalars, fractions: whole ones only, never truncated)
                if not number.is_integer():
                    raise ValueError
            refuse_past_int64(f"Hyperparameter '{key}' takes a whole number", number)
            return int(number)
        if hint is float:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not abs(number) <= _FLOAT32_MAX:  # (NaN, infinities and values float32 tensors cannot hold)
                raise UserError(f"Hyperparameter '{key}' got {value!r}: it must be a finite number within float32's "
                                f"range (at most {_FLOAT32_MAX:.3g} in size){infinite_advice(key)}.")
            return number
        if origin in (tuple, list):  # layer widths: a list of whole numbers (one number: one layer)
            items = [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            if isinstance(items, (str, bytes)) or any(isinstance(v, bool) or not float(v).is_integer() for v in items):
                raise ValueError
            return tuple(int(v) for v in items)
        if hint is str:
            if value is None:  # (a choice given as None: its "none", e.g. TD3's action_noise)
                return "none"
            if key == "encoder" and (isinstance(value, type) or isinstance(value, torch.nn.Module)):
                raise UserError(f"Hyperparameter 'encoder' takes a name ({', '.join(ENCODERS)}), not "
                                f"{refusal_name(value if isinstance(value, type) else type(value))}: {OWN_ENCODER}.")
            if isinstance(value, type):  # (a class for a named choice: torch.nn.ReLU for activation="relu")
                if key == "activation" and not is_torch_nn_class(value):  # (one's own Tanh is not torch's)
                    raise UserError(f"Hyperparameter '{key}' takes a name, or torch's own class for it, not "
                                    f"{refusal_name(value)}: the network is built from the name, "
                                    "so your class would be replaced by torch's; give your network to a subclass "
                                    "(docs/algorithms.md).")
                return activation_name(value) if key == "activation" else value.__name__.lower()
            if key == "activation" and isinstance(value, torch.nn.Module):  # (an instance: its arguments would be lost)
                name = activation_name(type(value))
                raise UserError(f"Hyperparameter '{key}' takes a name or torch's class, not a module ({value!r}): "
                                f"give activation='{name}' or torch.nn.{type(value).__name__}; a layer with "
                                "arguments of its own goes in a network of a subclass (docs/algorithms.md).")
            return str(value)
    except (TypeError, ValueError):
        pass
    else:
        return value
    schedule = callable(value) or (isinstance(value, str) and value.lower().startswith(("lin_", "linear")))
    annealed = {"learning_rate": "anneal_lr=True decays learning rates", "clip_range": "anneal_clip=True decays the "
                "clip range"}.get(key, "only learning_rate (anneal_lr=True) and clip_range (anneal_clip=True) decay,")
    advice = (f" A schedule is not a hyperparameter value here: give the starting value, and {annealed} linearly to 0 "
              "(Stable-Baselines3's linear schedule; its ConstantSchedule is taken as its value, and off-policy its "
              "LinearSchedule(start, 0, 1.0) as anneal_lr)." if schedule else "")
    if callable(value) and key in SCHEDULE_FUNCTION_KEYS:  # (one set on model.config)
        advice = (f" A schedule function is given to a model when it is made or loaded (PPO(env, {key}=f), "
                  f"PPO.load(path, {key}=f)), not set on model.config: give a number, or make or load the model with "
                  "the function.")
    elif callable(value):  # (a function for a setting that takes none: SB3 schedules these three alone)
        advice = (f" Schedule functions are taken for learning_rate, and PPO's clip_range and clip_range_vf, as in "
                  f"Stable-Baselines3: {key} takes a number.")
    if key in AUTO_VALUES and isinstance(value, str) and value.strip().lower() in ("none", "null"):
        advice = " Give auto for the automatically tuned value, or a number."
    elif key in AUTO_VALUES and isinstance(value, str) and value.strip().lower().startswith("auto"):
        advice = f" {key} is tuned automatically (auto) by SAC only; give a number."
    if hint is bool:
        advice = " Give true or false (yes or no, on or off, 1 or 0)."
    if origin in (tuple, list):
        advice = " Give the hidden layers' widths as one list of whole numbers, e.g. [64, 64]."
    raise UserError(f"Hyperparameter '{key}' got {value!r}, which is not a valid "
                    f"{getattr(hint, '__name__', hint)}.{advice}")


def changed_settings(config) -> str:
    """The hyperparameters of `config` that differ from its class's defaults, as `key=value, ...` ('' for none)."""
    changed = []
    for field in dataclasses.fields(config):
        if field.default is dataclasses.MISSING:
            continue
        value = getattr(config, field.name)
        if value != field.default:
            changed.append(f"{field.name}={value:g}" if isinstance(value, float) else f"{field.name}={value}")
    return ", ".join(changed)


def inert_settings(config, spec: EnvSpec | None = None, atari_known: bool = True) -> set[str]:
    """The hyperparameters of `config` that change nothing whatever their value: options of a feature the config has
    off (gSDE's without use_sde, Hindsight Experience Replay's without her, a normalisation's clip without that
    normalisation) and SAC's ent_coef_init beside a fixed ent_coef; with the env's `spec`, also those its spaces and id
    make idle (`env_inert_settings`; `atari_known`: whether its id tells an Atari game from others here).
    `unused_settings` names those set away from their defaults; `rlspeed report` does not tell experiments apart by
    them."""
    inert = env_inert_settings(config, spec, atari_known) if spec is not None else set()
    if not getattr(config, "use_sde", False):
        inert.update(getattr(config, "needs_sde", ()))
    if not getattr(config, "her", False):
        inert.update(name for name in ("n_sampled_goal", "goal_selection_strategy") if hasattr(config, name))
    for name, flag in (("normalize_obs_clip", "normalize_obs"), ("normalize_reward_clip", "normalize_reward")):
        if hasattr(config, name) and not getattr(config, flag, False):
            inert.add(name)
    if hasattr(config, "ent_coef_init") and getattr(config, "ent_coef", None) is not None:
        inert.add("ent_coef_init")
    return inert


def _images(config, space: gym.Space) -> list[gym.Space]:
    """The observations in `space` a CNN takes under `config`'s encoder (encoder=cnn: any 3-D Box; else images)."""
    taken = box_channels_first if config.encoder == "cnn" else image_channels_first
    return [leaf for leaf in _leaf_spaces(space) if taken(leaf) is not None]


def env_inert_settings(config, spec: EnvSpec, atari_known: bool = True) -> set[str]:
    """The hyperparameters of `config` that change nothing on the env of `spec`: the CNNs' options without images a
    CNN takes (or with encoder=mlp), normalize_images without uint8 images in [0, 255], log_std_init without Box
    actions (but gSDE's), and episodic_life and clip_rewards off Atari games (only where `atari_known`: the id is
    registered here, so that a game of an ale-py not installed is not taken for another env)."""
    inert = set()
    images = _images(config, spec.observation_space)
    if not images or config.encoder == "mlp":
        inert.update(name for name in ("cnn_features_dim", "cnn") if hasattr(config, name))
    if hasattr(config, "normalize_images") and not any(
            image_channels_first(space) is not None and np.dtype(space.dtype) == np.uint8 for space in images):
        inert.add("normalize_images")
    if hasattr(config, "log_std_init") and "log_std_init" not in getattr(config, "needs_sde", ()) and \
            not isinstance(spec.action_space, gym.spaces.Box):
        inert.add("log_std_init")
    if atari_known and not _atari_training(spec):
        inert.update(name for name in ("episodic_life", "clip_rewards") if hasattr(config, name))
    return inert


def unused_settings(config, spec: EnvSpec, env_normalises: Collection[str] = ()) -> list[str]:
    """The hyperparameters set away from their defaults that change nothing on this env, one sentence each: the CNN
    encoders' options without images they apply to, log_std_init without Gaussian actions, gSDE's options without
    use_sde (the config's `needs_sde`), episodic_life and clip_rewards without an Atari game, a normalisation's clip
    without that normalisation, SAC's ent_coef_init
    beside a fixed ent_coef, an on-policy batch_size above the rollout (one minibatch of the whole rollout) and a
    batch_size above buffer_size (every batch repeats rows). `env_normalises`: the normalisations (`normalize_obs`,
    `normalize_reward`) an env passed in has, which the model takes on."""
    defaults = {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}

    def given(name: str) -> bool:
        return name in defaults and getattr(config, name) != defaults[name]

    found, idle = [], env_inert_settings(config, spec)
    images = _images(config, spec.observation_space)
    for name in ("cnn_features_dim", "cnn"):
        if given(name) and name in idle:
            why = "encoder=mlp flattens the images" if images else f"{spec.env_id} has no image observations"
            found.append(f"{name}={getattr(config, name)} has no effect: {why}, so no CNN is built.")
    if given("normalize_images") and "normalize_images" in idle:
        bools = all(np.dtype(space.dtype) == np.bool_ for space in images)
        what = ("bool images" if bools else "no uint8 images in [0, 255]") if images else "no image observations"
        found.append(f"normalize_images={config.normalize_images} has no effect: it scales uint8 images to [0, 1], "
                     f"and {spec.env_id} has {what}.")
    needs_sde, inert = getattr(config, "needs_sde", ()), inert_settings(config)
    for name in needs_sde:
        if given(name) and name in inert:
            found.append(f"{name}={getattr(config, name)} has no effect: it is an option of gSDE, which is off "
                         "(use_sde=False).")
    if given("log_std_init") and "log_std_init" in idle:
        found.append(f"log_std_init={config.log_std_init} has no effect: it starts the Gaussian of Box actions, and "
                     f"{spec.env_id} has {type(spec.action_space).__name__} actions.")
    for name in ("n_sampled_goal", "goal_selection_strategy"):
        if given(name) and name in inert:
            found.append(f"{name}={getattr(config, name)} has no effect: it is an option of Hindsight Experience "
                         "Replay, which is off (her=False).")
    for name in ("episodic_life", "clip_rewards"):
        if given(name) and name in idle:
            found.append(f"{name}={getattr(config, name)} has no effect: it is an option of the training envs of "
                         f"Atari games, and {spec.env_id} is none.")
    for name, flag in (("normalize_obs_clip", "normalize_obs"), ("normalize_reward_clip", "normalize_reward")):
        if given(name) and name in inert and flag not in env_normalises:
            found.append(f"{name}={getattr(config, name):g} has no effect: it clips the values {flag} normalises, and "
                         f"{flag} is off.")
    if given("ent_coef_init") and "ent_coef_init" in inert:
        found.append(f"ent_coef_init={config.ent_coef_init:g} has no effect: it starts a tuned entropy coefficient, "
                     f"and ent_coef={config.ent_coef:g} holds it fixed (ent_coef=auto_{config.ent_coef_init:g} tunes "
                     "it from there).")
    batch_size, buffer_size = getattr(config, "batch_size", None), getattr(config, "buffer_size", None)
    num_envs, num_steps = getattr(config, "num_envs", None), getattr(config, "num_steps", None)
    if None not in (batch_size, num_envs, num_steps) and batch_size > num_envs * num_steps:
        found.append(f"batch_size {batch_size:,} is larger than a rollout (num_envs {num_envs} x num_steps "
                     f"{num_steps} = {num_envs * num_steps:,} steps): every update uses the whole rollout as one "
                     f"minibatch; set batch_size to {num_envs * num_steps:,} or less, or raise num_envs x num_steps "
                     f"to {batch_size:,}.")
    if batch_size is not None and buffer_size is not None and batch_size > buffer_size:
        found.append(f"batch_size ({batch_size:,}) is above buffer_size ({buffer_size:,}): every batch samples the at "
                     f"most {buffer_size:,} stored transitions with repeats; lower batch_size or raise buffer_size.")
    return found


def _atari_training(spec: EnvSpec) -> bool:
    """Whether the model's envs of `spec` are Atari games that `make_env` gives its training transforms."""
    from rlspeed.envs.atari import preprocessed

    return isinstance(spec.env_id, str) and preprocessed(spec.env_id, spec.env_kwargs or {})


def warn_unused_settings(config, spec: EnvSpec, env_normalises: Collection[str] = ()) -> None:
    """`unused_settings` as one warning each, shown at the caller outside rlspeed (the model's construction)."""
    for sentence in unused_settings(config, spec, env_normalises):
        warn_at_caller(sentence, UnusedSettingWarning)


def refuse_learn_keywords(keywords: dict, config_cls: type, made_as: str, learn: Callable,
                          loaded_as: str | None = None) -> None:
    """UserError for the first of `keywords` that `learn` does not take: a keyword of Stable-Baselines3's learn (with
    rlspeed's way), a setting of the model (`config_cls`'s, given when it is made: `made_as` is the start of that
    call, "PPO(env"; or, but for its networks' settings, when it is loaded: `loaded_as`, "PPO.load(path"), or a typo
    (the close names among `learn`'s parameters)."""
    taken = set(inspect.signature(learn).parameters)
    for key in keywords:
        advice = SB3_LEARN_KEYWORDS.get(key)
        if advice is not None and set(re.findall(r"learn\((\w+)=", advice)) <= taken:  # (its way is this learn's)
            raise UserError(f"learn's '{key}' is Stable-Baselines3's; {advice}.")
        if key in _field_names(config_cls):
            loaded = (f" or loaded ({loaded_as}, {key}=...))" if loaded_as is not None and key not in _ARCHITECTURE_KEYS
                      else "")
            raise UserError(f"learn takes no '{key}': it is a setting of the model, given when it is made "
                            f"({made_as}, {key}=...)){loaded}.")
        raise no_such_keyword("learn", key, taken)


def _first_value(values: torch.Tensor, where: torch.Tensor) -> str:
    """The first of `values` where `where` holds, in words with its place (`obs[3] = 20`)."""
    index = tuple(int(i) for i in where.nonzero()[0])  # ok-sync: an error message
    return (f"{values[index].item()} at position {list(index)}" if index  # ok-sync: an error message
            else f"{values.item()}")  # ok-sync: an error message


def _leaf_spaces(space: gym.Space) -> list[gym.Space]:
    """The spaces inside Dict and Tuple observations (each encoded by its own encoder), else the space itself."""
    if isinstance(space, gym.spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _leaf_spaces(sub)]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _leaf_spaces(sub)]
    return [space]


def check_verbose(verbose: typing.Any) -> int:
    """`verbose` as an int 0, 1 or 2 (Stable-Baselines3's levels; True is 1), or UserError in one sentence."""
    if isinstance(verbose, numbers.Integral) and int(verbose) in (0, 1, 2):
        return int(verbose)
    raise UserError(f"verbose is 0 (learn prints nothing), 1 (its progress bar) or 2 (the bar and each metrics row), "
                    f"not {verbose!r}.")


def check_tensorboard_log(tensorboard_log: typing.Any) -> str | None:
    """`tensorboard_log` (Stable-Baselines3's: the directory that holds a model's runs) as a str, None as None, or
    UserError in one sentence."""
    if tensorboard_log is None or isinstance(tensorboard_log, (str, os.PathLike)):
        return None if tensorboard_log is None else os.fspath(tensorboard_log)
    raise UserError(f"tensorboard_log is a directory's path (a str or pathlib.Path) or None, not {tensorboard_log!r}.")


def tensorboard_run_dir(tensorboard_log: str, name: str, new_run: bool = True) -> Path:
    """The run directory a learn call writes under `tensorboard_log` as Stable-Baselines3 numbers its TensorBoard
    runs (`stable_baselines3.common.utils.get_latest_run_id`): `tensorboard_log/name_N`, N one past the largest of
    the `name_<digits>` directories there (1 where there is none), or, not `new_run` (learn's
    reset_num_timesteps=False), the largest itself (0 where there is none), the run that call continues. The runs
    are counted where learn writes them: a `~` in `tensorboard_log` is expanded (`local_path`)."""
    folder, latest = local_path(tensorboard_log), 0
    for path in glob.glob(os.path.join(glob.escape(os.fspath(folder)), f"{glob.escape(name)}_[0-9]*")):
        prefix, _, number = os.path.basename(path).rpartition("_")
        if prefix == name and number.isdigit():
            latest = max(latest, int(number))
    return folder / f"{name}_{latest + 1 if new_run else latest}"


def checked_learn_values(total_timesteps, target_return, eval_freq, eval_episodes, checkpoint_freq, progress_bar,
                         confirm_target, zero_steps: bool = False, members: int = 1) -> tuple:
    """`learn`'s budget, evaluation and display settings (a model's and a population's) as (total_timesteps,
    eval_freq, eval_episodes, checkpoint_freq) ints (None where not given) and (progress_bar, confirm_target) bools;
    UserError naming the one that is not a whole number >= 1 (1e6 is one; total_timesteps 0 too with `zero_steps`), a
    target_return that is not a finite number, a flag that is not True or False (a string was taken as True), or
    eval_episodes whose results (of each of a population's `members`) would not fit in memory
    (`evaluation.refuse_unless_results_fit`)."""
    if (isinstance(total_timesteps, bool) or not isinstance(total_timesteps, numbers.Real)
            or not math.isfinite(total_timesteps) or not float(total_timesteps).is_integer()):
        raise UserError(f"total_timesteps is a whole number of env steps, got {total_timesteps!r}.")
    if total_timesteps < 0 or (total_timesteps == 0 and not zero_steps):
        raise UserError(f"total_timesteps must be {'0 or more' if zero_steps else 'positive'}, got {total_timesteps}.")
    if target_return is not None and (isinstance(target_return, bool) or not isinstance(target_return, numbers.Real)
                                      or not math.isfinite(target_return)):
        raise UserError(f"target_return must be a finite number (or None for no target), got {target_return!r}.")
    from rlspeed.evaluation import refuse_unless_results_fit

    eval_episodes = positive_whole("eval_episodes", eval_episodes)
    if eval_episodes is not None:  # (up front, not at the first evaluation after training steps)
        refuse_unless_results_fit(eval_episodes, members, "eval_episodes=N; --eval-episodes N on the command line")
    return (int(total_timesteps), positive_whole("eval_freq", eval_freq), eval_episodes,
            positive_whole("checkpoint_freq", checkpoint_freq), true_or_false("learn(progress_bar=...)", progress_bar),
            true_or_false("learn(confirm_target=...)", confirm_target))


def default_eval_freq(total_timesteps: int) -> int:
    """The env steps between `learn`'s evaluations where no `eval_freq` is given (a model's with a target, a
    population's whenever it evaluates, `rlspeed tune`'s trials'): a 40th of the call's budget `total_timesteps`
    and at least 2,048, so a run evaluates at most about 40 times however long it is."""
    return max(2048, int(total_timesteps) // 40)


def progress_remaining(timesteps: int, start: int, end: int) -> float:
    """A linear schedule's progress left at `timesteps`: 1 at `start`, 0 at `end` and after (SB3's
    `progress_remaining`)."""
    return max(1.0 - (timesteps - start) / max(end - start, 1), 0.0)


def require(condition: bool, message: str) -> None:
    """Raise UserError(message) unless condition holds (for config validation)."""
    if not condition:
        raise UserError(message)


#: the config options that clip normalised values, by the statistics module the model keeps for that normalisation
NORMALIZATION_CLIPS = {"obs_rms": "normalize_obs_clip", "return_rms": "normalize_reward_clip"}


def validate_normalization_clips(config) -> None:
    """UserError for a clip of normalised observations or rewards (`normalize_obs_clip`, `normalize_reward_clip`)
    that is not a positive finite number."""
    for name in NORMALIZATION_CLIPS.values():
        value = getattr(config, name)
        require(0 < value < math.inf, f"{name} must be a positive finite number (normalised values are clipped to "
                f"[-{name}, {name}]), got {value}.")


def validate_network(config) -> None:
    """UserError for the hidden layers of a config's networks: a width below 1 in `net_arch` (an empty net_arch is
    taken: linear heads on the encoder's features, SB3's CnnPolicy default), or an `activation` that is not a name of
    `rlspeed.activations.ACTIVATION_CLASSES` (refused with the config, before any env or file is made)."""
    require(all(width > 0 for width in config.net_arch),
            f"net_arch widths must be positive, got {list(config.net_arch)}.")
    check_activation(config.activation)


def acting_input(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An observation tensor given to `act` on `device`, float64 as float32 (the networks' dtype; `predict` converts
    its inputs so too): one made under `torch.set_default_dtype(torch.float64)` or from an env's float64 array."""
    if value.dtype == torch.float64:
        return value.to(device, torch.float32)
    return value if value.device == device else value.to(device)


def check_acting_batch(obs, space: gym.Space, call: str) -> None:
    """UserError in one sentence where `act`'s observations (`call`: the method, "act") are not a batch of tensors
    of the space's layout, `[N, *shape]` (a dict of them per key for a Dict space): a numpy array, one observation
    without its batch dimension or another shape failed deep in the networks (torch's shape or attribute errors).
    Shapes only: nothing is read from the device."""
    parts = space.spaces if isinstance(space, gym.spaces.Dict) else {None: space}
    if isinstance(space, gym.spaces.Dict) and not isinstance(obs, dict):
        raise UserError(f"{call} takes a dict of tensors, one per key ({', '.join(parts)}), each a batch [N, ...], "
                        f"not a {type(obs).__name__}; predict takes observations as the env returns them.")
    for key, sub in parts.items():
        shape = sub.shape  # (a leaf's, as observation_layout gives it: () for a Discrete index)
        value = obs if key is None else obs.get(key)
        tensor = isinstance(value, torch.Tensor)
        if tensor and value.dim() == len(shape) + 1 and value.shape[1:] == shape:
            continue
        where = "" if key is None else f" for key '{key}'"
        expected = "(" + ", ".join(["N", *map(str, shape)]) + ")"
        got = f"{tuple(value.shape)}; predict also takes one observation" if tensor else (
            f"a {type(value).__name__}; predict takes numpy arrays, lists and one observation")
        raise UserError(f"{call} takes a batch of observations as a tensor of shape {expected}{where}, not {got}.")


def as_observation_batch(observation, space: gym.Space, device: torch.device, layout: tuple | dict | None = None):
    """`predict`'s input as a batch on `device`: (obs, given as numpy, was a single observation). Numpy arrays and
    lists become tensors in the observation's dtype (float32 vectors, uint8 images, int64 indices); Dict
    observations are a dict of them per key (keys the model does not use, such as MiniGrid's `mission`, are
    ignored), Tuple observations a tuple of them (one observation, or a batch element by element, as the env returns
    them) or a list of observations, one tuple (or list) per row; a single observation gets a batch dimension. Float
    observations must be finite; whole-number ones (indices, uint8 images) whole and within their dtype's range.
    `layout`: `observation_layout(space)`, which a model's spec keeps (`EnvSpec.observation_layout`); found here
    without it."""
    layout = observation_layout(space) if layout is None else layout
    if isinstance(space, gym.spaces.Dict):
        keys = list(space.spaces)
        if tuple_positions(space):
            # (an element no encoder takes, such as a Text, dropped: the keys need not be every position)
            width = max(int(key) for key in keys) + 1
            shape_of = (f"This model takes Tuple observations of {width} elements: pass one as the env returns it "
                        "(a tuple), a list of them (one per row) or a tuple of arrays (a batch, element by element)")
            if (isinstance(observation, list) and observation
                    and all(isinstance(row, (tuple, list)) for row in observation)
                    and _one_observation_per_row(observation[0], space)):
                # a list of observations, one per row: the batch, element by element
                if any(len(row) < width for row in observation):
                    raise UserError(f"{shape_of}; a row holds {min(len(row) for row in observation)}.")
                observation = tuple(list(column) for column in zip(*observation))
            if isinstance(observation, (tuple, list)):
                if len(observation) < width:
                    raise UserError(f"{shape_of}; got {len(observation)} elements.")
                observation = {str(i): value for i, value in enumerate(observation)}
            elif not isinstance(observation, dict):
                raise UserError(f"{shape_of}; got {type(observation).__name__}.")
        if not isinstance(observation, dict):
            raise UserError(f"This model takes Dict observations (keys {', '.join(space.spaces)}); pass a dict of "
                            "arrays, one per key, as the env returns them.")
        missing = [key for key in space.spaces if key not in observation]
        if missing:
            raise UserError(f"The observation has no key '{missing[0]}', which this model takes (keys "
                            f"{', '.join(space.spaces)}).")
        parts = {}
        for key, sub in space.spaces.items():
            try:
                parts[key] = as_observation_batch(observation[key], sub, device, layout[key])
            except UserError as error:  # (the key named: "shape (4,)" alone does not say which part is wrong)
                raise UserError(f"The observation's key '{key}': {error}") from None
        rows = {key: part[0].shape[0] for key, part in parts.items()}  # (each with its batch dimension)
        if len(set(rows.values())) > 1:
            sizes = ", ".join(f"{key} {n}" for key, n in rows.items())
            raise UserError(f"The observation's keys hold different numbers of rows ({sizes}): give every key one "
                            "observation, or the same batch of N.")
        return ({key: part[0] for key, part in parts.items()}, any(part[1] for part in parts.values()),
                all(part[2] for part in parts.values()))
    shape, dtype = layout
    as_numpy = not isinstance(observation, torch.Tensor)
    if as_numpy:
        try:
            raw = np.asarray(observation)
            if raw.dtype.kind not in "biuf":  # (lists of mixed types: numbers, or the error below)
                # (None would be NaN, "3" the number 3 and a complex number its real part: no numbers here)
                if raw.dtype.kind != "O" or any(item is None for item in raw.flat):
                    raise TypeError
                raw = raw.astype(np.float64)
        except (TypeError, ValueError):
            raise UserError(f"predict takes observations of shape {tuple(shape)} (or a batch of them) as numbers, "
                            f"got {str(observation)[:60]!r}.") from None
        if raw.size and not dtype.is_floating_point:
            _check_whole(raw, space, dtype)  # (before the cast, which would cut 3.5 to 3 and wrap 256 to 0)
        target = numpy_dtype(dtype)
        if raw.dtype == target:  # (no cast: predict's usual float32 observation, without errstate's cost)
            observation = raw
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # (an overflow to infinity is refused just below)
                observation = raw.astype(target)
        if observation.size and dtype.is_floating_point and not _finite_on_host(observation):
            _refuse_non_finite(torch.from_numpy(observation), space)
    elif observation.numel() and not dtype.is_floating_point:
        _check_whole(observation, space, dtype)
    obs = host_tensor(observation, device) if as_numpy else torch.as_tensor(observation, device=device, dtype=dtype)
    # (a tensor's: after the cast, which makes a float64 1e300 infinite; one sum, one sync, where it is finite)
    if not as_numpy and obs.numel() and dtype.is_floating_point and not math.isfinite(obs.sum().item()):  # ok-sync
        _refuse_non_finite(obs, space)
    # the shape first: a MultiDiscrete's per-component bounds below broadcast against the observation
    dims = observation.shape if as_numpy else obs.shape  # (a numpy array's is a tuple: no torch.Size made)
    single = len(dims) == len(shape)
    if dims[1 - single:] != shape:
        batch = "(" + ", ".join(["N", *map(str, shape)]) + ("," if not shape else "") + ")"
        raw_frame = (len(dims) in (3, 4) and dims[-1] in (3, 4) and len(shape) == 3 and shape[-1] not in (3, 4)
                     and dims[-3:] != (*shape[1:], shape[0]))  # (a channel-last stack is no RGB frame)
        hint = (" That is an image's raw RGB frame: the model takes the observations its env gives after preprocessing "
                "(an Atari id's are rlspeed.make_env(env_id)'s uint8 frame stacks).") if raw_frame else ""
        raise UserError(f"This model takes observations of shape {tuple(shape)} (one) or {batch} (a batch of N), "
                        f"not {tuple(obs.shape)}.{hint}")
    # (a numpy observation's values are checked in numpy, on the host: cheaper than torch's calls for a few values)
    values, count = (observation, observation.size) if as_numpy else (obs, obs.numel())
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and count:
        low, high = integer_range(space)
        if not as_numpy:
            low, high = torch.as_tensor(low, device=device), torch.as_tensor(high, device=device)
        outside = (values < low) | (values >= high)
        if bool(outside.any()):  # ok-sync: predict returns to the host
            raise UserError(f"An observation holds {_first_value(obs, torch.as_tensor(outside, device=device))}, "
                            f"outside {space} (values from {int(low.min())} to {int(high.max()) - 1}).")
    if isinstance(space, gym.spaces.MultiBinary) and count:
        outside = (values != 0) & (values != 1)
        if bool(outside.any()):  # ok-sync: predict returns to the host
            raise UserError(f"An observation holds {_first_value(obs, torch.as_tensor(outside, device=device))}, "
                            f"outside {space} (values 0 and 1).")
    return (obs.unsqueeze(0) if single else obs), as_numpy, single


def host_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A numpy array (native byte order) as a tensor of its dtype on `device`: on the CPU a view of it, as
    `torch.as_tensor` gives, without that call's argument parsing (a few microseconds per `predict`). An array
    with a negative stride (`np.flip`, `obs[::-1]`), which torch cannot view, is copied first."""
    if array.strides and min(array.strides) < 0:
        array = np.ascontiguousarray(array)
    return torch.from_numpy(array) if device.type == "cpu" else torch.as_tensor(array, device=device)


def _one_observation_per_row(row, space: gym.spaces.Dict) -> bool:
    """Whether `row`, the first item of a list given for a Tuple model, is one observation: each of its elements has
    the shape of one observation of its part (a list of lists is rows where the parts are indices; where a part is a
    vector, `[[0.1, 0.2], [0.3, 0.4]]` is one observation, element by element)."""
    try:
        return all(np.shape(row[int(key)]) == tuple(observation_layout(sub)[0]) for key, sub in space.spaces.items())
    except (IndexError, ValueError):
        return len(row) < max(int(key) for key in space.spaces) + 1  # (a short row: refused as one below)


def _finite_on_host(values: np.ndarray) -> bool:
    """Whether a numpy array holds no NaN or infinity. A few values (predict's usual single observation) are summed
    in Python, whose float64 sum of float32 values is infinite only where one is: a numpy reduction right after
    torch's kernels costs several times more. A float64 sum that overflows says False; `_refuse_non_finite` then
    looks value by value."""
    return math.isfinite(sum(values.ravel().tolist())) if values.size <= 64 else bool(np.isfinite(values).all())


def _refuse_non_finite(values: torch.Tensor, space: gym.Space) -> None:
    """UserError naming the first NaN or infinity in `values` (a policy's argmax of NaN is action 0, silently)."""
    bad = ~torch.isfinite(values)
    if bool(bad.any()):  # ok-sync: predict returns to the host
        raise UserError(f"An observation holds {_first_value(values, bad)} for {space}: a policy cannot act on it "
                        "(find where the env or its wrapper produced it).")


def _check_whole(raw: torch.Tensor | np.ndarray, space: gym.Space, dtype: torch.dtype) -> None:
    """UserError for an observation a whole-number `dtype` (indices, uint8 images) cannot hold as it is: a fraction,
    NaN or infinity, or a value outside the dtype's range. Integers whose dtype fits in `dtype` (uint8 in uint8,
    int32 in int64) are not looked at; numpy arrays are checked as numpy, and as a tensor only to say where. A bool
    observation (MinAtar's grid) takes 0 and 1 only: the cast makes any other value, NaN included, True."""
    if dtype == torch.bool:
        if raw.dtype in (np.bool_, torch.bool):
            return
        bad = (raw != 0) & (raw != 1)
        if bool(bad.any()):  # ok-sync: predict returns to the host
            values = raw if isinstance(raw, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(raw))
            raise UserError(f"predict takes 0 and 1 (False and True) for {space}; an observation holds "
                            f"{_first_value(values, torch.as_tensor(bad))}.")
        return
    info = torch.iinfo(dtype)
    if isinstance(raw, np.ndarray):
        floating = raw.dtype.kind == "f"
        if not floating and (raw.dtype.kind == "b" or np.can_cast(raw.dtype, numpy_dtype(dtype))):
            return
        # (NaN is unequal to itself: a fraction here)
        if (floating and not np.array_equal(raw, np.trunc(raw))) or raw.min() < info.min or raw.max() > info.max:
            if raw.dtype == np.uint64 and raw.max() > info.max:  # (as int64 it wrapped to a negative number, the
                index = tuple(int(i) for i in np.argwhere(raw > info.max)[0])  # one named: said here, on the host)
                raise UserError(f"An observation holds {raw[index]}{f' at position {list(index)}' if index else ''}, "
                                f"outside what {space} stores ({dtype}: {info.min} to {info.max}).")
            _check_whole(torch.from_numpy(raw.astype(np.float64 if floating else np.int64)), space, dtype)
        return
    if raw.is_floating_point():
        bad = raw != torch.trunc(raw)
        if bool(bad.any()):  # ok-sync: predict returns to the host
            image = " (images: values 0 to 255, as the env gives them, not scaled to [0, 1])" if dtype == torch.uint8 \
                else ""
            raise UserError(f"predict takes whole numbers for {space}{image}; an observation holds "
                            f"{_first_value(raw, bad)}.")
    elif raw.dtype == torch.bool or (torch.iinfo(raw.dtype).min >= info.min and torch.iinfo(raw.dtype).max <= info.max):
        return  # (every value of its dtype fits)
    else:
        raw = raw.to(torch.int64)  # (compared with the limits in a dtype that holds them)
    bad = (raw < info.min) | (raw > info.max)
    if bool(bad.any()):  # ok-sync: predict returns to the host
        raise UserError(f"An observation holds {_first_value(raw, bad)}, outside what {space} stores "
                        f"({dtype}: {info.min} to {info.max}).")


def _check_shape(name: str, saved: torch.Size, expected: torch.Size) -> None:
    """UserError when a checkpoint tensor's shape is not the model's (a changed net_arch, a damaged file)."""
    if tuple(saved) != tuple(expected):
        raise UserError(f"The checkpoint's '{name}' has shape {tuple(saved)} but this model's is {tuple(expected)}: "
                        "it was saved with other hyperparameters (net_arch?) or env; build the model as it was saved, "
                        "or start afresh.")


def _device_rng(device: torch.device):
    """(get_rng_state, set_rng_state) of an accelerator's default generator (torch.cuda's, torch.npu's, ...), or None
    for the CPU and backends without one."""
    module = getattr(torch, device.type, None) if device.type != "cpu" else None
    if module is None or not hasattr(module, "get_rng_state") or not hasattr(module, "set_rng_state"):
        return None
    if device.type == "mps":  # (one device, no index argument)
        return module.get_rng_state, module.set_rng_state
    return (lambda: module.get_rng_state(device)), (lambda state: module.set_rng_state(state, device))


#: By default `learn` writes a metrics row every second and, with a run_dir, at least this many over a call of as
#: many iterations or more (a short run's curve)
ROWS_PER_LEARN = 50


@dataclasses.dataclass
class LearnResult:
    """What `learn` measured; `summary.json` is built from it. Its steps and clocks (`total_timesteps`, `train_wall_s`,
    `sps`, the target's, and each evaluation's `(steps, clock, mean)`: steps counted as `num_timesteps` is) cover the
    call, or, for the first call after `resume`, the resumed run from its start, as summary.json does.

    total_timesteps: env steps trained; train_wall_s: training time in seconds; sps: their ratio. target_return:
    learn's `target_return` (None: no target); steps_to_target and time_to_target_s: the env steps and seconds from
    the run's start to the evaluation that reached it (None until one does). evaluations: one
    `(steps, clock, mean return)` per evaluation; unfinished: beside it, each evaluation's episodes cut short at the
    step limit (counted with the return collected by then; metrics.csv's `eval_unfinished`); confirmations: `(steps,
    mean return)` of each confirming evaluation (fresh episodes run where an evaluation reached the target), and
    confirmations_unfinished beside it, each one's episodes cut short at the step limit (`eval_confirm_unfinished`);
    target_confirmation: `{"mean", "episodes", "unfinished"}` of the confirmation that reached the target (None until
    one does, or where `confirm_target=False`).
    stop_requested: training stopped because a rank was asked to (`Algorithm.stop_requested`: a signal).
    stopped_by: the callback whose hook returned False, ending training at that iteration: its name, the hook and its
    `stop_reason` where it gives one ("StopTrainingOnRewardThreshold._on_step returned False: mean evaluation return
    200.00 >= threshold 150"); None where no callback stopped it.
    """

    total_timesteps: int = 0
    train_wall_s: float = 0.0
    sps: float = 0.0
    target_return: float | None = None
    time_to_target_s: float | None = None
    steps_to_target: int | None = None
    evaluations: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    #: each evaluation's episodes cut short at the step limit, one per entry of `evaluations`
    unfinished: list[int] = dataclasses.field(default_factory=list)
    #: (env steps, confirming evaluation's mean) each time an evaluation reached the target
    confirmations: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    #: each confirming evaluation's episodes cut short at the step limit, one per entry of `confirmations`
    confirmations_unfinished: list[int] = dataclasses.field(default_factory=list)
    #: {"mean", "episodes", "unfinished"} of the confirming evaluation that reached the target (None before)
    target_confirmation: dict | None = None
    #: whether training stopped because a rank was asked to (`Algorithm.stop_requested`: a signal)
    stop_requested: bool = False
    #: the callback that stopped training (its name, hook and reason), None where none did
    stopped_by: str | None = None

    def reached(self) -> dict[str, typing.Any]:
        """The target's steps and clock once reached ({} before): a checkpoint keeps them with the loop's position,
        so a run stopped after training still reports them when `--resume` finishes it."""
        if self.steps_to_target is None:
            return {}
        return {"steps_to_target": self.steps_to_target, "time_to_target_s": self.time_to_target_s,
                "target_return": self.target_return, "target_confirmation": self.target_confirmation}

    def __repr__(self) -> str:
        # (a notebook shows it: rounded figures, and how many evaluations rather than all of them)
        def short(value):
            return f"{value:.6g}" if isinstance(value, float) else repr(value)

        fields = [f"{f.name}={short(getattr(self, f.name))}" for f in dataclasses.fields(self)
                  if f.name not in ("evaluations", "unfinished", "confirmations", "confirmations_unfinished")]
        return f"LearnResult({', '.join(fields)}, evaluations=[{len(self.evaluations)} of (steps, clock, mean)])"


def _class_name(cls: type) -> str:
    """A class as checkpoints record the one that saved them: `module.QualName`."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain_value(value) -> bool:
    """Whether `value` goes into a checkpoint's JSON metadata and comes back as itself: None, a bool, an int, a finite
    float, a string, or a list or str-keyed dict of such values."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(_plain_value, value))
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain_value(item) for key, item in value.items())
    return False


def _own_init_parameters(cls: type) -> list[str]:
    """The named parameters of a subclass's `__init__` that the rlspeed algorithm it derives from does not take (a
    user's own option, `MyPPO(env, aux_coef=0.5)`); none for rlspeed's own classes."""
    base = next((klass for klass in cls.__mro__ if klass.__module__.startswith("rlspeed.")), Algorithm)
    if base is cls:
        return []
    taken = set(inspect.signature(base.__init__).parameters) | {field.name for field in
                                                                 dataclasses.fields(cls.config_cls)}
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [name for name, parameter in inspect.signature(cls.__init__).parameters.items()
            if parameter.kind in plain and name not in taken]


def _close_logger(logger: RunLogger, raising: bool, plot: bool = True) -> None:
    """Close a `learn` call's logger (`plot`: drawing learning_curve.png; its TensorBoard writer kept for the next
    call, unless learn raises): a failure to write its last rows raises, unless learn is raising already (the error
    that stopped training is the one to see), where it is a warning at learn's caller."""
    try:
        logger.close(plot=plot, keep_writer=not raising)
    except UserError as error:
        if not raising:
            raise
        warnings.warn(f"{error} (after the error below, which stopped training)", stacklevel=3)


def _tell_training_error(callbacks, error: BaseException) -> None:
    """`callbacks.on_training_error(error)` for an error `learn` raises (a W&B run a callback began ends as failed, not
    left open for the next run to join); a failure there is dropped: the error that ended training is the one raised."""
    try:
        callbacks.on_training_error(error)
    except Exception:  # noqa: BLE001, S110
        pass


#: (class, argument) pairs whose not being saved was said (once per process)
_UNSAVED_ARGUMENTS_SAID: set[tuple[type, str]] = set()


def _warn_other_class(meta: dict, cls: type, path, call: str) -> None:
    """A warning when the checkpoint at `path` was saved by a subclass of rlspeed's algorithm (a user's own loss,
    network or update) and `cls`, another class, `call`s it (load, resume): the model it builds may act otherwise.
    Its advice is Python's (the class's `call`), or a command's inside `command_advice`."""
    saved = _other_class(meta, cls)
    if saved is None:
        return
    base = meta.get("derives_from", meta.get("algo"))
    command = running_command()
    who, advice = (command[0], command[1](saved)) if command and command[1] else (f"{cls.__name__}.{call}",
                                                                   f"use {_saved_class_call(saved, call)}")
    warnings.warn(f"'{path}' was saved by {saved}, a subclass of rlspeed's {base}; {who} makes it a {cls.__name__}, "
                  f"whose networks, losses or actions may differ from it: {advice}.", stacklevel=3)


def _other_class(meta: dict, cls: type) -> str | None:
    """The class (`module.QualName`) that saved the checkpoint of `meta` where it is a user's subclass other than
    `cls`, else None."""
    saved = meta.get("class")
    if not saved or saved == _class_name(cls) or saved.startswith("rlspeed."):
        return None
    return saved


def _derived_algorithm(cls: type) -> str | None:
    """The name of the rlspeed algorithm `cls` derives from, where `cls` is an algorithm of a user's own under another
    name (`class Mine(PPO): name = "mine"`), else None: what its checkpoints record as `derives_from`, so that a
    loader without its module builds that algorithm."""
    base = next((klass.name for klass in cls.__mro__ if klass.__module__.startswith("rlspeed.")
                 and getattr(klass, "name", "")), None)
    return base if base != getattr(cls, "name", "") else None


def holds_model_of(meta: dict, cls: type) -> bool:
    """Whether the checkpoint of `meta` holds a model of `cls`'s rlspeed algorithm: each side is the rlspeed algorithm
    it derives from (a file's `derives_from`, a class's `_derived_algorithm`), so that a file of
    `class Mine(PPO): name = "mine"` is a PPO's to PPO, and a PPO's file is Mine's: the rule of `load`
    (`saved_algorithm`), `set_parameters` and `--init-from`."""
    saved = meta.get("derives_from") or meta.get("algo")
    return saved == (_derived_algorithm(cls) or cls.name)


def algorithm_labels(meta: dict, cls: type) -> tuple[str, str]:
    """The algorithm of the checkpoint of `meta` and `cls`'s, as a refusal names them (`holds_model_of` False): each
    by its name, with the rlspeed algorithm it derives from where it has another name (`own_algorithm (derived from
    ppo)`), so that `class Mine(DQN): name = "ppo"` and PPO are told apart."""
    return (_algorithm_label(meta.get("algo"), meta.get("derives_from")),
            _algorithm_label(getattr(cls, "name", ""), _derived_algorithm(cls)))


def _algorithm_label(name: str | None, base: str | None) -> str:
    return f"{name} (derived from {base})" if base else str(name)


def _imported_class(saved: str | None) -> type | None:
    """The class `saved` (`module.QualName`) where its module is imported already (not `__main__`: another script's
    class of the same name is not the one that saved the file), else None."""
    module_name, _, qualname = (saved or "").rpartition(".")
    module = sys.modules.get(module_name) if module_name not in ("", "__main__") else None
    found = getattr(module, qualname, None) if module is not None else None
    return found if isinstance(found, type) else None


def saved_algorithm(meta: dict, cls: type, path, import_advice: str = "import {module} first, then load it again"
                    ) -> type:
    """The class `cls.load` builds the checkpoint of `meta` (at `path`) as: `cls` for a file of its algorithm or of
    an algorithm derived from it; for `Algorithm.load`, whichever algorithm the file holds (`imported_saved_class`), an
    algorithm of a user's own (another name) as its class where its module is imported, else as the rlspeed algorithm
    it derives from (a warning follows at load). A UserError otherwise, one sentence naming the class and what to do
    (`import_advice`: how to import its module, `{module}` filled in)."""
    if cls.name and holds_model_of(meta, cls):
        return cls
    name, classes = meta.get("algo"), _algorithm_classes()
    if name in classes and meta.get("derives_from") in classes:  # (a user's class under another rlspeed
        name = meta["derives_from"]  # algorithm's name, `class Mine(DQN): name = "ppo"`: a model of the one it is)
    algo = classes.get(name)
    if algo is None:  # (an algorithm of a user's own, or of a module not imported yet)
        saved = meta.get("class") or str(name)
        own = _imported_class(meta.get("class"))
        if own is not None and issubclass(own, Algorithm) and own.name == name:
            if cls.name and not issubclass(own, cls):
                raise UserError(f"'{path}' holds a model of {saved}, not of {cls.__name__}; load it with "
                                f"{own.__name__}.load, or rlspeed.load(path), which loads any model.")
            return cls if cls.name else own  # (`PPO.load` makes a PPO, as of a file of PPO's subclass; a warning)
        algo = classes.get(meta.get("derives_from"))  # (its module not imported: the rlspeed
        # algorithm it derives from, as for a subclass of PPO)
        module, _, short = saved.rpartition(".")
        if algo is None and module == "__main__":
            raise UserError(f"'{path}' holds a model of {short}, an algorithm of the script that saved it: load it "
                            f"with {_saved_class_call(saved, 'load')}.")
        if algo is None and own is not None:
            raise UserError(f"'{path}' holds a model of {saved} (algorithm {name!r}), which as imported now is no "
                            f"rlspeed algorithm named {name!r}: load it with the class that saves {name!r} models.")
        if algo is None and module in sys.modules:
            raise UserError(f"'{path}' holds a model of {saved} (algorithm {name!r}), which {module} no longer "
                            "defines (renamed or moved since the file was saved?): load it with that class's load "
                            "under its name now.")
        if algo is None and module:
            raise UserError(f"'{path}' holds a model of {saved}, which is not one of rlspeed's algorithms and whose "
                            f"module is not imported: {import_advice.format(module=module)}.")
        if algo is None:
            raise UserError(f"'{path}' holds a model of {saved!r}, which is not one of rlspeed's algorithms: load it "
                            "with the class that saved it, its module imported.")
    if cls.name and algo is not cls and name not in classes:  # (a user's own algorithm, its module not imported)
        raise UserError(f"'{path}' holds a model of {meta.get('class') or name}, an algorithm derived from rlspeed's "
                        f"{algo.__name__}, not of {cls.__name__}; load it with its class (its module imported), or "
                        f"with rlspeed.{algo.__name__}.load or rlspeed.load(path), which make a {algo.__name__} of it.")
    if cls.name and algo is not cls:  # (`Algorithm.load` builds whichever algorithm the file holds)
        raise UserError(f"'{path}' holds a model of {algo.__name__}, not of {cls.__name__}; load it with "
                        f"rlspeed.{algo.__name__}.load, or rlspeed.load(path), which loads any model.")
    return imported_saved_class(meta, algo)  # (a subclass of the user's that saved it, its module imported)


def imported_saved_class(meta: dict, algo_cls: type) -> type:
    """The user's subclass of `algo_cls` that saved the checkpoint of `meta` where its module is imported already
    (`rlspeed eval --gym-packages MODULE`), else `algo_cls`. Nothing is imported here: a file does not choose code to
    run."""
    found = _imported_class(_other_class(meta, algo_cls))
    return found if found is not None and issubclass(found, algo_cls) else algo_cls


def _saved_class_call(saved: str, call: str) -> str:
    """How to call `call` (load, resume, set_parameters) on the class `saved` (`module.QualName`): the class imported
    from its module, or, for a script's own class (`__main__`), defined again where the loading code runs."""
    module, _, name = saved.rpartition(".")
    if module == "__main__":
        return f"{name}.{call}, with {name} defined in this script as in the one that saved it"
    if module in sys.modules and _imported_class(saved) is None:
        return f"its class's {call} under its name now ({module} no longer defines {name}: renamed or moved?)"
    return f"{name}.{call}, with {name} imported from {module}"


def _load_remedy(saved: str, cls: type) -> tuple[str, str]:
    """Who cannot load the file the user's class `saved` (`module.QualName`) wrote as a `cls`, and what loads it as
    `saved`: `cls.load` and Python's call, or inside `command_advice` rlspeed's class and the command's option."""
    command = running_command()
    if command and command[1]:
        return f"rlspeed's {cls.__name__}", command[1](saved)
    return f"{cls.__name__}.load", f"load it with {_saved_class_call(saved, 'load')}"


def _other_networks(error: UserError, meta: dict, cls: type, path, call: str) -> UserError:
    """The error of `cls`'s `call` (load, resume, set_parameters) whose networks do not take the file at `path`'s
    tensors (`error`): where another class saved it, a user's subclass or, for a subclass's call, rlspeed's own class,
    one sentence naming that class and what takes the file (net_arch, or a damaged file, which `error` would suggest,
    is not the cause); `error` itself otherwise."""
    saved = meta.get("class")
    if not isinstance(saved, str) or saved == _class_name(cls) or (
            saved.startswith("rlspeed.") and cls.__module__.startswith("rlspeed.")):
        return error
    detail = str(error).removeprefix(f"'{path}': ").split(":")[0].rstrip(".")
    detail = detail[:1].lower() + detail[1:]
    if not saved.startswith("rlspeed."):
        who, advice = _load_remedy(saved, cls) if call == "load" else (
            f"{cls.__name__}.{call}", f"use {_saved_class_call(saved, call)}")
        return UserError(f"'{path}' was saved by {saved}, whose networks {who} does not build ({detail}): {advice}.")
    own = saved.rpartition(".")[2]
    return UserError(f"'{path}' was saved by rlspeed's {own}, whose networks {cls.__name__}.{call} does not build "
                     f"({detail}): use {own}.{call}, or train {cls.__name__} afresh.")


def _algorithm_classes() -> dict[str, type]:
    """Every algorithm class defined so far (the `Algorithm` subclasses with a `name`), by that name: what
    `Algorithm.load` dispatches on (read here, not from `rlspeed.algos`, which imports this module)."""
    found, todo = {}, list(Algorithm.__subclasses__())
    while todo:
        algo = todo.pop()
        todo.extend(algo.__subclasses__())
        if getattr(algo, "name", "") and algo.__module__.startswith("rlspeed."):
            found.setdefault(algo.name, algo)
    return found


def _algorithms_taking(takes: Callable[[type], bool]) -> str:
    """The names of rlspeed's algorithms for which `takes(cls)` holds (from their own `supports_*` declarations), in
    alphabetical order, as a sentence's list: "a2c, ppo or recurrent_ppo"."""
    names = sorted(name for name, algo in _algorithm_classes().items() if takes(algo))
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


#: Stable-Baselines3's `learn` keywords (or their values) that a `learn` here refuses, and what to write instead (a
#: model's and a population's `learn` take reset_num_timesteps=False, and a model's tb_log_name)
SB3_LEARN_KEYWORDS = {
    "reset_num_timesteps": "a further learn call here always continues the model's step count (a new model starts "
                           "from 0), so learn takes only reset_num_timesteps=False (SB3's way to continue: "
                           "the schedules of DQN's exploration, anneal_lr and anneal_clip then span the model's whole "
                           "step count, as SB3's do, where by default they run again over each call's steps)",
    "log_interval": "learn(log_interval_s=...) sets how often (in seconds) metrics are read and logged",
    "tb_log_name": "learn(run_dir=DIR) writes metrics.csv in DIR, and TensorBoard logs where the tensorboard package "
                   "is installed (a model's learn also takes tb_log_name, naming its run under the model's "
                   "tensorboard_log)",
    "eval_env": "learn(target_return=..., eval_freq=..., eval_episodes=...) evaluates on a separate env, or use "
                "rlspeed.callbacks.EvalCallback(eval_env)",
    "verbose": "verbose is the model's, as in Stable-Baselines3 (Algo(env, verbose=0) trains without output), and "
               "learn(progress_bar=False) silences one call",
}


def _refuse_sb3_positionals(progress_bar, target_return) -> None:
    """UserError for a `progress_bar` that is a count (where Stable-Baselines3's positional learn(N, callback,
    log_interval) puts its log_interval, whose 1 would show a bar, silently) or a `target_return` that is text. A
    target written as text is said as the number to write; other text as Stable-Baselines3's tb_log_name, by its name
    (SB3's positional call stops at its log_interval before: a text target comes by keyword or in rlspeed's order)."""
    if isinstance(progress_bar, numbers.Integral) and not isinstance(progress_bar, bool):
        raise UserError(f"learn's progress_bar is True or False, not {progress_bar} (given third by position, it is "
                        f"Stable-Baselines3's log_interval, a count: {SB3_LEARN_KEYWORDS['log_interval']}).")
    if isinstance(target_return, str):
        try:
            number = float(target_return)
        except ValueError:
            said = ("(a run's name, Stable-Baselines3's tb_log_name, is given by name: learn(total_timesteps, "
                    "tb_log_name=...) under the model's tensorboard_log)")
        else:
            said = (f"written as text: write target_return={number:g} without quotes" if math.isfinite(number)
                    else "(a finite one)")
        raise UserError(f"learn's target_return is a number (or None for no target), not {target_return!r} {said}.")


def success_totals(successes: list[tuple[torch.Tensor, torch.Tensor]], always: bool = False,
                   device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """The metrics `success_sum` and `success_count` (the finished episodes that succeeded, and all finished ones)
    and `success_reported` (1 where the env reported `is_success`) from each step's (`info["done"]`,
    `info["is_success"]`), on the device; {} when the env reported no success (the log's `success_rate` then stays
    absent), unless `always` (under torch.distributed every rank must send the same metrics: zeros on `device`)."""
    if not successes:
        if not always:
            return {}
        zero = torch.zeros((), device=device)
        return {"success_sum": zero, "success_count": zero, "success_reported": zero}
    dones, flags = (torch.stack(column) for column in zip(*successes))
    return {"success_sum": (dones & flags).sum(), "success_count": dones.sum(),
            "success_reported": torch.ones((), device=dones.device)}


def _warn_borrowed_id(env: BatchedEnv, name: str) -> None:
    """Warn where a batched env of the user's own (not one `make_env` made, nor a native env class itself) names a
    registered env id: what makes fresh envs from the id (evaluate, eval_freq, a target, load) makes that env
    instead."""
    from rlspeed.envs import NATIVE_ENVS
    from rlspeed.envs.base import find_episode_statistics

    env_id = env.spec.env_id
    own = not of_rlspeed(env)  # (rlspeed's adapters made directly make the stock env)
    if (own and find_episode_statistics(env) is None and type(env) not in NATIVE_ENVS.values()
            and isinstance(env_id, str) and env_id in gym.registry):
        warn_at_caller(f"{name}: {type(env).__name__} (a batched env of your own) names itself '{env_id}', a "
                       "registered env: evaluate(), eval_freq, a target and load() make that env from the id, not "
                       f"yours; give your env an id of its own (EnvSpec('my-{env_id}', ...)).", UserWarning)


def _check_atari_training(env: BatchedEnv, config, name: str) -> None:
    """UserError where an Atari env passed in (`make_env`'s training variant) ends episodes at lost lives or clips
    rewards otherwise than the model's `episodic_life` / `clip_rewards` ask: the env was made with its own."""
    from rlspeed.envs.atari import AtariTraining

    inner = find_wrapper(env, AtariTraining)
    for key in ("episodic_life", "clip_rewards"):
        asked, made = getattr(config, key, True), getattr(inner, key, None)
        if inner is not None and asked != made:
            raise UserError(f"{name} got an env of {env.spec.env_id} made with {key}={made}, and the model's {key} "
                            f"is {asked}: make the env with rlspeed.make_env(..., {key}={asked}), or give the model "
                            "its id.")


def _warn_double_normalisation(vector_env, config, whose: str = "this vector env's") -> None:
    """Warn where a vector env (passed in, or made from an id whose entry point wraps its envs: `whose` names it)
    normalises what the config asks rlspeed to normalise too: a Stable-Baselines3 VecEnv's VecNormalize, or
    Gymnasium's NormalizeObservation and NormalizeReward around a Gymnasium vector env or its envs."""
    asked = [name for name in ("normalize_obs", "normalize_reward") if getattr(config, name, False)]
    if not asked:
        return
    if is_sb3_vec_env(vector_env):
        normalizer = vec_normalize_of(vector_env)
        both = [(ours, theirs) for ours, theirs in (("normalize_obs", "norm_obs"), ("normalize_reward", "norm_reward"))
                if normalizer is not None and ours in asked and getattr(normalizer, theirs, False)]
        if both:
            ours, theirs = (" and ".join(names) for names in zip(*both))
            warn_at_caller(f"this VecEnv's VecNormalize ({theirs}=True) already normalises what {ours}=True would "
                           "normalise again: set one of the two to False.", UserWarning)
        return
    if not isinstance(vector_env, gym.vector.VectorEnv):
        return
    both = [(ours, theirs) for ours, theirs, present in zip(("normalize_obs", "normalize_reward"),
                                                            ("NormalizeObservation", "NormalizeReward"),
                                                            normalising_wrappers(vector_env))
            if present and ours in asked]
    if both:
        ours, theirs = (" and ".join(names) for names in zip(*both))
        warn_at_caller(f"{whose} Gymnasium {theirs} already normalises what {ours}=True would normalise "
                       f"again: set {ours} to False, or leave the wrapper out.", UserWarning)


def _warn_other_discount(env: BatchedEnv, config) -> None:
    """Warn where rlspeed's reward normalisation in an env passed in (`make_env(..., normalize_reward=True)`, whose
    gamma defaults to 0.99) discounts its running return with another gamma than the algorithm's: `normalize_reward`
    scales rewards by the std of the return at the algorithm's gamma, and a model that makes its env from the id (a
    loaded model's learn) goes on with that one."""
    wrapper = find_wrapper(env, NormalizeReward)
    gamma = getattr(config, "gamma", None)
    if wrapper is not None and gamma is not None and wrapper.gamma != gamma:
        warn_at_caller(f"this env's reward normalisation discounts its running return with gamma {wrapper.gamma}, and "
                       f"the model's gamma is {gamma}: make the env with make_env(..., normalize_reward=True, "
                       f"gamma={gamma}), as the model makes its own envs (after load, learn without an env "
                       f"normalises with gamma {gamma}).", UserWarning)


def _continuous_option_hint(spec: EnvSpec, continuous: bool) -> str:
    """', or ...': the env's other kind of actions where its constructor takes `continuous` (Gymnasium's LunarLander
    and CarRacing): the id registered with it (LunarLanderContinuous-v3), else the option; '' for other envs."""
    try:
        registered = gym.spec(spec.env_id)
    except Exception:  # (a user's vector env)
        return ""
    defaults = constructor_defaults(registered.entry_point)
    if not isinstance(defaults.get("continuous"), bool):
        return ""
    variant = registered_variant(spec.env_id, {**spec.env_kwargs, "continuous": continuous})
    if variant is not None:
        return f", or {variant}, the same env with {'continuous' if continuous else 'discrete'} actions"
    if {**defaults, **(registered.kwargs or {})}["continuous"] == continuous:
        return f", or {spec.env_id} without the option continuous={not continuous}"
    return (f", or the env's option continuous={continuous} (--env-kwargs continuous={str(continuous).lower()}; "
            f"env_kwargs={{'continuous': {continuous}}} in Python)")


def _check_env_fits(given: EnvSpec, saved: EnvSpec, path) -> None:
    """UserError unless an env given to `load` has the saved model's spaces: the observations' shapes and dtypes
    (per key), and the same action space (a Box's bounds too: actions are scaled to them)."""
    from rlspeed.evaluation import space_mismatch

    differ = space_mismatch(saved, given, action_bounds=True)
    if not differ:
        return
    what = " and ".join(differ)
    raise UserError(f"The env given to load ({given.env_id}: observations {space_text(given.observation_space)}, "
                    f"actions {space_text(given.action_space)}) does not fit the model in '{path}', trained on "
                    f"{saved.env_id} (observations {space_text(saved.observation_space)}, actions "
                    f"{space_text(saved.action_space)}): its {what} differ; give an env with the spaces the model was "
                    "trained on.")


#: Stable-Baselines3's (and sb3-contrib's) policy names, which its algorithms take before the env
SB3_POLICY_NAMES = ("MlpPolicy", "CnnPolicy", "MultiInputPolicy", "MlpLstmPolicy", "CnnLstmPolicy",
                    "MultiInputLstmPolicy")


def _env_example(env) -> str:
    """How to write `env` as a model's first argument, for a refusal's example: an id as it is, a single Gymnasium env
    (which the model refuses) by its registered id where it is that env unchanged (`single_env_id`: no wrapper,
    option or time limit of its own, nor rendering, which the id would drop), another env object as `env`."""
    if isinstance(env, str):
        return repr(env)
    registered = single_env_id(env) if isinstance(env, gym.Env) else None
    return repr(registered) if registered is not None else "env"


def _generator_states(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The states of torch's global generators a model on `device` draws from: the CPU's and `device`'s."""
    device_rng = _device_rng(device)
    return torch.get_rng_state(), device_rng[0]() if device_rng is not None else None


def _set_generator_states(device: torch.device, states: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    """Put `_generator_states(device)`'s `states` back into torch's global generators."""
    torch.set_rng_state(states[0])
    device_rng = _device_rng(device)
    if device_rng is not None and states[1] is not None:
        device_rng[1](states[1])


def _forked_random(device: torch.device):
    """`torch.random.fork_rng` over the CPU's generator and `device`'s: what the block draws leaves the caller's
    random streams as they were."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device], device_type=device.type)


def _refuse_policy(cls: type, first, rest: tuple) -> None:
    """UserError in one sentence where a model's first argument `first` is a Stable-Baselines3 policy (its name or
    class) before the env (`rest`: the arguments after it, the env first where given), as SB3's `PPO("CnnPolicy",
    env)` and `PPO("CnnPolicy", env=env)` write it."""
    name = cls.__name__
    if isinstance(first, str) and first in SB3_POLICY_NAMES:
        example = _env_example(rest[0]) if rest else "'CartPole-v1'"
        if "Lstm" in first and not hasattr(cls, "act_with_state"):
            raise UserError(f"{first!r} is sb3-contrib's RecurrentPPO policy: rlspeed's recurrent PPO is "
                            f"rlspeed.RecurrentPPO({example}, ...), which takes the env first and no policy name.")
        raise UserError(f"{name} takes the env first and no policy name ({first!r} is Stable-Baselines3's): the "
                        f"networks follow from the env's spaces (net_arch=, encoder= change them), so write "
                        f"{name}({example}, ...).")
    if isinstance(first, type) and (issubclass(first, torch.nn.Module) or first.__name__.endswith("Policy")):
        example = _env_example(rest[0]) if rest else "env"
        raise UserError(f"{name} takes the env first and no policy class ({first.__name__}, as Stable-Baselines3's "
                        f"policies): the networks follow from the env's spaces (net_arch=, activation=, encoder= "
                        f"shape them; a network of your own: override _build_policy, docs/algorithms.md), so write "
                        f"{name}({example}, ...).")


class ReplayBufferSaving:
    """What `model.save_replay_buffer` is: whether the model's checkpoints also write its replay buffer (its truth
    value, set by assigning a bool or by the `save_replay_buffer=` keyword), and, called with a path,
    Stable-Baselines3's method of that name: `model.save_replay_buffer(path)` writes the replay buffer to that file
    (`Algorithm.write_replay_buffer`). It compares equal to that bool but is none: `bool(model.save_replay_buffer)`
    gives one (for JSON, YAML or `is True`)."""

    __slots__ = ("_model",)

    def __init__(self, model: Algorithm):
        self._model = model

    def __bool__(self) -> bool:
        return self._model._checkpoint_replay

    def __eq__(self, other) -> bool:
        return bool(self) == other

    __hash__ = None  # (compares as the bool it stands for)

    def __repr__(self) -> str:
        return repr(bool(self))

    def __call__(self, path: str | os.PathLike, digest: str | None = None) -> Path:
        return self._model.write_replay_buffer(path, digest=digest)


class _SaveReplayBuffer:
    """The `save_replay_buffer` attribute of models: reads give a `ReplayBufferSaving`, assignments set the flag."""

    @typing.overload
    def __get__(self, model: None, owner: type | None = None) -> _SaveReplayBuffer: ...
    @typing.overload
    def __get__(self, model: Algorithm, owner: type | None = None) -> ReplayBufferSaving: ...

    def __get__(self, model, owner=None):
        return self if model is None else ReplayBufferSaving(model)

    def __set__(self, model: Algorithm, value: bool) -> None:
        value = read_switch("save_replay_buffer", value)
        if value:  # (the keyword's rule too: the constructor assigns it)
            if not model.keeps_replay_buffer:
                raise UserError(f"save_replay_buffer applies to off-policy algorithms (DQN, SAC, TD3, DDPG): "
                                f"{type(model).__name__} keeps no replay buffer; drop it.")
            refuse_replay_saving(getattr(model, "strategy", single_process()).world_size)
        model._checkpoint_replay = value


def read_switch(name: str, value: typing.Any) -> bool:
    """A model's on/off argument beside its hyperparameters (`save_replay_buffer`) read as the config reads a bool
    hyperparameter: True or False (numpy's, 1 or 0 too), text as `--set` gives it ('no', 'off', 'false', '0': False;
    any case), None as False, another `ReplayBufferSaving` as its bool; UserError naming `name` otherwise (the truth
    value of 'no' is True)."""
    if value is None or isinstance(value, ReplayBufferSaving):
        return bool(value)
    try:
        return _read_bool(value)
    except ValueError:
        raise UserError(f"{name} is True or False ('yes' or 'no', 'on' or 'off' as text), not {value!r}"[:200]
                        + ".") from None


def _import_apart(module: str) -> None:
    """Import `module` (where not yet imported) on a thread of its own. An import keeps the frames below it alive
    where a module keeps one of its own frames (torch.fx's `wrap`, run as torch._dynamo is imported, holds its frame
    in a local: a cycle): imported from a model's method, those frames hold the model, which `del model` then does not
    free until the garbage collector runs; on a thread of its own no caller's frame is below the import."""
    if module in sys.modules:
        return
    failure: list[BaseException] = []

    def load() -> None:
        try:
            importlib.import_module(module)
        except BaseException as error:  # noqa: BLE001  (raised on the caller's thread below)
            failure.append(error)

    loader = threading.Thread(target=load, name=f"import {module}")
    loader.start()
    loader.join()
    if failure:
        raise failure[0]


class Algorithm:
    """Base of rlspeed algorithms (SB3-like API: `learn`, `predict`, `save`, `load`)."""

    #: whether checkpoints also write the replay buffer (a bool), and `model.save_replay_buffer(path)` writes it now
    #: (see `ReplayBufferSaving`)
    save_replay_buffer = _SaveReplayBuffer()
    _checkpoint_replay = False

    name: str = ""
    config_cls: type
    #: whether the last `resume` restored the checkpoint's episodes in progress (`_first_obs` sets it per learn call)
    _episodes_restored: bool = False
    _learn_interrupted = False  # a KeyboardInterrupt left the last learn (`_drop_disrupted_env`)
    #: whether learn draws `run_dir/learning_curve.png` as it ends where a signal's stop (`stop_requested`) or an
    #: interrupt ended it. The CLI, which saves such a run, draws it itself after the model, checkpoint and
    #: summary.json: the plot (matplotlib's import) takes seconds of CPU time, which a loaded machine stretches past a
    #: scheduler's grace period before its kill
    _curve_on_stop = True
    #: an algorithm's own hyperparameters that it takes only when the model is built (SAC's entropy coefficient),
    #: besides `_ARCHITECTURE_KEYS` and `_BUILT_KEYS`: `learn` refuses a value set on `model.config` since
    _built_settings: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: typing.Any) -> None:
        super().__init_subclass__(**kwargs)
        # `help(PPO)`, notebooks and editors show the constructor's arguments (`inspect.signature` reads this), not
        # `__new__`'s (*args, **kwargs)
        init = inspect.signature(cls.__init__)
        cls.__signature__ = init.replace(parameters=list(init.parameters.values())[1:])

    def __new__(cls, *args: typing.Any, **kwargs: typing.Any) -> Self:
        """A new model, with a subclass's own `__init__` arguments recorded as it was called (`_own_init_arguments`:
        what `save` keeps of them, whatever its `__init__` then makes of them)."""
        if args and "env" in kwargs:  # (SB3's `PPO("CnnPolicy", env=env)`: Python's TypeError of two envs else)
            _refuse_policy(cls, args[0], (kwargs["env"], *args[1:]))
        self = super().__new__(cls)
        own = _own_init_parameters(cls) if args or kwargs else ()
        if own:
            try:
                bound = inspect.signature(cls.__init__).bind(self, *args, **kwargs)
            except TypeError:  # (the call does not fit: `__init__` says so)
                pass
            else:
                bound.apply_defaults()
                parameters = bound.signature.parameters
                plain, unsaved = {}, {}
                for name in (name for name in own if name in bound.arguments):
                    value = bound.arguments[name]
                    value = list(value) if isinstance(value, tuple) else value
                    if _plain_value(value):
                        plain[name] = copy.deepcopy(value)  # (as passed: not as the model may change it later)
                    elif value is not parameters[name].default:  # (only its type: the model holds no object)
                        unsaved[name] = type(value).__name__
                self.__dict__["_init_arguments"] = (plain, unsaved)
        return self

    def __init__(self, env: str | BatchedEnv | gym.vector.VectorEnv | VecEnvLike, *policy_and_env: typing.Any,
                 device: str | torch.device = "auto", seed: int | None = None, env_backend: str = "auto",
                 num_threads: int | None = None, accelerate: str = "off", strategy: DistributedStrategy | None = None,
                 nan_policy: str = "raise", numerics_guard: bool = True, save_replay_buffer: bool = False,
                 env_kwargs: dict[str, typing.Any] | None = None, verbose: int = 1,
                 tensorboard_log: str | os.PathLike[str] | None = None,
                 **hyperparameters: typing.Any) -> None:
        """`env`: a registered env id, a `BatchedEnv`, or a Gymnasium or Stable-Baselines3 vector env (an
        `EnvSpec` too: the env a checkpoint describes, as `load` passes it). No policy name comes before it, as in
        Stable-Baselines3 (`PPO("MlpPolicy", env)` is refused in one sentence): the networks follow from the env's
        spaces. `**hyperparameters`: the algorithm's config fields by name (its `config_cls`: `PPOConfig`,
        `DQNConfig`, ...; a misspelt or other algorithm's name is refused, naming the likely one).

        `device`: "auto" (the accelerator torch finds: NPU, CUDA, XPU or MPS, else the CPU; `RLSPEED_DEVICE`
        overrides it), "cpu", "cuda[:i]", "npu[:i]", "xpu[:i]" or "mps". `seed`: seeds the initial weights, the envs
        (on their first reset) and every random draw of training, from streams of the model's own (another model's
        training between its learn calls leaves its run as it would be alone); None draws nothing fixed, from torch's
        global generator as it stands. `env_backend` (for an env
        id): "auto" (`rlspeed.envs.resolve_backend`: rlspeed's native env where it has one, but for few envs on a CPU;
        EnvPool for Atari ids where it is installed; else Gymnasium's), "torch", "gymnasium", "gymnasium-async" or
        "envpool". `accelerate`: "off", or "auto"
        (precision, compilation and graph capture of the update step chosen by measuring, `rlspeed.auto_accelerate`'s
        choice; `acceleration_summary()` says what ran). `strategy`: a `rlspeed.distributed.DistributedStrategy` for
        data-parallel training under torchrun (None: one process, a no-op strategy, also under torchrun, where each
        process then trains on its own, which learn's first call warns of on rank 0: pass `DistributedStrategy()`
        there, docs/distributed.md).

        `num_threads`: torch's intra-op threads while this model is built (its initial weights: the same on any
        machine) and while it trains (`learn`, its evaluations included); the caller's count holds again after each,
        and `predict` leaves it as it is. None: the count `rlspeed.device.configure_threads` set for the process (the
        command line's `--threads`), else RLSPEED_NUM_THREADS, else 1.

        `nan_policy`: what a NaN or infinite observation or reward from the training env does: "raise"
        (`rlspeed.numerics.NonFiniteEnvError`, naming the env index and step) or "mask" (replaced by 0, counted).
        `numerics_guard=False` turns the whole guard off (env checks and the rollback of non-finite parameters; see
        `rlspeed.numerics`). `save_replay_buffer`: off-policy checkpoints also write the replay buffer, beside them
        (`<name>.replay.safetensors`), so that a resumed run continues with it (a run in one process only: refused
        with a `strategy` of several, `rlspeed.errors.refuse_replay_saving`).

        `env_kwargs`: options of the Gymnasium env an id names (`gymnasium.make(env, **env_kwargs)`, as
        Stable-Baselines3's `make_vec_env(env_kwargs=...)`); its envs are then Gymnasium's. The model records them
        (`spec.env_kwargs`, saved with it), so evaluation, videos and a loaded model make the same env again; an env
        from `make_env(env_id, **options)` carries its options the same way.

        `verbose` (Stable-Baselines3's levels, saved with the model): what `learn` prints on stderr where its
        `progress_bar` is not given: 0 nothing, 1 the progress bar (steps/s, recent return, evaluations), 2 the bar and
        each metrics row (the values metrics.csv gets, SB3's table at its `verbose=1`) as a line.

        `tensorboard_log` (Stable-Baselines3's, saved with the model): a directory whose runs `learn` writes where it
        is given no `run_dir`: each call's run directory (metrics.csv, the checkpoint and TensorBoard events in its
        `tensorboard/` folder) is `tensorboard_log/<name>_N`, named and numbered as SB3 names its TensorBoard runs
        (`learn`'s `tb_log_name`, by default the algorithm's class name: PPO_1, PPO_2, ...), so `tensorboard --logdir
        tensorboard_log` shows them; such a `learn` refuses to start where the tensorboard package is not installed.
        """
        name = type(self).__name__
        _refuse_policy(type(self), env, policy_and_env)
        if policy_and_env:
            raise UserError(f"{name} takes one positional argument, the env; give the others by name (got "
                            f"{len(policy_and_env)} more: {', '.join(repr(a)[:40] for a in policy_and_env)}).")
        seed = None if seed is None else check_seed(seed)
        #: what learn prints where its progress_bar is not given (0, 1 or 2: `__init__`)
        self.verbose = check_verbose(verbose)
        #: the directory whose numbered run directories `learn` writes where it is given no run_dir (None: none)
        self.tensorboard_log = check_tensorboard_log(tensorboard_log)
        #: torch's threads while `learn` runs (None: `rlspeed.device.set_training_threads`' default)
        self.num_threads = check_num_threads(num_threads)
        from rlspeed.callbacks import MetricsRecorder

        #: callbacks' own scalars (`BaseCallback.logger.record`), written with the next metrics row
        self.recorder = MetricsRecorder()
        self._numerics = NumericsGuard(numerics_guard, nan_policy)
        #: a function telling whether this process was asked to stop (the CLI's signals): learn stops at the end of
        #: the iteration where it was, under torch.distributed every rank where any one was
        self.stop_requested: Callable[[], bool] | None = None
        self.restarts = 0  # resumes of this run so far (`resume` counts them, checkpoints carry them)
        self._resume: dict | None = None  # what `resume` read for the next learn() (RNG, env, loop position)
        self._loop: dict = {}  # the learn loop's position, as checkpoints save it
        self._callback_runs: CallbackRuns | None = None  # (in learn: the step count each callback last ran at)
        self._run_dir: Path | None = None  # the run directory it trained in or was loaded from (`_continues`)
        self._left_runs: dict[Path, int] = {}  # run directories it trained in before `_run_dir`: the step it left at
        #: the run directory it last trained in, saved with it: a loaded copy continues that run too (`_continues`),
        #: as SB3's load then learn(reset_num_timesteps=False) continues the last tensorboard_log run
        self._trained_run: Path | None = None
        self._tensorboard = KeptWriter()  # (its TensorBoard writer from one learn call in a run directory to the next)
        from_spec = isinstance(env, EnvSpec)
        if env_kwargs is not None and not isinstance(env, str):
            raise UserError(f"{name} takes env_kwargs with an env id; this env is already built, so give its options "
                            "where it is made (rlspeed.make_env(env_id, **options) records them).")
        if not from_spec and not isinstance(env, (BatchedEnv, gym.vector.VectorEnv)) and not is_sb3_vec_env(env):
            _check_env_id(env, name)  # a str passes; other objects get the UserError that says which envs are accepted
        if not isinstance(env, str) and not from_spec and "num_envs" in _field_names(self.config_cls):
            given = env.num_envs
            if hyperparameters.setdefault("num_envs", given) != given:
                raise UserError(f"num_envs={hyperparameters['num_envs']} does not match the env passed in, "
                                f"which has {given} envs.")
        #: use_masking=True given by the caller (not a checkpoint's config, nor a whole config passed back, as
        #: config.yaml's `hyperparameters` hold it: the default written out): an env without masks is then worth a word
        whole = _field_names(self.config_cls).keys() <= hyperparameters.keys()
        self._asked_for_masks = hyperparameters.get("use_masking") is True and not from_spec and not whole
        # schedule functions (SB3's learning_rate=linear_schedule(3e-4)): the model calls them at every update, the
        # config holds their start value
        hyperparameters, self._schedule_functions = own_schedules(self.config_cls, hyperparameters)
        self._schedule_values: dict[str, float] = {}  # (what they gave the last update: `_call_schedules`)
        # those of the file a `load` or `resume` read that were not given again: {setting: the function's name}
        self._schedules_missing: dict[str, str] = {}
        self.config = build_config(self.config_cls, hyperparameters, strategy.world_size if strategy else 1)
        self._numerics.settings = changed_settings(self.config)  # (named when training diverges)
        self.strategy: DistributedStrategy = strategy or single_process()
        # (refused for a model without a replay buffer or under several processes, before any env)
        self.save_replay_buffer = save_replay_buffer
        self.device: torch.device = self.strategy.device if self.strategy.enabled else resolve_device(device)
        self.seed = seed
        self.accelerate = accelerate
        if accelerate not in ("auto", "off"):
            raise UserError(f"accelerate must be auto or off (--accelerate on the command line), got '{accelerate}'.")
        if accelerate == "auto" and self.strategy.enabled:
            raise UserError("--accelerate auto is not supported with several processes yet; use --accelerate off "
                            "under torchrun.")
        self._env: BatchedEnv | None = None
        self._closed_given_env = False  # (`close` closed an env the caller passed: learn cannot make it again)
        self._env_given = not (from_spec or isinstance(env, str))  # (else made from the env id: made again)
        self.env_id: str
        self.spec: EnvSpec
        self.env_backend: str
        if from_spec:
            self.env_id, self.spec, self.env_backend = env.env_id, env, env_backend
        elif isinstance(env, str):
            self.env_id = env
            self.spec = env_spec(env, env_kwargs)
            env_backend = backend_for_options(self.spec.env_kwargs, env_backend, env)
            self.env_backend = resolve_backend(env, env_backend, self.strategy.split_envs(self.config.num_envs),
                                               self.device)
        else:
            if not isinstance(env, BatchedEnv):  # a Gymnasium or Stable-Baselines3 vector env
                changers = reported_reward_wrappers(env)
                if changers:  # (SB3's VecNormalize hands its original rewards on: those returns are the env's own)
                    warn_at_caller(f"{name}: this vector env's rewards pass through {', '.join(changers)}, so the "
                                   "episode returns in the metrics (and a target_return) are the changed rewards' "
                                   "sums, not the env's own; normalize_reward=True normalises what the model learns "
                                   "from while the metrics keep the env's returns.", UserWarning)
                _warn_double_normalisation(env, self.config)
                env = make_env(env, device=self.device)
            else:
                _warn_borrowed_id(env, name)
                _check_atari_training(env, self.config, name)
                env = counted(env)  # (a batched env of the user's own: checked and counted)
            # seed= seeds an env passed in (on the model's first reset), unless make_env gave it a seed of its own
            env = seeded(env, None if seed is None else self.strategy.seed_for_rank(seed))
            # (the normalisation the config asks for and the env lacks: a vector env passed in has none of rlspeed's)
            self._env = normalised(env, getattr(self.config, "normalize_obs", False),
                                   getattr(self.config, "normalize_reward", False), getattr(self.config, "gamma", 0.99))
            _warn_other_discount(self._env, self.config)
            self.env_id = env.spec.env_id
            self.spec = env.spec
            self.env_backend = env.backend
        self._check_spaces(self.spec)
        if getattr(self.config, "normalize_obs", False):  # (observations it cannot normalise: said now, not at learn)
            observation_statistics(self.spec.observation_space, "cpu")
        if seed is not None:
            torch.manual_seed(seed)
        self.obs_rms: RunningMeanStd | None = None
        self.return_rms: RunningMeanStd | None = None  # reward normalisation's statistics (saved, for resuming)
        self.num_timesteps: int = 0
        self._n_updates, self._n_updates_known = 0, True
        # the schedules' span (`_progress_remaining`): set by learn, or by `load` to where the saved run's stood
        self._learn_start: int | None = None
        self._schedule_end: int | None = None
        # whether a `resume` from a save now continues the schedules: during a learn call and after one cut short (an
        # interrupt, a signal's stop request, an error), not after one that ran to its end (its budget, its target, a
        # callback's stop), whose next call would start them afresh
        self._schedule_open = False
        self._saved_with_action_masks = False  # (`load`: the file's run trained with action masks)
        self._saved_on_vec_normalize_obs = False  # (`load`: the file's run trained on an observation VecNormalize)
        self._recorded_gym_packages: list[str] = []  # (`load`: the modules the file records as registering its env)
        self.result = LearnResult()
        # built under the model's threads, as it trains: initial weights (an orthogonal init's QR) depend on the
        # thread count, and the same seed must give the same model on any machine
        # (float32 networks also where the caller made float64 torch's default; trainable ones also inside a caller's
        # torch.inference_mode(), whose inference tensors no later learn could update; built on the CPU and moved,
        # also where the caller made another device torch's default, whose generator drew other initial weights)
        self._check_networks_fit()
        with training_threads(self.num_threads), float32_default(), torch.inference_mode(False), torch.device("cpu"):
            object.__setattr__(self, "_optimizer_deferred", True)
            object.__setattr__(self, "_optimizer_state", None)  # (a checkpoint's, until they are built)
            self._setup()
            if all(name in self.__dict__ for name in self._optimizer_attributes):  # (a _setup that built them)
                object.__setattr__(self, "_optimizer_deferred", False)
                self._follow_replaced_optimizers()
            self._check_own_encoders()
        if self.strategy.is_main:  # (every algorithm's, once: load, members and other ranks leave it out)
            warn_unused_settings(self.config, self.spec, [flag for name, flag in _STATISTICS
                                                          if getattr(self._env, name, None) is not None])
            self._warn_encoder_settings_unread()
        if self.strategy.enabled:  # same initial weights everywhere, then rank-specific randomness
            for module in self._modules_to_sync():
                self.strategy.broadcast_module(module)
            # Without a seed, every process would keep torch's fixed default seed: the ranks would draw the same
            # exploration noise and replay indices. Each draws its own then.
            torch.manual_seed(self.strategy.seed_for_rank(seed) if seed is not None else secrets.randbits(63))
        self._own_random_streams(seed is not None)
        self._learning_rate_given = getattr(self.config, "learning_rate", None)  # (what the optimisers were built
        # with: `_follow_learning_rate` passes on a change)
        # (the values the model was built with, of the hyperparameters read only then: `_check_built_settings`)
        self._built_values = {name: copy.deepcopy(getattr(self.config, name))
                              for name in (*_ARCHITECTURE_KEYS, *_BUILT_KEYS, *self._built_settings)
                              if hasattr(self.config, name)}
        self._built = True  # (from here, a hyperparameter's name set on the model is refused: `__setattr__`)

    def _follow_env_moves(self, env: BatchedEnv) -> None:
        """At the start of `learn`: where the training env was stepped or reset by anything else since this model's
        last learn ended (another model given the same env object: self-play, a teacher and its student), its
        episodes are not where the observation the model kept says, so they start afresh, from a reset (said once per
        model), as after a learn cut short."""
        moves, before = getattr(find_episode_statistics(env), "moves", None), getattr(self, "_env_moves", None)
        if moves is None or before is None or moves == before or getattr(self, "_mid_rollout", False):
            return
        self._mid_rollout = True
        if not getattr(self, "_said_env_moved", False):
            self._said_env_moved = True
            warn_at_caller(f"{type(self).__name__}'s training env was stepped or reset by something else (another "
                           "model given the same env object?) since this model's last learn: its episodes start "
                           "afresh from a reset, not from the observation it kept (each model trains on its own "
                           "env object where that matters).", UserWarning)

    def _own_random_streams(self, seeded: bool) -> None:
        """A seeded model keeps its own random streams: the global generators' states now (right after seeding), put
        in place for each `learn` and taken back after it, the caller's given back; so another model's training,
        sampled actions or the caller's draws between two `learn` calls leave its run as it would be alone. An
        unseeded model draws from the global generators as they stand."""
        object.__setattr__(self, "_streams", _generator_states(self.device) if seeded else None)
        object.__setattr__(self, "_caller_streams", None)  # (the caller's, while a learn call has the model's in place)

    def _enter_streams(self) -> None:
        """At the start of `learn`: the model's own streams in place of the caller's (kept until `_leave_streams`)."""
        if getattr(self, "_streams", None) is not None and self._caller_streams is None:
            caller = _generator_states(self.device)
            _set_generator_states(self.device, self._streams)
            object.__setattr__(self, "_caller_streams", caller)

    def _leave_streams(self) -> None:
        """On every way out of `learn`: the model's streams as training left them kept, the caller's given back."""
        if getattr(self, "_caller_streams", None) is not None:
            object.__setattr__(self, "_streams", _generator_states(self.device))
            _set_generator_states(self.device, self._caller_streams)
            object.__setattr__(self, "_caller_streams", None)

    @property
    def steps_per_iteration(self) -> int:
        """Env steps one training iteration takes, over all processes: `learn` trains whole iterations, so it ends
        at the first multiple of this at or past its `total_timesteps` (a rollout on-policy, a collection of
        `train_freq` steps of every env off-policy: the two bases define it)."""
        raise NotImplementedError

    def acceleration_summary(self) -> dict[str, typing.Any]:
        """What the acceleration layer chose for the update step (summary.json's `accelerate` field); for an update
        in two steps (SAC's and TD3's critics, then actor, by autograd), the second's choice under `actor_step`."""
        report = getattr(getattr(self, "_update_step", None), "report", None)
        summary = {"precision": "fp32", "compile": "off"} if report is None else dict(report.summary())
        for name, step in self._further_update_steps().items():
            if step.report is not None:
                summary[name] = dict(step.report.summary())
        return summary

    def _further_update_steps(self) -> dict:
        """Update steps that train this model besides `_update_step`, by the name summary.json gives them (SAC's
        and TD3's `actor_step`, after the critics' step); none by default."""
        return {}

    def update_summary(self) -> dict[str, str]:
        """Which update implementation trains this model and why (summary.json's `update` field; the rules are in
        `rlspeed.algos.update`)."""
        return self._update_step.choice.as_dict()

    def numerics_report(self) -> dict[str, typing.Any]:
        """What the numerics guard saw and did (summary.json's `numerics`): non-finite env values (masked rows, the
        first env index and step), rollbacks of non-finite parameters and the env steps whose updates they undid."""
        return self._numerics.report()

    def report(self) -> str:
        """What runs and why: the update implementation and the rule that chose it, and what the acceleration layer
        measured and chose (with `accelerate="auto"`, once the updates have paid for its search)."""
        choice = self._update_step.choice
        lines = [f"{self.name} update: {choice.implementation} ({choice.reason})"]
        for step in (self._update_step, *self._further_update_steps().values()):
            if step.report is not None:
                lines.append(str(step.report))
        return "\n".join(lines)

    def _modules_to_sync(self) -> list[torch.nn.Module]:
        """Modules whose initial state rank 0 broadcasts (networks and their target copies)."""
        return [self.policy]

    def _make_encoder(self, network: str) -> torch.nn.Module | None:
        """The encoder of one network (`network`: "policy" for PPO, A2C and RecurrentPPO, "q_network" for DQN,
        "actor" and "critic" for SAC, TD3 and DDPG), a new one at every call: `encoder="auto"`'s (None for float
        vectors). A subclass returns its own (an `rlspeed.nn.Encoder`, docs/algorithms.md), for every algorithm
        without rewriting `_build_policy` or `_setup`; the targets copy their network's."""
        return encoder_from_config(self.spec.observation_space, self.config)

    # --- algorithm-specific -------------------------------------------------------------------------------
    supports_discrete = True
    supports_continuous = True
    #: MultiDiscrete and MultiBinary actions, Box actions of any shape, and action masks (the on-policy algorithms)
    supports_multi_actions = False
    supports_action_masks = False
    #: whether the algorithm learns from a replay buffer (which `save_replay_buffer` saves with checkpoints)
    keeps_replay_buffer = False
    #: metrics that are a schedule's value at the iteration's end (DQN's epsilon), not a statistic of its updates: a
    #: metrics row gives its last iteration's, the value at the row's step (as SB3's `rollout/exploration_rate`)
    current_metrics: tuple[str, ...] = ()
    #: gradient steps taken so far, over every learn call (SB3's `_n_updates`, metrics.csv's `n_updates`): each
    #: algorithm's update loop counts its steps; saved with the model and its checkpoints (here: 0 for a model an
    #: older rlspeed pickled)
    _n_updates: int = 0
    #: whether `_n_updates` counts from the model's first step: not for a file an older rlspeed wrote after training
    #: (it did not count them), whose rows then leave `n_updates` empty and whose saves leave it out
    _n_updates_known: bool = True
    policy: torch.nn.Module

    def _masks_wanted(self) -> bool:
        """Whether this learn applies action masks: the env gives them (`_action_mask`, known after the first
        observation), the algorithm takes them and `config.use_masking` is on (also where set on model.config since
        the last learn)."""
        return bool(self.supports_action_masks and getattr(self.config, "use_masking", False)
                    and getattr(self, "_action_mask", None) is not None)

    def _start_masking(self) -> int | None:
        """After the first observation (`self._action_mask` known): the width of the action masks this run applies
        (the env gives them, the algorithm takes them and its `use_masking` is on), else None. Masks change the
        loss: the hand-derived update, which has none, gives way to autograd (recorded in `update_summary`)."""
        masking = self._masks_wanted()
        if getattr(self, "_asked_for_masks", False) and self._action_mask is None:
            self._asked_for_masks = False  # (said once)
            warn_at_caller(f"use_masking=True has no effect: {self.env_id} gives no action masks (rlspeed reads "
                           "info['action_mask'] or an action_masks() method; an env whose mask method has another "
                           "name can be wrapped in sb3-contrib's ActionMasker(env, mask_fn)).", UnusedSettingWarning)
        # PettingZoo's classic games (and RLlib's convention) put the mask in the observation: a Dict key that the
        # policy encodes as an input but that masks nothing, so illegal actions stay allowed (said once per model)
        space = self.spec.observation_space
        if (self.supports_action_masks and getattr(self.config, "use_masking", False) and self._action_mask is None
                and isinstance(space, gym.spaces.Dict) and "action_mask" in space.spaces
                and not getattr(self, "_said_mask_key", False)):
            self._said_mask_key = True
            warn_at_caller(f"{self.env_id}'s observations hold an 'action_mask' key, which the policy reads as an "
                           "input but which masks no action: rlspeed reads masks from info['action_mask'] or an "
                           "action_masks() method, so give the mask there too (use_masking=False trains unmasked "
                           "without this warning).", UserWarning)
        if masking != getattr(self, "_masking", False):
            self._masking = masking
            hand_derived = getattr(getattr(self, "_update_step", None), "hand_derived", None)
            if getattr(hand_derived, "adam", None) is not None:  # (its flat optimizer gives the parameters back)
                hand_derived.adam.release()
            self._update_step = self._make_update_step()
        return self._action_mask.shape[-1] if masking else None

    def _check_parameters_held(self) -> None:
        """UserError where a network holds a parameter that requires grad but no optimizer of the model holds: its
        parameters were replaced after the model was made (`load_state_dict(..., assign=True)`, a layer put in place
        of one), so training would step the old tensors and leave the new ones as they are. (Parameters that do not
        require grad, target networks' and frozen ones', are not trained anyway.)"""
        held = _trained_parameters(self)
        if not held:  # (an algorithm of the caller's own whose optimisers the model does not list: nothing to compare)
            return
        for name, module in self._modules().items():
            if not isinstance(module, torch.nn.Module):
                continue
            for param_name, param in module.named_parameters():
                if param.requires_grad and id(param) not in held:
                    raise UserError(
                        f"{type(self).__name__}.{name}'s parameter '{param_name}' is not the tensor this model "
                        "trains: the network's parameters were replaced after the model was made "
                        "(load_state_dict(..., assign=True), or a layer put in place of one), or an optimizer of "
                        "_make_optimizer leaves it out, and learn would leave them unchanged; copy weights in with "
                        f"model.{name}.load_state_dict(state) (no assign=True), make a new model with the "
                        "architecture you want (net_arch, activation, ...), or freeze a parameter with "
                        "requires_grad_(False).")
        self._check_parameter_lists()

    def _check_parameter_lists(self) -> None:
        """UserError where a list of parameters the model keeps (`_params`, what the update clips; `_target_params`,
        what the target update moves; ...) holds a tensor no network of the model holds: a `_setup` put a network in
        place after `super()._setup()` and left the lists of the one it replaced, so training would clip, or move
        the targets of, a network nothing uses, silently."""
        held = {id(p) for value in self._saved_modules().values()
                for p in (value.parameters() if isinstance(value, torch.nn.Module) else (value,))}
        for name, value in vars(self).items():
            if (isinstance(value, list) and value and all(isinstance(p, torch.nn.Parameter) for p in value)
                    and any(id(p) not in held for p in value)):
                raise UserError(f"{type(self).__name__}.{name} holds parameters of a network the model no longer has: "
                                "a network was put in place of one after it was made (a _setup that replaces one "
                                f"after super()._setup()); set self.{name} again for the networks in place, as "
                                f"{type(self).__mro__[1].__name__}'s _setup sets it.")

    def _follow_replaced_optimizers(self) -> None:
        """An optimizer put in place of the model's after its update step was made for the old one (a subclass's
        `_setup` that sets `self.optimizer` after `super()._setup()`, or `model.optimizer = ...` before a learn or in
        a callback): the update step is made again (`_make_update_step`), so that the optimizer in place is the one
        that steps; the rules of `select_update` choose anew (an AdamW trains with autograd, and `update_summary`
        says so). Without `_make_update_step` (an algorithm of the caller's own), a UserError says what to do."""
        step = getattr(self, "_update_step", None)
        current = {id(optimizer) for optimizer in self._optimizers().values()}
        made_for = [getattr(each, "optimizer", None) for each in (step, *self._further_update_steps().values())]
        if not current or all(optimizer is None or id(optimizer) in current for optimizer in made_for):
            return
        make = getattr(self, "_make_update_step", None)
        if make is None:
            raise UserError(f"{type(self).__name__}'s update step steps an optimizer the model no longer has (one was "
                            "put in place of it after the step was made): make the update step again after "
                            "replacing the optimizer.")
        hand_derived = getattr(step, "hand_derived", None)
        if getattr(hand_derived, "adam", None) is not None:  # (its flat optimizer gives the parameters back)
            hand_derived.adam.release()
        self._update_step = make()

    def _follow_frozen_parameters(self, learn_start: bool = False) -> None:
        """Parameters the caller froze (`requires_grad_(False)`) after the model was made: the hand-derived update
        steps every parameter, so the update is chosen again (autograd, whose optimizer step leaves a parameter
        without a gradient alone; `update_summary` says why). Likewise when every parameter is trained again after
        frozen ones decided the update: it is chosen anew (the hand-derived one where the other rules allow, its flat
        Adam taking each parameter's own step count from the optimizer; looked at when `learn` starts,
        `learn_start`, not after every callback)."""
        step = getattr(self, "_update_step", None)
        hand_derived = getattr(step, "hand_derived", None)
        params = getattr(self, "_params", None)
        if step is None or not params:
            return
        frozen = not all(p.requires_grad for p in params)
        if hand_derived is not None and frozen:
            if getattr(hand_derived, "adam", None) is not None:  # (its flat optimizer gives the parameters back)
                hand_derived.adam.release()
        elif frozen or not learn_start or not getattr(getattr(step, "choice", None), "by_frozen_parameters", False):
            return
        self._update_step = self._make_update_step()

    def _setup(self) -> None:
        """Build the networks (called once from __init__, env not built yet); the optimisers and update steps are
        `_setup_optimizer`'s, unless this builds them too (every name of `_optimizer_attributes` set)."""
        raise NotImplementedError

    #: the attributes `_setup_optimizer` sets, built on their first read (`_ensure_optimizer`)
    _optimizer_attributes: tuple[str, ...] = ("optimizer", "_update_step")
    #: the attribute holding the parameters rlspeed's `_setup_optimizer` gives the optimizer
    _optimized_parameters = "_params"

    def _setup_optimizer(self) -> None:
        """Build the optimisers and the update steps (`_optimizer_attributes`), after `_setup`."""

    def _ensure_optimizer(self) -> None:
        """The one place that builds the optimisers and update steps a model made without them (`_setup` leaves them
        to `_setup_optimizer`), on the first read of one of `_optimizer_attributes` (the first learn, a gradient step,
        `model.optimizer`): a model loaded to act (predict, evaluate, export) or saved never builds them. They are
        built without importing torch._dynamo (`optimizers_without_dynamo`); where an update step imports it
        (`UpdateStep.imports_dynamo`: compile, graph capture), it is imported here, apart. What a `_setup` put in
        place of one stays, and the optimiser state a checkpoint gave (`_load_optimizer_state`) goes into them
        then."""
        if not self.__dict__.get("_optimizer_deferred"):
            return
        object.__setattr__(self, "_optimizer_deferred", False)
        given = {name: self.__dict__[name] for name in self._optimizer_attributes if name in self.__dict__}
        pending = self._optimizer_state
        try:
            with (training_threads(self.num_threads), float32_default(), torch.inference_mode(False),
                  torch.device("cpu"), optimizers_without_dynamo()):
                self._setup_optimizer()
                self.__dict__.update(given)
                self._follow_replaced_optimizers()
                self._optimizer_state = None
                if pending is not None:
                    self._load_optimizer_state(*pending)
        except BaseException:
            # a build that failed partway is no build: the next read builds again (and raises its error again), with
            # the checkpoint's state still to go in, rather than finding some of the attributes, or none
            for name in self._optimizer_attributes:
                self.__dict__.pop(name, None)
            self.__dict__.update(given)
            object.__setattr__(self, "_optimizer_state", pending)
            object.__setattr__(self, "_optimizer_deferred", True)
            raise
        steps = (self.__dict__.get("_update_step"), *self._further_update_steps().values())
        if any(getattr(step, "imports_dynamo", False) for step in steps):
            # (imported here, apart, the first step inside learn does not, and learn's frame is not kept by it: see
            # `_import_apart`)
            _import_apart("torch._dynamo")

    def _start(self, env: BatchedEnv, total_timesteps: int) -> None:
        """Prepare a learn() call: buffers, first observation."""
        raise NotImplementedError

    def _end(self) -> None:
        """Put back what `_start` set on the training env for this learn() call alone; runs on every way out of it."""

    def _train_iteration(self) -> tuple[int, dict[str, torch.Tensor]]:
        """Collect and update once; returns (env steps taken, metrics as device tensors)."""
        raise NotImplementedError

    def _policy_actions(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Actions of the policy for already-normalised observations, as the env expects them."""
        raise NotImplementedError

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {}

    # --- the learning-rate schedule (`anneal_lr`) -------------------------------------------------------------
    def _progress_remaining(self, timesteps: int | None = None) -> float:
        """1 at the start of the schedule, 0 at its end, at `timesteps` (default: now; see `learn` for what the
        schedule spans)."""
        timesteps = self.num_timesteps if timesteps is None else timesteps
        return progress_remaining(timesteps, self._learn_start, self._schedule_end)

    def _hold_learning_rates_as_tensors(self) -> None:
        """On graph devices, every optimizer's learning rate as a device tensor that `_anneal_learning_rate` fills
        in place: a captured step reads it from its memory, so annealing needs no recapture."""
        if not rules(self.device).supports_graphs:
            return
        for optimizer in self._optimizers().values():
            for group in optimizer.param_groups:
                if not isinstance(group["lr"], torch.Tensor):
                    group["lr"] = torch.tensor(float(group["lr"]), device=self.device)

    def _check_built_settings(self) -> None:
        """UserError in one sentence for a hyperparameter the model takes only when it is built (its networks, its
        optimiser, its update step; SAC's entropy coefficient) set to another value on `model.config` since, unless
        the algorithm takes the new value now (`_take_built_setting`): the learn would train with the built one and
        ignore it."""
        built = self.__dict__.get("_built_values", {})
        for name, value in built.items():
            now = getattr(self.config, name, value)
            if now == value:
                continue
            if self._take_built_setting(name, value, now):
                built[name] = copy.deepcopy(now)
                continue
            algo = type(self).__name__
            # (None of an automatic value as the user writes it: SAC's ent_coef "auto")
            now_text, built_text = ("'auto'" if held is None and name in AUTO_VALUES else repr(held)
                                    for held in (now, value))
            if name in _ARCHITECTURE_KEYS:
                remedy = "a new model takes another (the weights belong to the networks built)"
            else:
                remedy = f"save the model and load it with the new value, {algo}.load(path, {name}={now_text})"
            raise UserError(f"model.config.{name} is {now_text}, but {algo} takes {name} only when the model is "
                            f"built, with {built_text}, and this learn would ignore the change: set it back, or "
                            f"{remedy}.")

    def _take_built_setting(self, name: str, built, now) -> bool:
        """Whether the model took `now`, the value set on `model.config.<name>` since it was built with `built`, for
        one of `_built_settings` it can change in place (SAC's fixed entropy coefficient); none by default."""
        return False

    def _follow_learning_rate(self) -> None:
        """A `config.learning_rate` changed since the optimisers last took it (between learn calls) reaches them;
        a rate set in their param_groups by hand holds until then (and `anneal_lr` sets its own)."""
        learning_rate = self.config.learning_rate
        if self._learning_rate_given != learning_rate and not self.config.anneal_lr:
            self._set_learning_rate(learning_rate)
        self._learning_rate_given = learning_rate

    def _current_learning_rate(self) -> float | None:
        """The learning rate the optimizers hold now, which their last step took (every optimizer of a model takes the
        same: `_set_learning_rate`), as metrics.csv's `learning_rate`; None for a model without an optimizer."""
        for optimizer in self._optimizers().values():
            for group in optimizer.param_groups:
                return float(group["lr"])  # ok-sync: once per metrics row, after the row's own read
        return None

    def _set_learning_rate(self, learning_rate: float) -> None:
        """Every optimizer's learning rate (in place where it is a device tensor, as a captured step reads it)."""
        for optimizer in self._optimizers().values():
            for group in optimizer.param_groups:
                if isinstance(group["lr"], torch.Tensor):
                    group["lr"].fill_(learning_rate)
                else:
                    group["lr"] = learning_rate

    def _call_schedules(self, timesteps: int) -> None:
        """The schedule functions (`own_schedules`) called with progress_remaining at `timesteps`, the step count after
        the collection the coming updates learn from (SB3's progress, but never below 0): the learning rate set on
        every optimizer (in place where it is a device tensor), every value kept in `_schedule_values` for the
        update (PPO's clip ranges)."""
        progress = self._progress_remaining(timesteps)
        self._schedule_values = {key: schedule_value(key, function, progress)
                                 for key, function in self._schedule_functions.items()}
        if "learning_rate" in self._schedule_values:
            self._set_learning_rate(self._schedule_values["learning_rate"])

    def _schedule_names(self) -> dict[str, str]:
        """{setting: name} of the schedule functions this model calls (`_schedule_functions`) or was loaded without
        (`_schedules_missing`): what `save` records and a population refuses."""
        return {**self._schedules_missing,
                **{key: schedule_name(function) for key, function in self._schedule_functions.items()}}

    def _holds_learning_rates_as_tensors(self) -> bool:
        """Whether the learning rate changes during learn (`anneal_lr`, a schedule function): held as device tensors
        on graph devices (`_hold_learning_rates_as_tensors`)."""
        return bool(self.config.anneal_lr) or "learning_rate" in self._schedule_functions

    def _check_schedule_functions(self) -> None:
        """UserError in one sentence, at learn, for a scheduled setting or its anneal switch changed on model.config
        since the model was made (the function would override the change at every update), and for a model loaded or
        resumed from a file saved with schedule functions that were not given again: the file keeps their names, not
        their code, and the learn would train at a value the run never had as a constant."""
        algo = type(self).__name__
        for key, function in self._schedule_functions.items():  # (model.config changed since: the function would
            # override it at every update)
            switch = SB3_SCHEDULED.get(key)
            if switch is not None and getattr(self.config, switch, False) is True:
                raise UserError(f"model.config.{switch} is True, but this model calls the schedule function {key}="
                                f"{schedule_name(function)} at every update: set it back to False, or load the model "
                                f"with a number for {key} ({algo}.load(path, {key}=X, {switch}=True)).")
            start = schedule_value(key, function, 1.0)
            if getattr(self.config, key) != start:
                raise UserError(f"model.config.{key} is {getattr(self.config, key)!r}, but this model calls the "
                                f"schedule function {key}={schedule_name(function)} at every update (which starts at "
                                f"{start!r}): set it back, or load the model with the value "
                                f"({algo}.load(path, {key}=...)).")
        missing = self._schedules_missing
        if not missing:
            return
        plural, given, again = missing_schedules_words(missing)
        raise UserError(f"This model's file was saved with the schedule function{plural} {given}, which a "
                        f"model file does not keep (it holds no code): give {'them' if plural else 'it'} again in "
                        f"Python ({algo}.load(path, {again}), or {algo}(env, {again}).resume(path)), or a number for "
                        f"a constant value ({algo}.load(path, {again})).")

    def _anneal_learning_rate(self, timesteps: int | None = None) -> None:
        """`anneal_lr`: every optimizer's learning rate set to config.learning_rate times the progress remaining at
        `timesteps` (linear decay to 0, SB3's and RL-Zoo's `lin_X`)."""
        self._set_learning_rate(self.config.learning_rate * self._progress_remaining(timesteps))

    def _check_own_encoders(self) -> None:
        """UserError in one sentence, when the model is made, for an encoder of the user's own (a subclass's
        `_build_policy` or `_setup`; rlspeed's own are not run) whose features the heads cannot take: not one float32
        tensor `[batch, features_dim]` on the model's device (else the first rollout or predict fails deep in the
        heads' matrix products). It runs once on two random observations, in eval mode, without gradients, moving
        neither the global random streams nor its buffers; an encoder that raises on them (random values outside the
        range its env gives) is not checked."""
        seen: set[int] = set()
        for name, network in self._modules().items():
            for attribute in ("encoder", "obs_encoder"):
                encoder = getattr(network, attribute, None)
                if (not isinstance(encoder, torch.nn.Module) or id(encoder) in seen
                        or of_rlspeed(encoder)):
                    continue
                seen.add(id(encoder))
                self._check_encoder(encoder, f"{type(encoder).__name__} (the {name}'s {attribute})")

    def _warn_encoder_settings_unread(self) -> None:
        """An `UnusedSettingWarning` for each of rlspeed's encoder settings given away from its default (`encoder`,
        `cnn`, `cnn_features_dim`, `normalize_images`) where a subclass's `_make_encoder` gave every network an encoder
        of its own and never reads `self.config` (nothing then reads them); settings already said idle on this env
        (`env_inert_settings`) are not said again."""
        make = type(self)._make_encoder
        if getattr(make, "__module__", "rlspeed.").startswith("rlspeed.") or _may_read_config(make, type(self)):
            return
        kinds = set()
        for network in self._modules().values():
            encoders = [layer for layer in network.modules() if isinstance(layer, Encoder)] if isinstance(
                network, torch.nn.Module) else []
            if any(of_rlspeed(layer) for layer in encoders):
                return  # (one of rlspeed's encoders reads them)
            kinds.update(type(layer).__name__ for layer in encoders)
        if not kinds:
            return
        defaults = {field.name: field.default for field in dataclasses.fields(self.config)}
        idle = env_inert_settings(self.config, self.spec)
        for name in ("encoder", "cnn", "cnn_features_dim", "normalize_images"):
            value = getattr(self.config, name, None)
            if name in defaults and value != defaults[name] and name not in idle:
                warn_at_caller(f"{name}={value!r} has no effect: {type(self).__name__}._make_encoder gives the "
                               f"networks encoders of its own ({', '.join(sorted(kinds))}), which rlspeed's encoder "
                               f"settings do not reach (read self.config.{name} there to use it).",
                               UnusedSettingWarning)

    def _check_encoder(self, encoder: torch.nn.Module, who: str) -> None:
        obs = random_observations(self.spec.observation_space, 2, torch.Generator().manual_seed(0))
        obs = {key: value.to(self.device) for key, value in obs.items()} if isinstance(obs, dict) else obs.to(
            self.device)
        buffers = [(buffer, buffer.clone()) for buffer in encoder.buffers()]
        try:
            with _forked_random(self.device), torch.no_grad(), acting_mode(encoder):
                features = encoder(obs)
        except Exception:  # (values the env never gives, out of its range: an embedding of ids; not checked)
            return
        finally:
            with torch.no_grad():
                for buffer, value in buffers:
                    buffer.copy_(value)
        width = getattr(encoder, "features_dim", None)
        if not isinstance(features, torch.Tensor):
            raise UserError(f"{who} returned a {type(features).__name__}, and the heads take its features as one "
                            f"tensor [batch, features_dim]: return that tensor alone.")
        if tuple(features.shape) != (2, width):
            raise UserError(f"{who} returned features of shape {list(features.shape)} for a batch of 2 observations, "
                            f"and the heads were built for its features_dim {width}: return [batch, {width}], or set "
                            "features_dim to the width it returns.")
        if features.dtype != torch.float32 or features.device != self.device:
            raise UserError(f"{who} returned {features.dtype} features on {features.device}, and the heads take "
                            f"float32 on {self.device}, the model's device: return them so (x.float(); tensors it "
                            "makes with device=obs.device).")

    def _modules(self) -> dict[str, torch.nn.Module | torch.Tensor]:
        """What a checkpoint holds besides optimisers: name -> module, or a lone tensor (e.g. SAC's log_alpha).

        Names become key prefixes in the checkpoint (`policy.body.weights.0`); default: just the policy.
        """
        return {"policy": self.policy}

    def _saved_modules(self) -> dict[str, torch.nn.Module | torch.Tensor]:
        """`_modules`, plus what a subclass keeps of its own and trains without listing it there: each attribute of
        the model (a module, or a lone tensor) holding a parameter the model's optimizers step that no module before
        it holds (an auxiliary head that a `_make_optimizer` override adds). Saved, loaded and resumed with the
        networks, under the attribute's name."""
        modules = self._modules()
        held = {id(p) for value in modules.values()
                for p in (value.parameters() if isinstance(value, torch.nn.Module) else (value,))}
        candidates = {name: list(value.parameters()) if isinstance(value, torch.nn.Module) else [value]
                      for name, value in vars(self).items()
                      if name not in modules and isinstance(value, (torch.nn.Module, torch.Tensor))}
        if not any(id(p) not in held and (p.requires_grad or isinstance(p, torch.nn.Parameter))
                   for params in candidates.values() for p in params):
            return modules  # (nothing an optimiser could train beside them: a subclass's are not built to see)
        trained = _trained_parameters(self)
        own = {}
        for name, params in candidates.items():
            value = vars(self)[name]
            if any(id(p) in trained and id(p) not in held for p in params):
                own[name] = value
                held.update(id(p) for p in params)
        return {**modules, **own}

    # --- shared ---------------------------------------------------------------------------------------------
    def _check_metrics(self, row: dict) -> None:
        """A look at each metrics row as it is read (the algorithm's own signs of a run gone wrong); nothing here."""

    def _check_spaces(self, spec: EnvSpec) -> None:
        """UserError, when the model is made, for an action space (or, in subclasses, an observation space for what
        the config asks) this algorithm cannot train on."""
        space = spec.action_space
        problem = foreign_space_problem(space, spec.env_id, "an action")
        if problem:
            raise UserError(problem)
        if isinstance(space, gym.spaces.Discrete) and not self.supports_discrete:
            raise UserError(f"{type(self).__name__} needs continuous (Box) actions, but {spec.env_id} has discrete "
                            f"actions; use {_algorithms_taking(lambda algo: algo.supports_discrete)}"
                            f"{_continuous_option_hint(spec, True)}.")
        if isinstance(space, gym.spaces.Box) and not np.issubdtype(space.dtype, np.floating):
            # the policies act in real numbers: an integer cast of them would truncate, and predict's values would
            # not be members of the space (said before the discrete/continuous advice: every taker of Boxes refuses)
            # (indices start at 0, so the wrapper adds the Box's low; one integer is a Discrete, which DQN takes too)
            if math.prod(space.shape) == 1:  # (a 0-dim Box too: one integer)
                choices = "Discrete(high - low + 1)"
                takers = _algorithms_taking(lambda algo: algo.supports_discrete)
            else:
                choices = "MultiDiscrete(high - low + 1)"
                takers = _algorithms_taking(lambda algo: algo.supports_multi_actions)
            raise UserError(f"{spec.env_id} has Box actions of dtype {np.dtype(space.dtype).name}; rlspeed's "
                            "continuous policies act in real numbers: wrap the env in a gymnasium.ActionWrapper "
                            f"whose action_space is {choices} and whose action(a) returns low + a in the Box's "
                            f"shape and dtype ({takers} train on it), or one whose action_space is a float Box and "
                            "whose action(a) rounds a.")
        if isinstance(space, gym.spaces.Box) and not self.supports_continuous:
            # (a Box of more than one axis: only the algorithms that take such shapes, not those that refuse them)
            flat = len(space.shape) == 1
            takers = _algorithms_taking(lambda algo: algo.supports_continuous and (flat or algo.supports_multi_actions))
            raise UserError(f"{type(self).__name__} needs discrete actions, but {spec.env_id} has continuous "
                            f"actions; use {takers}{_continuous_option_hint(spec, False)}.")
        if isinstance(space, gym.spaces.Box) and len(space.shape) != 1 and not self.supports_multi_actions:
            # this algorithm's actors emit a flat action vector; nothing reshapes it to the space's shape
            raise UserError(f"{type(self).__name__} supports 1-D Box actions and {spec.env_id} has Box actions of "
                            f"shape {space.shape}: use {_algorithms_taking(lambda algo: algo.supports_multi_actions)}"
                            ", or flatten them with a gymnasium.ActionWrapper.")
        if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and np.any(np.asarray(space.start) != 0):
            # the policies act in indices 0..n-1 and the env adapters pass them on as they are
            raise UserError(f"{spec.env_id} has {type(space).__name__} actions starting at {space.start}; rlspeed "
                            "needs them to start at 0 (wrap the env in a gymnasium.ActionWrapper that adds the "
                            "offset).")
        if isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)) and not self.supports_multi_actions:
            raise UserError(f"{type(self).__name__} does not take {type(space).__name__} actions ({spec.env_id}): use "
                            f"{_algorithms_taking(lambda algo: algo.supports_multi_actions)}.")
        if not isinstance(space, (gym.spaces.Discrete, gym.spaces.Box, gym.spaces.MultiDiscrete,
                                  gym.spaces.MultiBinary)):
            raise UserError(f"{spec.env_id} has a {type(space).__name__} action space; rlspeed supports Discrete, "
                            "Box, MultiDiscrete and MultiBinary (wrap others in a gymnasium.ActionWrapper).")

    if not typing.TYPE_CHECKING:  # (else type checkers type a misspelt attribute as Any instead of reporting it)
        def __getattr__(self, name: str):
            if name in type(self)._optimizer_attributes and self.__dict__.get("_optimizer_deferred"):
                self._ensure_optimizer()
                if name in self.__dict__:
                    return self.__dict__[name]
            # (only for attributes that do not exist: Stable-Baselines3's model attributes say what to use instead)
            advice = SB3_ATTRIBUTES.get(name)
            if name == "buffer":  # (rlspeed's own: a rollout or replay buffer, made by learn for its envs)
                pending = (" (the transitions load_replay_buffer read go into it then)"
                           if self.__dict__.get("_replay_source") is not None else
                           " (transitions of your own, demonstrations, go into it through an "
                           "rlspeed.buffers.ReplayBuffer you fill and give to model.load_replay_buffer(buffer))"
                           if getattr(type(self), "keeps_replay_buffer", False) else "")
                raise AttributeError(f"{type(self).__name__}.buffer is made by learn, for the envs it trains on, and "
                                     f"no learn has made it yet{pending}.")
            if name in _config_names(type(self)):
                raise AttributeError(f"{type(self).__name__} keeps its hyperparameters in model.config: "
                                     f"model.config.{name}.")
            if advice is None:
                raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
            raise AttributeError(f"{type(self).__name__}.{name} is Stable-Baselines3's; {advice}.")

    def __reduce_ex__(self, protocol: typing.SupportsIndex) -> str | tuple[typing.Any, ...]:
        # Pickled by torch's pickler, which writes each storage once: the views a model holds (a hand-derived
        # update's parameters and gradients in its flat buffers, storage fields of one allocation) stay views; plain
        # pickle copies each view on its own, and the copy would train on gradients its optimizer never reads. Inside
        # it, attribute by attribute, as any object; also where the parameters are in shared memory
        # (`share_memory()` for torch.multiprocessing: its pickler shares them, which a copy made here would not).
        if getattr(_TORCH_PICKLING, "active", False) or any(
                p.is_shared() for p in getattr(self, "policy", torch.nn.Module()).parameters()):
            return super().__reduce_ex__(protocol)
        _TORCH_PICKLING.active = True
        try:
            buffer = io.BytesIO()
            torch.save(self, buffer)
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            env = self.__dict__.get("_env")
            if env is None or _picklable(env):
                raise
            # (Gymnasium's vector envs hold their env constructor, a local function: under the spawn start method,
            # macOS's and Windows' default, every model that trained on one met this in mp.Process(args=(model,)))
            # (a worker returning its trained model, a sweep's: closing drops the env, which learn makes again from
            # the id; an env passed in is not made again, so that advice is left out for it)
            closing = ("" if self.__dict__.get("_env_given", True) else
                       f", close() it first (the envs go; a later learn makes new ones from '{self.env_id}')")
            raise UserError(f"This {type(self).__name__} holds the {env.backend} env it trained on, which cannot be "
                            f"pickled ({first_line(error) or type(error).__name__}): send the model as a file instead "
                            f"(model.save(path) here, {type(self).__name__}.load(path) in the other process){closing}, "
                            "or pickle it before learn builds its env.") from None
        finally:
            _TORCH_PICKLING.active = False
        return _unpickle_model, (buffer.getvalue(),)

    def __getstate__(self) -> dict[str, typing.Any]:
        # (what a copy or pickle holds: made inside learn (a callback's snapshot of the best model), a seeded model's
        # own streams are the global generators as they stand, and the caller's, which learn gives back on its way
        # out, are no part of the copy: its own learn would give them back in place of its caller's)
        state = dict(self.__dict__)
        if state.get("_caller_streams") is not None:
            state["_streams"], state["_caller_streams"] = _generator_states(self.device), None
        return state

    def __deepcopy__(self, memo: dict[int, typing.Any]) -> Algorithm:
        # (the default deep copy, attribute by attribute, a subclass's __getstate__ and __setstate__ honoured:
        # storages shared within the model stay shared in the copy)
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        # (a copy that trains, also one made inside a caller's torch.inference_mode(): an evaluation helper's
        # snapshot of the best model, whose inference tensors no learn outside it could update)
        with torch.inference_mode(False):
            state = copy.deepcopy(self.__getstate__(), memo)
        if hasattr(new, "__setstate__"):
            new.__setstate__(state)
        else:
            new.__dict__.update(state)
        return new

    def __copy__(self) -> Algorithm:
        # (the default shallow copy: the same networks, envs and buffers)
        new = type(self).__new__(type(self))
        new.__dict__.update(Algorithm.__getstate__(self))
        return new

    def _own_modules(self) -> None:
        """After unpickling: what follows this model's networks (a target network following a `load_state_dict` of
        its online one, `rlspeed.algos.off_policy.frozen_copy`) follows this copy's, not nothing."""

    def __setattr__(self, name: str, value: typing.Any) -> None:
        if self.__dict__.get("_built"):
            # (a hyperparameter set on the model, as on Stable-Baselines3's, would be a new attribute nothing reads)
            if name not in self.__dict__ and not hasattr(type(self), name) and name in _config_names(type(self)):
                raise UserError(f"model.{name} = ... changes nothing: {type(self).__name__} reads its "
                                f"hyperparameters from model.config; set model.config.{name} (docs/callbacks.md says "
                                "which take effect once the model is built).")
            if name in SB3_SCHEDULE_ATTRIBUTES and name not in self.__dict__ and not hasattr(type(self), name):
                raise UserError(f"model.{name} = ... changes nothing: it is Stable-Baselines3's; "
                                f"{SB3_ATTRIBUTES[name]}.")
            # (the env is given when the model is made or loaded: nothing reads a `model.env` set later, Stable-
            # Baselines3's way to change it, and `env_id` must stay the env the weights trained on, which save records)
            if ((name == "env" and name not in self.__dict__ and not hasattr(type(self), name))
                    or (name == "env_id" and value != self.__dict__.get("env_id"))):
                raise UserError(f"model.{name} = ... does not change the env {type(self).__name__} trains on: give "
                                "the env when making or loading the model; to go on training on another env with the "
                                "same spaces, save the model and load it with that env, Algo.load(path, env=...).")
            # (a network put in place of one the model's optimisers train: they and the update steps hold the first
            # one's parameters, so the new one would act but not train, or neither; a wrapper of the same parameters,
            # torch.compile's, and networks of the user's own that no optimiser holds are taken)
            current = self.__dict__.get(name)
            if (isinstance(current, torch.nn.Module) and isinstance(value, torch.nn.Module) and value is not current
                    and _trained_parameters(self) & {id(p) for p in current.parameters()}
                    and {id(p) for p in value.parameters()} != {id(p) for p in current.parameters()}):
                raise UserError(f"model.{name} = ... would not be what trains: the model's optimisers and update "
                                f"step hold the networks it was built with; load the other's weights into them "
                                f"(model.{name}.load_state_dict(other.state_dict())).")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        # (what a notebook shows for `model.learn(...)`, which returns the model; getattr: a debugger may show a
        # model whose constructor raised)
        num_envs = getattr(getattr(self, "config", None), "num_envs", None)
        envs = "" if num_envs is None else f", num_envs={num_envs}"
        return (f"{type(self).__name__}({getattr(self, 'env_id', None)!r}{envs}, "
                f"device={str(getattr(self, 'device', None))!r}, num_timesteps={getattr(self, 'num_timesteps', 0)})")

    def close(self) -> None:
        """Close the training env: its subprocesses (`gymnasium-async`), EnvPool's threads, its render window; and the
        TensorBoard events file its `learn` calls into a run directory wrote on (a later call there starts another).
        The model stays usable (predict, evaluate, save, export); a later `learn` makes new envs from the env id, whose
        episodes start afresh (a model given an env object is refused: pass a new one to `load(path, env=...)`).
        Closing twice is a no-op. `with PPO(...) as model:` closes it at the block's end."""
        self._tensorboard.close()
        env, self._env = self._env, None
        if env is not None:
            self._closed_given_env = self._env_given
            self._mid_rollout = True  # (the next learn's envs start afresh, as after a learn cut short)
            env.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _waiting_switch(self, env: BatchedEnv) -> str | None:
        """What would step `env`'s envs in subprocesses of their own, in words, where learn may note that they wait
        (`rlspeed.diagnostics.waiting`): in-process Gymnasium envs, in one process (not under torch.distributed),
        where this process has not noted it before; else None."""
        if (waiting.noted or self.strategy.enabled
                or getattr(env.unwrapped, "backend_name", env.backend) != "gymnasium"):
            return None
        if self._env_given:
            return ("a gymnasium.vector.AsyncVectorEnv of your env (or make_env(..., backend='gymnasium-async') "
                    "passed in)")
        return "--env-backend gymnasium-async (env_backend='gymnasium-async')"

    def _check_networks_fit(self) -> None:
        """UserError, naming net_arch (and RecurrentPPO's lstm_hidden_size), where the weights of two networks of the
        config's hidden layers would not fit in the memory they are built in (the host) and trained on, refused
        before any is built (in one sentence, not the allocator's error or minutes of allocating). A lower bound
        (float32 weights of the hidden layers and the first layer's inputs, two networks: actor and critic, or Q and
        its target); the output layers and the optimiser's state come on top."""
        cfg = self.config
        widths = [int(width) for width in getattr(cfg, "net_arch", ())]
        lstm = int(getattr(cfg, "lstm_hidden_size", 0))
        inputs = self.spec.obs_dim if self.spec.float_vector_obs else int(getattr(cfg, "cnn_features_dim", 1))
        weights = 4 * lstm * (inputs + lstm) + sum(a * b for a, b in zip([lstm or inputs, *widths], widths))
        what = f"net_arch {widths}" + (f" with lstm_hidden_size {lstm:,}" if lstm else "")
        for device in dict.fromkeys((torch.device("cpu"), self.device)):
            refuse_unless_fits(2 * 4 * weights, device, f"{what} (the weights of two of its networks)",
                               "give smaller layers (net_arch=[64, 64] and lstm_hidden_size=256 are usual)" if lstm
                               else "give smaller layers (net_arch=[64, 64] is usual)")

    def _bytes_per_env(self) -> int:
        """The least memory one training env takes before anything of it exists (`_check_envs_fit`): its observation
        and reset buffers, and where the backend keeps an env object (`ENV_OBJECT_BYTES`) or process per env, that."""
        per_env = 2 * layout_nbytes(observation_layout(self.spec.observation_space)) + 64
        return per_env + ENV_OBJECT_BYTES.get(self.env_backend, 0)

    def _storage_bytes_estimate(self, num_envs: int) -> int:
        """The least memory of `num_envs` training envs and what the model stores per env (a rollout), before any
        exists: a population's estimate of a member (`population.base.check_members_fit`)."""
        return num_envs * self._bytes_per_env()

    def _check_envs_fit(self, num_envs: int) -> None:
        """UserError, naming --num-envs, where `num_envs` training envs would not fit in the memory available,
        refused before any is made: --num-envs 1e9 ran out of memory, or for hours, while it made them."""
        per_env = self._bytes_per_env()
        objects = (f" and {num_envs:,} {self.env_backend} env objects"
                   if self.env_backend in ENV_OBJECT_BYTES else "")
        refuse_unless_fits(num_envs * per_env, self.device,
                           f"num_envs {num_envs:,} (--num-envs) at {per_env:,} bytes per env (its storage{objects})",
                           lambda usable: f"give at most --num-envs {int(usable) // per_env:,}" if usable >= per_env
                           else "this machine has not the memory for one (free some)")

    def make_training_env(self) -> BatchedEnv:
        """The training env: built from the env id on first use, with the config's normalisation; built again where
        an interrupt left the envs unable to go on (`BatchedEnv.disrupted`), as after `close`."""
        if self._env is not None:
            self._drop_disrupted_env()
        if self._env is None and self._closed_given_env:
            raise UserError(f"This model's env was closed (model.close()) and was passed in, so learn cannot make it "
                            f"again: save the model and {type(self).__name__}.load(path, env=...) with a new env.")
        if self._env is None:
            cfg = self.config
            # (statistics a loaded model holds, from a normalising env it trained on, go on normalising: off-policy
            # configs have no normalize_reward of their own)
            normalize_obs = cfg.normalize_obs if hasattr(cfg, "normalize_obs") else self.obs_rms is not None
            normalize_reward = (cfg.normalize_reward if hasattr(cfg, "normalize_reward")
                                else self.return_rms is not None)
            self._check_envs_fit(self.strategy.split_envs(cfg.num_envs))
            self._env = make_env(self.env_id, num_envs=self.strategy.split_envs(cfg.num_envs), device=self.device,
                                 seed=self.strategy.seed_for_rank(self.seed),
                                 backend=self.env_backend, normalize_obs=normalize_obs,
                                 normalize_reward=normalize_reward,
                                 gamma=getattr(cfg, "gamma", 0.99), env_kwargs=self.spec.env_kwargs,
                                 episodic_life=cfg.episodic_life, clip_rewards=cfg.clip_rewards)
            inner = getattr(getattr(self._env, "unwrapped", None), "vector_env", None)  # (Gymnasium's envs)
            if inner is not None:  # (an id whose entry point wraps its envs in Gymnasium's normalisation)
                _warn_double_normalisation(inner, cfg, whose=f"{self.env_id}'s")
            made = self._env.spec.observation_space
            if type(made) is not type(self.spec.observation_space) or made.shape != self.spec.observation_space.shape:
                self._env.close()
                self._env = None
                raise UserError(f"The {self.env_backend} backend's {self.env_id} gives its observations as "
                                f"{space_text(made)}, not as {space_text(self.spec.observation_space)} (Gymnasium's "
                                "env's), which the model was built for: "
                                "use --env-backend gymnasium (env_backend='gymnasium').")
        # Distributed: normalisation statistics from every rank's data, identical everywhere, merged once per
        # iteration (`_sync_statistics`); also those of a normalising env passed in.
        self._synced_stats = [rms for rms in (getattr(self._env, name, None) for name, _ in _STATISTICS)
                              if rms is not None and self.strategy.enabled]
        for rms in self._synced_stats:
            rms.reduce = self.strategy.all_reduce_sum
        # The env's observation statistics (built here, or a normalising env passed in) are the model's: predict,
        # evaluate and save use them. Saved statistics (load, resume) seed the env's, which then carry on.
        self._adopt_statistics()
        self._numerics.attach(self._env, self.config.normalize_obs, self.config.normalize_reward)
        return self._env

    def _drop_disrupted_env(self) -> None:
        """Close the training env where it cannot go on (`BatchedEnv.disrupted`: subprocess envs a KeyboardInterrupt
        left with their pipes out of step, or stopped, as Jupyter's stop button does, which signals the workers too),
        so that `make_training_env` makes it again from the env id, as `close` then `learn` would: the model goes on
        (its step count, statistics and replay buffer), its episodes start afresh (without a warning: a learn cut
        short inside a rollout starts them afresh anyway). An env passed in cannot be made again: UserError."""
        disrupted = getattr(self._env.unwrapped, "disrupted", None)
        interrupted, self._learn_interrupted = self._learn_interrupted, False
        reason = disrupted(interrupted=interrupted) if callable(disrupted) else None
        if reason is None:
            return
        env_given = self._env_given
        self.close()  # (terminates the subprocesses: they are not asked, and may not answer)
        if env_given:
            how = ("" if "failed" in reason else
                   ": an interrupt inside a step, Ctrl-C or Jupyter's stop button, leaves them so")
            raise UserError(f"The env subprocesses of '{self.env_id}', which was passed in, cannot go on ({reason}"
                            f"{how}), and learn cannot make them again: save the model and {type(self).__name__}"
                            ".load(path, env=...) with a new env.")

    def _adopt_statistics(self) -> None:
        """Make the training env's normalisation statistics the model's (`obs_rms`, `return_rms`); statistics the
        model already holds (from `load` or `resume`) seed the env's first, which then carry on."""
        for name, flag in _STATISTICS:
            rms, held = getattr(self._env, name, None), getattr(self, name, None)
            if rms is not None and rms is not held:
                if held is not None:
                    rms.load_state_dict(held.state_dict())
                setattr(self, name, rms)
                if hasattr(self.config, flag):  # a normalising env passed in: a loaded model rebuilds one too
                    setattr(self.config, flag, True)
        self._apply_normalization_clips()

    def _apply_normalization_clips(self) -> None:
        """The config's clips (`normalize_obs_clip`, `normalize_reward_clip`) on the training env's normalisation
        wrappers. A wrapper the model met before follows the config (set between learn calls); a new one at the
        default clip takes the config's; a config at the default takes another clip of a normalising env passed in (as
        it takes its normalize_obs); a clip set in both, differently, is a UserError."""
        for wrapper_type, option in ((NormalizeObservation, "normalize_obs_clip"),
                                     (NormalizeReward, "normalize_reward_clip")):
            wrapper = find_wrapper(self._env, wrapper_type)
            if wrapper is None or not hasattr(self.config, option):
                continue
            ours = getattr(self.config, option)
            if wrapper.__dict__.get("_clip_follows_config") or wrapper.clip == CLIP:
                wrapper.clip = ours
            elif ours == CLIP:
                setattr(self.config, option, float(wrapper.clip))
            elif wrapper.clip != ours:
                raise UserError(f"This env's {wrapper_type.__name__} clips at {wrapper.clip} and the model's {option} "
                                f"is {ours}: give one value (or leave one at {CLIP:g}).")
            wrapper._clip_follows_config = True

    @property
    def _obs_clip(self) -> float:
        """The clip of normalised observations (`normalize_obs_clip`; SB3's default for configs without it)."""
        return getattr(self.config, "normalize_obs_clip", CLIP)

    def act(self, obs: torch.Tensor, deterministic: bool = True,
            action_masks: torch.Tensor | None = None) -> torch.Tensor:
        """Actions for raw observations `obs` (a tensor; moved to the model's device if it is elsewhere, float64 taken
        as float32), as the env expects them, on the model's device; `deterministic=False` samples the policy.
        `action_masks`: bool `[N, n]` (an env's `info["action_mask"]`); a masked action is never chosen."""
        deterministic = true_or_false("deterministic", deterministic)
        check_acting_batch(obs, self.spec.observation_space, "act")
        if action_masks is not None and not isinstance(action_masks, torch.Tensor):
            raise UserError(f"act takes action_masks as a bool tensor [N, n], not a {type(action_masks).__name__}; "
                            "predict(obs, action_masks=...) takes numpy arrays and lists.")
        obs = map_obs(lambda value: acting_input(value, self.device), obs)
        if action_masks is not None:
            action_masks = action_masks.to(self.device, torch.bool)
        return self._checked_actions(obs, deterministic, action_masks)

    def _checked_actions(self, obs: Observation, deterministic: bool,
                         action_masks: torch.Tensor | None) -> torch.Tensor:
        """`act` for observations and masks already checked, on the model's device in their dtypes (what `act` and
        `predict` make of their arguments): each check runs once per call."""
        with acting(self.policy):
            if self.obs_rms is not None:
                obs = self.obs_rms.normalize(obs, self._obs_clip)
            if action_masks is None:
                return self._policy_actions(obs, deterministic)
            if not self.supports_action_masks:
                raise UserError(f"{type(self).__name__} does not take action masks: drop action_masks, or use "
                                f"{_algorithms_taking(lambda algo: algo.supports_action_masks)}.")
            return self._policy_actions(obs, deterministic, action_masks=action_masks)

    @property
    def observation_space(self) -> gym.Space:
        """The env's observation space, as the model takes observations (Stable-Baselines3's attribute)."""
        return self.spec.observation_space

    @property
    def action_space(self) -> gym.Space:
        """The env's action space, as `predict` returns actions (Stable-Baselines3's attribute)."""
        return self.spec.action_space

    @typing.overload
    def predict(self, observation: torch.Tensor | typing.Mapping[str, torch.Tensor],
                state: tuple[np.ndarray | torch.Tensor, ...] | None = None,
                episode_start: ArrayLike | torch.Tensor | None = None, deterministic: bool = True,
                action_masks: ArrayLike | torch.Tensor | None = None) -> tuple[torch.Tensor, None]: ...

    @typing.overload
    def predict(self, observation: ObservationLike, state: tuple[np.ndarray | torch.Tensor, ...] | None = None,
                episode_start: ArrayLike | torch.Tensor | None = None, deterministic: bool = True,
                action_masks: ArrayLike | torch.Tensor | None = None) -> tuple[np.ndarray, None]: ...

    def predict(self, observation: ObservationLike, state: tuple[np.ndarray | torch.Tensor, ...] | None = None,
                episode_start: ArrayLike | torch.Tensor | None = None, deterministic: bool = True,
                action_masks: ArrayLike | torch.Tensor | None = None) -> tuple[np.ndarray | torch.Tensor, None]:
        """SB3-style: actions for one observation or a batch. Returns (actions, None): for one observation with
        Discrete actions a numpy integer (SB3: a 0-d array), which any env's `step` takes.

        Accepts numpy arrays, lists or tensors (for Dict observations, a dict of them per key, as the env gives them);
        numpy in gives numpy out, a tensor in gives a tensor out. `deterministic` (True by default, where SB3's is
        False): the policy's most likely action; False samples one. `state` and `episode_start` are SB3's recurrent
        arguments: RecurrentPPO takes them (its `predict`), the others take None. `action_masks` (sb3-contrib's
        `MaskablePPO`): one bool flag per action, `[n]` or `[N, n]` (MultiDiscrete: the components' flags
        concatenated); a masked action is never chosen.
        """
        deterministic = true_or_false("predict(deterministic=...)", deterministic)
        obs, as_numpy, single = as_observation_batch(observation, self.spec.observation_space, self.device,
                                                     self.spec.observation_layout)
        masks = self._check_masks(action_masks, obs_batch_size(obs))
        actions = self._checked_actions(obs, deterministic, masks)
        if as_numpy:
            return self._host_actions(actions, single), None
        return (actions[0] if single else actions), None

    def _host_actions(self, actions: torch.Tensor, single: bool = False) -> np.ndarray:
        """`predict`'s actions (`[N, ...]`; `single`: the first row alone) as numpy, members of the action space: Box
        actions in the space's dtype, clipped in it, as the env receives them (float32 actions clipped to float32
        bounds can lie just past float64 ones: 0.1 as float32 is above 0.1); a Discrete action for one observation as
        a numpy integer, not a 0-d array, which envs that index a table with it (FrozenLake, CliffWalking: `P[s][a]`)
        cannot hash. (The row is taken in numpy: a tensor index costs a torch call.)"""
        array, space = actions.cpu().numpy(), self.spec.action_space  # ok-sync: predict returns to the host
        if isinstance(space, gym.spaces.Box) and array.dtype != space.dtype:
            array = np.clip(array.astype(space.dtype), space.low, space.high)
        return array[0] if single else array

    def _check_masks(self, action_masks, num: int) -> torch.Tensor | None:
        """`predict`'s action masks as a bool tensor `[num, n]` on the model's device (None stays None); UserError in
        one sentence for a mask of the wrong shape or a row that allows no action (read on the host: predict returns
        there anyway)."""
        if action_masks is None:
            return None
        host = action_masks.cpu().numpy() if isinstance(action_masks, torch.Tensor) else action_masks  # ok-sync
        return host_tensor(check_action_masks(host, self.spec.action_space, num, "predict(action_masks=...)"),
                           self.device)

    def _tensorboard_run(self, run_dir: str | os.PathLike | None, tb_log_name: typing.Any,
                         new_run: bool) -> tuple[str | os.PathLike | None, str]:
        """`learn`'s run directory and the run's name: `tb_log_name`, by default the algorithm's (as SB3's learn
        defaults it; a callback's `self.locals["tb_log_name"]`). The directory is `run_dir` where given, else the
        model's `tensorboard_log`'s next run as SB3 numbers them (`tensorboard_run_dir`, by that name; under several
        processes rank 0's choice, known to every rank), else None. UserError for a `tb_log_name` that names nothing
        (no tensorboard_log, or a run_dir given too), or a tensorboard_log whose events the tensorboard package is not
        installed to write."""
        if tb_log_name is not None and not (isinstance(tb_log_name, str) and tb_log_name.strip()
                                            and os.sep not in tb_log_name and "/" not in tb_log_name):
            raise UserError(f"learn's tb_log_name names a run (a directory's name, no path), not {tb_log_name!r}.")
        name = tb_log_name or _owner_name(self.config_cls)
        if run_dir is not None:
            if tb_log_name is not None:
                raise UserError(f"learn(run_dir=..., tb_log_name={tb_log_name!r}): tb_log_name names a run under the "
                                "model's tensorboard_log, and run_dir is the run's directory itself: give one of them.")
            return run_dir, name
        # (also one set on the model since, as SB3's users do; a model pickled before the attribute has none)
        log = check_tensorboard_log(self.__dict__.get("tensorboard_log"))
        if log is None:
            if tb_log_name is not None:
                raise UserError(f"learn's tb_log_name={tb_log_name!r} names a run under the model's tensorboard_log, "
                                f"and this model has none: make it with {type(self).__name__}(env, "
                                "tensorboard_log=DIR), or give learn the run's directory, learn(run_dir=DIR).")
            return None, name
        if importlib.util.find_spec("tensorboard") is None:
            raise UserError(f"tensorboard_log={log!r} asks for TensorBoard events, and the tensorboard package is not "
                            "installed: pip install tensorboard (or make the model without tensorboard_log; "
                            "learn(run_dir=DIR) writes metrics.csv alone).")
        # (every rank takes rank 0's number: a rank listing the folder after rank 0 made the run would pick the next)
        chosen = os.fspath(tensorboard_run_dir(log, name, new_run)) if self.strategy.is_main else None
        return Path(self.strategy.broadcast_text(chosen)), name

    def learn(self, total_timesteps: int, callback: CallbackLike = None, progress_bar: bool | None = None,
              target_return: float | None = None, eval_freq: int | None = None, eval_episodes: int = 10,
              run_dir: str | Path | None = None, log_interval_s: float | None = None,
              checkpoint_freq: int | None = None,
              confirm_target: bool = True, checkpoint_interval_s: float | None = None,
              **stable_baselines3: typing.Any) -> Self:
        """Train for `total_timesteps` env steps (or until `target_return` is reached in evaluation); 0 (SB3's
        `learn(0)`, a loop's call whose budget is spent) returns the model as it is: nothing trains, no callback runs.

        `progress_bar`: training's progress on stderr (False: learn prints nothing; None: the model's `verbose`
        decides, a bar unless it is 0).
        `callback`: a `rlspeed.callbacks.BaseCallback`, a list of them, or a function `fn(locals_dict)` called after
        every iteration; returning False stops training at the end of that iteration (docs/callbacks.md: the points
        where callbacks run; their time is excluded from the training clock; under torch.distributed they run on
        rank 0). With a target, the policy is evaluated (deterministic, `eval_episodes` episodes, separate env) every
        `eval_freq` steps (default: a 40th of `total_timesteps`, at least 2,048: at the end of the first iteration at
        or past each multiple of it of the model's step count, as `checkpoint_freq` and the callbacks' periods act),
        with evaluation time excluded from the training clock. An evaluation that reaches the target
        is confirmed on fresh episodes (other seeds; `confirm_target=False` skips it) and training stops only if
        that one reaches it too, so the model it stops with meets the target on new episodes. Without a target, an
        `eval_freq` given evaluates as often (an evaluation curve; nothing stops). Results land in `self.result`,
        also when learn raises (KeyboardInterrupt included): it then holds the steps of the finished iterations (as
        `num_timesteps` counts them: an iteration cut short is not counted) and the training time so far. A
        further learn() call goes on from where the last one stopped: its step count, the envs' episodes in progress
        (after a call cut short inside a rollout, or where something else stepped or reset its env object since, such
        as another model given the same env: from a reset) and, off-policy, the replay buffer; its schedules
        (`anneal_lr`, `anneal_clip`, DQN's exploration) run again over its own steps, or, with Stable-Baselines3's
        `reset_num_timesteps=False`, over the model's whole step count from 0 as SB3's do.

        Metrics (steps/s, episode returns, losses) are read once per `log_interval_s` seconds; by default every
        second and, with `run_dir`, also at least 50 times over a call of 50 iterations or more. With `run_dir` each
        reading is a row of `run_dir/metrics.csv` (the last iterations before a stop a callback or signal asked for
        included); a `run_dir` holding another run's metrics.csv is refused (a model continues only the run it
        trained in or was loaded from, or the one the saved model last trained in), not one without rows (a call
        stopped before its first row left it).
        Without `run_dir`, a model made with Stable-Baselines3's `tensorboard_log=DIR` writes its run in
        `DIR/<tb_log_name>_N` (Stable-Baselines3's learn keyword, by default the algorithm's class name), N numbered
        as SB3 numbers its runs: one past the largest there, or with `reset_num_timesteps=False` the largest, which
        the call continues.

        Right after `resume`, training continues where the checkpoint's run was: its random generators, native envs,
        next evaluation and checkpoint steps; `steps_to_target` and `time_to_target_s` count from that run's start.
        The numerics guard (`rlspeed.numerics`) checks once per log interval and before every checkpoint.

        With `run_dir`, `run_dir/checkpoint.safetensors` is written every `checkpoint_freq` env steps and at the
        end (the budget spent, the target reached or a callback's stop), and, with `checkpoint_interval_s` (one
        process), also once that many seconds have passed since the last one, or 20 times the last save's duration
        if that is longer (saving then takes at most 5% of the time): what a crash loses is bounded in time
        whatever the budget.
        """
        # (the caller's, given back wherever an interrupt lands, a notebook's stop button included: one inside a
        # `torch.no_grad()` block would leave grad mode off for the process)
        threads_before, grad_before = torch.get_num_threads(), torch.is_grad_enabled()
        dtype_before = torch.get_default_dtype()
        # SB3's way to continue a model's run (the step count goes on here anyway): its schedules then span the
        # model's whole step count, from 0, as SB3's progress_remaining does
        whole_count_schedules = stable_baselines3.get("reset_num_timesteps", True) is False
        if whole_count_schedules:
            del stable_baselines3["reset_num_timesteps"]
        tb_log_name = stable_baselines3.pop("tb_log_name", None)
        refuse_learn_keywords(stable_baselines3, self.config_cls, f"{type(self).__name__}(env", Algorithm.learn,
                              f"{type(self).__name__}.load(path")
        _refuse_sb3_positionals(progress_bar, target_return)
        verbose = check_verbose(self.verbose)  # (also one set on the model since, as SB3's users set it)
        if progress_bar is None:
            progress_bar = verbose >= 1
        (total_timesteps, eval_freq, eval_episodes, checkpoint_freq, progress_bar,
         confirm_target) = checked_learn_values(total_timesteps, target_return, eval_freq, eval_episodes,
                                                checkpoint_freq, progress_bar, confirm_target, zero_steps=True)
        log_interval_s = seconds("log_interval_s", log_interval_s)
        checkpoint_interval_s = seconds("checkpoint_interval_s", checkpoint_interval_s)
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
            raise UserError(f"run_dir is a directory's path (a str or pathlib.Path), not {run_dir!r}.")
        tensorboard_run = run_dir is None  # (a run under tensorboard_log, where that gives one: refused in its words)
        run_dir, tb_log_name = self._tensorboard_run(run_dir, tb_log_name, new_run=not whole_count_schedules)
        if checkpoint_freq is not None and run_dir is None:  # (as a population's learn says it)
            raise UserError(f"checkpoint_freq={checkpoint_freq} needs a run_dir to write the checkpoints to "
                            "(learn(..., run_dir=DIR)), or a CheckpointCallback.")
        if run_dir is not None:  # (absolute, "~" expanded: every file of the run in one directory, also after a
            run_dir = local_path(run_dir).absolute()  # chdir during learn)
        evaluates = target_return is not None or eval_freq is not None  # (on fresh envs made from the id)
        # a loaded model (no env here) of an id nothing here registered: where its file records the modules that do,
        # said before anything else; where it evaluates, said now, not after the first rollout
        if self._env is None and self.env_id not in (USER_VECTOR_ENV, USER_SB3_VEC_ENV) and (
                recorded_modules_advice(self) or (evaluates and not remakeable(self.env_id))):
            raise UserError(unregistered_id_refusal(self, "or give it an env you built: "
                                                          f"{type(self).__name__}.load(path, env=env)"))
        if evaluates and not remakeable(self.env_id):  # (an env built and passed in)
            asked = "target_return" if target_return is not None else "eval_freq"
            raise UserError(f"learn({asked}=...) evaluates on fresh envs made from the env id, and "
                            f"'{self.env_id}' (an env built and passed in) is no id rlspeed can make an env of: "
                            "evaluate on "
                            "an env you build with callback=EvalCallback(eval_env"
                            + (", callback_on_new_best=StopTrainingOnRewardThreshold(target)" if target_return
                               is not None else "") + ") from rlspeed.callbacks (an env of your own can also be "
                            "registered with gymnasium.register when it is a gymnasium.Env).")
        if evaluates:
            from rlspeed.evaluation import check_evaluation_env, warn_target_without_time_limit

            check_evaluation_env(self, self.env_id)
            warn_target_without_time_limit(self.spec, target_return)
        from rlspeed.callbacks import as_callback

        callbacks = as_callback(callback)
        main = self.strategy.is_main  # only rank 0 logs, evaluates for the target and writes files
        if run_dir is not None and main and holds_metrics(run_dir) and not self._continues(run_dir):
            left_at = self.__dict__.get("_left_runs", {}).get(Path(run_dir).resolve())
            if tensorboard_run and left_at is None:  # (the last run, which reset_num_timesteps=False continues)
                raise UserError(f"'{run_dir}', the last run under tensorboard_log, which learn(..., "
                                "reset_num_timesteps=False) continues, holds the metrics.csv of another run, which "
                                "this model did not train in (a model continues the run it, or the model it was loaded "
                                "from, last trained in): learn without reset_num_timesteps=False writes the next run "
                                f"'{tensorboard_run_dir(self.tensorboard_log, run_dir.name.rpartition('_')[0])}'.")
            refuse_other_metrics(run_dir, "model", self.num_timesteps, self._run_dir, left_at)
        self._check_parameters_held()
        # values set on model.config since the model was built, taken and checked as the constructor takes and checks
        # them (an SB3 noise object or a misspelt choice for TD3's action_noise trained with no noise)
        coerce_in_place(self.config)
        self.config.validate()
        self._check_built_settings()
        self._check_schedule_functions()
        if total_timesteps == 0:  # (SB3's learn(0), a loop's last call whose budget is spent: the model as it was)
            self.result, self._total_timesteps = LearnResult(target_return=target_return), self.num_timesteps
            return self
        if run_dir is not None:
            if self._run_dir is not None and self._run_dir != Path(run_dir).resolve() and self.num_timesteps:
                # (the step its rows there end at; a model pickled before the attribute has none)
                self.__dict__.setdefault("_left_runs", {})[self._run_dir] = self.num_timesteps
            self._run_dir = self._trained_run = Path(run_dir).resolve()
        if not self.strategy.enabled:  # (a user's script under torchrun that left strategy= out)
            warn_training_alone(f"{type(self).__name__} without a strategy",
                                "pass strategy=rlspeed.distributed.DistributedStrategy() to train one run across them")
        # (from here on, also when interrupted before training began: this call's result, not the previous one's)
        result = self.result = LearnResult(target_return=target_return)
        # float32 tensors while it trains, also where the caller made float64 torch's default dtype, and gradients
        # with tensors autograd can train, also inside the caller's torch.no_grad() or torch.inference_mode() (a
        # helper wrapped in one); set here, in learn's own frame (a wrapper's frame would be where learn's warnings
        # point), the caller's given back on every way out
        torch.set_default_dtype(torch.float32)
        self._enter_streams()
        # (left on every way out, `training_contexts.close()` in the except and finally blocks below:
        # inference_mode(False) turns gradients on, also inside no_grad, its exit giving back the grad mode it found;
        # an env's close() error, an evaluation env's say, is kept and raised once training is done and saved,
        # `CloseErrors`)
        training_contexts = contextlib.ExitStack()
        training_contexts.enter_context(torch.inference_mode(False))
        close_errors = training_contexts.enter_context(CloseErrors())
        logger = bar = None
        try:
            env = self.make_training_env()
            # a model that has trained before (resume, a restart, a further learn) continues its run's metrics.csv
            columns = (("eval_mean", "eval_unfinished") if target_return is not None or eval_freq is not None
                       else ()) + (
                ("eval_confirm_mean", "eval_confirm_unfinished") if target_return is not None and confirm_target
                else ())
            logger = (RunLogger(run_dir, continue_from=self.num_timesteps if self.num_timesteps else None,
                                columns=columns, kept=self._tensorboard) if run_dir is not None and main else None)
            self._total_timesteps = self.num_timesteps + int(total_timesteps)
            resume = self._resume
            self._follow_env_moves(env)
            self._follow_replaced_optimizers()
            self._follow_frozen_parameters(learn_start=True)
            try:
                # Setting up runs on the model's threads too: a replay buffer's allocation (a large fill) on the
                # caller's count started torch's OpenMP threads, and a process forked after that (a sweep's Pool
                # worker) hung at its first parallel operation.
                set_training_threads(self.num_threads)
                self._start(env, int(total_timesteps))  # (after `resume`: `_first_obs` continues the saved episodes)
            except BaseException as error:  # (an env whose reset raises, an interrupt)
                if isinstance(error, KeyboardInterrupt):
                    self._learn_interrupted = True
                torch.set_num_threads(threads_before)
                torch.set_grad_enabled(grad_before)
                if logger is not None:  # (its TensorBoard writer's thread, which each such call left running)
                    logger, closed = None, logger
                    _close_logger(closed, raising=True,
                                  plot=self._curve_on_stop or not isinstance(error, KeyboardInterrupt))
                raise
            self._follow_learning_rate()
            # Schedules (PPO's learning-rate and clip annealing, DQN's epsilon) run from `_learn_start` to
            # `_schedule_end`: over this call, or, right after `resume`, over the run the checkpoint was saved from,
            # or, with reset_num_timesteps=False, over the model's whole step count.
            self._learn_start, self._schedule_end = self.num_timesteps, self._total_timesteps
            resumed_schedule, self._resumed_schedule = getattr(self, "_resumed_schedule", None), None
            if resumed_schedule is not None:  # (a bigger budget than the interrupted run's stretches it to the new end)
                self._learn_start = resumed_schedule[0]
                self._schedule_end = max(resumed_schedule[1], self._total_timesteps)
            if whole_count_schedules:
                self._learn_start, self._schedule_end = 0, self._total_timesteps
            self._schedule_open = True
            saved_loop = resume["meta"].get("loop", {}) if resume is not None else {}
            # evaluations at each multiple of eval_freq steps: for a target, or because eval_freq was asked for (a
            # resumed run keeps its own choice)
            evaluating = target_return is not None or eval_freq is not None or bool(saved_loop.get("evaluating"))
            if eval_freq is None:
                eval_freq = saved_loop.get("eval_freq") or default_eval_freq(total_timesteps)
            per_iteration = self.steps_per_iteration  # (learn trains whole iterations: the bar counts what they add to)
            # the run's start, for steps_to_target and time_to_target_s: this call's, or the resumed run's (whose steps
            # so far the bar starts from: it counts the whole run, as metrics.csv does)
            run_start = int(saved_loop.get("run_start", self.num_timesteps))
            so_far = self.num_timesteps - run_start if resume is not None else 0
            bar = ProgressBar(so_far + -(-int(total_timesteps) // per_iteration) * per_iteration,
                              enabled=progress_bar and main, desc=f"{self.name} {self.env_id}", initial=so_far)
            global_steps: dict[int, int] = {}  # env steps of one iteration summed over ranks, per local count
            pending: dict[str, list[torch.Tensor]] = {}  # each metric's device values since the last log, summed then
            iterations = 0
            clock_offset = float(saved_loop.get("train_wall_s", 0.0)) if resume is not None else 0.0
            # metrics.csv's clock column goes on over further learn() calls of one model, as its step count does (their
            # training time before this call's run_start; the clock of summary.json and time_to_target_s is the run's)
            earlier = (saved_loop if resume is not None else self._loop) if self.num_timesteps else {}
            clock_before = float(earlier.get("clock_before", 0.0)) + (
                float(earlier.get("train_wall_s", 0.0)) if resume is None else 0.0)
            start_steps = self.num_timesteps
            # the next evaluation and checkpoint, at multiples of their frequencies of the step count (`next_due`): as
            # the run this call continues (a resume's checkpoint, a further learn's call before) had them (one it had
            # not made yet at its step count, due then, is made at the first iteration's end)
            next_eval = resumed_due(earlier, "eval", eval_freq, self.num_timesteps)
            next_checkpoint = (resumed_due(earlier, "checkpoint", checkpoint_freq, self.num_timesteps)
                               if checkpoint_freq else None)
            # the step count every callback last ran at (`on_rollout_end`), and each one's (`CallbackRuns`), from
            # which their periods count at training start: where the run this call continues (a resume, a further
            # learn) counted an iteration whose callbacks did not run, or not all of them (a crash after its
            # checkpoint, an interrupt before or in them), an action it owed is due at once, as learn's own are
            callbacks_at = min(int(earlier.get("callbacks_at", self.num_timesteps)), self.num_timesteps)
            self._loop = {"run_start": run_start, "eval_freq": eval_freq, "next_eval": next_eval,
                          "checkpoint_freq": checkpoint_freq, "next_checkpoint": next_checkpoint,
                          "train_wall_s": clock_offset, "evaluating": evaluating and target_return is None,
                          "clock_before": clock_before, "callbacks_at": callbacks_at}
            self._callback_runs = (CallbackRuns(callbacks, earlier, self.num_timesteps)
                                   if callbacks is not None and main else None)
            if self._callback_runs is not None:  # (the list itself: a save a callback makes holds it as it stands)
                self._loop["callbacks_ran_at"] = self._callback_runs.at
            guarded = self._guarded_tensors() if self._numerics.enabled else {}
            if self._numerics.enabled:
                self._numerics.snapshot(guarded, self.num_timesteps)  # the first "last good" state
            last_log_time, last_log_steps = time.perf_counter(), self.num_timesteps
            last_check_time = last_log_time
            # a metrics row every `log_interval_s` seconds; by default every second and, with a run_dir, at least
            # ROWS_PER_LEARN rows over a call of that many iterations or more (a short run's curve in metrics.csv)
            row_iterations = (max(1, -(-int(total_timesteps) // self.steps_per_iteration) // ROWS_PER_LEARN)
                              if log_interval_s is None and run_dir is not None else math.inf)
            log_interval_s = 1.0 if log_interval_s is None else log_interval_s
            last_checkpoint_time, checkpoint_cost = last_log_time, 0.0  # (`checkpoint_interval_s`)
            timed_checkpoints = checkpoint_interval_s is not None and run_dir is not None and not self.strategy.enabled
            train_clock = 0.0
            clock_start = time.perf_counter()
            # where the training clock stopped (an evaluation, callbacks, a row's reading: not training time), None
            # while it runs: an interruption there adds only the time up to it
            paused_at = None
            # busy seconds from here until the note on envs that wait is decided (`waiting_advice`); None: not asked
            switch = self._waiting_switch(env)
            waiting_from = waiting.busy_seconds() if switch is not None else None
            stop = False
            # after a stop that no row followed (a callback's, a signal's): one more pass through the logging, without
            # training, so that the steps since the last row are in metrics.csv
            closing = False
            # (that pass's row, or the last row as values the last iteration's callbacks recorded joined it: callbacks
            # get it at training end, a tracker's as metrics.csv has it)
            closing_row = None
            callback_stop = False  # a callback's on_evaluation asked to stop (acted on at the end of the iteration)
            checkpointed = None  # (the step count of this call's last checkpoint)
            callbacks_started = False  # (an error from then on reaches them: `on_training_error`)

            def record_loop() -> None:  # (where the run stands, for the checkpoint a save writes and for the result)
                self._loop.update(next_eval=next_eval, next_checkpoint=next_checkpoint, callbacks_at=callbacks_at,
                                  train_wall_s=clock_offset + train_clock, **result.reached())

            flushed_before = flush_denormal_enabled()  # (the caller's, given back in the finally below)
        except BaseException as error:  # (also after `_start`, which left the model's thread count set)
            self._end()
            if bar is not None:  # (drawn: closed, which also gives back Python's display of warnings)
                bar.close()
            training_contexts.close()
            self._leave_streams()
            torch.set_num_threads(threads_before)
            torch.set_grad_enabled(grad_before)
            torch.set_default_dtype(dtype_before)
            if logger is not None:  # (an error between `_start` and training: the logger `_start`'s own errors close)
                _close_logger(logger, raising=True,
                              plot=self._curve_on_stop or not isinstance(error, KeyboardInterrupt))
            raise
        raising = interrupted = False
        try:  # (everything from here on restores the process's denormal setting and closes the logger, even on error)
            set_training_threads(self.num_threads)  # (the model's, evaluations included)
            set_flush_denormal(True)  # CPU arithmetic on denormal floats is tens of times slower
            if resume is not None:
                self._apply_resume(resume)  # last: the random generators as the checkpoint's run left them
            self._resume = None  # (from here the model is the resumed run's, whole: an interruption saves it)
            if callbacks is not None and main:
                from rlspeed.callbacks import LearnLocals

                callbacks.init_callback(self)
                callbacks_started = True
                # (their `self.locals["total_timesteps"]` is Stable-Baselines3's: the step count this call trains to,
                # the model's steps before it plus its budget, which a callback's progress reads)
                callbacks.on_training_start(LearnLocals.of(locals(), total_timesteps=self._total_timesteps))
                self._follow_replaced_optimizers()  # (an optimizer a callback put in place)
                self._follow_frozen_parameters()  # (a layer a callback froze)
            while closing or (self.num_timesteps < self._total_timesteps and not stop):
                logged = None  # the metrics row, when this iteration ends a log interval (callbacks get it)
                if not closing:
                    if callbacks is not None and main:
                        paused = paused_at = time.perf_counter()  # (as after the iteration: not training time)
                        callbacks.on_rollout_start()
                        paused, paused_at = time.perf_counter() - paused, None
                        clock_start += paused
                        last_log_time += paused
                    steps, metrics = self._train_iteration()
                    for rms in getattr(self, "_synced_stats", ()):
                        rms.flush()
                    if steps not in global_steps:
                        summed = self.strategy.all_reduce_sum(torch.tensor([steps], device=self.device))
                        global_steps[steps] = int(summed.item())  # ok-sync: once per learn() call
                    self.num_timesteps += global_steps[steps]
                    iterations += 1
                    for key, value in metrics.items():  # (a subclass's metric may be a plain number)
                        pending.setdefault(key, []).append(value if isinstance(value, torch.Tensor)
                                                           else torch.as_tensor(float(value), device=self.device))
                now = time.perf_counter()
                finished = self.num_timesteps >= self._total_timesteps
                eval_due = evaluating and not closing and (self.num_timesteps >= next_eval or finished)
                checkpoint_due = not closing and (
                    (next_checkpoint is not None and self.num_timesteps >= next_checkpoint and run_dir is not None)
                    or (timed_checkpoints and now - last_checkpoint_time
                        >= max(checkpoint_interval_s, 20 * checkpoint_cost)))
                # Under torch.distributed every rank must take part in the same collectives: log every iteration.
                if (now - last_log_time >= log_interval_s or iterations >= row_iterations
                        or eval_due or finished or checkpoint_due or closing or self.strategy.enabled):
                    # the numerics guard reads with the metrics: per log interval, and before an evaluation, a
                    # checkpoint or the caller (after a stop) sees the parameters
                    check = self._numerics.enabled and (now - last_check_time >= log_interval_s or eval_due
                                                        or finished or checkpoint_due or closing)
                    with phase("metrics"):
                        sums = {key: values[-1] if len(values) == 1 or key in self.current_metrics
                                else torch.stack(values).sum(0) for key, values in pending.items()}
                        counts = {key: 1 if key in self.current_metrics else len(values)
                                  for key, values in pending.items()}
                        if check:
                            guarded = self._guarded_tensors()
                        extra = self._numerics.device_values(guarded, self.device) if check else None
                        row = self._read_metrics(sums, counts, extra)  # the one host sync per log interval
                        self._check_metrics(row)
                        numerics = row.pop("_numerics", None)
                        finite_checked = False  # (this row's parameters checked and finite: its losses are read)
                        if numerics is not None:
                            rolled_back = self._numerics.after_read(numerics, guarded, self.env_id,
                                                                    self.num_timesteps)
                            finite_checked = not rolled_back
                            if rolled_back:
                                # (episodes a diverged policy may have made non-finite)
                                self._obs, reset_info = env.reset()
                                self._action_mask = reset_info.get("action_mask")
                                self._on_env_reset()
                            last_check_time = now
                    train_clock += now - clock_start
                    clock_start = paused_at = now
                    if waiting_from is not None and train_clock >= waiting.MEASURED_S:
                        waiting.note_if_waiting(self.env_id, waiting.busy_seconds() - waiting_from, train_clock,
                                                self.num_timesteps - start_steps, env.num_envs, switch)
                        waiting_from = None
                    sps = (self.num_timesteps - last_log_steps) / max(now - last_log_time, 1e-9)
                    # (a resumed run's rows go on from the interrupted run's training clock, as its step count does)
                    row.update(timesteps=self.num_timesteps, train_wall_s=clock_before + clock_offset + train_clock,
                               sps=sps)
                    if (rate := self._current_learning_rate()) is not None:
                        row["learning_rate"] = rate
                    if self._n_updates and self._n_updates_known:  # (none before an off-policy learning_starts)
                        row["n_updates"] = self._n_updates
                    row.update(self.recorder.take(row))  # (callbacks' `logger.record` values since the last row)
                    if eval_due:
                        reached = False
                        if main:
                            try:
                                evaluation = self.evaluate(episodes=eval_episodes, seed=self._eval_seed())
                                row["eval_mean"] = evaluation["mean"]
                                # (the episodes still running at the step limit, counted with their return so far: the
                                # warning of them shows once, each row says it of its evaluation)
                                row["eval_unfinished"] = evaluation.get("unfinished", 0)
                                result.unfinished.append(row["eval_unfinished"])
                                if "success_rate" in evaluation:
                                    row["eval_success_rate"] = evaluation["success_rate"]
                                result.evaluations.append((self.num_timesteps, clock_offset + train_clock,
                                                           evaluation["mean"]))
                                reached = target_return is not None and evaluation["mean"] >= target_return
                                if reached and confirm_target:
                                    # The target holds only if fresh episodes (other seeds) also reach it: one lucky
                                    # evaluation does not end training with a model below the threshold.
                                    confirming = self.evaluate(episodes=eval_episodes,
                                                               seed=self._eval_seed("confirm"))
                                    row["eval_confirm_mean"] = confirming["mean"]
                                    row["eval_confirm_unfinished"] = confirming.get("unfinished", 0)
                                    result.confirmations.append((self.num_timesteps, confirming["mean"]))
                                    result.confirmations_unfinished.append(row["eval_confirm_unfinished"])
                                    reached = confirming["mean"] >= target_return
                                    if reached:
                                        result.target_confirmation = {
                                            "mean": confirming["mean"], "episodes": confirming["episodes"],
                                            "unfinished": row["eval_confirm_unfinished"]}
                                if callbacks is not None and not callbacks.on_evaluation(evaluation):
                                    callback_stop = True
                            except KeyboardInterrupt:
                                # (a Ctrl-C while evaluating: the steps trained since the last row, which
                                # num_timesteps and a checkpoint have, keep their row in metrics.csv, without the
                                # columns of an evaluation that did not finish)
                                if logger is not None:
                                    logger.log(row)
                                raise
                        # (the next one, once this one is done: one an interrupt cut short stays due, in the
                        # checkpoint the interrupted run saves)
                        next_eval = next_due(self.num_timesteps, eval_freq)
                        if self.strategy.broadcast_flag(reached):
                            result.time_to_target_s = clock_offset + train_clock
                            result.steps_to_target = self.num_timesteps - run_start
                            stop = True
                    if numerics is None or finite_checked:  # (a row's losses: not those of a rolled-back stretch)
                        self._numerics.check_losses(row, self.num_timesteps, checked=finite_checked)
                    bar.update(self.num_timesteps - last_log_steps, sps=int(sps), ret=row.get("episode_return"),
                               success=row.get("success_rate"), eval=bar_evaluation(row, eval_episodes))
                    if verbose >= 2 and progress_bar and main:  # (the row as metrics.csv gets it, its step count
                        # first; learn(progress_bar=False) silences the call, rows too)
                        print_beside_bars(metrics_line(self.name, row), file=sys.stderr)
                    if logger is not None:
                        logger.log(row)
                    logged = row
                    pending, iterations = {}, 0
                    last_log_time, last_log_steps = time.perf_counter(), self.num_timesteps
                    clock_start, paused_at = time.perf_counter(), None
                if closing:
                    closing_row = logged
                    break
                # and at the run's end (its budget, or its target reached): --resume with a larger budget goes on
                # from there, not from the last periodic checkpoint
                # (timed checkpoints: where one was written, the end gets one too, so that it is never older than
                # the model a finished run saves)
                at_end = next_checkpoint is not None or (timed_checkpoints and checkpoint_cost > 0)
                if checkpoint_due or (at_end and run_dir is not None and (finished or stop)):
                    if checkpoint_freq:
                        next_checkpoint = next_due(self.num_timesteps, checkpoint_freq)
                    record_loop()
                    if main:
                        saving = time.perf_counter()
                        self.save(Path(run_dir) / "checkpoint.safetensors")
                        checkpoint_cost = time.perf_counter() - saving
                        checkpointed = self.num_timesteps
                        # a checkpoint is not training time (train_wall_s, sps), as an evaluation or a callback is not
                        clock_start += checkpoint_cost
                        last_log_time += checkpoint_cost
                    last_checkpoint_time = time.perf_counter()
                if callbacks is not None or self.stop_requested is not None:
                    paused = paused_at = time.perf_counter()  # (callbacks' evaluations are not training time)
                    if callbacks is not None and main:
                        # (a save a callback makes, CheckpointCallback's, holds where the run stands, with the
                        # callbacks that started at this iteration taken as run: `CallbackRuns`)
                        record_loop()
                        if not callbacks.on_rollout_end(LearnLocals.of(locals(), total_timesteps=self._total_timesteps),
                                                        logged):
                            callback_stop = True
                        self._callback_runs.all_ran(self.num_timesteps)
                    if callbacks is not None:
                        self._follow_replaced_optimizers()
                        self._follow_frozen_parameters()  # (a layer a callback froze, after a warm-up say)
                    # every rank stops where rank 0's callbacks (1), or a signal to any rank (2: `stop_requested`),
                    # ask to
                    asked = 2 if self.stop_requested is not None and self.stop_requested() else int(callback_stop)
                    asked = self.strategy.max_over_ranks(asked)
                    stop = stop or asked > 0
                    result.stop_requested = result.stop_requested or asked == 2
                    paused, paused_at = time.perf_counter() - paused, None
                    clock_start += paused
                    last_log_time += paused
                    closing = stop and iterations > 0  # (iterations since the last row)
                callbacks_at = self.num_timesteps
            # A callback's stop ends the run as its budget or target does, with a checkpoint of where it stopped (its
            # stop came after that iteration's checkpoint point): a resume goes on from there, not from the last
            # periodic one. (A stop a signal asked for too is saved by the caller: the CLI's interrupted run.)
            at_end = next_checkpoint is not None or (timed_checkpoints and checkpoint_cost > 0)
            if (callback_stop and not result.stop_requested and main and at_end and run_dir is not None
                    and checkpointed != self.num_timesteps):
                record_loop()
                self.save(Path(run_dir) / "checkpoint.safetensors")
        except BaseException as error:
            raising = True  # (a failure closing the logs then must not hide this one)
            # (a signal to the process group, Jupyter's stop button, reaches subprocess envs' workers too)
            self._learn_interrupted = interrupted = isinstance(error, KeyboardInterrupt)
            if callbacks_started:  # (a W&B run they began ends as failed, not left open for the next run to join)
                _tell_training_error(callbacks, error)
            raise
        finally:
            self._end()
            self._env_moves = getattr(find_episode_statistics(env), "moves", None)
            if iterations:  # (since the last row, up to where the clock stopped, if it did)
                train_clock += (time.perf_counter() if paused_at is None else paused_at) - clock_start
            # (also when learn raises, KeyboardInterrupt included: the model and its result say how far it got; first,
            # before the slow closing below (the learning curve's plot), which a second Ctrl-C or SIGTERM cuts short:
            # the checkpoint and summary.json an interruption writes then still hold the run's clock and schedule)
            record_loop()
            self._callback_runs = None  # (their counts stay in the loop, for a further learn or a checkpoint)
            # (this call's; right after `resume`, the resumed run's from its start, as steps_to_target and
            # time_to_target_s count and summary.json says)
            result.total_timesteps = self.num_timesteps - (run_start if resume is not None else start_steps)
            result.train_wall_s = clock_offset + train_clock
            result.sps = result.total_timesteps / max(result.train_wall_s, 1e-9)
            set_flush_denormal(flushed_before)
            training_contexts.close()
            self._leave_streams()
            torch.set_num_threads(threads_before)
            torch.set_grad_enabled(grad_before)
            torch.set_default_dtype(dtype_before)
            if self.num_timesteps > last_log_steps:  # (a call an exception ended: its bar shows where it stopped,
                bar.update(self.num_timesteps - last_log_steps)  # not the last metrics row, up to a second before)
            bar.close()
            if logger is not None:
                # (recorded by the last iteration's callbacks, after its row)
                pending = self.recorder.take(logger.last_row or ())
                if pending:
                    logger.amend_last(pending, self.num_timesteps)
                    closing_row = dict(logger.last_row)
                try:
                    _close_logger(logger, raising,
                                  plot=self._curve_on_stop or not (interrupted or result.stop_requested))
                except BaseException as error:  # (training done, its last rows unwritten: an error all the same)
                    if callbacks_started and not raising:
                        _tell_training_error(callbacks, error)
                    raise
        # (this call returned: a further one, or a resume from a save now, starts anew; unless a signal's stop request
        # cut it short, whose run the CLI saves to go on with --resume, as after an interrupt)
        self._schedule_open = result.stop_requested
        try:
            self._numerics.check_kept(start_steps, self.num_timesteps)  # (no update kept: not a silent success)
        except DivergedError as error:  # (learn raises after all: the callbacks hear of it, as of an error above)
            if callbacks_started:
                _tell_training_error(callbacks, error)
            raise
        if callbacks is not None and main:
            # (within the close() errors' block again: a tracker's end sees one kept, and ends as failed, as learn
            # does raising it below; one of the callbacks' own end is kept too, after every callback has ended)
            with close_errors:
                if closing_row is not None:
                    callbacks.set_final_metrics(closing_row)
                callbacks.on_training_end()  # (self.result is complete)
        close_errors.raise_first()
        return self

    def _continues(self, run_dir: str | Path) -> bool:
        """Whether `run_dir` is this model's own run: the one it last trained in, or the one it was loaded or resumed
        from, or the one the model it was loaded from last trained in (a model that has trained continues its run's
        metrics.csv there)."""
        return bool(self.num_timesteps) and Path(run_dir).resolve() in (self._run_dir,
                                                                        self.__dict__.get("_trained_run"))

    def _eval_seed(self, kind: str = "learn") -> int:
        """The env seed of `learn`'s evaluation of `kind` now (`evaluation_seed`: a population's member uses the
        same)."""
        from rlspeed.evaluation import evaluation_seed

        return evaluation_seed(self.seed, kind, self.num_timesteps)

    def _read_metrics(self, sums: dict[str, torch.Tensor], counts: dict[str, int],
                      extra: torch.Tensor | None = None) -> dict:
        """Average the device-side metric sums of a log interval over the iterations that reported each metric
        (`counts`), reading them back in one transfer; episode returns are averaged over finished episodes.
        `extra` (the numerics guard's vector) is read in the same transfer, as the row's `_numerics` list."""
        if not sums and extra is None:
            return {}
        keys = list(sums)
        # metrics of an env on another device than the model (a Gymnasium env's episode returns on the CPU, a model
        # on CUDA) join the model's device first, in float64 where it has it (the episode returns' sums are float64:
        # a float32 sum of returns near 1e6 keeps eighths)
        dtype = statistics_dtype(self.device)
        stacked = (self.strategy.all_reduce_sum(torch.stack([sums[k].to(self.device, dtype).reshape(())
                                                             for k in keys]))
                   if keys else torch.zeros(0, device=self.device, dtype=dtype))
        if extra is not None:  # (float64 where the device has it: step counts beyond float32's exact integers)
            stacked = torch.cat((stacked.to(extra.dtype), extra))
        values = stacked.cpu().tolist()  # ok-sync: once per log interval
        row = dict(zip(keys, values))
        if extra is not None:
            row["_numerics"] = values[len(keys):]
        count = row.pop("episode_count", 0.0)
        total = row.pop("episode_return_sum", math.nan)
        row["episode_return"] = total / count if count > 0 else math.nan
        if "success_count" in row:  # (envs that report info["is_success"])
            successes, finished = row.pop("success_sum"), row.pop("success_count")
            if row.pop("success_reported", 1.0) > 0:
                row["success_rate"] = successes / finished if finished > 0 else math.nan
        for key in keys:
            if key in row and key not in ("episode_return",):
                row[key] = row[key] / counts[key] / self.strategy.world_size
        return row

    def _export_module(self) -> torch.nn.Module:
        """The deterministic policy as a `rlspeed.export.PolicyExport` (raw observations in, env actions out, the
        normalisation and action mapping inside); an algorithm with another kind of policy overrides it."""
        return default_export_module(self)

    def export(self, path: str | Path, format: str | None = None, action_mask: bool | None = None) -> Path:
        """Write the deterministic policy to `path` in `format`, "onnx", "torchscript" or "exported_program" (None:
        the one the path's suffix names: .onnx, .pt, .pt2), with a sidecar
        `path + ".json"` naming inputs, outputs and spaces (docs/export.md); returns the path. `action_mask`: add an
        `action_mask` input (None: when this model trained with the env's action masks)."""
        return export_policy(self, path, format=format, action_mask=action_mask)

    def evaluate(self, episodes: int = 10, seed: int | None = None, env_id: str | None = None,
                 max_steps: int | None = None, deterministic: bool = True,
                 env_kwargs: dict[str, typing.Any] | None = None, progress_bar: bool = False,
                 **stable_baselines3: typing.Any) -> dict[str, typing.Any]:
        """Evaluation on a separate env, deterministic by default (see `rlspeed.evaluate`, whose dict it returns;
        `env_id`: the env to evaluate on, default the model's own; `max_steps` caps each episode; `deterministic=False`
        samples the policy, from a random stream `seed` seeds; `env_kwargs` replace options of the env, the recorded
        ones on the model's own id; `progress_bar`: a bar over the episodes). Runs on the model's `num_threads`, as
        `learn` and its evaluations do (a CPU's sums depend on the thread count: the same seed gives the same returns as
        the run's own evaluation); the caller's count is given back."""
        from rlspeed.evaluation import evaluate, refuse_evaluate_keywords

        refuse_evaluate_keywords(stable_baselines3, type(self).evaluate)
        if isinstance(episodes, str) or hasattr(episodes, "reset"):  # (an env where rlspeed.evaluate takes one)
            raise UserError(f"model.evaluate takes the number of episodes first, got {episodes!r}: "
                            "model.evaluate(episodes=N, env_id=ID) evaluates on a registered env, "
                            "rlspeed.evaluate(model, env, episodes=N) on an env of your own.")
        with training_threads(self.num_threads):
            return evaluate(self, env_id or self.env_id, episodes=episodes, seed=seed, max_steps=max_steps,
                            deterministic=deterministic, env_kwargs=env_kwargs, progress_bar=progress_bar)

    def _guarded_tensors(self) -> dict[str, torch.Tensor]:
        """The live tensors training changes, which the numerics guard checks and restores: module state (parameters,
        buffers, target networks), learnt lone tensors, normalisation statistics and per-parameter optimizer state."""
        tensors = self._state_tensors(learnt_only=True)  # a fixed lone tensor is a constant (-inf may be right)
        for name, optimizer in self._optimizers().items():
            params = [p for group in optimizer.param_groups for p in group["params"]]
            for index, param in enumerate(params):  # (the indices `Optimizer.state_dict` gives them)
                for key, value in optimizer.state.get(param, {}).items():
                    if isinstance(value, torch.Tensor):
                        tensors[f"optim.{name}.{index}.{key}"] = value
        return tensors

    # --- exact resume -------------------------------------------------------------------------------------------
    def _state_tensors(self, learnt_only: bool = False) -> dict[str, torch.Tensor]:
        """Networks (`_modules`, keys prefixed with their names), lone tensors (only those that learn, with
        `learnt_only`) and normalisation statistics, as a checkpoint names them."""
        tensors: dict[str, torch.Tensor] = {}
        for name, module in self._saved_modules().items():
            if isinstance(module, torch.Tensor):
                if module.requires_grad or not learnt_only:
                    tensors[name] = module.detach()
            else:
                tensors.update({f"{name}.{k}": v for k, v in module.state_dict().items()})
        for name, _ in _STATISTICS:
            rms = getattr(self, name, None)
            if rms is not None:
                tensors.update({f"{name}.{k}": v for k, v in rms.state_dict().items()})
        return tensors

    def _on_env_reset(self) -> None:
        """Called when the learn loop resets the training envs in the middle of a run (after a numerics rollback):
        per-episode state an algorithm carries (an LSTM state, pending n-step transitions, exploration noise) ends."""

    def _algorithm_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """An algorithm's own running state that exact resume needs besides networks and optimisers: (tensors, JSON
        values); see `_load_algorithm_state`."""
        return {}, {}

    def _load_algorithm_state(self, tensors: dict[str, torch.Tensor], values: dict) -> None:
        """Restore what `_algorithm_state` returned (called by the first learn() after `resume`, after `_start`)."""

    def _save_replay(self, path: Path, digest: str | None = None) -> dict | None:
        """Off-policy algorithms with `save_replay_buffer`: write the replay buffer beside the checkpoint `path` (with
        its `digest`) and return what the checkpoint records about it; None: nothing written."""
        return None

    def write_replay_buffer(self, path: str | os.PathLike[str], digest: str | None = None) -> Path:
        """Off-policy algorithms: write the replay buffer (its stored transitions, write position and the steps
        waiting for their n-step return) to the safetensors file `path` (`.safetensors` added when it has no
        suffix), for `load_replay_buffer`; returns the path written. `digest`: the algorithm of the integrity digest
        the file records, "sha256" or "sm3" (None: `RLSPEED_CHECKPOINT_DIGEST`'s, else "sha256").
        `model.save_replay_buffer(path)` (as in Stable-Baselines3) calls it. UserError for a model that keeps no
        replay buffer (PPO, A2C, RecurrentPPO)."""
        raise UserError(f"{type(self).__name__} keeps no replay buffer: save_replay_buffer(path) and "
                        "load_replay_buffer(path) are for the off-policy algorithms (DQN, SAC, TD3, DDPG).")

    def load_replay_buffer(self, path: str | os.PathLike[str] | ReplayBuffer, truncate_last_traj: bool = True,
                           assume_raw: bool = False) -> None:
        """Off-policy algorithms: fill the replay buffer from a file `save_replay_buffer(path)` wrote (or a
        checkpoint's `.replay.safetensors`), or from an `rlspeed.buffers.ReplayBuffer` given in place of the path.
        `truncate_last_traj` is Stable-Baselines3's, and only True is taken: steps still waiting for their n-step
        return are stored as shorter ones, their episodes truncated there (False, which would continue them in this
        model's envs, is refused). `assume_raw=True`: a file written before replay files recorded what their rows
        hold is taken as holding the env's own observations and rewards (refused otherwise by a model that
        normalises them). UserError for a model that keeps no replay buffer (PPO, A2C, RecurrentPPO)."""
        raise UserError(f"{type(self).__name__} keeps no replay buffer: save_replay_buffer(path) and "
                        "load_replay_buffer(path) are for the off-policy algorithms (DQN, SAC, TD3, DDPG).")

    def _resume_state(self, path: Path, digest: str | None = None) -> tuple[dict[str, torch.Tensor], dict]:
        """What a checkpoint carries for exact resume besides the model (tensors, JSON): the random generators
        (torch's CPU and device generators as byte tensors, numpy's and Python's as JSON), the training env's state
        where its backend can restore it (native envs) with the current observation, the learn loop's position, the
        algorithm's own counters, the number of resumes so far and the numerics guard's counts."""
        # (outside learn, a seeded model's own streams: those its next learn draws from)
        own = getattr(self, "_streams", None) is not None and getattr(self, "_caller_streams", None) is None
        cpu_state, device_state = self._streams if own else _generator_states(self.device)
        tensors = {"rng.torch": cpu_state}
        device_rng = _device_rng(self.device)
        if device_state is not None:
            tensors["rng.device"] = device_state
        np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
        py_version, py_internal, py_gauss = random.getstate()
        meta = {"rng": {"device": self.device.type if device_rng is not None else None,
                        "numpy": {"name": str(np_name), "keys": np.asarray(np_keys).tolist(), "pos": int(np_pos),
                                  "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_cached)},
                        "python": [py_version, list(py_internal), py_gauss]},
                "loop": dict(self._loop) or {"run_start": self.num_timesteps},
                "restarts": self.restarts, "numerics": self._numerics.state(), "rechecks": self._recheck_states()}
        obs = getattr(self, "_obs", None)
        # (a save inside a rollout, after a second Ctrl-C: the envs are past `_obs`, so resume starts them afresh)
        env_state = (self._env.state_dict() if self._env is not None and isinstance(obs, (torch.Tensor, dict))
                     and not getattr(self, "_mid_rollout", False) else None)
        meta["env"] = {"restorable": env_state is not None, "backend": self.env_backend}
        if env_state is not None:
            tensors.update({f"env.{key}": value for key, value in env_state.items()})
            # (a Dict observation as one tensor per key; the action masks valid for it, where the env gives them)
            tensors.update({f"obs.{key}": value for key, value in obs.items()} if isinstance(obs, dict)
                           else {"obs": obs})
            if getattr(self, "_action_mask", None) is not None:
                tensors["action_mask"] = self._action_mask
        algo_tensors, meta["algo"] = self._algorithm_state()
        tensors.update({f"algo.{key}": value for key, value in algo_tensors.items()})
        meta["replay_buffer"] = self._save_replay(path, digest)
        return tensors, meta

    def _first_obs(self, env: BatchedEnv) -> torch.Tensor:
        """The observation a learn() call starts from: right after `resume`, the checkpoint's, with the env's state
        restored where its backend allows (native envs); else a reset's (with a warning after `resume`). The reset's
        action masks, where the env gives them, land in `self._action_mask` (else None); `self._episodes_restored` says
        whether the checkpoint's episodes go on (per-episode state saved with them, such as an LSTM's, applies only
        then)."""
        resume = self._resume
        self._action_mask = None
        self._episodes_restored = False
        if resume is not None and not resume["meta"]:
            reason = "the checkpoint holds no random-generator or env state (an older rlspeed wrote it)"
        elif resume is not None and not self.strategy.enabled:
            saved = {key[4:]: value for key, value in resume["tensors"].items() if key.startswith("env.")}
            obs = resume["tensors"].get("obs")
            keyed = {key[4:]: value for key, value in resume["tensors"].items() if key.startswith("obs.")}
            obs = keyed if obs is None and keyed else obs
            expected = (env.num_envs, *self.spec.observation_shape)
            layout = observation_layout(self.spec.observation_space)
            if isinstance(obs, torch.Tensor) and tuple(obs.shape) != expected:  # (an edited or damaged file)
                reason = f"the checkpoint's observations have shape {tuple(obs.shape)}, these envs' {expected}"
            elif isinstance(obs, dict) and (not isinstance(layout, dict) or {
                    key: tuple(value.shape) for key, value in obs.items()} != {
                    key: (env.num_envs, *shape) for key, (shape, _) in layout.items()}):
                reason = "the checkpoint's observations do not fit these envs' Dict observation space"
            elif saved and obs is not None and env.state_dict() is not None:
                try:
                    env.load_state_dict(saved)
                    self._episodes_restored = True
                    mask = resume["tensors"].get("action_mask")
                    self._action_mask = mask.clone() if mask is not None else None
                    return map_obs(torch.clone, obs)
                except (KeyError, ValueError, RuntimeError) as error:
                    reason = f"the checkpoint's env state does not fit these envs ({error})"
            elif saved and obs is not None:  # (the checkpoint's envs could; these cannot take their state)
                saved_backend = resume["meta"].get("env", {}).get("backend")
                reason = (f"these {env.backend} envs cannot take the checkpoint's env state"
                          + (f" (it was saved from {saved_backend} envs)" if saved_backend else "")
                          + " or restore its episodes in progress")
            else:
                reason = (f"{resume['meta'].get('env', {}).get('backend', self.env_backend)} envs cannot restore their "
                          "episodes in progress or random streams (native envs can)")
        elif resume is not None:
            reason = "under torch.distributed each process's envs and random generators start afresh"
        obs, info = env.reset()
        self._action_mask = info.get("action_mask")  # bool [N, n] where the env gives action masks, else None
        if resume is not None and not (resume.get("untrained") and resume["meta"] and not self.strategy.enabled):
            warnings.warn(f"Resuming from '{resume['path']}': {reason}, so training continues from fresh episodes "
                          "and is not identical to the uninterrupted run.", stacklevel=4)
        return obs

    def _rechecks(self) -> dict[str, typing.Any]:
        """The schedules of rule 5's re-checks (`rlspeed.accel.recheck.Rechecks`) of the update steps that have one
        (`--accelerate auto`), by the name summary.json gives each step ("update" for `_update_step`); none before
        the update steps are built."""
        if self.__dict__.get("_optimizer_deferred") or "_update_step" not in self.__dict__:
            return {}
        steps = {"update": self.__dict__["_update_step"], **self._further_update_steps()}
        found = {name: getattr(getattr(step, "fn", None), "rechecks", None) for name, step in steps.items()}
        return {name: rechecks for name, rechecks in found.items() if rechecks is not None}

    def _recheck_states(self) -> dict[str, dict]:
        """Where each re-check schedule stands, as a checkpoint keeps it (a resumed run goes on from there)."""
        return {name: state for name, rechecks in self._rechecks().items() if (state := rechecks.state())}

    def _apply_resume(self, resume: dict) -> None:
        """Right before the learn loop after `resume`: the algorithm's own counters, the re-check schedules of its
        update steps' reduced precision (a checkpoint without them: from the start) and the random generators as the
        checkpoint's run left them (not under torch.distributed: the checkpoint holds rank 0's)."""
        tensors, meta = resume["tensors"], resume["meta"]
        self._load_algorithm_state({key[5:]: value for key, value in tensors.items() if key.startswith("algo.")},
                                   meta.get("algo") or {})
        saved = meta.get("rechecks")
        if isinstance(saved, dict) and saved:  # (checkpoints record {} where no step has a schedule)
            self._ensure_optimizer()  # (the update steps, whose schedules these are)
            for name, rechecks in self._rechecks().items():
                if isinstance(saved.get(name), dict):
                    rechecks.resume(saved[name])
        if self.strategy.enabled:
            return
        if getattr(self, "_caller_streams", None) is None and self.seed is not None:
            # (a seeded model without streams of its own, `load(path)`'s resuming its run: the run's streams are
            # the model's from here, as they were the saved model's; the caller's generator given back as learn found
            # it)
            object.__setattr__(self, "_caller_streams", _generator_states(self.device))
        try:
            rng = meta.get("rng") or {}
            if "rng.torch" in tensors:
                torch.set_rng_state(tensors["rng.torch"].cpu())  # ok-sync: once, when a resumed run starts
            device_rng = _device_rng(self.device)
            if "rng.device" in tensors and device_rng is not None and rng.get("device") == self.device.type:
                device_rng[1](tensors["rng.device"].cpu())  # ok-sync: once, when a resumed run starts
            if "numpy" in rng:
                state = rng["numpy"]
                np.random.set_state((state["name"], np.asarray(state["keys"], dtype=np.uint32), state["pos"],
                                     state["has_gauss"], state["cached_gaussian"]))
            if "python" in rng:
                version, internal, gauss = rng["python"]
                random.setstate((version, tuple(internal), gauss))
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise UserError(f"'{resume['path']}' has unreadable random-generator states ({error}): the file was "
                            "edited or damaged.") from None

    # --- checkpoints ------------------------------------------------------------------------------------------
    def save(self, path: str | Path, digest: str | None = None, **stable_baselines3: typing.Any) -> Path:
        """Save networks, optimiser state, normalisation statistics and config (safetensors + JSON) to `path` (with
        `.safetensors` appended unless it ends so; returns the file written), and what exact resume needs (`resume`;
        `Algorithm.load` ignores it): random generators, native envs' state, the learn loop's position, and with
        `save_replay_buffer` the replay buffer in a second file beside this one.
        `digest`: the file's integrity digest, "sha256" or "sm3" (default: `RLSPEED_CHECKPOINT_DIGEST`, else
        sha256; the checkpoints a run writes take the variable's)."""
        if stable_baselines3:
            sb3 = {"exclude", "include"} & set(stable_baselines3)
            raise UserError(f"save takes a path (and digest=); {', '.join(stable_baselines3)}: " + (
                "Stable-Baselines3's keywords (rlspeed saves every tensor the model needs, in one safetensors file)."
                if sb3 else "not a keyword of save."))
        if not isinstance(path, (str, os.PathLike)):
            raise UserError(f"save writes a file: give a path (str or pathlib.Path), not a {type(path).__name__}.")
        tensors = self._state_tensors()
        optim_meta = {}
        deferred = self.__dict__.get("_optimizer_deferred")
        if deferred:  # (not built: the state a checkpoint gave, unchanged, or none; building the optimisers here
            # would cost a model saved to act the import of torch._dynamo)
            optim_tensors, optim_meta = self.__dict__.get("_optimizer_state") or ({}, {})
            tensors.update(optim_tensors)
            optim_meta = dict(optim_meta)
        for name, optimizer in ({} if deferred else self._optimizers()).items():
            with optimizers_without_dynamo():
                state = optimizer.state_dict()
            for index, entries in state["state"].items():
                for key, value in entries.items():
                    # (a tensor as it is: torch.as_tensor would move it to the caller's default device)
                    tensors[f"optim.{name}.{index}.{key}"] = (value if isinstance(value, torch.Tensor)
                                                              else torch.tensor(value, device="cpu"))
            # (a tensor learning rate, as annealed on graph devices, is saved as its value)
            optim_meta[name] = [{k: float(v) if isinstance(v, torch.Tensor) else v for k, v in group.items()}
                                for group in state["param_groups"]]
        options = recorded_env_kwargs(self.spec)
        metadata = {"algo": self.name, "class": _class_name(type(self)),
                    **({"derives_from": base} if (base := _derived_algorithm(type(self))) else {}),
                    "env_id": self.env_id,
                    # (the modules that register the id, which another process imports before making the env)
                    "gym_packages": gym_packages(self),
                    "env_backend": self.env_backend,
                    "config": dataclasses.asdict(self.config), "num_timesteps": self.num_timesteps,
                    **({"n_updates": self._n_updates} if self._n_updates_known else {}), "seed": self.seed,
                    "verbose": self.verbose,
                    **({"tensorboard_log": self.tensorboard_log} if self.tensorboard_log is not None else {}),
                    # (the run it last trained in, which a loaded copy continues: `_continues`)
                    **({"trained_run": str(trained)} if (trained := self.__dict__.get("_trained_run")) else {}),
                    "observation_shape": list(self.spec.observation_shape),
                    "observation_space": space_to_json(self.spec.observation_space),
                    "action_space": space_to_json(self.spec.action_space),
                    "max_episode_steps": self.spec.max_episode_steps, "env_kwargs": options,
                    "env_kwargs_tuples": tuple_paths(options),
                    "reward_threshold": self.spec.reward_threshold, "optimizers": optim_meta,
                    "schedule": ([self._learn_start, self._schedule_end] if self._schedule_end is not None
                                 else None),
                    # (whether `resume` continues that schedule: saved during learn or after one cut short)
                    "schedule_continues": self._schedule_open,
                    # (the names of its schedule functions, whose code a file does not hold: load asks for them)
                    **({"schedule_functions": functions} if (functions := self._schedule_names()) else {}),
                    "rlspeed_version": __version__, "torch_version": torch.__version__,
                    # (whether it trained with the env's action masks: what `export` adds a mask input for)
                    "action_masks": self.trained_with_action_masks,
                    # (whether its observations came through an SB3 VecNormalize, which the file does not hold: an
                    # env made from an id gives the loaded model raw ones)
                    "vec_normalize_obs": self.trained_on_vec_normalize_obs}
        arguments = self._own_init_arguments()
        if arguments:
            metadata["init_arguments"] = arguments
        unsaved = (self.__dict__.get("_init_arguments") or ({}, {}))[1]
        if unsaved:  # (their names and types: load says which to pass again)
            metadata["unsaved_init_arguments"] = dict(unsaved)
        resume_tensors, metadata["resume"] = self._resume_state(checkpoint_path(path), digest)
        tensors.update({f"resume.{key}": value for key, value in resume_tensors.items()})
        replay = metadata["resume"].get("replay_buffer")
        return save_with_staged(path, tensors, metadata, replay["file"] if replay is not None else None,
                                digest=digest)

    def _own_init_arguments(self) -> dict:
        """A subclass's own `__init__` arguments (`_own_init_parameters`) as it was called (`__new__` records them),
        where they are plain values (`_plain_value`; a tuple comes back as a list): what `save` records and `load`
        gives the class again. One that is not, and is not its default, is said once: load would give the default."""
        plain, unsaved = self.__dict__.get("_init_arguments") or ({}, {})
        for name, kind in unsaved.items():
            if (type(self), name) not in _UNSAVED_ARGUMENTS_SAID:
                _UNSAVED_ARGUMENTS_SAID.add((type(self), name))
                warnings.warn(f"{type(self).__name__}.__init__'s argument {name} is not saved (a file keeps numbers, "
                              f"strings, and lists or dicts of them, not a {kind}): {type(self).__name__}.load gives "
                              f"it its default; pass it again ({type(self).__name__}.load(path, {name}=...)).",
                              stacklevel=3)
        return dict(plain)

    def set_parameters(self, path: str | Path, *stable_baselines3: typing.Any, verify: bool = True,
                       **stable_baselines3_keywords: typing.Any) -> None:
        """Load the networks (and observation/reward normalisation statistics) of the model or checkpoint file `path`
        into this model, as Stable-Baselines3's `set_parameters`: a warm start. The file must hold a model of this
        algorithm with the same networks (`net_arch`, `activation`, encoder, ...) for the same observation and action
        spaces; its optimiser state, step counts, schedules and random streams are not taken (this model's stay as
        they are: a fine-tune starts with fresh optimiser moments). `verify=False` (by name only) skips the file's
        digest check. Stable-Baselines3's further arguments (`exact_match`, `device`), by position or by name, are
        refused in one sentence naming each (another keyword: as misspelt, with its close name): the file's networks
        must match this model's in every shape, and they go to this model's device."""
        sb3_names = ("exact_match", "device")  # (Stable-Baselines3's arguments after the path, in its order)
        for key in stable_baselines3_keywords:  # (a misspelt verify, verfy=False: its close name, not SB3's)
            if key not in sb3_names:
                raise no_such_keyword("set_parameters", key, ("verify",))
        if stable_baselines3_keywords:  # (SB3's set_parameters(path, exact_match=False): a TypeError before)
            given = ", ".join(f"{key}={value!r}" for key, value in stable_baselines3_keywords.items())
            raise UserError(f"set_parameters takes the path and verify= alone, not {given} (Stable-Baselines3's "
                            f"{' and '.join(stable_baselines3_keywords)}, not taken here): the file's networks must "
                            "match this model's in every shape, and they go to this model's device.")
        if stable_baselines3:  # (SB3's set_parameters(path, False, "cpu"): exact_match, device; not a skipped digest
            # check)
            named = [f"{value!r} ({sb3_names[i]})" if i < len(sb3_names) else repr(value)
                     for i, value in enumerate(stable_baselines3)]
            raise UserError(f"set_parameters takes the path alone, not {', '.join(named)} after it "
                            "(Stable-Baselines3's arguments after the path are exact_match and device): here the "
                            "file's networks must match this model's in every shape, they go to this model's device, "
                            "and its digest check is skipped only by name, verify=False.")
        if isinstance(path, dict):
            raise UserError("set_parameters takes a saved model's path here (model.save(path) writes one); a dict of "
                            "weights goes to model.policy.load_state_dict(weights).")
        tensors, meta = load_checkpoint(path, device=self.device, verify=verify)
        refuse_non_model(path, meta, "load")
        if not holds_model_of(meta, type(self)):
            held, ours = algorithm_labels(meta, type(self))
            raise UserError(f"'{path}' holds a model of {held}, not of {ours}: set_parameters takes the networks of "
                            f"a {type(self).__name__} model.")
        observation_space = space_from_json(meta["observation_space"]) if "observation_space" in meta else None
        spec = EnvSpec(meta["env_id"], tuple(meta["observation_shape"]), space_from_json(meta["action_space"]),
                       None, None, observation_space, {})
        from rlspeed.evaluation import space_mismatch

        differ = space_mismatch(spec, self.spec, action_bounds=True)
        if differ:
            theirs, ours = ((f"{s.env_id}: observations {space_text(s.observation_space)}, actions "
                             f"{space_text(s.action_space)}") for s in (spec, self.spec))
            raise UserError(f"'{path}' holds a model of {theirs}, whose {' and '.join(differ)} differ from this "
                            f"model's ({ours}).")
        saved = saved_networks(type(self), meta)
        key = saved.mismatch(self.config)
        if key is not None:
            theirs, ours = (list(v) if isinstance(v, tuple) else v
                            for v in (saved.settings[key], getattr(self.config, key)))
            raise UserError(f"'{path}' holds networks built with {key}={theirs!r}, this model's have {key}="
                            f"{ours!r}: make the model with {key}={theirs!r} to take its weights.")
        networks = {key: value for key, value in tensors.items() if not key.startswith("optim.")}
        try:
            self._restore(networks, {**meta, "optimizers": {}}, path)
        except UserError as error:
            raise _other_networks(error, meta, type(self), path, "set_parameters") from None

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "auto",
             env: str | BatchedEnv | gym.vector.VectorEnv | VecEnvLike | None = None, verify: bool = True,
             allow_nonfinite: bool = False, **overrides: typing.Any) -> Self:
        """Rebuild the model saved at `path` (as given, or with `.safetensors` appended where that does not exist; a
        run directory: its model.safetensors) on `device` (no unpickling). `env` is optional: without it, `learn`
        builds one. `Algorithm.load` (`rlspeed.load`) rebuilds whichever algorithm the file holds, as the user's
        subclass that saved it where its module is imported; `PPO.load` and the others refuse another's (but for an
        algorithm of a user's own derived from theirs, `saved_algorithm`).

        The checkpoint's digest is checked (`verify=False` skips it) and NaN or infinite tensors are refused
        (`allow_nonfinite=True` accepts them); `overrides` replace saved hyperparameters. `env_kwargs=` (a dict)
        makes the env to go on with from the saved id (or an id given as `env`) with those options over the
        recorded ones, checked against the model's spaces (a curriculum's next stage)."""
        sb3 = [key for key in ("custom_objects", "print_system_info", "force_reset") if key in overrides]
        if sb3:
            raise UserError(f"load's {', '.join(sb3)}: Stable-Baselines3's keywords; rlspeed checkpoints hold no "
                            "pickled objects (replace a saved hyperparameter with a keyword: load(path, "
                            "learning_rate=...)), and an env given to load starts fresh episodes.")
        if hasattr(device, "step") or isinstance(device, str) and device in gym.registry:  # (SB3's load(path, env))
            name = "rlspeed.load" if cls is Algorithm else f"{cls.__name__}.load"
            raise UserError(f"{name}'s second argument is the device (Stable-Baselines3's is the env): write "
                            f"{name}(path, env=...).")
        device = resolve_device(device)
        path = run_model(path) if isinstance(path, (str, os.PathLike)) else path  # (a run directory: its model)
        tensors, meta = load_checkpoint(path, device=device, verify=verify, allow_nonfinite=allow_nonfinite)
        refuse_non_model(path, meta, "load")
        algo = saved_algorithm(meta, cls, path)
        # (schedule functions as their start values for the checks below: the model is made with them)
        overrides, schedules = own_schedules(algo.config_cls, overrides)
        # (SB3's n_steps=..., policy_kwargs=... over the file's num_steps, net_arch: the network check below sees them)
        overrides = sb3_settings(algo.config_cls, overrides)
        unknown = sorted(set(meta["config"]) - _field_names(algo.config_cls).keys())
        if unknown and (other := _other_class(meta, algo)) is not None:  # (a subclass's config of its own: built
            # as its class, in a command's words inside `command_advice`)
            who, advice = _load_remedy(other, algo)
            raise UserError(f"'{path}' was saved by {other}, whose settings {who} does not have "
                            f"({', '.join(unknown)}): {advice}.")
        if unknown:  # (the version is not told apart: a newer rlspeed's settings are the likely cause)
            raise UserError(f"'{path}' holds settings this rlspeed's {algo.__name__} does not have "
                            f"({', '.join(unknown)}): a newer rlspeed wrote it (pip install -U rlspeed), or a "
                            "config class of someone else's, or its metadata was edited.")
        fields = _field_names(algo.config_cls)
        for name, flag in _STATISTICS:  # (a file written before its algorithm had the flag, DQN's, SAC's, TD3's and
            # DDPG's normalize_obs: the statistics of the normalising env it trained on say the flag was on)
            if flag in fields and flag not in meta["config"] and any(key.startswith(f"{name}.") for key in tensors):
                meta["config"][flag] = True
        # (checkpoints written before observation spaces were recorded hold float vectors of observation_shape)
        observation_space = space_from_json(meta["observation_space"]) if "observation_space" in meta else None
        meta["config"] = with_saved_cnn(meta["config"], fields, observation_space)
        saved = build_config(algo.config_cls, meta["config"])
        for key in _network_keys(saved, observation_space):  # (the saved weights are of these networks: another
            # would run them wrongly)
            if key in overrides and hasattr(saved, key) and not _same_networks(
                    key, saved, build_config(algo.config_cls, {**meta["config"], key: overrides[key]}),
                    observation_space):
                raise UserError(f"load(..., {key}={overrides[key]!r}): '{path}' holds networks built with {key}="
                                f"{getattr(saved, key)!r}, which its weights belong to; a loaded model keeps its "
                                f"networks (make a new model for another {key}).")
        # (a subclass's own __init__ arguments, where the file holds them and the class loading it takes them)
        arguments = meta.get("init_arguments") if isinstance(meta.get("init_arguments"), dict) else {}
        own = _own_init_parameters(algo)
        config = {**{key: value for key, value in arguments.items() if key in own}, **meta["config"],
                  **{key: meta[key] for key in ("verbose", "tensorboard_log") if key in meta}, **overrides}
        env_backend = config.pop("env_backend", meta.get("env_backend", "auto"))
        if "env_backend" in overrides and env_backend not in BACKENDS:  # (given now: the file's may be "sb3", ...;
            # the constructor takes it without an env, and learn would refuse it late)
            raise UserError(f"load(..., env_backend={env_backend!r}): expected one of {', '.join(BACKENDS)}.")
        env_kwargs = config.pop("env_kwargs", None)  # (options of the env to go on with, over the recorded ones)
        if env_kwargs is not None and not isinstance(env_kwargs, dict):
            raise UserError(f"load(..., env_kwargs=...) takes a dict of the env's options, not {env_kwargs!r}.")
        if env_kwargs is not None and env is not None and not isinstance(env, str):
            raise UserError("load(..., env_kwargs=...) gives options to the env load makes (from the saved id, or an "
                            "id given as env=); an env already built has its own: make it with them "
                            "(rlspeed.make_env(env_id, **options)).")
        spec = EnvSpec(meta["env_id"], tuple(meta["observation_shape"]), space_from_json(meta["action_space"]),
                       meta.get("max_episode_steps"), meta.get("reward_threshold"), observation_space,
                       with_tuples(dict(meta.get("env_kwargs") or {}), meta.get("env_kwargs_tuples")))
        if env_kwargs is not None:  # (made here, where its spaces are checked against the model's)
            env = spec.env_id if env is None else env
            env_kwargs = {**spec.env_kwargs, **env_kwargs} if env == spec.env_id else env_kwargs
        made = isinstance(env, str)  # (an id: this call makes the env)
        # the values the env is made and wrapped with, as the model's config reads them (int('x') was a bare
        # ValueError, bool('no') True where the model's episodic_life='no' or normalize_obs='no' is False)
        built = build_config(algo.config_cls, {key: value for key, value in config.items() if key in fields})
        checked = {key: getattr(built, key) for key in config if key in fields}
        # (warnings said once the model is loaded: a refused load is its error alone)
        unsaid: list[tuple[str, type[Warning]]] = []
        try:  # (whatever fails from here, the env this call made is closed: one the caller built is theirs)
            if env is not None:
                if made and meta.get("env_kwargs") and env_kwargs is None:
                    unsaid.append((f"'{path}' was trained on {spec.env_id} made with the options {spec.env_kwargs}; "
                                   f"load(env={env!r}) makes that env without them (pass them again: "
                                   "load(path, env=env_id, env_kwargs=options)).", UserWarning))
                if made:  # as many envs as the run trained with (as load without an env, whose learn makes them), on
                    # the backend given to load (else the one that fits the id and options, as a new model's)
                    num_envs = int(checked.get("num_envs", 1))
                    env_backend = resolve_backend(env, backend_for_options(
                        env_kwargs or {}, env_backend if "env_backend" in overrides else "auto"), num_envs, device)
                    env = make_env(env, num_envs=num_envs, device=device, backend=env_backend, env_kwargs=env_kwargs,
                                   episodic_life=bool(checked.get("episodic_life", True)),
                                   clip_rewards=bool(checked.get("clip_rewards", True)))
                elif not isinstance(env, BatchedEnv):
                    if not isinstance(env, gym.vector.VectorEnv) and not is_sb3_vec_env(env):
                        _check_env_id(env, f"{cls.__name__}.load")  # (what load takes, not what make_env does)
                    env = make_env(env, device=device)
                else:
                    env = counted(env)  # (counted before a reward normalisation: the episode returns stay the env's)
                # normalised as it trained (a config without the options: where the file holds statistics), also an
                # env of the caller's, which predict's normalised observations would otherwise not match in training
                env = normalised(env, bool(checked.get("normalize_obs", any(key.startswith("obs_rms.")
                                                                            for key in tensors))),
                                 bool(checked.get("normalize_reward", any(key.startswith("return_rms.")
                                                                          for key in tensors))),
                                 float(checked.get("gamma", 0.99)))
                _check_env_fits(env.spec, spec, path)
                if "num_envs" in overrides and overrides["num_envs"] != env.num_envs and not made:
                    raise UserError(f"load(..., num_envs={overrides['num_envs']}) with an env of {env.num_envs} envs: "
                                    "the env passed decides; leave num_envs out, or pass an env of that many.")
                if "num_envs" in config:
                    config["num_envs"] = env.num_envs
            # built as any model is, then given the saved state; the initial weights it draws and overwrites must not
            # move the caller's random streams
            unsaved = meta.get("unsaved_init_arguments") if isinstance(meta.get("unsaved_init_arguments"), dict) else {}
            missing = {name: kind for name, kind in unsaved.items() if name in own and name not in overrides}
            again = f"{algo.__name__}.load(path, {', '.join(f'{name}=...' for name in missing)})"
            try:
                with _forked_random(device), warnings.catch_warnings():
                    warnings.simplefilter("ignore", UnusedSettingWarning)  # (said when the model was made)
                    warnings.simplefilter("ignore", EncoderWarning)
                    model = algo(env if env is not None else spec, device=device, env_backend=env_backend,
                                 **{**config, **schedules})
            except Exception as error:
                if not missing or isinstance(error, UserError):
                    raise
                # (the subclass's code failed on the default it got: say which argument the file could not give it)
                raise UserError(f"{algo.__name__}.load could not build the model of '{path}' without "
                                f"{', '.join(missing)}, a {', a '.join(missing.values())} its file does not keep "
                                f"({type(error).__name__}: {first_line(error)[:200]}): pass it again "
                                f"({again}).") from error
            defaulted = [name for name in missing if (algo, name) not in _UNSAVED_ARGUMENTS_SAID]
            if defaulted:  # (built with the default, which may act otherwise; said once a process, as save says it)
                unsaid.append((f"'{path}' was saved by a {algo.__name__} made with {', '.join(missing)} (a "
                               f"{', a '.join(missing.values())}), which its file does not keep: this model has the "
                               f"default; pass it again ({again}).", UserWarning))
            model._env_given = env is not None and not made  # (an env load made from an id is made again after close,
            if made:  # on the same backend)
                model.env_backend = env_backend
            for sentence in unused_settings(model.config, model.spec):  # (but for a value given to load now)
                if re.split(r"[= ]", sentence, maxsplit=1)[0] in overrides:
                    unsaid.append((sentence, UnusedSettingWarning))
            model.seed = overrides["seed"] if "seed" in overrides else meta.get("seed")
            if overrides.get("seed") is not None:  # (a seed given now: what the model draws from here on follows it,
                seed = overrides["seed"]  # as a model made with it; the weights are the file's)
                with _forked_random(model.device):  # (the model's own streams: the caller's generators stay as they
                    # were)
                    torch.manual_seed(model.strategy.seed_for_rank(seed) if model.strategy.enabled else seed)
                    model._own_random_streams(True)
            model._restore_counts(meta)
            model._schedules_missing = _saved_schedule_functions(meta, overrides)  # (a number given now is a constant
            # value)
            if meta.get("schedule"):  # (where the saved run's schedules stood: DQN.epsilon(t) as the run had it;
                # a learn sets its own)
                model._learn_start, model._schedule_end = (int(step) for step in meta["schedule"])
                # (kept as the file has it: a copy saved from this model resumes as the file would)
                model._schedule_open = bool(meta.get("schedule_continues", True))
            try:
                model._restore(tensors, meta, path)
            except UserError as error:
                raise _other_networks(error, meta, algo, path, "load") from None
        except BaseException:
            if made and not isinstance(env, str):
                close_quietly(env)  # (the load's error is the one to show)
            raise
        model._run_dir = Path(path).resolve().parent  # (its run directory, where its learn may continue)
        if isinstance(meta.get("trained_run"), str):  # (and the run it last trained in: `_continues`)
            model._trained_run = Path(meta["trained_run"])
        # (its training clock so far: metrics.csv's train_wall_s goes on where the saved model's ended, as its steps)
        loop = meta["resume"].get("loop") if isinstance(meta.get("resume"), dict) else None
        if isinstance(loop, dict):
            model._loop = {key: float(loop[key]) for key in ("train_wall_s", "clock_before") if key in loop}
        replay = meta["resume"].get("replay_buffer") if isinstance(meta.get("resume"), dict) else None
        left = beside(Path(path).resolve(), replay.get("file")) if isinstance(replay, dict) else None
        if left is not None and left.is_file():
            model._replay_left = left  # (said when learn starts)
        model._saved_with_action_masks = bool(meta.get("action_masks", False))
        model._saved_on_vec_normalize_obs = bool(meta.get("vec_normalize_obs", False))
        model._recorded_gym_packages = list(meta.get("gym_packages") or [])  # (saved again and exported with it)
        # (the saved config's use_masking is no request of the caller's: only one given to load now is)
        model._asked_for_masks = overrides.get("use_masking") is True
        _UNSAVED_ARGUMENTS_SAID.update((algo, name) for name in defaulted)
        for sentence, category in unsaid:
            warnings.warn(sentence, category, stacklevel=2)
        # (said once the model is built: a load that fails names the subclass in its error, one outcome)
        _warn_other_class(meta, algo, path, "load")
        return model

    @property
    def trained_with_action_masks(self) -> bool:
        """Whether this model trained with its env's action masks (in this process, or in the run it was saved
        from): `export` then adds an `action_mask` input by default."""
        return bool(getattr(self, "_masking", False) or getattr(self, "_saved_with_action_masks", False))

    @property
    def recorded_gym_packages(self) -> tuple[str, ...]:
        """The modules that the file this model was loaded from records as registering its env id (`gym_packages`: a
        user's env's module, MinAtar's `minatar.gym`); () for a model built here or a file that records none. `load`
        imports none of them: where nothing here registered the id (a file moved without its run), import them, then
        evaluate or train (`rlspeed eval` imports them itself)."""
        return tuple(self._recorded_gym_packages)

    @property
    def trained_on_vec_normalize_obs(self) -> bool:
        """Whether this model trains (or the run it was saved from trained) on a Stable-Baselines3 VecNormalize that
        normalises observations: an env made from an id gives raw ones, which `evaluate` refuses."""
        return (vec_normalize_of(getattr(self, "_env", None), "norm_obs") is not None
                or bool(getattr(self, "_saved_on_vec_normalize_obs", False)))

    def resume(self, path: str | Path, verify: bool = True, allow_nonfinite: bool = False) -> None:
        """Continue from the checkpoint at `path` (as for `load`), of this same run (after a restart): weights,
        optimisers, statistics, steps, and for the next learn() the rest of the run's state: random generators, native
        envs' states and episodes in progress, the learn loop's position (next evaluation and checkpoint, the run's
        start for `steps_to_target`), the replay buffer where it was saved (`save_replay_buffer`).

        Exact: on the CPU with native envs in one process, a run resumed from a checkpoint continues bitwise as the
        uninterrupted run would have (tests/test_resume.py). Not exact: Gymnasium and Stable-Baselines3 envs cannot
        restore their episodes in progress or their random streams (they restart with fresh episodes, with a
        warning); under torch.distributed, a checkpoint holds rank 0's state only, so envs and random generators
        start afresh on every rank; an off-policy run saved without its replay buffer refills one from empty.
        `restarts` counts the resumes of the run. `verify` and `allow_nonfinite`: as for `load`.
        """
        tensors, meta = load_checkpoint(path, device=self.device, verify=verify, allow_nonfinite=allow_nonfinite)
        refuse_non_model(path, meta, "resume")
        if meta.get("algo") != self.name or meta.get("env_id") != self.env_id:
            raise UserError(f"'{path}' is a {meta.get('algo')} {meta.get('env_id')} checkpoint; cannot resume "
                            f"{self.name} {self.env_id} from it.")
        try:  # (a setting an older rlspeed had, or a value it took: the tensors' shapes still decide)
            saved = saved_config(self.config_cls, meta["config"], self.spec.observation_space)
        except UserError:
            saved = None
        for key in _network_keys(saved, self.spec.observation_space) if saved is not None else ():  # (same shapes,
            # other networks: run wrongly)
            if hasattr(saved, key) and not _same_networks(key, saved, self.config, self.spec.observation_space):
                raise UserError(f"'{path}' holds networks built with {key}={getattr(saved, key)!r}, this model has "
                                f"{key}={getattr(self.config, key)!r}: resume with the run's own {key} (a run keeps "
                                "its networks).")
        try:
            self._restore(tensors, meta, path, build_optimizer=True)
        except UserError as error:
            raise _other_networks(error, meta, type(self), path, "resume") from None
        self._schedules_missing = _saved_schedule_functions(meta, self._schedule_functions)
        self._run_dir = Path(path).resolve().parent
        self._restore_counts(meta)
        schedule = meta.get("schedule")
        # the next learn() continues the schedules where the checkpoint's run left them (see `learn`); from a save
        # between learn calls it starts them afresh, as the next learn call of the saved model would have (older
        # checkpoints, without the flag, continue)
        continues = schedule is not None and meta.get("schedule_continues", True)
        self._resumed_schedule = (int(schedule[0]), int(schedule[1])) if continues else None
        self._schedule_open = bool(continues)
        if self._env is not None:
            self._adopt_statistics()
        state = meta.get("resume")
        state = state if isinstance(state, dict) else None  # (older checkpoints have none)
        self.restarts = (int(state.get("restarts", 0)) if state is not None else 0) + 1
        if state is not None:
            self._numerics.load_state(state.get("numerics") or {})
            # (the run's position as the checkpoint left it, also for what reads it before the next learn: a
            # summary after an interruption before that learn trained)
            self._loop = dict(state.get("loop") or {})
        file = Path(path) if Path(path).exists() else checkpoint_path(path)
        # (a run of DQN, SAC, TD3 or DDPG on a normalising env passed in, saved before their normalize_obs: its
        # replay holds observations normalised as collected, HER's raw ones; before their normalize_reward: rewards
        # scaled as collected, HER refused them)
        config = meta["config"]
        normalised_replay = [rows for rows, flag, name in (("observations", "normalize_obs", "obs_rms"),
                                                           ("rewards", "normalize_reward", "return_rms"))
                             if flag not in config and not (rows == "observations" and config.get("her"))
                             and any(key.startswith(f"{name}.") for key in tensors)]
        self._resume = {"meta": state or {}, "path": file,
                        "tensors": {key[7:]: value for key, value in tensors.items() if key.startswith("resume.")},
                        "normalised_replay": normalised_replay,
                        # (saved before any step: no episode in progress and no transition to lose, so a resume
                        # that starts fresh episodes and an empty replay buffer is the uninterrupted run)
                        "untrained": not int(meta.get("num_timesteps", 0))}
        # (said once the resume has passed every step that can refuse it: a refused resume is its error alone)
        _warn_other_class(meta, type(self), path, "resume")
        with warnings.catch_warnings():  # (an option no checkpoint can hold was said when this model was made)
            warnings.simplefilter("ignore")
            options = json.loads(json.dumps(recorded_env_kwargs(self.spec)))  # (as the file holds them)
        saved_options = meta.get("env_kwargs") or {}
        if isinstance(saved_options, dict) and saved_options != options:
            warnings.warn(f"'{path}' was trained on {self.env_id} made with the options {saved_options} and this "
                          f"model's env has {options}: the run goes on on this model's env (make the model with the "
                          "run's env_kwargs to go on as it was).", OtherEnvOptionsWarning, stacklevel=2)

    def _restore_counts(self, meta: dict) -> None:
        """The env steps and gradient steps a saved file holds (`load`, `resume`); a file an older rlspeed wrote after
        training holds no gradient steps: unknown (`_n_updates_known`)."""
        self.num_timesteps = int(meta.get("num_timesteps", 0))
        self._n_updates = int(meta.get("n_updates", 0))
        self._n_updates_known = "n_updates" in meta or not self.num_timesteps

    def _restore(self, tensors: dict[str, torch.Tensor], meta: dict, path: str | Path | None = None,
                 build_optimizer: bool = False) -> None:
        """Load networks, normalisation statistics and optimiser state from checkpoint tensors (of the file `path`,
        which a tensor that does not fit names). On the model's threads (`training_threads`), as training.
        `build_optimizer` (a resume, which trains next): the optimisers are built now (`_ensure_optimizer`), so that
        a state that does not fit them is refused here, not at the first update."""
        try:
            # (statistics it makes are trainable tensors also inside a caller's torch.inference_mode(), as __init__'s)
            with training_threads(self.num_threads), torch.inference_mode(False):
                self._restore_tensors(tensors, meta)
            if build_optimizer:
                self._ensure_optimizer()
        except UserError as error:
            if path is None or str(path) in str(error):
                raise
            raise UserError(f"'{path}': {error}") from None

    def _restore_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        listed = self._modules()
        for name, module in self._saved_modules().items():
            if name not in listed and not any(key == name or key.startswith(f"{name}.") for key in tensors):
                # (a subclass's own module, which the file's model did not have: rlspeed's own class saved it, say)
                warn_at_caller(f"The checkpoint holds no weights for {type(self).__name__}.{name}, which this model "
                               "trains: it starts as built.", UserWarning)
                continue
            if isinstance(module, torch.Tensor):
                if name in tensors:
                    _check_shape(name, tensors[name].shape, module.shape)
                    with torch.no_grad():
                        module.copy_(tensors[name])
            else:
                saved = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(f"{name}.")}
                expected = module.state_dict()
                missing = sorted(set(expected) - set(saved))
                if missing:
                    raise UserError(f"The checkpoint has no '{name}.{missing[0]}' ({len(missing)} tensors missing): it "
                                    f"is damaged or is not a {self.name} model of this architecture.")
                for key, value in saved.items():
                    if key in expected:
                        _check_shape(f"{name}.{key}", value.shape, expected[key].shape)
                extra = sorted(set(saved) - set(expected))
                if extra:  # (load_state_dict's RuntimeError otherwise: a network with more layers saved it)
                    raise UserError(f"The checkpoint holds '{name}.{extra[0]}' ({len(extra)} tensors this model does "
                                    f"not have): it is not a {self.name} model of this architecture.")
                module.load_state_dict(saved)
        for name, flag in _STATISTICS:
            rms_state = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(f"{name}.")}
            if (hasattr(self.config, flag) and not getattr(self.config, flag)
                    and getattr(self._env, name, None) is None):
                # normalisation turned off (a load or resume override; not a normalising env passed in, which sets
                # the flag when learn adopts its statistics): its statistics go, or predict, evaluate and export would
                # go on normalising what the model now trains on raw
                rms_state = {}
                setattr(self, name, None)
            if rms_state:
                if getattr(self, name, None) is None:
                    setattr(self, name, observation_statistics(self.spec.observation_space, self.device)
                            if name == "obs_rms" else RunningMeanStd((), device=self.device))
                getattr(self, name).load_state_dict(rms_state)
        optimizers = {key: value for key, value in tensors.items() if key.startswith("optim.")}
        saved = meta.get("optimizers", {})
        if not self.__dict__.get("_optimizer_deferred"):
            self._load_optimizer_state(optimizers, saved)
            return
        planned = _planned_parameters(self)  # (a state for other parameters said now, not at the first learn)
        if planned is not None and "optimizer" in saved and not _state_fits(saved["optimizer"], len(planned)):
            saved = {name: groups for name, groups in saved.items() if name != "optimizer"}
        object.__setattr__(self, "_optimizer_state", (optimizers, saved))  # (into the optimisers when built)

    def _load_optimizer_state(self, tensors: dict[str, torch.Tensor], saved: dict) -> None:
        """The per-parameter state (`tensors`, `optim.<name>.<index>.<field>`) of the optimisers a checkpoint's
        metadata lists (`saved`, their param_groups) into the model's."""
        for name, optimizer in self._optimizers().items():
            if name not in saved:
                continue
            state: dict = {}
            prefix = f"optim.{name}."
            for key, value in tensors.items():
                if key.startswith(prefix):
                    index, field = key[len(prefix):].split(".", 1)
                    state.setdefault(int(index), {})[field] = value
            # The hyperparameters (learning rate, betas, kernel flags) stay those this model was built with from its
            # config, overrides included (a saved PPO learning rate is the last annealed one); the checkpoint gives
            # the per-parameter state (moments, step).
            groups = optimizer.state_dict()["param_groups"]
            if not _state_fits(saved[name], sum(len(group["params"]) for group in groups)):
                continue
            params = [param for group in optimizer.param_groups for param in group["params"]]
            for index, fields in state.items():  # (moments of another shape would fail inside the first step)
                for field, value in fields.items():
                    if index < len(params) and value.numel() > 1:
                        _check_shape(f"{prefix}{index}.{field}", value.shape, params[index].shape)
            optimizer.load_state_dict({"state": state, "param_groups": groups})
            _match_parameter_layouts(optimizer)


def _state_fits(saved_groups: list[dict], count: int) -> bool:
    """Whether a checkpoint's optimizer state (its param_groups) is for `count` parameters; a warning if not."""
    saved_count = sum(len(group["params"]) for group in saved_groups)
    if saved_count != count:
        warn_at_caller(f"The optimizer state in the checkpoint is for {saved_count} parameters; this model trains a "
                       "different set (an override changed it), so its optimizer starts afresh.", UserWarning)
    return saved_count == count


def _match_parameter_layouts(optimizer: torch.optim.Optimizer) -> None:
    """Put every per-parameter state tensor of `optimizer` (Adam's moments) in its parameter's memory layout.
    Checkpoints store tensors contiguous while a parameter may be channels-last (`rlspeed.nn.to_device`), and a fused
    optimizer kernel walks a parameter and its moments in memory order: a moment in another layout would update other
    elements."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.shape == param.shape and value.stride() != param.stride():
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)

