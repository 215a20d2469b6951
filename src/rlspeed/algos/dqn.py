"""Deep Q-Network (Mnih et al., 2015) with Double DQN targets and an optional dueling head, all on the device.

Epsilon-greedy exploration decides per env row on the device (`torch.where` over a uniform draw). The random numbers
of a whole collection phase (`train_freq` steps of every env) are drawn at its start, in two calls, against the
epsilon of each step's place in the linear schedule, computed on the device from the host's step counter: nothing
is read back, and a collection step costs the Q-network's forward, its argmax and one `where`. Targets use Double
DQN (van Hasselt et al., 2016) unless `double_q` is off; the loss is Huber (`td_loss="mse"`: squared error),
gradients are clipped by global norm, and the target network follows the online one every
`target_update_interval` env steps, by hard copy (`tau=1`) or Polyak.

Action masks (an env's `info["action_mask"]`, `use_masking`): masked actions are never chosen. The greedy action is
the argmax of Q with masked actions at the dtype's lowest value; exploration draws uniformly among the allowed actions
(one uniform number per action, drawn ahead for the collection phase like the rest, the largest allowed one wins);
the target's argmax (or max) over next actions takes the mask stored for the next observation (`off_policy`'s
`next_masks`: for a truncated row the mask at its final observation, where the adapter gives it, else all actions).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlspeed.accel.introspect import made_as
from rlspeed.algos.base import require
from rlspeed.algos.off_policy import (
    BATCH_FIELDS,
    OffPolicyAlgorithm,
    OffPolicyConfig,
    allowed_uniform,
    copy_statistics,
    frozen_copy,
    polyak_update,
    statistics_pairs,
)
from rlspeed.algos.update import select_update
from rlspeed.device import rules, statistics_dtype
from rlspeed.diagnostics.phases import phase
from rlspeed.fused.dqn import FusedDQNUpdate, unsupported_reason
from rlspeed.fused.flat import sequential_linears
from rlspeed.nn import QNetwork, default_init_, make_adam, masked_logits, to_device

_PREPARE_FIELDS = ("actions", "rewards", "next_obs", "terminated", "discounts")  # FusedDQNUpdate.prepare's


#: DQN's TD losses of Q(s, a) and its target, by `td_loss` name (each the mean over the batch's last dimension)
TD_LOSSES = {"huber": F.smooth_l1_loss, "mse": F.mse_loss}


def scheduled_epsilon(timesteps: int, start: int, end: int, fraction: float, initial: float, final: float) -> float:
    """The exploration epsilon at env step `timesteps` of a learn call from `start` to `end`: linear from `initial`
    to `final` over `fraction` of the call, then `final` itself, as SB3's schedule gives it (initial + (final -
    initial) is not: 1.0 + (0.05 - 1.0) is 0.05000000000000004). A `fraction` of 0 is `final` from the start, one
    above 1 a line that ends past the call, as SB3's schedule. `DQN.epsilon`'s, and the first of
    `collection_epsilons`'s (a solo's and a population's collections)."""
    if fraction == 0:
        return final
    progress = (timesteps - start) / _exploration_steps(start, end, fraction)
    if progress >= 1.0:
        return final
    return initial + progress * (final - initial)


def _exploration_steps(start: int, end: int, fraction: float) -> float:
    """The env steps over which epsilon goes from initial to final: `fraction` of the learn call's steps from
    `start` to `end` (a call counted as one step at least); less than one step where `fraction` is that small
    (`collection_epsilons` holds its slope at one step)."""
    return fraction * max(end - start, 1)


def collection_epsilons(steps: int, envs: int, timesteps: int, start: int, end: int, fraction: float, initial: float,
                        final: float, device: torch.device | str) -> torch.Tensor:
    """The epsilons `[steps]` of the next `steps` collection steps from env step `timesteps`, each step advancing the
    count by `envs` (every rank's envs): `scheduled_epsilon`'s line continued step by step and held at `final`, as a
    float32 tensor for the epsilon-greedy draws made before a collection (`DQN`'s and a population's members')."""
    slope = envs * (final - initial) / _exploration_steps(start, end, fraction) if fraction else 0.0
    # (a line steeper than one step from initial to final gives the same epsilons held at final; an infinite
    # slope, from a fraction as small as 1e-300, would make the first step's NaN: 0 * inf)
    slope = max(slope, final - initial)
    return (torch.arange(steps, device=device, dtype=torch.float32).mul_(slope)
            .add_(scheduled_epsilon(timesteps, start, end, fraction, initial, final)).clamp_(min=final))


