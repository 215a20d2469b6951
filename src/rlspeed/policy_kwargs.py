"""Stable-Baselines3's `policy_kwargs` as rlspeed's hyperparameters: the one rule, per algorithm, that RL-Zoo's
translation (`rlspeed.presets.zoo`, from a YAML entry's text) and a model's refusal of the keyword (from Python's
values, `nn.LeakyReLU` a class) both follow, so that both name the same settings.

Without torch (presets and RL-Zoo's translation read it before torch loads).
"""

from __future__ import annotations

import typing

from rlspeed.activations import PRELU_REFUSAL, activation_name, names_prelu, refusal_name, torch_class_names
from rlspeed.errors import UserError

#: the algorithms (rlspeed's CLI names) whose critic has a value head, `net_arch`'s ``vf`` part in SB3
ON_POLICY = ("ppo", "a2c", "recurrent_ppo")
#: where an encoder of the user's own goes instead (rlspeed's `encoder` setting names rlspeed's, and SB3's
#: features_extractor_class has no counterpart): what a refusal of either says
OWN_ENCODER = "an encoder of your own is what a subclass's _make_encoder returns (docs/algorithms.md)"
#: the algorithms with gSDE (`use_sde`), whose policy options `full_std` and `use_expln` are (named here, without
#: torch, rather than read from their configs: tests/test_sde.py ties the two)
SDE_ALGORITHMS = ("ppo", "a2c", "sac", "recurrent_ppo")

#: sb3-contrib's `MlpLstmPolicy` layout options at the values that build `RecurrentActorCritic` (its defaults); any
#: other value builds a network rlspeed's RecurrentPPO has not. One rule (`is_rlspeeds_lstm_layout`) for a keyword or
#: `--set` (`build_config`), the `policy_kwargs` refusal and RL-Zoo's translation: at these values an option is taken
#: and changes nothing (nothing is stored, so no saved config holds it); at any other it is refused.
SB3_CONTRIB_LSTM_LAYOUT = {"n_lstm_layers": 1, "enable_critic_lstm": True, "shared_lstm": False, "lstm_kwargs": None}
#: what a user is told about the layout options (after the option's name)
LSTM_LAYOUT_RULE = ("rlspeed's RecurrentPPO has one LSTM layer (torch.nn.LSTM's defaults) for the actor and one for "
                    "the critic")


#: what a user is told about `share_features_extractor` at another value than SB3's default
SHARE_RULE = ("rlspeed's PPO, A2C and RecurrentPPO share one encoder between actor and critic, and its SAC, TD3 and "
              "DDPG give the actor and the critics one each (SB3's defaults), which no setting changes")


def is_rlspeeds_lstm_layout(name: str, value: object) -> bool:
    """Whether sb3-contrib's layout option `name` (a key of `SB3_CONTRIB_LSTM_LAYOUT`) at `value` builds rlspeed's
    `RecurrentActorCritic`: its default value, of its type (an empty `lstm_kwargs` as its None). Of its type: 1 for
    `enable_critic_lstm` or True for `n_lstm_layers` equal the defaults only by Python's bool-int equality, and a
    text such as "false" is a true value to sb3-contrib."""
    if name == "lstm_kwargs":
        return value is None or (isinstance(value, dict) and not value)
    default = SB3_CONTRIB_LSTM_LAYOUT[name]
    return type(value) is type(default) and value == default


class PolicySettings(typing.Protocol):
    """Where `translate_policy_kwargs` puts what it reads: settings, refusals and notes."""

    notes: list[str]

    def set(self, key: str, value, origin: str) -> None:
        """rlspeed's hyperparameter `key` is `value`, from SB3's option `origin` ("policy_kwargs.net_arch")."""

    def refuse_option(self, key: str, shown: str, rule: str) -> None:
        """SB3's option `key`, given as `shown` (its value as a message writes it), is not honoured, for the reason
        `rule` (the same text for each option refused by the same rule)."""


class Collected:
    """A `PolicySettings` that keeps what it is given: `hyper` (key -> value), `origin` (key -> SB3's option),
    `refused` ((SB3's option, its value shown, rule) triples), `notes`."""

    def __init__(self):
        self.hyper: dict = {}
        self.origin: dict[str, str] = {}
        self.refused: list[tuple[str, str, str]] = []
        self.notes: list[str] = []

    def set(self, key: str, value, origin: str) -> None:
        self.hyper[key], self.origin[key] = value, origin

    def refuse_option(self, key: str, shown: str, rule: str) -> None:
        self.refused.append((key, shown, rule))


def _activation(item) -> str | None:
    """rlspeed's name for SB3's `activation_fn`: torch.nn's class, or its name as code writes it, by the rule of the
    `activation` keyword (`rlspeed.activations.activation_name`); None for anything else (a class of one's own)."""
    try:
        return activation_name(item)
    except UserError:
        return None


