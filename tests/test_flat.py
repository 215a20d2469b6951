"""FlatAdam: parameters as views of one buffer, what it refuses, and what it notices."""

import copy

import pytest
import torch
from torch import nn

from rlspeed.accel.search import TOLERANCES
from rlspeed.accel.strategy import precision_context, reduced_matmul_supported
from rlspeed.fused.flat import (
    FlatAdam,
    Workspace,
    ensemble_backward,
    ensemble_forward,
    ensemble_input_grad,
    ensemble_rows_input_grad,
    linear_backward,
    linear_forward,
    tanh_,
)


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


def test_the_hidden_layers_tanh_is_torchs_tanh_to_within_four_float32_steps_at_one():
    special = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-8, 44.0, -44.0, 1e30, -1e30, 3.4e38, -3.4e38, float("inf"),
                            -float("inf")])
    x = torch.cat([torch.linspace(-20, 20, 400_001), torch.randn(100_000) * 3, special])
    got = tanh_(x.clone())
    exact = torch.tanh(x.double())
    assert (got.double() - exact).abs().max().item() <= 2.4e-7
    assert got.abs().max().item() <= 1.0  # bounded as tanh is: the backward's 1 - out^2 stays >= 0
    assert tanh_(torch.tensor([float("nan")])).isnan().all()
    half = torch.linspace(-5, 5, 101, dtype=torch.float64)  # other dtypes: torch's own tanh
    assert torch.equal(tanh_(half.clone()), torch.tanh(half))


def test_refuses_adam_variants_it_does_not_implement():
    net = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="amsgrad"):
        FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters(), amsgrad=True))
    with pytest.raises(ValueError, match="exactly these parameters"):
        FlatAdam([net.weight], torch.optim.Adam(net.parameters()))


def test_parameters_given_new_data_go_back_into_the_flat_buffer_and_another_shape_is_refused():
    net = nn.Linear(2, 2)
    adam = FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters()))
    net.bias.data = torch.tensor([3.0, 4.0])  # (a pretrained value: the flat buffer, which the update reads, takes it)
    adam.check()
    assert net.bias.data_ptr() == adam.param_views[1].data_ptr() and adam.flat[-2:].tolist() == [3.0, 4.0]
    net.weight.data = torch.zeros(3, 2)
    with pytest.raises(RuntimeError, match="moved to another device or given another shape"):
        adam.check()


def test_workspace_passes_give_the_same_results_and_reuse_their_buffers():
    torch.manual_seed(0)
    weights = [torch.randn(16, 5), torch.randn(3, 16)]
    biases = [torch.randn(16), torch.randn(3)]
    ens_weights = [torch.randn(2, 5, 16), torch.randn(2, 16, 1)]
    ens_biases = [torch.randn(2, 1, 16), torch.randn(2, 1, 1)]
    workspace = Workspace()

    def passes(x, ws):
        out = linear_forward(x, weights, biases, False, ws, "mlp")
        weight_grads = [torch.empty_like(w) for w in weights]
        bias_grads = [torch.empty_like(b) for b in biases]
        linear_backward(torch.ones_like(out[-1]), out, weights, weight_grads, bias_grads, False, ws, "mlp")
        ens = ensemble_forward(x.expand(2, -1, -1), ens_weights, ens_biases, True, ws, "ens")
        ens_weight_grads = [torch.empty_like(w) for w in ens_weights]
        ens_bias_grads = [torch.empty_like(b) for b in ens_biases]
        ensemble_backward(torch.ones_like(ens[-1]), ens, ens_weights, ens_weight_grads, ens_bias_grads, True,
                          workspace=ws, tag="ens")
        grad_in = ensemble_input_grad(torch.ones_like(ens[-1]), ens, ens_weights, True, workspace=ws, tag="ens in")
        return [o.clone() for o in (*out, *ens, *weight_grads, *bias_grads, *ens_weight_grads, grad_in)], out[1]

    x = torch.randn(8, 5)
    expected, _ = passes(x, None)
    got, hidden = passes(x, workspace)
    for a, b in zip(expected, got):
        torch.testing.assert_close(a, b)
    again, hidden_again = passes(torch.randn(8, 5), workspace)
    assert hidden_again.data_ptr() == hidden.data_ptr()  # the same buffer, overwritten
    assert not torch.equal(again[1], got[1])
    _, hidden_six = passes(torch.randn(6, 5), workspace)  # another batch size: buffers made anew, no shape error
    assert hidden_six.shape == (6, 16)


