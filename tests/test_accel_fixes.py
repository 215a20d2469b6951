"""rlspeed.accel regressions: the search must not touch the caller's graphs, gradients or buffers, must not reuse a
choice across an edited forward, must not pass outputs it cannot check, and must handle empty batches and float64
models.

Most tests need a real search (two candidates), which a CPU without native bf16 or a forced strategy would not
run: `two_candidates` makes the candidates fp32 eager and bf16 autocast (which runs, slowly, on any CPU), with no
torch.compile involved, and a module searches on the first call of each kind (instead of once its calls have
taken long enough to pay for the search: tests/test_accel.py covers that rule).
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import needs_torch_2_9, update
from torch import nn

from rlspeed.accel import accelerate_step, auto_accelerate, unaccelerate
from rlspeed.accel.strategy import EAGER_FP32, Strategy

BF16 = Strategy("bf16")


pytestmark = pytest.mark.usefixtures("isolated_accel")  # conftest: own cache, nothing forced, short timing


@pytest.fixture
def two_candidates(monkeypatch):
    """Modules and steps made after this search fp32 eager against bf16 autocast, modules on each kind's first
    call."""

    def fake_candidates(request, device, *, allow_fp16, whole_step_graphs=False, float_dtype=torch.float32):
        return [EAGER_FP32, BF16], []

    monkeypatch.setattr("rlspeed.accel.module.candidates", fake_candidates)
    monkeypatch.setattr("rlspeed.accel.step.candidates", fake_candidates)
    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", math.inf)  # any time spent pays for a search


def _mlp(inputs: int, outputs: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, 32), nn.Tanh(), nn.Linear(32, outputs))


def _cached_files() -> list[str]:
    root = os.path.join(os.environ["RLSPEED_CACHE_DIR"], "accel")
    return os.listdir(root) if os.path.isdir(root) else []


# --- 1. the search and the caller's graph ------------------------------------------------------------------------
def test_search_leaves_an_upstream_graph_and_its_gradients_alone(two_candidates):
    actor, critic = _mlp(3, 2, seed=1), _mlp(5, 1, seed=2)
    plain_actor, plain_critic = copy.deepcopy(actor), copy.deepcopy(critic)
    critic = auto_accelerate(critic, device="cpu")
    obs = torch.randn(16, 3)
    q = critic(torch.cat((obs, actor(obs)), -1))  # the first call searches, with an input attached to a graph
    assert critic.accel_report.decisions[-1].source == "search"
    assert all(p.grad is None for p in actor.parameters())  # no dry-run gradients upstream
    assert all(p.grad is None for p in critic.parameters())
    (-q.mean()).backward()  # the upstream graph is still there
    (-plain_critic(torch.cat((obs, plain_actor(obs)), -1)).mean()).backward()
    for p, ref in zip([*actor.parameters(), *critic.parameters()], [*plain_actor.parameters(),
                                                                    *plain_critic.parameters()]):
        assert torch.allclose(p.grad, ref.grad, rtol=1e-5, atol=1e-6)


def test_search_leaves_the_gradient_of_a_leaf_input_alone(two_candidates):
    model = auto_accelerate(_mlp(4, 1), device="cpu")
    plain = unaccelerate(copy.deepcopy(model))
    obs = torch.randn(16, 4, requires_grad=True)
    out = model(obs)
    assert model.accel_report.decisions[-1].source == "search"
    assert obs.grad is None
    out.sum().backward()
    expected = torch.autograd.grad(plain(obs).sum(), obs)[0]
    assert torch.allclose(obs.grad, expected, rtol=1e-5, atol=1e-6)


def test_search_on_an_input_computed_by_the_same_module(two_candidates):
    # The upstream graph runs through this module's own parameters, so a dry backward restricted to them would
    # still free it: the dry runs must take a detached input.
    model = auto_accelerate(_mlp(4, 4), device="cpu")
    plain = unaccelerate(copy.deepcopy(model))
    x = torch.randn(16, 4)
    out = model(model(x)[:2])  # two kinds of call (batch 16, batch 2): two searches
    assert [d.source for d in model.accel_report.decisions] == ["search", "search"]
    assert all(p.grad is None for p in model.parameters())
    out.sum().backward()
    plain(plain(x)[:2]).sum().backward()
    for p, ref in zip(model.parameters(), plain.parameters()):
        assert torch.allclose(p.grad, ref.grad, rtol=1e-5, atol=1e-6)


class Flaky(nn.Module):
    """A forward that runs once and then fails until `fixed` is set (one that cannot be repeated)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.calls = 0
        self.fixed = False

    def forward(self, x):
        self.calls += 1
        if self.calls > 1 and not self.fixed:
            raise RuntimeError("cannot run twice")
        return self.linear(x)


def test_a_search_where_every_candidate_failed_is_not_cached(two_candidates):
    x = torch.randn(8, 4)
    broken = auto_accelerate(Flaky(), device="cpu", example_inputs=x)
    decision = broken.accel_report.decisions[-1]
    assert decision.chosen == EAGER_FP32 and all(not t.passed for t in decision.trials)
    assert any("not cached" in note for note in broken.accel_report.notes)
    assert _cached_files() == []
    broken.fixed = True
    assert broken(x).shape == (8, 2)  # decided for this process: no new search
    assert len(broken.accel_report.decisions) == 1

    repaired = Flaky()
    repaired.fixed = True
    repaired = auto_accelerate(repaired, device="cpu", example_inputs=x)
    assert repaired.accel_report.decisions[-1].source == "search"  # not the cached failure


