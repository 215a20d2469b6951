"""The numerics guard: no silent NaN or infinity in what an env returns or in what training learns.

Two parts, both on by default and both free of per-step host syncs:

* `EnvValueGuard` sits in the innermost wrapper of the training env (`EpisodeStatistics`), so it sees the env's own
  observations and rewards before any normalisation. Each step adds a few small kernels: the row sums of the
  observations, the final observations and the reward are accumulated per env on the device (a sum is non-finite
  when any of its terms is, and stays so), with a count of the steps each env stayed clean. With
  `nan_policy="mask"` non-finite values are also replaced by 0 before anything else sees them, and the rows that
  had any are counted.
* `NumericsGuard` (one per algorithm) reads those counters and a fused `isfinite` check of every trained tensor
  (parameters, target networks, optimizer state, normalisation statistics) once per log interval, in the same host
  transfer as the metrics. Finite: the tensors become the "last good" snapshot (device copies). Not finite: they are
  restored from the snapshot in place (the updates since the last read are undone, whichever update implementation
  made them: autograd, hand-derived or captured graphs) and the rollback is counted; after
  `MAX_CONSECUTIVE_ROLLBACKS` rollbacks in a row training stops with `DivergedError`. So a run never ends with
  non-finite weights and a normal return.

The guard rolls back per log interval rather than skipping single updates: skipping one update without a host sync
would need a copy of every parameter and optimizer state before each update and a `torch.where` after it, which
costs as much as a small update; the interval check costs a few kernels per second.
"""

from __future__ import annotations

import math
import warnings
import weakref

import torch

from rlspeed.device import statistics_dtype
from rlspeed.errors import UserError

#: what to do about training whose parameters became NaN or infinite (a DivergedError, a rollback, a population
#: member dropped)
DIVERGED_ADVICE = ("lower learning_rate, check the observations' and rewards' scales (normalize_obs, "
                   "normalize_reward), or clip gradients (max_grad_norm)")

NAN_POLICIES = ("raise", "mask")

#: Rewards (observation values) of at least this magnitude in an env's first steps make the scale hint suggest
#: normalize_reward (normalize_obs); rewards that are not all 0 and stay below `TINY_REWARD`, scaling them up.
LARGE_SCALE = 1e4
TINY_REWARD = 1e-4

#: Rollbacks in a row (log intervals whose updates made a tensor non-finite) before training stops.
MAX_CONSECUTIVE_ROLLBACKS = 10


class NumericsError(UserError, RuntimeError):
    """Training met NaN or infinity it cannot carry on with (the CLI prints the message and exits with code 2)."""


class NonFiniteEnvError(NumericsError):
    """The env returned a NaN or infinite observation or reward (with `nan_policy="raise"`).

    `env_id` names the env; `env_index` is the env's row in the batch, `step` the env's step at which it happened (0
    is the first reset), `rows` how many envs returned such values by the time it was noticed. A population's
    (`member`: its index and seed) names the member instead, `step` being the population's step count when it was
    noticed (populations do not mask such values). `wide_floats`: the observation space has float64 parts, whose
    finite values beyond float32's range became infinite in the float32 the adapters store (said, as the env may
    have returned no NaN or infinity itself); `wide_rewards`: the env returned a finite reward past float32's range,
    infinite in the float32 rlspeed keeps rewards in (`BatchedEnv.rewards_overflowed`); `nan_reward_cause`: what a
    NaN reward may have been before the env's adapter saw it (`BatchedEnv.nan_reward_cause`), said where one was NaN.
    """

    def __init__(self, env_id: str, env_index: int, step: int, rows: int, member: tuple[int, int] | None = None,
                 wide_floats: bool = False, wide_rewards: bool = False, nan_reward_cause: str = ""):
        self.env_index, self.step, self.rows = env_index, step, rows
        wide = ""
        if wide_rewards:
            also = " (and float64 observations past it count too)" if wide_floats else ""
            wide = (f" (a finite reward past float32's range, about 3.4e38, became infinite{also}: rlspeed keeps "
                    "rewards in float32; scale them down in the env)")
        elif wide_floats:
            wide = (" (float64 observations past float32's range, about 3.4e38, count too: rlspeed keeps observations "
                    "in float32)")
        if member is not None:
            others = f" ({rows - 1} other env rows too)" if rows > 1 else ""
            super().__init__(f"The env '{env_id}' returned a NaN or infinite observation or reward{wide} to "
                             f"population member {member[0]} (seed {member[1]}) by step {step:,}{others}; fix the env "
                             "(populations do not mask such values).")
            return
        others = f" ({rows - 1} other envs too)" if rows > 1 else ""
        where = "at its first reset" if step == 0 else f"at its step {step:,}"
        cause = f" ({nan_reward_cause})" if nan_reward_cause else ""
        super().__init__(f"The env '{env_id}' returned a NaN or infinite observation or reward{wide} in env "
                         f"{env_index} {where}{others}{cause}; fix the env, or pass nan_policy='mask' (CLI: "
                         "--nan-policy mask) to replace such values by 0 and count them.")