@dataclass
class DQNConfig(OffPolicyConfig):
    """DQN hyperparameters (names follow Stable-Baselines3; defaults as docs/algorithms.md's tables give them, with
    SB3's where they differ: Double-Q, orthogonal initialisation, Adam's epsilon)."""

    train_freq: int = 4
    batch_size: int = 32
    learning_starts: int = 100
    learning_rate: float = 1e-4
    tau: float = 1.0
    net_arch: tuple[int, ...] = (64, 64)
    target_update_interval: int = 10_000  # env steps between target updates
    exploration_fraction: float = 0.1  # share of the run over which epsilon decays linearly (0: final eps throughout)
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.05
    max_grad_norm: float = 10.0
    td_loss: str = "huber"  # the TD error's loss: "huber" (SB3's smooth L1) or "mse" (CleanRL's squared error)
    double_q: bool = True
    dueling: bool = False
    # hand-derived gradient + flat Adam (fused/) where the network allows; `rlspeed.algos.update.select_update`
    # decides (on CUDA: the autograd update as a whole-step graph instead; benchmarks/cuda_check.sh measures both)
    fused_update: bool = True
    use_masking: bool = True  # apply the env's action masks (info["action_mask"] or action_masks()) where it has them

    def validate(self) -> None:
        """The `OffPolicyConfig` checks, plus DQN's own: target update interval, exploration epsilons, grad norm."""
        super().validate()
        require(self.target_update_interval >= 1,
                f"target_update_interval must be >= 1, got {self.target_update_interval}.")
        # (Stable-Baselines3's meaning: 0 holds epsilon at exploration_final_eps from the start, and above 1 the
        # linear decay is longer than the learn call, which ends before epsilon reaches its final value)
        require(self.exploration_fraction >= 0, f"exploration_fraction must be >= 0 (the share of each learn call "
                f"over which epsilon decays), got {self.exploration_fraction}.")
        require(0 <= self.exploration_final_eps <= self.exploration_initial_eps <= 1,
                "exploration epsilons must satisfy 0 <= exploration_final_eps <= exploration_initial_eps <= 1.")
        require(self.max_grad_norm > 0, f"max_grad_norm must be > 0, got {self.max_grad_norm}.")
        require(self.td_loss in TD_LOSSES, f"td_loss must be one of {', '.join(TD_LOSSES)}, got {self.td_loss!r}.")


def masked_argmax(q_values: torch.Tensor, action_masks: torch.Tensor | None) -> torch.Tensor:
    """The greedy action per row (int64 `[B]`) among the allowed ones (bool `[B, n]` masks; None: all); any leading
    shape `[..., n]` alike."""
    return masked_logits(q_values, action_masks).argmax(dim=-1)


