"""rlspeed.accel in a user's own PyTorch loop: what a CleanRL-style script hands `accelerate_step` and
`auto_accelerate` (an optimizer that needs a closure, an already compiled model, a script that only wants the
acceleration layer) is accelerated as the plain loop runs, or refused or reported in words."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlspeed.accel import accelerate_step
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
