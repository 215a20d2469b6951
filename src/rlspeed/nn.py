"""Networks and action distributions shared by the algorithms.

A policy is an encoder, chosen from the observation space (`make_encoder`), followed by heads (MLPs giving logits,
Gaussian parameters, values or Q-values). The encoder turns an observation batch in its stored dtype (uint8 images,
int64 indices, a dict of tensors) into float features `[B, features_dim]`; float vector observations have no encoder
module at all (`encoder is None`: the heads take the flattened observation, the plain-MLP case that the hand-derived
updates in `rlspeed.fused` cover).

The distributions are written as plain tensor maths (no `torch.distributions` objects): that keeps the hot path
to a few kernels, free of argument validation and Python objects, and compilable.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlspeed.accel.grads import clip_grad_norm as clip_grad_norm  # (re-exported: the updates clip with it)
from rlspeed.activations import ACTIVATION_CLASSES, check_activation
from rlspeed.device import rules
from rlspeed.envs.base import Observation, check_observation_space, observation_layout
from rlspeed.errors import EncoderWarning, UserError, warn_at_caller
from rlspeed.policy_kwargs import OWN_ENCODER as OWN_ENCODER  # (re-exported: the configs' refusals say it)

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # SAC's actor: log std clamped to this range
LOG_2PI = math.log(2 * math.pi)
LOG_2 = math.log(2.0)

#: the hidden layers' activation by name (`rlspeed.activations.ACTIVATION_CLASSES`, the one table)
ACTIVATIONS: dict[str, type[nn.Module]] = {name: getattr(nn, cls) for name, cls in ACTIVATION_CLASSES.items()}


def activation_layer(name: str) -> nn.Module:
    """A new layer of the activation `name` (a name of `ACTIVATIONS`); UserError naming the table for another."""
    check_activation(name)
    return ACTIVATIONS[name]()


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, activation: str = "tanh",
        out_gain: float = 1.0) -> nn.Sequential:
    """An MLP from `in_dim` inputs through the `hidden` widths to `out_dim` outputs, `activation` (a name of
    `ACTIVATIONS`) after each hidden layer, with orthogonal initialisation (gain sqrt(2) on hidden layers, `out_gain`
    on the last) and zero biases."""
    check_activation(activation)  # (before any layer is made)
    layers: list[nn.Module] = []
    last = in_dim
    for width in hidden:
        layers += [_init(nn.Linear(last, int(width)), math.sqrt(2)), ACTIVATIONS[activation]()]
        last = int(width)
    layers.append(_init(nn.Linear(last, out_dim), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


_M = TypeVar("_M", bound=nn.Module)


def to_device(module: _M, device: torch.device) -> _M:
    """`module` moved to `device`, its CNN encoders' convolutions in channels-last memory where
    `DeviceRules.channels_last_convs` says so (the CPU). Every algorithm places its networks with this."""
    module = module.to(device)
    if rules(torch.device(device)).channels_last_convs:
        for layer in module.modules():
            if isinstance(layer, CNNEncoder):
                layer.use_channels_last()
    return module


def image_storage_format(encoder: nn.Module | None) -> torch.memory_format:
    """The memory layout in which storage should keep the observations `encoder` takes: `torch.channels_last` where it
    is a CNN encoder of channels-first images whose convolutions run channels-last (`use_channels_last`), so that
    the minibatches gathered from the storage reach them without a layout copy each (the copy is made once, as each
    step is stored); `torch.contiguous_format` otherwise."""
    if (isinstance(encoder, CNNEncoder) and not encoder.channels_last
            and encoder.input_format == torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def default_init_(module: nn.Module) -> nn.Module:
    """Re-initialise every linear and convolution layer of `module` as PyTorch initialises a new one (uniform
    Kaiming weights with a = sqrt(5), uniform biases within 1/sqrt(fan_in)): Stable-Baselines3's `ortho_init=False`.
    `EnsembleMLP` members are initialised one by one as `nn.Linear` would be; LSTMs keep their (default)
    initialisation; other parameters (`log_std`) are left as they are; an encoder of the user's own (an `Encoder`
    whose class is not rlspeed's: a subclass's `_make_encoder`) keeps the initialisation its code gave it, as
    Stable-Baselines3's `ortho_init=False` leaves a custom features extractor's. Returns `module`."""
    with torch.no_grad():
        for layer in _modules_outside_own_encoders(module):
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                layer.reset_parameters()
            elif isinstance(layer, EnsembleMLP):
                for weight, bias in zip(layer.weights, layer.biases):
                    for k in range(weight.shape[0]):
                        nn.init.kaiming_uniform_(weight[k].T, a=math.sqrt(5))  # (the [out, in] view, fan_in = in)
                        bound = 1 / math.sqrt(weight.shape[1])
                        nn.init.uniform_(bias[k], -bound, bound)
    return module


def _modules_outside_own_encoders(module: nn.Module) -> Iterator[nn.Module]:
    """`module` and its submodules (as `modules()`, each once), less the encoders of the user's own and their layers;
    rlspeed's encoders inside one (`make_encoder`'s, wrapped) are rlspeed's layers and come with theirs."""
    seen: set[int] = set()
    todo = [(module, False)]
    while todo:
        layer, inside_own = todo.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if isinstance(layer, Encoder):
            inside_own = not of_rlspeed(layer)
        if not inside_own:
            yield layer
        todo.extend((child, inside_own) for child in reversed(list(layer.children())))


#: torch.nn layers whose forward is the same in train and eval mode (exact types: a subclass may read `training`)
_MODE_FREE_LAYERS = frozenset({
    nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Flatten, nn.Unflatten, nn.Identity, nn.Sequential,
    nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict, nn.LayerNorm, nn.GroupNorm, nn.Embedding,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d, nn.ReLU, nn.ReLU6, nn.Tanh, nn.ELU, nn.SELU, nn.CELU, nn.SiLU, nn.GELU, nn.Mish,
    nn.LeakyReLU, nn.PReLU, nn.Sigmoid, nn.Softplus, nn.Softsign, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid,
    nn.Softmax, nn.LogSoftmax, nn.Tanhshrink,
})


def mode_dependent(module: nn.Module) -> bool:
    """Whether `module` holds a layer whose forward may differ between train and eval mode: Dropout, BatchNorm, a
    multi-layer LSTM's dropout, or any module of the user's own (its forward may read `self.training`); rlspeed's own
    networks, the plain torch.nn layers (`_MODE_FREE_LAYERS`) and torch.compile's wrapper of them do not. (A walk of
    the `_modules` dicts: it runs at every `predict`, where `modules()`'s generator costs several times as much.)"""
    todo = [module]
    while todo:
        layer = todo.pop()
        if layer is None:  # (a child registered as None)
            continue
        kind = type(layer)
        free = _MODE_FREE.get(kind)
        if free is None:
            free = _MODE_FREE[kind] = (kind in _MODE_FREE_LAYERS or kind.__module__.startswith("rlspeed.")
                                       or (kind.__module__, kind.__qualname__) == _COMPILED_WRAPPER)
        if not free and (kind not in (nn.LSTM, nn.GRU, nn.RNN) or layer.dropout):
            return True
        todo.extend(layer._modules.values())
    return False


#: torch.compile's wrapper (`OptimizedModule`), whose forward is its `_orig_mod`'s (a child, walked as the others)
_COMPILED_WRAPPER = ("torch._dynamo.eval_frame", "OptimizedModule")

#: each layer class seen, whether it is mode-free (`mode_dependent`'s cache)
_MODE_FREE: dict[type, bool] = {}


#: the networks in `acting_mode` now: id -> (blocks inside it, each layer's mode before the first), under the lock
#: (a server's threads predict at once: the last to leave puts the modes back, not the first)
_ACTING: dict[int, tuple[int, list[tuple[nn.Module, bool]]]] = {}
_ACTING_LOCK = threading.Lock()


@contextlib.contextmanager
def acting_mode(module: nn.Module) -> Iterator[None]:
    """`module` in eval mode inside the block (acting: rollouts, collection, `predict`, evaluation; export's copy is in
    eval mode too), each layer's own mode put back when the last block on it (of any thread) ends (updates train in
    the modes the layers hold, train mode unless the user set another), as Stable-Baselines3 switches its policies.
    Only where the mode can change the output (`mode_dependent`): rlspeed's default networks are left alone, at no
    cost but the check."""
    if not mode_dependent(module):
        yield
        return
    key = id(module)
    with _ACTING_LOCK:
        depth, modes = _ACTING.get(key, (0, []))
        if depth == 0:
            modes = [(layer, layer.training) for layer in module.modules()]
            module.eval()
        _ACTING[key] = (depth + 1, modes)
    try:
        yield
    finally:
        with _ACTING_LOCK:
            depth, modes = _ACTING.pop(key)
            if depth > 1:
                _ACTING[key] = (depth - 1, modes)
            else:
                for layer, training in modes:
                    layer.training = training