@pytest.mark.parametrize("workspace", [False, True])
def test_narrow_outputs_written_column_major_match_autograd(workspace):
    """A 3-wide input and a 2-wide output (SAC's actor on Pendulum) at 96 rows: the forward's output and the first
    layer's weight gradient go through column-major buffers, and agree with autograd."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    x, grad_out = torch.randn(96, 3), torch.randn(96, 2)
    net(x).backward(grad_out)
    weights = [layer.weight.detach() for layer in net[::2]]
    biases = [layer.bias.detach() for layer in net[::2]]
    weight_grads = [torch.full_like(w, float("nan")) for w in weights]
    bias_grads = [torch.full_like(b, float("nan")) for b in biases]
    ws = Workspace() if workspace else None
    for _ in range(2):  # the second time through reused buffers
        out = linear_forward(x, weights, biases, False, ws, "mlp")
        assert out[-1].stride() == (1, 96)  # column-major
        linear_backward(grad_out, out, weights, weight_grads, bias_grads, False, ws, "mlp")
        torch.testing.assert_close(out[-1], net(x))
        for layer, grad_w, grad_b in zip(net[::2], weight_grads, bias_grads):
            torch.testing.assert_close(grad_w, layer.weight.grad)
            torch.testing.assert_close(grad_b, layer.bias.grad)


@pytest.mark.parametrize("workspace", [False, True])
@pytest.mark.parametrize(("in_dim", "out_dim"), [(1, 1), (3, 2), (4, 4), (2, 5)])
def test_ensembles_thin_products_match_autograd(in_dim, out_dim, workspace):
    """Ensembles whose input or output has 1-5 columns (value and Q heads, CartPole's 2 logits, Pendulum's 1-wide
    actions) at 96 rows: the forward, the weight and bias gradients and the gradient of the input (all of it, and
    one column of it, as SAC's actor loss takes) agree with autograd on `baddbmm`, also on reused buffers."""
    torch.manual_seed(0)
    members, rows = 3, 96
    weights = [torch.randn(members, in_dim, 32), torch.randn(members, 32, 32) / 6,
               torch.randn(members, 32, out_dim) / 6]
    biases = [torch.randn(members, 1, 32) / 4, torch.randn(members, 1, 32) / 4, torch.randn(members, 1, out_dim)]
    params = [p.clone().requires_grad_() for p in (*weights, *biases)]
    x = torch.randn(members, rows, in_dim, requires_grad=True)
    grad_out = torch.randn(members, rows, out_dim)
    y = x
    for layer in range(3):
        y = torch.baddbmm(params[3 + layer], y, params[layer])
        y = torch.tanh(y) if layer < 2 else y
    expected = torch.autograd.grad(y, [x, *params], grad_out)
    ws = Workspace() if workspace else None
    for _ in range(2):
        weight_grads = [torch.full_like(w, float("nan")) for w in weights]
        bias_grads = [torch.full_like(b, float("nan")) for b in biases]
        outputs = ensemble_forward(x.detach(), weights, biases, True, ws, "ens")
        torch.testing.assert_close(outputs[-1], y.detach())
        if 2 <= out_dim <= 4:
            assert outputs[-1].stride() == (out_dim * rows, 1, rows)  # column-major
        ensemble_backward(grad_out, outputs, weights, weight_grads, bias_grads, True, ws, "ens")
        for got, want in zip([*weight_grads, *bias_grads], expected[1:]):
            torch.testing.assert_close(got, want)
        torch.testing.assert_close(ensemble_input_grad(grad_out, outputs, weights, True, workspace=ws, tag="in"),
                                   expected[0])
        torch.testing.assert_close(
            ensemble_input_grad(grad_out, outputs, weights, True, slice(0, 1), workspace=ws, tag="in"),
            expected[0][..., :1])


@pytest.mark.parametrize("out_dim", [1, 3])
def test_the_autograd_ensembles_layer_is_baddbmm_with_its_gradients(out_dim):
    """`rlspeed.nn.ensemble_linear` (the TD3/DDPG/DQN populations' and `EnsembleMLP`'s layer) writes a 1-wide head
    as a multiply and a sum: the same values and gradients as `baddbmm`."""
    from rlspeed.nn import ensemble_linear

    torch.manual_seed(0)
    x = torch.randn(3, 40, 8, requires_grad=True)
    weight = torch.randn(3, 8, out_dim, requires_grad=True)
    bias = torch.randn(3, 1, out_dim, requires_grad=True)
    grad = torch.randn(3, 40, out_dim)
    got, want = ensemble_linear(x, weight, bias), torch.baddbmm(bias, x, weight)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, (x, weight, bias), grad),
                    torch.autograd.grad(want, (x, weight, bias), grad)):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(not reduced_matmul_supported(torch.device("cpu"), "bf16-matmul"),
                    reason="this CPU has no bf16 matmul")
