"""The documented API is fully annotated, for users whose projects type-check (rlspeed ships `py.typed`): every
public function and method of what docs/api.md documents (its `::: name` entries: classes, functions, modules), and
the other names the docs' examples call, annotates each parameter and its return, and `typing.get_type_hints`
resolves those annotations (with the module's `if TYPE_CHECKING:` imports, which type checkers see too).

An unannotated parameter is `Any` to mypy and unknown to pyright's strict mode: a call through it type-checks
whatever it is given, and what it returns spreads unknown types into the caller's code. `KNOWN_INCOMPLETE` lists what
is not yet annotated; it only shrinks (an entry that became complete fails the test until it is taken out).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: names the docs' examples call that docs/api.md has no `:::` entry of
EXAMPLES_CALL = ("rlspeed.presets.load_preset", "rlspeed.presets.split_run_settings")
#: documented callables not yet fully annotated (qualified as docs/api.md names them): take one out once annotated
KNOWN_INCOMPLETE = {
    "rlspeed.algos.update.UpdateStep.__call__", "rlspeed.algos.update.UpdateStep.precision_context",
    "rlspeed.algos.update.WeakBoundLoss.__call__", "rlspeed.algos.update.autograd_step",
    "rlspeed.algos.update.loss_owner", "rlspeed.algos.update.select_update",
    "rlspeed.buffers.FrameStackReplayBuffer.add", "rlspeed.buffers.HerReplayBuffer.add",
    "rlspeed.buffers.ReplayBuffer.add", "rlspeed.buffers.RolloutBuffer.add",
    "rlspeed.buffers.SharedObservationReplayBuffer.__init__", "rlspeed.buffers.SharedObservationReplayBuffer.add",
    "rlspeed.buffers.frame_stacks", "rlspeed.buffers.image_space", "rlspeed.envs.NativeGymEnv.render",
    "rlspeed.envs.NativeGymEnv.reset", "rlspeed.envs.NativeGymEnv.step", "rlspeed.envs.SB3VecEnv.__init__",
    "rlspeed.envs.native.NativeEnv.seed_row_blocks", "rlspeed.envs.native.NativeEnv.transition",
    "rlspeed.envs.native.NativeEnv.uniform", "rlspeed.export.PolicyExport.actions",
    "rlspeed.export.PolicyExport.check_inputs", "rlspeed.export.PolicyExport.forward",
    "rlspeed.population.normalize.MemberNormalize.reset", "rlspeed.population.normalize.MemberNormalize.state",
    "rlspeed.population.normalize.MemberNormalize.step",
}


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for part in parts[end:]:
            value = getattr(value, part)
        return value
    raise ImportError(dotted)


def _callables(value: object, name: str) -> Iterator[tuple[str, typing.Callable[..., object]]]:
    """(qualified name, function) of each public function of `value`: a module's own functions and classes, a
    class's public methods (its `__init__` and `__call__` too) and properties defined in rlspeed, or the function."""
    if inspect.ismodule(value):
        for attribute in getattr(value, "__all__", [key for key in vars(value) if not key.startswith("_")]):
            member = getattr(value, attribute)
            if getattr(member, "__module__", None) == value.__name__ and (
                    inspect.isfunction(member) or inspect.isclass(member)):
                yield from _callables(member, f"{name}.{attribute}")
    elif inspect.isclass(value):
        seen: set[str] = set()
        for owner in value.__mro__:
            if not owner.__module__.startswith("rlspeed"):
                continue
            for attribute, member in vars(owner).items():
                if attribute in seen or (attribute.startswith("_") and attribute not in ("__init__", "__call__")):
                    continue
                seen.add(attribute)
                function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(function):
                    yield f"{name}.{attribute}", function
    elif inspect.isfunction(value):
        yield name, value


@functools.cache
def _namespace(module_name: str) -> dict[str, object]:
    """The module's globals with the names its top-level `if TYPE_CHECKING:` blocks import or define."""
    module = importlib.import_module(module_name)
    namespace = dict(vars(module))
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            exec(compile(ast.Module(body=node.body, type_ignores=[]), module.__file__ or module_name, "exec"),
                 namespace)
    return namespace


def _problems(function: typing.Callable[..., object]) -> list[str]:
    """What `function` leaves unannotated (parameter names, "return"), or why its annotations do not resolve."""
    parameters = list(inspect.signature(function).parameters.values())
    empty = inspect.Parameter.empty
    missing = [parameter.name for i, parameter in enumerate(parameters)
               if parameter.annotation is empty and not (i == 0 and parameter.name in ("self", "cls"))]
    if "return" not in function.__annotations__ and function.__name__ != "__init__":
        missing.append("return")
    try:
        typing.get_type_hints(function, globalns=_namespace(function.__module__))
    except Exception as error:  # noqa: BLE001 (any failure to resolve is the finding)
        missing.append(f"annotations do not resolve ({type(error).__name__}: {error})")
    return missing