# --- 2. cache keys and edited code -------------------------------------------------------------------------------
def _net_class(version: int) -> type:
    """Classes with the same name, qualname and repr; only the code of forward (or of a helper it calls) differs."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        if version == 0:
            def forward(self, x):
                return self.features(x)
        else:
            def forward(self, x):
                return self.features(x).sin()

        if version == 2:
            def features(self, x):
                return self.linear(x * 2)
        else:
            def features(self, x):
                return self.linear(x)

    return Net


def test_an_edited_forward_is_searched_again(two_candidates):
    x = torch.randn(8, 4)
    sources = []
    for version in (0, 0, 1, 2):
        model = auto_accelerate(_net_class(version)(), device="cpu", example_inputs=x)
        sources.append(model.accel_report.decisions[-1].source)
    assert sources == ["search", "cache", "search", "search"]


def test_a_helper_called_from_a_lambda_in_forward_is_part_of_the_key(two_candidates):
    x = torch.randn(8, 4)

    def net_class(scale: float) -> type:
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(4, 2)

            def forward(self, x):
                apply = lambda t: self.features(t)  # noqa: E731 - the name is only used inside the lambda
                return apply(x)

            if scale == 1.0:
                def features(self, x):
                    return self.linear(x)
            else:
                def features(self, x):
                    return self.linear(x * 2)

        return Net

    sources = [auto_accelerate(net_class(scale)(), device="cpu", example_inputs=x).accel_report.decisions[-1].source
               for scale in (1.0, 1.0, 2.0)]
    assert sources == ["search", "cache", "search"]


def test_code_digests_are_the_same_in_every_process():
    # A set literal compiles to a frozenset constant whose repr order follows string hashing, which is seeded
    # per process: hashed as is, the cache would miss in every new process. (This process's digest against one of
    # another process whose set order differs from this one's: one interpreter start, not two.)
    from rlspeed.accel.cache import code_digest

    source = "def f(x):\n    return x in {'alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta', 'theta'}\n"
    namespace = {}
    exec(source, namespace)
    code = namespace["f"].__code__
    script = (f"from rlspeed.accel.cache import code_digest\n{source}"
              "print(code_digest(f.__code__))\nprint(repr(f.__code__.co_consts))")
    for seed in ("1", "2", "3"):
        digest, consts = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                        env={**os.environ, "PYTHONHASHSEED": seed}).stdout.splitlines()
        if consts != repr(code.co_consts):
            break
    assert consts != repr(code.co_consts)  # (the set's order differs there: a digest that followed it would too)
    assert digest == code_digest(code)


def test_an_edited_model_forward_changes_the_step_cache_key(two_candidates):
    x, y = torch.randn(16, 4), torch.randn(16, 2)

    def closure_step(model):
        def loss_fn(a, b):  # the same code for every model: only the model's forward differs
            return (model(a) - b).square().mean()

        return accelerate_step(loss_fn, torch.optim.SGD(model.parameters(), lr=0.0))

    class Agent:
        def __init__(self, model):
            self.model = model

        def loss(self, a, b):
            return (self.model(a) - b).square().mean()

    def method_step(model):
        return accelerate_step(Agent(model).loss, torch.optim.SGD(model.parameters(), lr=0.0))

    for make_step in (closure_step, method_step):
        sources = []
        for version in (0, 0, 1):
            step = make_step(_net_class(version)())
            step(x, y)
            sources.append(step.report.decisions[-1].source)
        assert sources == ["search", "cache", "search"]


# --- 3. outputs the accuracy check cannot see into ---------------------------------------------------------------
class Gaussian(nn.Module):
    def __init__(self, with_mean: bool = False):
        super().__init__()
        self.body = _mlp(4, 2)
        self.with_mean = with_mean

    def forward(self, x):
        mu = self.body(x)
        dist = torch.distributions.Normal(mu, torch.ones_like(mu))
        return (mu, dist) if self.with_mean else dist


@pytest.mark.parametrize("with_mean", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_outputs_hiding_their_tensors_stay_fp32(two_candidates, with_mean, grad):
    model = Gaussian(with_mean)
    plain = copy.deepcopy(model)
    model = auto_accelerate(model, device="cpu")
    x = torch.randn(64, 4)
    with torch.set_grad_enabled(grad):
        out = model(x)
    dist = out[1] if with_mean else out
    decision = model.accel_report.decisions[-1]
    assert decision.chosen == EAGER_FP32
    assert not any(t.passed for t in decision.trials if t.strategy.precision != "fp32")  # nothing passes unchecked
    assert "Normal" in decision.reason and any("Normal" in note for note in model.accel_report.notes)
    assert dist.loc.dtype == torch.float32
    expected = plain(x)
    assert torch.equal(dist.loc, (expected[1] if with_mean else expected).loc)


# --- 4. accelerate_step and module buffers -----------------------------------------------------------------------
def test_step_search_puts_batchnorm_statistics_back(two_candidates):
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

    x, y = torch.randn(64, 4), torch.randn(64, 1)
    plain = make()
    (plain(x) - y).square().mean().backward()
    model = make()
    step = accelerate_step(lambda a, b: (model(a) - b).square().mean(), torch.optim.SGD(model.parameters(), lr=0.0))
    step(x, y)
    assert step.report.decisions[-1].source == "search"
    norm, plain_norm = model[1], plain[1]
    assert int(norm.num_batches_tracked) == int(plain_norm.num_batches_tracked) == 1
    assert torch.allclose(norm.running_mean, plain_norm.running_mean)
    assert torch.allclose(norm.running_var, plain_norm.running_var)


# --- 5. empty batches --------------------------------------------------------------------------------------------
def test_empty_batch_with_a_compiled_strategy(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setenv("RLSPEED_ACCELERATE", "fp32+compile:eager")
    model = auto_accelerate(_mlp(4, 2), device="cpu")
    plain = unaccelerate(copy.deepcopy(model))
    obs = torch.randn(5, 4)
    assert model(obs[torch.zeros(5, dtype=torch.bool)]).shape == (0, 2)  # first call empty
    assert torch.allclose(model(obs), plain(obs), atol=1e-6)
    assert model(obs[:0]).shape == (0, 2)  # empty after a real call


def test_empty_batch_decides_nothing(two_candidates):
    model = auto_accelerate(_mlp(4, 2), device="cpu")
    plain = unaccelerate(copy.deepcopy(model))
    assert torch.equal(model(torch.zeros(0, 4)), plain(torch.zeros(0, 4)))
    assert model.accel_report.decisions == [] and _cached_files() == []


# --- 6. float64 models -------------------------------------------------------------------------------------------
def test_float64_model_keeps_float64_inputs(two_candidates):
    model = _mlp(4, 2).double()
    plain = copy.deepcopy(model)
    model = auto_accelerate(model, device="cpu")
    x = torch.randn(8, 4, dtype=torch.float64)
    out = model(x)
    assert out.dtype == torch.float64 and torch.equal(out, plain(x))
    assert torch.equal(model(x.numpy()), plain(x))  # numpy float64 too

    step = accelerate_step(lambda a: model(a).square().mean(), torch.optim.SGD(model.parameters(), lr=0.1))
    assert step(x).dtype == torch.float64
    float32_model = auto_accelerate(_mlp(4, 2), device="cpu")
    assert float32_model(x).dtype == torch.float32  # a float32 model still gets float32


@pytest.mark.parametrize("how", ["fp32 asked for", "float64"])
def test_example_inputs_of_a_module_with_plain_fp32_as_its_only_candidate_run_no_search(how):
    """`auto_accelerate(model, example_inputs=...)` where plain fp32 is the only candidate (precision="fp32",
    compile=False; a float64 model) searched it all the same: seconds timing fp32 alone, and a second decision in
    the report beside "only candidate". It is decided when the module is made, as its calls are."""
    model, x = (_mlp(4, 2), torch.randn(8, 4)) if how == "fp32 asked for" else (
        _mlp(4, 2).double(), torch.randn(8, 4, dtype=torch.float64))
    options = {"precision": "fp32", "compile": False} if how == "fp32 asked for" else {}
    model = auto_accelerate(model, device="cpu", example_inputs=x, **options)
    assert [(d.chosen, d.source) for d in model.accel_report.decisions] == [(EAGER_FP32, "only candidate")]
    assert model._rlspeed_accelerator.searches == 0


def test_a_float64_model_is_not_searched_over_precisions_that_leave_it_as_it_is(monkeypatch):
    """A program that made float64 torch's default (or called `.double()`) got float64 models whose search timed
    bf16 autocast (and bf16-matmul, tf32) against fp32: none of them changes float64 arithmetic (out err 0.0, the
    same kernels), so the search spent seconds timing fp32 against itself and could choose "bf16" on the noise of a
    busy machine. Reduced precisions are tried for float32 parameters only, and the report says why."""
    import rlspeed.accel.strategy as strategy

    monkeypatch.setattr(strategy, "bf16_supported", lambda device: True)  # (bf16 tried on any CPU)
    model = auto_accelerate(_mlp(4, 2).double(), device="cpu")
    model(torch.randn(8, 4, dtype=torch.float64))
    step = accelerate_step(lambda a: model(a).square().mean(), torch.optim.SGD(model.parameters(), lr=0.1),
                           example_inputs=torch.randn(8, 4, dtype=torch.float64))
    for report in (model.accel_report, step.report):
        assert [(d.chosen, d.source) for d in report.decisions] == [(EAGER_FP32, "only candidate")]
        assert any("parameters are float64" in note for note in report.notes)
    float32_model = _mlp(4, 2)
    float32 = accelerate_step(lambda a: float32_model(a).sum(), torch.optim.SGD(float32_model.parameters(), lr=0.1))
    assert BF16 in float32._candidates  # (a float32 model's search still tries it)


# --- lower priority: train and eval calls ------------------------------------------------------------------------
def test_train_and_eval_calls_are_decided_separately(two_candidates):
    model = auto_accelerate(nn.Sequential(_mlp(4, 2), nn.Dropout(0.5)), device="cpu")
    x = torch.randn(8, 4)
    with torch.no_grad():
        model(x)
        model.eval()
        model(x)
        model(x)
    labels = [d.signature for d in model.accel_report.decisions]
    assert len(labels) == 2 and labels[1].endswith(", eval") and not labels[0].endswith(", eval")


def test_a_wrapped_module_can_be_traced_exported_and_compiled_whole():
    """`torch.jit.trace`, the TorchScript ONNX exporter and `torch.compile(fullgraph=True)` of an accelerated module
    record its plain forward (the trace failed on a traced batch size; compiling broke the graph at the call timer)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    wrapped = auto_accelerate(copy.deepcopy(model))
    x = torch.randn(8, 4)
    traced = torch.jit.trace(wrapped, x)
    assert torch.allclose(traced(x), model(x))
    compiled = torch.compile(wrapped, fullgraph=True, backend="eager")  # (Dynamo alone: a graph break raises)
    assert torch.allclose(compiled(x), model(x))
    assert torch.allclose(wrapped(x), model(x))  # (and the module itself still runs its accelerator)


