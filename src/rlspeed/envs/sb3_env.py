"""Adapter from a Stable-Baselines3 `VecEnv` (DummyVecEnv, SubprocVecEnv, their wrappers) to the batched contract.

SB3's vector envs already reset a finished env within the same step, as rlspeed's contract does: the returned
observation of that row is the new episode's first, and `infos[i]["terminal_observation"]` holds the true last
observation. They report one `done` flag; `infos[i]["TimeLimit.truncated"]` says the episode was cut by a time
limit rather than ended, which is what `truncated` means here. Stable-Baselines3 itself is not imported: any object
with SB3's VecEnv methods is accepted.
"""

from __future__ import annotations

import multiprocessing.connection
import sys
import time
import typing
import warnings
import weakref

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs.base import BatchedEnv, EnvSpec, ResetResult, StepResult
from rlspeed.envs.gymnasium_env import (
    _NUMPY_DIR,
    USER_SB3_VEC_ENV,
    HostObservations,
    _envs_time_limit,
    _to_numpy_actions,
    _vector_env_spec,
    add_success,
    check_action_masks,
    close_other_backend,
    float32_rewards,
    host_tensor,
    host_to,
    mask_size,
    obs_and_final,
    probe_contract,
    recorded_seed,
    records_episodes,
    refuse_failed_asks,
    registered_vector_env_id,
    reward_problem,
    reward_wrappers,
    success_flag,
    success_key,
    to_device,
    warn_step_only_masks,
    warn_unapplied_masks,
    warn_unseeded_reset,
    worker_exit_error,
)
from rlspeed.errors import UserError

_VEC_ENV_METHODS = ("reset", "step_async", "step_wait", "get_attr", "close")


#: a Stable-Baselines3 VecEnv (step_async, step_wait, reset, close) where rlspeed takes one: Any, since
#: Stable-Baselines3 is an optional dependency that type checkers may not find
VecEnvLike: typing.TypeAlias = typing.Any


def is_sb3_vec_env(env: object) -> bool:
    """Whether `env` has Stable-Baselines3's VecEnv interface (and is not a Gymnasium vector env)."""
    return (not isinstance(env, gym.vector.VectorEnv) and all(callable(getattr(env, m, None)) for m in _VEC_ENV_METHODS)
            and hasattr(env, "num_envs") and hasattr(env, "observation_space") and hasattr(env, "action_space"))


def reported_reward_wrappers(env) -> list[str]:
    """The wrappers around a Gymnasium or Stable-Baselines3 vector env, or the envs inside it, that change the rewards
    whose sums are the episode returns reported (`reward_wrappers`): those under the layer whose episodes are read
    (SB3's `Monitor` around every env, Gymnasium's `RecordEpisodeStatistics`) change none."""
    return reward_wrappers(env, below_monitor=(is_sb3_vec_env(env) and monitored(env)) or records_episodes(env))


def vec_normalize_of(env, normalising: str | None = None):
    """The Stable-Baselines3 `VecNormalize` among the wrappers of `env` (an SB3 VecEnv, or a batched env holding one
    as `vec_env`, as rlspeed's adapter and the wrappers over it do), or None; with `normalising` ("norm_obs" or
    "norm_reward"), only one that normalises that. None without Stable-Baselines3 installed (a VecEnv of another
    package with SB3's interface holds no VecNormalize); SB3 is imported only for an env that holds a VecEnv."""
    vec_env = env if is_sb3_vec_env(env) else getattr(env, "vec_env", None)
    if vec_env is None:
        return None
    try:
        from stable_baselines3.common.vec_env import unwrap_vec_normalize
    except ImportError:
        return None
    normalizer = unwrap_vec_normalize(vec_env)
    return normalizer if normalizer is not None and (normalising is None or getattr(normalizer, normalising)) else None


_WARNED_UNSEEDED: set[str] = set()


