"""`--accelerate auto` on the hand-derived updates: a measured matmul precision, forced choices, no trace."""

import contextlib
import math
import types

import pytest
import torch
from conftest import needs_torch_2_9

import rlspeed
from rlspeed import DQN, SAC
from rlspeed.accel.strategy import reduced_matmul_supported
from rlspeed.fused.precision import AutoMatmulPrecision
from rlspeed.fused.sac import FusedSACUpdate

pytestmark = pytest.mark.usefixtures("isolated_accel")  # (conftest: own cache, nothing forced, short timing)


@pytest.fixture(autouse=True)
def search_at_once(monkeypatch):
    """The matmul-precision search at the first update (instead of once the updates have taken long enough to pay
    for it: `test_the_search_waits_until_the_updates_pay_for_it` covers that rule)."""
    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", math.inf)


def _batch(batch=256):
    generator = torch.Generator().manual_seed(0)
    return {"obs": torch.randn(batch, 3, generator=generator),
            "actions": torch.rand(batch, 1, generator=generator) * 2 - 1,
            "rewards": torch.randn(batch, generator=generator), "next_obs": torch.randn(batch, 3, generator=generator),
            "terminated": torch.zeros(batch), "discounts": torch.full((batch,), 0.99)}


def test_auto_measures_then_keeps_its_choice_and_leaves_no_trace(monkeypatch):
    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    torch.manual_seed(0)
    auto = SAC("Pendulum-v1", device="cpu", seed=0, accelerate="auto", net_arch=(64, 64))
    assert isinstance(auto._update_step.fn, AutoMatmulPrecision)
    assert isinstance(auto._update_step.fn.update, FusedSACUpdate)
    torch.manual_seed(1)
    auto._update(_batch())
    chosen = auto._update_step.fn.precision
    assert chosen in ("fp32", "bf16-matmul")
    if not reduced_matmul_supported(torch.device("cpu"), "bf16-matmul"):  # (a CPU without native bf16: nothing to try)
        assert chosen == "fp32" and not auto._update_step.fn.trials
        assert "no reduced matmul precision" in str(auto._update_step.fn)
        return
    assert [t.strategy.precision for t in auto._update_step.fn.trials][0] == "fp32"
    assert auto.acceleration_summary() == {"precision": chosen, "compile": "off", "chosen_by": "search",
                                           "reason": auto._update_step.fn.reason}
    assert chosen in str(auto._update_step.fn)

    # The same first step with the choice forced (no search): identical weights, so the search changed nothing
    # (RNG forked, gradient buffer overwritten, no Adam step taken).
    monkeypatch.setenv("RLSPEED_ACCELERATE", chosen)
    torch.manual_seed(0)
    forced = SAC("Pendulum-v1", device="cpu", seed=0, accelerate="auto", net_arch=(64, 64))
    assert forced._update_step.fn.precision == chosen and not forced._update_step.fn.trials
    torch.manual_seed(1)
    forced._update(_batch())
    for a, b in zip(auto._params, forced._params):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_environment_variable_forcing_autocast_uses_autograd(monkeypatch):
    monkeypatch.setenv("RLSPEED_ACCELERATE", "bf16")
    model = DQN("CartPole-v1", device="cpu", seed=0, accelerate="auto")
    assert not isinstance(model._update_step.fn, AutoMatmulPrecision) and model._update_step.hand_derived is None
    choice = model.update_summary()
    assert choice == {"implementation": "autograd",
                      "reason": "RLSPEED_ACCELERATE forces a strategy the hand-derived update cannot run"}


def test_off_means_fp32_without_measuring(monkeypatch):
    monkeypatch.setenv("RLSPEED_ACCELERATE", "off")
    model = DQN("CartPole-v1", device="cpu", seed=0, accelerate="auto", learning_starts=32, train_freq=8,
                batch_size=16)
    model.learn(64, progress_bar=False)
    assert model._update_step.fn.precision == "fp32" and not model._update_step.fn.trials