def test_bf16_matmul_region_keeps_thin_products_in_fp32_and_wide_ensembles_close():
    torch.manual_seed(0)
    # a critic-like ensemble: 4-wide input, two 256-wide layers, 1-wide head (thin, wide, thin products)
    weights = [torch.randn(2, 4, 256) * 0.5, torch.randn(2, 256, 256) / 16, torch.randn(2, 256, 1) / 16]
    biases = [torch.randn(2, 1, 256) * 0.1, torch.randn(2, 1, 256) * 0.1, torch.randn(2, 1, 1) * 0.1]
    x = torch.randn(512, 4).expand(2, -1, -1)
    grad_out = torch.randn(2, 512, 1)

    def passes():
        out = ensemble_forward(x, weights, biases, False, Workspace(), "critic")
        weight_grads = [torch.empty_like(w) for w in weights]
        bias_grads = [torch.empty_like(b) for b in biases]
        ensemble_backward(grad_out, out, weights, weight_grads, bias_grads, False)
        grad_in = ensemble_input_grad(grad_out, out, weights, False)
        return [o.clone() for o in out[1:]], weight_grads, bias_grads, grad_in

    reference = passes()
    with precision_context(torch.device("cpu"), "bf16-matmul"):
        reduced = passes()
        assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"  # restored after each thin product
    (ref_out, ref_wg, ref_bg, ref_in), (out, wg, bg, grad_in) = reference, reduced
    torch.testing.assert_close(out[0], ref_out[0], rtol=0, atol=0)  # the 4-wide input layer: fp32, bit for bit
    torch.testing.assert_close(out[1], ref_out[1], rtol=2e-2, atol=2e-2)  # the 256x256 layer: bf16 inside
    for got, want in zip([*wg, *bg, grad_in], [*ref_wg, *ref_bg, ref_in]):
        cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert cosine >= TOLERANCES["bf16-matmul"].grad_cosine  # what the acceleration layer accepts
    assert not torch.equal(out[1], ref_out[1])  # the wide product did run in bf16


@pytest.mark.parametrize("tanh", [False, True])
@pytest.mark.parametrize("workspace", [None, Workspace()])
def test_rows_input_grad_equals_the_full_backward_at_those_rows(tanh, workspace):
    torch.manual_seed(0)
    weights = [torch.randn(2, 5, 16) / 2, torch.randn(2, 16, 16) / 4, torch.randn(2, 16, 1) / 4]
    biases = [torch.randn(2, 1, 16) / 4, torch.randn(2, 1, 16) / 4, torch.randn(2, 1, 1)]
    outputs = ensemble_forward(torch.randn(12, 5).expand(2, -1, -1), weights, biases, tanh)
    grad_out = torch.randn(2, 12, 1)
    full = ensemble_input_grad(grad_out, outputs, weights, tanh)  # d/d(input) of every row
    for member, rows in ((0, [1, 4, 5]), (1, [0, 11])):
        index = torch.tensor(rows)
        weights_t = [weights[0][member][3:].t(), *(w[member].t() for w in weights[1:])]  # input columns 3 and 4
        for _ in range(2):  # again with the same (reused) buffers
            got = ensemble_rows_input_grad(grad_out[member, index], outputs, member, weights_t, tanh, index,
                                           workspace, "rows")
            torch.testing.assert_close(got, full[member, index][:, 3:])