def _warn_unseeded(vec_env, error: AttributeError) -> None:
    """Warn once per VecEnv class that it cannot be seeded (its `seed()` raised `error`)."""
    name = type(vec_env).__name__
    if name in _WARNED_UNSEEDED:
        return
    _WARNED_UNSEEDED.add(name)
    warnings.warn(f"This {name} cannot be seeded (its seed() raised AttributeError: {error}), so its episodes start "
                  "unseeded: training and evaluation on it are not reproducible.", UserWarning, stacklevel=4)


def vec_env_has_attr(vec_env, name: str) -> bool:
    """Whether the envs of an SB3 VecEnv have attribute `name` (its `has_attr`). False for a VecEnv without
    `has_attr`, and for one whose `has_attr` raises AttributeError: SuperSuit's `concat_vec_envs_v1(...,
    base_class="stable_baselines3")` inherits SB3's, which asks the vector env inside, and that has none (SB3's own
    VecEnvs answer False where `get_attr` raises AttributeError)."""
    has_attr = getattr(vec_env, "has_attr", None)
    try:
        return callable(has_attr) and bool(has_attr(name))
    except AttributeError:
        return False
    except Exception as error:  # (a SubprocVecEnv's worker that ended: named)
        raise_exited_workers(vec_env, error)
        raise


#: the SubprocVecEnvs a step, reset or question to which met the end of a worker's pipe (`raise_exited_workers`):
#: they cannot go on, and `SB3VecEnv.close` ends their workers left (`_close_workers_left`)
_WORKERS_ENDED: weakref.WeakSet = weakref.WeakSet()


def raise_exited_workers(vec_env, error: BaseException) -> None:
    """Where asking SB3's SubprocVecEnv `vec_env` (or the one it wraps) met the end of a worker's pipe (`error`:
    EOFError, a broken pipe), ChildProcessError naming the workers that exited and their exit codes
    (`worker_exit_error`: an error in the env ends an SB3 worker, which prints its traceback); else nothing. Either
    way the VecEnv is marked (`_WORKERS_ENDED`), for its close."""
    inner = getattr(vec_env, "unwrapped", vec_env)
    if not isinstance(error, (EOFError, OSError)) or not isinstance(getattr(inner, "processes", None), list):
        return
    _WORKERS_ENDED.add(inner)
    exited = worker_exit_error(inner, wait_s=WORKER_EXIT_WAIT_S)
    if exited is not None:
        raise exited from error


def monitored(vec_env) -> bool:
    """Whether every env of an SB3 VecEnv is wrapped in SB3's `Monitor` (`make_vec_env` and `make_atari_env` wrap
    them), as SB3 asks it (`env_is_wrapped`); False without Stable-Baselines3 or for a VecEnv that cannot say."""
    try:
        from stable_baselines3.common.monitor import Monitor
    except ImportError:
        return False
    try:
        return bool(all(vec_env.env_is_wrapped(Monitor)))
    except Exception:  # (a VecEnv of another package with SB3's interface, without env_is_wrapped)
        return False


def _raised_by(error: BaseException, owner) -> bool:
    """Whether `error` was raised in a method of `owner` or of a Gymnasium wrapper (its innermost frame outside numpy):
    where SB3's DummyVecEnv, or a wrapper around its envs (SB3's Monitor), calls an env and unpacks what it returns,
    not inside an env."""
    frame, tb = None, error.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_NUMPY_DIR):
            frame = tb.tb_frame
        tb = tb.tb_next
    return frame is not None and (frame.f_locals.get("self") is owner or isinstance(frame.f_locals.get("self"),
                                                                                  gym.Wrapper))


#: how long a step or reset that read the end of a SubprocVecEnv worker's pipe waits for a worker to exit (it does as
#: its pipe ends; a generous bound for a loaded machine, waited only where a worker ended)
WORKER_EXIT_WAIT_S = 30.0


