"""FlatAdam: parameters as views of one buffer, what it refuses, and what it notices."""

import pytest
import torch
from torch import nn

from rlspeed.flat import FlatAdam


def test_parameters_and_gradients_become_views_of_the_flat_buffers():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    before = [p.detach().clone() for p in net.parameters()]
    adam = FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters(), lr=0.1), max_grad_norm=1.0)
    for p, b in zip(net.parameters(), before):
        assert torch.equal(p, b) and p.grad is not None
    adam.grad.fill_(1.0)  # every parameter's .grad sees it
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in net.parameters())
    adam.step()
    # clipped to norm 1, then Adam's first step moves every weight by lr against the gradient's sign
    assert all(torch.allclose(p, b - 0.1, atol=1e-6) for p, b in zip(net.parameters(), before))


def test_refuses_adam_variants_it_does_not_implement():
    net = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="amsgrad"):
        FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters(), amsgrad=True))
    with pytest.raises(ValueError, match="exactly these parameters"):
        FlatAdam([net.weight], torch.optim.Adam(net.parameters()))


def test_notices_parameters_replaced_after_flattening():
    net = nn.Linear(2, 2)
    adam = FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters()))
    net.weight.data = net.weight.data.clone()
    with pytest.raises(RuntimeError, match="moved or replaced"):
        adam.check()