class _Scripted(nn.Module):
    """A CleanRL-style network with a forward of its own, for torch.jit.script (which reads the source)."""

    def __init__(self):
        super().__init__()
        self.network = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


def test_an_accelerated_module_can_be_scripted(tmp_path):
    """`torch.jit.script` of an accelerated module (or of a module holding one) compiles its plain forward, as the
    plain module's; it failed with "Module 'QNetwork' has no attribute '__dict__'" (the accel_* properties)."""
    torch.manual_seed(0)
    model = _Scripted()
    plain = copy.deepcopy(model)
    model = auto_accelerate(model, device="cpu")
    model.network = auto_accelerate(model.network, device="cpu")
    x = torch.randn(8, 4)
    scripted = torch.jit.script(model)
    assert torch.equal(scripted(x), plain(x))
    path = str(tmp_path / "q.pt")
    torch.jit.save(scripted, path)
    assert torch.equal(torch.jit.load(path)(x), plain(x))
    assert torch.equal(torch.jit.script(model.network)(x), plain.network(x))
    assert torch.equal(model(x), plain(x)) and model.accel_report.decisions  # (still accelerated)


def test_concurrent_calls_of_an_accelerated_module_all_run_its_chosen_strategy(monkeypatch):
    """The guard against nested calls was one counter for all threads: while one thread was inside the chosen
    runner, calls from other threads ran plain fp32 (other numbers for the same input, from a server's threads)."""
    import threading

    import rlspeed.accel.strategy as strategy

    monkeypatch.setattr(strategy, "_cpu_native_bf16", lambda: True)  # (bf16 autocast runs on any CPU, slowly)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    accelerated = auto_accelerate(module, precision="bf16")
    x = torch.randn(8, 16)
    with torch.no_grad():
        expected = accelerated(x).clone()
    outputs = []

    def work():
        torch.set_num_threads(1)
        with torch.no_grad():
            for _ in range(50):
                outputs.append(accelerated(x).clone())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outputs) == 200 and all(torch.equal(output, expected) for output in outputs)


