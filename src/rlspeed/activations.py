"""The hidden layers' activations: the one table of their names, and the rule that reads torch's class for one.

Without torch (presets and RL-Zoo's translation read it before torch loads): `rlspeed.nn.ACTIVATIONS` makes the
layers from this table. Each name is a parameter-free elementwise layer of `torch.nn` with its default arguments,
as Stable-Baselines3's `policy_kwargs=dict(activation_fn=nn.LeakyReLU)` builds it.
"""

from __future__ import annotations

from rlspeed.errors import UserError

#: rlspeed's activation names -> the class of torch.nn each one is (with its default arguments)
ACTIVATION_CLASSES = {"tanh": "Tanh", "relu": "ReLU", "elu": "ELU", "silu": "SiLU", "leaky_relu": "LeakyReLU",
                      "gelu": "GELU", "softplus": "Softplus", "mish": "Mish", "hardswish": "Hardswish",
                      "selu": "SELU", "celu": "CELU", "sigmoid": "Sigmoid"}

#: the activations whose derivative `rlspeed.fused` writes out: networks with another train with autograd (the
#: reference), and `update_summary` says so
HAND_DERIVED_ACTIVATIONS = ("tanh", "relu")

#: why torch.nn's PReLU is not among them
PRELU_REFUSAL = ("nn.PReLU learns its slope, a parameter beside the linear layers' that rlspeed's networks do not "
                 "hold (a population stacks only those, the hand-derived updates derive no other): use leaky_relu, "
                 "PReLU with its slope fixed")


#: the ways code names torch.nn's activation classes: bare, as torch.nn imported (`nn`, `torch.nn`, RL-Zoo's
#: `th.nn`), or by the module that defines them (as the class prints)
TORCH_NN_PREFIXES = ("", "nn", "torch.nn", "th.nn", "torch.nn.modules.activation")


def _key(name: str) -> str:
    return name.replace("_", "").lower()


_BY_KEY = {**{_key(name): name for name in ACTIVATION_CLASSES}, **{_key(cls): name
                                                                   for name, cls in ACTIVATION_CLASSES.items()}}


def is_torch_nn_class(cls: type) -> bool:
    """Whether the class `cls` is torch.nn's own (of a module under `torch.nn`): a class of one's own named `Tanh`
    is not, nor torch's quantized layers (`torch.ao.nn`), which take other arguments."""
    return cls.__module__ == "torch.nn" or cls.__module__.startswith("torch.nn.")


def _torch_nn_spelling(value: object) -> str | None:
    """The class name `value` gives where it names a class of torch.nn, or one of the table's names: torch.nn's class
    itself, or a name as code writes it (under one of `TORCH_NN_PREFIXES`); None for anything else."""
    if isinstance(value, type):
        return value.__name__ if is_torch_nn_class(value) else None
    if not isinstance(value, str):
        return None
    prefix, _, name = value.rpartition(".")
    return name if prefix in TORCH_NN_PREFIXES else None


def activation_name(value: object) -> str:
    """The name in `ACTIVATION_CLASSES` of `value`: a name, torch.nn's class (`nn.LeakyReLU`) or its name as code
    writes it ("nn.LeakyReLU", "torch.nn.GELU", "th.nn.Tanh", "LeakyReLU"; case and underscores aside). UserError,
    one sentence naming the table, for anything else: a class of one's own (`is_torch_nn_class`), or a name under
    another prefix ("F.relu", torch's function, which Stable-Baselines3 does not take either)."""
    spelled = _torch_nn_spelling(value)
    name = _BY_KEY.get(_key(spelled)) if spelled is not None else None
    if name is None:
        check_activation(refusal_name(value) if isinstance(value, type) else value)
    return name


def refusal_name(value: object) -> object:
    """`value` as a refusal names it: torch.nn's class by its name (`PReLU`), another class or a function by its
    module's (`mymod.Tanh`, `torch.nn.functional.relu`), so that it does not read as torch.nn's; anything else as it
    is."""
    if isinstance(value, type) and is_torch_nn_class(value):
        return value.__name__
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else value


def check_activation(name: object) -> None:
    """UserError unless `name` is a name of `ACTIVATION_CLASSES`: for PReLU, why not; else the table's names."""
    if isinstance(name, str) and name in ACTIVATION_CLASSES:  # (a list or dict given is refused too, not unhashable)
        return
    if names_prelu(name):
        raise UserError(f"activation {name}: {PRELU_REFUSAL}.")
    raise UserError(f"activation must be one of {', '.join(ACTIVATION_CLASSES)}, got '{name}'.")


def names_prelu(value: object) -> bool:
    """Whether `value` is torch.nn's PReLU, its class or its name as code writes it (`PRELU_REFUSAL` says why not)."""
    spelled = _torch_nn_spelling(value)
    return spelled is not None and _key(spelled) == "prelu"


def torch_class_names() -> str:
    """The table as torch's classes, for messages about SB3's `activation_fn`: "nn.Tanh, nn.ReLU, ..."."""
    return ", ".join(f"nn.{cls}" for cls in ACTIVATION_CLASSES.values())