class acting:
    """`with torch.no_grad(), acting_mode(module):` in one block, for the calls that act once per env step or per
    `predict`: `torch.no_grad()` makes two objects on the way in and out (about 5 us, as much as a small network's
    layer), this block sets the grad mode itself; `acting_mode` runs only where `mode_dependent` says it matters.
    Re-entrant and per thread, as `torch.no_grad()` is (each block is its own object)."""

    __slots__ = ("module", "grad_before", "mode")

    def __init__(self, module: nn.Module):
        self.module = module

    def __enter__(self) -> None:
        self.grad_before = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        self.mode = acting_mode(self.module) if mode_dependent(self.module) else None
        if self.mode is not None:
            try:
                self.mode.__enter__()
            except BaseException:
                torch.set_grad_enabled(self.grad_before)
                raise

    def __exit__(self, *exc_info) -> None:
        try:
            if self.mode is not None:
                self.mode.__exit__(*exc_info)
        finally:
            torch.set_grad_enabled(self.grad_before)


# --- encoders: observations -> features ------------------------------------------------------------------------
ENCODERS = ("auto", "mlp", "cnn")
#: The smallest image side Nature-DQN's CNN takes (8x8 stride 4, 4x4 stride 2, 3x3 stride 1 leave one pixel).
NATURE_CNN_MIN_SIDE = 36
#: The smallest image side `cnn=auto` gives the strided 3x3 CNN (below it the small CNN, whose linear layer takes
#: 32 x (side - 4)^2 outputs: about 1 million weights at 12x12 with cnn_features_dim 512, 2.4 million at 16x16).
STRIDED_CNN_MIN_SIDE = 16
#: The smallest image side the strided CNN takes (its two halvings then its unpadded 3x3 leave one pixel).
STRIDED_CNN_LEAST_SIDE = 9
#: The CNN architectures (`cnn`): `auto` picks by the smaller image side: `nature` from 36 pixels, `strided` from 16,
#: `small` below; `nature_or_small` is the rule before the strided CNN existed (nature from 36, else small), which a
#: file saved without `cnn` in its config is loaded with.
CNN_KINDS = ("auto", "nature", "strided", "small", "nature_or_small")
#: A CNN whose linear layer has more weights than this warns (`_warn_large_cnn`): images far larger than Atari's 84x84
#: for the Nature CNN (a 400x600 render: 107 million), or from about 20x20 for the small one (cnn=small), which keeps
#: their full size
LARGE_CNN_WEIGHTS = 8_000_000


def image_channels_first(space: gym.Space) -> bool | None:
    """Whether a Box is an image with channels first (CxHxW: True) or last (HxWxC: False); None when it is not an
    image. Images are 3-D uint8 Boxes with bounds [0, 255] (as Stable-Baselines3's `is_image_space`) or 3-D bool
    Boxes (binary grids, MinAtar's), their layout `box_channels_first`'s."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
        return None
    dtype = np.dtype(space.dtype)
    if dtype == np.uint8:
        if np.any(space.low != 0) or np.any(space.high != 255):
            return None
    elif dtype != np.bool_:
        return None
    return box_channels_first(space)


def box_channels_first(space: gym.Space) -> bool | None:
    """The channel layout of a 3-D Box of any dtype and bounds read as an image (what `encoder="cnn"` takes: SB3's
    `is_image_space` with `normalized_image=True`), None for any other space: channels first (CxHxW: True) or last
    (HxWxC: False). The channel axis is the smallest dimension, as SB3's `is_image_space_channels_first` decides (a
    smallest middle dimension counts as channels last), except that a tie between the first and last dimensions
    counts as channels last, the layout envs produce (MinAtar Seaquest's 10x10x10; SB3 would read its height as
    channels)."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
        return None
    if space.shape[0] == space.shape[-1]:
        return False
    return int(np.argmin(space.shape)) == 0


def image_shape(space: gym.Space) -> tuple[int, int, int] | None:
    """(channels, height, width) of a 3-D Box read as an image in its layout (`box_channels_first`: CxHxW or HxWxC),
    else None: the one reading of an image's sides that the CNNs, their architecture choice and their warnings share."""
    channels_first = box_channels_first(space)
    if channels_first is None:
        return None
    first, second, third = (int(side) for side in space.shape)
    return (first, second, third) if channels_first else (third, first, second)


#: Stable-Baselines3 policy attributes every network a model exposes (`model.policy`, `model.actor`, `model.critic`,
#: ...) lacks, with what to use instead (`SB3Names`)
SB3_NETWORK_ATTRIBUTES = {
    "predict": "model.predict(obs) acts on observations as the env gives them (normalised where normalize_obs is on); "
               "the networks take tensors",
    "obs_to_tensor": "the networks take a batch of tensors on model.device in the observations' own dtypes (float32 "
                     "vectors, uint8 images, int64 indices), normalised by model.obs_rms.normalize(obs) where "
                     "normalize_obs is on, and model.predict(obs) takes numpy as the env gives it",
    "set_training_mode": "the network's train(mode) sets it (eval() for train(False)), as on any torch module",
    "optimizer": "one optimizer trains all of the model's networks: model.optimizer (a new rate between learn calls: "
                 "model.config.learning_rate)",
    **dict.fromkeys(("features_extractor", "pi_features_extractor", "vf_features_extractor", "extract_features"),
                    "the observation encoder is the network's encoder attribute (None for vector observations, "
                    "which the layers take flattened as they are)"),
    "device": "the model's device is model.device",
    "save": "model.save(path) saves the whole model (Algo.load(path) gives it back, its policy model.policy), "
            "model.export(path) the deterministic policy alone (ONNX, TorchScript), and "
            "torch.save(model.policy.state_dict(), path) the weights",
    "load": "Algo.load(path) (or rlspeed.load(path)) gives back a saved model, its policy model.policy; weights saved "
            "with torch.save(network.state_dict(), path) go back with network.load_state_dict(torch.load(path))",
    **dict.fromkeys(("observation_space", "action_space"), "the spaces are model.observation_space and "
                                                             "model.action_space"),
}

#: ... of PPO's and A2C's `model.policy` (`ActorCritic`)
SB3_ACTOR_CRITIC_ATTRIBUTES = {
    **SB3_NETWORK_ATTRIBUTES,
    "predict_values": "V(obs) is model.policy.value(obs), of shape [B] (SB3's is [B, 1])",
    "evaluate_actions": "model.policy.evaluate(obs, actions) returns (log_probs, entropy, values) in that order "
                        "(SB3's: values, log_prob, entropy)",
    **dict.fromkeys(("get_distribution", "action_dist"),
                    "model.policy(obs) returns (actor output, values): the logits of Discrete actions "
                    "(torch.softmax(logits, -1) their probabilities) or the Gaussian mean of Box ones (std: "
                    "model.policy.log_std.exp()), and model.policy.sample(output) draws (actions, log_probs) from it"),
    **dict.fromkeys(("mlp_extractor", "action_net", "value_net"),
                    "the actor's and the critic's MLPs, output layers included, are the two members of "
                    "model.policy.body (0: the actor, 1: the critic), and model.policy(obs) returns (actor output, "
                    "values)"),
}

#: ... of RecurrentPPO's `model.policy` (`RecurrentActorCritic`; sb3-contrib's `RecurrentActorCriticPolicy`)
SB3_RECURRENT_ATTRIBUTES = {
    **SB3_ACTOR_CRITIC_ATTRIBUTES,
    "predict_values": "V(obs) is model.policy.value_step(obs, state) for the LSTM state [4, N, H] "
                      "(model.policy.initial_state(N) at episode starts), of shape [N]",
    **dict.fromkeys(("get_distribution", "evaluate_actions"),
                    "model.policy.act_step(obs, state) steps both LSTMs and returns (actions, log_probs, values, next "
                    "state), and model.policy.evaluate(model.policy.sequence_features(obs, state, episode_starts), "
                    "actions) evaluates stored sequences"),
    **dict.fromkeys(("features_extractor", "pi_features_extractor", "vf_features_extractor", "extract_features"),
                    "the observation encoder is model.policy.obs_encoder (None for vector observations, which the "
                    "LSTMs take flattened as they are)"),
}

#: ... of DQN's `model.policy` (`QNetwork`)
SB3_Q_NETWORK_ATTRIBUTES = {
    **SB3_NETWORK_ATTRIBUTES,
    "q_net": "DQN's model.policy is the Q-network itself (model.q_network), and model.policy(obs) returns the "
             "Q-values [B, n]",
    "q_net_target": "DQN's target network is model.q_target",
}

#: ... of SAC's `model.policy` (its actor, `SquashedGaussianActor`)
SB3_SAC_ACTOR_ATTRIBUTES = {
    **SB3_NETWORK_ATTRIBUTES,
    **dict.fromkeys(("actor", "critic", "critic_target"),
                    "SAC's model.policy is the actor itself (model.actor), and the critics are model.critic and "
                    "model.critic_target"),
    "action_log_prob": "model.actor.sample(obs) returns (actions in [-1, 1], log_probs)",
    "get_action_dist_params": "model.actor(obs) returns the Gaussian's (mean, log_std) before the tanh",
}

#: ... of TD3's and DDPG's `model.policy` (their actor, `DeterministicActor`)
SB3_DETERMINISTIC_ACTOR_ATTRIBUTES = {
    **SB3_NETWORK_ATTRIBUTES,
    **dict.fromkeys(("actor", "actor_target", "critic", "critic_target"),
                    "TD3's and DDPG's model.policy is the actor itself (model.actor, its target model.actor_target), "
                    "and the critics are model.critic and model.critic_target"),
}