@pytest.mark.parametrize("tanh", [False, True])
def test_ensemble_input_grad_equals_autograd_with_the_weights_held_constant(tanh):
    torch.manual_seed(0)
    weights = [torch.randn(3, 5, 16) / 2, torch.randn(3, 16, 16) / 4, torch.randn(3, 16, 1) / 4]
    biases = [torch.randn(3, 1, 16) / 4, torch.randn(3, 1, 16) / 4, torch.randn(3, 1, 1)]
    x = torch.randn(3, 12, 5, requires_grad=True)
    grad_out = torch.randn(3, 12, 1)
    activation = torch.tanh if tanh else torch.relu
    y = x
    for layer, (weight, bias) in enumerate(zip(weights, biases)):
        y = torch.baddbmm(bias, y, weight)
        y = activation(y) if layer < 2 else y
    (expected,) = torch.autograd.grad(y, x, grad_out)
    outputs = ensemble_forward(x.detach(), weights, biases, tanh)
    torch.testing.assert_close(ensemble_input_grad(grad_out, outputs, weights, tanh), expected)
    torch.testing.assert_close(ensemble_input_grad(grad_out, outputs, weights, tanh, slice(3, None), Workspace()),
                               expected[..., 3:])


def test_flat_adam_in_parts_equals_one_step_and_counts_it_once():
    """SAC's update steps the critics' part, then the actor's: with the same gradients, the two parts make the same
    step as one whole step, and the step count (Adam's bias corrections) moves once."""
    def make():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        return net, FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters(), lr=1e-2))

    (_, whole), (_, parts) = make(), make()
    for step in range(3):
        gradient = torch.randn(whole.grad.shape, generator=torch.Generator().manual_seed(step))
        whole.grad.copy_(gradient)
        parts.grad.copy_(gradient)
        whole.step()
        parts.step([slice(10, None)])
        parts.step([slice(0, 4), slice(4, 10)], advance=False)
        torch.testing.assert_close(parts.flat, whole.flat, rtol=1e-6, atol=1e-8)  # (vector lanes differ at the tails)
        assert float(parts.step_count) == float(whole.step_count) == step + 1