def test_dqn_prepares_batches_together_once_the_precision_is_chosen(monkeypatch):
    """DQN's one target-network pass for an iteration's batches (`_prepare_batches`) also runs under `--accelerate
    auto`, in the chosen precision, once the first update has chosen it; the steps then match the bare update's."""
    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    generator = torch.Generator().manual_seed(0)
    rows = {"obs": torch.randn(64, 4, generator=generator), "actions": torch.randint(0, 2, (64,), generator=generator),
            "rewards": torch.randn(64, generator=generator), "next_obs": torch.randn(64, 4, generator=generator),
            "terminated": torch.zeros(64), "discounts": torch.full((64,), 0.99)}
    models = []
    for accelerate in ("auto", "off"):
        torch.manual_seed(0)
        models.append(DQN("CartPole-v1", device="cpu", seed=0, accelerate=accelerate, net_arch=(32, 32)))
    auto, bare = models
    assert "prepared" not in auto._prepare_batches(rows)  # not chosen yet: the first update measures
    auto._update(rows)  # (32-wide layers: their products run in fp32 whatever precision this chooses)
    bare._update(rows)
    monkeypatch.setattr(auto._update_step.fn, "precision", "fp32")  # compare like with like
    prepared = auto._prepare_batches(rows)
    assert "prepared" in prepared and "prepared" in bare._prepare_batches(rows)
    auto._update(prepared)
    bare._update(bare._prepare_batches(rows))
    for a, b in zip(auto.q_network.parameters(), bare.q_network.parameters()):
        torch.testing.assert_close(a, b)


def test_a_graphs_device_takes_the_captured_autograd_step_unless_graphs_are_forced_off(monkeypatch):
    """`select_update` rule 4 (no GPU here: a device whose rules say it has whole-step graphs, and a stub for
    accelerate_step's `AcceleratedStep` that records how it was asked): PPO, SAC and DQN take the captured autograd
    step in fp32 without a search when --accelerate is off; RLSPEED_ACCELERATE=off turns graphs off and the
    hand-derived update returns."""
    import dataclasses

    from rlspeed.algos import update

    real_rules = update.rules
    monkeypatch.setattr(update, "rules", lambda device: dataclasses.replace(real_rules(device), supports_graphs=True))
    asked = []

    class Captured:
        report = None

        def __init__(self, loss_fn, optimizer, **options):
            asked.append(options)

        def __call__(self, *batch):
            raise AssertionError("not called in this test")

    monkeypatch.setattr(update, "AcceleratedStep", Captured)
    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    for algo, env_id in ((rlspeed.PPO, "CartPole-v1"), (rlspeed.SAC, "Pendulum-v1"), (rlspeed.DQN, "CartPole-v1")):
        choice = algo(env_id, device="cpu").update_summary()
        assert choice == {"implementation": "autograd+graphs", "reason": "whole-step graphs on cpu"}, algo
        assert asked[-1]["precision"] == "fp32" and asked[-1]["compile"] is False
    monkeypatch.setenv("RLSPEED_ACCELERATE", "off")
    assert rlspeed.PPO("CartPole-v1", device="cpu").update_summary()["implementation"] == "hand-derived"


def test_summary_records_the_rollout_policys_choice_beside_the_updates(monkeypatch):
    """PPO's rollout policy is measured on its own under accelerate="auto": summary.json named only the update's
    choice."""
    from rlspeed import PPO

    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    model = PPO("CartPole-v1", device="cpu", seed=0, accelerate="auto", num_envs=2, num_steps=16, batch_size=32)
    model.learn(32, progress_bar=False)
    summary = model.acceleration_summary()
    assert summary["rollout_policy"] == dict(model.policy.accel_report.summary())
    assert summary["rollout_policy"]["precision"] in ("fp32", "bf16-matmul", "bf16", "fp16")
    assert "rollout_policy" not in PPO("CartPole-v1", device="cpu").acceleration_summary()


