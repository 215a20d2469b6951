"""Atari games (ale-py) with the standard preprocessing, as batched envs of uint8 frame stacks.

Every Atari image id (`BreakoutNoFrameskip-v4`, `ALE/Breakout-v5`, ...) is built as Gymnasium's
`AtariPreprocessing` (up to 30 no-op actions at reset, 4 frames per step with the last two max-pooled, 84x84
greyscale) followed by `FrameStackObservation(4)`: observations are uint8 `[N, 4, 84, 84]`, the stack as channels.
Ids whose registered env skips frames itself (the v5 ids: 4 frames, sticky actions) are made with `frameskip=1`, so
that the wrapper does the skipping; their sticky actions stay.

Two transforms apply to training only, and sit outside `EpisodeStatistics` (`AtariTraining`, applied by `make_env`
unless `training=False`): a lost life ends the learner's episode (`terminated`; the game itself goes on, as in
Stable-Baselines3's `EpisodicLifeEnv` and EnvPool's `episodic_life`), and rewards are clipped to their sign. So the
episode returns every env reports (`info["episode_return"]` where `info["done"]`) are whole games' raw scores, in
training as in evaluation. Both Atari adapters (this Gymnasium one and `rlspeed.envs.envpool_env`) report each
env's lives in `info["lives"]` (int32 `[N]`), which `AtariTraining` reads.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib.util

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs.base import NO_TIME_LIMIT, BatchedEnv, EnvSpec, EnvWrapper, ResetResult, StepResult
from rlspeed.envs.gymnasium_env import GymnasiumEnv, is_atari_image_spec
from rlspeed.envs.packages import import_cause, install_command, missing_dependency
from rlspeed.errors import UserError, is_true_or_false

#: The standard preprocessing (Mnih et al. 2015; Machado et al. 2018 for the v5 ids' sticky actions).
NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
FRAME_STACK = 4

_registered = False


def register_atari() -> bool:
    """Register ale-py's envs with Gymnasium (once; importing ale-py is deferred to the first Atari id). Returns
    whether ale-py is installed."""
    global _registered
    if _registered:
        return True
    if importlib.util.find_spec("ale_py") is None:
        return False
    import ale_py

    # ALE prints a banner on stderr ("A.L.E: Arcade Learning Environment ...", "[Powered by Stella]") when the first
    # emulator of a process is made, at its Info level: every AtariEnv sets the Error level on its emulator right
    # after, so setting it first leaves out the banner and nothing else
    with contextlib.suppress(AttributeError):  # (an ale-py without logger modes)
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    gym.register_envs(ale_py)
    _registered = True
    return True


def is_atari(env_id: str) -> bool:
    """Whether `env_id` is a registered Atari game with image observations (not a `-ram` id), once ale-py's envs
    are registered (`register_atari`)."""
    spec = gym.registry.get(env_id)
    return spec is not None and is_atari_image_spec(spec)


def atari_image_id(env_id: str) -> bool:
    """Whether `env_id` is an Atari game with image observations, ale-py's ids registered first (`register_atari`;
    False without ale-py). An id registered already is answered from its spec: importing ale-py to ask about
    CartPole-v1 (an export's description) would add ale-py's ids to the caller's registry, and its warning filter."""
    if env_id in gym.registry:
        return is_atari(env_id)
    return register_atari() and is_atari(env_id)


def preprocessed(env_id: str, env_kwargs: dict) -> bool:
    """Whether `env_id` made with the options `env_kwargs` is one of this module's preprocessed games (frame stacks):
    an Atari image id (registered already), unless the options ask for its RAM (`obs_type="ram"`: 128 bytes, no
    image preprocessing)."""
    return is_atari(env_id) and env_kwargs.get("obs_type", "rgb") != "ram"


def registered_limit(env_id: str, limit: int | None) -> int | None:
    """A game's time limit in agent steps: the option `limit`, else the id's registered `max_episode_steps` (an id
    registered with one: an option by another name, counted in agent steps too)."""
    return gym.spec(env_id).max_episode_steps if limit is None else limit


def max_episode_steps(env_id: str, env_kwargs: dict | None = None) -> int:
    """Agent steps per game at most, for `env_id` made with the options `env_kwargs`: a `max_episode_steps` option or
    registration (agent steps, as `make_atari_env` applies it), else (left out, or `NO_TIME_LIMIT`: no limit of
    rlspeed's) ALE's truncation after `max_num_frames_per_episode` frames (the option's, else the id's: 108,000 for
    the registered ids, 30 minutes of play), each agent step being `FRAME_SKIP` frames."""
    env_kwargs = env_kwargs or {}
    limit = registered_limit(env_id, env_kwargs.get("max_episode_steps"))
    if limit not in (None, NO_TIME_LIMIT):
        return int(limit)
    frames = (env_kwargs.get("max_num_frames_per_episode")
              or (gym.spec(env_id).kwargs or {}).get("max_num_frames_per_episode") or 108_000)
    return int(frames) // FRAME_SKIP


class FireReset(gym.Wrapper):
    """FIRE pressed for the agent in hidden steps, as Stable-Baselines3's `AtariWrapper` (`EpisodicLifeEnv` +
    `FireResetEnv`) and CleanRL's `ppo_atari` train: FIRE then action 2 after every reset, and no-op, FIRE, action 2
    right after a lost life (the `fire_reset` option of `make_atari_env`). The agent never sees these steps (no
    transition, no step counted); their rewards are added to the step's reward. `fire`: the FIRE action's index
    (`fire_action`)."""

    def __init__(self, env: gym.Env, fire: int):
        super().__init__(env)
        self.fire = fire
        self._lives = 0

    def _press(self, actions: tuple[int, ...], reward: float = 0.0):
        result = None
        for action in actions:
            result = self.env.step(action)
            reward += float(result[1])
            if result[2] or result[3]:
                break
        obs, _, terminated, truncated, info = result
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self._press((self.fire, 2))
        if terminated or truncated:  # (as FireResetEnv: a game that ended in those steps starts again)
            obs, info = self.env.reset(**kwargs)
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        if lives < self._lives and not (terminated or truncated):
            obs, reward, terminated, truncated, info = self._press((0, self.fire, 2), float(reward))
            lives = self.env.unwrapped.ale.lives()
        self._lives = lives
        return obs, reward, terminated, truncated, info


def fire_reset_option(env_id: str, value) -> bool:
    """The `fire_reset` option's `value` as a bool; UserError unless it is one, or for a game without FIRE as its
    second action."""
    if not is_true_or_false(value):  # (rlspeed's one rule for switches: 1 and 1.0 too)
        raise UserError(f"The Atari option fire_reset is true or false, got {value!r}.")
    if value and fire_action(env_id) is None:
        raise UserError(f"{env_id} has no FIRE as its second action, so fire_reset does not apply: leave it out.")
    return bool(value)


def make_atari_env(env_id: str, **env_kwargs) -> gym.Env:
    """One Atari env with the standard preprocessing (module docstring): what each row of the Gymnasium backend
    is, and what the EnvPool backend reproduces. `env_kwargs` go to `gymnasium.make` (e.g.
    `repeat_action_probability=0.0`), but for rlspeed's own two: `max_episode_steps` (agent steps per game) and
    `fire_reset=True` (FIRE pressed for the agent after every reset and lost life, in hidden steps: `FireReset`)."""
    registered = gym.spec(env_id).kwargs or {}
    fire = fire_reset_option(env_id, env_kwargs.pop("fire_reset", False))
    if env_kwargs.get("frameskip", 1) != 1:
        raise UserError(f"{env_id}: rlspeed's Atari preprocessing skips {FRAME_SKIP} frames itself (max-pooling the "
                        f"last two), so the env must not: leave frameskip out (got {env_kwargs['frameskip']!r}).")
    if registered.get("frameskip", 1) != 1:
        env_kwargs.setdefault("frameskip", 1)  # AtariPreprocessing skips frames itself and refuses an env that does
    # A time limit counts agent steps, as every step count of rlspeed's does (the spec's, evaluation's max_steps):
    # gym.make's would wrap the emulator, whose steps are single frames here
    # (NO_TIME_LIMIT, Gymnasium's value for none, leaves ALE's own truncation: `max_num_frames_per_episode`)
    limit = env_kwargs.pop("max_episode_steps", None)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer))
                              or (limit <= 0 and limit != NO_TIME_LIMIT)):
        raise UserError(f"{env_id}: max_episode_steps is the agent steps per game, a whole number above 0 (or -1 for "
                        f"no limit but ALE's own, max_num_frames_per_episode), got {limit!r}.")
    limit = registered_limit(env_id, limit)
    # (gym.make's TimeLimit would count the emulator's single frames, the reset's no-ops among them)
    env = gym.make(env_id, max_episode_steps=NO_TIME_LIMIT, **env_kwargs)
    if env.observation_space != env.unwrapped.observation_space:  # (AtariPreprocessing takes the emulator's frames)
        env.close()
        wrappers = ", ".join(wrapper.name for wrapper in gym.spec(env_id).additional_wrappers)
        raise UserError(f"{env_id} is registered with wrappers that change ALE's frames ({wrappers}), and rlspeed "
                        "preprocesses an Atari game's frames itself (AtariPreprocessing, then the last "
                        f"{FRAME_STACK} frames stacked): register the id without them, or train on a vector env you "
                        "build with them, gymnasium.make_vec(id, n, vectorization_mode='sync', vector_kwargs="
                        "{'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}, wrappers=[...]).")
    try:
        env = gym.wrappers.AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP,
                                              screen_size=SCREEN_SIZE, terminal_on_life_loss=False,
                                              grayscale_obs=True, scale_obs=False)
    except gym.error.DependencyNotInstalled as error:
        env.close()
        # (Gymnasium's message names a pip command of its own, whatever the import's error: cv2 missing, or installed
        # and failing to load, its libGL missing; `missing_dependency` tells them apart and names rlspeed's extra)
        cause = import_cause(error)
        reason = (missing_dependency(cause) if cause is not error else None) or \
            f"the Python module 'cv2' is not installed: {install_command('cv2')}"
        raise UserError(f"Atari preprocessing needs OpenCV: {reason.rstrip('.')}.") from None
    if fire:
        env = FireReset(env, fire_action(env_id))
    if limit is not None and limit != NO_TIME_LIMIT:
        env = gym.wrappers.TimeLimit(env, int(limit))
    return gym.wrappers.FrameStackObservation(env, FRAME_STACK)


