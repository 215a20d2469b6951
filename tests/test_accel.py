"""rlspeed.accel: transparency of auto_accelerate, numerics per strategy, the search, the cache, forcing, fp16 guard.

Timing-dependent choices are not asserted (a test is not a benchmark), except where the gap is structural: a tiny
model at batch 8 is several times slower in bf16 than in fp32 on every machine. torch.compile with inductor is
slow on a CPU, so the recompile test uses dynamo's "eager" backend (same tracing and guards, no code generation);
the one inductor test is marked slow and runs only with RLSPEED_SLOW_TESTS=1.
"""

from __future__ import annotations

import copy
import inspect
import io
import math
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
from conftest import needs_torch_2_9, update
from torch import nn

import rlspeed
from rlspeed.accel import accelerate_step, auto_accelerate, unaccelerate
from rlspeed.accel import search as search_module
from rlspeed.accel.module import AcceleratedModule
from rlspeed.accel.report import Trial
from rlspeed.accel.strategy import EAGER_FP32, Strategy, bf16_supported, reduced_matmul_supported
from rlspeed.errors import UserError
from rlspeed.nn import ActorCritic

CPU = torch.device("cpu")
needs_bf16 = pytest.mark.skipif(not bf16_supported(CPU), reason="no native bf16 on this CPU")
needs_bf16_matmul = pytest.mark.skipif(not reduced_matmul_supported(CPU, "bf16-matmul"),
                                       reason="no bf16 matmul mode on this CPU")


pytestmark = pytest.mark.usefixtures("isolated_accel")  # conftest: own cache, nothing forced, short timing


class Policy(nn.Module):
    """A small user-style module with an extra attribute and a method that calls self()."""

    def __init__(self, obs_dim: int = 4, action_dim: int = 2, hidden: int = 32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, action_dim)
        self.register_buffer("scale", torch.ones(obs_dim))
        self.greeting = "hello"

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(obs * self.scale))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs).argmax(-1)


def make_policy(seed: int = 0, **kwargs) -> Policy:
    torch.manual_seed(seed)
    return Policy(**kwargs)


def plain_copy(model: nn.Module) -> nn.Module:
    """An un-accelerated deep copy (for comparisons)."""
    return unaccelerate(copy.deepcopy(model))


# --- transparency ---------------------------------------------------------------------------------------------
def test_same_object_same_parameters_same_state_dict_keys():
    model = make_policy()
    params = list(model.parameters())
    keys = list(model.state_dict().keys())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # made before accelerating
    accelerated = auto_accelerate(model, device="cpu")
    assert accelerated is model
    assert all(a is b for a, b in zip(accelerated.parameters(), params))
    assert list(accelerated.state_dict().keys()) == keys
    assert not any("_orig_mod" in key for key in accelerated.state_dict())
    assert isinstance(accelerated, Policy)
    before = params[0].detach().clone()
    accelerated(torch.randn(16, 4)).square().sum().backward()
    optimizer.step()
    assert not torch.equal(params[0], before)


def test_outputs_and_signature_match_the_plain_module():
    model = make_policy()
    plain = copy.deepcopy(model)
    accelerated = auto_accelerate(model, device="cpu", precision="fp32", compile=False)
    obs = torch.randn(8, 4)
    assert torch.equal(accelerated(obs), plain(obs))
    assert inspect.signature(accelerated.forward) == inspect.signature(plain.forward)
    assert accelerated.greeting == "hello"
    assert torch.equal(accelerated.greedy(obs), plain.greedy(obs))  # a method calling self() works


def test_train_eval_and_deepcopy():
    model = auto_accelerate(make_policy(), device="cpu")
    model.eval()
    assert not model.training and not model.body.training
    model.train()
    assert model.training and model.body[0].training
    model(torch.randn(8, 4))  # a decision is made and travels with the copy
    twin = copy.deepcopy(model)
    assert type(twin) is type(model) and isinstance(twin, Policy)
    assert all(a is not b and torch.equal(a, b) for a, b in zip(twin.parameters(), model.parameters()))
    obs = torch.randn(8, 4)
    assert torch.equal(twin(obs), model(obs))
    assert twin.accel_report.decisions[0].chosen == model.accel_report.decisions[0].chosen


def test_checkpoints_interoperate_with_plain_modules():
    accelerated = auto_accelerate(make_policy(seed=1), device="cpu", precision="fp32")
    plain = make_policy(seed=2)
    plain.load_state_dict(accelerated.state_dict())
    obs = torch.randn(8, 4)
    assert torch.equal(plain(obs), plain_copy(accelerated)(obs))

    other = make_policy(seed=3)
    accelerated.load_state_dict(other.state_dict())
    assert torch.equal(accelerated(obs), other(obs))

    buffer = io.BytesIO()
    torch.save(accelerated.state_dict(), buffer)
    buffer.seek(0)
    fresh = make_policy(seed=4)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(fresh(obs), other(obs))


def test_whole_module_pickles_and_unaccelerate_restores_the_class():
    model = auto_accelerate(make_policy(), device="cpu")
    obs = torch.randn(4, 4)
    model(obs)  # decided before pickling: the decision travels
    restored = pickle.loads(pickle.dumps(model))
    assert isinstance(restored, Policy) and restored.accel_report.decisions
    assert torch.equal(restored(obs), model(obs))
    unaccelerate(model)
    assert type(model) is Policy
    assert "_rlspeed_accelerator" not in model.__dict__


def test_a_class_accelerated_once_is_freed_with_its_models():
    """auto_accelerate kept every module class it had seen (a module-level table) and all it held: a notebook cell
    or a factory defining a new class per run grew the process for good. A subclass accelerated too gets its own."""
    import gc
    import weakref

    classes = []
    for _ in range(3):
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 2)

            def forward(self, x):
                return self.layer(x)

        model = auto_accelerate(Net(), device="cpu")
        model(torch.zeros(3, 4))
        assert isinstance(model, Net) and type(auto_accelerate(Net(), device="cpu")) is type(model)
        classes.append(weakref.ref(Net))
        del model, Net
    gc.collect()
    assert all(ref() is None for ref in classes)

    class Wider(Policy):
        pass

    assert type(auto_accelerate(Wider(), device="cpu")).__mro__[1:3] == (AcceleratedModule, Wider)