#: how long the close of a SubprocVecEnv one of whose workers ended waits for the workers left to close their envs
#: (SB3's "close" command) before it terminates them
WORKERS_CLOSE_WAIT_S = 30.0

#: how long that close waits for the workers it terminated to end before it kills those left (an env that ignores
#: SIGTERM): one bound for them all
WORKER_TERMINATE_WAIT_S = 5.0


def _close_workers_left(inner) -> None:
    """Close SB3's SubprocVecEnv `inner` one of whose workers ended: each live worker is sent SB3's "close" command,
    so that its env's close() runs (a file, a simulator process it holds), while the answers they still give are read
    (the step or reset that broke, which a worker may send after the command: a large one would block its send); those
    not ended within `WORKERS_CLOSE_WAIT_S` are terminated, and killed where they outlive that by
    `WORKER_TERMINATE_WAIT_S`. SB3's own close would read the ended worker's pipe first and stop on EOFError."""
    live = [(process, remote) for process, remote in zip(inner.processes, inner.remotes) if process.is_alive()]
    for _process, remote in live:
        try:
            remote.send(("close", None))
        except (EOFError, OSError):  # (it ended meanwhile)
            pass
    deadline = time.monotonic() + WORKERS_CLOSE_WAIT_S
    waiting = {process.sentinel: process for process, _remote in live}
    answering = [remote for _process, remote in live]
    while waiting and (left := deadline - time.monotonic()) > 0:
        for ready in multiprocessing.connection.wait([*waiting, *answering], timeout=left):
            if isinstance(ready, int):
                waiting.pop(ready, None)
                continue
            try:
                ready.recv()  # (an answer given after all: read, so that the worker goes on to the command)
            except (EOFError, OSError):  # (its pipe ended: the worker did, or is about to)
                answering.remove(ready)
    for process in waiting.values():
        process.terminate()
    deadline = time.monotonic() + WORKER_TERMINATE_WAIT_S  # (one bound for them all, terminated together)
    for process in waiting.values():
        process.join(max(deadline - time.monotonic(), 0.0))
        if process.is_alive():
            process.kill()
    for process in inner.processes:
        process.join()
    for remote in inner.remotes:  # (SB3's close does too: each is a file descriptor)
        remote.close()
    inner.closed = True


class _CheckedAnswers:
    """A SubprocVecEnv's pipe to one worker (its `remotes`), in its place while its `step_wait` reads the answers
    (`recv`, all it calls): each answer's reward, (observation, reward, done, info, reset info), is checked
    (`reward_problem`, as `name`) as it arrives: `problem`, the first."""

    def __init__(self, remote, name: str):
        self._remote, self._name, self.problem = remote, name, None

    def recv(self):
        answer = self._remote.recv()
        if self.problem is None and isinstance(answer, tuple) and len(answer) > 1:
            self.problem = reward_problem(self._name, answer[1])
        return answer