def has_wide_floats(space) -> bool:
    """Whether an observation space (a Dict or Tuple's parts too) holds a float Box wider than float32, whose values
    the env adapters store as float32 (`rlspeed.envs.base.observation_layout`)."""
    parts = getattr(space, "spaces", None)
    parts = list(parts.values()) if isinstance(parts, dict) else list(parts or [space])
    dtypes = [getattr(part, "dtype", None) for part in parts]
    return any(dtype is not None and dtype.kind == "f" and dtype.itemsize > 4 for dtype in dtypes)


class DivergedError(NumericsError):
    """Training made the parameters or optimizer state non-finite again and again, even after restoring the last
    finite ones."""


#: Under the `raise` policy, steps are checked in blocks of up to this many (one pass over stacked values: a few
#: kernels per block instead of a few per step) ...
_BLOCK_STEPS = 32
#: ... holding at most about this many observation elements.
_BLOCK_ELEMENTS = 1 << 22


class EnvValueGuard:
    """Per-env device counters of non-finite observations and rewards, fed by `EpisodeStatistics` each step.

    `sums[0]` accumulates each env's reward and observation and final-observation row sums, `sums[1]` the sums of
    the (float) actions it was given, each step's times 0 (0, or NaN where a term was not finite): a sum is non-finite
    once any of its terms was, and stays so; finite values overflow it only where one step's row sums past float32's
    ~3.4e38. `clean[k]` counts the observations (resets included) made
    while `sums[k]` was finite: for an env, the step of its first non-finite value. Under the `raise` policy the steps
    are kept (the env's fresh tensors, by reference) and checked a block at a time (`flush`); under `mask` each step
    is checked at once, its non-finite values replaced by 0, and `bad` counts each env's steps that had any.
    """

    def __init__(self, num_envs: int, device: torch.device, policy: str):
        self.policy = policy
        self.sums = torch.zeros(2, num_envs, device=device, dtype=torch.float32)
        self.clean = torch.zeros(2, num_envs, device=device, dtype=torch.int64)
        self.bad = torch.zeros(num_envs, device=device, dtype=torch.int64)
        self._value_sums, self._action_sums = self.sums[0], self.sums[1]
        self.steps = 0  # observations so far (host count; the first reset is the first)
        self._pending: list[tuple] = []  # (reward, obs, final_obs, actions) of steps not yet checked
        self._pending_elements = 0
        self._zeros: dict[tuple, torch.Tensor] = {}  # stand-ins for a missing reward, final obs or action
        #: [the largest |reward|, the largest |observation value|] of the env's first `_BLOCK_STEPS` steps (NaN until
        #: measured; the observations' stays NaN where they are not floats), which `NumericsGuard` reads for its
        #: scale hint; measured once, on the steps the guard keeps anyway
        self.scale = torch.full((2,), math.nan, device=device, dtype=torch.float32)
        self._scale_steps = 0

    def _zeros_like(self, like: torch.Tensor) -> torch.Tensor:
        key = (tuple(like.shape), like.dtype)
        if key not in self._zeros:
            self._zeros[key] = torch.zeros_like(like)
        return self._zeros[key]

    def check(self, obs: torch.Tensor, reward: torch.Tensor | None = None, final_obs: torch.Tensor | None = None,
              actions: torch.Tensor | None = None):
        """Count this step's non-finite values (no host sync); returns (obs, reward, final_obs), with non-finite
        values replaced by 0 under the `mask` policy. `reward` and `actions` are None at a reset; `final_obs` may be
        `obs` itself."""
        self.steps += 1
        if final_obs is obs:
            final_obs = None
        if self.policy == "raise":
            self._pending.append((reward, obs, final_obs, actions))
            if obs.is_floating_point():  # (integer and bool observations, images, are not summed by `flush`)
                self._pending_elements += obs.numel() * (1 if final_obs is None else 2)
            if len(self._pending) >= _BLOCK_STEPS or self._pending_elements >= _BLOCK_ELEMENTS:
                self.flush()
            return obs, reward, final_obs
        if self._scale_steps < _BLOCK_STEPS:
            self._measure_scale([reward], [obs])
        step = torch.zeros_like(self._value_sums)
        for values in (reward, obs, final_obs):
            if values is not None and values.is_floating_point():
                step.add_(values.reshape(values.shape[0], -1).sum(1, dtype=torch.float32))
        self._add_actions([actions])
        self.bad.add_(step.isfinite().logical_not_())
        self._value_sums.copy_(self.bad)  # (0 while clean: `clean` then counts the steps before the first bad one)
        self._value_sums.masked_fill_(self.bad > 0, math.nan)
        self.clean[0].add_(self._value_sums.isfinite())

        def zeroed(values):
            if isinstance(values, torch.Tensor) and values.is_floating_point():
                return torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
            return values

        return zeroed(obs), zeroed(reward), zeroed(final_obs)

    def _measure_scale(self, rewards: list, obs: list) -> None:
        """Fold the largest |reward| and |observation value| of these steps (resets' rewards None) into `scale`,
        non-finite values read as 0 (the guard reports those)."""
        rewards = [r for r in rewards if r is not None]
        if not rewards:
            return
        self._scale_steps += len(rewards)

        def largest(values: list) -> torch.Tensor:
            stacked = torch.stack(values).to(torch.float32)
            return torch.nan_to_num(stacked, nan=0.0, posinf=0.0, neginf=0.0).abs().amax()

        observed = largest(obs) if obs[0].is_floating_point() else self.scale.new_tensor(math.nan)
        torch.fmax(self.scale, torch.stack((largest(rewards), observed)), out=self.scale)

    def _accumulate(self, sums: torch.Tensor, clean: torch.Tensor, totals: torch.Tensor) -> None:
        """Fold per-step row totals `[T, N]` into a running sum and its clean-step count. The totals are taken
        times 0 first (0 where finite, NaN where not): large finite values summed over a run would overflow float32
        and read as non-finite."""
        running = totals.mul(0).cumsum_(0).add_(sums)
        clean.add_(running.isfinite().sum(0))
        sums.copy_(running[-1])

    def _add_actions(self, actions: list) -> None:
        floats = [a for a in actions if a is not None and a.is_floating_point()]
        if not floats:  # integer actions are always finite
            self.clean[1].add_(self._action_sums.isfinite(), alpha=len(actions))
            return
        like = floats[0]
        stacked = torch.stack([a if a is not None and a.is_floating_point() else self._zeros_like(like)
                               for a in actions])
        self._accumulate(self._action_sums, self.clean[1],
                         stacked.reshape(len(actions), like.shape[0], -1).sum(2, dtype=torch.float32))

    def flush(self) -> None:
        """Check the kept steps in one pass (a few kernels for the block)."""
        pending, self._pending, self._pending_elements = self._pending, [], 0
        if not pending:
            return
        if self._scale_steps < _BLOCK_STEPS:
            self._measure_scale([entry[0] for entry in pending], [entry[1] for entry in pending])
        steps, num_envs = len(pending), self._value_sums.shape[0]
        totals = torch.zeros(steps, num_envs, device=self._value_sums.device, dtype=torch.float32)
        obs = [entry[1] for entry in pending]
        if obs[0].is_floating_point():
            finals = [final if final is not None else self._zeros_like(o) for o, (_, _, final, _) in zip(obs, pending)]
            for values in (obs, finals):
                totals.add_(torch.stack(values).reshape(steps, num_envs, -1).sum(2, dtype=torch.float32))
        rewards = [entry[0] for entry in pending]
        if any(r is not None for r in rewards):
            zeros = self._zeros_like(next(r for r in rewards if r is not None))
            totals.add_(torch.stack([r if r is not None else zeros for r in rewards]))
        self._accumulate(self._value_sums, self.clean[0], totals)
        self._add_actions([entry[3] for entry in pending])

    def summary(self) -> torch.Tensor:
        """[envs whose own values were non-finite, the first such env, its step, masked rows, envs given non-finite
        actions first] on the device (a few kernels)."""
        self.flush()
        bad = self._value_sums.isfinite().logical_not_()
        # Both counts advance on every observation (reset or step), so an env whose first non-finite action came at
        # or before its first non-finite observation has clean[1] <= clean[0]: the policy's doing, not the env's.
        caused = bad & (self.clean[1] <= self.clean[0])
        own = bad & ~caused
        # (min over the env axis gives the step and its env together: indexing with a 0-d tensor would read it back)
        step, first = torch.where(own, self.clean[0], torch.iinfo(torch.int64).max).min(0)
        return torch.stack((own.sum(), first, step, self.bad.sum(), caused.sum()))

    def forget(self) -> None:
        """After a rollback: the non-finite values seen so far were the diverged policy's doing; count afresh (the
        steps so far as clean ones)."""
        self._pending, self._pending_elements = [], 0
        self.sums.zero_()
        self.clean.fill_(self.steps)
        self.bad.zero_()