def test_inputs_are_converted_and_moved():
    class Echo(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(()))

        def forward(self, obs, actions, flag=False):
            return obs * self.weight, actions, flag

    model = auto_accelerate(Echo(), device="cpu", precision="fp32", compile=False)
    assert list(inspect.signature(model.forward).parameters) == ["obs", "actions", "flag"]
    assert list(inspect.signature(auto_accelerate(make_policy()).forward).parameters) == ["obs"]
    obs, actions, flag = model(np.zeros((3, 2), dtype=np.float64), np.array([1, 0, 1], dtype=np.int32), flag=True)
    assert obs.dtype == torch.float32 and obs.shape == (3, 2)
    assert actions.dtype == torch.int64  # rules(cpu).index_dtype
    assert flag is True
    obs, actions, _ = model([[0.5, 1.5]], torch.tensor([1], dtype=torch.int16))
    assert obs.dtype == torch.float32 and torch.equal(obs, torch.tensor([[0.5, 1.5]]))
    assert actions.dtype == torch.int64


def test_actor_critic_from_rlspeed_nn_keeps_its_api():
    model = auto_accelerate(ActorCritic(4, 2, discrete=True, hidden=(16, 16)), device="cpu")
    actions, log_probs, values = model.act(np.random.randn(5, 4))
    assert actions.shape == (5,) and log_probs.dtype == torch.float32 and values.shape == (5,)


def test_user_errors_are_one_sentence():
    with pytest.raises(UserError, match="GradScaler"):
        auto_accelerate(make_policy(), device="cpu", precision="fp16")
    with pytest.raises(UserError, match="CUDA"):
        auto_accelerate(make_policy(), device="cpu", graphs=True)
    with pytest.raises(UserError, match="precision"):
        auto_accelerate(make_policy(), device="cpu", precision="fp8")
    with pytest.raises(UserError, match="Module"):
        auto_accelerate(lambda x: x)
    with pytest.raises(UserError, match="did you mean inductor"):  # a misspelled backend, before any call
        auto_accelerate(make_policy(), device="cpu", compile="inducter")
    # (Python's TypeError "got an unexpected keyword argument 'bogus'", which named no option)
    with pytest.raises(UserError, match=r"^auto_accelerate takes no 'bogus' \(its options: device, precision, compile, "
                                        r"graphs, example_inputs\)\.$"):
        auto_accelerate(make_policy(), bogus=1)

    class Agent(nn.Module):  # CleanRL's layout: no forward, methods that call the submodules
        def __init__(self):
            super().__init__()
            self.actor = make_policy()

        def get_action(self, x):
            return self.actor(x)

    with pytest.raises(UserError, match="has no forward.*agent.actor = auto_accelerate"):
        auto_accelerate(Agent(), device="cpu")
    # (a torch.compile()d module has its forward on the instance: what it wraps is accelerated, not refused)
    with pytest.warns(UserWarning, match="torch.compile\\(\\)d module"):  # (compiled no more on a CPU: said)
        compiled = auto_accelerate(torch.compile(make_policy()), device="cpu")
    assert isinstance(compiled, nn.Module) and compiled(torch.randn(3, 4)).shape[0] == 3
    model = make_policy()
    with pytest.raises(UserError, match="needs a torch.optim.Optimizer"):  # the model where the optimizer goes
        accelerate_step(lambda x: model(x).sum(), model)


# --- numerics per strategy ------------------------------------------------------------------------------------
def _forced_module(precision: str) -> tuple[nn.Module, nn.Module]:
    model = make_policy(hidden=64)
    plain = copy.deepcopy(model)
    return auto_accelerate(model, device="cpu", precision=precision, compile=False), plain


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


def test_fp32_is_exact():
    model, plain = _forced_module("fp32")
    obs = torch.randn(32, 4)
    assert torch.equal(model(obs), plain(obs))


@needs_bf16
@pytest.mark.parametrize("precision", ["bf16", pytest.param("bf16-matmul", marks=needs_bf16_matmul)])
def test_reduced_precision_module_stays_within_tolerance(precision):
    model, plain = _forced_module(precision)
    obs = torch.randn(256, 4)
    out = model(obs)
    assert out.dtype == torch.float32  # outputs come back in the model's dtype
    assert _rel_err(out, plain(obs)) < 2e-2
    out.square().mean().backward()
    plain(obs).square().mean().backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        cosine = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
        assert cosine > 0.99
    assert model.accel_strategy.precision == precision


@needs_torch_2_9
@pytest.mark.parametrize(("flags", "native", "matmul_mode"), [({"avx512f", "avx512bw"}, False, False),
                                                             ({"avx512f", "avx512_bf16"}, True, False),
                                                             ({"avx2", "amx_bf16"}, True, True), (None, True, True)])
