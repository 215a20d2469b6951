"""What DQN, SAC, TD3 and DDPG share: the replay buffer, the collect-then-update loop and target-network updates.

One iteration of `_train_iteration` is `train_freq` steps of all `num_envs` envs (uniform random actions, drawn on
the device, until `learning_starts` env steps, unless `_policy_at_warmup`), their transitions stored together after
the last step (`ReplayBuffer.extend`: the same rows as one `add` per step), followed by `gradient_steps` updates on
uniform batches. Everything stays on the device: episode returns and losses are summed as device tensors and read by the
base once per log interval. An algorithm file provides its networks (`_setup`), its exploration (`_explore`) and one
gradient step (`_update`).

Actions are stored as the policy produces them: indices for Discrete spaces; for Box spaces, values in [-1, 1] that
`_to_env` rescales to the space's bounds (so the networks never see the env's units).

Action masks (DQN, `_start_masking`): the mask valid for each observation (`info["action_mask"]`, from the reset or
the step that returned it) goes to the random and exploring choices, and the buffer stores the mask of each
transition's next observation (`next_masks`: for rows whose episode ended, the mask at `final_obs` where the adapter
gives it, else all actions).

Replay layout: frame-stacked Atari observations (`rlspeed.envs.atari.stacked_frames`) go to a
`FrameStackReplayBuffer`, which stores each frame once (about an eighth of the dense layout's bytes), other uint8 or
bool images to a `SharedObservationReplayBuffer`, which stores each observation once (about 5/8) where storing them
twice would take 1 GiB or more, unless `frame_dedup` is off; `report()` and `replay_summary()` say which layout runs
and its bytes per transition.
"""

from __future__ import annotations

import copy
import os
import secrets
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from rlspeed.algos.base import Algorithm, require, success_totals, validate_network, validate_normalization_clips
from rlspeed.buffers import (
    FrameStackReplayBuffer,
    HerReplayBuffer,
    ReplayBuffer,
    SharedObservationReplayBuffer,
    frame_stacks,
    image_space,
)
from rlspeed.buffers.her import GOAL_STRATEGIES, env_compute_reward, goal_space_problem, has_compute_reward
from rlspeed.buffers.replay import layout_nbytes, refuse_unless_fits
from rlspeed.checkpoint import REPLAY_SUFFIX as REPLAY_SUFFIX  # (the replay file's name, where it was defined before)
from rlspeed.checkpoint import beside, load_checkpoint, load_paired, replay_path, save_checkpoint, staged_path
from rlspeed.device import rules, training_threads
from rlspeed.diagnostics.phases import phase
from rlspeed.envs import BatchedEnv
from rlspeed.envs.atari import stacked_frames
from rlspeed.envs.base import check_steps_held, find_wrapper, integer_range, observation_layout
from rlspeed.envs.wrappers import NormalizeObservation, NormalizeReward
from rlspeed.errors import UserError, true_or_false, warn_at_caller
from rlspeed.nn import (
    CNN_KINDS,
    ENCODERS,
    OWN_ENCODER,
    QEnsemble,
    acting_mode,
    default_init_,
    mode_dependent,
    to_device,
)

#: The fields of a replay batch, in the order the algorithms' loss functions take them.
BATCH_FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "discounts")
#: The settings learn makes the replay buffer with (its rows' discounts and n-step returns, capacity and layout): a
#: further learn, which keeps the buffer, refuses another value set on `model.config` (`_check_buffer_settings`)
_BUFFER_KEYS = ("gamma", "n_step", "buffer_size", "her", "n_sampled_goal", "goal_selection_strategy", "frame_dedup",
                "use_masking")  # (use_masking: of the algorithms that take masks)

#: What the rows of a replay file rlspeed writes hold (its `replay_buffer.contents`): the env's own observations and
#: rewards, which `normalize_obs` and `normalize_reward` normalise per sampled batch. Files written before it was
#: recorded have no `contents` (`_replay_contents_problem`).
RAW_CONTENTS = {"observations": "raw", "rewards": "raw"}
#: the config flag that normalises each kind of row per batch
_NORMALISED_BY = {"observations": "normalize_obs", "rewards": "normalize_reward"}

#: What a resume whose replay buffer is not restored says of it (`_load_replay`)
_REFILLS = "the replay buffer refills from empty and updates wait for learning_starts new transitions"
_SAMPLE_ROWS = 2**16  # replay rows gathered at once for several gradient steps
#: The most env steps of every env (`train_freq`) and updates (`gradient_steps`) one iteration takes that
#: `OffPolicyConfig.validate` accepts: learn runs whole iterations, so a count no iteration could finish is refused
#: in one sentence, not run silently (PPO's `MAX_EPOCHS` is the same kind of bound)
MAX_TRAIN_FREQ = 1_000_000
MAX_GRADIENT_STEPS = 1_000_000
_STAGE_BYTES = 2**26  # most memory an iteration's transitions may take while they wait to be stored together
# Images that are not frame stacks are stored once per transition (SharedObservationReplayBuffer) where storing them
# twice would take this much: its step-by-step bookkeeping costs each env step more than the dense layout's staged
# writes (DQN on MinAtar: benchmarks/replay_layouts.py), which only memory this large outweighs.
_SHARED_OBSERVATIONS_BYTES = 2**30