def test_threads_whose_calls_make_a_search_due_at_once_search_once(two_candidates, monkeypatch):
    """A server's threads reach a kind of call's search threshold together: each of them searched it (each search
    timed under the others' load, the report listing a decision per thread, a later one replacing an earlier one's
    choice), and their first calls each added a 'waiting' decision to the report, never removed. Now one thread
    searches while the others' calls run eager fp32, and every call after the decision runs the chosen strategy."""
    import threading

    import rlspeed.accel.module as module_policy

    entered, second_entered = [], threading.Event()
    real_search = module_policy.run_search

    def slow_search(*args, **kwargs):  # (long enough for every thread to reach the search while one runs)
        entered.append(threading.get_ident())
        if len(entered) > 1:
            second_entered.set()
        second_entered.wait(timeout=1.0)
        return real_search(*args, **kwargs)

    monkeypatch.setattr(module_policy, "run_search", slow_search)
    accelerated = auto_accelerate(_mlp(8, 4), device="cpu")
    x = torch.randn(4, 8)
    start = threading.Barrier(4)
    errors = []

    def work():
        torch.set_num_threads(1)
        try:
            start.wait(timeout=60)
            with torch.no_grad():
                for _ in range(20):
                    accelerated(x)
        except Exception as error:  # (reported below: an assertion in a thread would go unseen)
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(entered) == 1 and accelerated._rlspeed_accelerator.searches == 1
    decisions = accelerated.accel_report.decisions
    assert [decision.source for decision in decisions] == ["search"]
    chosen = decisions[0].chosen
    with torch.no_grad():
        expected = accelerated._rlspeed_accelerator._runner(accelerated, chosen)(x)
        assert torch.equal(accelerated(x), expected)


def test_first_calls_of_one_kind_from_several_threads_wait_for_one_decision(monkeypatch):
    """Threads calling a new kind of call at once each looked its choice up in the cache and each put a 'waiting'
    decision in the report (of which a search later removed one): the report of a server's model listed the kind
    once per thread."""
    import threading
    import time

    import rlspeed.accel.module as module_policy

    real_load = module_policy.cache.load

    def slow_load(key):  # (a cache on a slow disk: the lookup outlasts the other threads' arrival)
        time.sleep(0.2)
        return real_load(key)

    monkeypatch.setattr(module_policy.cache, "load", slow_load)
    monkeypatch.setattr(module_policy, "candidates", lambda *args, **kwargs: ([EAGER_FP32, BF16], []))
    accelerated = auto_accelerate(_mlp(8, 4), device="cpu")
    x = torch.randn(4, 8)
    start = threading.Barrier(4)

    def work():
        start.wait(timeout=60)
        with torch.no_grad():
            accelerated(x)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [decision.source for decision in accelerated.accel_report.decisions] == ["waiting"]


@needs_torch_2_9
def test_overlapping_matmul_precision_blocks_restore_the_setting_from_before_the_first():
    """Two accelerated models called at once from two threads: each block restored what it found on entry, so the
    one entered second and left last put the first one's reduced precision back for the whole process."""
    from rlspeed.accel.strategy import MatmulPrecision

    backend = torch.backends.mkldnn.matmul
    before = backend.fp32_precision
    first, second = (MatmulPrecision(torch.device("cpu"), "bf16-matmul") for _ in range(2))
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert backend.fp32_precision == "bf16"  # (the second block still runs)
    second.__exit__(None, None, None)
    assert backend.fp32_precision == before