#: the EnvSpecs `atari_spec` made in this process, by (id, options), with the registration they were made from and
#: its fields then (`_registered_as`): each game made costs a ROM load, and a population's members and their solo runs
#: ask for the same one (at most `_SPECS_KEPT`, the newest kept)
_specs: collections.OrderedDict[tuple[str, str], tuple[object, str, EnvSpec]] = collections.OrderedDict()
_SPECS_KEPT = 32


def _registered_as(registration) -> str:
    """The fields of a Gymnasium registration (entry point, kwargs, time limit, reward threshold, wrappers, ...) as
    text: a registration changed in place (`gymnasium.spec(id).kwargs[...] = ...`, Gymnasium's EnvSpec is not frozen)
    makes another game, whose spec a kept one must not stand for."""
    return repr(registration)


def _spec_key(env_id: str, env_kwargs: dict | None) -> tuple[str, str]:
    return env_id, repr(sorted((env_kwargs or {}).items()))


def atari_spec(env_id: str, env: gym.Env, env_kwargs: dict | None = None) -> EnvSpec:
    """The EnvSpec of a preprocessed Atari env (`make_atari_env`'s) of `env_id`, made with the options
    `env_kwargs` (kept for `known_spec`)."""
    registration = gym.spec(env_id)
    made = EnvSpec.from_spaces(env_id, env.observation_space, env.action_space, max_episode_steps(env_id, env_kwargs),
                               registration.reward_threshold)
    key = _spec_key(env_id, env_kwargs)
    _specs[key] = (registration, _registered_as(registration), made)
    _specs.move_to_end(key)
    while len(_specs) > _SPECS_KEPT:
        _specs.popitem(last=False)
    return made