@dataclass
class OffPolicyConfig:
    """Hyperparameters every off-policy algorithm has (names follow Stable-Baselines3)."""

    num_envs: int = 1
    train_freq: int = 1  # env steps of every env per iteration, before the gradient steps
    gradient_steps: int = 1  # updates per iteration; -1: one per env step collected (train_freq * num_envs)
    batch_size: int = 256
    learning_starts: int = 100  # env steps of uniform random actions (and no updates) at the start
    buffer_size: int = 1_000_000
    learning_rate: float = 3e-4
    adam_eps: float = 1e-5  # Adam's epsilon (SB3's off-policy algorithms: torch's default, 1e-8)
    anneal_lr: bool = False  # linear decay of the learning rate to 0 over total_timesteps (SB3 and RL-Zoo's lin_X)
    tau: float = 0.005  # Polyak coefficient of the target networks (1.0: hard copy)
    gamma: float = 0.99
    n_step: int = 1  # n-step returns in the replay buffer
    net_arch: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    #: orthogonal initialisation of the networks' layers (gain sqrt(2) on hidden layers); False keeps PyTorch's
    #: default initialisation, which SB3's off-policy algorithms use
    ortho_init: bool = True
    encoder: str = "auto"  # observations -> features: auto (from the space), mlp or cnn (`rlspeed.nn.make_encoder`)
    cnn_features_dim: int = 512  # output width of the CNN encoders (SB3's features_dim)
    #: the CNN encoders' architecture (`rlspeed.nn.CNNEncoder`): auto (Nature-DQN's from 36 pixels a side, strided
    #: 3x3 from 16, small 3x3 below), nature, strided, small, or nature_or_small (the rule of files saved without it)
    cnn: str = "auto"
    normalize_images: bool = True  # uint8 images scaled to [0, 1] on the device
    #: running mean/std normalisation of float vector observations (SB3's VecNormalize norm_obs): the replay stores
    #: the env's own observations and normalises each batch with the statistics of sampling time, as SB3's does
    normalize_obs: bool = False
    #: rewards divided by the running std of the discounted return, clipped at 10 (SB3's VecNormalize norm_reward):
    #: the replay stores the env's own rewards (n-step returns: their discounted sums) and scales each batch's with
    #: the statistics of sampling time, as SB3's does; metrics and evaluation report the env's own returns
    normalize_reward: bool = False
    #: normalised observations are clipped to [-normalize_obs_clip, normalize_obs_clip] (SB3's VecNormalize clip_obs)
    normalize_obs_clip: float = 10.0
    #: normalised rewards are clipped to [-normalize_reward_clip, normalize_reward_clip] (VecNormalize's clip_reward)
    normalize_reward_clip: float = 10.0
    # frame-stacked Atari observations: the replay stores each frame once (FrameStackReplayBuffer), other uint8 or bool
    # images each observation once where their replay takes 1 GiB or more (SharedObservationReplayBuffer); off:
    # observation and next observation whole
    frame_dedup: bool = True
    #: Atari games' training envs (`rlspeed.envs.atari.AtariTraining`): a lost life ends the learner's episode, and
    #: rewards are clipped to their sign; False leaves either out (whole games; raw scores)
    episodic_life: bool = True
    clip_rewards: bool = True
    #: Hindsight Experience Replay for goal-conditioned envs (Dict observations with achieved_goal and desired_goal,
    #: and compute_reward): SB3's HerReplayBuffer, `rlspeed.buffers.her`
    her: bool = False
    n_sampled_goal: int = 4  # relabelled goals per real one (her: n / (n + 1) of the samples relabelled)
    goal_selection_strategy: str = "future"  # future, final or episode

    def validate(self) -> None:
        """Raise UserError, naming the hyperparameter, for a value out of range (`build_config` calls it)."""
        require(self.num_envs >= 1, f"num_envs must be >= 1, got {self.num_envs}.")
        require(1 <= self.train_freq <= MAX_TRAIN_FREQ, f"train_freq must be from 1 to {MAX_TRAIN_FREQ:,} (env steps "
                f"of every env between updates; Stable-Baselines3's default is 1), got {self.train_freq:,}.")
        require(1 <= self.gradient_steps <= MAX_GRADIENT_STEPS or self.gradient_steps == -1,
                f"gradient_steps must be from 1 to {MAX_GRADIENT_STEPS:,} (updates per iteration), or -1 for one per "
                f"env step, got {self.gradient_steps:,}.")
        require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}.")
        require(self.learning_starts >= 0, f"learning_starts must be >= 0, got {self.learning_starts}.")
        require(self.buffer_size >= self.num_envs,
                f"buffer_size ({self.buffer_size}) must be at least num_envs ({self.num_envs}).")
        require(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}.")
        require(self.adam_eps > 0, f"adam_eps must be > 0, got {self.adam_eps}.")
        require(0 < self.tau <= 1, f"tau must be in (0, 1], got {self.tau}.")
        require(0 <= self.gamma <= 1, f"gamma must be in [0, 1], got {self.gamma}.")
        require(self.n_step >= 1, f"n_step must be >= 1, got {self.n_step}.")
        validate_network(self)
        require(self.encoder in ENCODERS, f"encoder must be one of {', '.join(ENCODERS)}, got '{self.encoder}': "
                f"{OWN_ENCODER}.")
        require(self.cnn_features_dim >= 1, f"cnn_features_dim must be >= 1, got {self.cnn_features_dim}.")
        require(self.cnn in CNN_KINDS, f"cnn must be one of {', '.join(CNN_KINDS)}, got '{self.cnn}'.")
        require(self.n_sampled_goal >= 0, f"n_sampled_goal must be >= 0, got {self.n_sampled_goal}.")
        require(self.goal_selection_strategy in GOAL_STRATEGIES, f"goal_selection_strategy must be one of "
                f"{', '.join(GOAL_STRATEGIES)}, got '{self.goal_selection_strategy}'.")
        require(not (self.her and self.n_step > 1), f"her relabels one-step transitions (as SB3's HerReplayBuffer), "
                f"and n_step is {self.n_step}: leave one of them out.")
        validate_normalization_clips(self)


def no_update_reason(cfg: OffPolicyConfig, stored: int, each_env: int, empty: bool) -> str | None:
    """Why a learn call runs no gradient update, one sentence (None where it runs some): `stored` env steps in its
    replay buffer by its end, counted since the buffer started (all envs, whole iterations), `each_env` steps of each
    env in this call, `empty` where the buffer holds no transition at its start. Updates start once past
    `learning_starts` stored steps with a transition in the buffer; an n-step transition is stored once the n_step
    steps after it are taken (an env's first one after n_step steps, whether or not its episode ended before)."""
    if stored <= cfg.learning_starts:
        return (f"learning_starts ({cfg.learning_starts:,}) is not below the env steps this learn call stores "
                f"({stored:,}): no gradient update will run; lower learning_starts or train longer.")
    if empty and each_env < cfg.n_step:
        return (f"n_step ({cfg.n_step:,}) is above the steps each env takes in this learn call ({each_env:,}): a "
                "transition is stored once the n_step steps after it are taken, so the replay buffer stays empty and "
                "no gradient update will run; lower n_step or train longer.")
    return None


def _share_restored(processes: int | None, transitions: int) -> str:
    """What a resume restored from a replay buffer filled by other envs than its run steps, by the `processes` count
    its file records (`_save_replay`): a run in several processes saved process 0's envs alone (an older rlspeed took
    save_replay_buffer under torch.distributed); one process saved the whole run's, only its num_envs was other (no
    warning then); files of an older rlspeed record no count (None), so both causes are named."""
    if processes is None:
        return (f"its {transitions:,} transitions are restored, the whole run's where it ran with other num_envs in "
                "one process, process 0's envs' alone where it ran in several processes (saved by an older rlspeed)")
    return (f"process 0's envs of a run in {processes} processes filled it, so their {transitions:,} transitions are "
            "restored, not the whole run's")


def _stack(values: tuple) -> torch.Tensor | dict[str, torch.Tensor]:
    """torch.stack of per-step tensors, per key for Dict observations."""
    if isinstance(values[0], dict):
        return {key: torch.stack([value[key] for value in values]) for key in values[0]}
    return torch.stack(values)


def allowed_uniform(uniform: torch.Tensor, action_masks: torch.Tensor) -> torch.Tensor:
    """Per row, a uniformly random allowed action (int64 `[N]`) from uniform draws `[N, n]` (one per action, drawn
    ahead of time if need be) and bool masks `[N, n]` (or any leading shape `[..., n]`): the allowed action with the
    largest draw (ties have probability 0). Two kernels, no host read; a row needs one allowed action (the env
    adapters check it)."""
    return torch.where(action_masks, uniform, -1.0).argmax(dim=-1)