#: ... of SAC's, TD3's and DDPG's `model.critic` (`QEnsemble`)
SB3_CRITIC_ATTRIBUTES = {
    **SB3_NETWORK_ATTRIBUTES,
    **dict.fromkeys(("q1_forward", "q_networks"),
                    "model.critic(obs, actions) returns every critic's Q-values as one tensor [n_critics, B], the "
                    "first critic's at [0] (SB3's: a tuple of [B, 1] tensors)"),
}


class SB3Names:
    """Mixin of the networks a model exposes: an attribute of Stable-Baselines3's policies that the network lacks
    (`sb3_names`) raises an AttributeError saying what to use instead, where torch's says only "no attribute"; any
    other missing attribute stays torch's (hasattr and getattr defaults work)."""

    sb3_names: ClassVar[dict[str, str]] = SB3_NETWORK_ATTRIBUTES

    if not TYPE_CHECKING:  # (type checkers see nn.Module's __getattr__: submodules and parameters)
        def __getattr__(self, name: str):
            # (only for names that are neither in the instance's nor the class's dict: submodules and parameters, then
            # Stable-Baselines3's names)
            try:
                return nn.Module.__getattr__(self, name)
            except AttributeError:
                advice = type(self).sb3_names.get(name)
                if advice is None:
                    raise
            raise AttributeError(f"{type(self).__name__}.{name} is Stable-Baselines3's; {advice}.")


class Encoder(nn.Module):
    """Observation batch (in its stored dtype) -> float features `[B, features_dim]`. `kind` names it in reports."""

    features_dim: int
    kind: str = "encoder"


def of_rlspeed(value: object) -> bool:
    """Whether `value`'s class is one of rlspeed's (else the user's own: an encoder a subclass's `_make_encoder`
    returns, a network of theirs)."""
    return type(value).__module__.startswith("rlspeed.")


def _init_conv_net(module: nn.Module) -> None:
    """Orthogonal initialisation with gain sqrt(2) for every conv and linear layer, zero biases (SB3's actor-critic
    policies initialise their features extractors so; its DQN, SAC and TD3 keep PyTorch's default)."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(layer.weight, math.sqrt(2))
            nn.init.zeros_(layer.bias)


class CNNEncoder(Encoder):
    """An image encoder: the image to float on the device (uint8 images in [0, 255] scaled to [0, 1] when
    `normalize_images`; any other 3-D Box, float images in [0, 1] for one, as it is), channels-last images permuted
    to channels first (`box_channels_first`), then convolutions and one ReLU linear layer of `features_dim`.

    `arch` (`CNN_KINDS`): `nature`, Nature-DQN's CNN (Mnih et al., 2015; SB3's `NatureCNN`): 32 8x8/4, 64 4x4/2, 64
    3x3/1, for both sides >= 36 pixels; `strided`, Nature's channels in 3x3 kernels: 32 3x3/2 and 64 3x3/2 (padded
    by one: each halves the image), 64 3x3/1, for both sides >= 9 (auto: 16 to 35 pixels, where the small CNN's
    linear layer grows with the image's area: 15.7 million weights at 35x35); `small`, 16 and 32 3x3/1 convolutions
    that keep the image's size (padded when a side is below 5; auto: MinAtar's 10x10, MiniGrid's 7x7). `auto` picks
    by the smaller side; `nature_or_small`, the rule before `strided`, takes `nature` from 36 pixels, else `small`.
    """

    def __init__(self, space: gym.spaces.Box, features_dim: int = 512, normalize_images: bool = True,
                 arch: str = "auto"):
        super().__init__()
        channels_first = box_channels_first(space)
        if channels_first is None:
            raise UserError(f"A CNN encoder needs image observations (a 3-D Box, channels first or last), not {space}; "
                            f"{_cnn_fix(space)}.")
        self.channels_last = not channels_first
        channels, height, width = image_shape(space)
        #: the architecture built: nature, strided or small
        self.arch = cnn_arch(arch, height, width)
        self.kind = {"nature": "Nature CNN encoder", "strided": "strided CNN encoder",
                     "small": "small CNN encoder"}[self.arch]
        scale = normalize_images and image_channels_first(space) is not None and np.dtype(space.dtype) == np.uint8
        self.scale = 1.0 / 255.0 if scale else 1.0
        if self.arch == "nature":
            convs = [nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                     nn.Conv2d(64, 64, 3, stride=1), nn.ReLU()]
        elif self.arch == "strided":
            convs = [nn.Conv2d(channels, 32, 3, stride=2, padding=1), nn.ReLU(),
                     nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU()]
        else:
            padding = 0 if min(height, width) >= 5 else 1
            convs = [nn.Conv2d(channels, 16, 3, padding=padding), nn.ReLU(),
                     nn.Conv2d(16, 32, 3, padding=padding), nn.ReLU()]
        self.cnn = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            flat = self.cnn(torch.zeros(1, channels, height, width)).shape[1]
        self.linear = nn.Sequential(nn.Linear(flat, int(features_dim)), nn.ReLU())
        self.features_dim = int(features_dim)
        _init_conv_net(self)
        #: the memory layout the convolutions take their input in (`use_channels_last`)
        self.input_format = torch.preserve_format

    def use_channels_last(self) -> None:
        """Convolution weights and (from now on) the float input in channels-last memory (`to_device` decides)."""
        self.cnn.to(memory_format=torch.channels_last)
        self.input_format = torch.channels_last

    @property
    def nature(self) -> bool:
        """Whether it is Nature-DQN's CNN (`arch` nature)."""
        return self.arch == "nature"

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(self.conv_features(obs))

    def conv_features(self, obs: torch.Tensor) -> torch.Tensor:
        """The flattened output of the convolutions `[B, flat]` (what the linear layer takes)."""
        if self.channels_last:  # a view: NHWC memory read as NCHW (channels_last format, which conv2d takes)
            obs = obs.permute(0, 3, 1, 2)
        # The layout changes on the narrow dtype (uint8 or bool: a quarter of float32's bytes) and the image becomes
        # float in one pass; the [0, 1] scaling is folded into the first convolution's weights (conv(x * s, W) ==
        # conv(x, s * W)), so no full-size pass over the float image is spent on it.
        if self.input_format == torch.channels_last:
            obs = obs.contiguous(memory_format=torch.channels_last)
        x = obs.to(torch.float32)
        first = self.cnn[0]
        weight = first.weight * self.scale if self.scale != 1.0 else first.weight
        x = F.conv2d(x, weight, first.bias, first.stride, first.padding)
        for layer in list(self.cnn)[1:]:  # (slicing the Sequential would build a new module on every call)
            x = layer(x)
        return x


def image_side(space: gym.Space) -> int | None:
    """The smaller side in pixels of a 3-D Box read as an image (`image_shape`), else None: what `cnn=auto` picks the
    architecture by."""
    shape = image_shape(space)
    return None if shape is None else min(shape[1:])


def _refuse_unknown_cnn(cnn: str) -> None:
    """UserError where `cnn` is none of `CNN_KINDS`."""
    if cnn not in CNN_KINDS:
        raise UserError(f"Unknown cnn '{cnn}': use one of {', '.join(CNN_KINDS)}.")


def cnn_arch(cnn: str, height: int, width: int) -> str:
    """The CNN architecture (nature, strided or small) that `cnn` (`CNN_KINDS`) gives images of `height` x `width`
    pixels; UserError for an unknown kind or an image too small for the kind asked for."""
    _refuse_unknown_cnn(cnn)
    side = min(height, width)
    if cnn == "auto":
        cnn = "nature" if side >= NATURE_CNN_MIN_SIDE else "strided" if side >= STRIDED_CNN_MIN_SIDE else "small"
    elif cnn == "nature_or_small":
        cnn = "nature" if side >= NATURE_CNN_MIN_SIDE else "small"
    least = {"nature": NATURE_CNN_MIN_SIDE, "strided": STRIDED_CNN_LEAST_SIDE}.get(cnn, 1)
    if side < least:
        raise UserError(f"cnn={cnn} needs both image sides >= {least} pixels, and these images are {height}x{width}; "
                        f"use cnn=small or cnn=auto.")
    return cnn


class OneHotEncoder(Encoder):
    """Discrete observations (int64 indices `[B]`) or MultiDiscrete ones (`[B, k]`) as one-hot float vectors,
    concatenated over the k components (`features_dim` = n, or the sum of nvec)."""

    kind = "one-hot encoder"

    def __init__(self, space: gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        super().__init__()
        if isinstance(space, gym.spaces.Discrete):
            sizes, starts = np.array([int(space.n)]), np.array([int(space.start)])
            self.single = True
        else:
            sizes, starts = space.nvec.reshape(-1).astype(np.int64), np.broadcast_to(space.start, space.nvec.shape)
            starts = np.asarray(starts).reshape(-1).astype(np.int64)
            self.single = False
        self.features_dim = int(sizes.sum())
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])) - starts  # index of value v in component i: v + offset
        self.register_buffer("offsets", torch.as_tensor(offsets, dtype=torch.int64), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        index = (obs.unsqueeze(-1) if self.single else obs.flatten(1)).long() + self.offsets
        out = torch.zeros(index.shape[0], self.features_dim, device=index.device)
        return out.scatter(1, index, 1.0)  # (out of place: the populations' vmapped encoders take it)


class FlattenEncoder(Encoder):
    """Non-float vectors (MultiBinary, bool or integer Boxes; images with encoder=mlp) flattened to float, uint8
    images scaled to [0, 1] when `normalize_images`. (Float vectors need no encoder: `encoder is None`.)"""

    kind = "flatten encoder"

    def __init__(self, space: gym.Space, normalize_images: bool = True):
        super().__init__()
        shape, _ = observation_layout(space)
        self.features_dim = int(np.prod(shape)) if shape else 1
        image = image_channels_first(space) is not None and np.dtype(space.dtype) == np.uint8
        self.scale = 1.0 / 255.0 if image and normalize_images else 1.0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(obs.shape[0], self.features_dim).to(torch.float32)  # (-1 is ambiguous for a batch of 0)
        return x * self.scale if self.scale != 1.0 else x


class MultiInputEncoder(Encoder):
    """Dict observations: one encoder per key (`make_encoder` of its space; float vectors flattened as they are),
    the features concatenated in the space's key order (SB3's `CombinedExtractor`)."""

    kind = "multi-input encoder"

    def __init__(self, space: gym.spaces.Dict, encoder: str = "auto", cnn_features_dim: int = 512,
                 normalize_images: bool = True, cnn: str = "auto"):
        super().__init__()
        self.keys = list(space.spaces)
        self.encoders = nn.ModuleDict()
        dims = 0
        for key, sub in space.spaces.items():
            if box_channels_first(sub) is None and encoder == "cnn":
                sub_choice = "auto"  # encoder=cnn for a Dict: its image keys get CNNs, the others their own encoder
            else:
                sub_choice = encoder
            module = _make_encoder(sub, sub_choice, cnn_features_dim, normalize_images, cnn, key)
            if module is None:  # a float vector: flattened as it is
                dims += int(np.prod(sub.shape)) if sub.shape else 1
            else:
                self.encoders[key] = module
                dims += module.features_dim
        self.features_dim = dims
        kinds = sorted({module.kind.removesuffix(" encoder") for module in self.encoders.values()})
        self.kind = "multi-input encoder" + (f" with {' and '.join(kinds)} parts" if kinds else "")

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.encoders[key](obs[key]) if key in self.encoders else obs[key].flatten(1).to(torch.float32)
                 for key in self.keys]
        return torch.cat(parts, dim=1)


