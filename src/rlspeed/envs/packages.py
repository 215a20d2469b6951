"""Env packages that register their ids with Gymnasium when imported: `--gym-packages` modules, and the families of
ids whose package rlspeed imports by itself on the first id (`PACKAGE_FAMILIES`)."""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import gymnasium as gym

from rlspeed.errors import UserError

_REGISTERED_BY_CALL: set[str] = set()  # modules whose register_envs() import_gym_packages has called


def import_gym_packages(modules: list[str], why: str = "(--gym-packages)") -> None:
    """Import each module, which registers its envs with Gymnasium (RL-Zoo's `--gym-packages`), and call its
    `register_envs()` where it has one and registers nothing on import (`minatar.gym`); UserError naming the module
    that cannot be imported."""
    for module in modules:
        if not module or not all(part.isidentifier() for part in module.split(".")):
            raise UserError(f"'{module}' {why} is not a Python module name.")
        try:
            imported = importlib.import_module(module)
        except ImportError as error:
            raise UserError(f"Cannot import the module '{module}' {why}, which should register the env: "
                            f"{error}.") from None
        register = getattr(imported, "register_envs", None)
        if callable(register) and module not in _REGISTERED_BY_CALL:
            _REGISTERED_BY_CALL.add(module)
            try:
                with warnings.catch_warnings():  # ids the user's code registered already: the same entry points
                    warnings.filterwarnings("ignore", message=".*Overriding environment")
                    register()
            except TypeError:  # a register_envs with parameters is not this convention
                pass


#: Env families whose package registers them when imported (`import_gym_packages`), by id prefix: (family, module
#: to import, what to pip install).
PACKAGE_FAMILIES = {"MinAtar/": ("MinAtar", "minatar.gym", "minatar"),
                    "MiniGrid-": ("MiniGrid", "minigrid", "minigrid"), "BabyAI-": ("BabyAI", "minigrid", "minigrid")}


def register_family(env_id: str) -> None:
    """For an unregistered id of a family in `PACKAGE_FAMILIES`: import its package, which registers it (as
    `--gym-packages` would); UserError with the pip command when the package is not installed."""
    if env_id in gym.registry:
        return
    for prefix, (family, module, package) in PACKAGE_FAMILIES.items():
        if env_id.startswith(prefix):
            if importlib.util.find_spec(module.split(".")[0]) is None:
                raise UserError(f"'{env_id}' is a {family} id, and {family} envs need {package}: pip install "
                                f"{package}.")
            import_gym_packages([module], f"(which registers the {family} envs)")
            return