def with_options(spec: EnvSpec, env_kwargs: dict | None) -> EnvSpec:
    """`spec` (`atari_spec`'s, whose time limit already counts the options' agent steps) with the options recorded
    (`EnvSpec.with_options`), its time limit kept: `max_episode_steps=-1` (`NO_TIME_LIMIT`) leaves ALE's own
    truncation, which ends the game all the same, where a Gymnasium env has none."""
    return dataclasses.replace(spec.with_options(env_kwargs), max_episode_steps=spec.max_episode_steps)


def known_spec(env_id: str, env_kwargs: dict | None = None) -> EnvSpec | None:
    """`atari_spec` of `env_id` with the options `env_kwargs` where this process made that game already (and the id
    is still registered as it was then: the same registration, unchanged), else None: the spec without a ROM load."""
    kept = _specs.get(_spec_key(env_id, env_kwargs))
    if kept is None:
        return None
    registration = gym.spec(env_id)
    if registration is not kept[0] or _registered_as(registration) != kept[1]:
        return None
    return kept[2]


def stacked_frames(env: BatchedEnv) -> int | None:
    """Frames per observation when `env` (through its wrappers) gives preprocessed Atari frame stacks, whose
    channels are the last `FRAME_STACK` frames of the game, newest last (this module's Gymnasium env, or the EnvPool
    backend's Atari task); else None. The replay buffer stores such frames once (`FrameStackReplayBuffer`)."""
    inner = env
    while isinstance(inner, EnvWrapper):
        inner = inner.env
    atari_env = isinstance(inner, AtariGymnasiumEnv) or (getattr(inner, "backend", None) == "envpool"
                                                         and getattr(inner, "atari", False))
    return FRAME_STACK if atari_env and inner.spec.observation_shape == (FRAME_STACK, SCREEN_SIZE, SCREEN_SIZE) \
        else None