def test_bf16_is_tried_on_x86_cpus_only_where_their_flags_say_it_is_native(monkeypatch, flags, native, matmul_mode):
    """oneDNN's own check accepts AVX-512 CPUs that emulate bf16 (slower than fp32): bf16 is offered only with
    AVX512_BF16 or AMX (unreadable flags: oneDNN's check). Its bf16 math mode for fp32 matmuls computes fp32 without
    AMX (with AVX512_BF16 alone it gives fp32's results), so bf16-matmul is offered only with AMX: a search would time
    fp32 twice."""
    from rlspeed.accel import strategy

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(strategy.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(strategy, "_x86_cpu_flags", lambda: flags)
    strategy._cpu_native_bf16.cache_clear()
    try:
        assert bf16_supported(CPU) is native
        assert reduced_matmul_supported(CPU, "bf16-matmul") is matmul_mode
    finally:
        strategy._cpu_native_bf16.cache_clear()


@needs_bf16_matmul
def test_where_bf16_matmul_is_offered_it_computes_in_bf16():
    """The mode is offered only where it changes the arithmetic (bf16's 8-bit mantissa: errors of about 1e-3 where
    fp32's are about 1e-7), not where oneDNN runs its fp32 kernels under it."""
    from rlspeed.accel.strategy import MatmulPrecision

    generator = torch.Generator().manual_seed(0)
    a, w = torch.randn(256, 256, generator=generator), torch.randn(256, 256, generator=generator)
    exact = a.double() @ w.double().T
    with MatmulPrecision(CPU, "bf16-matmul"):
        reduced = torch.nn.functional.linear(a, w)
    assert ((reduced.double() - exact).abs().max() / exact.abs().max()).item() > 1e-4


@needs_bf16_matmul
def test_bf16_matmul_setting_is_held_only_while_accelerated_code_runs():
    setting = torch.backends.mkldnn.matmul
    before = setting.fp32_precision
    model, plain = _forced_module("bf16-matmul")
    seen = []
    model.head.register_forward_hook(lambda *_: seen.append(setting.fp32_precision))
    model.head.weight.register_hook(lambda grad: seen.append(setting.fp32_precision))
    out = model(torch.randn(64, 4))
    assert setting.fp32_precision == before  # restored after the forward
    out.sum().backward()
    assert seen == ["bf16", "bf16"]  # forward and the backward flowing into the outputs ran in bf16-matmul
    assert setting.fp32_precision == before  # restored when that backward pass ended
    plain(torch.randn(64, 4)).sum().backward()  # unrelated code is untouched
    assert setting.fp32_precision == before


def _regression_problem(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    inputs = torch.randn(128, 8)
    targets = inputs[:, :1].sin() + 0.1 * inputs[:, 1:2]

    def loss_fn(x, y):
        return (model(x) - y).square().mean()

    return model, loss_fn, inputs, targets


def _train(precision: str, steps: int = 30, fused_optimizer: bool | str = "auto", **kwargs):
    model, loss_fn, inputs, targets = _regression_problem()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = accelerate_step(loss_fn, optimizer, precision=precision, compile=False, fused_optimizer=fused_optimizer,
                           **kwargs)
    losses = [step(inputs, targets) for _ in range(steps)]
    return model, step, torch.stack(losses)


def _train_plain(steps: int = 30):
    model, loss_fn, inputs, targets = _regression_problem()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = loss_fn(inputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return model, torch.stack(losses)


def test_fp32_step_matches_the_plain_update():
    plain_model, plain_losses = _train_plain()
    model, step, losses = _train("fp32", fused_optimizer=False)
    assert torch.equal(losses, plain_losses)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain_model.parameters()))
    fused_model, fused_step, fused_losses = _train("fp32")  # fused Adam: same algorithm, rounding may differ
    assert fused_step.optimizers[0].param_groups[0]["fused"] is True
    assert torch.allclose(fused_losses, plain_losses, rtol=1e-4, atol=1e-6)


@needs_bf16
@pytest.mark.parametrize("precision", ["bf16", pytest.param("bf16-matmul", marks=needs_bf16_matmul)])
def test_reduced_precision_step_learns_like_fp32(precision):
    _, plain_losses = _train_plain()
    _, step, losses = _train(precision)
    assert step.strategy.precision == precision
    assert losses.dtype == torch.float32
    assert _rel_err(losses, plain_losses) < 5e-2
    assert losses[-1] < 0.5 * losses[0]


def test_fp16_step_uses_a_grad_scaler_and_learns():
    _, plain_losses = _train_plain()
    _, step, losses = _train("fp16", max_grad_norm=10.0)
    assert step.scaler is not None
    assert torch.isfinite(losses).all()
    assert _rel_err(losses, plain_losses) < 5e-2
    assert step.skipped_steps() <= 16


def test_fp16_falls_back_to_fp32_when_gradients_keep_overflowing():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def exploding_loss(x):  # overflows fp16 (max 65504) on every step, fine in fp32
        return (model(x) * 1e5).square().mean() * 1e-10

    step = accelerate_step(exploding_loss, optimizer, precision="fp16", compile=False)
    x = torch.randn(8, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(70):
            step(x)
    assert step.fell_back and step.strategy.precision == "fp32" and step.scaler is None
    assert any("falling back" in str(w.message) for w in caught)
    assert step.report.decisions[-1].source == "fallback"
    before = model.weight.detach().clone()
    step(x)
    assert not torch.equal(model.weight, before)  # fp32 steps are taken again


def test_step_differentiates_only_the_optimizer_parameters():
    torch.manual_seed(0)
    actor, critic = nn.Linear(3, 2), nn.Linear(5, 1)
    optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)

    def actor_loss(obs):
        return -critic(torch.cat((obs, actor(obs)), -1)).mean()

    step = accelerate_step(actor_loss, optimizer, precision="fp32", compile=False)
    out = step(torch.randn(4, 3))
    assert out.requires_grad is False
    assert all(p.grad is None for p in critic.parameters())
    assert all(p.grad is not None for p in actor.parameters())


def test_step_returns_aux_outputs_detached_in_fp32():
    model, loss_fn, inputs, targets = _regression_problem()

    def loss_and_stats(x, y):
        prediction = model(x)
        return (prediction - y).square().mean(), prediction.mean()

    step = accelerate_step(loss_and_stats, torch.optim.SGD(model.parameters(), lr=0.1), precision="fp32",
                           compile=False)
    loss, mean = step(inputs, targets)
    assert loss.dim() == 0 and not loss.requires_grad and not mean.requires_grad
    with pytest.raises(UserError, match="scalar"):
        accelerate_step(lambda x, y: model(x), torch.optim.SGD(model.parameters(), lr=0.1), precision="fp32",
                        compile=False)(inputs, targets)


# --- search, cache, forcing -------------------------------------------------------------------------------------
def test_tiny_model_stays_fp32_and_the_search_leaves_no_trace(monkeypatch):
    monkeypatch.setattr(search_module, "TIMING_BUDGET_S", 0.2)  # a real decision: the default rounds
    monkeypatch.setattr(search_module, "ROUNDS", 11)
    model = make_policy()
    torch.manual_seed(123)
    obs = torch.randn(8, 4)
    rng_before = torch.get_rng_state()
    with torch.no_grad():
        model = auto_accelerate(model, device="cpu", example_inputs=obs)
    assert torch.equal(torch.get_rng_state(), rng_before)
    decision = model.accel_report.decisions[0]
    assert all(p.grad is None for p in model.parameters())
    if decision.source == "only candidate":  # (a CPU without native bf16: nothing to compare fp32 with)
        assert decision.chosen == EAGER_FP32 and not decision.trials
        return
    assert decision.source == "search"
    assert [t.strategy.precision for t in decision.trials][0] == "fp32"
    if len(decision.trials) > 1:  # bf16 exists on this CPU: at batch 8 it is much slower, fp32 must stay
        assert decision.chosen == EAGER_FP32
    text = str(model.accel_report)
    assert "fp32" in text and "candidate" in text


def _two_candidates(monkeypatch) -> None:
    """fp32 eager against bf16 autocast (which runs on any CPU): a search with something to compare."""
    monkeypatch.setattr("rlspeed.accel.module.candidates", lambda *a, **k: ([EAGER_FP32, Strategy("bf16")], []))


def test_first_calls_of_a_small_model_run_plain_without_searching(monkeypatch):
    _two_candidates(monkeypatch)
    model = auto_accelerate(make_policy(), device="cpu")
    plain = plain_copy(model)
    obs = torch.randn(4)
    for _ in range(50):  # rollout-like calls (one state, no_grad) and update-like calls (a minibatch, with grad)
        with torch.no_grad():
            assert torch.equal(model(obs), plain(obs))
        model(torch.randn(64, 4)).sum().backward()
    accelerator = model._rlspeed_accelerator
    assert accelerator.searches == 0
    assert [d.source for d in model.accel_report.decisions] == ["waiting", "waiting"]
    assert "fp32 eager until" in str(model.accel_report)
    assert not os.path.isdir(os.path.join(os.environ["RLSPEED_CACHE_DIR"], "accel"))  # nothing decided, nothing cached


class _HalfSecondCalls:
    """A `time` module whose perf_counter advances 0.25 s per read: a call timed by two reads takes 0.5 s."""

    now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.25
        return self.now


def test_a_kind_of_call_is_searched_once_its_calls_pay_for_the_search(monkeypatch):
    _two_candidates(monkeypatch)
    # A clock on which every plain call takes 0.5 s, and a search expected to cost as much as 49.5 calls' share:
    # the search is due once 50 calls have run.
    monkeypatch.setattr("rlspeed.accel.module.time", _HalfSecondCalls())
    monkeypatch.setattr("rlspeed.accel.module.expected_search_s",
                        lambda per_call_s, *counts: 0.03 * (49.5 * per_call_s or 1e-12))
    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", 0.03)
    model = auto_accelerate(make_policy(), device="cpu")
    accelerator = model._rlspeed_accelerator
    obs = torch.randn(8, 4)
    with torch.no_grad():
        for _ in range(50):
            model(obs)
        assert accelerator.searches == 0
        model(obs)
        assert accelerator.searches == 1
        for _ in range(100):
            model(obs)
    assert accelerator.searches == 1  # decided for good
    decision, = model.accel_report.decisions
    assert decision.source == "search" and "after 50 fp32 calls" in decision.reason
    assert decision.trials and decision.chosen == accelerator.strategies[(8, False, True)]

    # A later run of the same model finds the decision in the cache and uses it from the first call.
    again = auto_accelerate(make_policy(seed=3), device="cpu")
    with torch.no_grad():
        again(obs)
    assert again._rlspeed_accelerator.searches == 0
    assert [d.source for d in again.accel_report.decisions] == ["cache"]
    assert again.accel_strategy == decision.chosen


def test_time_lost_to_other_processes_does_not_make_a_winner_on_a_cpu(monkeypatch):
    """On a CPU the search counts a speed-up only where the process's CPU time agrees with the wall clock: a
    baseline whose calls lose wall time waiting for the cores (other processes running) but take the same CPU time
    as a rival's does not make that rival win. Clocks are simulated: each fp32 call takes 3 ms of wall time and
    1 ms of CPU time, each rival call 1 ms of both."""

    class Clocks:
        wall = cpu = 0.0

        def perf_counter(self):
            return self.wall

        def process_time(self):
            return self.cpu

    clocks = Clocks()
    monkeypatch.setattr(search_module, "time", clocks)
    monkeypatch.setattr(search_module, "compare", lambda result, reference, tolerance, trial: setattr(
        trial, "passed", True))
    weight = torch.zeros(2, requires_grad=True)

    def build(strategy):
        def run():
            weight.grad = torch.ones(2)
            clocks.wall += 3e-3 if strategy == EAGER_FP32 else 1e-3
            clocks.cpu += 1e-3
            return None, 1.0
        return run

    chosen, trials, reason = search_module.run_search([EAGER_FP32, Strategy("bf16-matmul")], build, [weight],
                                                      torch.device("cpu"), budget_s=0.1)
    assert chosen == EAGER_FP32 and "1.00x" in reason, reason
    assert trials[1].ms_per_call < trials[0].ms_per_call  # the wall clock alone would have picked it


def test_a_tie_goes_to_the_more_precise_candidate():
    """Rivals within 5% of the fastest: the one earlier in the candidates' order (more precise) is chosen."""
    candidates = [EAGER_FP32, Strategy("bf16-matmul"), Strategy("bf16")]
    trials = [Trial(EAGER_FP32, ms_per_call=3.0, speedup=1.0, passed=True, reference=True),
              Trial(candidates[1], ms_per_call=1.02, speedup=2.9, passed=True),
              Trial(candidates[2], ms_per_call=1.0, speedup=3.0, passed=True)]
    assert search_module.choose(candidates, trials)[0] == candidates[1]
    trials[2].speedup = 3.5  # clearly faster: the less precise one wins
    assert search_module.choose(candidates, trials)[0] == candidates[2]
    # a more precise rival within 5% that does not pass the 1.11x margin itself does not stop one that does
    trials[1].speedup, trials[2].speedup = 1.095, 1.15
    assert search_module.choose(candidates, trials)[0] == candidates[2]


def test_a_step_runs_plain_until_its_calls_pay_for_the_search_then_uses_the_cached_choice(monkeypatch):
    """`accelerate_step` waits as modules do: its first calls are the plain step (the same losses and weights as
    the plain loop, with `fused_optimizer=False`), the search runs once the calls have taken what it is expected to
    cost / SEARCH_COST_SHARE, and a later step of the same function takes the cached choice at its first call."""
    monkeypatch.setattr("rlspeed.accel.step.candidates",
                        lambda *a, **k: ([EAGER_FP32, Strategy("bf16")], []))

    monkeypatch.setattr("rlspeed.accel.step.time", _HalfSecondCalls())  # every plain step takes 0.5 s
    monkeypatch.setattr("rlspeed.accel.module.expected_search_s",
                        lambda per_call_s, *counts: 0.03 * (9.5 * per_call_s or 1e-12))
    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", 0.03)
    _, plain_losses = _train_plain(steps=10)
    model, loss_fn, inputs, targets = _regression_problem()
    step = accelerate_step(loss_fn, torch.optim.Adam(model.parameters(), lr=1e-2), compile=False,
                           fused_optimizer=False)
    losses = torch.stack([step(inputs, targets) for _ in range(10)])
    assert torch.equal(losses, plain_losses)  # the plain step, bit for bit, while it waits
    assert [d.source for d in step.report.decisions] == ["waiting"] and "fp32 eager until the step" in str(step.report)
    step(inputs, targets)  # 10 calls of 0.5 s pay for the search
    decision, = step.report.decisions
    assert decision.source == "search" and "after 10 fp32 calls" in decision.reason
    again = accelerate_step(loss_fn, torch.optim.Adam(model.parameters(), lr=1e-2), compile=False,
                            fused_optimizer=False)
    again(inputs, targets)
    assert [d.source for d in again.report.decisions] == ["cache"] and again.strategy == decision.chosen


@needs_bf16_matmul
def test_hand_derived_updates_are_checked_and_timed_by_the_same_search(monkeypatch):
    from types import SimpleNamespace

    from rlspeed.fused.precision import AutoMatmulPrecision

    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", math.inf)  # (searched at the first call)

    class Update:
        """A hand-derived update whose gradient is wrong when matmuls run in bf16."""

        def __init__(self):
            self.adam = SimpleNamespace(grad=torch.zeros(16), check=lambda: None)
            self.adam.grad_views = [self.adam.grad]
            self.steps = 0

        def gradient(self, x):
            sign = -1.0 if torch.backends.mkldnn.matmul.fp32_precision == "bf16" else 1.0
            self.adam.grad.copy_(sign * (x.T @ x).sum(0))

        def __call__(self, x):
            self.gradient(x)
            self.steps += 1
            return self.adam.grad.sum()

    update = Update()
    auto = AutoMatmulPrecision(update, CPU, "toy")
    x = torch.randn(32, 16)
    auto(x)
    assert auto.precision == "fp32" and update.steps == 1  # the search ran no step of its own
    reference, candidate = auto.trials
    assert isinstance(candidate, Trial) and reference.reference and candidate.strategy.precision == "bf16-matmul"
    assert not candidate.passed and "gradient cosine" in candidate.error  # the shared tolerances rejected it
    torch.testing.assert_close(update.adam.grad, (x.T @ x).sum(0))
    assert auto.summary() == {"precision": "fp32", "compile": "off", "chosen_by": "search",
                              "reason": "no other candidate passed the accuracy checks"}
    assert "bf16-matmul" in str(auto)


def test_choose_needs_a_margin():
    fp32, bf16 = Strategy("fp32"), Strategy("bf16")
    trials = [Trial(fp32, ms_per_call=1.0, passed=True, reference=True), Trial(bf16, ms_per_call=0.95, passed=True)]
    assert search_module.choose([fp32, bf16], trials)[0] == fp32  # 5% faster is not enough
    trials[1].ms_per_call = 0.5
    assert search_module.choose([fp32, bf16], trials)[0] == bf16
    trials[1].speedup = 1.02  # the best rounds say 2x, the round-paired median says noise: no
    assert search_module.choose([fp32, bf16], trials)[0] == fp32
    trials[1].speedup = 1.9
    assert search_module.choose([fp32, bf16], trials)[0] == bf16
    trials[1].passed = False
    assert search_module.choose([fp32, bf16], trials)[0] == fp32  # inaccurate never wins


def test_second_model_reuses_the_cached_choice_without_measuring(monkeypatch):
    obs = torch.randn(64, 4)
    first = auto_accelerate(make_policy(), device="cpu", example_inputs=obs)
    if len(first.accel_report.decisions[0].trials) < 2:
        pytest.skip("only one candidate on this machine: nothing is searched or cached")
    assert first.accel_report.decisions[0].source == "search"
    assert any(os.scandir(os.environ["RLSPEED_CACHE_DIR"] + "/accel"))

    def no_search(*args, **kwargs):
        raise AssertionError("the cached choice should have been used")

    monkeypatch.setattr("rlspeed.accel.module.run_search", no_search)
    second = auto_accelerate(make_policy(seed=5), device="cpu", example_inputs=obs)
    decision = second.accel_report.decisions[0]
    assert decision.source == "cache"
    assert decision.chosen == first.accel_report.decisions[0].chosen
    assert decision.trials  # the cached record keeps what was measured


def test_step_cache(monkeypatch):
    """A step decided by a search (example_inputs: decided when it is made) caches its choice: a later step of the
    same loss code takes it at its first call without measuring. (A step's first call runs plain, waiting for its
    calls to pay for a search: one call alone never searched, and this test skipped on every machine.)"""
    monkeypatch.setattr("rlspeed.accel.step.candidates", lambda *a, **k: ([EAGER_FP32, Strategy("bf16")], []))

    def searched_step():
        model, loss_fn, inputs, targets = _regression_problem()
        return accelerate_step(loss_fn, torch.optim.Adam(model.parameters(), lr=1e-2), compile=False,
                               example_inputs=(inputs, targets)), inputs, targets

    step, _, _ = searched_step()
    assert step.report.decisions[0].source == "search"
    monkeypatch.setattr("rlspeed.accel.step.run_search", lambda *a, **k: (_ for _ in ()).throw(AssertionError()))
    again, inputs, targets = searched_step()
    again(inputs, targets)
    assert again.report.decisions[0].source == "cache"
    assert again.strategy == step.strategy


def test_environment_variable_forces_the_strategy(monkeypatch):
    monkeypatch.setattr("rlspeed.accel.module.run_search", lambda *a, **k: (_ for _ in ()).throw(AssertionError()))
    monkeypatch.setenv("RLSPEED_ACCELERATE", "off")
    model = auto_accelerate(make_policy(), device="cpu", precision="bf16")  # the variable wins over arguments
    model(torch.randn(8, 4))
    assert model.accel_strategy == EAGER_FP32
    assert model.accel_report.decisions[0].source == "forced"

    if bf16_supported(CPU):
        monkeypatch.setenv("RLSPEED_ACCELERATE", "bf16")
        model = auto_accelerate(make_policy(), device="cpu")
        model(torch.randn(8, 4))
        assert model.accel_strategy == Strategy("bf16")

    # graphs, which a CPU cannot capture, were ignored, but the torch.compile they imply ran (inductor's minutes)
    monkeypatch.setenv("RLSPEED_ACCELERATE", "graphs")
    model = auto_accelerate(make_policy(), device="cpu")
    model(torch.randn(8, 4))
    assert model.accel_strategy == EAGER_FP32 and "and the torch.compile" in " ".join(model.accel_report.notes)

    monkeypatch.setenv("RLSPEED_ACCELERATE", "fp16")  # modules have no GradScaler: fp32, with a note
    model = auto_accelerate(make_policy(), device="cpu")
    assert model.accel_strategy == EAGER_FP32 and "fp16" in " ".join(model.accel_report.notes)

    monkeypatch.setenv("RLSPEED_ACCELERATE", "off")  # a step forced off keeps the user's optimizer untouched
    model, loss_fn, inputs, targets = _regression_problem()
    optimizer = torch.optim.Adam(model.parameters())
    accelerate_step(loss_fn, optimizer)(inputs, targets)
    assert not optimizer.param_groups[0]["fused"]

    monkeypatch.setenv("RLSPEED_ACCELERATE", "warp-speed")
    with pytest.raises(UserError, match="RLSPEED_ACCELERATE"):
        auto_accelerate(make_policy(), device="cpu")


# --- compile ------------------------------------------------------------------------------------------------------
def test_varying_batch_sizes_do_not_recompile_each_time(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setenv("RLSPEED_ACCELERATE", "fp32+compile:eager")  # forced: exactly this strategy
    model = auto_accelerate(make_policy(), device="cpu")
    plain = plain_copy(model)
    for batch in (5, 6, 7, 8, 9, 100, 3):
        x = torch.randn(batch, 4)
        assert torch.allclose(model(x), plain(x), atol=1e-6)
    assert model.accel_compilations >= 1
    compiled = model.accel_compilations
    for batch in (11, 40, 250):  # dynamic shapes: new sizes reuse the graph with a symbolic batch dimension
        model(torch.randn(batch, 4))
    assert model.accel_compilations == compiled


def test_rows_that_interact_stay_correct_when_compiled(monkeypatch):
    class Centred(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x):
            return self.linear(x - x.mean(0))  # each row depends on the whole batch

    torch._dynamo.reset()
    monkeypatch.setenv("RLSPEED_ACCELERATE", "compile:eager")
    model = auto_accelerate(Centred(), device="cpu")
    for batch in (5, 7):
        x = torch.randn(batch, 4)
        assert torch.allclose(model(x), plain_copy(model)(x), atol=1e-6)


def test_search_compiles_only_the_eager_winners_precision():
    torch._dynamo.reset()
    model = auto_accelerate(make_policy(), device="cpu", compile="eager", example_inputs=torch.randn(32, 4))
    trials = model.accel_report.decisions[0].trials
    eager = [t for t in trials if t.strategy.compile == "off"]
    compiled = [t for t in trials if t.strategy.compile != "off"]
    assert eager and len(compiled) == 1  # one compile, not one per precision
    assert compiled[0].passed and compiled[0].ms_per_call is not None
    x = torch.randn(32, 4)
    assert torch.allclose(model(x), plain_copy(model)(x), rtol=2e-2, atol=1e-3)


@pytest.mark.skipif(os.environ.get("RLSPEED_SLOW_TESTS") != "1", reason="inductor compiles for 10-60 s on a CPU; "
                    "set RLSPEED_SLOW_TESTS=1")
def test_inductor_step_matches_eager(monkeypatch):
    _, plain_losses = _train_plain(steps=5)
    model, loss_fn, inputs, targets = _regression_problem()
    monkeypatch.setenv("RLSPEED_ACCELERATE", "fp32+compile")
    step = accelerate_step(loss_fn, torch.optim.Adam(model.parameters(), lr=1e-2))
    losses = torch.stack([step(inputs, targets) for _ in range(5)])
    assert step.compilations >= 1
    assert torch.allclose(losses, plain_losses, rtol=1e-3)


def test_public_names_are_exported():
    assert rlspeed.auto_accelerate is auto_accelerate
    assert rlspeed.accelerate_step is accelerate_step


def test_a_dtype_change_after_wrapping_takes_the_new_dtype():
    """`.double()` (or `.to(dtype)`) after `auto_accelerate`: float64 inputs stay float64 and the outputs equal the
    plain double model's (the wrap-time input conversion narrowed them to float32: a dtype error in the first
    matmul); `.float()` back narrows them again."""
    model = make_policy()
    plain = copy.deepcopy(model).double()
    model = auto_accelerate(model, device="cpu").double()
    x = torch.randn(5, 4, dtype=torch.float64)
    assert torch.equal(model(x), plain(x))
    assert model.float()(x).dtype == torch.float32


def _adam_run(steps: int, checkpoint: dict | None = None, accelerated: bool = True):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    if checkpoint is not None:  # (a resume: loaded before the step is made, as a script does)
        checkpoint = copy.deepcopy(checkpoint)  # (as read from a file: torch.load gives each load its own tensors)
        net.load_state_dict(checkpoint["net"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    step = accelerate_step(lambda x: net(x).square().mean(), optimizer, precision="fp32", compile=False)
    torch.manual_seed(1 if checkpoint is None else 2)
    for _ in range(steps):
        update(step, torch.randn(8, 3), accelerated=accelerated)
    return net, optimizer


def test_the_fused_adam_switch_stays_out_of_the_optimizers_checkpoint():
    """accelerate_step's switch to fused Adam went into `optimizer.state_dict()`: a plain script resuming from that
    checkpoint got a fused Adam it never asked for (other roundings). Now the checkpoint keeps the optimizer's own
    settings, and a resumed accelerated run is fused again, as the uninterrupted one."""
    net, optimizer = _adam_run(3)
    assert optimizer.param_groups[0]["fused"] is True
    checkpoint = {"net": copy.deepcopy(net.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict())}
    assert checkpoint["optimizer"]["param_groups"][0]["fused"] is None
    assert checkpoint["optimizer"]["param_groups"][0]["foreach"] is None

    _, plain = _adam_run(0, checkpoint, accelerated=False)
    assert plain.param_groups[0]["fused"] is None and plain.param_groups[0]["foreach"] is None

    _, resumed = _adam_run(2, checkpoint)
    assert resumed.param_groups[0]["fused"] is True
    optimizer.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))  # (into the accelerated optimizer itself)
    assert optimizer.param_groups[0]["fused"] is True

    torch.manual_seed(5)
    xs = [torch.randn(8, 3) for _ in range(4)]
    whole, whole_optimizer = _adam_run(0, checkpoint)
    whole_step = accelerate_step(lambda x: whole(x).square().mean(), whole_optimizer, precision="fp32",
                                 compile=False)
    for x in xs:
        whole_step(x)
    half, half_optimizer = _adam_run(0, checkpoint)
    half_step = accelerate_step(lambda x: half(x).square().mean(), half_optimizer, precision="fp32", compile=False)
    for x in xs[:2]:
        half_step(x)
    again = {"net": copy.deepcopy(half.state_dict()), "optimizer": copy.deepcopy(half_optimizer.state_dict())}
    resumed, resumed_optimizer = _adam_run(0, again)
    resumed_step = accelerate_step(lambda x: resumed(x).square().mean(), resumed_optimizer, precision="fp32",
                                   compile=False)
    for x in xs[2:]:
        resumed_step(x)
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters()))  # (fused throughout)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"max_grad_norm": "0.5"}, "max_grad_norm must be a number > 0 or None, got '0.5'"),  # (a flag read as a string)
    ({"max_grad_norm": float("nan")}, "max_grad_norm must be a number > 0"),  # (it made every weight NaN in silence)
    ({"max_grad_norm": 0}, "max_grad_norm must be a number > 0"),
    ({"fused_optimizer": "maybe"}, "Unknown fused_optimizer setting 'maybe'"),  # (taken as auto in silence)
    # (Python's TypeError "got an unexpected keyword argument", which named no option)
    ({"precison": "fp32"}, r"accelerate_step takes no 'precison' \(its options: params, max_grad_norm, device, "
                           r"precision, .*\); did you mean precision\?"),
])
def test_accelerate_step_refuses_a_bad_setting_in_one_sentence(kwargs, match):
    """A max_grad_norm given as a string failed with "'<=' not supported between instances of 'str' and 'int'"; NaN
    was taken and turned every gradient (and weight) NaN; an unknown fused_optimizer value was taken as auto."""
    net = torch.nn.Linear(3, 1)
    with pytest.raises(UserError, match=match):
        accelerate_step(lambda x: net(x).mean(), torch.optim.Adam(net.parameters()), **kwargs)