def next_masks(info: dict, ended: torch.Tensor) -> torch.Tensor:
    """The actions allowed at each transition's next observation (`final_obs`), bool `[N, n]`. After an autoreset
    `info["action_mask"]` is the new episode's first mask; the mask at `final_obs` is `info["final_action_mask"]`
    where the adapter gives it (Gymnasium's for `info["action_mask"]` envs). Without it, rows whose episode ended
    (`ended`) allow all actions: a terminated row does not bootstrap (its mask is never used), and a truncated one
    then bootstraps from a max over all actions, as an unmasked run does."""
    final = info.get("final_action_mask")
    return final if final is not None else info["action_mask"] | ended.unsqueeze(1)


def polyak_update(target_params: list[torch.Tensor], online_params: list[torch.Tensor], tau: float) -> None:
    """theta_target <- tau * theta + (1 - tau) * theta_target for every parameter, in one fused call.

    `tau == 1` copies exactly (a lerp with weight 1 can be off by a rounding error).
    """
    with torch.no_grad():
        if tau == 1.0:
            torch._foreach_copy_(target_params, online_params)
        else:
            torch._foreach_lerp_(target_params, online_params, tau)


def statistics_pairs(*pairs: tuple[torch.nn.Module, torch.nn.Module]) -> tuple[list, list]:
    """(target buffers, online buffers) of (target, online) network pairs whose networks hold a mode-dependent layer
    of the user's (`mode_dependent`: BatchNorm's running statistics): every target update copies them whole, as
    Stable-Baselines3 does (Polyak averaging is for parameters; a target in eval mode normalises with these). Empty
    lists for rlspeed's own networks."""
    targets, online = [], []
    for target, network in pairs:
        if mode_dependent(network):
            targets += list(target.buffers())
            online += list(network.buffers())
    return targets, online


def copy_statistics(statistics: tuple[list, list]) -> None:
    """`statistics_pairs`' target buffers set to their online networks' (nothing where there are none)."""
    if statistics[0]:
        with torch.no_grad():
            torch._foreach_copy_(*statistics)


def frozen_copy(module: torch.nn.Module, owner=None, names: tuple[str, str] | None = None) -> torch.nn.Module:
    """A target network: a deep copy of `module` that takes no gradients. Given the model that holds both (`owner`)
    and their attribute names (`names`: online, target), the target also takes a copy of whatever is loaded into the
    online network later (`model.policy.load_state_dict(pretrained)`: Stable-Baselines3's policy holds both networks
    and loads both; without it the target would bootstrap from its initial weights until its next update). A
    checkpoint loads the target after its network, so the target it saved is the one kept."""
    target = copy.deepcopy(module).requires_grad_(False)
    if mode_dependent(target):  # (a user's Dropout or BatchNorm: targets compute in eval mode, as SB3's do)
        target.eval()
    if owner is not None and names is not None:
        module.register_load_state_dict_post_hook(_TargetFollower(owner, *names))
    return target


class _TargetFollower:
    """`frozen_copy`'s load hook: after `load_state_dict` into the model's online network (`owner.<online>`), the same
    state goes into its target (`owner.<target>`), key by key where both have it. It holds the model weakly and acts
    on the model's own network only; a deep copy or pickle of the model gets one for the copy (`_own_modules`), a copy
    or pickle of the network alone an inert one."""

    def __init__(self, owner, online: str, target: str):
        self._owner = weakref.ref(owner) if owner is not None else None
        self._names = (online, target)

    def __call__(self, module: torch.nn.Module, incompatible_keys) -> None:
        owner = self._owner() if self._owner is not None else None
        if owner is None or module is not getattr(owner, self._names[0], None):
            return
        target = getattr(owner, self._names[1], None)
        if not isinstance(target, torch.nn.Module):
            return
        held = target.state_dict()
        with torch.no_grad():
            for name, value in module.state_dict().items():
                if name in held and held[name].shape == value.shape:
                    held[name].copy_(value)

    def __deepcopy__(self, memo) -> _TargetFollower:
        # (a deep copy of the model registers the copy in `memo` before it copies the networks)
        owner = self._owner() if self._owner is not None else None
        return _TargetFollower(memo.get(id(owner)) if owner is not None else None, *self._names)

    def __reduce__(self):
        return _TargetFollower, (None, *self._names)


def action_scaling(box: gym.spaces.Box, device: torch.device, who: str) -> tuple[torch.Tensor, ...] | None:
    """(center, half_range, low, high) of a bounded Box as float32 tensors on `device`, for actions in [-1, 1] mapped
    to center + half_range * a and clamped to [low, high]; computed in float64 (float32's (high - low) overflows for
    bounds near its largest number), UserError where the half range is beyond float32's numbers. low and high are
    None where the mapping cannot leave the bounds (it rises with a, so its values at -1 and 1 decide): no clamp
    then, in a step that runs once per env step."""
    low, high = np.asarray(box.low, dtype=np.float64), np.asarray(box.high, dtype=np.float64)
    center, half_range = high / 2 + low / 2, high / 2 - low / 2
    with np.errstate(over="ignore"):
        values = [part.astype(np.float32) for part in (center, half_range, low, high)]
    if not all(np.isfinite(part).all() for part in values):
        raise UserError(f"{who}: the action bounds (low {box.low}, high {box.high}) are beyond float32's numbers, in "
                        "which the actor's actions are rescaled; give the env narrower bounds (e.g. "
                        "gymnasium.wrappers.RescaleAction).")
    center, half_range, low, high = (torch.as_tensor(part, device=device) for part in values)
    ends = torch.addcmul(center, half_range, torch.tensor([[-1.0], [1.0]], device=device))
    if bool((ends[0] >= low).all() and (ends[1] <= high).all()):  # ok-sync: once, when the model is built
        return center, half_range, None, None
    return center, half_range, low, high


def clamped(actions: torch.Tensor, low: torch.Tensor | None, high: torch.Tensor | None) -> torch.Tensor:
    """`actions` clamped in place to [low, high] (`action_scaling`'s bounds; None: nothing to clamp)."""
    return actions if low is None else actions.clamp_(low, high)