@needs_torch_2_9
def test_the_choice_is_cached_so_a_later_run_on_the_machine_does_not_search_again(monkeypatch):
    """`--accelerate auto` searched the hand-derived update's matmul precision at the first update of every run and
    stored nothing: every run paid for the search again. (bf16-matmul is offered here whatever the CPU: the search's
    mechanics are what is tested.)"""
    from rlspeed.fused import precision

    monkeypatch.setattr(precision, "reduced_matmul_supported", lambda device, p: p == "bf16-matmul")
    sources = []
    for _ in range(2):
        model = SAC("Pendulum-v1", device="cpu", seed=0, accelerate="auto", net_arch=(64, 64))
        torch.manual_seed(1)
        model._update(_batch())
        decision = model._update_step.fn._report.decisions[-1]
        sources.append((decision.source, decision.chosen.precision))
    assert sources[0][0] == "search" and sources[1] == ("cache", sources[0][1])
    batch = _batch(128)  # (another batch shape: searched for itself)
    model = SAC("Pendulum-v1", device="cpu", seed=0, accelerate="auto", net_arch=(64, 64))
    model._update(batch)
    assert model._update_step.fn._report.decisions[-1].source == "search"


def test_the_summary_says_how_the_precision_was_chosen(monkeypatch):
    """summary.json's accelerate field said which precision ran but not whether it was measured, cached or forced, and
    the update's reason said "measured by --accelerate auto" when RLSPEED_ACCELERATE had forced it."""
    model = SAC("Pendulum-v1", device="cpu", seed=0, accelerate="auto", net_arch=(64, 64))
    assert model.acceleration_summary()["chosen_by"] == "not yet"
    model._update(_batch())
    assert model.acceleration_summary()["chosen_by"] in ("search", "only candidate")
    monkeypatch.setenv("RLSPEED_ACCELERATE", "fp32")
    forced = SAC("Pendulum-v1", device="cpu", seed=0, accelerate="auto", net_arch=(64, 64))
    assert forced.acceleration_summary()["chosen_by"] == "forced"
    assert "forced by RLSPEED_ACCELERATE" in forced.update_summary()["reason"]


class _TwoParameterUpdate:
    """A stand-in hand-derived update: a large parameter whose gradient every precision computes alike, and a small
    one (a value head's bias) whose gradient a reduced matmul precision garbles."""

    def __init__(self, reduced):
        self.reduced = reduced  # (whether the reduced-precision region is open now)
        self.adam = types.SimpleNamespace(grad=torch.zeros(4096 + 16), check=lambda: None)
        self.adam.grad_views = list(self.adam.grad.split([4096, 16]))
        generator = torch.Generator().manual_seed(0)
        self.large = torch.randn(4096, generator=generator)
        self.small = torch.randn(16, generator=generator) * 0.01
        self.garbled = torch.randn(16, generator=generator) * 0.01

    def gradient(self, *batch):
        self.adam.grad_views[0].copy_(self.large)
        self.adam.grad_views[1].copy_(self.garbled if self.reduced["on"] else self.small)

    def __call__(self, *batch):
        self.gradient(*batch)
        return None, {}


def test_a_reduced_precision_that_garbles_one_parameters_gradient_is_rejected(monkeypatch):
    """The hand-derived updates' search checks the gradient parameter by parameter, as `accelerate_step`'s does: a
    small parameter's gradient gone wrong fails the check, though the whole flat gradient's cosine stays ~1."""
    from rlspeed.fused import precision as fused_precision

    reduced = {"on": False}

    @contextlib.contextmanager
    def region(device, precision):
        reduced["on"] = True
        try:
            yield
        finally:
            reduced["on"] = False

    monkeypatch.setattr(fused_precision, "reduced_matmul_supported", lambda device, p: p == "bf16-matmul")
    monkeypatch.setattr(fused_precision, "precision_context", region)
    step = AutoMatmulPrecision(_TwoParameterUpdate(reduced), torch.device("cpu"), "test")
    step(torch.zeros(1))
    reference, candidate = step.trials
    assert reference.reference and candidate.strategy.precision == "bf16-matmul"
    assert not candidate.passed and "gradient cosine" in candidate.error
    assert step.precision == "fp32"
    assert step.summary()["reason"] == "no other candidate passed the accuracy checks"  # (summary.json says why)
    # (a gradient computation has no output: the report says none was compared rather than an error of 0)
    assert candidate.output_rel_err is None
    line = next(line for line in str(step).splitlines() if line.split()[:1] == ["bf16-matmul"])
    assert line.split()[4] == "-"  # (label, ms/call, speed-up, 1st call s, out err)