def test_accelerate_step_takes_its_settings_in_their_usual_spellings():
    net = torch.nn.Linear(3, 1)
    for kwargs in ({"max_grad_norm": 1}, {"max_grad_norm": np.float32(0.5)}, {"fused_optimizer": "off"},
                   {"fused_optimizer": "True"}, {"fused_optimizer": None}, {"fused_optimizer": False}):
        step = accelerate_step(lambda x: net(x).mean(), torch.optim.Adam(net.parameters()), **kwargs)
        step(torch.randn(4, 3))
    assert step.max_grad_norm is None


@pytest.mark.parametrize(("loss_fn", "match"), [
    (lambda net, x: net(x).detach().mean(), "does not depend on any parameter"),  # (no gradient would flow)
    (lambda net, x: net(x), "must be a scalar"),
    (lambda net, x: 1.0, "must return a scalar loss tensor"),
])
def test_accelerate_step_names_a_loss_it_cannot_train_on(loss_fn, match):
    """A loss without a gradient, a non-scalar loss and a non-tensor are each one sentence, not torch's errors."""
    net = torch.nn.Linear(3, 1)
    step = accelerate_step(lambda x: loss_fn(net, x), torch.optim.Adam(net.parameters()))
    with pytest.raises(UserError, match=match):
        step(torch.randn(4, 3))