def scale_hint(reward: float, observed: float, normalize_obs: bool, normalize_reward: bool,
               steps: str = "the env's first steps", keeper: str = "the model") -> str | None:
    """The scale hint's warning where `reward` and `observed` (the largest |reward| and |observation value| of
    `steps`, NaN where not measured) are far from 1 and the run does not normalise them (with statistics `keeper`
    saves); None otherwise."""
    found, advice = [], []
    if not normalize_reward and reward >= LARGE_SCALE:
        found.append(f"rewards up to {reward:.3g} in magnitude")
        advice.append("normalize_reward=True (--set normalize_reward=true) divides the rewards by the running "
                      "std of the discounted return")
    elif not normalize_reward and 0 < reward < TINY_REWARD:
        found.append(f"rewards of at most {reward:.3g} in magnitude")
        advice.append("normalize_reward=True (--set normalize_reward=true) divides the rewards by the running "
                      "std of the discounted return (scaling them up in the env does more)")
    if not normalize_obs and not math.isnan(observed) and observed >= LARGE_SCALE:
        found.append(f"observation values up to {observed:.3g} in magnitude")
        advice.append("normalize_obs=True (--set normalize_obs=true) scales each observation feature by its "
                      "running mean and std")
    if not found:
        return None
    return (f"rlspeed: {steps} have {' and '.join(found)}: values this far from 1 train slowly or not at all; "
            f"{', and '.join(advice)}, statistics {keeper} saves.")