def make_encoder(space: gym.Space, encoder: str = "auto", cnn_features_dim: int = 512,
                 normalize_images: bool = True, cnn: str = "auto") -> Encoder | None:
    """The encoder for an observation space (an `EnvSpec.observation_space`), or None for float vectors (the heads
    take the flattened observation).

    `encoder="auto"`: images (`image_channels_first`) get a CNN (`CNNEncoder`), Discrete and MultiDiscrete
    observations a one-hot encoding, MultiBinary, bool and integer vectors a float flattening, Dict observations one
    encoder per key (`MultiInputEncoder`). `mlp`: images flattened too (scaled to [0, 1]). `cnn`: a CNN, which takes
    any 3-D Box as an image (`box_channels_first`; SB3's CnnPolicy with `normalize_images=False`): float images in
    [0, 1] and uint8 Boxes of other bounds unscaled (or a Dict with such keys). UserError for spaces no encoder
    handles. `cnn_features_dim`: the output width of each CNN (SB3's `features_dim`); `normalize_images`: uint8 images
    in [0, 255] scaled to [0, 1] on the device (False: their raw values, as floats); `cnn`: the CNNs' architecture
    (`CNN_KINDS`; `auto`: Nature-DQN's when both sides are >= 36 pixels, a strided 3x3 one from 16, else a small 3x3
    one).
    """
    return _make_encoder(space, encoder, cnn_features_dim, normalize_images, cnn)


def _make_encoder(space: gym.Space, encoder: str, cnn_features_dim: int, normalize_images: bool, cnn: str,
                  key: str | None = None) -> Encoder | None:
    """`make_encoder`; `key`: the Dict observation's key `space` is (named in the warnings about it), None for the
    whole observation."""
    if encoder not in ENCODERS:
        raise UserError(f"Unknown encoder '{encoder}': use one of {', '.join(ENCODERS)}.")
    if cnn_features_dim < 1:
        raise UserError(f"cnn_features_dim must be >= 1, got {cnn_features_dim}.")
    _refuse_unknown_cnn(cnn)  # (here too: images or not, as an unknown encoder is)
    if not isinstance(space, (gym.spaces.Dict, gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                              gym.spaces.MultiBinary)):
        space = check_observation_space(space, "this env")  # a Tuple becomes a Dict; others get the one sentence
    if isinstance(space, gym.spaces.Dict):
        if encoder == "cnn" and not any(box_channels_first(sub) is not None for sub in space.spaces.values()):
            raise UserError(f"encoder=cnn needs image observations, and this Dict observation has no 3-D Box key "
                            f"(keys: {', '.join(space.spaces)}); use encoder=auto.")
        return MultiInputEncoder(space, encoder, cnn_features_dim, normalize_images, cnn)
    image = image_channels_first(space) is not None
    if encoder == "cnn" or (encoder == "auto" and image):
        module = CNNEncoder(space, cnn_features_dim, normalize_images, cnn)
        _warn_large_cnn(module, space, key)
        return module
    if encoder == "auto":
        _warn_image_like(space, key)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return OneHotEncoder(space)
    _, dtype = observation_layout(space)
    if dtype == torch.float32:
        return None
    return FlattenEncoder(space, normalize_images)


def _observations(shape: tuple, key: str | None) -> str:
    """'Observations of shape S', or for a Dict observation's `key`, "The 'key' observations of shape S"."""
    return f"Observations of shape {shape}" if key is None else f"The '{key}' observations of shape {shape}"


def _warn_image_like(space: gym.Space, key: str | None = None) -> None:
    """A warning where `auto` flattens a Box that holds images the CNN does not take by itself: a uint8 Box in
    [0, 255] of 2 dimensions (a frame without its channel axis) or of 4 or more (stacked colour frames), or a bounded
    3-D Box of another dtype or bounds (float images in [0, 1]: SB3's env checker warns of those), which an MLP then
    takes pixel by pixel (as Stable-Baselines3's MlpPolicy would). `key`: the Dict observation's key it is, named."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) < 2 or sorted(space.shape)[-2] < 8:
        return
    shape, size = tuple(space.shape), int(np.prod(space.shape))
    if len(shape) == 3:
        if image_channels_first(space) is not None or not space.is_bounded("both"):  # (images have bounds)
            return
        low, high = np.min(space.low), np.max(space.high)
        warn_at_caller(f"{_observations(shape, key)} ({np.dtype(space.dtype)} in [{low:g}, {high:g}]) look like "
                       f"images, but only uint8 Boxes in [0, 255] and bool Boxes get a CNN by themselves: they are "
                       f"flattened into an MLP input of {size:,} values; pass encoder='cnn' (--set encoder=cnn) for a "
                       f"CNN over them as they are (unscaled), or encoder='mlp' (--set encoder=mlp) to keep the MLP "
                       "without this warning.", EncoderWarning)
        return
    if np.dtype(space.dtype) != np.uint8 or np.any(space.low != 0) or np.any(space.high != 255):
        return
    warn_at_caller(f"{_observations(shape, key)} (uint8 in [0, 255]) look like images, but the CNN encoder takes one "
                   f"3-D image (channels first or last): they are flattened into an MLP input of {size:,} values; "
                   f"{_cnn_fix(space)}, or pass encoder='mlp' (--set encoder=mlp) to keep the MLP without this "
                   "warning.", EncoderWarning)


def _warn_large_cnn(cnn: CNNEncoder, space: gym.Space, key: str | None = None) -> None:
    """A warning where a CNN's linear layer has more than `LARGE_CNN_WEIGHTS` weights, which makes every update slow
    (SB3's NatureCNN builds the same layer for large images and fails for small ones); `key`: the Dict observation's
    key of the images, named."""
    layer = cnn.linear[0]
    weights = layer.in_features * layer.out_features
    if weights <= LARGE_CNN_WEIGHTS:
        return
    _, height, width = image_shape(space)
    if cnn.nature:
        fix = "resize the images with gymnasium.wrappers.ResizeObservation(env, (84, 84)) (Atari's size)"
    else:
        fix = (f"resize the images to at least {NATURE_CNN_MIN_SIDE}x{NATURE_CNN_MIN_SIDE} with "
               f"gymnasium.wrappers.ResizeObservation (the Nature CNN strides over them: at "
               f"{NATURE_CNN_MIN_SIDE}x{NATURE_CNN_MIN_SIDE} its linear layer takes 64 convolution outputs)")
        if cnn.arch == "small" and min(height, width) >= STRIDED_CNN_LEAST_SIDE:
            fix = f"pass cnn='strided' (--set cnn=strided; its two stride-2 convolutions quarter the image), or {fix}"
    images = f"{height}x{width} images" + (f" ('{key}')" if key is not None else "")
    warn_at_caller(f"The {cnn.kind} of {images} has {weights / 1e6:.1f} million weights in its linear "
                   f"layer ({layer.in_features:,} convolution outputs x cnn_features_dim {layer.out_features}), which "
                   f"makes every update slow: {fix}, or lower cnn_features_dim.", EncoderWarning)


def _cnn_fix(space: gym.Space) -> str:
    """What makes `space` a 3-D image for a CNN (the fix a refusal or a warning names)."""
    shape = tuple(getattr(space, "shape", None) or ())
    if len(shape) == 2:
        return (f"give the frame a channel axis (gymnasium.wrappers.ReshapeObservation(env, {(1, *shape)}), "
                "GrayscaleObservation(env, keep_dim=True) or AtariPreprocessing(grayscale_newaxis=True))")
    if len(shape) == 4 and (shape[-1] == 1 or int(np.argmin(shape[1:])) == 0):
        # stacked frames of one channel (GrayscaleObservation(keep_dim=True) then FrameStackObservation: (4, H, W, 1))
        # or channels first (4, C, H, W): a reshape folds the stack into the channel axis, channels first
        folded = (shape[0], *shape[1:3]) if shape[-1] == 1 else (shape[0] * shape[1], *shape[2:])
        return (f"fold the stacked frames into the channel axis (gymnasium.wrappers.ReshapeObservation(env, "
                f"{folded}); grey frames made without keep_dim stack to that shape)")
    if len(shape) > 3:
        return ("fold the stacked frames into the channel axis (grey frames: GrayscaleObservation(env) without "
                "keep_dim, or AtariPreprocessing, then FrameStackObservation give (4, 84, 84)), or reshape them to "
                "one 3-D image")
    return "use encoder=auto"


def encoder_from_config(space: gym.Space, config) -> Encoder | None:
    """`make_encoder` with a config's `encoder`, `cnn_features_dim`, `normalize_images` and `cnn` (defaults where
    the config has none)."""
    return make_encoder(space, getattr(config, "encoder", "auto"), getattr(config, "cnn_features_dim", 512),
                        getattr(config, "normalize_images", True), getattr(config, "cnn", "auto"))


def encoder_kind(*modules: nn.Module) -> str | None:
    """The kind of the first non-MLP encoder among these networks (their `encoder` attribute), or None when all of
    them take flattened float vectors: what `unsupported_reason` of a hand-derived update names."""
    for module in modules:
        found = getattr(module, "encoder", None)
        if found is not None:
            return getattr(found, "kind", type(found).__name__)
    return None


def _encode(encoder: Encoder | None, obs: Observation) -> torch.Tensor:
    """Features of an observation batch: the encoder's, or the flattened float vector."""
    return obs.flatten(1) if encoder is None else encoder(obs)