def test_a_torch_without_the_fp32_precision_settings_offers_no_reduced_matmuls_and_trains(monkeypatch):
    """torch before 2.9 has no `torch.backends.mkldnn.matmul.fp32_precision` (pyproject allows 2.6): reading it at
    import made `import rlspeed.algos` fail; now no bf16-matmul region is offered, asking for one is one sentence
    naming the torch it needs, and the hand-derived update trains in fp32."""
    from rlspeed import PPO
    from rlspeed.accel.strategy import reduced_matmul_supported
    from rlspeed.errors import UserError
    from rlspeed.fused import flat

    class OldTorchSetting:  # (what torch 2.6-2.8 have there: a module without fp32_precision)
        pass

    monkeypatch.setattr(torch.backends.mkldnn, "matmul", OldTorchSetting(), raising=False)
    monkeypatch.setattr(flat, "_MKLDNN_MATMUL", None)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert not reduced_matmul_supported(torch.device("cpu"), "bf16-matmul")
    assert not flat.reduced_matmuls()
    with pytest.raises(UserError, match="torch 2.9 or newer"):
        auto_accelerate(nn.Linear(3, 2), precision="bf16-matmul", device="cpu")(torch.ones(4, 3))
    model = PPO("CartPole-v1", seed=0, device="cpu", num_envs=2, num_steps=16, batch_size=32, n_epochs=1)
    model.learn(64)
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())


@needs_torch_2_9
@pytest.mark.parametrize("after", ["call", "backward"])
def test_a_backward_pass_that_raises_does_not_leave_the_reduced_precision_on(after):
    """The backward region of an accelerated module's precision opens at its outputs' gradient hook and closes in an
    engine callback, which a backward pass that raises (a second `loss.backward()` on a freed graph) never runs: the
    reduced precision stayed on for every later matmul of the process, later backward passes included. The module's
    next call, or the next backward pass through it, closes it."""
    from rlspeed.accel.module import _with_backward_hook
    from rlspeed.accel.strategy import BackwardPrecisionHook

    backend = torch.backends.mkldnn.matmul
    before = backend.fp32_precision
    module = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    accelerated = _with_backward_hook(module, BackwardPrecisionHook(torch.device("cpu"), "bf16-matmul"))
    x = torch.randn(16, 4)
    loss = accelerated(x).sum()
    loss.backward()
    assert backend.fp32_precision == before
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    if after == "call":
        accelerated(x)
    else:
        accelerated(x).sum().backward()
    assert backend.fp32_precision == before
    accelerated(x).sum().backward()  # (and the region opens and closes as before)
    assert backend.fp32_precision == before


def test_a_refused_auto_accelerate_leaves_the_module_as_it_was(monkeypatch):
    """A request the device refuses (tf32 on a CPU) raised its UserError after the module's class had been swapped:
    every later call of the module failed with KeyError '_rlspeed_accelerator'."""
    from rlspeed.errors import UserError

    module = nn.Linear(3, 1)
    expected = module(torch.ones(2, 3))
    with pytest.raises(UserError, match="tf32"):
        auto_accelerate(module, precision="tf32", device="cpu")
    assert type(module) is nn.Linear and torch.equal(module(torch.ones(2, 3)), expected)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):  # (example inputs the module refuses)
        auto_accelerate(module, device="cpu", example_inputs=torch.ones(2, 5))
    assert type(module) is nn.Linear and torch.equal(module(torch.ones(2, 3)), expected)


