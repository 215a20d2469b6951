"""PPO with an LSTM policy (sb3-contrib's `RecurrentPPO`), for partially observed tasks such as CartPoleNoVel-v1.

What differs from PPO, and nothing else:

1. Rollout: every env carries an LSTM state `[4, N, H]` (actor h, c; critic h, c) from step to step on the device,
   zeroed exactly where an episode starts: a whole one (`info["done"]`), so the state goes on through a lost life
   that ends only the learner's episode (Atari's episodic life: the value bootstrap is cut there, the game and its
   memory go on, as in evaluation, whose envs play whole games). The buffer keeps the state each step started from.
2. GAE bootstraps V(final_obs) from the critic state the step produced (one batched LSTM step for the rollout).
3. Update: minibatches of `batch_size` steps made of sequences, as sb3-contrib's: each env column of the rollout is
   cut into chunks of `sequence_length` steps (the rule is that function's), shuffled per epoch, `batch_size /
   sequence_length` chunks to a minibatch, so an epoch makes rollout / batch_size gradient steps. The LSTMs are
   re-run over each chunk from the state the rollout stored at its first step (under the rollout's policy), with the
   state zeroed at episode starts inside it; the clipped PPO loss is then PPO's own (`PPO._loss` on the LSTM
   features). A `batch_size` that is a multiple of `num_steps` makes chunks of whole columns.

`predict(obs, state, episode_start)` follows Stable-Baselines3: the state is the actor's `(h, c)`, numpy arrays
`[1, N, H]`, to be passed back on the next call.
"""

from __future__ import annotations

import math
import typing
import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from rlspeed.algos.base import (
    ArrayLike,
    ObservationLike,
    acting_input,
    as_observation_batch,
    check_acting_batch,
    host_tensor,
    require,
)
from rlspeed.algos.on_policy import OnPolicyAlgorithm
from rlspeed.algos.ppo import PPO, PPOConfig, _nearest_sizes
from rlspeed.algos.update import GRAPHS
from rlspeed.buffers.recurrent import RecurrentRolloutBuffer
from rlspeed.envs import BatchedEnv
from rlspeed.envs.base import map_obs, obs_batch_size
from rlspeed.errors import UserError, true_or_false
from rlspeed.nn import RecurrentActorCritic, SequenceLayout, acting, reset_at_episode_starts
from rlspeed.policy_kwargs import LSTM_LAYOUT_RULE, SB3_CONTRIB_LSTM_LAYOUT
from rlspeed.sde import build_sde_actor_critic

#: Options of the replay-based (off-policy) algorithms, which an on-policy algorithm has no use for.
REPLAY_OPTIONS = ("buffer_size", "learning_starts", "train_freq", "gradient_steps", "tau", "target_update_interval",
                  "exploration_fraction", "exploration_initial_eps", "exploration_final_eps", "policy_delay",
                  "target_policy_noise", "target_noise_clip", "action_noise", "optimize_memory_usage")
_REPLAY_FIX = ("it is an option of the replay-based algorithms (dqn, sac, td3, ddpg); RecurrentPPO learns from "
               "rollouts of num_envs x num_steps steps: remove it, and size the rollout with num_envs and num_steps")
#: what is said of sb3-contrib's LSTM layout options (`SB3_CONTRIB_LSTM_LAYOUT`): rlspeed's RecurrentPPO has one of
#: its layouts, the default one (`build_config` takes an option at its default, `policy_kwargs.is_rlspeeds_lstm_layout`,
#: and refuses any other value with this sentence).
_LSTM_LAYOUT_FIX = (f"{LSTM_LAYOUT_RULE} (sb3-contrib's defaults "
                    f"{', '.join(f'{key}={value!r}' for key, value in SB3_CONTRIB_LSTM_LAYOUT.items())}): remove it; "
                    "lstm_hidden_size sets the LSTMs' size")
#: the fewest steps a sequence of the update holds (unless num_steps is fewer): shorter ones would train the LSTM to
#: remember almost nothing beyond the stored states
MIN_SEQUENCE_LENGTH = 8