class SB3VecEnv(BatchedEnv):
    """N envs of a Stable-Baselines3 VecEnv behind the batched contract (tensors on `device`).

    `vec_env`: the VecEnv, its wrappers included (a VecNormalize that normalises rewards gives its original ones in
    `info["raw_reward"]`); N is its `num_envs`.
    """

    backend = "sb3"
    nan_reward_cause = ("a reward was NaN: a Stable-Baselines3 VecEnv stores an env's reward of None as NaN, so its "
                        "env's step() may have returned None, or another value that is no number, as its reward")

    def __init__(self, vec_env, device: torch.device | str = "cpu"):
        self.vec_env = vec_env
        self.device = torch.device(device)
        self.num_envs = int(vec_env.num_envs)
        obs_space, action_space = vec_env.observation_space, vec_env.action_space
        spec = _vector_env_spec(vec_env)  # the first env's: SB3's VecEnvs have no spec of their own
        max_steps = _envs_time_limit(vec_env, spec.max_episode_steps if spec is not None else None)
        # see GymnasiumEnv: the id only if it rebuilds, with the envs' time limit
        registered = (registered_vector_env_id(vec_env) is not None and spec is not None
                      and max_steps == spec.max_episode_steps)
        self.spec = EnvSpec.from_spaces(spec.id if registered else USER_SB3_VEC_ENV, obs_space, action_space,
                                        max_steps, spec.reward_threshold if registered else None)
        refuse_failed_asks(vec_env)
        self._host = HostObservations(self.spec.observation_space)
        self._float_vector = self.spec.float_vector_obs
        # Action masks as sb3-contrib's MaskablePPO reads them, the envs' `action_masks()` method, or (Gymnasium's
        # Taxi) their infos' "action_mask" (a reset's in the innermost VecEnv's `reset_infos`: SB3's VecEnv wrappers
        # keep lists of their own that stay empty; seen at the first reset)
        self._mask_method = vec_env_has_attr(vec_env, "action_masks")
        self._maskable = mask_size(self.spec.action_space) is not None
        self.has_action_masks = self._maskable and self._mask_method
        if self._mask_method and not self.has_action_masks:
            warn_unapplied_masks(self.spec, self)
        self._step_masks_checked = False  # (whether the first step's infos were looked at for masks, see `_masks`)
        self.reports_success = False  # (True once a finished episode's info has a success flag: success_key)
        #: the VecEnv's VecNormalize where it normalises rewards (its original rewards go to `info["raw_reward"]`)
        self._normalizer = vec_normalize_of(vec_env, "norm_reward")
        #: whether each env is in SB3's Monitor, whose episodes and returns are the ones counted (`EpisodeStatistics`)
        self._monitored = monitored(vec_env)
        self._first_step = True  # (its rewards are checked: `_first_step_wait`)

    def _masks(self, infos=None, finished=()) -> dict:
        """{"action_mask": bool [N, n] on the device} for the current observations, from the envs' `action_masks()`
        or their infos (`infos`: a step's, whose `finished` rows' masks are in `reset_infos`: their observations
        start new episodes; None: the reset's), or {} without masks."""
        if not self.has_action_masks:
            if infos is not None and not self._step_masks_checked:  # (the first step's: masks not learnt of at reset)
                self._step_masks_checked = True
                if self._maskable and any("action_mask" in row for row in infos):
                    warn_step_only_masks(self.spec, self)
            return {}
        if self._mask_method:
            try:
                masks, source = self.vec_env.env_method("action_masks"), f"{self.spec.env_id}'s action_masks()"
            except Exception as error:  # (a worker that ended: named, as a step names it)
                self._name_exited_workers(error)
                raise
        else:
            rows = list(self._reset_infos() or [{}] * self.num_envs)
            if infos is not None:  # (a step's: finished rows' new observations have their reset's masks)
                restarted = set(np.asarray(finished).tolist())
                rows = [rows[i] if i in restarted else infos[i] for i in range(self.num_envs)]
            masks, source = [row.get("action_mask") for row in rows], f"{self.spec.env_id}'s info['action_mask']"
            if any(mask is None for mask in masks):
                missing = next(i for i, mask in enumerate(masks) if mask is None)
                raise UserError(f"{source}: env {missing} gave no action mask with this observation, though the "
                                "envs gave one at their reset: give one with every observation.")
        masks = check_action_masks(masks, self.spec.action_space, self.num_envs, source)
        return {"action_mask": torch.as_tensor(masks, device=self.device)}

    def _reset_infos(self) -> list | None:
        """The reset infos of the innermost VecEnv (SB3's wrappers, VecMonitor and VecNormalize, keep their own list,
        which stays empty)."""
        return getattr(getattr(self.vec_env, "unwrapped", self.vec_env), "reset_infos", None)

    def _masks_in_reset_infos(self) -> None:
        """After a reset: masks in the envs' reset infos (`info["action_mask"]`, as Gymnasium's Taxi gives them) are
        applied from now on, where the action space takes masks (else a warning)."""
        reset_infos = self._reset_infos() or []
        if self._mask_method or not any("action_mask" in info for info in reset_infos):
            return
        self.has_action_masks = self._maskable
        if not self._maskable:
            warn_unapplied_masks(self.spec, self)

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset every env (SB3 seeds env i with `seed + i` when a seed is given) and return (obs, info); info holds
        `action_mask` where the envs give masks (an `action_masks()` method, or `info["action_mask"]`)."""
        if seed is not None:
            try:
                self.vec_env.seed(seed)
            except AttributeError as error:
                # SuperSuit's concat_vec_envs_v1(..., base_class="stable_baselines3") inherits SB3's seed(), which
                # asks the vector env inside, and that has none (its own reset(seed=...) calls the same seed()):
                # such a VecEnv runs unseeded, said once per VecEnv class, rather than stop every seeded model and
                # every evaluation (EvalCallback always seeds)
                _warn_unseeded(self.vec_env, error)
        try:
            obs = self.vec_env.reset()
        except Exception as error:
            self._name_contract_breach("reset", error)
            self._name_exited_workers(error)
            raise
        if seed is not None:  # (a DummyVecEnv's envs, seeded seed + i by its seed(): SubprocVecEnv's are elsewhere)
            envs = getattr(getattr(self.vec_env, "unwrapped", self.vec_env), "envs", None)
            for index, env in enumerate(envs if isinstance(envs, list) else []):
                warn_unseeded_reset(self.spec.env_id, recorded_seed(env), seed + index, self)
        infos = self._reset_infos() or []
        bad = next((i for i, info in enumerate(infos) if not isinstance(info, dict)), None)
        if bad is not None:  # (SB3 unpacked an old-API reset's observation of 2 values as (obs, info))
            raise UserError(self._probe("reset") or f"Env {bad} of this VecEnv gave a reset info of type "
                            f"{type(infos[bad]).__name__}: Gymnasium's reset returns (obs, info), info a dict.")
        self._masks_in_reset_infos()
        if self._float_vector:
            return host_tensor(obs, self.device), self._masks()
        return to_device(self._host.batch(obs), self.device), self._masks()

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the VecEnv and return the batched contract's tensors; `info` holds `final_obs` (and `action_mask`,
        for the returned observations, where the envs give masks; `is_success` once an episode's info
        has a success flag (`success_key`), as for Gymnasium envs)."""
        numpy_actions = _to_numpy_actions(actions, self.spec.action_space)
        try:
            self.vec_env.step_async(numpy_actions)  # (a SubprocVecEnv's send: a worker that ended breaks it)
            if self._first_step:
                self._first_step = False
                obs, rewards, dones, infos = self._first_step_wait()
            else:
                obs, rewards, dones, infos = self.vec_env.step_wait()
        except Exception as error:
            self._name_contract_breach("step", error, numpy_actions)
            self._name_exited_workers(error)
            raise
        obs = np.array(obs, dtype=np.float32) if self._float_vector else self._host.batch(obs)
        dones = np.asarray(dones, dtype=bool).reshape(-1)
        finished = np.flatnonzero(dones)
        if np.size(rewards) != self.num_envs or dones.size != self.num_envs:
            raise UserError(f"This VecEnv of {self.num_envs} envs returned {np.size(rewards)} rewards and "
                            f"{dones.size} dones from step_wait(): one of each per env.")
        lacking = [int(row) for row in finished if "terminal_observation" not in infos[row]]
        if lacking:
            raise UserError(f"This VecEnv gave no infos[{lacking[0]}]['terminal_observation'] for a finished env: "
                            "SB3's VecEnvs (DummyVecEnv, SubprocVecEnv) put the episode's last observation there, and "
                            "a VecEnv of your own must too (rlspeed bootstraps truncated episodes from it).")
        truncated = np.zeros_like(dones)
        if len(finished):
            truncated[finished] = [bool(infos[row].get("TimeLimit.truncated", False)) for row in finished]
        if self._float_vector:
            shape = self.spec.observation_shape
            obs_t, final_t = obs_and_final(obs, finished, self.device,
                                           lambda row: np.asarray(infos[row]["terminal_observation"]).reshape(shape))
        else:
            obs_t, final_t = obs_and_final(obs, finished, self.device,
                                           lambda row: infos[row]["terminal_observation"], self._host)
        info = {"final_obs": final_t, "final_rows": finished, **self._masks(infos, finished)}
        if self._normalizer is not None:  # episode returns are the env's own rewards', as SB3's Monitor records them
            info["raw_reward"] = host_tensor(self._normalizer.get_original_reward(), self.device).reshape(-1)
        if self._monitored:
            # the Monitor's episodes, as SB3 reports them (`make_atari_env`: whole games, raw scores, where a lost
            # life ends the learner's episode and its rewards are clipped)
            ended = np.array([isinstance(row.get("episode"), dict) for row in infos], dtype=bool)
            returns = np.array([float(row["episode"]["r"]) if end else 0.0 for row, end in zip(infos, ended)],
                               dtype=np.float32)
            info["episode_ends"] = (host_to(ended, self.device), host_to(returns, self.device))
        add_success(self, info, {int(row): success_flag(infos[row][key], key) for row in finished
                                 if (key := success_key(infos[row])) is not None})
        return (obs_t, host_to(float32_rewards(rewards, self), self.device).reshape(-1),
                host_to(dones & ~truncated, self.device), host_to(truncated, self.device),
                info)

    def _first_step_wait(self) -> tuple:
        """`step_wait` at the first step, each env's reward checked as the Gymnasium backends check it
        (`reward_problem`): SB3 stores a reward of None as NaN, which the NaN guard stops without naming the reward,
        and "1.0" as 1.0. The envs of a DummyVecEnv (in this process), which writes rewards into a float32 buffer,
        are checked as they return (their `step`, for this step only); a SubprocVecEnv's as its workers' answers
        arrive (`_CheckedAnswers`: stacked with numbers, a text reward makes every row's text); another VecEnv's
        stacked rewards here."""
        def name(index: int) -> str:
            return f"'{self.spec.env_id}'.step() of env {index}"

        envs = getattr(getattr(self.vec_env, "unwrapped", self.vec_env), "envs", None)
        # each env's innermost object by its index (the first index where one object is in several rows)
        indices = {}
        for index, env in enumerate(envs if isinstance(envs, list) else []):
            if isinstance(env, gym.Env):
                indices.setdefault(id(env.unwrapped), (index, env.unwrapped))
        inner = [env for _, env in indices.values()]
        own = [vars(env).get("step") for env in inner]  # (a step set on the instance: put back after)

        def checked(step, index: int):
            def step_checked(action):
                stepped = step(action)
                problem = (reward_problem(name(index), stepped[1]) if isinstance(stepped, tuple) and len(stepped) > 1
                           else None)
                if problem:
                    raise UserError(problem)
                return stepped
            return step_checked

        for index, env in indices.values():
            env.step = checked(env.step, index)
        vec_env = getattr(self.vec_env, "unwrapped", self.vec_env)
        remotes = getattr(vec_env, "remotes", None)
        answers = ([_CheckedAnswers(remote, name(index)) for index, remote in enumerate(remotes)]
                   if isinstance(remotes, (list, tuple)) and len(remotes) == self.num_envs else None)
        if answers is not None:
            vec_env.remotes = type(remotes)(answers)
        try:
            stepped = self.vec_env.step_wait()
        finally:
            for env, step in zip(inner, own):
                if step is None:
                    del env.step
                else:
                    env.step = step
            if answers is not None:
                vec_env.remotes = remotes
        problem = next(filter(None, (each.problem for each in answers or ())), None)
        if problem:  # (raised once every answer is read: the VecEnv waits for none, and closes as always)
            raise UserError(problem)
        rewards = np.asarray(stepped[1])
        if rewards.dtype.kind in "OUS":  # (stacked text: every row's is text, numbers too, so no row is named)
            problem = next(filter(None, (reward_problem(name(index) if rewards.dtype.kind == "O" else
                                                        f"'{self.spec.env_id}'.step()", reward)
                                         for index, reward in enumerate(rewards.ravel()))), None)
            if problem:
                raise UserError(problem)
        return stepped

    def _name_contract_breach(self, call: str, error: Exception, actions=None) -> None:
        """UserError naming what an env inside a DummyVecEnv returned against Gymnasium's contract, where the VecEnv
        raised calling or unpacking it (an env of the old gym API: SB3's "not enough values to unpack (expected 5,
        got 4)", "reset() got an unexpected keyword argument 'seed'"), found by calling its first env once more
        (`probe_contract`: the run fails anyway); nothing where the error came from inside an env."""
        inner = getattr(self.vec_env, "unwrapped", self.vec_env)
        if isinstance(error, UserError) or not _raised_by(error, inner):
            return
        problem = self._probe(call, actions)
        if problem:
            raise UserError(problem) from error

    def _name_exited_workers(self, error: Exception) -> None:
        """Where a SubprocVecEnv's step or reset met the end of a worker's pipe (`error`: EOFError, a broken pipe):
        ChildProcessError naming the workers that exited and their exit codes (an error in the env ends an SB3
        worker, which prints its traceback; the parent heard only "EOFError"; a worker killed between steps breaks the
        next step's send to it). The VecEnv cannot go on either way:
        its `close` ends the workers left (`raise_exited_workers` marks it)."""
        raise_exited_workers(self.vec_env, error)

    def _probe(self, call: str, actions=None) -> str | None:
        """`probe_contract` of the first env inside a DummyVecEnv (None for a VecEnv whose envs are elsewhere)."""
        envs = getattr(getattr(self.vec_env, "unwrapped", self.vec_env), "envs", None)
        if not envs:
            return None
        shape = self.spec.observation_shape if self._float_vector else None
        return probe_contract(self.spec.env_id, call, envs[0], shape, None if actions is None else actions[0])

    def close(self) -> None:
        """Close the VecEnv (for SubprocVecEnv, its worker processes too); an error of an env's close() is an
        `EnvStepError` naming the env, kept or raised as `close_envs` says (`close_other_backend`)."""
        inner = self.vec_env.unwrapped
        # (a step, a reset or a question that met a worker's end: `raise_exited_workers`)
        workers_ended = isinstance(getattr(inner, "processes", None), list) and inner in _WORKERS_ENDED
        if workers_ended and not getattr(inner, "closed", True):
            # (the step or reset that a worker's end broke said so: SB3's close would read the dead worker's pipe and
            # raise EOFError again; the workers left close their envs, and the wrappers close over none)
            _close_workers_left(inner)
        dummy = getattr(sys.modules.get("stable_baselines3.common.vec_env.dummy_vec_env"), "DummyVecEnv", None)
        if dummy is None or type(inner).close is not dummy.close:
            close_other_backend(self.vec_env.close, self.spec.env_id, self.backend,
                                inner if isinstance(getattr(inner, "processes", None), list)
                                and not workers_ended else None)
            return
        # (DummyVecEnv's close is a loop over its envs that stops at the first whose close raises: each is closed
        # first, every error said; its wrappers' close then runs over none of them, and the VecEnv keeps its envs)
        envs = inner.envs

        def close_wrappers():
            inner.envs = []
            try:
                self.vec_env.close()
            finally:
                inner.envs = envs

        close_other_backend(close_wrappers, self.spec.env_id, self.backend, envs=list(envs))