class DQN(OffPolicyAlgorithm):
    """DQN for Discrete action spaces.

    >>> import gymnasium
    >>> from rlspeed import DQN
    >>> model = DQN("CartPole-v1", seed=0).learn(50_000)
    >>> obs, _ = gymnasium.make("CartPole-v1").reset(seed=0)
    >>> action, _ = model.predict(obs, deterministic=True)
    """

    name = "dqn"
    config_cls = DQNConfig
    config: DQNConfig
    supports_continuous = False
    supports_action_masks = True
    current_metrics = ("epsilon",)  # (a metrics row's epsilon is the exploration rate at its step)

    def _setup(self) -> None:
        self._masking = False  # whether this run applies the env's action masks (decided in `_start_masking`)
        cfg, spec = self.config, self.spec
        q_network = QNetwork(spec.obs_dim, spec.action_dim, cfg.net_arch, cfg.activation, cfg.dueling,
                             encoder=self._make_encoder("q_network"))
        if not cfg.ortho_init:
            default_init_(q_network)
        self.q_network = to_device(q_network, self.device)
        self.q_target = frozen_copy(self.q_network, self, ("q_network", "q_target"))
        self.policy = self.q_network
        self._params = list(self.q_network.parameters())
        self._target_params = list(self.q_target.parameters())
        self._target_statistics = statistics_pairs((self.q_target, self.q_network))
        self._index_dtype = rules(self.device).index_dtype
        # (see `_collection_linears`)
        self._body_linears_of: torch.nn.Module | None = None
        self._body_linears: tuple[list[torch.nn.Linear], bool] | None = None
        self._draws: tuple[int, torch.Tensor, torch.Tensor] | None = None  # see _prepare_collection
        self._collect_weights: list[torch.Tensor] | None = None  # contiguous W^T copies [in, out]

    def _setup_optimizer(self) -> None:
        self.optimizer = make_adam(self._params, self.config.learning_rate, self.device, eps=self.config.adam_eps)
        self._update_step = self._make_update_step()

    def _make_update_step(self):
        """The update step (`select_update`), with the hand-derived update as the alternative where it applies."""
        cfg = self.config
        return select_update(
            self, loss_fn=self._loss, optimizer=self.optimizer, params=self._params, max_grad_norm=cfg.max_grad_norm,
            name="dqn", reference_cls=DQN, reference_methods=("_loss", "_update"),
            unsupported=unsupported_reason(self.q_network, masking=self._masking),
            hand_derived=lambda: FusedDQNUpdate(self.q_network, self.q_target, self.optimizer,
                                                max_grad_norm=cfg.max_grad_norm, double_q=cfg.double_q,
                                                td_loss=cfg.td_loss, strategy=self.strategy))

    def _modules(self):
        return {"q_network": self.q_network, "q_target": self.q_target}

    def _optimizers(self):
        return {"optimizer": self.optimizer}

    def _policy_actions(self, obs: torch.Tensor, deterministic: bool,
                        action_masks: torch.Tensor | None = None) -> torch.Tensor:
        greedy = masked_argmax(self.q_network(obs), action_masks).to(self._index_dtype)
        if deterministic:
            return greedy
        return self._epsilon_greedy(greedy, self.config.exploration_final_eps, action_masks)

    # --- exploration ------------------------------------------------------------------------------------------
    def epsilon(self, timesteps: int) -> float:
        """Linear schedule from exploration_initial_eps to exploration_final_eps over exploration_fraction of the
        current learn() call (a host float from host step counts: no device read)."""
        cfg = self.config
        if self._schedule_end is None:  # (before learn: no schedule yet, the value it starts from)
            return cfg.exploration_initial_eps
        return scheduled_epsilon(timesteps, self._learn_start, self._schedule_end, cfg.exploration_fraction,
                                 cfg.exploration_initial_eps, cfg.exploration_final_eps)

    def _epsilon_greedy(self, greedy: torch.Tensor, epsilon: float,
                        action_masks: torch.Tensor | None = None) -> torch.Tensor:
        """Per row: a uniform random (allowed) action with probability epsilon, else the greedy one (decided on the
        device)."""
        random_actions = self._random_actions(greedy.shape[0], action_masks).to(greedy.dtype)
        explore = torch.rand(greedy.shape, device=greedy.device) < epsilon
        return torch.where(explore, random_actions, greedy)

    def _greedy(self, obs, action_masks: torch.Tensor | None = None) -> torch.Tensor:
        if self._collect_weights is None:
            q_values = self.q_network(obs)
        else:  # during collection: the fixed network's addmm/activation kernels on contiguous W^T
            linears, tanh = self._body_linears
            last = len(linears) - 1
            q_values = obs.flatten(1)
            for i, (weight_t, layer) in enumerate(zip(self._collect_weights, linears)):
                q_values = torch.addmm(layer.bias, q_values, weight_t)
                if i < last:
                    q_values = q_values.tanh_() if tanh else q_values.relu_()
        return masked_argmax(q_values, action_masks).to(self._index_dtype)

    def _collection_linears(self) -> tuple[list[torch.nn.Linear], bool] | None:
        """(linear layers, tanh?) of the Q-network, for the greedy action during collection (called once per env
        step): a plain MLP on float vectors runs as its addmm/activation kernels, without the per-module call
        overhead. Only rlspeed's own `QNetwork`, and the one now in `q_network`: a subclass's network (its own
        forward), or one a subclass's `_setup` put in its place, is called as a module."""
        network = self.q_network
        if self._body_linears_of is not network:
            plain = (made_as(network) is QNetwork and not getattr(network, "dueling", True)
                     and network.encoder is None)
            self._body_linears = sequential_linears(network.body) if plain else None
            self._body_linears_of = network
        return self._body_linears

    def _prepare_collection(self, start: int) -> None:
        """Before the next `train_freq` steps of every env (from env step `start`), during which the Q-network
        does not change: its weights laid out as W^T for `_greedy` (the product x W^T then reads memory in order),
        and epsilon-greedy's random numbers: whether each (step, env) explores (a uniform draw below that step's
        epsilon) and its random action: with action masks, which are known only at the step, one uniform number per
        action instead, from which the step takes the allowed action with the largest (`allowed_uniform`)."""
        cfg, num_envs = self.config, self._env.num_envs
        if self._collection_linears() is not None:
            self._collect_weights = [layer.weight.detach().t().contiguous() for layer in self._body_linears[0]]
        # (per collection step, which advances num_timesteps by every rank's envs)
        epsilons = collection_epsilons(cfg.train_freq, self._envs_all_ranks, start, self._learn_start,
                                       self._schedule_end, cfg.exploration_fraction, cfg.exploration_initial_eps,
                                       cfg.exploration_final_eps, self.device)
        explore = torch.rand((cfg.train_freq, num_envs), device=self.device) < epsilons.unsqueeze(1)
        if self._masking:
            actions = torch.rand((cfg.train_freq, num_envs, self.spec.action_dim), device=self.device)
        else:
            actions = torch.randint(0, self.spec.action_dim, (cfg.train_freq, num_envs), device=self.device,
                                    dtype=self._index_dtype)
        self._draws = (start, explore, actions)

    def _explore(self, obs: torch.Tensor, timesteps: int, action_masks: torch.Tensor | None = None) -> torch.Tensor:
        greedy = self._greedy(obs, action_masks)
        if self._draws is not None:
            start, explore, actions = self._draws
            step = (timesteps - start) // self._envs_all_ranks
            if 0 <= step < explore.shape[0]:
                random_actions = actions[step]
                if action_masks is not None:
                    random_actions = allowed_uniform(random_actions, action_masks).to(greedy.dtype)
                return torch.where(explore[step], random_actions, greedy)
        return self._epsilon_greedy(greedy, self.epsilon(timesteps), action_masks)

    def _train_iteration(self) -> tuple[int, dict[str, torch.Tensor]]:
        before = self.num_timesteps
        global_steps = self.config.train_freq * self._envs_all_ranks  # (`steps` below: this rank's)
        if before + global_steps > self._uniform_until:
            with phase("act"):  # (before learning_starts, actions are uniform: nothing to prepare)
                self._prepare_collection(before)
        steps, metrics = super()._train_iteration()
        self._draws = self._collect_weights = None
        # Target network: every target_update_interval env steps of all envs, by copy (tau=1) or Polyak (SB3 counts
        # vector steps, every interval // n_envs of them: the same with one env, more often with several). The online
        # network is fixed during collection, so k updates due now are one with 1-(1-tau)^k.
        interval = self.config.target_update_interval
        due = (before + global_steps) // interval - before // interval
        if due > 0:
            with phase("update"):
                polyak_update(self._target_params, self._params, 1.0 - (1.0 - self.config.tau) ** due)
                copy_statistics(self._target_statistics)
        # (in the statistics dtype, float64 where the device has it: the schedule's value as metrics.csv's epsilon,
        # 0.01 and not float32's 0.009999999776482582)
        metrics["epsilon"] = torch.full((), self.epsilon(before + global_steps), device=self.device,
                                        dtype=statistics_dtype(self.device))
        return steps, metrics

    # --- one gradient step ------------------------------------------------------------------------------------
    def _prepare_batches(self, rows: dict[str, torch.Tensor]) -> dict:
        """With the hand-derived update: the target network's part of every batch of this iteration's gradient
        steps, in one pass (`FusedDQNUpdate.prepare`; the target network changes only after those steps, in
        `_train_iteration`), in the matmul precision `--accelerate auto` chose (fp32 while its search waits; the
        update's own call runs the search, and the checks of a reduced precision chosen against fp32: the batches
        in which one is due are not prepared)."""
        batches = rows["actions"].shape[0] // self.config.batch_size
        update, context = self._update_step.hand_derived, self._update_step.precision_context(batches)
        if update is None or context is None:
            return rows
        update.follow(self.config)  # (double_q as the config says now: the autograd loss reads it at each step)
        with context:
            prepared = update.prepare(*(rows[field] for field in _PREPARE_FIELDS))
        return {"obs": rows["obs"], "next_obs": rows["next_obs"], "prepared": prepared}

    def _update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "prepared" in batch:  # (in fp32 while the precision's search waits, even where it became due meanwhile)
            with self._update_step.precision_context() or contextlib.nullcontext():
                _, metrics = self._update_step.timed(self._update_step.hand_derived.step_prepared, batch["obs"],
                                                     batch["next_obs"], batch["prepared"])
        else:
            fields = BATCH_FIELDS + (("next_action_masks",) if "next_action_masks" in batch else ())
            _, metrics = self._update_step(*(batch[field] for field in fields))  # Adam step, clipped
        return metrics

    def _loss(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
              terminated: torch.Tensor, discounts: torch.Tensor, next_action_masks: torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The TD loss (`td_loss`: Huber or squared error) of one replay batch; with `next_action_masks` (bool
        `[B, n]`) the target's argmax (or max) runs over the actions allowed at the next observation only."""
        cfg = self.config
        with torch.no_grad():
            next_q_target = self.q_target(next_obs)
            if cfg.double_q:
                # Double DQN: the online network chooses a' = argmax_a Q(s', a), the target network values it.
                next_actions = masked_argmax(self.q_network(next_obs), next_action_masks).unsqueeze(1)
                next_q = next_q_target.gather(1, next_actions).squeeze(1)
            else:
                next_q = masked_logits(next_q_target, next_action_masks).max(dim=1).values
            # y = r + gamma^m (1 - d) Q_target(s', a')
            target_q = rewards + discounts * (1 - terminated) * next_q

        q_values = self.q_network(obs).gather(1, actions.long().unsqueeze(1)).squeeze(1)  # Q(s, a)
        loss = TD_LOSSES[cfg.td_loss](q_values, target_q)
        return loss, {"loss": loss.detach(), "q_values": q_values.detach().mean()}