def translate_policy_kwargs(algo: str, kwargs: dict, out: PolicySettings) -> None:
    """SB3 policy arguments of `algo` (rlspeed's CLI name) -> rlspeed's hyperparameters, set on (or refused to)
    `out`: net_arch, activation_fn (a class or its name), log_std_init, ortho_init, lstm_hidden_size,
    normalize_images, n_critics (off-policy actor-critics), features_extractor_kwargs (its features_dim:
    cnn_features_dim), .... Options the algorithm has not are refused by name; settings a config lacks are the
    config check's to refuse."""
    for name, item in kwargs.items():
        key = f"policy_kwargs.{name}"
        if name == "net_arch":
            _net_arch(algo, key, item, out)
        elif name == "activation_fn":
            activation = _activation(item)
            if activation is not None:
                out.set("activation", activation, key)
            else:
                out.refuse_option(key, str(refusal_name(item)), PRELU_REFUSAL if names_prelu(item)
                                  else f"rlspeed's activations are {torch_class_names()}")
        elif name in ("full_std", "use_expln") and algo not in SDE_ALGORITHMS:
            out.refuse_option(key, repr(item), f"an option of gSDE, which rlspeed's {algo} has not")
        elif name in ("log_std_init", "full_std", "use_expln", "normalize_images"):
            out.set(name, item, key)  # (the config check refuses them where absent)
        elif name == "ortho_init" and isinstance(item, bool):
            out.set("ortho_init", item, key)
        elif name == "ortho_init":
            out.refuse_option(key, repr(item), "ortho_init is True or False")
        elif name == "lstm_hidden_size" and algo == "recurrent_ppo":
            out.set("lstm_hidden_size", item, key)
        elif name in SB3_CONTRIB_LSTM_LAYOUT and algo == "recurrent_ppo":
            if is_rlspeeds_lstm_layout(name, item):
                out.notes.append(f"{key} {item}: rlspeed's RecurrentPPO has that too")
            else:
                out.refuse_option(key, repr(item), LSTM_LAYOUT_RULE)
        elif name == "n_critics" and algo in ("sac", "td3", "ddpg"):
            out.set("n_critics", item, key)
        elif name in ("squash_output", "clip_mean"):
            # rlspeed's gSDE has SB3's defaults: on-policy actions unsquashed; SAC squashed, mean clipped to +-2
            default = {"squash_output": algo == "sac", "clip_mean": 2.0 if algo == "sac" else None}[name]
            if item == default:
                out.notes.append(f"{key} {item!r}: rlspeed's {algo} does that too")
            else:
                out.refuse_option(key, repr(item), "rlspeed's gSDE has SB3's defaults for it (on-policy: no "
                                                   "squashing; SAC: squashed, mean clipped to [-2, 2])")
        elif name == "share_features_extractor" and algo != "dqn":
            if item is (algo in ON_POLICY):  # (SB3's default: on-policy one encoder, off-policy one each)
                out.notes.append(f"{key} {item!r}: rlspeed's {algo} does that too")
            else:
                out.refuse_option(key, repr(item), SHARE_RULE)
        elif name in ("optimizer_class", "optimizer_kwargs"):
            instead = " (torch RMSprop or Adam: use_rms_prop, rms_prop_eps)" if algo == "a2c" else ""
            out.refuse_option(key, repr(item), f"rlspeed's {algo} builds its own optimizer{instead}; another "
                                               "optimizer is a subclass's (docs/algorithms.md, \"Your own loss\")")
        elif name == "features_extractor_kwargs":
            _features_extractor_kwargs(key, item, out)
        elif name == "features_extractor_class":
            out.refuse_option(key, str(getattr(item, "__name__", item)),
                              "rlspeed picks its encoder from the observation space (encoder auto, mlp or cnn; the "
                              "CNN's architecture: cnn nature, strided or small), not from a class; " + OWN_ENCODER)
        else:
            out.refuse_option(key, repr(item), f"rlspeed's {algo} has no such option")


def _features_extractor_kwargs(key: str, value, out: PolicySettings) -> None:
    """SB3's features extractor options: `features_dim` (NatureCNN's) and `cnn_output_dim` (CombinedExtractor's,
    MultiInputPolicy) are the width of rlspeed's CNN encoders, `cnn_features_dim`; rlspeed's encoders take no
    other option."""
    if not isinstance(value, dict):
        out.refuse_option(key, repr(value), "expected dict(...)")
        return
    for name, item in value.items():
        if name in ("features_dim", "cnn_output_dim"):
            out.set("cnn_features_dim", item, f"{key}.{name}")
        else:
            out.refuse_option(f"{key}.{name}", repr(item), "rlspeed's encoders take only the CNN's output width "
                                                           "(features_dim, as cnn_features_dim); an encoder of your "
                                                           "own takes its options in a subclass's _make_encoder")


def _net_arch(algo: str, key: str, value, out: PolicySettings) -> None:
    """A width list, or dict(pi=[...], vf=[...]) / dict(pi=..., qf=...): rlspeed has one list for both."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):  # SB3 1.x: [dict(pi, vf)]
        value = value[0]
    if isinstance(value, dict):
        widths = [value.get(part) for part in ("pi", "vf" if algo in ON_POLICY else "qf")]
        if set(value) - {"pi", "vf", "qf"} or widths[0] != widths[1] or widths[0] is None:
            out.refuse_option(key, str(value), "rlspeed uses one width list for the actor and the critic")
            return
        value = widths[0]
    if isinstance(value, list) and all(isinstance(w, int) and not isinstance(w, bool) for w in value):
        out.set("net_arch", value, key)
    else:
        out.refuse_option(key, repr(value), "expected a list of layer widths")


__all__ = ["Collected", "ON_POLICY", "PolicySettings", "SDE_ALGORITHMS", "translate_policy_kwargs"]