class _RecordLives(gym.vector.VectorWrapper):
    """Keeps the lives of the last step's info (ALE puts them there) of a subprocess vector env."""

    def __init__(self, env: gym.vector.VectorEnv):
        super().__init__(env)
        self.lives = np.zeros(env.num_envs, dtype=np.int32)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.lives = np.asarray(info["lives"], dtype=np.int32)
        return obs, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.lives = np.asarray(info["lives"], dtype=np.int32)
        return obs, reward, terminated, truncated, info


class AtariGymnasiumEnv(GymnasiumEnv):
    """N preprocessed Atari envs (`make_atari_env`) in a Gymnasium vector env (sync or subprocesses), SAME_STEP
    autoreset, with each env's lives in `info["lives"]`. `envs`: existing `make_atari_env` envs of `env_id` (in
    whatever state they are) to step synchronously instead of new ones (a population keeping some of its rows)."""

    def __init__(self, env_id: str, num_envs: int = 1, device: torch.device | str = "cpu",
                 vectorization: str = "sync", env_kwargs: dict | None = None, envs: list[gym.Env] | None = None):
        if vectorization not in ("sync", "async"):
            raise UserError(f"Unknown vectorization '{vectorization}': use sync or async.")
        env_kwargs = dict(env_kwargs or {})
        vector_kwargs = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "copy": False}
        if envs is not None:
            spec = atari_spec(env_id, envs[0], env_kwargs)
            vector_env = gym.vector.SyncVectorEnv([lambda env=env: env for env in envs], **vector_kwargs)
        else:
            spec = known_spec(env_id, env_kwargs)
            if spec is None:
                probe = make_atari_env(env_id, **env_kwargs)  # fails here, in this process, on a bad option
                try:
                    spec = atari_spec(env_id, probe, env_kwargs)
                finally:
                    probe.close()
            factories = [lambda: make_atari_env(env_id, **env_kwargs)] * num_envs
            if vectorization == "sync":
                vector_env = gym.vector.SyncVectorEnv(factories, **vector_kwargs)
            else:
                vector_env = _RecordLives(gym.vector.AsyncVectorEnv(factories, **vector_kwargs))
        super().__init__(env_id, vector_env=vector_env, device=device, from_id=True)
        # (the id's time limit in agent steps: the vector env's spec has none)
        self.spec = with_options(spec, env_kwargs)

    @property
    def splits_steps(self) -> bool:
        """False: the lives come with `step` (see `GymnasiumEnv.splits_steps`)."""
        return False

    def _lives(self) -> torch.Tensor:
        if self._sync_envs is not None:
            lives = np.fromiter((env.unwrapped.ale.lives() for env in self._sync_envs), np.int32, self.num_envs)
        else:
            lives = self.vector_env.lives
        return torch.as_tensor(lives, device=self.device)

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset the N games (env i seeded with `seed + i`); info holds their lives."""
        obs, info = super().reset(seed=seed)
        return obs, {**info, "lives": self._lives()}

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the N games (finished ones restart in the same step); info adds their lives."""
        obs, reward, terminated, truncated, info = super().step(actions)
        info["lives"] = self._lives()
        return obs, reward, terminated, truncated, info


