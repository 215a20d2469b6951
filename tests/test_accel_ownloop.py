"""rlspeed.accel in a user's own PyTorch loop: what a CleanRL-style script hands `accelerate_step` and
`auto_accelerate` (an optimizer that needs a closure, an already compiled model, a script that only wants the
acceleration layer) is accelerated as the plain loop runs, or refused or reported in words."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import rlspeed
from rlspeed.accel import accelerate_step, auto_accelerate
from rlspeed.errors import UserError

pytestmark = pytest.mark.usefixtures("isolated_accel")  # conftest: own cache, nothing forced, short timing


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def test_an_optimizer_that_needs_a_closure_is_refused_in_one_sentence_before_any_update():
    """LBFGS steps only with a closure; the step used to run the loss and its backward, then fail inside torch with
    "step() missing 1 required positional argument: 'closure'"."""
    model = _mlp()
    optimizer = torch.optim.LBFGS(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(UserError, match="LBFGS needs a closure.*auto_accelerate"):
        accelerate_step(lambda x: model(x).pow(2).mean(), optimizer)
    assert all(torch.equal(a, b) and p.grad is None for a, b, p in zip(before, model.parameters(), model.parameters()))


def _imported_at_import(module: str) -> set[str]:
    """The rlspeed modules importing `module` runs: its module-level imports (not those inside functions, which run
    when called), their packages' `__init__`s, and theirs in turn."""
    root = Path(rlspeed.__file__).parent.parent
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        path = root / Path(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if name in seen or not path.exists():
            continue
        seen.add(name)
        todo.extend(".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1))  # (its packages)
        nodes = list(ast.parse(path.read_text()).body)
        while nodes:
            node = nodes.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                todo.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                todo.extend([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
            else:
                nodes.extend(ast.iter_child_nodes(node))
    return {name for name in seen if name.startswith("rlspeed")}


def test_the_acceleration_layer_imports_no_environments_or_algorithms():
    """A script that imports only `accelerate_step`/`auto_accelerate` pays for the acceleration layer alone: it used to
    import `rlspeed.nn` (for its gradient clipping) and through it `rlspeed.envs`, about 0.1 s of CPU of every run."""
    imported = _imported_at_import("rlspeed.accel")
    assert "rlspeed.accel.step" in imported and "rlspeed.device" in imported  # (it follows the imports)
    assert not {name for name in imported if name.startswith(("rlspeed.envs", "rlspeed.algos", "rlspeed.nn"))}


def test_a_compiled_model_given_to_auto_accelerate_says_its_compilation_is_replaced():
    """`auto_accelerate(torch.compile(model))` returns the module inside; on a device where it tries no compilation
    the user's torch.compile used to be dropped without a word."""
    model, x = _mlp(), torch.ones(3, 4)
    expected = model(x)
    with pytest.warns(UserWarning, match="torch.compile\\(\\)d module.*runs uncompiled; pass compile=True"):
        accelerated = auto_accelerate(torch.compile(model, backend="eager"), device="cpu")
    assert accelerated is model
    assert any("torch.compile()d module" in note for note in accelerated.accel_report.notes)
    assert torch.equal(accelerated(x), expected)


class _Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.head = nn.LSTM(4, 8), nn.Linear(8, 2)

    def forward(self, x, state, scale=None):
        out, state = self.lstm(x, state)
        return self.head(out) * (1.0 if scale is None else scale), state


class _CountingConverter:
    """Stands in for a module accelerator's input converter, counting the calls that went through it."""

    def __init__(self, converter):
        self.converter, self.convert_dtypes, self.calls = converter, converter.convert_dtypes, 0

    def __call__(self, args, kwargs):
        self.calls += 1
        return self.converter(args, kwargs)


def test_a_recurrent_state_tuple_of_tensors_in_place_is_not_converted_at_each_call():
    """A rollout's `policy(x, (h, c))` went through the general input conversion at every call (+25-30 us a call of
    a small LSTM on a CPU, a quarter of the call), and so did any call with a keyword argument or a number (+7 us);
    tensors in place, in a tuple or given by keyword, beside numbers, now take the plain tensors' path."""
    torch.manual_seed(0)
    model = _Recurrent()
    x, state = torch.randn(1, 3, 4), (torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))
    with torch.no_grad():
        expected = model(x, state)
        auto_accelerate(model, device="cpu")
        model(x, state)  # (the first call of a kind decides it)
        counting = _CountingConverter(model.__dict__["_rlspeed_accelerator"].converter)
        model.__dict__["_rlspeed_accelerator"].converter = counting
        outputs = model(x, state)
        assert counting.calls == 0
        assert torch.equal(model(x, state=state)[0], expected[0]) and counting.calls == 0  # (by keyword alike)
        assert torch.equal(model(x, state, 2.0)[0], 2 * expected[0]) and counting.calls == 0  # (numbers alike)
        assert torch.equal(outputs[0], expected[0]) and all(map(torch.equal, outputs[1], expected[1]))
        converted = model(x, tuple(t.numpy() for t in state))  # (a state that needs converting still is)
    assert counting.calls == 1 and torch.equal(converted[0], expected[0])


def test_a_module_called_only_inside_a_step_says_so_in_its_report():
    """CleanRL's SAC calls its Q-networks only in losses; accelerated as the docs show, their report said "no decision
    yet: the first call ... triggers it" after thousands of calls. It says those calls ran inside a step, as the step
    chose (once, however many calls), and a call outside the step still decides for itself."""
    critic = auto_accelerate(_mlp())
    step = accelerate_step(lambda x: critic(x).square().mean(), torch.optim.SGD(critic.parameters(), lr=0.1))
    for _ in range(3):
        step(torch.randn(8, 4))
    text = str(critic.accel_report)
    assert text.count("called inside an accelerated step's loss function") == 1
    assert "step's report" in text and "its first call outside a step" in text
    with torch.no_grad():
        critic(torch.randn(8, 4))
    assert critic.accel_report.decisions