def test_a_loaded_state_keeps_each_parameters_own_step_count():
    """Torch's Adam counts steps per parameter: a step the optimizer takes itself with a parameter left without a
    gradient advances the others only, and a parameter added since (no state) starts at 0. A state saved and loaded
    again (`optimizer.load_state_dict`: resume, `load`) keeps each parameter's count and moments."""
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    adam = FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters(), lr=1e-2))
    for _ in range(2):
        adam.grad.normal_()
        adam.step()
    net(torch.randn(5, 3)).square().sum().backward()
    net[0].weight.grad = None  # (the optimizer's own step leaves this parameter alone)
    adam.optimizer.step()
    saved = copy.deepcopy(adam.optimizer.state_dict())  # (as read back from a file)
    assert [float(state["step"]) for state in saved["state"].values()] == [2.0, 3.0, 3.0, 3.0]
    adam.optimizer.load_state_dict(saved)
    adam.check()
    assert adam._step_counts.tolist() == [2.0, 3.0, 3.0, 3.0]
    del saved["state"][3]  # (as the state of a parameter added after the others' steps)
    adam.optimizer.load_state_dict(copy.deepcopy(saved))
    adam.check()
    assert adam._step_counts.tolist() == [2.0, 3.0, 3.0, 0.0]
    assert adam.exp_avg_sq[:12].ne(0).all() and adam.exp_avg_sq[-2:].eq(0).all()
    again = adam.optimizer.state_dict()["state"]
    assert [float(again[i]["step"]) for i in range(4)] == [2.0, 3.0, 3.0, 0.0]
    for i in range(3):
        torch.testing.assert_close(again[i]["exp_avg"], saved["state"][i]["exp_avg"], rtol=0, atol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_each_parameter_steps_with_its_own_count_as_torchs_adam_steps_it(fused):
    """Torch's Adam corrects each parameter's bias with that parameter's own step count: after a step of the
    optimizer itself that left a parameter without a gradient out (a value-only loss leaves log_std's None), or a reset
    of one parameter's state, the flat steps go on as torch's Adam does (whole, clipped, and in parts); while every
    parameter's count is the same they stay one step over the whole buffer."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    reference = copy.deepcopy(net)
    torch_adam = torch.optim.Adam(reference.parameters(), lr=1e-2)
    adam = FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters(), lr=1e-2), max_grad_norm=0.5)
    if not fused:
        adam._fused_adam = None

    def flat_step(parts=None):
        grad = torch.randn_like(adam.grad)
        adam.grad.copy_(grad)
        if parts is None:
            adam.step()
        else:
            adam.max_grad_norm = None
            adam.step(parts[:1])
            adam.step(parts[1:], advance=False)
            adam.max_grad_norm = 0.5
        for p, chunk in zip(reference.parameters(), grad.split([p.numel() for p in net.parameters()])):
            p.grad = chunk.view_as(p).clone()
        if parts is None:
            nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        torch_adam.step()

    def own_step(left_out: int | None):
        x = torch.randn(5, 3)
        for model, optimizer in ((net, adam.optimizer), (reference, torch_adam)):
            optimizer.zero_grad()
            model(x).square().sum().backward()
            if left_out is not None:
                list(model.parameters())[left_out].grad = None
            optimizer.step()

    for _ in range(3):
        flat_step()
    own_step(left_out=None)
    assert not adam.uneven_steps  # (the optimizer's own step with every gradient: the counts stay equal)
    adam.check()
    flat_step()
    own_step(left_out=3)
    assert adam.uneven_steps
    adam.check()
    for _ in range(3):
        flat_step()
    flat_step(parts=[slice(0, 10), slice(10, None)])  # (SAC's pieces: cut inside a parameter, too)
    torch.testing.assert_close(adam.flat, torch.cat([p.detach().reshape(-1) for p in reference.parameters()]),
                               rtol=1e-5, atol=1e-7)
    assert adam._step_counts.tolist() == [float(torch_adam.state[p]["step"]) for p in reference.parameters()]

    adam.optimizer.state[list(net.parameters())[2]] = {}  # (not the first parameter's: noticed all the same)
    torch_adam.state[list(reference.parameters())[2]] = {}
    adam.check()
    flat_step()
    flat_step()
    torch.testing.assert_close(adam.flat, torch.cat([p.detach().reshape(-1) for p in reference.parameters()]),
                               rtol=1e-5, atol=1e-7)


def test_copies_leave_no_hook_on_the_originals_optimizer():
    """A training loop that keeps snapshots (`copy.deepcopy(model)` every so often: self-play, a best model) adds
    nothing to the model's own optimizer: each copy's hook is on the copy's optimizer."""
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    adam = FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters(), lr=1e-2))
    hooks = len(adam.optimizer._optimizer_step_pre_hooks)
    for _ in range(20):
        copied = copy.deepcopy(adam)
        assert len(copied.optimizer._optimizer_step_pre_hooks) == hooks
    assert len(adam.optimizer._optimizer_step_pre_hooks) == hooks == 1


def test_copies_notice_their_own_optimizers_steps_and_even_counts_step_whole():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    adam = FlatAdam(list(net.parameters()), torch.optim.Adam(net.parameters(), lr=1e-2))
    adam.grad.normal_()
    adam.step()
    copied = copy.deepcopy(adam)
    for flat in (copied, adam):
        assert not flat.uneven_steps
        flat.params[0].grad = None
        flat.optimizer.step()
        assert flat.uneven_steps
        flat.check()
        assert flat._step_counts.tolist() == [1.0, 2.0, 2.0, 2.0]
    saved = copy.deepcopy(adam.optimizer.state_dict())
    for state in saved["state"].values():
        state["step"] = torch.tensor(5.0)
    adam.optimizer.load_state_dict(saved)  # (equal counts again: one step over the whole buffer)
    adam.check()
    assert not adam.uneven_steps