class AtariTraining(EnvWrapper):
    """The training-only Atari transforms: a lost life ends the learner's episode, and rewards are clipped to their
    sign (module docstring). Wraps an env whose info carries `lives` (both Atari adapters, under EpisodeStatistics).

    A row whose life was lost is `terminated` but not reset: the game goes on, so its `obs` is the next state of the
    same game and `info["final_obs"]` equals it. `info["done"]` and the episode statistics still mark whole games.
    """

    def __init__(self, env: BatchedEnv, episodic_life: bool = True, clip_rewards: bool = True):
        super().__init__(env)
        self.episodic_life, self.clip_rewards = episodic_life, clip_rewards
        self._lives = torch.zeros(self.num_envs, dtype=torch.int32, device=self.device)

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset the inner env and note each game's lives."""
        obs, info = self.env.reset(seed=seed)
        self._lives = info["lives"]
        return obs, info

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the inner env; a life lost (fewer lives, same game) sets `terminated`; rewards become their sign."""
        obs, reward, terminated, truncated, info = self.env.step(actions)
        lives = info["lives"]
        if self.episodic_life:
            # a finished game restarts with its full lives, so only a drop within one game counts
            terminated = terminated | ((lives < self._lives) & ~(terminated | truncated))
        self._lives = lives
        if self.clip_rewards:
            reward = torch.sign(reward)
        return obs, reward, terminated, truncated, info

    def _own_state(self) -> dict[str, torch.Tensor]:
        return {"_lives": self._lives}


@functools.cache
def fire_action(env_id: str) -> int | None:
    """The index of FIRE when `env_id`'s game has it as its second action, as Gymnasium's and Stable-Baselines3's
    `FireResetEnv` require (Breakout, Pong, SpaceInvaders, ...; not MsPacman); else None."""
    env = gym.make(env_id)
    try:
        meanings = env.unwrapped.get_action_meanings()
    finally:
        env.close()
    return 1 if len(meanings) >= 3 and meanings[1] == "FIRE" else None


#: steps FIRE is pressed for at a game's start and after a lost life where actions are sticky (`fire_steps`)
STICKY_FIRE_STEPS = 2


def fire_steps(env_id: str, env_kwargs: dict | None = None) -> int:
    """How many steps `FireToStart` presses FIRE for at a game's start and after a lost life in `env_id` made with
    the options `env_kwargs`: `STICKY_FIRE_STEPS` where actions are sticky (`repeat_action_probability` above 0: the
    v5 ids), else 1. A sticky action may repeat the previous one in place of FIRE, leaving the ball unserved, and a
    policy that never fires would then stand still until ALE ends the game (tests/test_atari_evaluation.py counts the
    unserved games)."""
    registered = gym.spec(env_id).kwargs or {}
    sticky = (env_kwargs or {}).get("repeat_action_probability", registered.get("repeat_action_probability", 0.0))
    return STICKY_FIRE_STEPS if float(sticky or 0.0) > 0 else 1


class FireToStart(EnvWrapper):
    """For evaluation: the first action of every game and the first after every lost life is FIRE, in place of the
    policy's, in games whose second action is FIRE (`fire_action`). Some games (Breakout) wait for FIRE to serve the
    ball, and a deterministic policy that never chooses it (an untrained one, often) would stand still until ALE
    ends the game after 27,000 steps; peers press it for the policy the same way (Stable-Baselines3's and CleanRL's
    `FireResetEnv` after every reset, which their episodic-life wrapper makes after every lost life too; EnvPool's
    `use_fire_reset`). Training envs are left as Gymnasium's wrappers make them (`make_env`), unless made with the
    `fire_reset` option (`FireReset`, in hidden steps, then also for evaluation); `rlspeed.evaluate` wraps its env
    in this (`for_evaluation`) where the env does not press FIRE itself.

    The FIRE is a step of the game the policy sees, with its reward (none in these games) counted in the episode.
    `fire`: the FIRE action's index; `steps`: how many steps FIRE is pressed for each time (`fire_steps`: 2 where
    actions are sticky).
    """

    def __init__(self, env: BatchedEnv, fire: int, steps: int = 1):
        super().__init__(env)
        self.fire, self.steps = fire, steps
        self._pending = torch.full((self.num_envs,), steps, dtype=torch.int32, device=self.device)
        self._lives = torch.zeros(self.num_envs, dtype=torch.int32, device=self.device)

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset the games; each one's next actions are FIRE."""
        obs, info = self.env.reset(seed=seed)
        self._pending = torch.full((self.num_envs,), self.steps, dtype=torch.int32, device=self.device)
        self._lives = info["lives"]
        return obs, info

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step with FIRE in the rows whose game just started or lost a life, the given actions elsewhere."""
        actions = torch.where(self._pending > 0, torch.full_like(actions, self.fire), actions)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        lives = info["lives"]
        restarted = terminated | truncated | (lives < self._lives)
        self._pending = torch.where(restarted, self.steps, (self._pending - 1).clamp(min=0)).to(torch.int32)
        self._lives = lives
        return obs, reward, terminated, truncated, info


def for_evaluation(env: BatchedEnv) -> BatchedEnv:
    """`env` wrapped in `FireToStart` when it is a preprocessed Atari game that waits for FIRE, else `env` (also for
    envs made with `fire_reset` without sticky actions, which press it themselves)."""
    if stacked_frames(env) is None or (fire := fire_action(env.spec.env_id)) is None:
        return env
    options = env.spec.env_kwargs or {}
    steps = fire_steps(env.spec.env_id, options)
    # (fire_reset presses FIRE once, as the peers' FireResetEnv: where actions are sticky that can leave the ball
    # unserved, and FireToStart's presses go on top)
    return env if options.get("fire_reset") and steps == 1 else FireToStart(env, fire, steps)


__all__ = ["register_atari", "is_atari", "atari_image_id", "preprocessed", "make_atari_env", "atari_spec", "known_spec",
           "with_options", "max_episode_steps", "FireReset", "fire_reset_option", "AtariGymnasiumEnv", "AtariTraining",
           "stacked_frames", "fire_action", "fire_steps", "FireToStart", "for_evaluation", "NOOP_MAX", "FRAME_SKIP",
           "SCREEN_SIZE", "FRAME_STACK", "STICKY_FIRE_STEPS"]