def sequence_length(num_steps: int, batch_size: int, rollout: int) -> int:
    """The length of the sequences RecurrentPPO's update cuts each env column of `num_steps` steps into: the greatest
    common divisor of `num_steps` and `batch_size` (`num_steps` itself where batch_size is a multiple of it: whole
    columns), so that a minibatch of batch_size steps is a whole number of sequences; `num_steps` where one minibatch
    is the whole rollout (`batch_size >= rollout`)."""
    return num_steps if batch_size >= rollout else math.gcd(num_steps, batch_size)


def _long_enough(num_steps: int, batch_size: int, rollout: int) -> bool:
    """Whether `batch_size` divides the rollout into sequences of `MIN_SEQUENCE_LENGTH` steps or more (or num_steps)."""
    return (batch_size >= rollout or rollout % batch_size == 0
            and sequence_length(num_steps, batch_size, rollout) >= min(num_steps, MIN_SEQUENCE_LENGTH))


@dataclass
class RecurrentPPOConfig(PPOConfig):
    """RecurrentPPO hyperparameters: PPO's (`PPOConfig`) plus the LSTM's size. `num_steps`, `batch_size` and the LSTM's
    size default to sb3-contrib's; the others are PPO's (`num_envs=8`, `anneal_lr=True`, where sb3-contrib keeps the
    rate constant and trains on the envs it is given).

    `net_arch` is the MLP head after each LSTM (actor and critic alike). `batch_size` counts steps, as in PPO and
    sb3-contrib: a minibatch is `batch_size / L` sequences of L = `sequence_length(num_steps, batch_size, rollout)`
    steps (the gcd of the two: whole env columns where batch_size is a multiple of num_steps), L of at least
    `MIN_SEQUENCE_LENGTH` steps (or num_steps).
    """

    num_steps: int = 128
    batch_size: int = 128
    lstm_hidden_size: int = 256

    refused: ClassVar[dict[str, str]] = {**dict.fromkeys(REPLAY_OPTIONS, _REPLAY_FIX),
                                         **dict.fromkeys(SB3_CONTRIB_LSTM_LAYOUT, _LSTM_LAYOUT_FIX)}

    def validate(self) -> None:
        """PPO's checks (its batch_size rule with the sequences' one: `_check_batch_size`), plus: an LSTM state of at
        least one unit."""
        require(self.lstm_hidden_size >= 1,
                f"lstm_hidden_size must be >= 1, got {self.lstm_hidden_size}: the LSTM needs a state (64 or 256 are "
                "usual).")
        super().validate()

    def _check_batch_size(self, rollout: int, processes: int = 1) -> None:
        """PPO's rule (batch_size divides the rollout), the sequences' (at least `MIN_SEQUENCE_LENGTH` steps, or
        num_steps) and, for several `processes`, theirs (a minibatch's sequences a multiple of the number of processes)
        in one check, so that the sizes its sentence suggests pass all three."""
        def works(size: int) -> bool:  # (L depends on the size)
            return size >= rollout or (_long_enough(self.num_steps, size, rollout)
                                       and size // sequence_length(self.num_steps, size, rollout) % processes == 0)

        if works(self.batch_size):
            return
        least = min(self.num_steps, MIN_SEQUENCE_LENGTH)
        would = _nearest_sizes(self.batch_size, rollout, works)
        length = sequence_length(self.num_steps, self.batch_size, rollout)
        if rollout % self.batch_size:
            raise UserError(f"batch_size ({self.batch_size}) must divide num_envs * num_steps ({rollout}) into "
                            f"sequences of at least {least} steps for RecurrentPPO's update to train its LSTM on (a "
                            f"sequence is as long as the greatest common divisor of batch_size and num_steps "
                            f"({self.num_steps}), here {length}): {would} would do.")
        if length < least:
            raise UserError(f"batch_size ({self.batch_size}) cuts num_steps ({self.num_steps}) into sequences of "
                            f"{length} steps (their greatest common divisor), and RecurrentPPO's update needs "
                            f"sequences of at least {least} steps to train its LSTM on: {would} would do.")
        sequences = self.batch_size // length
        raise UserError(f"batch_size ({self.batch_size}) holds {sequences} sequence{'s' if sequences != 1 else ''} "
                        f"of {length} steps (the greatest common divisor of batch_size and num_steps "
                        f"({self.num_steps})), which must be a multiple of the number of processes ({processes}): each "
                        f"process takes an equal share of every minibatch's sequences ({would} would do).")


class RecurrentPPO(PPO):
    """PPO with LSTM actor and critic for Discrete, Box, MultiDiscrete and MultiBinary action spaces (action masks as
    PPO takes them).

    >>> import numpy as np
    >>> from rlspeed import RecurrentPPO, make_env
    >>> model = RecurrentPPO("CartPoleNoVel-v1", seed=0).learn(100_000)
    >>> env = make_env("CartPoleNoVel-v1", num_envs=4, seed=1)
    >>> obs, _ = env.reset()
    >>> actions, state = model.predict(obs, state=None, episode_start=np.ones(4, dtype=bool))
    >>> obs, rewards, terminated, truncated, info = env.step(actions)
    >>> actions, state = model.predict(obs, state=state, episode_start=terminated | truncated)
    """

    name = "recurrent_ppo"
    config_cls = RecurrentPPOConfig
    config: RecurrentPPOConfig

    # --- the network and its state -------------------------------------------------------------------------

    def _build_policy(self) -> RecurrentActorCritic:
        cfg, spec = self.config, self.spec
        if cfg.use_sde:
            return build_sde_actor_critic(self, recurrent=True)
        return RecurrentActorCritic(spec.obs_dim, spec.action_dim, spec.discrete, cfg.lstm_hidden_size, cfg.net_arch,
                                    cfg.activation, cfg.log_std_init,
                                    encoder=self._make_encoder("policy"),
                                    action_space=spec.action_space)

    _optimizer_attributes = ("optimizer", "_update_step", "_segmented")

    def _make_update_step(self):
        # PPO's hand-derived update is for the MLP ActorCritic: this one always trains with the autograd of `_loss`
        update = OnPolicyAlgorithm._make_update_step(self)
        # The update re-runs the LSTMs with one fused call per minibatch over its episode segments, cut where episodes
        # start (read to the host once per rollout). A whole-step graph needs fixed shapes and no host sync: there the
        # step-by-step reference runs instead.
        self._segmented = update.choice.implementation != GRAPHS
        return update

    def initial_state(self, num_envs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's (h, c) at an episode start, zeros `[1, num_envs, H]` each on the model's device."""
        zeros = self.policy.initial_state(num_envs)[:2].unsqueeze(1)
        return zeros[0], zeros[1]

    def act_with_state(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None,
                       episode_start: torch.Tensor | None, deterministic: bool = True,
                       action_masks: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Actions for raw observations `[N, ...]` (tensors) from the actor's state (h, c) `[1, N, H]` (None: an
        episode start for all), zeroed first where `episode_start` (bool `[N]`) is set; returns (actions, state).
        `action_masks` (bool `[N, n]`): a masked action is never chosen."""
        deterministic = true_or_false("deterministic", deterministic)
        check_acting_batch(obs, self.spec.observation_space, "act_with_state")
        obs = map_obs(lambda v: acting_input(v, self.device), obs)
        num = obs_batch_size(obs)
        h, c = state if state is not None else self.initial_state(num)
        h, c = h.to(self.device)[0], c.to(self.device)[0]
        if episode_start is not None:
            episode_start = torch.as_tensor(episode_start, device=self.device).bool()
        masks = action_masks.to(self.device, torch.bool) if action_masks is not None else None
        actions, h, c = self._checked_step(obs, h, c, episode_start, deterministic, masks)
        return actions, (h.unsqueeze(0), c.unsqueeze(0))

    def _checked_step(self, obs, h: torch.Tensor, c: torch.Tensor, episode_start: torch.Tensor | None,
                      deterministic: bool, action_masks: torch.Tensor | None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`act_with_state` for arguments already checked and on the model's device (what `act_with_state` and
        `predict` make of theirs): the state h, c `[N, H]`, `episode_start` bool `[N]` or None (no episode starts);
        returns (actions, h, c)."""
        if episode_start is not None:
            h, c = reset_at_episode_starts(h, episode_start), reset_at_episode_starts(c, episode_start)
        with acting(self.policy):
            if self.obs_rms is not None:
                obs = self.obs_rms.normalize(obs, self._obs_clip)
            actions, h, c = self.policy.actor_step(obs, h, c, deterministic, action_masks)
        return self._to_env(actions), h, c

    def _policy_actions(self, obs: torch.Tensor, deterministic: bool, action_masks=None) -> torch.Tensor:
        raise UserError("RecurrentPPO's actions depend on its LSTM state: use model.predict(obs, state, "
                        "episode_start) and pass the returned state back (or act_with_state with tensors).")

    @typing.overload  # type: ignore[override]  # (its state is the LSTM's (h, c), where the others' is None)
    def predict(self, observation: torch.Tensor | typing.Mapping[str, torch.Tensor],
                state: tuple[torch.Tensor, torch.Tensor] | None = None,
                episode_start: torch.Tensor | ArrayLike | None = None, deterministic: bool = True,
                action_masks: ArrayLike | torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]: ...

    @typing.overload
    def predict(self, observation: ObservationLike,
                state: tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor] | None = None,
                episode_start: torch.Tensor | ArrayLike | None = None, deterministic: bool = True,
                action_masks: ArrayLike | torch.Tensor | None = None,
                ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]: ...

    def predict(self, observation: ObservationLike,  # type: ignore[override]
                state: tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor] | None = None,
                episode_start: torch.Tensor | ArrayLike | None = None, deterministic: bool = True,
                action_masks: ArrayLike | torch.Tensor | None = None,
                ) -> tuple[np.ndarray | torch.Tensor, tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]]:
        """SB3-style: (actions, state) for a batch of N observations (or one), numpy in and out (tensors in give
        tensors out). `state` is the previous call's (None at the start: zeros); `episode_start` (bool `[N]`) zeroes
        the state of envs whose observation starts an episode (None: none does); `action_masks` as `Algorithm.predict`
        takes them."""
        deterministic = true_or_false("predict(deterministic=...)", deterministic)
        obs, as_numpy, single = as_observation_batch(observation, self.spec.observation_space, self.device,
                                                     self.spec.observation_layout)
        num = obs_batch_size(obs)
        masks = self._check_masks(action_masks, num)
        if state is not None:
            h, c = self._check_state(state, num, as_numpy)
        else:
            h, c = self.initial_state(num)
            h, c = h[0], c[0]
        if episode_start is not None:
            episode_start = self._check_episode_start(episode_start, num)
        actions, h, c = self._checked_step(obs, h, c, episode_start, deterministic, masks)
        if as_numpy:  # (the state's layer dimension added in numpy: a view, no torch call)
            return self._host_actions(actions, single), (h.cpu().numpy()[None], c.cpu().numpy()[None])  # ok-sync
        return (actions[0] if single else actions), (h.unsqueeze(0), c.unsqueeze(0))

    def _check_episode_start(self, episode_start, num: int) -> torch.Tensor | None:
        """`predict`'s episode starts as a bool tensor `[num]` on the model's device; None where numpy flags start no
        episode (the state then goes on as it is: the reset multiplies it by 1); UserError for anything but one flag
        (bool or 0/1) per observation."""
        flags = episode_start if isinstance(episode_start, torch.Tensor) else np.asarray(episode_start)
        if isinstance(flags, np.ndarray):
            if flags.dtype.kind not in "biuf":  # (strings, objects: no flags)
                raise UserError(f"predict(episode_start=...) takes one flag (bool or 0/1) per observation, got "
                                f"{episode_start!r}"[:160] + ".")
            flags = flags.reshape(-1)
            if flags.dtype != np.bool_ and bool(((flags != 0) & (flags != 1)).any()):
                # (0.5, 2, -1 or NaN: their truth value would reset the state, without a word)
                raise UserError(f"predict(episode_start=...) takes one flag (bool or 0/1) per observation, got "
                                f"{flags.tolist()!r}"[:160] + ".")
            if flags.size != num:
                raise UserError(f"predict(episode_start=...) has {flags.size} entries for {num} "
                                f"observation{'s' if num != 1 else ''}: give one flag per observation.")
            return torch.as_tensor(flags, device=self.device).bool() if flags.any() else None
        # (on the model's device: as_tensor alone makes it on the caller's default device, or moves a tensor there)
        flags = torch.as_tensor(flags, device=self.device).reshape(-1)
        if flags.dtype != torch.bool and bool(((flags != 0) & (flags != 1)).any()):
            raise UserError(f"predict(episode_start=...) takes one flag (bool or 0/1) per observation, got "
                            f"{flags.tolist()!r}"[:160] + ".")
        if flags.numel() != num:
            raise UserError(f"predict(episode_start=...) has {flags.numel()} entries for {num} "
                            f"observation{'s' if num != 1 else ''}: give one flag per observation.")
        return flags.bool()

    def _check_state(self, state, num: int, as_numpy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """`predict`'s state (h, c), each `[1, num, lstm_hidden_size]`, as float tensors `[num, lstm_hidden_size]`
        on the model's device; UserError for anything else (sb3-contrib's states of several LSTM layers included:
        rlspeed's LSTM has one). Numpy states stay numpy until checked: only their one layer becomes a tensor."""
        expected = (1, num, self.config.lstm_hidden_size)
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise UserError(f"predict(state=...) takes the (h, c) pair the previous call returned, each of shape "
                            f"{list(expected)}; got {type(state).__name__}"
                            f"{f' of {len(state)} items' if isinstance(state, (tuple, list)) else ''}.")
        try:
            if as_numpy:
                parts = tuple(np.asarray(s) for s in state)
                if any(part.dtype.kind not in "biuf" for part in parts):  # (None, strings: no numbers)
                    raise TypeError
                parts = tuple(part if part.dtype == np.float32 else part.astype(np.float32) for part in parts)
            else:
                parts = tuple(torch.as_tensor(s, dtype=torch.float32, device=self.device) for s in state)
        except (TypeError, ValueError, RuntimeError):  # ((None, None), strings: no numbers)
            got = ", ".join(type(part).__name__ for part in state)
            raise UserError(f"predict(state=...) takes the (h, c) pair the previous call returned, each of shape "
                            f"{list(expected)} of numbers; got ({got}).") from None
        for name, part in zip("hc", parts):
            if tuple(part.shape) != expected:
                raise UserError(f"predict(state=...)'s {name} has shape {list(part.shape)}, and this model needs "
                                f"{list(expected)} (one LSTM layer, {num} observation{'s' if num != 1 else ''}, "
                                f"lstm_hidden_size {self.config.lstm_hidden_size}): pass back the state the previous "
                                "call returned for the same observations, or None at the start.")
        if as_numpy:
            return host_tensor(parts[0][0], self.device), host_tensor(parts[1][0], self.device)
        return parts[0][0], parts[1][0]

    # --- rollout ----------------------------------------------------------------------------------------------
    def _stores_next_obs(self) -> bool:
        """The recurrent rollout keeps each step's next observation, whatever the observations."""
        return True

    def _rollout_step_bytes(self) -> int:
        """`OnPolicyAlgorithm._rollout_step_bytes` and the LSTM states (`RecurrentRolloutBuffer.state_step_bytes`),
        which the envs' memory check and a population's estimate count."""
        state_numel = self.policy.initial_state(1).numel()
        return super()._rollout_step_bytes() + RecurrentRolloutBuffer.state_step_bytes(state_numel)

    def _start(self, env: BatchedEnv, total_timesteps: int) -> None:
        if self._continues_episodes(env):  # (the LSTM state and episode starts go on with the episodes)
            return
        action_shape, action_dtype = self._action_storage()
        self._state = self.policy.initial_state(env.num_envs)
        self._obs = self._first_obs(env)  # (after `resume`: where the checkpoint's run was; masks in _action_mask)
        self.buffer = RecurrentRolloutBuffer(self.config.num_steps, env.num_envs, self.spec.observation_space,
                                             action_shape, action_dtype, self.device, tuple(self._state.shape),
                                             mask_size=self._start_masking())
        self._episode_start = torch.ones(env.num_envs, dtype=torch.bool, device=self.device)

    def _algorithm_state(self):
        tensors, values = super()._algorithm_state()
        # the LSTM state each env carries into its next step, and which envs start an episode there (none before learn
        # made the envs: a model saved untrained)
        if getattr(self, "_state", None) is not None:
            tensors.update(lstm_state=self._state, episode_start=self._episode_start)
        return tensors, values

    def _load_algorithm_state(self, tensors: dict[str, torch.Tensor], values: dict) -> None:
        # The saved LSTM state belongs to the saved episodes: it goes on where they go on (`_first_obs` restored the
        # envs), else every env starts from zeros at an episode start, as `_start` left it. Fresh episodes are
        # already said (`_first_obs`); a state that cannot apply is said here.
        super()._load_algorithm_state(tensors, values)
        state, starts = tensors.get("lstm_state"), tensors.get("episode_start")
        if state is not None and tuple(state.shape) != tuple(self._state.shape):
            saved = f"{state.shape[1]} envs" if state.dim() == 3 else f"shape {tuple(state.shape)}"
            warnings.warn(f"The checkpoint's LSTM state is for {saved} and this run has {self._state.shape[1]} envs: "
                          "every env's LSTM state starts from zeros, at an episode start.", stacklevel=4)
        elif self._episodes_restored:
            if state is None or starts is None:
                warnings.warn("The checkpoint holds no LSTM state (an older rlspeed wrote it): the restored episodes "
                              "go on with every env's LSTM state starting from zeros.", stacklevel=4)
            else:
                self._state.copy_(state)
                self._episode_start = starts.to(self.device, torch.bool).clone()

    def _on_env_reset(self) -> None:
        self._episode_start = torch.ones_like(self._episode_start)  # every env starts a fresh episode
        # (zeroed outright: the episode-start reset multiplies, and a state a diverged update made NaN stays NaN)
        self._state = torch.zeros_like(self._state)

    def _act(self, obs: torch.Tensor, step: int,
             action_masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # the state is zeroed exactly where this observation starts an episode, and carried over everywhere else
        state = reset_at_episode_starts(self._state, self._episode_start)
        self._resample_noise(step)
        actions, log_probs, values, next_state = self.policy.act_step(obs, state, action_masks=action_masks)
        self.buffer.add_state(step, state, next_state, self._episode_start)
        self._state = next_state
        return actions, log_probs, values

    def _on_dones(self, dones: torch.Tensor) -> None:
        self._episode_start = dones

    def _next_values(self, buf: RecurrentRolloutBuffer) -> torch.Tensor:
        # V(final_obs[t]) continues from the critic state step t produced: one LSTM step over all T * N rows
        states = buf.next_states.transpose(0, 1).flatten(1, 2)  # [T, 4, N, H] -> [4, T * N, H]
        return self.policy.value_step(map_obs(lambda v: v.flatten(0, 1), buf.next_obs), states).view_as(buf.values)

    # --- update -----------------------------------------------------------------------------------------------
    def _update_epochs(self, buf: RecurrentRolloutBuffer, advantages: torch.Tensor, returns: torch.Tensor,
                       clip_range: float) -> torch.Tensor:
        """n_epochs of clipped-objective updates over minibatches of sequences (chunks of `sequence_length` steps of
        the env columns); returns the mean [policy loss, value loss, entropy, approx_kl, clipfrac] of the updates."""
        cfg = self.config
        num_envs, num_steps = buf.num_envs, buf.num_steps
        length = sequence_length(cfg.num_steps, cfg.batch_size, cfg.num_envs * cfg.num_steps)
        # chunk j is steps [k * length, (k + 1) * length) of env column n, for k, n = divmod(j, num_envs): with
        # whole columns (k = 0) chunk j is column j
        num_chunks = num_steps // length * num_envs
        # Data-parallel: each rank holds 1/world of the envs, so its minibatches hold 1/world of the chunks.
        chunks = min(max(cfg.batch_size // length // self.strategy.world_size, 1), num_chunks)
        segmented = self._segmented  # (see `_make_update_step`)
        # (where the chunk indices are made: on the host for the segmented path, on the device for the graphed one)
        offsets = torch.arange(length, device="cpu" if segmented else self.device).view(-1, 1)
        episode_starts = buf.episode_starts.cpu() if segmented else None  # ok-sync: once per rollout, not per step
        whole = SequenceLayout(episode_starts, self.device) if segmented and chunks == num_chunks else None
        clip = torch.full((), clip_range, device=self.device)
        stats = torch.zeros(5, device=self.device)
        updates = 0
        stopped = False
        for epoch in range(cfg.n_epochs):
            if cfg.target_kl is not None:  # (the statistics of the last epoch that ran)
                stats.zero_()
                updates = 0
            # one minibatch holding every column needs no shuffle: its gradient does not depend on the order; the
            # segmented path cuts sequences on the host (`SequenceLayout`), the graphed one keeps indices on the device
            order = (None if chunks == num_chunks else torch.randperm(num_chunks, device="cpu") if segmented
                     else torch.randperm(num_chunks, device=self.device))
            for start in range(0, num_chunks - chunks + 1, chunks):
                if order is None:
                    steps, columns, layout = slice(None), slice(None), whole
                else:
                    index = order[start:start + chunks]
                    # [length, chunks] each: the step and the column of every step of the minibatch's chunks
                    steps = (index // num_envs * length).view(1, -1) + offsets
                    columns = (index % num_envs).view(1, -1).expand_as(steps)
                    layout = None
                    if segmented:
                        layout = SequenceLayout(episode_starts[steps, columns], self.device)
                        # (host copies of an index: no wait for the device)
                        steps, columns = steps.to(self.device), columns.to(self.device)
                # float vectors as [T, B, D]; other observations in their stored layout (the encoder runs in the loss)
                obs = (buf.obs[steps, columns].flatten(2) if self.policy.obs_encoder is None
                       else map_obs(lambda v: v[steps, columns], buf.obs))  # noqa: B023 (used within this iteration)
                masks = () if buf.action_masks is None else (buf.action_masks[steps, columns].flatten(0, 1),)
                # the state the rollout stored at each chunk's first step [4, B, H]
                state = (buf.states[0] if order is None
                         else buf.states[steps[0], :, columns[0]].transpose(0, 1).contiguous())
                _, minibatch_stats = self._update_step(
                    obs, state, buf.episode_starts[steps, columns], layout,
                    buf.actions[steps, columns].flatten(0, 1), buf.log_probs[steps, columns].flatten(),
                    buf.values[steps, columns].flatten(), advantages[steps, columns].flatten(),
                    returns[steps, columns].flatten(), clip, *masks)
                self._n_updates += 1
                if epoch == cfg.n_epochs - 1 or cfg.target_kl is not None:  # the last epoch's, as PPO logs them
                    stats += minibatch_stats
                    updates += 1
                if cfg.target_kl is not None and self._kl_exceeded(minibatch_stats):
                    stopped = True
                    break
            if stopped:
                break
        return stats / max(updates, 1)

    def _loss(self, obs, state, episode_starts, layout, actions, old_log_probs, old_values, advantages, returns,
              clip_range, action_masks=None):
        """PPO's loss of a minibatch of sequences: obs `[T, B, D]`, the state stored at t = 0 `[4, B, H]`, episode
        starts `[T, B]` and their `SequenceLayout` (None: the step-by-step reference), the other fields `[T * B]`."""
        features = self.policy.sequence_features(obs, state, episode_starts, layout)
        return super()._loss(features, actions, old_log_probs, old_values, advantages, returns, clip_range,
                             action_masks)