class EnsembleMLP(nn.Module):
    """K MLPs of the same shape evaluated together: each layer is one batched matmul (`baddbmm`) for all K.

    For small RL networks the cost is per kernel launch, not per FLOP, so K networks cost about as much as one.
    Input `[B, in]` (shared by all members) or `[K, B, in]`; output `[K, B, out]`. Member k is initialised like
    `mlp(...)` with `out_gains[k]` on its last layer.
    """

    def __init__(self, num_members: int, in_dim: int, hidden: Sequence[int], out_dim: int, activation: str = "tanh",
                 out_gains: Sequence[float] | None = None):
        super().__init__()
        self.activation = activation_layer(activation)
        self.num_members = num_members
        out_gains = list(out_gains) if out_gains is not None else [1.0] * num_members
        dims = [in_dim, *[int(w) for w in hidden], out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for layer, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
            last = layer == len(dims) - 2
            weight = torch.empty(num_members, fan_in, fan_out)
            for k in range(num_members):
                # orthogonal_ on the [out, in] view, as nn.Linear would be initialised
                nn.init.orthogonal_(weight[k].T, out_gains[k] if last else math.sqrt(2))
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.zeros(num_members, 1, fan_out)))

    def forward(self, x: torch.Tensor, members: slice | None = None, detached: bool = False,
                with_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Outputs `[K, B, out]`. `members` (a slice) evaluates only those members, e.g. `slice(0, 1)`;
        `detached` uses the weights as constants: gradients flow to `x` only (e.g. an actor's loss through a critic);
        `with_hidden` also returns the last layer's input `[K, B, width]` (the last hidden features, or `x` without
        hidden layers): gSDE's latent features (`rlspeed.sde`).
        """
        num_members = self.num_members if members is None else len(range(self.num_members)[members])
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(num_members, -1, -1)
        # (the ParameterLists' own dicts, read as their `[i]` reads them, functional_call's substitutes included:
        # iterating a ParameterList costs about 5 us a layer, several times a small network's kernels)
        weights, biases = self.weights._parameters.values(), self.biases._parameters.values()
        last = len(weights) - 1
        for layer, (weight, bias) in enumerate(zip(weights, biases)):
            if members is not None:
                weight, bias = weight[members], bias[members]
            if detached:
                weight, bias = weight.detach(), bias.detach()
            hidden = x
            x = ensemble_linear(x, weight, bias)
            if layer < last:
                x = self.activation(x)
        return (x, hidden) if with_hidden else x


def ensemble_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`bias + x @ weight` for every member (`x` `[K, B, in]`, `weight` `[K, in, out]`, `bias` `[K, 1, out]`), as
    autograd differentiates it; on a CPU a 1-wide output (a Q head) as a multiply and a sum, which MKL's batched
    product runs several times slower (see `rlspeed.fused.flat.THIN_COLUMNS`; benchmarks/thin_products.py)."""
    if weight.shape[-1] == 1 and x.device.type == "cpu":
        return (x * weight.transpose(-1, -2)).sum(-1, keepdim=True) + bias
    return torch.baddbmm(bias, x, weight)


class QEnsemble(SB3Names, nn.Module):
    """K state-action value networks Q_k(s, a) held as one `EnsembleMLP`: all K evaluated in one batched pass.

    Used for the twin critics of SAC and TD3 (K=2) and DDPG's single critic (K=1). `forward(obs, actions)`
    takes observations `[B, ...]` and actions `[B, action_dim]` and returns Q-values `[K, B]`. With an `encoder`
    (images, Dict observations), the K members share it (SB3's critics share one features extractor).
    """

    sb3_names = SB3_CRITIC_ATTRIBUTES

    def __init__(self, num_members: int, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256),
                 activation: str = "relu", encoder: Encoder | None = None):
        super().__init__()
        self.num_members = num_members
        self.encoder = encoder
        in_dim = encoder.features_dim if encoder is not None else obs_dim
        self.body = EnsembleMLP(num_members, in_dim + action_dim, hidden, 1, activation)

    def features(self, obs: Observation) -> torch.Tensor:
        """The members' shared input features of an observation batch `[B, F]`."""
        return _encode(self.encoder, obs)

    def head(self, features: torch.Tensor, actions: torch.Tensor, members: slice | None = None,
             detached: bool = False) -> torch.Tensor:
        """Q-values `[K, B]` from `features` (see `forward`)."""
        return self.body(torch.cat((features, actions), dim=-1), members, detached).squeeze(-1)

    def forward(self, obs: Observation, actions: torch.Tensor, members: slice | None = None,
                detached: bool = False) -> torch.Tensor:
        """Q-values `[K, B]` (or `[len(members), B]` for a slice of the members); see `EnsembleMLP.forward`.
        `detached` also keeps gradients out of the encoder."""
        features = self.features(obs)
        return self.head(features.detach() if detached and self.encoder is not None else features, actions,
                         members, detached)


# --- action distributions -----------------------------------------------------------------------------------------
ACTION_KINDS = ("categorical", "multi_categorical", "bernoulli", "gaussian")


def action_kind(space: gym.Space) -> str:
    """The distribution a policy uses for an action space: categorical (Discrete), multi_categorical
    (MultiDiscrete: one categorical per component), bernoulli (MultiBinary: one Bernoulli per bit) or gaussian
    (Box of any shape, flattened)."""
    if isinstance(space, gym.spaces.Discrete):
        return "categorical"
    if isinstance(space, gym.spaces.MultiDiscrete):
        return "multi_categorical"
    if isinstance(space, gym.spaces.MultiBinary):
        return "bernoulli"
    return "gaussian"