def test_the_search_waits_until_the_updates_pay_for_it(monkeypatch):
    """`--accelerate auto` on a hand-derived update follows `accelerate_step`'s rule: fp32 (the bare update) until
    the updates have taken long enough for the search to cost at most `SEARCH_COST_SHARE` of their time, so a short
    run pays nothing for it; then one search, on that update's batch. DQN's updates on prepared batches count too."""
    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", 0.03)  # (the rule as shipped)
    monkeypatch.setattr("rlspeed.fused.precision.reduced_matmul_supported", lambda device, p: p == "bf16-matmul")
    model = DQN("CartPole-v1", device="cpu", seed=0, accelerate="auto", learning_starts=32, train_freq=8,
                batch_size=16)
    model.learn(256, progress_bar=False)
    step = model._update_step.fn
    summary = model.acceleration_summary()
    assert {key: summary[key] for key in ("precision", "compile", "chosen_by")} == {
        "precision": "fp32", "compile": "off", "chosen_by": "waiting"}
    assert summary["reason"].startswith("fp32 eager until the update's calls have taken")
    assert not step.trials and step._waiting.calls == model._n_updates > 8
    assert "until the update's calls have taken" in str(step)

    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", 1e6)  # (any update pays for it: the second searches)
    model = DQN("CartPole-v1", device="cpu", seed=0, accelerate="auto", learning_starts=32, train_freq=8,
                batch_size=16)
    model.learn(64, progress_bar=False)
    step = model._update_step.fn
    assert model.acceleration_summary()["chosen_by"] == "search"
    assert [t.strategy.precision for t in step.trials] == ["fp32", "bf16-matmul"]
    assert "searched after 1 fp32 updates" in step.reason


def test_a_reduced_precision_is_checked_again_as_training_goes_on(monkeypatch, isolated_accel):
    """A reduced precision chosen early keeps being checked against fp32 (after RECHECK_FIRST of its updates, then
    after twice as many more each time): while it passes it stays; once a parameter's gradient leaves the tolerances
    (a critic's small gradients next to its fitted outputs, later in training) the update runs fp32 from there on,
    and summary.json says why."""
    from rlspeed.accel.strategy import Strategy
    from rlspeed.fused import precision as fused_precision

    reduced, garbling = {"on": False}, {"on": False}

    @contextlib.contextmanager
    def region(device, precision):
        reduced["on"] = garbling["on"]
        try:
            yield
        finally:
            reduced["on"] = False

    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", 1e6)  # (the second call searches)
    monkeypatch.setattr(fused_precision, "reduced_matmul_supported", lambda device, p: p == "bf16-matmul")
    monkeypatch.setattr(fused_precision, "precision_context", region)
    monkeypatch.setattr("rlspeed.accel.recheck.RECHECK_FIRST", 3)
    monkeypatch.setattr(fused_precision, "run_search", lambda *args, **kwargs: (
        Strategy("bf16-matmul"), [], "bf16-matmul 1.5x faster than fp32"))
    update = _TwoParameterUpdate(reduced)
    step = AutoMatmulPrecision(update, torch.device("cpu"), "test", ["body.weight", "value_head.bias"])
    for _ in range(2):  # (fp32 while waiting, then the search, on the first call's batch shape)
        step(torch.zeros(1))
    for _ in range(3 + 9):  # (checks at its 3rd and 9th updates: pass; batches of another shape from here on)
        step(torch.zeros(2))
    assert step.precision == "bf16-matmul" and step.summary()["chosen_by"] == "search"
    garbling["on"] = True
    for _ in range(21):  # (the next check, at its 21st update)
        step(torch.zeros(2))
    assert step.precision == "fp32"
    assert step.summary()["reason"].startswith("bf16-matmul failed its check again after 21 updates (gradient cosine")
    # (it names the parameter that went wrong, and by how much)
    difference, largest = float((update.garbled - update.small).abs().max()), float(update.small.abs().max())
    assert (f"(parameter value_head.bias, shape [16]: max abs difference {difference:.3g}, fp32's largest |gradient| "
            f"{largest:.3g})") in step.summary()["reason"]
    # (a later run, which looks its first call's batch up in the cache, starts on fp32)
    again = AutoMatmulPrecision(_TwoParameterUpdate(reduced), torch.device("cpu"), "test")
    again(torch.zeros(1))
    assert again.precision == "fp32" and again.summary()["chosen_by"] == "cache"