class OffPolicyAlgorithm(Algorithm):
    """Base of the replay-buffer algorithms. Subclasses provide `_setup`, `_explore`, `_update`, `_modules`."""

    keeps_replay_buffer = True

    config: OffPolicyConfig
    #: explore with the policy (`_explore`) before learning_starts too, instead of uniform random actions (SAC's
    #: use_sde_at_warmup)
    _policy_at_warmup: bool = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # (the on-policy algorithms' hook, never called here, unless the subclass's own _setup calls it)
        if "_make_optimizer" in cls.__dict__ and cls._setup.__module__.startswith("rlspeed."):
            raise TypeError(f"{cls.__name__}._make_optimizer would never be called: the replay-buffer algorithms make "
                            "their optimizer in _setup; override _setup, set self.optimizer and remake "
                            "self._update_step (CONTRIBUTING.md).")

    @property
    def steps_per_iteration(self) -> int:
        """Env steps of one collection (`train_freq` steps of all `num_envs` envs), over all processes: `learn`
        trains whole collections."""
        return int(self.config.num_envs * self.config.train_freq)

    # --- what an algorithm provides -----------------------------------------------------------------------------
    def _explore(self, obs: torch.Tensor, timesteps: int, action_masks: torch.Tensor | None = None) -> torch.Tensor:
        """Exploration actions (policy space: indices, or values in [-1, 1]) for observations `[N, ...]`.

        `timesteps` is the env step count at this step (host integer), for schedules such as DQN's epsilon;
        `action_masks` (bool `[N, n]`, given only when `_start_masking` chose masks) the actions allowed.
        """
        raise NotImplementedError

    def _update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One gradient step on a replay batch (see `BATCH_FIELDS`); returns metrics as device tensors (an update
        may return none: logs average each metric over the updates that reported it)."""
        raise NotImplementedError

    def _prepare_batches(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The replay rows of an iteration's next batches, gathered together, before they are split into batches:
        an algorithm may add per-row fields that do not change during those gradient steps (see DQN)."""
        return rows

    def _prepare_normalised(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`_prepare_batches` on the gathered rows, whose stored observations are first normalised with the running
        statistics where the replay holds the env's own (`_start`; the HER buffer normalises its batches itself),
        and whose stored rewards are scaled with the running return statistics where `normalize_reward` is on."""
        if getattr(self, "_obs_normaliser", None) is not None and not isinstance(self.buffer, HerReplayBuffer):
            rows = {**rows, **{name: self._normalised_obs(rows[name]) for name in ("obs", "next_obs")}}
        if getattr(self, "_reward_normaliser", None) is not None:
            rows = {**rows, "rewards": self._reward_normaliser.scale(rows["rewards"])}
        return self._prepare_batches(rows)

    def _on_dones(self, dones: torch.Tensor) -> None:
        """Called after every env step with the finished rows (bool `[N]`); e.g. to reset per-episode noise."""

    # --- shared ---------------------------------------------------------------------------------------------
    def _modules_to_sync(self) -> list[torch.nn.Module]:
        return [m for m in self._modules().values() if isinstance(m, torch.nn.Module)]

    @property
    def _envs_all_ranks(self) -> int:
        """Env steps per collection step over every process: num_timesteps counts them all (ranks run equal
        shares, `DistributedStrategy.split_envs`), while this process steps `self._env.num_envs` of them."""
        return self._env.num_envs * self.strategy.world_size

    def _place_actor_and_critics(self, actor: torch.nn.Module) -> None:
        """SAC's and TD3's networks: `actor` and `n_critics` Q-networks (an ensemble with its own encoder), both
        initialised as `ortho_init` says and placed on the device (`self.actor`, `self.critic`), and the critics'
        frozen target (`self.critic_target`)."""
        cfg, spec = self.config, self.spec
        critic = QEnsemble(cfg.n_critics, spec.obs_dim, spec.action_dim, cfg.net_arch, cfg.activation,
                           encoder=self._make_encoder("critic"))
        if not cfg.ortho_init:  # (PyTorch's default initialisation, SB3's for its off-policy networks)
            default_init_(actor)
            default_init_(critic)
        self.actor, self.critic = to_device(actor, self.device), to_device(critic, self.device)
        self.critic_target = frozen_copy(self.critic, self, ("critic", "critic_target"))

    def _check_spaces(self, spec) -> None:
        super()._check_spaces(spec)
        problem = goal_space_problem(spec.observation_space) if self.config.her else None
        if problem is not None:
            raise UserError(f"her=True (Hindsight Experience Replay) needs goal-conditioned observations, and "
                            f"{spec.env_id} does not have them: {problem}.")

    def _setup_action_scaling(self) -> None:
        """Device tensors for the policy-space <-> env-space mapping of Box actions."""
        if not self.spec.discrete:
            box = self.spec.action_space
            if not (np.isfinite(box.low).all() and np.isfinite(box.high).all()):
                raise UserError(f"{type(self).__name__} maps its actions in [-1, 1] onto the action space's bounds, "
                                f"but {self.spec.env_id} has unbounded actions (low {box.low}, high {box.high}); give "
                                "the env the range its actions should take, e.g. gymnasium.wrappers.TransformAction("
                                "env, lambda a: a, gymnasium.spaces.Box(low, high)) (RescaleAction refuses unbounded "
                                "actions, ClipAction makes them so).")
            self._action_center, self._action_half_range, self._action_low, self._action_high = action_scaling(
                box, self.device, f"{type(self).__name__} on {self.spec.env_id}")

    def _to_env(self, actions: torch.Tensor) -> torch.Tensor:
        """Policy-space actions as the env expects them: Box values in [-1, 1] rescaled to [low, high] (clamped
        there: center + half_range * 1 may round past an asymmetric bound)."""
        if self.spec.discrete:
            return actions
        return clamped(torch.addcmul(self._action_center, self._action_half_range, actions), self._action_low,
                       self._action_high)

    @property
    def _uniform_until(self) -> int:
        """The env step count before which actions are uniform random (unless `_policy_at_warmup`): learning_starts,
        brought forward by the transitions `load_replay_buffer` put in the buffer before the run's own
        (demonstrations, a previous stage's experience), which count towards learning_starts for the updates too;
        a loaded or resumed model's new empty buffer never brings it back."""
        cfg = self.config
        return min(cfg.learning_starts, getattr(self, "_buffer_start", 0) + cfg.learning_starts)

    def _normalised_obs(self, obs):
        """`obs` as the networks take them: normalised with the running statistics where the env hands out its own
        observations (`_start`: normalize_obs or Hindsight Experience Replay), else as they are."""
        normaliser = getattr(self, "_obs_normaliser", None)
        return obs if normaliser is None else normaliser.obs_rms.normalize(obs, normaliser.clip)

    def _random_actions(self, num: int, action_masks: torch.Tensor | None = None) -> torch.Tensor:
        """Uniform random policy-space actions for `num` envs, drawn on the device; with `action_masks` (bool
        `[num, n]`), uniform over each row's allowed actions."""
        if action_masks is not None:
            return allowed_uniform(torch.rand(action_masks.shape, device=self.device), action_masks).to(
                rules(self.device).index_dtype)
        if self.spec.discrete:
            return torch.randint(0, self.spec.action_dim, (num,), device=self.device,
                                 dtype=rules(self.device).index_dtype)
        return torch.rand((num, *self.spec.action_space.shape), device=self.device) * 2 - 1

    def _start(self, env: BatchedEnv, total_timesteps: int) -> None:
        cfg = self.config
        # normalize_obs, and Hindsight Experience Replay on rlspeed's observation normalisation: the env hands out its
        # own observations, which the replay stores (and relabels), then normalises each batch with the running
        # statistics (as SB3's VecNormalize); the policy acts on them normalised (`_normalised_obs`)
        self._obs_normaliser = find_wrapper(env, NormalizeObservation) if cfg.her or cfg.normalize_obs else None
        if self._obs_normaliser is not None:
            self._obs_normaliser.hand_out_raw = True
        # normalize_reward: the env hands out its own rewards, which the replay stores; each batch's are scaled
        # (`_prepare_normalised`)
        self._reward_normaliser = find_wrapper(env, NormalizeReward) if cfg.normalize_reward else None
        if self._reward_normaliser is not None:
            self._reward_normaliser.hand_out_raw = True
        if self._holds_learning_rates_as_tensors():
            self._hold_learning_rates_as_tensors()
        buffer = getattr(self, "buffer", None)
        if buffer is not None and buffer is not getattr(self, "_made_buffer", None):
            # (a buffer put in place by hand, `model.buffer = ...`: its transitions go into the one made here)
            if not isinstance(buffer, ReplayBuffer):
                raise UserError(f"model.buffer holds an object of type {type(buffer).__name__}: it takes an "
                                "rlspeed.buffers.ReplayBuffer (or fill it with model.load_replay_buffer(path)).")
            self.load_replay_buffer(buffer)
        elif buffer is not None and buffer.num_envs == env.num_envs and self._resume is None:
            # a further learn() call continues the same episodes with the same replay data (after a call cut short
            # during collection, the envs are past the stored observation: they start afresh)
            self._check_buffer_settings()
            if getattr(self, "_mid_rollout", False):
                self._obs, self._mid_rollout = self._first_obs(env), False
                self._on_env_reset()  # (pending n-step steps stored as shorter ones, frame stacks restarted)
            if getattr(self, "_replay_source", None) is not None:  # (one the last learn refused)
                self._fill_replay()
            return
        # Updates wait until the new buffer holds learning_starts transitions, also after `load` or `resume`, whose
        # step count is already past learning_starts but whose replay data was not saved.
        self._buffer_start = self.num_timesteps
        require(cfg.buffer_size >= env.num_envs,
                f"buffer_size ({cfg.buffer_size}) must be at least the number of envs ({env.num_envs}).")
        discrete = self.spec.discrete
        # (a collection's steps' tensors are held until it ends, and n-step's window holds n_step steps' more)
        check_steps_held(env, cfg.train_freq + cfg.n_step)
        self._obs = self._first_obs(env)  # (after `resume`: where the checkpoint's run was)
        space = self.spec.observation_space
        obs_bytes = layout_nbytes(observation_layout(space))
        kind, options = ReplayBuffer, {"n_step": cfg.n_step}
        if cfg.her:
            kind, options = HerReplayBuffer, {"compute_reward": env_compute_reward(env),
                                              "n_sampled_goal": cfg.n_sampled_goal,
                                              "goal_selection_strategy": cfg.goal_selection_strategy,
                                              "normalize": self._normalised_obs}
        elif cfg.frame_dedup and frame_stacks(space) and stacked_frames(env):
            kind = FrameStackReplayBuffer
        elif cfg.frame_dedup and image_space(space) and 2 * cfg.buffer_size * obs_bytes >= _SHARED_OBSERVATIONS_BYTES:
            kind = SharedObservationReplayBuffer
        if not cfg.her and goal_space_problem(space) is None and self.strategy.is_main and has_compute_reward(env):
            # (a goal env's sparse rewards: without relabelling, few episodes reach their goal)
            warn_at_caller(f"{self.env_id} is goal-conditioned (achieved_goal and desired_goal observations, "
                           "compute_reward): Hindsight Experience Replay, off here, usually learns it far faster "
                           "(her=True; rlspeed train --set her=true).", UserWarning)
        self.buffer = kind(cfg.buffer_size, env.num_envs, space,
                           () if discrete else tuple(self.spec.action_space.shape),
                           rules(self.device).index_dtype if discrete else torch.float32,
                           self.device, gamma=cfg.gamma, mask_size=self._start_masking(), **options)
        left, self._replay_left = getattr(self, "_replay_left", None), None
        if left is not None and self._resume is None and getattr(self, "_replay_source", None) is None:
            # (a loaded model's first learn: the file beside it not read)
            warnings.warn(f"'{left.name}' beside the loaded model holds its run's replay buffer, which load does not "
                          f"read: this learn starts an empty one (updates wait for learning_starts transitions); "
                          f"model.resume(path) on a model made as the run's continues with it.", stacklevel=3)
        if self._resume is not None and self._load_replay(self._resume):
            self._buffer_start = int(self._resume["meta"].get("algo", {}).get("buffer_start", self._buffer_start))
            if not self._episodes_restored:  # (the envs start fresh episodes: steps waiting for their n-step
                self.buffer.restart_episodes()  # return, saved with the buffer, belong to the ended ones)
        self._made_buffer = self.buffer
        self._buffer_settings = {name: getattr(cfg, name, None) for name in _BUFFER_KEYS}
        if getattr(self, "_replay_source", None) is not None:  # (`load_replay_buffer` before this learn)
            self._fill_replay()
        # each sampled batch holds its rows whole on the training device (frame stacks and shared observations
        # rebuilt): observation and next observation, and the row's other fields
        batch_bytes = cfg.batch_size * (2 * obs_bytes + self.buffer._row_bytes)
        refuse_unless_fits(batch_bytes, self.device, f"A sampled batch of batch_size={cfg.batch_size:,}",
                           "lower batch_size")
        per_iteration = self.steps_per_iteration  # (learn trains whole iterations, updating after each collection)
        iterations = -(-total_timesteps // per_iteration)
        stored = self.num_timesteps - self._buffer_start + iterations * per_iteration
        reason = no_update_reason(cfg, stored, iterations * cfg.train_freq, len(self.buffer) == 0)
        if reason is not None:
            warnings.warn(reason, stacklevel=3)

    def _end(self) -> None:
        # (the env hands out normalised observations again: to its user, and to another model training on it)
        for normaliser in (getattr(self, "_obs_normaliser", None), getattr(self, "_reward_normaliser", None)):
            if normaliser is not None:
                normaliser.hand_out_raw = False

    def _check_buffer_settings(self) -> None:
        """UserError in one sentence for a setting the replay buffer was made with (`_BUFFER_KEYS`: its rows'
        discounts, their n-step returns, its capacity and layout) set to another value on `model.config` since: the
        further learn that keeps the buffer would ignore it."""
        for name, value in getattr(self, "_buffer_settings", {}).items():
            now = getattr(self.config, name, value)
            if now != value:
                algo = type(self).__name__
                raise UserError(f"model.config.{name} is {now!r}, but the replay buffer an earlier learn made holds "
                                f"transitions for {value!r}, and this learn would keep it and ignore the change: set "
                                f"it back, or save the model and load it with the new value, {algo}.load(path, "
                                f"{name}={now!r}) (its save_replay_buffer(path) file can fill the new buffer, "
                                "load_replay_buffer).")

    def _own_modules(self) -> None:
        """`Algorithm._own_modules`: the unpickled target followers (inert, `_TargetFollower.__reduce__`) follow this
        model."""
        for value in vars(self).values():
            if isinstance(value, torch.nn.Module):
                for hook in value._load_state_dict_post_hooks.values():
                    if isinstance(hook, _TargetFollower) and hook._owner is None:
                        hook._owner = weakref.ref(self)

    # --- the replay buffer in checkpoints (`save_replay_buffer`) ----------------------------------------------
    def _on_env_reset(self) -> None:
        # steps of the episodes the reset ended, still waiting for their n-step return, would be joined to the new
        # episodes' rewards: stored as shorter ones (`ReplayBuffer.restart_episodes`)
        buffer = getattr(self, "buffer", None)
        if buffer is not None:
            buffer.restart_episodes()

    def report(self) -> str:
        """`Algorithm.report`, plus the replay buffer's layout, placement and bytes per transition (once learn made
        it)."""
        buffer = getattr(self, "buffer", None)
        return super().report() + ("" if buffer is None else "\n" + buffer.describe())

    def replay_summary(self) -> dict | None:
        """The replay buffer's layout (`dense`, `frames` or `observations`), capacity, bytes per transition, bytes and
        placement, as JSON values (for summary.json); None before learn made it."""
        buffer = getattr(self, "buffer", None)
        return None if buffer is None else buffer.summary()

    def _algorithm_state(self):
        tensors, values = super()._algorithm_state()
        if hasattr(self, "_buffer_start"):
            values["buffer_start"] = self._buffer_start
        return tensors, values

    def _save_replay(self, path: Path, digest: str | None = None) -> dict | None:
        """With `save_replay_buffer`: the buffer's stored rows, write position and pending n-step steps
        (`ReplayBuffer.state_dict`) for `<checkpoint>.replay.safetensors`, written first to its staged name
        (`rlspeed.checkpoint.staged_path`; `save` moves it into place after the checkpoint), so that a kill between the
        two files leaves the previous pair whole; a token in both files pairs them."""
        buffer = getattr(self, "buffer", None)
        if not self.save_replay_buffer:
            return None
        if buffer is None:
            if self._resume is None:
                return None
            # (resumed and saved before a learn made the buffer: a run whose checkpoint holds its whole budget,
            # finished by --resume; its model keeps the checkpoint's buffer beside it, as the uninterrupted run's)
            replay = self._resumed_replay()
            if replay is None:
                return None
            tensors, meta = replay
        else:
            tensors, meta = buffer.state_dict()
            meta = {**meta, "processes": self.strategy.world_size}  # (a resumed file's own count, or none, is kept)
        token = secrets.token_hex(16)
        file = replay_path(path)
        save_checkpoint(staged_path(file), tensors, {"replay_buffer": {"token": token, **meta,
                                                                       "contents": RAW_CONTENTS}}, digest=digest)
        return {"file": file.name, "token": token}

    def _resumed_replay(self) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The replay buffer saved with the checkpoint this model was resumed from (its tensors and `replay_buffer`
        metadata, as `ReplayBuffer.state_dict` gave them), or None where there is none to give (`_saved_replay`)."""
        found = self._saved_replay(self._resume, "cpu", "the model is saved without a replay buffer")
        return None if found is None else (found[1], {key: value for key, value in found[2].items() if key != "token"})

    def _saved_replay(self, resume: dict, device, outcome: str,
                      mapped: bool = False) -> tuple[Path, dict[str, torch.Tensor], dict] | None:
        """(file, tensors, `replay_buffer` metadata) of the replay buffer saved with the checkpoint `resume` describes,
        on `device`; None where the checkpoint names none, and, with a warning ending in `outcome`, where the file it
        names cannot be read or does not belong to it (a later save wrote it)."""
        saved = resume["meta"].get("replay_buffer")
        if not isinstance(saved, dict):
            return None
        file = beside(resume["path"], saved.get("file"))
        try:
            if file is None:  # (an edited file's)
                raise UserError(f"it names {str(saved.get('file'))!r}, no file beside it")
            tensors, meta = load_paired(file, saved.get("token"), device=device, mapped=mapped)
        except UserError as error:
            warnings.warn(f"The replay buffer saved with '{resume['path']}' cannot be read ({error}); {outcome}.",
                          stacklevel=5)
            return None
        info = meta.get("replay_buffer") or {}
        if info.get("token") != saved.get("token"):
            warnings.warn(f"'{file}' does not belong to '{resume['path']}' (a later save wrote it); {outcome}.",
                          stacklevel=5)
            return None
        return file, tensors, info

    def _load_replay(self, resume: dict) -> bool:
        """Fill the new replay buffer from the file the checkpoint names, when it was saved with one; a missing or
        mismatched file is a warning (the buffer then fills from empty). Returns whether it was restored."""
        if self.strategy.enabled:  # (each process fills a buffer of its own: no one file restores them)
            if not resume.get("untrained"):
                warnings.warn(f"Resuming from '{resume['path']}': under torch.distributed the replay buffer is not "
                              f"restored (each process fills its own), so {_REFILLS}: training is not identical to "
                              "the uninterrupted run.", stacklevel=4)
            return False
        if not isinstance(resume["meta"].get("replay_buffer"), dict):  # (as a population's resume says it)
            if resume.get("untrained"):
                return False
            warnings.warn(f"Resuming from '{resume['path']}': it holds no replay buffer (save_replay_buffer=True, or "
                          f"--save-replay-buffer, saves one with each checkpoint), so {_REFILLS}: training is not "
                          "identical to the uninterrupted run.", stacklevel=4)
            return False
        normalisers = {"observations": getattr(self, "_obs_normaliser", None),
                       "rewards": getattr(self, "_reward_normaliser", None)}
        normalised = [rows for rows in resume.get("normalised_replay") or () if normalisers.get(rows) is not None]
        if normalised:
            flags = " and ".join(_NORMALISED_BY[rows] for rows in normalised)
            warnings.warn(f"Resuming from '{resume['path']}': an older rlspeed saved its replay buffer with the "
                          f"{' and '.join(normalised)} normalised as they were collected, and {flags} now stores them "
                          f"raw and normalises each batch, so {_REFILLS}.", stacklevel=4)
            return False
        # (the file's tensors read as views of it mapped in memory, copied into the buffer and dropped: a copy of them
        # besides the buffer it fills, as large as the buffer when full, would not fit where the buffer fills memory)
        found = self._saved_replay(resume, self.buffer.storage_device, "the replay buffer refills from empty",
                                   mapped=True)
        if found is None:
            return False
        file, tensors, info = found
        if "contents" in info:  # (else written before it was recorded: the checkpoint's config told, above)
            problem = self._replay_contents_problem(info["contents"], [])
            if problem is not None:
                warnings.warn(f"'{file}' cannot fill this model's replay buffer: {problem}; it refills from empty.",
                              stacklevel=4)
                return False
        reason = self.buffer.load_state_dict(tensors, info)
        if reason is not None:
            warnings.warn(f"'{file}' cannot fill this model's replay buffer: {reason}; it refills from empty.",
                          stacklevel=4)
            return False
        filled_by, processes = info.get("num_envs"), info.get("processes")
        if isinstance(filled_by, int) and filled_by != self.buffer.num_envs and processes != 1:
            warnings.warn(f"Resuming from '{resume['path']}': its replay buffer was filled by {filled_by} envs and "
                          f"this run steps {self.buffer.num_envs}: {_share_restored(processes, self.buffer.size)}.",
                          stacklevel=4)
        return True

    def write_replay_buffer(self, path: str | os.PathLike[str], digest: str | None = None) -> Path:
        """`Algorithm.write_replay_buffer`: the replay buffer learn made, written to `path` (a checkpoint file of
        its own, `rlspeed.checkpoint`: digest, atomic write, encryption where a key is set)."""
        if not isinstance(path, (str, os.PathLike)):
            raise UserError(f"save_replay_buffer writes a file: give a path (str or pathlib.Path), not "
                            f"{type(path).__name__}.")
        buffer = getattr(self, "buffer", None)
        if buffer is None:
            raise UserError(f"{type(self).__name__} has no replay buffer to save yet: learn makes it.")
        tensors, meta = buffer.state_dict()
        return save_checkpoint(path, tensors, {"replay_buffer": {**meta, "processes": self.strategy.world_size,
                                                                 "contents": RAW_CONTENTS, "algo": self.name,
                                                                 "env_id": self.env_id}}, digest=digest)

    def load_replay_buffer(self, path: str | os.PathLike[str] | ReplayBuffer, truncate_last_traj: bool = True,
                           assume_raw: bool = False) -> None:
        """`Algorithm.load_replay_buffer`: the transitions of the file (or of the `ReplayBuffer` given) go into this
        model's replay buffer, now if learn made it, else when the next learn makes it (where they do not fit, that
        learn refuses them, and the next one again); updates may start, and the uniform random actions of the
        warm-up end, as soon as it holds `learning_starts` transitions, the loaded ones counted. The stored rows
        must match this model's observation and action shapes, its n_step (n-step rows: also its gamma; refused
        here, as the values are) and its action space's values (Discrete actions below n; Box actions in the
        policy's scale, [-1, 1]), and hold no NaN or infinite values; a buffer of
        another capacity gives its newest transitions. Steps still waiting for their n-step return are stored as
        shorter ones, their episodes truncated there (Stable-Baselines3's `truncate_last_traj=True`; False, which
        continues them in the model's envs, is refused: the envs' episodes are not theirs). The rows must hold what
        the buffer holds, the env's own observations and rewards (a file records what its rows hold; a ReplayBuffer
        given is taken as filled with them): a file whose rows were normalised is refused, and so is a file written
        before rlspeed recorded it, into a model that normalises (`normalize_obs`, `normalize_reward`), unless
        `assume_raw=True` says its rows are the env's own."""
        assume_raw = true_or_false("load_replay_buffer(..., assume_raw=...)", assume_raw)
        if truncate_last_traj is not True:
            raise UserError("load_replay_buffer(..., truncate_last_traj=False) would continue the saved episodes in "
                            "this model's envs, whose episodes are not theirs: leave it True (the steps of unfinished "
                            "episodes are stored as truncated there).")
        if isinstance(path, ReplayBuffer):
            name = f"the {type(path).__name__} given"
            tensors, meta = path.state_dict()
            tensors = {key: value.clone() for key, value in tensors.items()}  # (its rows now: later adds stay its)
        elif isinstance(path, (str, os.PathLike)):
            name = f"'{path}'"
            tensors, meta = load_checkpoint(path, device="cpu")
            meta = meta.get("replay_buffer")
            if not isinstance(meta, dict):
                raise UserError(f"'{path}' holds no replay buffer (save_replay_buffer(path) writes one; a model file "
                                "is read by load).")
            problem = self._replay_contents_problem(meta.get("contents"), self._normalised_rows(), assume_raw)
            if problem is not None:
                raise UserError(f"{name} cannot fill this model's replay buffer: {problem}.")
        else:
            raise UserError(f"load_replay_buffer reads a file (a str or pathlib.Path) or takes an "
                            f"rlspeed.buffers.ReplayBuffer, not {type(path).__name__}.")
        problem = self._replay_values_problem(tensors, meta) or self._replay_returns_problem(meta)
        if problem is not None:
            raise UserError(f"{name} cannot fill this model's replay buffer: {problem}.")
        self._replay_source = (tensors, meta, name)
        if getattr(self, "buffer", None) is not None and getattr(self, "_made_buffer", None) is self.buffer:
            self._fill_replay()

    def _fill_replay(self) -> None:
        """Fill the buffer learn made from `load_replay_buffer`'s source; a UserError naming it when it does not
        fit (the source stays, for the next learn to say it again rather than train without it)."""
        tensors, meta, name = self._replay_source
        with training_threads(self.num_threads):  # (a large fill: on the model's threads, as training)
            reason = self.buffer.load_state_dict(tensors, meta)
        if reason is not None:
            raise UserError(f"{name} cannot fill this model's replay buffer: {reason}.")
        self._replay_source = None
        self.buffer.restart_episodes()  # (its steps waiting for their n-step return: stored, truncated)
        self._buffer_start = self.num_timesteps - len(self.buffer)  # (the loaded rows count for learning_starts)

    def _normalised_rows(self) -> list[str]:
        """The kinds of row ("observations", "rewards") this model normalises per sampled batch: its config's flags,
        and a normalising env passed in, whose statistics turn them on at learn."""
        wrappers = {"observations": NormalizeObservation, "rewards": NormalizeReward}
        env = getattr(self, "_env", None)
        return [rows for rows, flag in _NORMALISED_BY.items() if getattr(self.config, flag, False)
                or (env is not None and find_wrapper(env, wrappers[rows]) is not None)]

    @staticmethod
    def _replay_contents_problem(contents, normalised: list[str], assume_raw: bool = False) -> str | None:
        """Why replay rows recorded as `contents` (a file's `replay_buffer.contents`; None: a file written before it
        was recorded) cannot go into a buffer that holds the env's own rows and normalises `normalised` per batch,
        else None. Rows normalised as collected are refused rather than converted: each was normalised with the
        statistics of its own time, which no file keeps."""
        if contents is None:
            if assume_raw or not normalised:  # (a model that normalises nothing takes rows as they are, as it did)
                return None
            flags = " and ".join(_NORMALISED_BY[rows] for rows in normalised)
            return (f"it was written before replay files recorded what their rows hold, and this model normalises "
                    f"each batch's {' and '.join(normalised)} ({flags}), which an older run on a normalising env "
                    "stored normalised already: pass assume_raw=True if its run stored the env's own (no "
                    "normalisation, or an rlspeed with this flag)")
        if not isinstance(contents, dict):
            return f"its record of what its rows hold is unreadable ({contents!r}): the file is damaged"
        other = [f"{rows} {contents.get(rows)!r}" for rows in RAW_CONTENTS if contents.get(rows) != "raw"]
        if other:
            return (f"its rows hold {', '.join(other)}, and the buffer holds the env's own (raw) ones, which rows "
                    "normalised with the statistics of their time cannot be turned back into")
        return None

    def _replay_returns_problem(self, meta: dict) -> str | None:
        """Why a replay source's returns cannot be this model's (another n_step, or n-step returns summed with another
        gamma), else None: known from the settings alone, so said as the source is given rather than at the learn
        that makes the buffer (the other checks need it)."""
        n_step, gamma = self.config.n_step, self.config.gamma
        steps, summed = int(meta.get("n_step", n_step)), meta.get("gamma", gamma)
        if steps == n_step and (steps == 1 or summed == gamma):
            return None
        held = f"{steps}-step transitions" + (f" summed with gamma {summed}" if steps > 1 else "")
        return (f"it holds {held}, and this model takes {n_step}-step ones" + (f" with gamma {gamma}" if n_step > 1
                                                                                else "")
                + f" (a ReplayBuffer you fill: ReplayBuffer(..., n_step={n_step}, gamma={gamma}); or make the model "
                  f"with n_step={steps}" + (f", gamma={summed}" if steps > 1 else "") + ")")

    def _replay_values_problem(self, tensors: dict[str, torch.Tensor], meta: dict) -> str | None:
        """Why the stored values of a replay source cannot be this model's, else None: NaN or infinite ones, and
        actions (and Discrete observations) that are not this model's: values a Discrete space does not have fail in
        the update's indexing, and Box actions outside [-1, 1] are in the env's units, not the policy's scale the
        buffer holds."""
        rows = int(meta.get("rows", meta.get("size", 0)))
        actions = tensors.get("actions")
        if actions is None or not rows:
            return None
        for key, values in tensors.items():  # (NaN passes the range checks below, and trains NaN weights)
            if key.split(".")[0] in BATCH_FIELDS and values.is_floating_point() and not all(
                    bool(part.isfinite().all()) for part in values[:rows].split(_SAMPLE_ROWS)):  # (bounded memory)
                return f"its {key} hold NaN or infinite values"
        actions = actions[:rows]
        if self.spec.discrete:
            n = self.spec.action_dim
            if actions.is_floating_point() or bool(((actions < 0) | (actions >= n)).any()):
                return f"its actions hold values outside {self.spec.env_id}'s Discrete({n}) actions 0..{n - 1}"
        elif actions.is_floating_point() and bool((actions.abs() > 1).any()):
            return (f"its actions reach {float(actions.abs().max()):.4g}: the buffer holds actions in the policy's "
                    "scale [-1, 1] (an env action a is 2 (a - low) / (high - low) - 1)")
        space = self.spec.observation_space
        if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            for key in ("obs", "next_obs"):
                values = tensors.get(key)
                if values is None:
                    continue
                low, high = (torch.as_tensor(bound, device=values.device) for bound in integer_range(space))
                if bool(((values[:rows] < low) | (values[:rows] >= high)).any()):
                    return f"its {key} hold values outside {self.spec.env_id}'s observation space {space}"
        return None

    def _train_iteration(self) -> tuple[int, dict[str, torch.Tensor]]:
        cfg, env, buffer = self.config, self._env, self.buffer
        num_envs = env.num_envs
        global_envs = self._envs_all_ranks

        # 1. Collect train_freq steps of every env into the replay buffer.
        episode_returns, episode_dones = [], []  # per step: the running returns and which rows just finished
        successes: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step, where the env reports is_success
        obs = self._obs
        self._mid_rollout = True  # (until `_obs` is the envs' observation again: a learn cut short here resets)
        # Several steps per iteration go to the buffer together after the last one (the same rows as step by step:
        # nothing reads the buffer in between), unless holding them would take much memory.
        # (the frame layout stores step by step: it needs each step's restarted rows)
        stage = (1 < cfg.train_freq and buffer.layout == "dense"
                 and cfg.train_freq * num_envs * buffer.bytes_per_transition <= _STAGE_BYTES)
        staged: list[tuple[torch.Tensor, ...]] | None = [] if stage else None
        masking = buffer.next_action_masks is not None
        with torch.no_grad(), acting_mode(self.policy):  # (Dropout off, BatchNorm's running statistics; SB3's modes)
            for step in range(cfg.train_freq):
                timesteps = self.num_timesteps + step * global_envs
                masks = self._action_mask if masking else None  # the mask valid for `obs`
                with phase("act"):
                    if timesteps < self._uniform_until and not self._policy_at_warmup:
                        actions = self._random_actions(num_envs, masks)
                    elif masking:
                        actions = self._explore(self._normalised_obs(obs), timesteps, masks)
                    else:
                        actions = self._explore(self._normalised_obs(obs), timesteps)
                    env_actions = self._to_env(actions)
                with phase("env"):
                    next_obs, rewards, terminated, truncated, info = env.step(env_actions)
                with phase("buffer"):
                    # final_obs is the true last observation of finished rows: truncated episodes bootstrap from it.
                    transition = (obs, actions, rewards, info["final_obs"], terminated, truncated)
                    if masking:
                        transition = (*transition, next_masks(info, terminated | truncated))
                        self._action_mask = info["action_mask"]
                    if staged is None:
                        # (the rows the env restarted, on the host where the adapter knows them: for the frame layout)
                        buffer.add(*transition, reset_rows=info.get("final_rows"))
                    else:
                        staged.append(transition)
                    dones = info["done"]
                    self._on_dones(dones)  # (TD3/DDPG's OU noise restarts for finished episodes)
                    episode_returns.append(info["episode_return"])
                    episode_dones.append(dones)
                    if "is_success" in info:
                        successes.append((dones, info["is_success"]))
                obs = next_obs
            if staged:
                with phase("buffer"):
                    buffer.extend(*(_stack(field) for field in zip(*staged)))
        self._obs, self._mid_rollout = obs, False
        steps = cfg.train_freq * num_envs
        # the returns of the episodes that finished, summed, and their count: a few kernels for all steps
        returns, dones = ((episode_returns[0], episode_dones[0]) if len(episode_returns) == 1
                          else (torch.stack(episode_returns), torch.stack(episode_dones)))
        metrics = {"episode_return_sum": (returns * dones).sum(), "episode_count": dones.sum(),
                   **success_totals(successes, self.strategy.enabled, self.device)}

        # 2. Gradient steps on uniform replay batches, once past learning_starts (SB3's convention).
        if self.num_timesteps + cfg.train_freq * global_envs - self._buffer_start > cfg.learning_starts and len(buffer):
            if cfg.anneal_lr:  # (at the step count after this collection, as SB3 computes its progress)
                self._anneal_learning_rate(self.num_timesteps + cfg.train_freq * global_envs)
            if self._schedule_functions:  # (schedule functions: called at the same progress, as SB3 calls them)
                self._call_schedules(self.num_timesteps + cfg.train_freq * global_envs)
            with phase("update"):
                metrics.update(self._gradient_steps(steps))
        return steps, metrics

    def _gradient_steps(self, steps: int) -> dict[str, torch.Tensor]:
        """This iteration's gradient steps (`steps`: its env steps on this rank) on uniform replay batches; returns
        each metric averaged over the updates that reported it."""
        cfg, buffer = self.config, self.buffer
        gradient_steps = steps if cfg.gradient_steps == -1 else cfg.gradient_steps
        totals: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}  # updates that reported each metric (not necessarily all of them)
        # Batches drawn together, up to ~64k rows at a time (the buffer does not change until the next collect).
        chunk = max(1, min(gradient_steps, _SAMPLE_ROWS // cfg.batch_size))
        for first in range(0, gradient_steps, chunk):
            for batch in buffer.sample_batches(min(chunk, gradient_steps - first), cfg.batch_size,
                                               prepare=self._prepare_normalised):
                for key, value in self._update(batch).items():
                    totals[key] = totals[key] + value if key in totals else value
                    counts[key] = counts.get(key, 0) + 1
                self._n_updates += 1
        return {key: value / counts[key] if counts[key] > 1 else value for key, value in totals.items()}