def action_head_size(space: gym.Space) -> int:
    """Outputs of the actor head: n logits (Discrete), sum(nvec) logits (MultiDiscrete), one logit per bit
    (MultiBinary), the flattened Box size (Gaussian mean)."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return int(np.prod(space.shape))


def env_actions(actions: torch.Tensor, kind: str, shape: tuple[int, ...], low: torch.Tensor | None = None,
                high: torch.Tensor | None = None) -> torch.Tensor:
    """The env's actions from a policy's (`action_kind` `kind`) flat actions `[B, ...]`: Discrete indices as they are;
    Gaussian samples clipped to the Box's [`low`, `high`]; MultiDiscrete, MultiBinary and Box actions in the space's
    `shape` (a view)."""
    if kind == "categorical":
        return actions
    if kind == "gaussian":
        actions = torch.maximum(torch.minimum(actions, high), low)
    return actions if len(shape) == 1 else actions.reshape(actions.shape[0], *shape)


def masked_logits(logits: torch.Tensor, action_masks: torch.Tensor | None) -> torch.Tensor:
    """Logits with masked actions (False in the bool mask) set to the dtype's lowest finite value: after the softmax
    their probability is exactly 0 (exp underflows), and nothing is -inf, so entropies and gradients stay finite.
    A row must allow at least one action (the env adapters and `predict` check that at the boundary)."""
    if action_masks is None:
        return logits
    return torch.where(action_masks, logits, torch.finfo(logits.dtype).min)


def _categorical_sample(log_p: torch.Tensor, deterministic: bool) -> torch.Tensor:
    if deterministic:
        return log_p.argmax(-1)
    # Gumbel-max with -log(E), E ~ Exp(1), as the Gumbel noise: four kernels, no distribution object. A masked
    # action's log-prob is the dtype's minimum: no finite noise lifts it above an allowed one.
    return (log_p - torch.empty_like(log_p).exponential_().log_()).argmax(-1)


def categorical_entropy(log_p: torch.Tensor, action_masks: torch.Tensor | None) -> torch.Tensor:
    """-sum p log p over the allowed actions (a masked action has p = 0 and adds nothing)."""
    terms = log_p.exp() * log_p
    if action_masks is not None:
        terms = torch.where(action_masks, terms, 0.0)
    return -terms.sum(-1)


class ActorCritic(SB3Names, nn.Module):
    """Actor and critic MLPs (same hidden sizes, separate weights) evaluated as one two-member ensemble.

    The actor's output parameterises the action distribution (`action_kind` of the action space): logits of a
    categorical (Discrete; masked by a bool `[B, n]` action mask where the env gives one), logits of one categorical
    per component (MultiDiscrete, actions `[B, k]`, masks `[B, sum(nvec)]` split per component as sb3-contrib does,
    log-probs and entropies summed), one logit per bit (MultiBinary, independent Bernoullis, actions float `[B, n]`)
    or the mean of a diagonal Gaussian with a state-independent `log_std` (Box of any shape, flattened to
    `[B, prod(shape)]` here; the algorithm reshapes for the env). `act` samples; `evaluate` gives log-prob, entropy
    and value of stored actions.

    The MLPs take the observation's features: with an `encoder` (images, Dict, Discrete observations; `make_encoder`)
    its output, shared by actor and critic (SB3's `share_features_extractor`), else the flattened float observation.

    Arguments: `obs_dim`, the flattened observation's size (the MLPs' input without an encoder); `action_space`, which
    sets the distribution and the actor's output size (without it: `discrete` says categorical or Gaussian, with
    `action_dim` logits or means); `hidden`, both MLPs' hidden widths; `activation`, a name of `ACTIVATIONS`;
    `log_std_init`, the Gaussian's initial log standard deviation; `encoder`, as above. A subclass with a network of
    its own (docs/algorithms.md) overrides `forward(obs) -> (actor output, value)`, which `act`, `evaluate`, `value`
    and the export call.
    """

    sb3_names = SB3_ACTOR_CRITIC_ATTRIBUTES

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, hidden: Sequence[int] = (64, 64),
                 activation: str = "tanh", log_std_init: float = 0.0, encoder: Encoder | None = None,
                 action_space: gym.Space | None = None):
        super().__init__()
        if action_space is not None:
            self.kind = action_kind(action_space)
            action_dim = action_head_size(action_space)
        else:
            self.kind = "categorical" if discrete else "gaussian"
        self.discrete = self.kind == "categorical"
        #: component sizes of a MultiDiscrete action (the logits are split into these)
        self.nvec = (tuple(int(n) for n in action_space.nvec.reshape(-1)) if self.kind == "multi_categorical"
                     else None)
        self.action_dim = action_dim
        self.encoder = encoder
        in_dim = encoder.features_dim if encoder is not None else obs_dim
        # member 0 = actor (small last-layer gain: near-uniform initial policy), member 1 = critic
        self.body = EnsembleMLP(2, in_dim, hidden, action_dim, activation, out_gains=(0.01, 1.0))
        if self.kind == "gaussian":
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def features(self, obs: Observation) -> torch.Tensor:
        """What the MLPs take: the encoder's features, or the flattened float observation `[B, obs_dim]`."""
        return _encode(self.encoder, obs)

    def value(self, obs: Observation) -> torch.Tensor:
        """V(obs) `[B]`: the critic output of `forward`."""
        return self(obs)[1]

    def forward(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor output, value): logits or Gaussian mean `[B, A]`, and V(obs) `[B]`."""
        out = self.body(self.features(obs))
        return out[0], out[1, :, 0]

    def act(self, obs: torch.Tensor, deterministic: bool = False,
            action_masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions (the mode when `deterministic`), never a masked one. Returns (actions, log_probs, values)."""
        out, value = self(obs)
        actions, log_probs = self.sample(out, deterministic, action_masks)
        return actions, log_probs, value

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor,
                 action_masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_probs, entropy, values) of given actions under the current policy (masked as when they were taken)."""
        out, value = self(obs)
        log_prob, entropy = self.log_prob_entropy(out, actions, action_masks)
        return log_prob, entropy, value

    def sample(self, out: torch.Tensor, deterministic: bool = False,
               action_masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions, log_probs) from the actor's output `[B, A]`."""
        kind = self.kind
        if kind == "categorical":
            log_p = torch.log_softmax(masked_logits(out, action_masks), dim=-1)
            actions = _categorical_sample(log_p, deterministic)
            return actions, log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        if kind == "multi_categorical":
            logits = masked_logits(out, action_masks).split(self.nvec, dim=-1)
            parts, log_prob = [], None
            for component in logits:
                log_p = torch.log_softmax(component, dim=-1)
                choice = _categorical_sample(log_p, deterministic)
                parts.append(choice)
                term = log_p.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
                log_prob = term if log_prob is None else log_prob + term
            return torch.stack(parts, dim=-1), log_prob
        if kind == "bernoulli":
            if deterministic:
                actions = (out > 0).to(out.dtype)
            else:
                actions = (torch.rand_like(out) < torch.sigmoid(out)).to(out.dtype)
            return actions, bernoulli_log_prob(actions, out)
        std = self.log_std.exp()
        actions = out if deterministic else out + std * torch.randn_like(out)
        return actions, gaussian_log_prob(actions, out, self.log_std)

    def mode(self, out: torch.Tensor, action_masks: torch.Tensor | None = None) -> torch.Tensor:
        """The deterministic action for the actor's output `[B, A]` (what `sample(deterministic=True)` gives): the
        argmax of the (masked) logits, logit > 0 per bit, the Gaussian mean; without the log-probabilities (`predict`
        and the export need the action alone)."""
        kind = self.kind
        if kind == "categorical":
            return _categorical_sample(torch.log_softmax(masked_logits(out, action_masks), dim=-1), True)
        if kind == "multi_categorical":
            logits = masked_logits(out, action_masks).split(self.nvec, dim=-1)
            return torch.stack([_categorical_sample(torch.log_softmax(component, dim=-1), True)
                                for component in logits], dim=-1)
        if kind == "bernoulli":
            return (out > 0).to(out.dtype)
        return out

    def log_prob_entropy(self, out: torch.Tensor, actions: torch.Tensor,
                         action_masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(log_probs, entropy) `[B]` of `actions` under the actor's output `out`."""
        kind = self.kind
        if kind == "categorical":
            log_p = torch.log_softmax(masked_logits(out, action_masks), dim=-1)
            log_prob = log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return log_prob, categorical_entropy(log_p, action_masks)
        if kind == "multi_categorical":
            logits = masked_logits(out, action_masks).split(self.nvec, dim=-1)
            masks = action_masks.split(self.nvec, dim=-1) if action_masks is not None else [None] * len(self.nvec)
            log_prob = entropy = None
            for i, (component, mask) in enumerate(zip(logits, masks)):
                log_p = torch.log_softmax(component, dim=-1)
                term = log_p.gather(-1, actions[:, i].long().unsqueeze(-1)).squeeze(-1)
                ent = categorical_entropy(log_p, mask)
                log_prob = term if log_prob is None else log_prob + term
                entropy = ent if entropy is None else entropy + ent
            return log_prob, entropy
        if kind == "bernoulli":
            # H = softplus(l) - l sigmoid(l) per bit, summed
            entropy = (F.softplus(out) - out * torch.sigmoid(out)).sum(-1)
            return bernoulli_log_prob(actions, out), entropy
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum().expand(out.shape[0])
        return gaussian_log_prob(actions, out, self.log_std), entropy


def bernoulli_log_prob(actions: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Log-probability of 0/1 `actions` under independent Bernoullis with these logits, summed over the bits:
    a log sigmoid(l) + (1 - a) log sigmoid(-l) = a l - softplus(l)."""
    return (actions * logits - F.softplus(logits)).sum(-1)


def gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the action dimension."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


# Where torch._dynamo is not imported nothing can be compiling, and torch's wrappers that keep torch.compile out of an
# optimizer's methods (`torch._disable_dynamo`, `_use_grad_for_differentiable`'s graph breaks) do nothing but import it
# (a large part of a fresh process's start; docs/checkpoints.md). Building, saving, loading and stepping an optimizer
# skip that import there (`optimizers_without_dynamo`, `zero_grad_without_dynamo`, `step_without_dynamo`); where a
# torch release wraps these methods otherwise, they are called as torch made them, which imports it.

#: torch.optim.Optimizer's methods that torch wraps in `torch._disable_dynamo`, whose first call imports torch._dynamo,
#: compiling or not: building, saving and loading an optimizer call them
_DYNAMO_DISABLED_OPTIMIZER_METHODS = ("add_param_group", "state_dict", "load_state_dict")


def _dynamo_imported() -> bool:
    """Whether torch._dynamo is imported (only then can anything be compiling)."""
    return "torch._dynamo" in sys.modules


@contextlib.contextmanager
def optimizers_without_dynamo() -> Iterator[None]:
    """Within it, torch optimizers are built, saved and loaded without importing torch._dynamo where nothing has
    imported it before the block: their methods' `torch._disable_dynamo` wrappers call them directly, which is what the
    wrappers do where torch._dynamo is not imported (nothing can be compiling). After the block the wrappers are as
    torch made them; where torch._dynamo was imported before it, the block changes nothing. Where a torch release
    wraps these methods otherwise, torch._dynamo is imported as before."""
    if _dynamo_imported():
        yield
        return
    # (`_disable_dynamo`'s wrapper calls what it finds in the attribute `__dynamo_disable` of the function it wraps,
    # `__wrapped__`, and puts torch._dynamo's disabled function there at its first call when the attribute is unset)
    methods = [getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
               for name in _DYNAMO_DISABLED_OPTIMIZER_METHODS]
    methods = [method for method in methods if callable(method) and "__dynamo_disable" not in vars(method)]
    for method in methods:
        setattr(method, "__dynamo_disable", method)
    try:
        yield
    finally:
        for method in methods:
            if vars(method).get("__dynamo_disable") is method:
                delattr(method, "__dynamo_disable")


@functools.cache
def _wrapper_code(decorator: str) -> object:
    """The code of the wrapper that torch's `decorator` (a dotted name) makes; None where this torch has none of
    that name or it makes none."""
    module, _, name = decorator.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)(lambda *args, **kwargs: None).__code__
    except Exception:  # noqa: BLE001  (another torch release: its methods are called as it makes them)
        return None


def _made_by(function: object, decorator: str) -> bool:
    """Whether `function` is the wrapper torch's `decorator` makes (its code: `functools.wraps` copies the name)."""
    code = _wrapper_code(decorator)
    return code is not None and getattr(function, "__code__", None) is code


def _zero_grad_unwrapped(optimizer: torch.optim.Optimizer) -> Callable[..., None] | None:
    """The method `optimizer.zero_grad`'s `torch._disable_dynamo` wrapper wraps (what the wrapper calls where nothing
    is compiling); None where the optimizer's own attribute replaces it or torch wraps it otherwise."""
    zero_grad = getattr(type(optimizer), "zero_grad", None)
    unwrapped = getattr(zero_grad, "__wrapped__", None)
    if "zero_grad" in vars(optimizer) or not callable(unwrapped) or not _made_by(zero_grad, "torch._disable_dynamo"):
        return None
    return unwrapped


#: each optimizer class's `step` as torch made it -> that step without torch._dynamo's import (None: torch made it
#: otherwise)
_STEPS_WITHOUT_DYNAMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_unwrapped(optimizer: torch.optim.Optimizer) -> Callable[..., object] | None:
    """`optimizer`'s `step` made again as torch makes it (`Optimizer.profile_hook_step`: the step hooks and the
    profiler's label, around `_use_grad_for_differentiable`: the grad mode, around the step itself) but for
    `_use_grad`'s import of torch._dynamo, for graph breaks that do nothing where nothing is compiling; None where the
    optimizer's own attribute replaces its class's (a learning-rate scheduler's counter), or where the step is not
    torch's own optimizer's as torch makes it (another release, a subclass's own `step`)."""
    hooked = getattr(type(optimizer), "step", None)
    if "step" in vars(optimizer) or not callable(hooked):
        return None
    if hooked in _STEPS_WITHOUT_DYNAMO:
        return _STEPS_WITHOUT_DYNAMO[hooked]
    use_grad = getattr(hooked, "__wrapped__", None)
    step = getattr(use_grad, "__wrapped__", None)
    profile_hook_step = getattr(torch.optim.Optimizer, "profile_hook_step", None)
    made = None
    # (torch's own optimizers' steps only: a subclass's step may call torch's, which would import it after all)
    if (getattr(hooked, "hooked", False) and callable(step) and callable(profile_hook_step)
            and str(getattr(step, "__module__", "")).startswith("torch.optim.")
            and _made_by(use_grad, "torch.optim.optimizer._use_grad_for_differentiable")):

        @functools.wraps(step)
        def with_grad_mode(self, *args, **kwargs):
            enabled = torch.is_grad_enabled()
            try:
                torch.set_grad_enabled(self.defaults["differentiable"])
                return step(self, *args, **kwargs)
            finally:
                torch.set_grad_enabled(enabled)

        made = profile_hook_step(with_grad_mode)
    _STEPS_WITHOUT_DYNAMO[hooked] = made
    return made


def steps_without_dynamo(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `zero_grad_without_dynamo` and `step_without_dynamo` reach this optimizer's methods without importing
    torch._dynamo (where nothing else imports it); False: they call its methods as torch made them, which import it."""
    return _zero_grad_unwrapped(optimizer) is not None and _step_unwrapped(optimizer) is not None


def zero_grad_without_dynamo(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.zero_grad(set_to_none=True)`, without importing torch._dynamo where nothing has imported it (the
    method its `torch._disable_dynamo` wrapper wraps, called as the wrapper calls it there); as torch made it where
    torch._dynamo is imported, where the optimizer's own attribute replaces it, or where torch wraps it otherwise."""
    zero_grad = None if _dynamo_imported() else _zero_grad_unwrapped(optimizer)
    if zero_grad is None:
        optimizer.zero_grad(set_to_none=True)
    else:
        zero_grad(optimizer, set_to_none=True)


def step_without_dynamo(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.step()`, without importing torch._dynamo where nothing has imported it: torch's step with its hooks,
    profiler label and grad mode (`_step_unwrapped`); as torch made it where torch._dynamo is imported, where the
    optimizer's own attribute replaces it, or where torch makes it otherwise."""
    step = None if _dynamo_imported() else _step_unwrapped(optimizer)
    if step is None:
        optimizer.step()
    else:
        step(optimizer)


def make_adam(params, lr: float, device: torch.device, eps: float = 1e-5) -> torch.optim.Optimizer:
    """Adam with the fused kernel where the backend has one (CPU and CUDA), else the foreach version."""
    params = list(params)
    if device.type in ("cpu", "cuda"):
        try:
            return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
        except (RuntimeError, TypeError):
            pass
    return torch.optim.Adam(params, lr=lr, eps=eps, foreach=True)


class SquashedGaussianActor(SB3Names, nn.Module):
    """pi(a|s): a = tanh(u), u ~ N(mu(s), sigma(s)); actions in [-1, 1] (the algorithm rescales them to the Box)."""

    sb3_names = SB3_SAC_ACTOR_ATTRIBUTES

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], activation: str = "relu",
                 encoder: Encoder | None = None):
        super().__init__()
        self.encoder = encoder
        in_dim = encoder.features_dim if encoder is not None else obs_dim
        self.net = mlp(in_dim, hidden, 2 * action_dim, activation, out_gain=0.01)

    def forward(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_std) of the Gaussian before the tanh squashing."""
        mean, log_std = self.net(_encode(self.encoder, obs)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample: (actions in [-1, 1], log_pi) with the tanh change-of-variables correction."""
        mean, log_std = self(obs)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        actions = torch.tanh(u)
        # log pi(a|s) = log N(u; mu, sigma) - sum log(1 - tanh(u)^2)   (SAC paper, appendix C), with
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) written in its numerically stable form.
        log_prob_u = -0.5 * noise.square() - log_std - 0.5 * LOG_2PI
        log_pi = (log_prob_u - 2 * (LOG_2 - u - F.softplus(-2 * u))).sum(-1)
        return actions, log_pi

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode's squashed mean, tanh(mu(s)): the action used for evaluation."""
        return torch.tanh(self(obs)[0])


class DeterministicActor(SB3Names, nn.Module):
    """mu(s) = tanh(MLP(s)): actions in [-1, 1] (the algorithm rescales them to the Box)."""

    sb3_names = SB3_DETERMINISTIC_ACTOR_ATTRIBUTES

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], activation: str = "relu",
                 encoder: Encoder | None = None):
        super().__init__()
        self.encoder = encoder
        in_dim = encoder.features_dim if encoder is not None else obs_dim
        self.net = mlp(in_dim, hidden, action_dim, activation, out_gain=0.01)

    def forward(self, obs: Observation) -> torch.Tensor:
        return torch.tanh(self.net(_encode(self.encoder, obs)))


class QNetwork(SB3Names, nn.Module):
    """Q(s, .) for all actions. Dueling (Wang et al., 2016): Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')."""

    sb3_names = SB3_Q_NETWORK_ATTRIBUTES

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int], activation: str = "relu",
                 dueling: bool = False, encoder: Encoder | None = None):
        super().__init__()
        self.dueling = dueling
        self.encoder = encoder
        in_dim = encoder.features_dim if encoder is not None else obs_dim
        if dueling:
            if not hidden:
                raise UserError("dueling=true needs at least one hidden layer in net_arch (the V and A heads branch "
                                "from the last one).")
            # shared body, then one linear layer giving V (column 0) and A (the other columns) together
            self.body = nn.Sequential(mlp(in_dim, hidden[:-1], hidden[-1], activation), activation_layer(activation))
            self.head = nn.Linear(hidden[-1], 1 + num_actions)
        else:
            self.body = mlp(in_dim, hidden, num_actions, activation)

    def forward(self, obs: Observation) -> torch.Tensor:
        obs = _encode(self.encoder, obs)
        if not self.dueling:
            return self.body(obs)
        return dueling_q_values(self.head(self.body(obs)))


def dueling_q_values(out: torch.Tensor) -> torch.Tensor:
    """Q `[..., n]` from a dueling head's output `[..., 1 + n]` (V, then A): V + A - mean_a' A (Wang et al., 2016)."""
    value, advantages = out[..., :1], out[..., 1:]
    return value + advantages - advantages.mean(dim=-1, keepdim=True)


class SequenceLayout:
    """Where each step of a `[T, B]` block of sequences sits when the block is cut into episode segments.

    An LSTM cannot reset its state in the middle of one fused call, so `RecurrentActorCritic.sequence_features`
    runs each segment (a stretch of one column between episode starts) as its own sequence: `rows` `[L, S]` picks
    segment s's step l from the `T * B` steps (padding repeats a valid step; its output is never read), `columns`
    and `continues` give each segment's column and whether it continues the column's stored initial state (it
    starts at t = 0) rather than a fresh episode, and `inverse` `[T * B]` puts the `L * S` outputs back in step
    order. Built on the host from the episode starts (one transfer per layout, not per step), its tensors made there
    by name (not on torch's default device, which a caller may have made another: `torch.set_default_device`).
    """

    def __init__(self, episode_starts: torch.Tensor, device: torch.device):
        starts = episode_starts.to("cpu", torch.bool)  # ok-sync: once per layout (per rollout or minibatch)
        steps, columns = starts.shape
        begins = starts.clone()
        begins[0] = True
        column, first = begins.T.nonzero(as_tuple=True)  # segments sorted by column, then by start
        same_column = torch.cat((column[1:] == column[:-1], column.new_zeros(1, dtype=torch.bool)))
        end = torch.where(same_column, torch.cat((first[1:], first.new_tensor([steps]))), steps)
        length = end - first
        self.num_segments, self.max_length = int(column.numel()), int(length.max())
        offset = torch.arange(self.max_length, device="cpu").view(-1, 1)
        valid = offset < length.view(1, -1)
        rows = (first.view(1, -1) + torch.minimum(offset, length.view(1, -1) - 1)) * columns + column.view(1, -1)
        inverse = torch.empty(steps * columns, dtype=torch.long, device="cpu")
        inverse[rows[valid]] = torch.arange(rows.numel(), device="cpu").view_as(rows)[valid]
        self.rows = rows.to(device)
        self.inverse = inverse.to(device)
        self.columns = column.to(device)
        self.continues = (first == 0).to(device)


def reset_at_episode_starts(state: torch.Tensor, episode_starts: torch.Tensor) -> torch.Tensor:
    """The recurrent `state` `[..., N, H]` zeroed in the rows of envs whose observation starts an episode
    (`episode_starts`, bool `[N]`): an LSTM starts every episode from zeros. The one place the rollout, `predict`,
    the update's sequence re-run and the exported policy reset the state; a multiply by 0/1 rather than a branch, so
    shapes stay fixed and nothing is read on the host (it runs inside captured and exported graphs)."""
    return state * (~episode_starts).to(state.dtype).view(-1, 1)


class RecurrentActorCritic(ActorCritic):
    """sb3-contrib's `MlpLstmPolicy` with `enable_critic_lstm`: an LSTM actor and an LSTM critic over the flat
    observation, each followed by an MLP head (`ActorCritic`'s two-member ensemble, fed the LSTM outputs).

    The recurrent state of N envs is one tensor `[4, N, H]`: (h, c) of the actor, then (h, c) of the critic.
    `act_step`/`value_step` advance it one step (the rollout, bootstrapping); `sequence_features` re-runs both LSTMs
    over stored sequences for the update, zeroing the state where an episode starts. With an `obs_encoder` (images,
    Dict, Discrete observations), both LSTMs take its features (one encoder, shared); the observations the methods
    below take are then in their stored layout (`encode` turns them into the LSTMs' input).
    """

    sb3_names = SB3_RECURRENT_ATTRIBUTES

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, lstm_hidden_size: int = 64,
                 hidden: Sequence[int] = (64,), activation: str = "relu", log_std_init: float = 0.0,
                 encoder: Encoder | None = None, action_space: gym.Space | None = None):
        if lstm_hidden_size < 1:
            raise UserError(f"lstm_hidden_size must be >= 1, got {lstm_hidden_size}: the LSTM needs a state.")
        super().__init__(lstm_hidden_size, action_dim, discrete, hidden, activation, log_std_init,
                         action_space=action_space)
        self.hidden_size = int(lstm_hidden_size)
        self.obs_encoder = encoder
        in_dim = encoder.features_dim if encoder is not None else obs_dim
        # PyTorch's default LSTM initialisation, as sb3-contrib keeps it (its orthogonal init skips the LSTMs)
        self.lstm_actor = nn.LSTM(in_dim, self.hidden_size)
        self.lstm_critic = nn.LSTM(in_dim, self.hidden_size)

    def features(self, lstm_outputs: torch.Tensor) -> torch.Tensor:
        """The heads take the LSTM outputs `[2, N, H]` as they are."""
        return lstm_outputs

    def encode(self, obs: Observation) -> torch.Tensor:
        """The LSTMs' input for observations `[N, ...]`: the encoder's features, or the flattened float vector."""
        return _encode(self.obs_encoder, obs)

    def initial_state(self, num_envs: int) -> torch.Tensor:
        """The state at an episode start: zeros `[4, num_envs, H]`."""
        weight = self.lstm_actor.weight_hh_l0
        return torch.zeros(4, num_envs, self.hidden_size, device=weight.device, dtype=weight.dtype)

    @staticmethod
    def _cell(lstm: nn.LSTM, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of a one-layer `nn.LSTM` with its own weights (no sequence-call overhead)."""
        return torch.lstm_cell(obs, (h, c), lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both LSTMs one step from `state` (already zeroed where an episode starts): (features `[2, N, H]` for the
        heads, next state `[4, N, H]`)."""
        h_actor, c_actor = self._cell(self.lstm_actor, obs, state[0], state[1])
        h_critic, c_critic = self._cell(self.lstm_critic, obs, state[2], state[3])
        return torch.stack((h_actor, h_critic)), torch.stack((h_actor, c_actor, h_critic, c_critic))

    def act_step(self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool = False,
                 action_masks: torch.Tensor | None = None):
        """One rollout step: (actions, log_probs, values, next state)."""
        features, next_state = self.step(self.encode(obs), state)
        actions, log_probs, values = self.act(features, deterministic, action_masks)
        return actions, log_probs, values, next_state

    def actor_step(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, deterministic: bool = True,
                   action_masks: torch.Tensor | None = None):
        """The actor alone (inference, `predict`): (actions, h, c) from the actor's state `[N, H]` each."""
        h, c = self._cell(self.lstm_actor, self.encode(obs), h, c)
        out, latent = self.body(h.unsqueeze(0), members=slice(0, 1), with_hidden=True)  # the actor's head alone
        return self._actor_actions(out, latent, deterministic, action_masks), h, c

    def _actor_actions(self, out: torch.Tensor, latent: torch.Tensor, deterministic: bool,
                       action_masks: torch.Tensor | None) -> torch.Tensor:
        """`actor_step`'s actions from the actor head's output `out` `[1, N, A]` (`latent` `[1, N, width]`: the
        head's last hidden features, which gSDE's noise takes; indexed only where used: `predict` runs this)."""
        out = out[0]
        return self.mode(out, action_masks) if deterministic else self.sample(out, False, action_masks)[0]

    def value_step(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """V `[N]` of observations reached from `state` (the critic LSTM one step, then its head)."""
        h, _ = self._cell(self.lstm_critic, self.encode(obs), state[2], state[3])
        return self.body(h.unsqueeze(0), members=slice(1, 2))[0, :, 0]

    def sequence_features(self, obs: Observation, state: torch.Tensor, episode_starts: torch.Tensor,
                          layout: SequenceLayout | None = None) -> torch.Tensor:
        """Both LSTMs over sequences: obs `[T, B, ...]` from `state` `[4, B, H]` (the state stored at t = 0, already
        reset where it starts an episode), zeroing the state where `episode_starts` `[T, B]` is set at t > 0.
        Returns features `[2, T * B, H]` in step order (t-major).

        Without a `layout`, a loop over the T steps (the reference, fixed shapes); with one (built from the same
        episode starts), one fused `nn.LSTM` call per LSTM over the episode segments, padded to the longest.
        """
        steps, batch = episode_starts.shape
        if self.obs_encoder is not None or (isinstance(obs, torch.Tensor) and obs.dim() > 3):
            # every step's features in one encoder pass, then the sequences as float vectors [T, B, F]
            flat = {k: v.flatten(0, 1) for k, v in obs.items()} if isinstance(obs, dict) else obs.flatten(0, 1)
            obs = self.encode(flat).view(steps, batch, -1)
        if layout is None:
            outputs = []
            for t in range(steps):
                if t > 0:
                    state = reset_at_episode_starts(state, episode_starts[t])
                features, state = self.step(obs[t], state)
                outputs.append(features)
            return torch.stack(outputs, dim=1).flatten(1, 2)
        segments = obs.flatten(0, 1)[layout.rows]  # [L, S, D]
        initial = state[:, layout.columns] * layout.continues.to(state.dtype).view(1, -1, 1)  # [4, S, H]
        actor, _ = self.lstm_actor(segments, (initial[0:1].contiguous(), initial[1:2].contiguous()))
        critic, _ = self.lstm_critic(segments, (initial[2:3].contiguous(), initial[3:4].contiguous()))
        return torch.stack((actor, critic)).flatten(1, 2)[:, layout.inverse]