def test_integer_inputs_are_never_narrowed_and_auto_keeps_the_models_accelerator(monkeypatch):
    """Where a device prefers int32 indices (NPU), a script's int64 actions were narrowed to int32, and
    F.cross_entropy(logits, actions) failed ("expected ... Long"); narrower integers are still widened. `device="auto"`
    moved a model on an accelerator (`model.to("npu:1")`, a torchrun rank's device) to device 0: it stays where it is,
    and otherwise auto takes the current device of the chosen type."""
    from rlspeed import device as devices
    from rlspeed.accel.inputs import InputConverter
    from rlspeed.accel.module import _target_device
    from rlspeed.device import DeviceRules

    monkeypatch.setattr("rlspeed.accel.inputs.rules", lambda device: DeviceRules(torch.int32, True, True))
    converter = InputConverter(torch.device("cpu"))
    assert converter.convert(torch.tensor([1, 0], dtype=torch.int64)).dtype == torch.int64
    assert converter.convert(np.array([1, 0], dtype=np.int64)).dtype == torch.int64
    assert converter.convert(torch.tensor([1], dtype=torch.int16)).dtype == torch.int32

    on_meta = nn.Linear(2, 2, device="meta")  # (a device other than the CPU, as an accelerator is)
    assert _target_device(on_meta, "auto") == torch.device("meta")
    with monkeypatch.context() as env:  # (RLSPEED_DEVICE naming another type is the user's choice over the placement)
        env.setenv("RLSPEED_DEVICE", "cpu")
        assert _target_device(on_meta, "auto") == torch.device("cpu")
    monkeypatch.setattr(devices, "is_available", lambda kind: kind in ("cpu", "cuda"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert devices.resolve_device("auto") == torch.device("cuda", 1)


def test_auto_accelerate_of_an_rlspeed_model_names_accelerate_auto():
    """`auto_accelerate(model)` of an rlspeed model (the README's table names `auto_accelerate(model)`) said only
    that it expects a torch.nn.Module: it says that the model accelerates its own steps with accelerate='auto'."""
    model = rlspeed.PPO("CartPole-v1", device="cpu", seed=0)
    with pytest.raises(UserError, match=r"^auto_accelerate takes a torch.nn.Module of your own training code, not an "
                                        r"rlspeed model \(a PPO\), which accelerates its own steps: make it with "
                                        r"accelerate='auto' \(PPO\(env_id, accelerate='auto'\); the command line's "
                                        r"--accelerate auto\)\.$"):
        auto_accelerate(model)
    with pytest.raises(UserError, match="expects a torch.nn.Module, got list"):
        auto_accelerate([])


def test_before_a_decision_the_lines_run_the_plain_scripts_torch_operations():
    """A CleanRL-style script with `auto_accelerate` on its rollout network and `accelerate_step` for its update
    (`fused_optimizer=False`), before anything is decided, runs the plain script's torch operations, each as often
    (the step adds one `detach`, of the loss it returns), starts no thread and leaves torch's thread counts and grad
    mode as they were: counts that hold whatever the machine's load, which the time of a short script does not."""
    import collections
    import threading

    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func).startswith("aten."):  # (not the profiler's markers: zero_grad's, which the step skips)
                self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    def script(lines: bool) -> collections.Counter:
        torch.manual_seed(0)
        q_network = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
        target = copy.deepcopy(q_network)
        optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-3)

        def loss_fn(obs, actions, rewards, next_obs):
            with torch.no_grad():
                td_target = rewards + 0.99 * target(next_obs).max(dim=1).values
            return nn.functional.mse_loss(q_network(obs).gather(1, actions).squeeze(1), td_target)

        if lines:
            q_network = auto_accelerate(q_network)
            step = accelerate_step(loss_fn, optimizer, fused_optimizer=False)
        batch = (torch.randn(8, 4), torch.randint(0, 2, (8, 1)), torch.randn(8), torch.randn(8, 4))
        with CountOps() as counter:
            for _ in range(3):
                q_network(torch.randn(1, 4)).argmax(dim=1)  # (the rollout's call, with grad as in CleanRL's DQN)
                if lines:
                    step(*batch)
                else:
                    loss = loss_fn(*batch)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        if lines:
            assert q_network.accel_report.decisions[-1].source == step.report.decisions[-1].source == "waiting"
        return counter.ops

    # (the threads alive before, not their count: an earlier test's thread may end meanwhile)
    alive, threads = set(threading.enumerate()), (torch.get_num_threads(), torch.get_num_interop_threads())
    plain = script(lines=False)
    accelerated = script(lines=True)
    assert accelerated - plain == collections.Counter({"aten.detach.default": 3})
    assert plain - accelerated == collections.Counter()
    assert set(threading.enumerate()) - alive == set()
    assert (torch.get_num_threads(), torch.get_num_interop_threads()) == threads
    assert torch.is_grad_enabled()


def test_auto_leaves_adam_unfused_on_a_cpu_running_several_threads():
    """On a CPU running several torch threads, the fused Adam kernel splits every parameter over the threads at each
    step (more thread-pool synchronisations than torch's default loop for a small network): `auto` leaves the
    optimizer as the script made it there and says so, fuses with one thread; True fuses anyway."""
    def fused_after_a_step(threads: int, fused_optimizer="auto"):
        model = nn.Linear(4, 2)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            step = accelerate_step(lambda x: model(x).square().mean(), optimizer, precision="fp32",
                                   fused_optimizer=fused_optimizer)
            step(torch.randn(8, 4))
        finally:
            torch.set_num_threads(previous)
        return optimizer.param_groups[0]["fused"], step.report.notes

    fused, notes = fused_after_a_step(2)
    assert not fused
    assert any("left as is: torch runs 2 threads" in note for note in notes)
    assert fused_after_a_step(1)[0] is True
    assert fused_after_a_step(2, fused_optimizer=True)[0] is True