def _frozen_then_changed(accelerated: bool, change: str) -> list[torch.Tensor]:
    """Ten Adam updates of a small regression (plus a temperature-like scalar), `change` made before the sixth."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))
    log_alpha = torch.zeros(1, requires_grad=True)
    if change == "unfreeze":
        model[0].requires_grad_(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 4), torch.randn(64, 1)

    def loss_fn():
        return (model(x) - y).pow(2).mean() + (log_alpha - 1).pow(2).sum()

    step = accelerate_step(loss_fn, optimizer, precision="fp32", compile=False, graphs=False, fused_optimizer=False)
    for i in range(10):
        if i == 5:
            if change == "group":
                optimizer.add_param_group({"params": [log_alpha]})
            else:
                model[0].requires_grad_(change == "unfreeze")
        update(step, accelerated=accelerated)
    return [p.detach().clone() for p in (*model.parameters(), log_alpha)]


@pytest.mark.parametrize("change", ["unfreeze", "freeze", "group"])
def test_an_update_step_trains_the_parameters_as_they_are_at_each_call(change):
    """accelerate_step took its parameter list when it was made: a layer unfrozen later never trained, a param group
    added later (SAC's temperature) stayed at its initial value, and a layer frozen later failed the backward pass.
    Each now matches the plain loop exactly."""
    plain, accelerated = _frozen_then_changed(False, change), _frozen_then_changed(True, change)
    assert all(torch.equal(a, b) for a, b in zip(plain, accelerated))
    if change == "group":  # (the added group trained)
        assert not torch.equal(accelerated[-1], torch.zeros(1))


def test_an_update_step_says_when_its_loss_cannot_train_the_optimizers_parameters():
    """A loss that does not reach the optimizer's parameters (the actor's optimizer given with the critic's loss)
    stepped nothing in silence, or failed in clip_grad_norm ("Tensor list must have at least one tensor"); a call
    inside torch.no_grad() failed with torch's "element 0 of tensors does not require grad"."""
    from rlspeed.errors import UserError

    actor, critic, x = nn.Linear(3, 1), nn.Linear(3, 1), torch.randn(4, 3)
    for clip in (None, 0.5):
        step = accelerate_step(lambda: critic(x).pow(2).mean(), torch.optim.Adam(actor.parameters()),
                               max_grad_norm=clip, precision="fp32", compile=False)
        with pytest.raises(UserError, match="does not reach any parameter of the optimizer"):
            step()
    step = accelerate_step(lambda: actor(x).pow(2).mean(), torch.optim.Adam(actor.parameters()), precision="fp32",
                           compile=False)
    with torch.no_grad(), pytest.raises(UserError, match=r"inside torch.no_grad\(\)"):
        step()


def test_a_choice_that_cannot_be_cached_says_so(tmp_path, monkeypatch, two_candidates):
    """An RLSPEED_CACHE_DIR that cannot be written (a file there) left every run searching again, without a word."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RLSPEED_CACHE_DIR", str(tmp_path / "file"))
    model = auto_accelerate(nn.Linear(4, 2), device="cpu", example_inputs=torch.ones(8, 4))
    assert any("could not be written" in note for note in model.accel_report.notes)


def test_a_user_without_a_home_directory_searches_uncached_and_is_told(monkeypatch, two_candidates):
    """HOME unset and no passwd entry (a container's user of an arbitrary id): Path.home() raised RuntimeError out of
    the first call of every accelerated module and step."""
    pwd = pytest.importorskip("pwd")  # (POSIX: where Python looks the home up when HOME is unset)
    monkeypatch.delenv("RLSPEED_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    model = auto_accelerate(nn.Linear(4, 2), device="cpu", example_inputs=torch.ones(8, 4))
    assert model(torch.ones(8, 4)).shape == (8, 2)
    assert any("no home directory" in note for note in model.accel_report.notes)


def test_the_reference_is_timed_in_every_round_even_after_one_slow_round(monkeypatch):
    """A candidate at twice the leader's time stops being timed; the fp32 reference did too, after a single round a
    disturbance had slowed: every speed-up then rested on one pair of timings (reports read "7.8 ms/call against
    1.8 ms/call, speed-up 0.67x")."""
    import types

    from rlspeed.accel import search

    clock = types.SimpleNamespace(now=0.0)  # (a clock the runners advance: no dependence on the machine's load)
    monkeypatch.setattr(search, "time", types.SimpleNamespace(perf_counter=lambda: clock.now,
                                                              process_time=lambda: clock.now))
    calls = [0]

    def reference():  # (slow in its first calls, as a round another process interrupted)
        calls[0] += 1
        clock.now += 0.02 if calls[0] <= 3 else 0.002

    def bf16():
        clock.now += 0.002

    timings = search.time_runners({EAGER_FP32: reference, BF16: bf16}, torch.device("cpu"), budget_s=0.2, rounds=5)
    assert len(timings[EAGER_FP32]) == len(timings[BF16]) == 5


def test_a_pinned_host_input_is_copied_before_the_call_returns(monkeypatch):
    """A pinned host batch was copied to CUDA with non_blocking=True: the call returned while the copy could still
    be reading it, and a caller refilling its pinned buffer (a DataLoader's, a staging tensor) changed the batch the
    step trained on. The copy blocks, as the plain `.to(device)` the call stands in for. (Faked on a CPU.)"""
    from rlspeed.accel.inputs import InputConverter

    asked = {}

    def to(self, *args, **kwargs):
        asked.update(kwargs)
        return self

    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    InputConverter(torch.device("cuda"), torch.float32)((torch.zeros(4, 3),), {})
    assert asked["device"] == torch.device("cuda") and not asked.get("non_blocking", False)


@pytest.mark.parametrize("searched", [False, True])
@pytest.mark.parametrize("when", [0, 2])
def test_an_update_step_follows_its_model_converted_to_float64(searched, when, request):
    """`model.double()` after `accelerate_step` (the parameters stay the same objects), before the first update or
    between updates of a stateless optimizer: the step narrowed the float64 inputs to float32, as for the model it
    was made with, and failed with torch's "mat1 and mat2 must have the same dtype" where the plain loop trains. It
    now trains as the plain loop does, and decides its strategy anew."""
    if searched:
        request.getfixturevalue("two_candidates")

    def run(accelerated: bool) -> list[torch.Tensor]:
        model = _mlp(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(1)
        xs = [torch.randn(8, 4, dtype=torch.float32 if i < when else torch.float64) for i in range(4)]
        kwargs = {} if searched else {"precision": "fp32"}
        step = accelerate_step(lambda x: model(x).square().mean(), optimizer, compile=False, **kwargs)
        for i, x in enumerate(xs):
            if i == when:
                model.double()
            update(step, x, accelerated=accelerated)
        if accelerated and searched and when:
            assert any("became torch.float64" in note for note in step.report.notes)
        return [p.detach().clone() for p in model.parameters()]

    plain = run(False)
    accelerated = run(True)
    assert all(p.dtype == torch.float64 for p in accelerated)
    if searched and when:  # (the search may choose bf16 for the float32 calls)
        assert all(torch.allclose(a, b, rtol=0.05, atol=1e-3) for a, b in zip(plain, accelerated))
    else:
        assert all(torch.equal(a, b) for a, b in zip(plain, accelerated))


# --- 14. the random generators a searched call draws from ---------------------------------------------------------
class _NoisyNet(nn.Module):
    """A model drawing its noise from a generator of its own (seeded for a reproducible run)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 2)
        self.noise = torch.Generator().manual_seed(1)

    def forward(self, x):
        return self.linear(x) + 0.1 * torch.randn(x.shape[0], 2, generator=self.noise)


def test_a_module_search_leaves_the_models_own_generator_where_it_was(two_candidates):
    x = torch.randn(8, 4)
    plain = _NoisyNet()
    expected = [plain(x) for _ in range(2)]
    model = auto_accelerate(_NoisyNet(), example_inputs=(x,))
    assert model.accel_report.decisions[-1].source == "search"
    assert all(torch.equal(model(x), y) for y in expected)


def _searched_or_plain_step(loss, optimizer, example_inputs: tuple, accelerated: bool):
    """An update step of `loss`: accelerate_step's, searched on `example_inputs`, or the plain loop's."""
    if accelerated:
        step = accelerate_step(loss, optimizer, example_inputs=example_inputs)
        assert step.report.decisions[-1].source == "search"
        return step

    def step(*args):
        optimizer.zero_grad()
        loss(*args).backward()
        optimizer.step()
    return step


@pytest.mark.parametrize("where", ["named", "argument", "module"])
def test_a_step_search_leaves_the_generators_its_loss_draws_from_where_they_were(two_candidates, where):
    """The search runs the loss function many times: a seeded generator it draws from (by name, as an argument, or
    inside a model it calls) continues after the search as in the plain loop, as the default RNG does."""

    def run(accelerated):
        model = _NoisyNet()
        generator = torch.Generator().manual_seed(2)

        def loss(x, g=None):
            noise = torch.randn(x.shape, generator=generator if where == "named" else g) if where != "module" else 0
            return model(x + noise).square().mean()

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
        extra = (generator,) if where == "argument" else ()
        step = _searched_or_plain_step(loss, optimizer, (x, *extra), accelerated)
        for _ in range(3):
            step(x, *extra)
        return model.linear.weight.detach().clone(), torch.rand(2, generator=generator), torch.rand(2,
                                                                                                  generator=model.noise)

    for plain, accelerated in zip(run(False), run(True)):
        assert torch.equal(plain, accelerated)


# --- 15. inputs changed in place by the searched call -------------------------------------------------------------
class _HalvesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 2)

    def forward(self, x):
        x /= 2.0  # (in place: the caller's tensor too, once per call)
        return self.linear(x)


def test_a_searched_module_call_changes_its_input_in_place_once(two_candidates):
    x, expected = torch.ones(8, 4), torch.ones(8, 4)
    plain = _HalvesItsInput()
    y = plain(expected)
    model = auto_accelerate(_HalvesItsInput())
    assert torch.equal(model(x), y)
    assert model.accel_report.decisions[-1].source == "search"
    assert torch.equal(x, expected)


def test_a_searched_step_changes_its_input_in_place_once(two_candidates):
    def run(accelerated):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def loss(x):
            x *= 2.0  # (in place, once per call)
            return model(x).square().mean()

        x = torch.ones(8, 4)
        if accelerated:
            step = accelerate_step(loss, optimizer)
            step(x)
            assert step.report.decisions[-1].source == "search"
        else:
            optimizer.zero_grad()
            loss(x).backward()
            optimizer.step()
        return x, model.weight.detach().clone()

    for plain, accelerated in zip(run(False), run(True)):
        assert torch.equal(plain, accelerated)


# --- 16. tensors the loss function changes in place by name -----------------------------------------------------
class _ReturnNorm(nn.Module):
    """A running scale of the returns, updated by a method (not forward) from inside the loss."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()))

    def update(self, returns):
        self.scale.mul_(0.9).add_(0.1 * returns.abs().mean())


@pytest.mark.parametrize("kept_in", ["module buffer", "tensor"])
def test_a_step_search_puts_back_what_the_loss_updates_in_place_by_name(two_candidates, kept_in):
    def run(accelerated):
        torch.manual_seed(0)
        model, norm, scale = nn.Linear(4, 1), _ReturnNorm(), torch.ones(())

        def loss(x, returns):
            if kept_in == "module buffer":
                norm.update(returns)
            else:
                scale.mul_(0.9).add_(0.1 * returns.abs().mean())
            return ((model(x).squeeze(-1) - returns) / (norm.scale * scale)).square().mean()

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, returns = torch.randn(16, 4), torch.randn(16)
        step = _searched_or_plain_step(loss, optimizer, (x, returns), accelerated)
        for _ in range(2):
            step(x, returns)
        return norm.scale.clone(), scale.clone(), model.weight.detach().clone()

    for plain, accelerated in zip(run(False), run(True)):
        assert torch.equal(plain, accelerated)


def test_a_large_tensor_the_loss_changes_in_place_is_reported(two_candidates, monkeypatch):
    monkeypatch.setattr("rlspeed.accel.step.NAMED_SNAPSHOT_BYTES", 8)
    torch.manual_seed(0)
    model, counts = nn.Linear(4, 1), torch.zeros(16)

    def loss(x):
        counts.add_(1.0)
        return model(x).square().mean()

    with pytest.warns(RuntimeWarning, match="changed tensors it reads by name in place"):
        step = accelerate_step(loss, torch.optim.SGD(model.parameters(), lr=0.1), example_inputs=(torch.randn(8, 4),))
    assert any("too large to put back" in note for note in step.report.notes)


# --- 17. the per-call cost of a kind of call waiting for its search -----------------------------------------------
class _Critic(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 1)

    def forward(self, obs, action):
        return self.linear(torch.cat([obs, action], -1))


@pytest.mark.parametrize("inputs", ["two tensors", "numpy array"])
def test_a_waiting_kind_of_call_reestimates_its_search_threshold_only_when_reached(monkeypatch, inputs):
    """A call of several tensors (critic(obs, action)) or of a numpy observation pays a comparison per call while its
    kind waits for its search, as one tensor does, not the estimate of the search's cost."""
    import numpy as np

    from rlspeed.accel.module import _Waiting

    estimates = []
    original = _Waiting.search_due
    monkeypatch.setattr(_Waiting, "search_due", lambda self, *a, **k: estimates.append(1) or original(self, *a, **k))
    if inputs == "two tensors":
        model, args = auto_accelerate(_Critic()), (torch.randn(1, 4), torch.randn(1, 2))
        expected = unaccelerate(_Critic())(*args)
    else:
        model, args = auto_accelerate(_mlp(4, 2)), (np.ones((1, 4)),)
        expected = _mlp(4, 2)(torch.ones(1, 4))
    with torch.no_grad():
        for _ in range(50):
            assert torch.equal(model(*args), expected)
    assert model.accel_report.decisions[-1].source == "waiting"
    assert len(estimates) <= 2


class _UpdatedThenApplied(nn.Module):
    """A normaliser the loss updates by a method and then applies through its forward."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))

    def update(self, x):
        self.mean.lerp_(x.mean(0), 0.5)

    def forward(self, x):
        return x - self.mean


def test_a_buffer_the_loss_changes_before_its_modules_forward_is_put_back_from_before_the_search(two_candidates):
    def run(accelerated):
        torch.manual_seed(0)
        model, norm = nn.Linear(4, 1), _UpdatedThenApplied()

        def loss(x):
            norm.update(x)
            return model(norm(x)).square().mean()

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(16, 4) + 3.0
        if accelerated:
            accelerate_step(loss, optimizer, example_inputs=(x,))(x)
        else:
            optimizer.zero_grad()
            loss(x).backward()
            optimizer.step()
        return norm.mean.clone(), model.weight.detach().clone()

    for plain, accelerated in zip(run(False), run(True)):
        assert torch.equal(plain, accelerated)


@pytest.mark.parametrize("clip", [0.05, math.inf])
def test_an_update_step_gives_the_gradient_norm_its_clipping_measured(clip):
    """A loop that logs the gradient norm (`clip_grad_norm_`'s return value) had no way to read it from the step:
    `step.grad_norm` is the last call's norm before clipping, as the plain loop's, and `max_grad_norm=math.inf`
    measures it without clipping (the parameters then follow the unclipped loop)."""
    torch.manual_seed(0)
    plain_net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    net = copy.deepcopy(plain_net)
    plain_opt, opt = torch.optim.SGD(plain_net.parameters(), lr=0.1), torch.optim.SGD(net.parameters(), lr=0.1)
    step = accelerate_step(lambda x: net(x).pow(2).mean(), opt, max_grad_norm=clip, precision="fp32", compile=False)
    assert step.grad_norm is None  # (before a call)
    for _ in range(3):
        x = torch.randn(16, 3)
        plain_opt.zero_grad()
        plain_net(x).pow(2).mean().backward()
        norm = torch.nn.utils.clip_grad_norm_(plain_net.parameters(), clip)
        plain_opt.step()
        step(x)
        assert torch.allclose(step.grad_norm, norm, rtol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_net.parameters(), net.parameters()))
    unclipped = accelerate_step(lambda x: net(x).pow(2).mean(), opt, precision="fp32", compile=False)
    unclipped(torch.randn(16, 3))
    assert unclipped.grad_norm is None


def test_clipping_parameters_without_gradients_returns_zero_as_torch_does():
    """`rlspeed.nn.clip_grad_norm` on parameters none of which has a gradient (a frozen network, a call before any
    backward) failed in torch._foreach_norm ("Tensor list must have at least one tensor"); torch's `clip_grad_norm_`
    returns 0."""
    from rlspeed.nn import clip_grad_norm

    params = list(nn.Linear(3, 2).parameters())
    for given in (params, []):
        norm = clip_grad_norm(given, 0.5)
        assert torch.equal(norm, torch.nn.utils.clip_grad_norm_(given, 0.5))
    assert all(p.grad is None for p in params)


def test_clipping_takes_any_iterable_of_parameters_as_torch_does():
    """`rlspeed.nn.clip_grad_norm(net.parameters(), ...)` (a generator, as torch's `clip_grad_norm_` takes it) on a
    network without gradients failed with TypeError (len() of a generator); with gradients it clips as torch does."""
    from rlspeed.nn import clip_grad_norm

    net = nn.Linear(3, 2)
    assert clip_grad_norm(net.parameters(), 0.5).item() == 0.0
    twin = nn.Linear(3, 2)
    twin.load_state_dict(net.state_dict())
    for module in (net, twin):
        module(torch.ones(4, 3)).pow(2).sum().backward()
    norm = clip_grad_norm(net.parameters(), 0.5)
    assert torch.allclose(norm, torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5))
    assert all(torch.allclose(a.grad, b.grad) for a, b in zip(net.parameters(), twin.parameters()))
    assert torch.allclose(clip_grad_norm(net.weight, 1e9), torch.linalg.vector_norm(net.weight.grad))


def test_an_accelerated_module_inside_an_update_step_runs_as_the_step_chose(monkeypatch):
    """The docs' pattern: `auto_accelerate(model)` and a step whose loss calls the model. Inside the step the model
    runs its plain forward, so the step's strategy, checked on the loss itself, is what runs: a module decided on
    bf16 for its own calls neither turns a step that chose fp32 into a bf16 one nor is the step search's fp32
    reference; outside the step the module keeps its own decision."""
    model, plain = auto_accelerate(_mlp(4, 1), precision="bf16"), _mlp(4, 1)
    x, y = torch.randn(64, 4), torch.randn(64) * 100  # (large targets: a value loss)

    def value_loss(obs, returns):
        return (model(obs).squeeze(-1) - returns).square().mean()

    step = accelerate_step(value_loss, torch.optim.Adam(model.parameters(), lr=1e-3), precision="fp32",
                           fused_optimizer=False)
    step(x, y)
    plain_optimizer = torch.optim.Adam(plain.parameters(), lr=1e-3)
    (plain(x).squeeze(-1) - y).square().mean().backward()
    plain_optimizer.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    with torch.no_grad():
        assert not torch.equal(model(x), plain(x))  # (its own calls: bf16 autocast, as asked)

    monkeypatch.setattr("rlspeed.accel.step.candidates", lambda *args, **kwargs: ([EAGER_FP32, BF16], []))
    searched = accelerate_step(value_loss, torch.optim.Adam(model.parameters()), example_inputs=(x, y))
    reference, candidate = searched.report.decisions[-1].trials
    assert reference.reference and candidate.strategy == BF16
    assert candidate.output_rel_err > 0  # (measured against a true fp32 run of the loss, not against bf16 itself)