def documented_callables() -> dict[str, typing.Callable[..., object]]:
    names = re.findall(r"^::: ([\w.]+)\s*$", (ROOT / "docs" / "api.md").read_text(encoding="utf-8"), re.MULTILINE)
    found: dict[str, typing.Callable[..., object]] = {}
    for dotted in [*names, *EXAMPLES_CALL]:
        for name, function in _callables(_resolve(dotted), dotted):
            if function not in found.values():
                found[name] = function
    return found


def test_documented_functions_annotate_every_parameter_and_their_return() -> None:
    found = documented_callables()
    assert len(found) > 200  # (the walk found the API: algorithms, callbacks, envs, populations, ...)
    incomplete = {name: problems for name, function in found.items() if (problems := _problems(function))}
    new = {name: problems for name, problems in incomplete.items() if name not in KNOWN_INCOMPLETE}
    assert not new, "documented callables with parameters or returns a type checker sees as Any/unknown:\n" + "\n".join(
        f"{name}: {', '.join(problems)}" for name, problems in sorted(new.items()))
    done = sorted(KNOWN_INCOMPLETE - set(incomplete))
    assert not done, f"now fully annotated (take them out of KNOWN_INCOMPLETE): {', '.join(done)}"


@pytest.mark.parametrize("name", ["PPO.__init__", "PPO.learn", "PPO.load", "PPO.save", "PPO.predict",
                                  "RecurrentPPO.predict", "SAC.load_replay_buffer", "stats.aggregate",
                                  "presets.split_run_settings"])
def test_the_model_methods_annotations_resolve_in_a_plain_program(name: str) -> None:
    """`typing.get_type_hints` on a model's methods works without the TYPE_CHECKING names, as tools that read
    signatures at run time (jsonargparse, typer, pydantic's validate_call) call it."""
    hints = typing.get_type_hints(_resolve(f"rlspeed.{name}"))
    assert "return" in hints


def test_every_documented_callables_annotations_resolve_in_a_plain_program() -> None:
    """`typing.get_type_hints` without the modules' TYPE_CHECKING names (as jsonargparse, typer or pydantic call it)
    resolves the annotations of every documented callable and of `rlspeed`'s public names: `evaluate`,
    `record_video`, `export`, `Population` and the callbacks' hooks raised NameError for the model's class, which
    their modules imported for type checkers only (an import of it there closes a cycle)."""
    import rlspeed

    found = documented_callables()
    for public in rlspeed.__all__:
        for name, function in _callables(getattr(rlspeed, public), f"rlspeed.{public}"):
            found.setdefault(name, function)
    assert "rlspeed.record_video" in found and "rlspeed.evaluate" in found
    unresolved = {}
    for name, function in found.items():
        try:
            typing.get_type_hints(function)
        except Exception as error:  # noqa: BLE001 (any failure to resolve is the finding)
            unresolved[name] = f"{type(error).__name__}: {error}"
    assert not unresolved, "\n".join(f"{name}: {why}" for name, why in sorted(unresolved.items()))


def test_the_model_class_in_annotations_resolves_before_the_algorithms_are_imported() -> None:
    """In a program that imported only the callbacks, evaluation, video and export modules (not `rlspeed.algos`),
    `typing.get_type_hints` resolves the model's class in their annotations: resolving it imports the algorithms."""
    import subprocess
    import sys

    script = (
        "import sys, typing\n"
        "from rlspeed.callbacks import BaseCallback, EvalCallback\n"
        "from rlspeed.evaluation import evaluate\n"
        "from rlspeed.export import export\n"
        "from rlspeed.video import record_video\n"
        "assert 'rlspeed.algos' not in sys.modules\n"
        "for function in (BaseCallback.init_callback, EvalCallback.__init__, evaluate, export, record_video):\n"
        "    print(typing.get_type_hints(function).get('model'))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:5] == ["<class 'rlspeed.algos.base.Algorithm'>", "None", *[
        "<class 'rlspeed.algos.base.Algorithm'>"] * 3]


#: classes whose `__getattr__` hands on an inner object's attributes, which type checkers rightly see as Any
FORWARDING = {"EnvWrapper", "_ReaderMayLeave"}


def test_a_misspelt_attribute_of_a_model_env_or_network_is_a_type_error() -> None:
    """A `__getattr__` that only raises (the AttributeError naming Stable-Baselines3's counterpart) is defined where
    type checkers do not see it: one they see makes every attribute access type-check, `model.lern(...)` as Any."""
    seen_by_checkers = []
    for path in sorted((ROOT / "src" / "rlspeed").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name not in FORWARDING:
                seen_by_checkers += [f"{path.relative_to(ROOT)}: {node.name}" for item in node.body
                                     if isinstance(item, ast.FunctionDef) and item.name == "__getattr__"]
    assert not seen_by_checkers, "classes whose __getattr__ type checkers see (put it under `if not " \
                                 "TYPE_CHECKING:`): " + ", ".join(seen_by_checkers)