class NumericsGuard:
    """The algorithm's side of the guard: reads the env counters and checks every trained tensor once per log
    interval, keeps the last finite tensors, rolls back to them, and reports (`report`)."""

    def __init__(self, enabled: bool = True, nan_policy: str = "raise",
                 max_rollbacks: int = MAX_CONSECUTIVE_ROLLBACKS):
        if nan_policy not in NAN_POLICIES:
            raise UserError(f"nan_policy must be one of {', '.join(NAN_POLICIES)}, got {nan_policy!r}.")
        self.enabled, self.nan_policy, self.max_rollbacks = bool(enabled), nan_policy, int(max_rollbacks)
        self.env_guard: EnvValueGuard | None = None
        self.env_checked = False
        self.wide_floats = False  # (the watched env's observation space has float64 parts: `attach`)
        self._source = None  # (the watched env, innermost, held weakly: `attach`)
        self._guarded = None  # (the `EpisodeStatistics` that `env_guard` counts the steps of, held weakly: `attach`)
        self.rollbacks = 0
        self.consecutive_rollbacks = 0
        self.rolled_back_timesteps = 0
        self.masked_env_rows = 0
        self._masked_before = 0  # rows masked before a resume
        self.first_env_index: int | None = None
        self.first_env_step: int | None = None
        self._snapshot: dict[str, torch.Tensor] | None = None
        self._snapshot_timesteps = 0
        self._rolled_back_to = 0  # the step of the last rollback (or snapshot): what a rollback discards starts there
        #: each logged loss first seen non-finite while the parameters stayed finite: {name: step}
        self.nonfinite_losses: dict[str, int] = {}
        #: losses seen non-finite in rows logged since the last check of the parameters (rows come more often than
        #: checks): {name: (step, value, episode return)}, reported once a check finds the parameters finite
        self._unchecked_losses: dict[str, tuple[int, float, object]] = {}
        #: the run's hyperparameters that differ from the defaults (`key=value, ...`), named when training diverges
        self.settings = ""
        #: (normalize_obs, normalize_reward) of the run (`attach`): what the scale hint need not suggest
        self.normalising = (False, False)
        self.scale_hinted = False  # (the hint shows once per model)

    def __getstate__(self) -> dict:
        # (a weak reference does not pickle; `attach` sets them again)
        return {**self.__dict__, "_source": None, "_guarded": None}

    def attach(self, env, normalize_obs: bool = False, normalize_reward: bool = False) -> None:
        """Watch the training env's values (through its `EpisodeStatistics` wrapper; an env without one is not
        watched, and `report` says so); `normalize_obs` and `normalize_reward`: the run's, for the scale hint."""
        self.normalising = (bool(normalize_obs), bool(normalize_reward))
        if not self.enabled:
            return
        from rlspeed.envs.base import clear_reward_flags, find_episode_statistics

        stats = find_episode_statistics(env)
        self.env_checked = stats is not None
        if stats is None:
            return
        # (the counters are this model's own, set on the env for each learn: another model training on the same env
        # object, with its own policy or not, counts its steps in its own)
        if self.env_guard is None or self._guarded is None or self._guarded() is not stats:
            if self.env_guard is not None:  # (another env: its counts start afresh, the rows masked so far stay)
                self._masked_before = self.masked_env_rows
            self.env_guard = EnvValueGuard(stats.num_envs, stats.device, self.nan_policy)
            self._guarded = weakref.ref(stats)
            clear_reward_flags(env)  # (marked before this guard counted: not its values)
        stats.numerics = self.env_guard
        self.wide_floats = has_wide_floats(getattr(getattr(env, "spec", None), "observation_space", None))
        # (its `rewards_overflowed`, named in a refusal; held weakly, so that a closed model's env goes and the model
        # pickles: a Gymnasium vector env holds local functions)
        self._source = weakref.ref(getattr(env, "unwrapped", env))

    def device_values(self, tensors: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor | None:
        """What the next host read needs, as one device vector: [all tensors finite, env summary...]; None when the
        guard is off."""
        if not self.enabled:
            return None
        floats = [t for t in tensors.values() if t.is_floating_point()]
        finite = torch.stack([t.isfinite().all() for t in floats]).all() if floats else torch.ones((), dtype=bool)
        dtype = statistics_dtype(device)
        parts = [finite.to(device, dtype).reshape(1)]
        if self.env_guard is not None:
            parts += [self.env_guard.summary().to(device, dtype), self.env_guard.scale.to(device, dtype)]
        return torch.cat(parts)

    def _hint_scale(self, reward: float, observed: float) -> None:
        """Warn once where the env's first steps (`EnvValueGuard.scale`: their largest |reward| and |observation
        value|, NaN before any step) are far from 1 and the run does not normalise them."""
        if math.isnan(reward):
            return
        self.scale_hinted = True
        hint = scale_hint(reward, observed, *self.normalising)
        if hint is not None:
            warnings.warn(hint, UserWarning, stacklevel=3)

    def snapshot(self, tensors: dict[str, torch.Tensor], timesteps: int) -> None:
        """Keep device copies of `tensors` as the last good state (copied into the previous copies when the set of
        tensors is unchanged)."""
        old = self._snapshot
        if old is not None and old.keys() == tensors.keys() and all(
                old[k].shape == t.shape and old[k].dtype == t.dtype for k, t in tensors.items()):
            with torch.no_grad():
                torch._foreach_copy_([old[k] for k in tensors], list(tensors.values()))
        else:
            self._snapshot = {name: t.detach().clone() for name, t in tensors.items()}
        self._snapshot_timesteps = self._rolled_back_to = timesteps

    def after_read(self, values: list[float], tensors: dict[str, torch.Tensor], env_id: str,
                   timesteps: int) -> bool:
        """Act on what `device_values` read: raise for non-finite env values (`raise` policy), count masked ones,
        roll back non-finite tensors (or stop after too many rollbacks in a row), else take a new snapshot. Returns
        whether it rolled back (then the caller restarts the training envs' episodes: a diverged policy may have left
        them in non-finite states)."""
        finite = values[0] > 0.5
        if len(values) > 1:
            rows, first_env, first_step, masked, caused = (int(v) for v in values[1:6])
            if rows and self.first_env_index is None:
                self.first_env_index, self.first_env_step = first_env, first_step
            self.masked_env_rows = self._masked_before + masked
            source = self._source and self._source()
            if not rows:  # (the guard saw no non-finite value: a mark is of steps it did not count)
                from rlspeed.envs.base import clear_reward_flags

                clear_reward_flags(source)
            if rows and self.nan_policy == "raise":
                raise NonFiniteEnvError(env_id, first_env, first_step, rows, wide_floats=self.wide_floats,
                                        wide_rewards=bool(getattr(source, "rewards_overflowed", False)),
                                        nan_reward_cause=(getattr(source, "nan_reward_cause", "")
                                                          if getattr(source, "rewards_nan", False) else ""))
            finite = finite and not caused  # non-finite actions went to the env: the policy diverged
            if not self.scale_hinted and len(values) >= 8:
                self._hint_scale(values[6], values[7])
        if finite:
            self.consecutive_rollbacks = 0
            self.snapshot(tensors, timesteps)
            return False
        self.rollbacks += 1
        self.consecutive_rollbacks += 1
        self._unchecked_losses.clear()  # (losses of the stretch rolled back: not of finite parameters)
        # (the steps since the last snapshot or rollback: a second rollback to the same snapshot counts only its own)
        self.rolled_back_timesteps += timesteps - max(self._snapshot_timesteps, self._rolled_back_to)
        self._rolled_back_to = timesteps
        self.restore(tensors)  # (also before stopping: the model a caller then saves holds the last finite state)
        if self.consecutive_rollbacks >= self.max_rollbacks:
            raise DivergedError(
                f"Training made the parameters or optimizer state NaN or infinite {self.consecutive_rollbacks} times "
                f"in a row (at {timesteps:,} steps), even after restoring the last finite ones (those of step "
                f"{self._snapshot_timesteps:,}); {DIVERGED_ADVICE}{self._settings_text()}.")
        if self.env_guard is not None:
            self._masked_before = self.masked_env_rows  # (the device count restarts)
            self.env_guard.forget()
        advice = f"; if it recurs, {DIVERGED_ADVICE}" if self.rollbacks == 1 else ""  # (the first one says it)
        warnings.warn(f"rlspeed: non-finite parameters or optimizer state at {timesteps:,} steps: restored those of "
                      f"step {self._snapshot_timesteps:,} (rollback {self.rollbacks}); the training envs restart their "
                      f"episodes{advice}.", RuntimeWarning, stacklevel=3)
        return True

    def check_losses(self, row: dict, timesteps: int, checked: bool) -> None:
        """Warn (once per loss) where a logged loss is NaN or infinite while the parameters are finite: a value loss
        of returns too large for float32 squares is infinite, and its gradient, clipped to max_grad_norm, leaves the
        other terms' gradients almost nothing (the policy stops changing, silently). `checked`: this row's
        parameters were checked and found finite; a row logged between checks is held until the next check finds
        them finite (a rollback forgets it), and the warning names the first row's step."""
        if not self.enabled:
            return
        for name, value in row.items():
            if (name.endswith("loss") and name not in self.nonfinite_losses and isinstance(value, float)
                    and not math.isfinite(value)):
                self._unchecked_losses.setdefault(name, (int(timesteps), value, row.get("episode_return")))
        if not checked:
            return
        for name, (steps, value, returns) in self._unchecked_losses.items():
            self.nonfinite_losses[name] = steps
            scale = (f" (episode returns about {returns:.3g})" if isinstance(returns, float)
                     and math.isfinite(returns) else "")
            warnings.warn(f"rlspeed: {name} is {value} at {steps:,} steps while the parameters are finite: its "
                          f"terms overflow float32{scale}, and the clipped gradient leaves the rest of the update "
                          "almost nothing; scale the rewards down (normalize_reward=True where the algorithm has it, "
                          "or a reward wrapper).", RuntimeWarning, stacklevel=3)
        self._unchecked_losses.clear()

    def restore(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy the snapshot into `tensors` in place (views of flat buffers and captured graphs keep their memory);
        a tensor the snapshot lacks (optimizer state created after it) starts from zero, as a fresh optimizer's."""
        snapshot = self._snapshot or {}
        with torch.no_grad():
            for name, tensor in tensors.items():
                saved = snapshot.get(name)
                if saved is not None and saved.shape == tensor.shape:
                    tensor.copy_(saved)
                else:
                    tensor.zero_()

    def check_kept(self, start_timesteps: int, timesteps: int) -> None:
        """At the end of `learn` (started at `start_timesteps`): DivergedError when its last check rolled back to the
        state it started from, so no update of the call was kept (a short run can end before `max_rollbacks`
        rollbacks in a row stop it)."""
        if self.enabled and self.consecutive_rollbacks and self._snapshot_timesteps <= start_timesteps:
            raise DivergedError(
                f"Every update of this training was NaN or infinite and rolled back ({self.consecutive_rollbacks} "
                f"rollback(s) up to {timesteps:,} steps): the model holds the weights it started with (step "
                f"{self._snapshot_timesteps:,}); {DIVERGED_ADVICE}{self._settings_text()}.")

    def _settings_text(self) -> str:
        return f" (this run's settings other than the defaults: {self.settings})" if self.settings else ""

    @property
    def last_finite_timesteps(self) -> int:
        """The step count of the last finite state kept (what a rollback restores)."""
        return int(self._snapshot_timesteps)

    def state(self) -> dict:
        """The counts a checkpoint carries, so that a resumed run's report covers the whole run."""
        return {"rollbacks": self.rollbacks, "rolled_back_timesteps": self.rolled_back_timesteps,
                "masked_env_rows": self.masked_env_rows, "first_env_index": self.first_env_index,
                "first_env_step": self.first_env_step, "nonfinite_losses": dict(self.nonfinite_losses)}

    def load_state(self, state: dict) -> None:
        """Continue the counts of `state` (the env counters on the device start again from zero)."""
        self.rollbacks = int(state.get("rollbacks", 0))
        self.rolled_back_timesteps = int(state.get("rolled_back_timesteps", 0))
        self._masked_before = int(state.get("masked_env_rows", 0))
        self.masked_env_rows = self._masked_before
        self.first_env_index, self.first_env_step = state.get("first_env_index"), state.get("first_env_step")
        self.nonfinite_losses = {str(k): int(v) for k, v in (state.get("nonfinite_losses") or {}).items()}

    def report(self) -> dict:
        """What the guard saw and did (summary.json's `numerics`)."""
        return {"guard": self.enabled, "nan_policy": self.nan_policy, "env_values_checked": self.env_checked,
                "nonfinite_env_rows_masked": self.masked_env_rows, "first_nonfinite_env": self.first_env_index,
                "first_nonfinite_env_step": self.first_env_step, "rollbacks": self.rollbacks,
                "rolled_back_timesteps": self.rolled_back_timesteps, "max_consecutive_rollbacks": self.max_rollbacks,
                "nonfinite_losses": dict(self.nonfinite_losses)}