def test_dqn_updates_on_prepared_batches_are_checked_again_too(monkeypatch):
    """DQN's updates on prepared batches (the target network's part computed for an iteration's batches at once)
    count towards the next check of the reduced precision chosen, and the iteration at which a check is due runs
    through the wrapper, which checks: the checks go on for the whole run, not just at the first iterations."""
    from rlspeed.accel import recheck
    from rlspeed.accel.strategy import Strategy
    from rlspeed.fused import precision as fused_precision

    checked_at = []
    check_again = recheck.check_again

    def counting_check(*args, **kwargs):
        checked_at.append(step.rechecks.updates)
        return check_again(*args, **kwargs)

    monkeypatch.setattr(fused_precision, "reduced_matmul_supported", lambda device, p: p == "bf16-matmul")
    monkeypatch.setattr(fused_precision, "precision_context", lambda device, precision: contextlib.nullcontext())
    monkeypatch.setattr("rlspeed.accel.recheck.RECHECK_FIRST", 3)
    monkeypatch.setattr(fused_precision, "run_search", lambda *args, **kwargs: (
        Strategy("bf16-matmul"), [], "bf16-matmul 1.5x faster than fp32"))
    monkeypatch.setattr(recheck, "check_again", counting_check)
    wrapper_calls = []
    call = AutoMatmulPrecision.__call__
    monkeypatch.setattr(AutoMatmulPrecision, "__call__",
                        lambda self, *a, **k: (wrapper_calls.append(self.rechecks.updates), call(self, *a, **k))[1])
    model = DQN("CartPole-v1", device="cpu", seed=0, accelerate="auto", learning_starts=32, train_freq=4,
                gradient_steps=3, batch_size=16)
    step = model._update_step.fn
    model.learn(64, progress_bar=False)
    assert step.precision == "bf16-matmul" and step.rechecks.updates == model._n_updates > 21
    # (after 3 updates, then after twice as many more each time: at the update due, though batches come in threes)
    assert checked_at == [3, 9, 21]
    assert len(wrapper_calls) < model._n_updates / 2  # (the other updates ran on prepared batches)


def test_summary_names_the_rollouts_most_called_kind_of_call_not_the_latest(monkeypatch):
    """summary.json's `rollout_policy` described the kind of call decided last: a run's one batch-1 value call (an
    env truncated alone) hid the choice that every batch-of-num_envs rollout call ran."""
    import torch

    from rlspeed import PPO

    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    model = PPO("CartPole-v1", device="cpu", seed=0, accelerate="auto", num_envs=2, num_steps=16, batch_size=32)
    model.learn(32, progress_bar=False)
    with torch.no_grad():
        model.policy(torch.zeros(1, 4))  # (a rare kind of call, decided after the rollout's)
    summary = model.acceleration_summary()["rollout_policy"]
    assert summary["reason"].startswith("[batch<=2, no_grad]"), summary
    kinds = summary["kinds"].split("; ")
    assert kinds[0].startswith("[batch<=2, no_grad] ") and kinds[0].endswith(", 16 calls")  # (num_steps of them)
    assert [kind for kind in kinds if kind.startswith("[batch<=1, no_grad] ")][0].endswith(", 1 call")


@pytest.mark.parametrize(("algo", "env_id"), [("PPO", "CartPole-v1"), ("DQN", "CartPole-v1"), ("SAC", "Pendulum-v1")])
def test_a_hand_derived_updates_check_can_name_each_of_its_parameters(algo, env_id):
    """A failed check names the parameter that went wrong by the model's attribute and its name there: the
    hand-derived update knows every parameter it steps by such a name (SAC's log_alpha included)."""
    model = getattr(rlspeed, algo)(env_id, seed=0, device="cpu", accelerate="auto")
    wrapper = model._update_step.fn
    named = dict(zip(wrapper.parameter_names, wrapper.adam.params))
    assert len(named) == len(wrapper.adam.params) and None not in named
    for name, parameter in named.items():
        attribute, _, inside = name.partition(".")
        held = getattr(model, attribute)
        assert (held.get_parameter(inside) if inside else held) is parameter
