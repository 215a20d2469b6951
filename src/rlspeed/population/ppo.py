"""PPO populations: K independent PPO agents trained in one process as one batched model.

Every parameter, Adam moment, env row and buffer has the members stacked along a leading dimension `K`: the
actor-critic MLPs of all members are one batched matmul per layer (`2K` networks: each member's actor and critic),
the envs are one native env of `K x N` rows, and one update call steps every member. Member `k` is a solo
`PPO(env_id, seed=seeds[k], ...)`:

* its initial weights are those of the solo model (K solo models are built and their parameters stacked);
* its env rows draw the solo run's env streams (`NativeEnv.seed_row_blocks`);
* its random draws (action sampling, minibatch order) come from its own `torch.Generator`, started from the state
  the solo run's global generator has when its training starts, so they are the solo run's draws;
* per-member hyperparameters that do not change shapes (learning rate, gamma, GAE lambda, entropy and value
  coefficients, clip range, max grad norm) are tensors of shape `[K]`; gradient clipping and Adam are per member.

So the first updates of member k equal the solo run's to float tolerance (tests/test_population.py). Evaluation
batches every member's 10 deterministic episodes into one native env, seeded as the solo run's evaluation is.

A member that leaves (reached its target with `stop="each"`, pruned by `learn`'s `on_eval`, or diverged) leaves the
computation: its rows of every stacked tensor (parameters, Adam moments, hyperparameters, generators, env rows) are
cut out, so the cost of an iteration follows the members still training. `alive` maps the rows to the original
member indices, which every result uses.

Envs: the native envs (`rlspeed.envs.registry.NATIVE_ENVS`), whose row block k draws the streams of an env seeded
`seeds[k]`, or any registered Gymnasium env (`env_backend="gymnasium"`; the default for ids without a native env):
one synchronous vector env of K x N envs, member k's env i reset with seed `seeds[k] + i`, as a solo run's
Gymnasium envs are, or EnvPool's (`env_backend="envpool"`; the default for Atari games where it is installed): one
pool per member made with seed `seeds[k]` (`rlspeed.population.base.MemberEnvs`), as a solo run's.

Covered now: PPO with Discrete or Box actions and rlspeed's default MLP policy on float-vector observations,
one-hot encoded Discrete / MultiDiscrete ones (FrozenLake, Taxi), flattened bool or integer vectors, images through
each member's own CNN encoder (`MemberEncoder`: one grouped call for small CNNs, one call per member for Nature
CNNs on a CPU; the rollout keeps the images' dtype; autograd update), or Dict and Tuple observations through each
member's own multi-input encoder (the envs pack them into flat rows: `PackedObservations`), with or without
observation and reward normalisation (each member by its own statistics: `rlspeed.population.normalize`), on one
device (A2C: `rlspeed.population.a2c`, a subclass; SAC, TD3, DDPG and DQN: `rlspeed.population.offpolicy`).
Action masks (`use_masking`, sb3-contrib's MaskablePPO) apply as in the solo PPO and A2C, by autograd. Not yet:
RecurrentPPO.

Checkpoints (`save`, `resume`, `learn(run_dir=..., checkpoint_freq=...)`, see `PopulationBase`) hold the stacked
parameters, the parameters members left with, the optimiser's moments and step count, the per-member hyperparameter
tensors and the schedules' end, besides what every population's hold (generators, env state, the loop's progress).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rlspeed.algos.base import progress_remaining
from rlspeed.algos.ppo import PPO
from rlspeed.buffers import gae
from rlspeed.buffers.rollout import check_rollout_bytes
from rlspeed.device import check_num_threads, float32_default, training_threads
from rlspeed.envs.base import observation_layout
from rlspeed.errors import UserError, positive_whole
from rlspeed.fused.flat import Workspace, ensemble_backward, ensemble_forward
from rlspeed.fused.ppo import unsupported_reason
from rlspeed.nn import categorical_entropy, ensemble_linear, env_actions, gaussian_log_prob, masked_logits
from rlspeed.population.base import (
    MemberEncoder,
    PopulationBase,
    config_tensors,
    fused_adam_members,
    has_parameters,
    member_features,
    member_grad_norms,
    saved_like,
    stack_leaf,
)

#: Hyperparameters a member may set for itself (none changes a tensor's shape)
PER_MEMBER = ("learning_rate", "gamma", "gae_lambda", "ent_coef", "vf_coef", "clip_range", "max_grad_norm")
#: Hyperparameters that change shapes or the loop's structure: one value for the whole population
SHARED_ONLY = ("net_arch", "num_envs", "num_steps", "batch_size", "n_epochs", "activation", "encoder",
               "cnn_features_dim", "cnn", "normalize_obs", "normalize_reward", "anneal_lr", "anneal_clip",
               "normalize_advantage", "clip_range_vf", "log_std_init", "use_masking", "fused_update",
               "normalize_images", "normalize_obs_clip", "normalize_reward_clip")
_ADAM_BETAS, _ADAM_EPS = (0.9, 0.999), 1e-5  # as `rlspeed.nn.make_adam`


def _normalized(advantages: torch.Tensor) -> torch.Tensor:
    """Each member's advantages `[K, B]` normalised over its rows, as a solo run's `normalize_advantage`."""
    return (advantages - advantages.mean(1, keepdim=True)) / (advantages.std(1, keepdim=True) + 1e-8)


class PPOPopulation(PopulationBase):
    """K independent PPO members trained as one batched model (see the module docstring).

    >>> from rlspeed import PPO
    >>> from rlspeed.population import Population
    >>> population = Population(PPO, "CartPole-v1", seeds=range(4), learning_rate=[1e-3, 2e-3, 3e-3, 4e-3])
    >>> summary = population.learn(100_000, target_return=475, eval_freq=1024)

    `seeds`: one per member (distinct). Hyperparameters: one value for all members, or, for those in `PER_MEMBER`, a
    list of K values. `member_overrides`: a list of K dicts of hyperparameters for single members (same rules).
    `members`: solo PPO models (one per seed of `seeds`, each made with that seed, as loaded from member files) that
    the members start as, their parameters and normalisation statistics, in place of new ones; their settings are the
    population's (give no hyperparameters).
    """

    algo_name = "ppo"
    algo_cls: type = PPO  # the solo algorithm whose runs the members are
    per_member = PER_MEMBER
    supports_action_masks = True  # (sb3-contrib's MaskablePPO, as the solo PPO: categorical actions)
    check_divergence_every_iteration = True  # (one host read of K flags per rollout of num_envs x num_steps steps)

    def __init__(self, algo_cls: type, env_id: str, seeds: Sequence[int], *,
                 member_overrides: Sequence[dict[str, Any] | None] | None = None,
                 device: str | torch.device = "cpu", env_backend: str = "auto",
                 members: Sequence[Any] | None = None, **hyperparameters: Any) -> None:
        # float32 batched networks, also under a caller's float64 default dtype; built on the members' threads, as
        # a solo model is (stacking their weights on the caller's count started torch's OpenMP threads, and a
        # process forked after that, a sweep's Pool worker, hung at its first parallel operation)
        # (and trainable ones, also inside a caller's torch.inference_mode(), and built on the CPU, also where the
        # caller made another device torch's default, as a solo model's)
        threads = check_num_threads(hyperparameters.get("num_threads"))
        with float32_default(), training_threads(threads), torch.inference_mode(False), torch.device("cpu"):
            solos = self._solo_members(algo_cls, env_id, seeds, member_overrides, device, env_backend, hyperparameters,
                                       members)
            cfg, size = self.config, self.size
            policy = solos[0].policy
            self.kind = policy.kind
            self._action_low = self._action_high = None  # (bounds only for the Gaussian's clipping)
            if self.kind == "gaussian":  # the Box's bounds, made once (a host-to-device copy each step otherwise)
                box = solos[0].spec.action_space
                self._action_low = torch.as_tensor(box.low, device=self.device, dtype=torch.float32).flatten()
                self._action_high = torch.as_tensor(box.high, device=self.device, dtype=torch.float32).flatten()
            encoder = policy.encoder
            if self.kind not in ("categorical", "gaussian"):
                raise UserError(f"Populations cover policies with Discrete or Box actions so far; {env_id} has "
                                f"{type(solos[0].spec.action_space).__name__} actions: train them with solo runs, "
                                "one seed each.")
            if encoder is not None and cfg.normalize_obs and self._packed is None:  # (Dict: float keys, as solo runs)
                raise UserError(f"normalize_obs applies to float vector observations, and {env_id}'s go through a "
                                f"{encoder.kind}: drop normalize_obs.")
            #: the members' observation encoder where it has no parameters (one-hot, flatten), else None
            self._encoder = None if has_parameters(encoder) else encoder
            #: each member's own encoder where it has parameters (a CNN): `MemberEncoder`, its stacked parameters in
            #: `params` after the MLP's weights and biases
            self._member_encoder = MemberEncoder([s.policy.encoder for s in solos]) if has_parameters(encoder) else None
            self.activation = policy.body.activation
            self.spec = solos[0].spec
            self.action_dim = policy.action_dim
            # stacked parameters: weights [K, 2, in, out] and biases [K, 2, 1, out] (member's actor, critic),
            # log_std [K, A]
            layers = range(len(policy.body.weights))
            self.weights = [stack_leaf([s.policy.body.weights[i] for s in solos]) for i in layers]
            self.biases = [stack_leaf([s.policy.body.biases[i] for s in solos]) for i in layers]
            self.encoder_params = ([] if self._member_encoder is None
                                   else self._member_encoder.stack([s.policy.encoder for s in solos]))
            self.params = [*self.weights, *self.biases, *self.encoder_params]
            if self.kind == "gaussian":
                self.log_std = stack_leaf([s.policy.log_std for s in solos])
                self.params.append(self.log_std)
            # Adam's moments (RMSprop's mean square: `_exp_avg_sq`) of every parameter as one flat [K, P] buffer per
            # moment: the optimiser is a handful of kernels
            self._exp_avg = torch.zeros(size, sum(p[0].numel() for p in self.params), device=self.device)
            self._exp_avg_sq = torch.zeros_like(self._exp_avg)
            self._adam_steps = 0  # the same for every member in the computation: each is updated at every step
            #: whether Adam steps through torch's fused kernel (`_fused_steps`) where `rlspeed.nn.make_adam` takes
            #: it: PPO's flat formula makes more passes than `_FlatMemberAdam`'s, and the fused step is the faster at
            #: every preset size benchmarks/member_adam.py measures
            self._fused_adam = self.device.type in ("cpu", "cuda")
            # the update: PPO's loss differentiated by hand (`_hand_gradients`) where `rlspeed.fused` covers the
            # network and `fused_update` is on (as the solo algorithms choose), else autograd of `_loss`;
            # tests/test_population.py checks the two agree
            # (a run that finds action masks when its env starts switches to autograd then: `_start_masking`)
            unsupported = "fused_update=False" if not self.config.fused_update else unsupported_reason(policy)
            #: which update trains the members (summary.json's `update`): "hand-derived" or "autograd", and why
            self.update_path = "autograd" if unsupported else "hand-derived"
            self.update_reason = unsupported or "default (the network is one rlspeed.fused covers)"
            self._tanh = isinstance(self.activation, torch.nn.Tanh)
            # the activation as a function where it is one (a module call costs as much as the kernel on a few rows)
            self._activate = {torch.nn.Tanh: torch.tanh, torch.nn.ReLU: torch.relu}.get(type(self.activation),
                                                                                      self.activation)
            self._workspace = Workspace()

            self.hyper = config_tensors(solos, self.per_member, self.device)
            self._adopt_solos(solos)
            self._param_sizes = [p[0].numel() for p in self.params]
            #: original indices of the members still in the computation, one per row of every stacked tensor
            self.alive: list[int] = list(range(size))
            # every member's parameters as they were when it left (rows of members still training are stale)
            self._final_params = [p.detach().clone() for p in self.params]
            self._start_normalization()
            self.num_timesteps = 0  # env steps per member
            self._env = None
            self._storage_key = None  # (the rollout storage is made at the first iteration)
            self._masks: torch.Tensor | None = None  # the rollout's action masks, where the run applies them
            del solos

    # --- the batched network ------------------------------------------------------------------------------------
    def forward(self, obs: torch.Tensor, params: Sequence[torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor outputs `[K, B, A]`, values `[K, B]`) of observations `[K, B, obs_dim]`: one batched matmul per layer
        for every member's actor and critic. `params`: stacked parameters laid out as `self.params` (default: those
        of the members in the computation)."""
        params = self.params if params is None else params
        layers = len(self.weights)
        weights, biases = params[:layers], params[layers:2 * layers]
        size, batch = obs.shape[0], obs.shape[1]
        x = self._features(obs, params).unsqueeze(1).expand(size, 2, batch, -1).reshape(2 * size, batch, -1)
        last = layers - 1
        for layer, (weight, bias) in enumerate(zip(weights, biases)):
            x = ensemble_linear(x, weight.flatten(0, 1), bias.flatten(0, 1))
            if layer < last:
                x = self._activate(x)
        x = x.view(size, 2, batch, -1)
        return x[:, 0], x[:, 1, :, 0]

    def _features(self, obs: torch.Tensor, params: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """The networks' input `[K, B, features]` from observations `[K, B, ...]` (stored flat): flattened float
        vectors, the one-hot encoding of Discrete / MultiDiscrete indices (stored as floats in the rollout), or each
        member's own encoder (`MemberEncoder`, by the encoder parameters in `params`: default `self.params`)."""
        obs = self.member_observations(obs, unflatten=self._member_encoder is not None)
        if self._member_encoder is None:
            return member_features(self._encoder, obs)
        start = 2 * len(self.weights)
        encoder_params = (self.params if params is None else params)[start:start + len(self.encoder_params)]
        return self._member_encoder(encoder_params, obs)

    def _adopt_solos(self, solos: Sequence) -> None:
        """Take what a subclass needs from the solo models before they are dropped (PPO: nothing)."""

    def _start_masking(self) -> None:
        super()._start_masking()
        # (the hand-derived update has no masks, as for the solo run)
        self.update_path, self.update_reason = "autograd", "action masks"

    def _sample(self, out: torch.Tensor, step: int,
                masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions, log_probs) `[K, B]` at rollout step `step`, member k's noise from its own generator (the solo
        run's draws: one draw per step, as `ActorCritic.act`), never a masked action (`masks` `[K, B, A]`)."""
        if self.kind == "categorical":
            log_p = torch.log_softmax(masked_logits(out, masks), dim=-1)
            noise = torch.stack([torch.empty(out.shape[1:], device=self.device).exponential_(generator=g)
                                 for g in self.generators])
            actions = (log_p - noise.log_()).argmax(-1)
            return actions, log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        noise = torch.stack([torch.randn(out.shape[1:], device=self.device, generator=g) for g in self.generators])
        actions = out + self.log_std.exp().unsqueeze(1) * noise
        return actions, self._gaussian_log_prob(actions, out)

    def _gaussian_log_prob(self, actions: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return gaussian_log_prob(actions, mean, self.log_std.unsqueeze(1))  # each member's log std over its rows

    def _log_prob_entropy(self, out: torch.Tensor, actions: torch.Tensor,
                          masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "categorical":  # (with masks: over the allowed actions, as `ActorCritic.log_prob_entropy`)
            log_p = torch.log_softmax(masked_logits(out, masks), dim=-1)
            return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), categorical_entropy(log_p, masks)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum(-1, keepdim=True).expand(out.shape[:2])
        return self._gaussian_log_prob(actions, out), entropy

    def _env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions `[K, B, ...]` as the env rows take them `[K * B, ...]` (`nn.env_actions`: Gaussian samples clipped
        to the Box)."""
        return env_actions(actions.flatten(0, 1), self.kind, self.spec.action_space.shape, self._action_low,
                           self._action_high)

    # --- training ----------------------------------------------------------------------------------------------
    def _progress_remaining(self) -> float:
        return progress_remaining(self.num_timesteps, getattr(self, "_schedule_start", 0), self._total_timesteps)

    def _rollout_row_bytes(self, obs_dim: int, obs_dtype: torch.dtype, mask_bytes: int) -> int:
        """Bytes one env row's step takes in the rollout (`_rollout_storage`): observation and next observation,
        action, log-probability, value, reward, the two flags and the action mask."""
        action_bytes = 8 if self.kind == "categorical" else 4 * self.action_dim
        return 2 * obs_dim * obs_dtype.itemsize + action_bytes + 3 * 4 + 2 + mask_bytes

    def check_fits(self, total_timesteps: int) -> None:
        """UserError (`check_rollout_bytes`) where the rollout `learn` allocates when it starts does not fit in memory
        (see `PopulationBase.check_fits`). Counts action masks wherever the actions are discrete and `use_masking` is
        on (the env says whether it gives masks only when it starts)."""
        layout = observation_layout(self.spec.observation_space)
        if isinstance(layout, dict):  # (refused when the env starts: populations take no Dict observations)
            return
        shape, dtype = layout
        obs_dtype = dtype if self._member_encoder is not None else torch.float32
        mask_bytes = self.action_dim if self.kind == "categorical" and self.config.use_masking else 0
        check_rollout_bytes(self.config.num_steps, self.config.num_envs,
                            self._rollout_row_bytes(math.prod(shape), obs_dtype, mask_bytes), self.device,
                            members=len(self.alive))

    def _rollout_storage(self, size: int, obs_dim: int, action_shape: tuple[int, ...]
                         ) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        """The rollout's buffers `[T, K * N, ...]` (observations, next observations, actions `[T, K, N, ...]`,
        log-probabilities, values, rewards, terminated, dones) and each step's row views of them, so a step is stored
        with one foreach copy. Made again only when the members in the computation change: nothing of a rollout is
        read after its iteration."""
        key = (size, obs_dim)
        if self._storage_key != key:
            steps, rows, device = self.config.num_steps, size * self.config.num_envs, self.device
            # obs, next obs: images in their own dtype (uint8 or bool: the encoder makes them float), else float32
            obs_dtype = self._obs.dtype if self._member_encoder is not None else torch.float32
            # refused in one sentence naming the num_steps that fits, as a solo rollout is, before the allocator
            # fails (a RuntimeError) or the process is killed; the storage made before goes first
            self._storage = self._storage_key = None
            mask_bytes = self._action_mask.shape[-1] if self._masking else 0
            check_rollout_bytes(steps, self.config.num_envs, self._rollout_row_bytes(obs_dim, obs_dtype, mask_bytes),
                                device, members=size)
            observations = [torch.empty(steps, rows, obs_dim, device=device, dtype=obs_dtype) for _ in range(2)]
            actions = torch.empty(steps, size, self.config.num_envs, *action_shape, device=device,
                                  dtype=torch.long if self.kind == "categorical" else torch.float32)
            floats = [torch.empty(steps, rows, device=device) for _ in range(3)]  # log-probs, values, rewards
            flags = [torch.empty(steps, rows, dtype=torch.bool, device=device) for _ in range(2)]  # term, done
            buffers = [*observations, actions, *floats, *flags]
            per_member_rows = (3, 4)  # (log-probabilities and values arrive as [K, N])
            views = [buf.view(steps, size, -1) if i in per_member_rows else buf for i, buf in enumerate(buffers)]
            self._storage = buffers, [[view[step] for view in views] for step in range(steps)]
            self._storage_key = key
        return self._storage

    def train_iteration(self) -> int:
        """One rollout of `num_steps` steps of every env row, GAE, and the updates of every member (`_update_rollout`,
        PPO's: `n_epochs` of minibatches); returns the env steps per member (`num_steps * num_envs`)."""
        cfg, size, envs = self.config, len(self.alive), self.config.num_envs
        if not size:
            raise UserError("Every member has left the population (reached, pruned or diverged): nothing to train.")
        if self._env is None:
            self._start_env()
        env, steps = self._env, cfg.num_steps
        obs_dim = self._obs[0].numel()  # (stored flat: the networks take observations flattened)
        action_shape = () if self.kind == "categorical" else (self.action_dim,)
        buffers, rows = self._rollout_storage(size, obs_dim, action_shape)
        buf_obs, buf_next, buf_actions, buf_log_probs, buf_values, buf_rewards, buf_terminated, buf_dones = buffers
        buf_masks = self._mask_storage(steps, size * envs) if self._masking else None
        obs = self._obs
        with torch.no_grad():
            for step in range(steps):
                out, values = self.forward(obs.view(size, envs, -1))
                if buf_masks is None:
                    actions, log_probs = self._sample(out, step)
                else:  # (the masks valid for `obs`: from the reset or the step that returned it)
                    masks = self._action_mask
                    actions, log_probs = self._sample(out, step, masks.view(size, envs, -1))
                next_obs, rewards, terminated, truncated, info = env.step(self._env_actions(actions))
                if buf_masks is not None:
                    buf_masks[step].copy_(masks)
                    self._action_mask = info["action_mask"]
                torch._foreach_copy_(rows[step], (obs.reshape(obs.shape[0], -1),
                                                  info["final_obs"].reshape(obs.shape[0], -1), actions, log_probs,
                                                  values, rewards, terminated, terminated | truncated))
                obs = next_obs
            self._obs = obs
            self._note_rollout_values(buf_obs, buf_next, buf_rewards, buf_actions)
            next_obs_per_member = buf_next.view(steps, size, envs, -1).transpose(0, 1).reshape(size, -1, obs_dim)
            next_values = self.forward(next_obs_per_member)[1]
            next_values = next_values.view(size, steps, envs).transpose(0, 1).reshape(steps, size * envs)
            per_row = {key: self.hyper[key].repeat_interleave(envs) for key in ("gamma", "gae_lambda")}
            advantages, returns = gae(buf_rewards, buf_values, next_values, buf_terminated, buf_dones,
                                      per_row["gamma"], per_row["gae_lambda"])

        def per_member(x: torch.Tensor) -> torch.Tensor:  # [T, K * N, ...] -> [K, T * N, ...] (the solo's order)
            return x.view(steps, size, envs, *x.shape[2:]).transpose(0, 1).reshape(size, steps * envs, *x.shape[2:])

        batch = (per_member(buf_obs), buf_actions.transpose(0, 1).reshape(size, steps * envs, *action_shape),
                 per_member(buf_log_probs), per_member(buf_values), per_member(advantages), per_member(returns))
        if buf_masks is None:
            self._update_rollout(*batch)
        else:
            self._update_rollout(*batch, masks=per_member(buf_masks))
        self.num_timesteps += steps * envs
        return steps * envs

    def _mask_storage(self, steps: int, rows: int) -> torch.Tensor:
        """The rollout's action masks `[T, K * N, A]` (made again when the members in the computation change)."""
        width = self._action_mask.shape[-1]
        if self._masks is None or self._masks.shape != (steps, rows, width):
            self._masks = torch.empty(steps, rows, width, dtype=torch.bool, device=self.device)
        return self._masks

    def _update_rollout(self, obs, actions, old_log_probs, old_values, advantages, returns, masks=None) -> None:
        """The updates of one rollout, every tensor `[K, T * N, ...]` in the solo run's row order: PPO's `n_epochs`
        of minibatches (member k's order from its generator); `masks`: the action masks the actions were sampled
        under."""
        cfg, size = self.config, len(self.alive)
        progress = self._progress_remaining()
        learning_rate = self.hyper["learning_rate"] * (progress if cfg.anneal_lr else 1.0)
        clip_range = self.hyper["clip_range"] * (progress if cfg.anneal_clip else 1.0)
        batch_size = obs.shape[1]
        minibatch = min(max(cfg.batch_size, 1), batch_size)
        normalized = cfg.normalize_advantage and minibatch == batch_size > 1
        if normalized:  # (as PPO: one minibatch of the whole rollout is normalised once)
            advantages = _normalized(advantages)
        members = torch.arange(size, device=self.device).unsqueeze(1)
        for _ in range(cfg.n_epochs):
            order = (torch.stack([torch.randperm(batch_size, device=self.device, generator=g)
                                  for g in self.generators]) if minibatch < batch_size else None)
            for start in range(0, batch_size - minibatch + 1, minibatch):
                if order is None:
                    parts, part_masks = (obs, actions, old_log_probs, old_values, advantages, returns), masks
                else:
                    index = order[:, start:start + minibatch]
                    parts = tuple(x[members, index] for x in (obs, actions, old_log_probs, old_values, advantages,
                                                              returns))
                    part_masks = None if masks is None else masks[members, index]
                self._update_step(*parts, clip_range, learning_rate, normalize=cfg.normalize_advantage
                                  and not normalized, masks=part_masks)

    def _update_step(self, obs, actions, old_log_probs, old_values, advantages, returns, clip_range, learning_rate,
                     normalize: bool, masks: torch.Tensor | None = None) -> None:
        """One minibatch update of every member: PPO's loss per member (as `PPO._loss`), its gradient (by hand or by
        autograd, `update_path`), per-member gradient clipping, per-member Adam."""
        if normalize and advantages.shape[1] > 1:
            advantages = _normalized(advantages)
        self._optimizer_step(self._gradients(obs, actions, old_log_probs, old_values, advantages, returns, clip_range,
                                             masks=masks), learning_rate)

    def _gradients(self, *batch, masks: torch.Tensor | None = None) -> list[torch.Tensor]:
        """d(sum of the members' `_loss`)/d(each of `self.params`) on `batch` (`_loss`'s arguments): by hand or by
        autograd, as `update_path` says (autograd wherever the run applies action `masks`)."""
        if self.update_path == "hand-derived":
            return self._hand_gradients(*batch)
        loss = self._loss(*batch) if masks is None else self._loss(*batch, masks=masks)
        return list(torch.autograd.grad(loss.sum(), self.params))  # (members share no parameter)

    def _loss(self, obs, actions, old_log_probs, old_values, advantages, returns, clip_range,
              masks: torch.Tensor | None = None) -> torch.Tensor:
        """Each member's PPO loss `[K]` on its minibatch rows `[K, B, ...]` (advantages already normalised), as
        `PPO._loss` computes a solo run's: the reference the hand-derived gradient is tested against."""
        cfg, hyper = self.config, self.hyper
        out, new_values = self.forward(obs)
        new_log_probs, entropy = self._log_prob_entropy(out, actions, masks)
        ratio = (new_log_probs - old_log_probs).exp()
        clip = clip_range.unsqueeze(1)
        policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)).mean(1)
        if cfg.clip_range_vf is None:
            value_loss = 0.5 * (new_values - returns).square().mean(1)
        else:
            clipped = old_values + (new_values - old_values).clamp(-cfg.clip_range_vf, cfg.clip_range_vf)
            value_loss = 0.5 * torch.max((new_values - returns).square(), (clipped - returns).square()).mean(1)
        return policy_loss - hyper["ent_coef"] * entropy.mean(1) + hyper["vf_coef"] * value_loss

    @torch.inference_mode()
    def _hand_gradients(self, obs, actions, *loss_inputs) -> list[torch.Tensor]:
        """d(sum of the members' `_loss`)/d(each of `self.params`), written out as `rlspeed.fused.ppo` does for one
        member (see its docstring for the maths), with every member's coefficients its own: the forward pass of every
        member's networks, `_output_gradients` (the algorithm's dL/dlog pi and dL/dV per row, from `loss_inputs`:
        `_loss`'s arguments after obs and actions), the entropy term and the backward pass."""
        hyper = self.hyper
        size, batch = obs.shape[0], obs.shape[1]
        weights = [w.detach().flatten(0, 1) for w in self.weights]  # [2K, in, out]: member k's actor, critic
        biases = [b.detach().flatten(0, 1) for b in self.biases]
        x = self._features(obs).unsqueeze(1).expand(size, 2, batch, -1).reshape(2 * size, batch, -1)
        hidden = ensemble_forward(x, weights, biases, self._tanh, self._workspace, "population")
        out = hidden[-1].view(size, 2, batch, -1)
        head, values = out[:, 0], out[:, 1, :, 0]
        if self.kind == "categorical":
            log_p = torch.log_softmax(head, dim=-1)
            probs = log_p.exp()
            index = actions.long().unsqueeze(-1)
            new_log_probs = log_p.gather(-1, index).squeeze(-1)
        else:
            log_std = self.log_std.detach().unsqueeze(1)  # [K, 1, A]
            inv_std = torch.exp(-log_std)
            z_score = (actions - head) * inv_std
            new_log_probs = (-0.5 * z_score.square() - log_std).sum(-1) - 0.5 * math.log(2 * math.pi) * head.shape[-1]
        grad_log_prob, grad_values = self._output_gradients(new_log_probs, values, *loss_inputs)
        grad_out = torch.zeros_like(out)
        ent_coef = hyper["ent_coef"].view(size, 1, 1)
        if self.kind == "categorical":
            entropy = -(probs * log_p).sum(-1, keepdim=True)
            grad_head = (ent_coef / batch) * probs * (log_p + entropy) - probs * grad_log_prob.unsqueeze(-1)
            grad_head.scatter_add_(-1, index, grad_log_prob.unsqueeze(-1))
            grad_out[:, 0] = grad_head
        else:
            grad_out[:, 0] = grad_log_prob.unsqueeze(-1) * z_score * inv_std
            log_std_grad = (grad_log_prob.unsqueeze(-1) * (z_score.square() - 1)).sum(1) - ent_coef.view(size, 1)
        grad_out[:, 1, :, 0] = grad_values
        weight_grads = [torch.empty_like(w) for w in weights]
        bias_grads = [torch.empty_like(b) for b in biases]
        ensemble_backward(grad_out.view(2 * size, batch, -1), hidden, weights, weight_grads, bias_grads, self._tanh,
                          workspace=self._workspace, tag="population")
        grads = [g.view(w.shape) for g, w in zip(weight_grads, self.weights)]
        grads += [g.view(b.shape) for g, b in zip(bias_grads, self.biases)]
        if self.kind == "gaussian":
            grads.append(log_std_grad)
        return grads

    def _output_gradients(self, new_log_probs, values, old_log_probs, old_values, advantages, returns, clip_range
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """(dL/dlog pi, dL/dV) `[K, B]` of PPO's clipped surrogate and (clipped) value loss, L the sum of the
        members' `_loss` (the entropy term is `_hand_gradients`')."""
        cfg, batch = self.config, new_log_probs.shape[1]
        ratio = (new_log_probs - old_log_probs).exp()
        clip = clip_range.unsqueeze(1)
        unclipped = advantages * ratio
        clipped = advantages * ratio.clamp(1 - clip, 1 + clip)
        value_error = values - returns
        if cfg.clip_range_vf is None:
            value_grad = value_error
        else:
            change = values - old_values
            clipped_sq = (old_values + change.clamp(-cfg.clip_range_vf, cfg.clip_range_vf) - returns).square()
            value_grad = torch.where((value_error.square() >= clipped_sq) | (change.abs() <= cfg.clip_range_vf),
                                     value_error, 0.0)
        # the unclipped term is the minimum of A r and A clip(r): it passes -A r / B to log pi, the clipped one none
        grad_log_prob = torch.where(unclipped <= clipped, advantages, 0.0).mul_(ratio).mul_(-1.0 / batch)
        return grad_log_prob, value_grad * (self.hyper["vf_coef"].unsqueeze(1) / batch)

    @torch.no_grad()
    def _optimizer_step(self, grads: Sequence[torch.Tensor], learning_rate: torch.Tensor) -> None:
        """Per-member gradient clipping (`_clipped_gradient`) and Adam (as `torch.optim.Adam`, eps 1e-5), on the
        gradients of every parameter as one flat `[K, P]`; `learning_rate` `[K]`. Where torch has a fused Adam kernel
        (CPU, CUDA: the one the solo runs' `make_adam` takes), each member's rows step through it (`_fused_steps`);
        elsewhere the same maths runs on the flat buffers (`tests/test_population.py` checks the two agree)."""
        flat = self._clipped_gradient(grads)
        self._adam_steps += 1
        if self._fused_adam:
            self._fused_steps(flat, learning_rate)
            return
        beta1, beta2 = _ADAM_BETAS
        correction1, correction2 = 1 - beta1 ** self._adam_steps, 1 - beta2 ** self._adam_steps
        self._exp_avg.lerp_(flat, 1 - beta1)
        self._exp_avg_sq.mul_(beta2).addcmul_(flat, flat, value=1 - beta2)
        denom = (self._exp_avg_sq.sqrt() / math.sqrt(correction2)).add_(_ADAM_EPS)
        self._subtract((self._exp_avg / denom).mul_((learning_rate / correction1).unsqueeze(1)))

    def _fused_steps(self, flat: torch.Tensor, learning_rate: torch.Tensor) -> None:
        """One Adam step of every member by torch's fused kernel, member k's parameters, moments and gradient rows of
        `flat` as lists of views (made once per layout: `_fused_views`) and its own learning rate; the kernel reads
        the step count (`_adam_steps`, already advanced) from one tensor, as `torch.optim.Adam` advances its own
        before the kernel."""
        views = self._fused_views(flat)
        self._fused_step_count.fill_(self._adam_steps)
        fused_adam_members(views, learning_rate.unbind(), self._fused_step_count, _ADAM_EPS, _ADAM_BETAS)

    def _fused_views(self, flat: torch.Tensor) -> list[tuple[list[torch.Tensor], ...]]:
        """Per member: (its parameters, gradient rows of `flat`, first and second moments) as lists of views shaped as
        its parameters, rebuilt when a buffer changes (members leave, a resume)."""
        key = (flat.data_ptr(), self._exp_avg.data_ptr(), self._exp_avg_sq.data_ptr(),
               *(p.data_ptr() for p in self.params))
        if getattr(self, "_fused_key", None) != key:
            sizes = self._param_sizes

            def rows(buffer: torch.Tensor, k: int) -> list[torch.Tensor]:
                return [part.view(p.shape[1:]) for part, p in zip(buffer[k].split(sizes), self.params)]

            self._fused_step_count = torch.zeros((), device=self.device)
            self._fused_cache = [([p.detach()[k] for p in self.params], rows(flat, k), rows(self._exp_avg, k),
                                  rows(self._exp_avg_sq, k)) for k in range(flat.shape[0])]
            self._fused_key = key
        return self._fused_cache

    def _clipped_gradient(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """The gradients of every parameter as one flat `[K, P]` (a buffer kept from call to call), each member's
        clipped to its `max_grad_norm` (as `rlspeed.nn.clip_grad_norm`: the global norm of the member's gradient)."""
        size = len(self.alive)
        buffer = getattr(self, "_grad_buffer", None)
        if buffer is None or buffer.shape != self._exp_avg.shape:
            buffer = self._grad_buffer = torch.empty_like(self._exp_avg)
        flat = torch.cat([g.reshape(size, -1) for g in grads], dim=1, out=buffer)
        norm = member_grad_norms(grads)
        return flat.mul_((self.hyper["max_grad_norm"] / (norm + 1e-6)).clamp_(max=1.0).unsqueeze(1))

    def _subtract(self, step: torch.Tensor) -> None:
        """Parameters -= `step`, a flat `[K, P]` laid out as `_clipped_gradient`'s."""
        torch._foreach_sub_([p.detach() for p in self.params],
                            [part.view(p.shape) for part, p in zip(step.split(self._param_sizes, 1), self.params)])

    # --- members leaving the computation ----------------------------------------------------------------------
    def remove(self, members: Iterable[int]) -> None:
        """Take members (original indices) out of the computation: their rows of every stacked tensor (parameters,
        Adam moments and steps, hyperparameters, generators, env rows and observations) are cut out, and their
        parameters kept as they are now for `member_state` and the final evaluation. Members already out are
        ignored."""
        leaving = set(int(k) for k in members) & set(self.alive)
        if not leaving:
            return
        rows = [i for i, k in enumerate(self.alive) if k not in leaving]
        gone = [i for i, k in enumerate(self.alive) if k in leaving]
        gone_members = torch.tensor([self.alive[i] for i in gone], device=self.device, dtype=torch.long)
        gone_rows = torch.tensor(gone, device=self.device, dtype=torch.long)
        with torch.no_grad():
            for final, param in zip(self._final_params, self.params):
                final[gone_members] = param.detach()[gone_rows]
        keep = torch.tensor(rows, device=self.device, dtype=torch.long)
        self._keep_statistics(rows)
        self._set_params([param.detach()[keep].requires_grad_() for param in self.params])
        self._exp_avg, self._exp_avg_sq = self._exp_avg[keep], self._exp_avg_sq[keep]
        self.hyper = {key: value[keep] for key, value in self.hyper.items()}
        self._keep_members(rows)

    def _set_params(self, params: list[torch.Tensor]) -> None:
        """`params` (laid out as `self.params`) become the stacked parameters: `weights`, `biases`,
        `encoder_params`, `log_std`."""
        layers = len(self.weights)
        self.params = params
        self.weights, self.biases = params[:layers], params[layers:2 * layers]
        self.encoder_params = params[2 * layers:2 * layers + len(self.encoder_params)]
        if self.kind == "gaussian":
            self.log_std = params[-1]

    #: rows of the rollouts since the last check whose observations or rewards were not finite, and rows that were
    #: sent a non-finite action (device flags; `_note_rollout_values`)
    _rollout_bad: torch.Tensor | None = None
    _rollout_sent: torch.Tensor | None = None

    def _attach_env_guard(self) -> None:
        """No per-step guard: the rollout storage is checked once per iteration (`_note_rollout_values`)."""
        self._env_guard = None
        self._rollout_bad = self._rollout_sent = None  # (the rows change with the env)

    def _note_rollout_values(self, obs: torch.Tensor, final_obs: torch.Tensor, rewards: torch.Tensor,
                             actions: torch.Tensor) -> None:
        """After a rollout: flag the env rows whose observations, final observations or rewards `[T, rows, ...]` were
        NaN or infinite, and those sent a non-finite action (a diverged policy's doing, not the env's), a few kernels
        per rollout (the single runs' guard checks the same values: `rlspeed.numerics.EnvValueGuard`)."""
        steps, rows = rewards.shape
        bad = ~rewards.isfinite().all(0)
        for values in (obs, final_obs):
            if values.is_floating_point():
                bad |= ~values.reshape(steps, rows, -1).isfinite().all(2).all(0)
        sent = (~actions.reshape(steps, rows, -1).isfinite().all(2).all(0) if actions.is_floating_point()
                else torch.zeros_like(bad))
        if self._rollout_bad is None or self._rollout_bad.shape != bad.shape:
            self._rollout_bad, self._rollout_sent = torch.zeros_like(bad), torch.zeros_like(bad)
        self._rollout_sent |= sent
        self._rollout_bad |= bad
        if self._rollout_scale is None and not self._scale_hinted:
            self._rollout_scale = self._measured_scale(obs, rewards)

    #: the first rollout's [largest |reward|, largest |observation value|] (`_env_scale`), None before it
    _rollout_scale: torch.Tensor | None = None

    def _measured_scale(self, obs: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        """[the largest |reward|, the largest |observation value|] of a rollout as stored (a normalisation the run
        has is applied already, which the scale hint then leaves alone), non-finite values read as 0; observations
        NaN unless they are float vectors the networks take as they are (as the solo runs' guard measures)."""
        def largest(values: torch.Tensor) -> torch.Tensor:
            return torch.nan_to_num(values.float(), nan=0.0, posinf=0.0, neginf=0.0).abs().amax()

        plain = (obs.is_floating_point() and self._packed is None and self._encoder is None
                 and self._member_encoder is None)
        return torch.stack((largest(rewards), largest(obs) if plain else rewards.new_tensor(math.nan)))

    def _env_scale(self) -> torch.Tensor | None:
        return self._rollout_scale

    def _env_value_flags(self) -> torch.Tensor | None:
        if self._rollout_bad is None:
            return None
        own = self._rollout_bad & ~self._rollout_sent
        self._rollout_bad = self._rollout_sent = None
        first = torch.where(own, torch.arange(own.shape[0], device=own.device), own.shape[0]).min()
        return torch.stack((own.sum(), first))

    def _finite_members(self) -> torch.Tensor:
        """Whether each member's parameters and Adam moments are still finite (device flags)."""
        finite = torch.ones(len(self.alive), dtype=torch.bool, device=self.device)
        for x in (*self.params, self._exp_avg_sq):
            finite &= x.detach().flatten(1).sum(1).isfinite()  # (a sum of finite values can overflow: also out)
        return finite

    # --- evaluation and the learn loop -------------------------------------------------------------------------
    def evaluate(self, seeds: Sequence[int] | None = None, episodes: int = 10, members: Sequence[int] | None = None,
                 max_steps: int | None = None) -> torch.Tensor:
        """Mean return over `episodes` deterministic episodes of each of `members` (original indices; default: those
        in the computation) as a host tensor, member `members[j]` on an env seeded `seeds[j]` as `rlspeed.evaluate`
        seeds one (one batched env for all; default seeds: `_evaluation_seeds`). Members out of the computation are
        evaluated with the parameters they left with."""
        episodes = positive_whole("episodes", episodes, needed_by="evaluate")
        if members is None or list(members) == self.alive:
            members, params = list(self.alive), self.params
        else:
            members = list(members)
            self._check_members(members)
            self._store_alive()
            params = [final[members] for final in self._final_params]
        seeds = self._evaluation_seeds(seeds, members)
        size = len(members)
        if size == 0:
            return torch.zeros(0, dtype=torch.float64, device="cpu")

        def policy(obs: torch.Tensor, masks: torch.Tensor | None = None) -> torch.Tensor:
            rows = obs.shape[0] // size  # (each member's episodes of the wave it plays: `_mean_returns`)
            out, _ = self.forward(obs.view(size, rows, -1), params)
            if masks is not None:  # (the deterministic action among the allowed ones)
                out = masked_logits(out, masks.view(size, rows, -1))
            return self._env_actions(out.argmax(-1) if self.kind == "categorical" else out)

        return self._mean_returns(seeds, episodes, policy, members, max_steps)

    def _store_alive(self) -> None:
        """Copy the parameters (and statistics) of the members in the computation into the store of every member's."""
        self._store_alive_statistics()
        if self.alive:
            members = torch.tensor(self.alive, device=self.device)
            with torch.no_grad():
                for final, param in zip(self._final_params, self.params):
                    final[members] = param.detach()

    # --- what `PopulationBase.learn` asks of a population ---------------------------------------------------------
    def _begin(self, total_timesteps: int, schedule_start: int) -> None:
        # the learning-rate and clip schedules' span: this call's (a further call starts them afresh, as a solo run's
        # does, unless `schedule_start` is 0), or right after `resume` the resumed run's (its end where that is later)
        resumed_end, self._resumed_schedule_end = getattr(self, "_resumed_schedule_end", None), None
        resumed_start, self._resumed_schedule_start = getattr(self, "_resumed_schedule_start", None), None
        self._schedule_start = schedule_start if resumed_start is None else resumed_start
        self._total_timesteps = max(self.num_timesteps + total_timesteps, resumed_end or 0)

    # --- checkpoints (see `PopulationBase.save`) ----------------------------------------------------------------
    def _state(self) -> tuple[dict[str, torch.Tensor], dict]:
        tensors = {f"param.{i}": p.detach() for i, p in enumerate(self.params)}
        tensors.update({f"final.{i}": p for i, p in enumerate(self._final_params)})
        tensors.update({"exp_avg": self._exp_avg, "exp_avg_sq": self._exp_avg_sq})
        tensors.update({f"hyper.{key}": value for key, value in self.hyper.items()})
        tensors.update(self._statistics_state())
        # the schedules' end is the learn call's in progress (`progress` set): a save between learn calls has none, as
        # the next learn call sets its own
        in_learn = self.progress is not None
        return tensors, {"adam_steps": self._adam_steps,
                         "schedule_end": getattr(self, "_total_timesteps", None) if in_learn else None,
                         "schedule_start": getattr(self, "_schedule_start", None) if in_learn else None}

    def _load_state(self, tensors: dict[str, torch.Tensor], values: dict) -> None:
        def take(name: str, like: torch.Tensor, any_float: bool = False) -> torch.Tensor:
            return saved_like(tensors, name, like, any_float).clone()

        self._set_params([take(f"param.{i}", p).requires_grad_() for i, p in enumerate(self.params)])
        self._final_params = [take(f"final.{i}", p) for i, p in enumerate(self._final_params)]
        self._exp_avg, self._exp_avg_sq = take("exp_avg", self._exp_avg), take("exp_avg_sq", self._exp_avg_sq)
        self.hyper = {key: take(f"hyper.{key}", value) for key, value in self.hyper.items()}
        self._load_statistics(tensors)
        self._adam_steps = int(values["adam_steps"])
        end = values.get("schedule_end")
        self._resumed_schedule_end = None if end is None else int(end)
        # (checkpoints written before the start was saved: their runs' schedules started at 0)
        self._resumed_schedule_start = None if end is None else int(values.get("schedule_start") or 0)

    def _member_checkpoint(self, k: int) -> dict[str, torch.Tensor]:
        return {f"policy.{name}": value for name, value in self.member_state(k).items()}

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's (original index) policy parameters, named as a solo PPO's `policy.state_dict()` names them: the
        current ones while it trains, those it left with after it left."""
        if k in self.alive:
            params, row = self.params, self.alive.index(k)
        else:
            params, row = self._final_params, k
        layers = len(self.weights)
        state = {}
        for i in range(layers):
            state[f"body.weights.{i}"] = params[i][row].detach().clone()
            state[f"body.biases.{i}"] = params[layers + i][row].detach().clone()
        if self._member_encoder is not None:
            for i, name in enumerate(self._member_encoder.names):
                state[f"encoder.{name}"] = params[2 * layers + i][row].detach().clone()
        if self.kind == "gaussian":
            state["log_std"] = params[-1][row].detach().clone()
        return state

