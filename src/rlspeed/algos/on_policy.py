"""What on-policy algorithms share: rollout collection into device storage, GAE, schedules, the update step.

An algorithm on this base (PPO, A2C, RecurrentPPO) writes only its own maths: `_loss` (the autograd reference of
one update) and `_update_rollout` (how the rollout is split into updates: PPO's epochs of minibatches, A2C's one
step). The loop, per iteration:

1. anneal the learning rate (`anneal_lr`) from the run's progress;
2. collect `num_steps` steps of every env into `RolloutBuffer` (actions from `_act`), all on the device;
3. GAE over the rollout, truncated episodes bootstrapped from `info["final_obs"]`;
4. `_update_rollout`, which calls `self._update_step` (chosen in `rlspeed.algos.update.select_update`).

Nothing is read back to the host: metrics are device tensors summed until the learn loop's next log.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

import torch

from rlspeed.accel import auto_accelerate
from rlspeed.algos.base import (
    Algorithm,
    require,
    success_totals,
    validate_network,
    validate_normalization_clips,
    warn_at_caller,
)
from rlspeed.algos.update import select_update
from rlspeed.buffers import RolloutBuffer, gae
from rlspeed.buffers.rollout import check_rollout_bytes, rollout_step_bytes
from rlspeed.device import rules
from rlspeed.diagnostics.phases import phase
from rlspeed.envs import BatchedEnv
from rlspeed.envs.base import map_obs
from rlspeed.nn import (
    CNN_KINDS,
    ENCODERS,
    OWN_ENCODER,
    ActorCritic,
    acting_mode,
    action_kind,
    default_init_,
    env_actions,
    image_storage_format,
    make_adam,
    to_device,
)
from rlspeed.sde import SDEConfig, build_sde_actor_critic, resample_due


@dataclass
class OnPolicyConfig(SDEConfig):
    """Hyperparameters every on-policy algorithm has (names follow Stable-Baselines3 where it has one; gSDE's from
    `SDEConfig`)."""

    num_envs: int = 8
    num_steps: int = 128  # rollout length per env (SB3: n_steps)
    learning_rate: float = 3e-4
    anneal_lr: bool = True  # linear decay of the learning rate to 0 over total_timesteps
    gamma: float = 0.99
    gae_lambda: float = 0.95
    normalize_advantage: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    net_arch: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    log_std_init: float = 0.0
    #: orthogonal initialisation (SB3's `ortho_init`): gain sqrt(2) on hidden and encoder layers, 0.01 on the
    #: actor's last layer, 1 on the critic's; False keeps PyTorch's default initialisation of every layer
    ortho_init: bool = True
    normalize_obs: bool = False
    normalize_reward: bool = False
    #: normalised observations are clipped to [-normalize_obs_clip, normalize_obs_clip] (SB3's VecNormalize clip_obs)
    normalize_obs_clip: float = 10.0
    #: normalised rewards are clipped to [-normalize_reward_clip, normalize_reward_clip] (VecNormalize's clip_reward)
    normalize_reward_clip: float = 10.0
    encoder: str = "auto"  # observations -> features: auto (from the space), mlp or cnn (`rlspeed.nn.make_encoder`)
    cnn_features_dim: int = 512  # output width of the CNN encoders (SB3's features_dim)
    #: the CNN encoders' architecture (`rlspeed.nn.CNNEncoder`): auto (Nature-DQN's from 36 pixels a side, strided
    #: 3x3 from 16, small 3x3 below), nature, strided, small, or nature_or_small (the rule of files saved without it)
    cnn: str = "auto"
    normalize_images: bool = True  # uint8 images scaled to [0, 1] on the device
    use_masking: bool = True  # apply the env's action masks (info["action_mask"] or action_masks()) where it has them
    #: Atari games' training envs (`rlspeed.envs.atari.AtariTraining`): a lost life ends the learner's episode, and
    #: rewards are clipped to their sign; False leaves either out (whole games; raw scores)
    episodic_life: bool = True
    clip_rewards: bool = True

    def validate(self) -> None:
        """Raise UserError, naming the hyperparameter, for a value out of range (`build_config` calls it)."""
        require(self.num_envs >= 1, f"num_envs must be >= 1, got {self.num_envs}.")
        require(self.num_steps >= 1, f"num_steps must be >= 1, got {self.num_steps}.")
        require(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}.")
        require(0 <= self.gamma <= 1, f"gamma must be in [0, 1], got {self.gamma}.")
        require(0 <= self.gae_lambda <= 1, f"gae_lambda must be in [0, 1], got {self.gae_lambda}.")
        require(self.ent_coef >= 0, f"ent_coef must be >= 0, got {self.ent_coef}.")
        require(self.vf_coef >= 0, f"vf_coef must be >= 0, got {self.vf_coef}.")
        require(self.max_grad_norm > 0, f"max_grad_norm must be > 0, got {self.max_grad_norm}.")
        validate_network(self)
        require(self.encoder in ENCODERS, f"encoder must be one of {', '.join(ENCODERS)}, got '{self.encoder}': "
                f"{OWN_ENCODER}.")
        require(self.cnn_features_dim >= 1, f"cnn_features_dim must be >= 1, got {self.cnn_features_dim}.")
        require(self.cnn in CNN_KINDS, f"cnn must be one of {', '.join(CNN_KINDS)}, got '{self.cnn}'.")
        validate_normalization_clips(self)
        self.validate_sde()


class OnPolicyAlgorithm(Algorithm):
    """Base of PPO, A2C and RecurrentPPO: see the module docstring for the loop and what a subclass writes."""

    config: OnPolicyConfig
    supports_multi_actions = True
    supports_action_masks = True
    current_metrics = ("std",)  # (a row's std is the policy's at its step, after the row's last update, as SB3's)

    @property
    def steps_per_iteration(self) -> int:
        """Env steps of one rollout (`num_envs` x `num_steps`), over all processes: `learn` trains whole rollouts."""
        return int(self.config.num_envs * self.config.num_steps)

    # --- what a subclass may override ---------------------------------------------------------------------
    def _build_policy(self) -> torch.nn.Module:
        """The policy-value network (default: `ActorCritic`, actor and critic MLPs evaluated as one ensemble; with
        `use_sde`, gSDE's `SDEActorCritic`, Box actions only)."""
        cfg, spec = self.config, self.spec
        if cfg.use_sde:
            return build_sde_actor_critic(self)
        return ActorCritic(spec.obs_dim, spec.action_dim, spec.discrete, cfg.net_arch, cfg.activation,
                           cfg.log_std_init, encoder=self._make_encoder("policy"),
                           action_space=spec.action_space)

    def _make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return make_adam(params, self.config.learning_rate, self.device)

    def _make_update_step(self):
        """The update step (`select_update`); PPO passes its hand-derived update as the alternative."""
        return select_update(self, loss_fn=self._loss, optimizer=self.optimizer, params=self._params,
                             max_grad_norm=self.config.max_grad_norm, name=self.name)

    def _act(self, obs: torch.Tensor, step: int,
             action_masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(actions, log_probs, values) sampled for rollout step `step` (0 .. num_steps - 1), never a masked action;
        with gSDE, new exploration matrices at the rollout's start and every `sde_sample_freq` steps."""
        self._resample_noise(step)
        return self.policy.act(obs, action_masks=action_masks)

    def _resample_noise(self, step: int) -> None:
        """With gSDE, new exploration matrices before rollout step `step` where they are due (`resample_due`)."""
        if self.config.use_sde and resample_due(step, self.config.sde_sample_freq):
            self.policy.resample(self._env.num_envs)

    def _on_dones(self, dones: torch.Tensor) -> None:
        """Called after each rollout step with the rows whose whole episode ended (bool `[N]`, `info["done"]`: not
        where a wrapper ended only the learner's episode and the game goes on, Atari's lost life), e.g. to reset
        recurrent state."""

    def _next_values(self, buf: RolloutBuffer) -> torch.Tensor:
        """V of every step's next observation (`info["final_obs"]`), `[T, N]`, for GAE's bootstrap: of the stored
        next observations, or (buffers without them) the `final_values` of the rows the env restarted and, for the
        others, whose next observation is the next step's (also where a wrapper ended the learner's episode without
        a restart, Atari's lost life), the next step's values, V of the observation after the rollout for the last
        step."""
        if buf.next_obs is not None:
            return self.policy.value(map_obs(lambda v: v.flatten(0, 1), buf.next_obs)).view_as(buf.values)
        following = torch.cat((buf.values[1:], self.policy.value(self._obs).unsqueeze(0)))
        return torch.where(torch.as_tensor(buf.valued, device=self.device), buf.final_values, following)

    def _store_final_values(self, buf: RolloutBuffer, step: int, info: dict) -> None:
        """Buffers without next observations: V of the last observations (`info["final_obs"]`) of the rows the env
        restarted into `buf.final_values[step]`, marked in `buf.valued[step]`. The env adapters that know on the host
        which rows they restarted say so (`info["final_rows"]`): no pass when none did, a pass over those rows only
        otherwise; without it, all rows."""
        rows = info.get("final_rows")
        buf.valued[step] = rows is None
        if rows is None:
            buf.final_values[step].copy_(self.policy.value(info["final_obs"]))
        elif len(rows):
            buf.valued[step, rows] = True
            index = torch.as_tensor(rows, device=self.device)
            final = map_obs(lambda v: v[index.to(v.device)], info["final_obs"])
            buf.final_values[step].index_copy_(0, index, self.policy.value(final))

    def _loss(self, *batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of one update on `batch` and its statistics: the reference every implementation matches."""
        raise NotImplementedError

    def _update_rollout(self, buf: RolloutBuffer, advantages: torch.Tensor,
                        returns: torch.Tensor) -> dict[str, torch.Tensor]:
        """The updates of one rollout (calling `self._update_step`); returns metrics as device tensors."""
        raise NotImplementedError

    # --- shared ---------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        self._masking = False  # whether the rollouts use the env's action masks (decided in `_start`)
        self.policy = self._build_policy()
        if not self.config.ortho_init:
            default_init_(self.policy)
        self.policy = to_device(self.policy, self.device)
        self._params = list(self.policy.parameters())
        if self.accelerate == "auto":  # the rollout's forward passes, measured (same object, same parameters)
            self.policy = auto_accelerate(self.policy, device=self.device)
        space = self.spec.action_space
        self._action_kind = action_kind(space)
        self._action_low = self._action_high = None  # (bounds only for the Gaussian's clipping)
        if self._action_kind == "gaussian":  # (flattened: the policy's Gaussian is over prod(shape) values)
            self._action_low = torch.as_tensor(space.low, device=self.device, dtype=torch.float32).flatten()
            self._action_high = torch.as_tensor(space.high, device=self.device, dtype=torch.float32).flatten()

    def _setup_optimizer(self) -> None:
        self.optimizer = self._make_optimizer(self._params)
        if self._holds_learning_rates_as_tensors():
            self._hold_learning_rates_as_tensors()
        self._update_step = self._make_update_step()

    def _optimizers(self):
        return {"optimizer": self.optimizer}

    def _action_std(self) -> torch.Tensor | None:
        """metrics.csv's `std` (SB3's `train/std`), as the update left the policy: the mean standard deviation of its
        Gaussian over the action's components (exp(log_std)), with gSDE the mean of its sigma matrix; None for actions
        that are not a Gaussian's (Discrete, MultiDiscrete, MultiBinary)."""
        with torch.no_grad():
            sde = getattr(self.policy, "sde", None)
            if sde is not None:
                return sde.std().mean()
            log_std = getattr(self.policy, "log_std", None)
            return log_std.exp().mean() if isinstance(log_std, torch.Tensor) else None

    def _warn_off_center_bounds(self) -> None:
        """A warning (once per process, at learn) for Box actions whose bounds are not centred on 0: the policy's
        Gaussian starts around 0 and its samples are clipped to the bounds, so a component whose range lies off 0
        (say [5, 6]) sits at a bound and learns nothing from exploring."""
        low, high = self._action_low, self._action_high
        if low is None or not bool(torch.isfinite(low).all() and torch.isfinite(high).all()):  # ok-sync: once
            return
        off = (low + high).abs() > 1e-6 * (high - low).clamp_min(1.0)
        if bool(off.any()):  # ok-sync: once per learn
            index = int(off.nonzero()[0, 0])
            warn_at_caller(
                f"{self.name}: the action space's bounds are not centred on 0 (component {index}: "
                f"[{float(low[index]):g}, {float(high[index]):g}]); the policy's Gaussian starts around 0 and its "
                "samples are clipped to the bounds, so such a component explores little: rescale the env's actions "
                "to [-1, 1] with gymnasium.wrappers.RescaleAction (as Stable-Baselines3's env checker advises).",
                UserWarning)

    def acceleration_summary(self) -> dict[str, typing.Any]:
        """The update step's choice (`Algorithm.acceleration_summary`) and, under `accelerate="auto"`, the rollout
        policy's under `rollout_policy` (its own measurement: the two may differ)."""
        summary = super().acceleration_summary()
        report = getattr(self.policy, "accel_report", None)
        if report is not None:
            summary["rollout_policy"] = dict(report.summary())
        return summary

    def _policy_actions(self, obs: torch.Tensor, deterministic: bool,
                        action_masks: torch.Tensor | None = None) -> torch.Tensor:
        if deterministic:  # (the actions `act` gives, without the log-probabilities)
            return self._to_env(self.policy.mode(self.policy(obs)[0], action_masks))
        actions, _, _ = self.policy.act(obs, deterministic=False, action_masks=action_masks)
        return self._to_env(actions)

    #: approx_kl above which a metrics row says the policy moves far beyond what PPO's clipping keeps it to
    #: (clipped updates keep it to a few hundredths; one of 1 means the new policy's log-probabilities are about 1 nat
    #: away from the rollout's on average)
    RUNAWAY_KL = 1.0

    def _check_metrics(self, row: dict) -> None:
        """One warning per model where a row's approx_kl exceeds `RUNAWAY_KL`: the updates change the policy far more
        than the clip range allows (a learning rate far too high, usually), which training then goes on with."""
        kl = row.get("approx_kl")
        if kl is None or not kl > self.RUNAWAY_KL or getattr(self, "_warned_runaway", False):
            return
        self._warned_runaway = True
        warn_at_caller(f"{type(self).__name__}: approx_kl averaged {kl:.3g} over the updates before step "
                       f"{self.num_timesteps:,} (clipped PPO updates keep it to a few hundredths): each update moves "
                       f"the policy far from the one that collected the data; lower learning_rate (now "
                       f"{self.config.learning_rate:g}) or n_epochs.", RuntimeWarning)

    def _to_env(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions as the env takes them: Gaussian samples clipped to the Box (stored unclipped, as sampled); the
        policy's flat MultiDiscrete, MultiBinary and Box actions in the space's shape (a view)."""
        return env_actions(actions, self._action_kind, self.spec.action_space.shape, self._action_low,
                           self._action_high)

    def _action_storage(self) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of one stored action: an index (Discrete), k indices (MultiDiscrete), n 0/1 floats
        (MultiBinary), prod(shape) floats (Box)."""
        kind, index_dtype = self._action_kind, rules(self.device).index_dtype
        if kind == "categorical":
            return (), index_dtype
        if kind == "multi_categorical":
            return (len(self.policy.nvec),), index_dtype
        return (self.policy.action_dim,), torch.float32

    def _continues_episodes(self, env: BatchedEnv) -> bool:
        """Whether a further learn() call goes on from where the last one stopped (its envs' episodes, observation and
        rollout storage), as the off-policy algorithms and SB3's further `learn` do: not after `resume` or `load`, a
        rollout cut short (an exception or Ctrl-C inside it), a change of rollout size or of `use_masking` set on
        model.config since (the rollout is made again with or without its masks, `_start_masking`)."""
        buffer = getattr(self, "buffer", None)
        return (buffer is not None and self._resume is None and getattr(self, "_obs", None) is not None
                and not getattr(self, "_mid_rollout", False) and buffer.num_envs == env.num_envs
                and buffer.num_steps == self.config.num_steps
                and bool(getattr(self, "_masking", False)) == self._masks_wanted())

    def _rollout_step_bytes(self) -> int:
        """Bytes per step and env of the rollout `_start` allocates (`rollout_step_bytes`; without action masks,
        which the env says it gives only when it starts)."""
        action_shape, action_dtype = self._action_storage()
        return rollout_step_bytes(self.spec.observation_space, action_shape, action_dtype, self.device,
                                  store_next_obs=self._stores_next_obs())

    def _stores_next_obs(self) -> bool:
        """Whether the rollout keeps each step's next observation: float vectors fed to an MLP; images (float ones
        too, with encoder=cnn) and other encoded observations are stored once, the bootstrap values taken during the
        rollout."""
        return self.spec.float_vector_obs and self.config.encoder != "cnn"

    def _storage_bytes_estimate(self, num_envs: int) -> int:
        return super()._storage_bytes_estimate(num_envs) + self.config.num_steps * num_envs * self._rollout_step_bytes()

    def _check_envs_fit(self, num_envs: int) -> None:
        """The rollout `_start` allocates (`check_rollout_bytes`: naming the num_steps or num_envs that fits), then the
        envs themselves (`Algorithm._check_envs_fit`), checked before any env is made."""
        check_rollout_bytes(self.config.num_steps, num_envs, self._rollout_step_bytes(), self.device)
        super()._check_envs_fit(num_envs)

    def _start(self, env: BatchedEnv, total_timesteps: int) -> None:
        cfg = self.config
        self._warn_off_center_bounds()
        if self._continues_episodes(env):
            return
        self._obs = self._first_obs(env)  # (after `resume`: where the checkpoint's run was)
        action_shape, action_dtype = self._action_storage()
        self.buffer = RolloutBuffer(cfg.num_steps, env.num_envs, self.spec.observation_space, action_shape,
                                    action_dtype, self.device, mask_size=self._start_masking(),
                                    store_next_obs=self._stores_next_obs(),
                                    image_format=image_storage_format(getattr(self.policy, "encoder", None)))

    def _train_iteration(self):
        cfg, env, buf = self.config, self._env, self.buffer
        if cfg.anneal_lr:
            self._anneal_learning_rate()

        # 1. Rollout: everything stays on the device.
        obs = self._obs
        self._mid_rollout = True  # (until `_obs` is the envs' observation again: a learn cut short here resets)
        masking = self._masking
        successes: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step, where the env reports is_success
        with torch.no_grad(), acting_mode(self.policy):  # (Dropout off, BatchNorm's running statistics; SB3's modes)
            for step in range(cfg.num_steps):
                # the mask valid for `obs` (from the reset or the step that returned it)
                masks = self._action_mask if masking else None
                with phase("act"):
                    actions, log_probs, values = self._act(obs, step, masks) if masking else self._act(obs, step)
                    env_actions = self._to_env(actions)
                with phase("env"):
                    next_obs, rewards, terminated, truncated, info = env.step(env_actions)
                with phase("buffer"):
                    dones = terminated | truncated
                    # whole episodes for the statistics (a training wrapper may end a learning episode earlier,
                    # e.g. Atari's lost life: `info["done"]` still marks the game's end)
                    ends = info.get("done", dones)
                    buf.add(step, obs, info["final_obs"], actions, log_probs, values, rewards, terminated, dones,
                            ends, info["episode_return"], action_masks=masks)
                    if buf.next_obs is None:
                        self._store_final_values(buf, step, info)
                    if masking:
                        self._action_mask = info["action_mask"]
                    if "is_success" in info:
                        successes.append((info.get("done", dones), info["is_success"]))
                    self._on_dones(ends)
                obs = next_obs
            self._obs, self._mid_rollout = obs, False
            # 2. GAE, bootstrapping every step from V(final_obs); termination cuts the bootstrap, truncation not.
            with phase("gae"):
                advantages, returns = gae(buf.rewards, buf.values, self._next_values(buf), buf.terminated, buf.dones,
                                          cfg.gamma, cfg.gae_lambda)

        # 3. The algorithm's updates, with the schedule functions' values at the step count after this rollout (SB3's
        # progress; anneal_lr's was taken before it, CleanRL's).
        if self._schedule_functions:
            self._call_schedules(self.num_timesteps + cfg.num_steps * env.num_envs * self.strategy.world_size)
        with phase("update"):
            metrics = self._update_rollout(buf, advantages, returns)
            metrics["explained_variance"] = explained_variance(buf.values, returns)
            std = self._action_std()
            if std is not None:
                metrics["std"] = std
        episode_return_sum, episode_count = buf.episode_totals()
        metrics.update(episode_return_sum=episode_return_sum, episode_count=episode_count,
                       **success_totals(successes, self.strategy.enabled, self.device))
        return cfg.num_steps * env.num_envs, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """How much of the returns' variance the value estimates made during the rollout explain, as Stable-Baselines3
    logs it: 1 - Var(returns - values) / Var(returns) (1: perfect, 0: no better than a constant, negative: worse);
    NaN where the returns do not vary."""
    spread = returns.var(correction=0)
    return torch.where(spread > 0, 1 - (returns - values).var(correction=0) / spread, torch.nan)
