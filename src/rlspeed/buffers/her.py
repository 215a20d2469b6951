"""Hindsight Experience Replay (Andrychowicz et al. 2017), as Stable-Baselines3's `HerReplayBuffer` defines it.

Goal-conditioned envs (Gymnasium-Robotics' Fetch and other `GoalEnv`s, SB3's `BitFlippingEnv`) return Dict
observations with `achieved_goal` and `desired_goal` keys and have a `compute_reward(achieved_goal, desired_goal,
info)` method that takes batches. A sampled transition is relabelled with probability `1 - 1 / (n_sampled_goal +
1)`: its `desired_goal` (in `obs` and `next_obs`) becomes an `achieved_goal` of a `next_obs` of the same episode in
the same env, and its reward becomes `compute_reward(next_obs achieved_goal, new goal, {})`:

- `future`: a transition of the same episode at this step or later (SB3's default);
- `final`: the episode's last transition;
- `episode`: any transition of the episode still stored.

As in SB3, `terminated` stays what the env said (a relabelled goal reached does not end the episode), and
`compute_reward` gets empty info dicts (SB3's `copy_info_dict=False`). Unlike SB3, which samples only transitions
of finished episodes, every stored transition is sampled: one of an episode still running takes its goal from the
steps stored so far.

Bookkeeping: each row keeps the step it was written at (one step is one `add` of all N envs, so the row of env `e`
at step `t` is `(t * N + e) % capacity`), the step its episode started at and, once it finished, the step it ended
at (-1 while it runs): 24 bytes per transition more, which `bytes_per_transition` counts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from rlspeed.buffers.replay import ReplayBuffer
from rlspeed.envs.base import EnvWrapper
from rlspeed.errors import UserError

#: How a relabelled transition's goal is chosen (SB3's goal_selection_strategy)
GOAL_STRATEGIES = ("future", "final", "episode")


def goal_strategy_name(value):
    """A `goal_selection_strategy` as rlspeed names it: SB3's `GoalSelectionStrategy.FUTURE` by its member's name, a
    string in any case (SB3 reads "FUTURE" too) in lower case; anything else as it is (checked by the caller)."""
    if isinstance(value, enum.Enum):
        value = value.name
    return value.lower() if isinstance(value, str) else value


#: The Dict keys goal-conditioned observations have (Gymnasium-Robotics' GoalEnv)
GOAL_KEYS = ("achieved_goal", "desired_goal")


def goal_space_problem(space: gym.Space) -> str | None:
    """Why observations of `space` cannot take Hindsight Experience Replay (None when they can): a Dict with
    `achieved_goal` and `desired_goal` keys of one shape and dtype is needed."""
    if not isinstance(space, gym.spaces.Dict):
        return f"its observations are {type(space).__name__}, not a Dict with achieved_goal and desired_goal keys"
    missing = [key for key in GOAL_KEYS if key not in space.spaces]
    if missing:
        return f"its Dict observations have no {' and no '.join(missing)} key (keys: {', '.join(space.spaces)})"
    achieved, desired = space["achieved_goal"], space["desired_goal"]
    if achieved.shape != desired.shape or achieved.dtype != desired.dtype:
        return (f"its achieved_goal ({achieved}) and desired_goal ({desired}) differ in shape or dtype, so one cannot "
                "stand for the other")
    return None


def reward_function(compute_reward: Callable, device: torch.device) -> Callable[[torch.Tensor, torch.Tensor],
                                                                                  torch.Tensor]:
    """`compute_reward(achieved_goal, desired_goal, infos)` of an env (NumPy batches) as a function of two tensor
    batches `[B, ...]` returning float32 rewards `[B]` on `device`; UserError naming what it returned when that is
    not one number per goal, or the error it raised on the batch (chained)."""
    def rewards(achieved: torch.Tensor, desired: torch.Tensor) -> torch.Tensor:
        count = achieved.shape[0]
        try:
            out = compute_reward(achieved.cpu().numpy(), desired.cpu().numpy(), [{} for _ in range(count)])
        except Exception as error:  # (one written for one goal at a time: its error alone would not say why)
            raise UserError(f"The env's compute_reward failed on a batch of {count} goals (achieved_goal and "
                            f"desired_goal arrays of shape {tuple(achieved.shape)}), which is how Hindsight "
                            f"Experience Replay calls it: {type(error).__name__}: {error} (a compute_reward "
                            "written for one goal at a time fails so: HER needs one that takes batches, as "
                            "Gymnasium-Robotics' GoalEnv defines it).") from error
        out = np.asarray(out, dtype=np.float32)
        if out.size != count:
            raise UserError(f"The env's compute_reward returned {out.size} values for a batch of {count} goals: "
                            "Hindsight Experience Replay needs one reward per goal (a compute_reward that takes "
                            "batches, as Gymnasium-Robotics' GoalEnv defines it).")
        return torch.as_tensor(out.reshape(count), device=device)

    return rewards


def env_compute_reward(env) -> Callable:
    """The `compute_reward` method of the envs behind the batched env `env` (rlspeed's adapters of a Gymnasium
    vector env or a Stable-Baselines3 VecEnv, and wrappers around them): the first env's, for a subprocess vector env
    that of a probe env made by the same constructor in this process (a method cannot be called across the pipe as
    a batch). UserError when there is none, or when a wrapper normalises observations (their goals would not be the
    env's; but rlspeed's `NormalizeObservation` handing out raw ones) or rewards (relabelled rewards would be the
    env's own among scaled ones; but rlspeed's `NormalizeReward` handing out raw ones)."""
    # (rlspeed's EnvWrappers, down to the adapter; each wrapper's own attributes: `getattr` would look inside it)
    from rlspeed.envs.wrappers import NormalizeObservation, NormalizeReward

    while isinstance(env, EnvWrapper):
        # (rlspeed's own normalisation handing out raw observations: the replay normalises each batch itself)
        if env.__dict__.get("obs_rms") is not None and not (isinstance(env, NormalizeObservation)
                                                            and env.hand_out_raw):
            raise UserError("Hindsight Experience Replay relabels goals with the env's compute_reward, which takes the "
                            f"env's own goals, and {type(env).__name__} hands out normalised observations: normalise "
                            "with rlspeed.make_env(..., normalize_obs=True), whose statistics the replay applies to "
                            "each batch after relabelling, or leave the wrapper out.")
        # (stored rewards scaled, relabelled ones the env's own; but rlspeed's `NormalizeReward` handing out raw
        # ones: the algorithm scales each batch's, relabelled ones included)
        if env.__dict__.get("return_rms") is not None and not (isinstance(env, NormalizeReward) and env.hand_out_raw):
            raise UserError("Hindsight Experience Replay recomputes relabelled rewards with the env's compute_reward, "
                            f"and {type(env).__name__} scales the rewards the env returns: the two would be mixed in "
                            "training (normalise with the model's normalize_reward=True, which scales each batch "
                            "after relabelling, or leave the wrapper out).")
        env = env.env
    vector_env = getattr(env, "vector_env", None)
    if vector_env is not None:
        from rlspeed.envs.gymnasium_env import reward_wrappers

        changed = reward_wrappers(vector_env)
        if changed:  # (stored rewards would be the wrappers', relabelled ones compute_reward's: two scales)
            raise UserError(f"Hindsight Experience Replay recomputes relabelled rewards with the env's compute_reward, "
                            f"and {', '.join(changed)} changes the rewards the env returns: the two would be mixed in "
                            "training (leave the reward wrapper out).")
    elif getattr(env, "vec_env", None) is not None:
        wrapper = env.vec_env
        while wrapper is not None:  # (SB3's VecNormalize hands out normalised goals: relabelled rewards would be
            # computed on them)
            if getattr(wrapper, "norm_obs", False) or getattr(wrapper, "norm_reward", False):
                raise UserError("Hindsight Experience Replay relabels goals with the env's compute_reward, which takes "
                                "the env's own goals and rewards: it cannot run behind SB3's VecNormalize (leave it "
                                "out).")
            wrapper = getattr(wrapper, "venv", None)
    method, _ = _compute_reward_method(env)
    if not callable(method):
        raise UserError("Hindsight Experience Replay needs the env's compute_reward(achieved_goal, desired_goal, info) "
                        f"to relabel goals, and {env.spec.env_id} has none (rlspeed's native envs have none; "
                        "Gymnasium-Robotics' GoalEnv defines it).")
    return method


def _compute_reward_method(env) -> tuple[Callable | None, object]:
    """The `compute_reward` method of the envs behind the batched env `env` (None where they have none), and the probe
    env made for it (None where none was: a subprocess vector env's first constructor is called in this process, as a
    method cannot be called across the pipe as a batch)."""
    while isinstance(env, EnvWrapper):
        env = env.env
    vector_env = getattr(env, "vector_env", None)
    if vector_env is not None:
        vector_env, probe = getattr(vector_env, "unwrapped", vector_env), None
        if hasattr(vector_env, "envs"):
            source = vector_env.envs[0]
        elif getattr(vector_env, "env_fns", None):
            source = probe = vector_env.env_fns[0]()  # (never stepped)
        else:
            source = None
        return getattr(getattr(source, "unwrapped", source), "compute_reward", None), probe
    vec_env = getattr(env, "vec_env", None)  # (a Stable-Baselines3 VecEnv: its own way of calling a method)
    if vec_env is None:
        return None, None
    from rlspeed.envs.sb3_env import raise_exited_workers, vec_env_has_attr

    if not vec_env_has_attr(vec_env, "compute_reward"):
        return None, None

    def method(achieved, desired, infos):
        try:
            return vec_env.env_method("compute_reward", achieved, desired, infos, indices=[0])[0]
        except Exception as error:  # (a SubprocVecEnv's worker that ended: named, as a step names it)
            raise_exited_workers(vec_env, error)
            raise

    return method, None


def has_compute_reward(env) -> bool:
    """Whether the envs behind the batched env `env` have a callable `compute_reward` (a probe env made to find out
    is closed)."""
    method, probe = _compute_reward_method(env)
    if probe is not None:
        probe.close()
    return callable(method)


class HerReplayBuffer(ReplayBuffer):
    """A `ReplayBuffer` whose samples relabel goals, as Stable-Baselines3's HerReplayBuffer: a sampled transition
    gets, with probability n / (n + 1), the achieved goal of a transition of its own episode as its `desired_goal`
    (in `obs` and `next_obs`) and `compute_reward` of its achieved goal and that goal as its reward; `terminated`
    stays as stored. Unlike SB3, transitions of episodes still running are sampled too (goals from the steps stored so
    far). The algorithms make it for `her=True`; to use it in a loop of your own:

    - `capacity`, `num_envs`, `observation` (a Dict space with `achieved_goal` and `desired_goal` keys of one shape
      and dtype), `action_shape`, `action_dtype`, `device`, `gamma`, `storage_device`, `mask_size`: as for
      `ReplayBuffer`;
    - `compute_reward`: the env's `compute_reward(achieved_goal, desired_goal, info)`, which takes NumPy batches (and
      a list of info dicts, given empty) and returns one reward per goal (Gymnasium-Robotics' GoalEnv's method);
    - `n_sampled_goal`: relabelled goals per real one, >= 0 (4: 80% of the samples relabelled; 0: none);
    - `goal_selection_strategy`: "future" (a transition of the same episode at this step or later), "final" (the
      episode's last) or "episode" (any of it still stored).
    - `normalize`: where given, maps a batch's Dict observations (`obs` and `next_obs`, after relabelling and
      `compute_reward`) to the ones training takes: the replay stores the env's own observations, normalised with the
      statistics of sampling time, as SB3's VecNormalize (`NormalizeObservation`'s `obs_rms.normalize`).

    `add` takes one step of all `num_envs` envs, with `terminated` and `truncated` marking episode ends (their rows
    learn their episode's last step); `restart_episodes()` ends the running episodes where the envs were reset
    outside the steps. One-step transitions only (no `n_step`); 24 bytes per transition more than the dense layout.
    """

    layout = "her"

    def __init__(self, capacity: int, num_envs: int, observation: gym.spaces.Dict, action_shape: tuple[int, ...],
                 action_dtype: torch.dtype, device: torch.device | str,
                 compute_reward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], n_sampled_goal: int = 4,
                 goal_selection_strategy: str = "future", gamma: float = 0.99,
                 storage_device: torch.device | str | None = None, mask_size: int | None = None,
                 normalize: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None):
        problem = goal_space_problem(observation)
        if problem is not None:
            raise UserError(f"Hindsight Experience Replay needs goal-conditioned observations: {problem}.")
        if not n_sampled_goal >= 0:  # (n / (n + 1) relabelled: a negative n is no share)
            raise UserError(f"n_sampled_goal must be >= 0, got {n_sampled_goal}.")
        goal_selection_strategy = goal_strategy_name(goal_selection_strategy)
        if goal_selection_strategy not in GOAL_STRATEGIES:
            raise UserError(f"goal_selection_strategy must be one of {', '.join(GOAL_STRATEGIES)}, got "
                            f"{goal_selection_strategy!r}.")
        super().__init__(capacity, num_envs, observation, action_shape, action_dtype, device, n_step=1, gamma=gamma,
                         storage_device=storage_device, mask_size=mask_size)
        self.compute_reward = reward_function(compute_reward, self.device)  # (tensors in, rewards on the device)
        self.strategy = goal_selection_strategy
        self.normalize = normalize
        self.her_ratio = 1.0 - 1.0 / (n_sampled_goal + 1)
        self.steps = self._zeros(dtype=torch.int64)  # the step each row was written at
        self.episode_starts = self._zeros(dtype=torch.int64)  # the step its episode started at
        self.episode_ends = torch.full_like(self.steps, -1)  # the step its episode ended at; -1: still running
        self._episode_start = torch.zeros(self.num_envs, dtype=torch.int64, device=self.storage_device)
        self._step = 0  # steps added so far (the next one's number)

    def _storage_bytes(self, layout) -> int:
        return super()._storage_bytes(layout) + 3 * 8 * self.capacity

    def _layout_text(self) -> str:
        return (f"dense, with Hindsight Experience Replay ({self.strategy} goals, {self.her_ratio:.0%} of samples "
                "relabelled)")

    def storage_tensors(self) -> dict[str, torch.Tensor]:
        return {**super().storage_tensors(), "steps": self.steps, "episode_starts": self.episode_starts,
                "episode_ends": self.episode_ends}

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        tensors, meta = super().state_dict()
        return {**tensors, "episode_start": self._episode_start}, {**meta, "step": self._step}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict) -> str | None:
        if "episode_start" not in tensors or "step" not in meta:
            return "it holds another replay layout than this model's"
        if tensors["episode_start"].numel() != self.num_envs:  # (the rows of env e at step t are t * N + e)
            return (f"its episodes were stored by {tensors['episode_start'].numel()} envs, and this model has "
                    f"{self.num_envs}: their rows cannot be told apart")
        reason = super().load_state_dict(tensors, meta)
        if reason is None:
            self._episode_start.copy_(tensors["episode_start"])
            self._step = int(meta["step"])
        return reason

    def _oldest_steps(self, env):
        """For env index `env` (an int, or a tensor of them), the earliest step whose row is still stored (later
        writes overwrite the oldest rows)."""
        overwritten = self._step * self.num_envs - self.capacity - env  # rows before the stored ones, per env
        first = -(-overwritten // self.num_envs)  # (ceiling division)
        return first.clamp(min=0) if isinstance(first, torch.Tensor) else max(first, 0)

    def _end_episodes(self, env: torch.Tensor, last: int) -> None:
        """The episodes running in envs `env` (host int64 indices) ended at step `last`: their stored rows get it."""
        for e in env.tolist():
            first = max(int(self._episode_start[e]), self._oldest_steps(e))
            if first <= last:
                steps = torch.arange(first, last + 1, device=self.storage_device)
                self.episode_ends[(steps * self.num_envs + e) % self.capacity] = last

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, next_action_masks=None,
            reset_rows=None) -> None:
        """`ReplayBuffer.add`, recording each row's step and episode; an episode that ended (terminated or
        truncated) gives its stored rows its last step."""
        rows = (self.pos + self._rows) % self.capacity
        super().add(obs, actions, rewards, next_obs, terminated, truncated, next_action_masks, reset_rows)
        step = self._step
        self._step += 1
        self.steps[rows] = step
        self.episode_starts[rows] = self._episode_start
        self.episode_ends[rows] = -1
        done = (terminated.bool() | truncated.bool()).to(self.storage_device)
        ended = done.nonzero().flatten().cpu()  # ok-sync: the rows of ended episodes are written from the host
        if ended.numel():
            self._end_episodes(ended, step)
            self._episode_start[ended.to(self.storage_device)] = step + 1

    def restart_episodes(self) -> None:
        """The envs were reset outside the step loop: the episodes they were running end at the last stored step."""
        super().restart_episodes()
        if self._step:
            self._end_episodes(torch.arange(self.num_envs), self._step - 1)
        self._episode_start.fill_(self._step)

    def _relabel(self, batch: dict, index: torch.Tensor, generator: torch.Generator | None) -> dict:
        """Relabel a random `her_ratio` of the sampled rows `index` with goals of their episodes (see the module's
        docstring), the others as stored; then `normalize` the observations where given."""
        batch = self._relabel_goals(batch, index, generator)
        if self.normalize is not None:
            for name in ("obs", "next_obs"):
                batch[name] = self.normalize(batch[name])
        return batch

    def _relabel_goals(self, batch: dict, index: torch.Tensor, generator: torch.Generator | None) -> dict:
        """`_relabel` on the stored observations, before `normalize`."""
        chosen = torch.rand(index.shape, device=self.storage_device, generator=generator) < self.her_ratio
        rows = index[chosen]
        if rows.numel() == 0:
            return batch
        step = self.steps[rows]
        env = (rows - step * self.num_envs) % self.capacity
        end = self.episode_ends[rows]
        end = torch.where(end < 0, self._step - 1, end)
        if self.strategy == "final":
            goal_step = end
        else:
            first = step if self.strategy == "future" else torch.maximum(self.episode_starts[rows],
                                                                         self._oldest_steps(env))
            draw = torch.rand(rows.shape, device=self.storage_device, generator=generator)
            goal_step = first + torch.minimum((draw * (end - first + 1)).long(), end - first)
        goals = self.next_obs["achieved_goal"][(goal_step * self.num_envs + env) % self.capacity].to(self.device)
        where = chosen.to(self.device)
        for name in ("obs", "next_obs"):
            batch[name]["desired_goal"][where] = goals
        batch["rewards"][where] = self.compute_reward(batch["next_obs"]["achieved_goal"][where], goals)
        return batch
