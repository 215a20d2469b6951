"""Whole-step CUDA graphs of `accelerate_step` (rlspeed.accel.graphs).

The graph tests need a CUDA GPU and are skipped without one; what can be checked on a CPU (the candidates a CUDA
request gets, the input signature, the values a graph watches) is checked here too.
"""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
from torch import nn

from rlspeed.accel import accelerate_step
from rlspeed.accel.graphs import (
    MAX_GRAPHS,
    MAX_SIGNATURES,
    MAX_STATE_CHANGES,
    MIN_REPLAYS_PER_CAPTURE,
    WARMUP_CALLS,
    StepGraphs,
    _signature,
    split_sync_warnings,
)
from rlspeed.accel.introspect import named_numbers, named_tensors_and_modules, parameter_names
from rlspeed.accel.strategy import Strategy, candidates, normalise_request

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CALLS = WARMUP_CALLS + 5


# --- without a GPU ------------------------------------------------------------------------------------------------
def test_step_candidates_on_cuda_leave_compile_out_for_whole_step_graphs():
    device = torch.device("cuda")
    request = normalise_request("fp32", "auto", "auto")
    step_list, notes = candidates(request, device, allow_fp16=True, whole_step_graphs=True)
    assert step_list == [Strategy("fp32")]
    assert any("captured as a CUDA graph" in note for note in notes)
    module_list, _ = candidates(request, device, allow_fp16=False)  # a module: compiled candidates with graphs
    assert Strategy("fp32", "inductor", True) in module_list
    # graphs=True without compile: an error for a module, the whole-step graph for a step
    forced = normalise_request("fp32", False, True)
    assert candidates(forced, device, allow_fp16=True, whole_step_graphs=True)[0] == [Strategy("fp32")]
    with pytest.raises(Exception, match="torch.compile"):
        candidates(forced, device, allow_fp16=False)


def test_step_candidates_on_cpu_are_unchanged_by_whole_step_graphs():
    request = normalise_request("auto", "auto", "auto")
    cpu = torch.device("cpu")
    assert candidates(request, cpu, allow_fp16=True, whole_step_graphs=True) == candidates(request, cpu,
                                                                                           allow_fp16=True)


def test_signature_keys_shapes_dtypes_and_plain_values():
    a, b = torch.zeros(4, 3), torch.zeros(5, 3)
    assert _signature(((a, 0.5), {})) == _signature(((torch.ones(4, 3), 0.5), {}))
    assert _signature(((a, 0.5), {})) != _signature(((b, 0.5), {}))
    assert _signature(((a, 0.5), {})) != _signature(((a.double(), 0.5), {}))
    assert _signature(((a, 0.5), {})) != _signature(((a, 0.25), {}))
    assert _signature(((a,), {"scale": 1})) != _signature(((a,), {"scale": 2}))
    assert _signature(((a, object()), {})) is None


def test_named_numbers_look_into_plain_objects_and_through_partials():
    class Schedule:
        pass

    schedule, config = Schedule(), Schedule()
    schedule.beta, config.tau = 0.4, 0.005

    def loss(x, weight, cfg):
        return x.sum() * schedule.beta * weight * cfg.tau * SCALE

    readers = named_numbers(functools.partial(loss, weight=5.0, cfg=config))
    schedule.beta, config.tau = 0.6, 0.01
    # schedule.beta and config.tau now, and the global SCALE; the bound 5.0 cannot change
    assert sorted(read() for read in readers) == [0.01, 0.6, 2.0]


def test_named_tensors_and_modules_see_a_rebound_name():
    class Agent:
        def __init__(self):
            self.alpha = torch.ones(())
            self.net = nn.Linear(2, 1)

        def loss(self, x):
            return self.net(x).mean() * self.alpha

    agent = Agent()
    readers = named_tensors_and_modules(agent.loss)
    before = [read() for read in readers]
    agent.alpha = torch.full((), 0.5)  # rebound, e.g. log_alpha.exp().detach() on every step
    after = [read() for read in readers]
    assert any(a is not b for a, b in zip(before, after)) and agent.alpha in after


def test_only_torch_s_sync_warning_marks_a_step_as_synchronising():
    def recorded(*texts):
        return [warnings.WarningMessage(UserWarning(text), UserWarning, "x.py", 1) for text in texts]

    # torch's note on switching the check on mentions "synchronizing operations" too: not a sync (a false positive
    # here turned off the graphs of the first step in every process)
    note = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations "
            "(Triggered internally at Module.cpp:1003.)")
    synced, others = split_sync_warnings(recorded(note, "some other warning"))
    assert synced is None and [str(w.message) for w in others] == ["some other warning"]
    synced, others = split_sync_warnings(recorded(note, "called a synchronizing CUDA operation (Triggered ...)"))
    assert synced.startswith("called a synchronizing CUDA operation") and others == []


SCALE = 2.0


class _Loss:
    def __init__(self):
        self.gamma = 0.9
        self.net = nn.Linear(2, 1)

    def __call__(self, x):
        return self.net(x).mean() * self.gamma * SCALE


def test_parameter_names_name_a_closures_modules_and_tensors_by_their_variables():
    critic, log_alpha, stray = nn.Linear(2, 1), torch.zeros((), requires_grad=True), torch.zeros(())

    def loss(x):
        return critic(x).mean() * log_alpha.exp()

    names = parameter_names(loss, [critic.weight, critic.bias, log_alpha, stray])
    assert names == ["critic.weight", "critic.bias", "log_alpha", None]


def test_named_numbers_watch_closures_globals_and_attributes():
    global SCALE
    coef = 1.5

    def loss(x):
        return x.sum() * coef * SCALE

    readers = named_numbers(loss)
    before = [read() for read in readers]
    assert sorted(before) == [1.5, 2.0]
    SCALE = 3.0
    try:
        assert sorted(read() for read in readers) == [1.5, 3.0]
        obj = _Loss()
        readers = named_numbers(obj)
        obj.gamma = 0.5
        assert sorted(read() for read in readers) == [0.5, 3.0]
    finally:
        SCALE = 2.0


class _FakeStep:
    """What StepGraphs uses of an AcceleratedStep, on the CPU."""

    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer):
        self.loss_fn = lambda x: net(x).square().mean()
        self.optimizers, self.params = [optimizer], list(net.parameters())
        self.device, self.name, self.off_reason = torch.device("cpu"), "fake", None

    def update(self, args: tuple, kwargs: dict) -> torch.Tensor:
        for p in self.params:
            p.grad = None
        loss = self.loss_fn(*args)
        loss.backward()
        self.optimizers[0].step()
        return loss.detach()

    def graphs_turned_off(self, why: str) -> None:
        self.off_reason = why


@pytest.fixture
def traced(monkeypatch):
    """StepGraphs' decisions on a CPU: capture and replay are recorded, and every call still makes a real update."""
    from rlspeed.accel import graphs as graphs_module

    trace: list[str] = []
    monkeypatch.setattr(graphs_module, "_SIDE_STREAMS", {})  # (its fake streams stay out of the real ones' cache)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)

    def side_stream(self, args, kwargs):
        trace.append("warm")
        return self.update(args, kwargs)

    def watching_syncs(self, args, kwargs):
        trace.append("warm-sync")
        return self.update(args, kwargs), None

    def capture(self, args, kwargs, pool):
        trace.append("capture")
        # what a real capture would record: an optimizer whose state is still to be created would be reset by every
        # replay
        self.state_at_capture = getattr(self, "state_at_capture", []) + [all(map(len, (o.state for o in
                                                                                  self.step.optimizers)))]
        self.captures += 1
        return object()

    def replay(self, captured, args, kwargs):
        trace.append("replay")
        self.replays += 1
        return self.update(args, kwargs)

    for name, fn in (("_on_side_stream", side_stream), ("_watching_syncs", watching_syncs), ("_capture", capture),
                     ("_replay", replay)):
        monkeypatch.setattr(StepGraphs, name, fn)
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    step = _FakeStep(net, torch.optim.Adam(net.parameters(), lr=1e-3))
    return StepGraphs(step, step.update), step, trace


def _calls(graphs: StepGraphs, count: int, rows: int = 8) -> None:
    for _ in range(count):
        graphs((torch.randn(rows, 3),), {})


WARM = ["warm"] * (WARMUP_CALLS - 1) + ["warm-sync"]


def test_graphs_warm_up_then_capture_once_and_replay(traced):
    graphs, _, trace = traced
    _calls(graphs, WARMUP_CALLS + 3)
    assert trace == WARM + ["capture", "replay", "replay", "replay"]


def test_signatures_kept_are_the_recently_replayed_and_more_in_turn_than_kept_turn_graphs_off(traced):
    """A fifth batch size dropped the oldest capture, not the least recently used (a rare size cost the hot one its
    graph); five sizes in turn captured on every call, far slower than eager, and nothing turned graphs off."""
    graphs, _, trace = traced
    sizes = [8, 16, 32, 64]
    for rows in sizes:
        _calls(graphs, WARMUP_CALLS + 1, rows)
    _calls(graphs, 1, 8)  # (the first size replayed again: now the most recently used)
    _calls(graphs, WARMUP_CALLS + 1, 128)  # (a fifth: the least recently used, 16, makes room)
    trace.clear()
    _calls(graphs, 1, 8)
    assert trace == ["replay"]
    for _ in range(3):  # (a rare fifth size now and then, between long stretches of the four: graphs stay on)
        for rows in sizes:
            _calls(graphs, MIN_REPLAYS_PER_CAPTURE + 1, rows)
        _calls(graphs, 1, 128)
    assert graphs.off is None
    trace.clear()
    for _ in range(MAX_GRAPHS + 2):
        for rows in [*sizes, 128]:
            _calls(graphs, 1, rows)
    assert graphs.off is not None and "input signatures in use in turn" in graphs.off
    assert trace.count("capture") <= MAX_GRAPHS + 1


def test_changed_optimizer_state_is_warmed_up_again_before_the_next_capture(traced):
    graphs, step, trace = traced
    _calls(graphs, WARMUP_CALLS + 1)
    step.optimizers[0].state.clear()  # captured now, Adam's state would be created inside the graph
    trace.clear()
    _calls(graphs, 5)
    # an eager call creates the state (a change again), one more changes nothing, the next captures
    assert trace == ["warm-sync", "warm-sync", "capture", "replay", "replay", "replay"]
    assert graphs.state_at_capture == [True, True]  # both captures found Adam's state already made
    assert step.optimizers[0].state[step.params[0]]["step"].item() == 5


def test_a_learning_rate_change_recaptures_and_one_on_every_step_turns_graphs_off(traced):
    graphs, step, trace = traced
    _calls(graphs, WARMUP_CALLS + 1)
    group = step.optimizers[0].param_groups[0]
    group["lr"] = 5e-4
    trace.clear()
    _calls(graphs, 3)
    assert trace == ["warm-sync", "capture", "replay", "replay"]  # one eager call, then a new capture
    for _ in range(MAX_STATE_CHANGES):  # a schedule: the learning rate changes again and again
        group["lr"] *= 0.5
        _calls(graphs, WARMUP_CALLS + 1)
    assert step.off_reason is not None and "changed" in step.off_reason
    trace.clear()
    _calls(graphs, 3)
    assert trace == []  # eager from now on
    assert graphs.captures == MAX_STATE_CHANGES + 1


def test_a_tensor_learning_rate_annealed_in_place_keeps_the_first_capture(traced):
    """An annealed learning rate held as a tensor and filled in place (as PPO and A2C hold it on devices with graphs):
    no state the graphs watch changes, so the first capture replays on, with every step reading the new value."""
    graphs, step, trace = traced
    group = step.optimizers[0].param_groups[0]
    group["lr"] = torch.tensor(1e-3)
    _calls(graphs, WARMUP_CALLS + 1)
    trace.clear()
    for _ in range(MAX_STATE_CHANGES + 2):  # more changes than turn graphs off when the value is a float
        group["lr"].mul_(0.5)
        _calls(graphs, 1)
    assert trace == ["replay"] * (MAX_STATE_CHANGES + 2)
    assert step.off_reason is None and graphs.captures == 1


def test_a_state_that_changes_on_every_call_from_the_start_turns_graphs_off_without_a_capture(traced):
    graphs, step, trace = traced
    group = step.optimizers[0].param_groups[0]
    for call in range(WARMUP_CALLS + MAX_STATE_CHANGES + 3):
        group["lr"] = 1e-3 / (call + 1)  # e.g. a schedule written into the optimizer before every step
        _calls(graphs, 1)
    assert "capture" not in trace
    assert step.off_reason is not None and "changed" in step.off_reason
    assert trace.count("warm-sync") <= MAX_STATE_CHANGES + 1  # not a sync-checked call on every step


def test_a_rare_learning_rate_change_keeps_graphs(traced, monkeypatch):
    graphs, step, _ = traced
    monkeypatch.setattr("rlspeed.accel.graphs.STATE_CHANGE_WINDOW", 5)
    _calls(graphs, WARMUP_CALLS + 1)
    group = step.optimizers[0].param_groups[0]
    for _ in range(MAX_STATE_CHANGES + 2):  # a decay now and then, each after more than the window's replays
        group["lr"] *= 0.5
        _calls(graphs, WARMUP_CALLS + 1 + 6)
    assert step.off_reason is None and graphs.captures == MAX_STATE_CHANGES + 3


def test_arguments_that_change_on_every_call_turn_graphs_off(traced):
    graphs, step, _ = traced
    for call in range(MAX_SIGNATURES + 1):
        graphs((torch.randn(8, 3),), {"scale": 1.0 + call})
    assert step.off_reason is not None and "signatures" in step.off_reason
    assert len(graphs.warming) == 0


def test_turning_graphs_off_shows_in_the_strategy_report_and_summary(isolated_accel):
    net = nn.Linear(3, 1)
    step = accelerate_step(lambda x: net(x).square().mean(), torch.optim.Adam(net.parameters()), precision="fp32",
                           example_inputs=(torch.randn(4, 3),))
    step.strategy = Strategy("fp32", graphs=True)  # as on CUDA
    step.report.decisions[-1].chosen = step.strategy
    assert step.report.summary()["graphs"] == "true"
    step.graphs_turned_off("whole-step CUDA graph off: a reason")
    assert not step.strategy.graphs
    assert step.report.summary()["graphs"] == "false"
    assert step.report.decisions[-1].source == "fallback" and "a reason" in str(step.report)


def test_an_optimizer_a_capture_cannot_record_gets_no_graph_label_and_keeps_its_hand_derived_update(monkeypatch):
    """On a graphs device (CUDA), A2C's RMSprop cannot be captured: its update said "autograd+graphs" while it ran
    eagerly, and its hand-derived update was passed over. It takes the hand-derived update, saying why there is no
    graph; PPO's Adam keeps the whole-step graph. (A CPU standing in for a graphs device.)"""
    import dataclasses

    from rlspeed import A2C, PPO
    from rlspeed.algos import update
    from rlspeed.device import rules

    monkeypatch.setattr(update, "rules", lambda device: dataclasses.replace(rules(device), supports_graphs=True))
    a2c = A2C("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=8)
    summary = a2c.update_summary()
    assert summary["implementation"] == "hand-derived" and a2c._update_step.hand_derived is not None
    assert "no whole-step CUDA graph: RMSprop is not captured" in summary["reason"]
    assert PPO("CartPole-v1", device="cpu", seed=0).update_summary()["implementation"] == "autograd+graphs"


# --- on a GPU -----------------------------------------------------------------------------------------------------
def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).cuda()


def _batches(count: int, rows: int = 32, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 6, generator=generator).cuda(), torch.randn(rows, generator=generator).cuda())
            for _ in range(count)]


def _regression(net: nn.Module):
    def loss(x, y):
        prediction = net(x).squeeze(-1)
        return (prediction - y).square().mean(), {"mean_prediction": prediction.detach().mean()}

    return loss


def _plain_steps(net: nn.Module, batches, lr: float = 1e-3) -> list[float]:
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss, _ = _regression(net)(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@cuda
def test_graphed_step_trains_like_the_eager_step(isolated_accel):
    batches = _batches(CALLS)
    plain, graphed = _net(), _net()
    plain_losses = _plain_steps(plain, batches)
    optimizer = torch.optim.Adam(graphed.parameters(), lr=1e-3)
    step = accelerate_step(_regression(graphed), optimizer, precision="fp32")
    losses = [step(x, y)[0].item() for x, y in batches]
    assert step.strategy.graphs and step.graph_captures == 1
    assert step.graph_replays == CALLS - WARMUP_CALLS
    assert "CUDA graph" in str(step.report)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(plain_losses), rtol=1e-4, atol=1e-6)
    for p, q in zip(graphed.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert all(p.grad is not None for p in graphed.parameters())  # the last step's gradients stay readable


@cuda
def test_deleted_graphed_steps_give_back_their_gpu_memory(isolated_accel):
    """Each step's own side stream made cuBLAS cache a workspace for it for the life of the process: every model
    on CUDA kept 64 MiB after `del` (2 GiB after 32 models). Steps made one after another in a thread share one."""
    import gc

    def made_and_dropped():
        net = _net()
        step = accelerate_step(_regression(net), torch.optim.Adam(net.parameters(), lr=1e-3), precision="fp32")
        for x, y in _batches(WARMUP_CALLS + 2):
            step(x, y)
        assert step.graph_captures == 1
        return step._graphs.stream

    first = made_and_dropped()
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    streams = [made_and_dropped() for _ in range(6)]  # (held: ids of dropped streams could be reused)
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 16 * 2**20
    assert all(stream is first for stream in streams)


def test_a_graph_dropped_during_a_capture_is_destroyed_after_it():
    """CUDA refuses to destroy a graph while another is being captured, and the attempt invalidates that capture: a
    dropped model's graph, freed by the garbage collector inside another step's capture, made that capture fail."""
    import gc

    from rlspeed.accel import graphs

    class Graph:  # (a stand-in for torch.cuda.CUDAGraph, which is destroyed when its last reference goes)
        pass

    captured = graphs._Captured(Graph(), [], None, [])
    captured.cycle = captured  # (freed by the collector, as a dropped model's graphs are)
    with graphs._capturing():
        del captured
        gc.collect()
        assert [type(kept) for kept in graphs._DROPPED_DURING_CAPTURE] == [Graph]  # still referenced
    assert not graphs._DROPPED_DURING_CAPTURE


@cuda
def test_a_capture_survives_the_collection_of_a_dropped_steps_graph(isolated_accel):
    import gc

    old_net = _net()
    old = accelerate_step(_regression(old_net), torch.optim.Adam(old_net.parameters(), lr=1e-3), precision="fp32")
    for x, y in _batches(WARMUP_CALLS + 2):
        old(x, y)
    assert old.graph_captures == 1
    net = _net(1)
    regression = _regression(net)

    def loss(x, y):
        if torch.cuda.is_current_stream_capturing():
            gc.collect()  # (as the collector may at any allocation)
        return regression(x, y)

    step = accelerate_step(loss, torch.optim.Adam(net.parameters(), lr=1e-3), precision="fp32")
    gc.disable()  # the dropped step (a reference cycle) stays uncollected until the capture
    try:
        del old, old_net
        for x, y in _batches(WARMUP_CALLS + 2):
            step(x, y)
    finally:
        gc.enable()
    assert step.graph_captures == 1 and step._graphs.off is None


@cuda
def test_a_step_waiting_for_its_search_runs_as_a_graph(isolated_accel):
    """Until a search pays for itself the step waits on its simplest candidate: on CUDA that ran eagerly, without
    the whole-step graph an algorithm's accelerate="off" captures (SAC with --accelerate auto trained several times
    slower than with off). It waits as a graph, and the search's choice is captured anew."""
    net = _net()
    step = accelerate_step(_regression(net), torch.optim.Adam(net.parameters(), lr=1e-3))
    batches = _batches(2 * WARMUP_CALLS + 4)
    for x, y in batches[:WARMUP_CALLS + 2]:
        step(x, y)
    assert step.report.summary()["chosen_by"] == "waiting"
    assert step.strategy.graphs and step.graph_captures == 1 and step.graph_replays == 2
    step.prepare(*batches[0])  # (searches now)
    assert step.report.summary()["chosen_by"] == "search"
    losses = [step(x, y)[0] for x, y in batches[WARMUP_CALLS + 2:]]
    assert step.strategy.graphs and step.graph_captures == 1
    assert all(torch.isfinite(loss) for loss in losses)


@cuda
def test_graphed_step_replays_without_host_syncs(isolated_accel):
    batches = _batches(CALLS)
    net = _net()
    step = accelerate_step(_regression(net), torch.optim.Adam(net.parameters(), lr=1e-3), precision="fp32")
    for x, y in batches[:WARMUP_CALLS + 1]:
        step(x, y)
    assert step.graph_captures == 1
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in batches[WARMUP_CALLS + 1:]:
            step(x, y)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert step.graph_replays == CALLS - WARMUP_CALLS


@cuda
def test_graphed_step_outputs_are_not_overwritten_by_later_replays(isolated_accel):
    batches = _batches(CALLS)
    net = _net()
    step = accelerate_step(_regression(net), torch.optim.Adam(net.parameters(), lr=1e-3), precision="fp32")
    kept = [step(x, y) for x, y in batches]
    values = [(loss.item(), metrics["mean_prediction"].item()) for loss, metrics in kept]
    assert len(set(values)) == len(values)  # every call's outputs are its own


@cuda
def test_graphed_step_gives_each_replays_gradient_norm(isolated_accel):
    """`grad_norm` after a replay is that replay's norm (the graph rewrites the captured norm), as the eager step's."""
    batches = _batches(CALLS)
    plain, graphed = _net(), _net()
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    step = accelerate_step(_regression(graphed), torch.optim.Adam(graphed.parameters(), lr=1e-3), precision="fp32",
                           max_grad_norm=math.inf)
    norms, plain_norms = [], []
    for x, y in batches:
        step(x, y)
        norms.append(step.grad_norm)
        plain_opt.zero_grad()
        _regression(plain)(x, y)[0].backward()
        plain_norms.append(torch.nn.utils.clip_grad_norm_(plain.parameters(), math.inf))
        plain_opt.step()
    assert step.graph_replays == CALLS - WARMUP_CALLS
    torch.testing.assert_close(torch.stack(norms), torch.stack(plain_norms), rtol=1e-4, atol=1e-6)


@cuda
def test_graphed_step_follows_a_changed_learning_rate(isolated_accel):
    batches = _batches(2 * CALLS)
    net = _net()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    step = accelerate_step(_regression(net), optimizer, precision="fp32")
    for x, y in batches[:CALLS]:
        step(x, y)
    assert step.graph_captures == 1
    optimizer.param_groups[0]["lr"] = 0.0
    before = [p.detach().clone() for p in net.parameters()]
    for x, y in batches[CALLS:]:  # warm-up again, then a capture with the new learning rate
        step(x, y)
    assert step.graph_captures == 2
    for p, b in zip(net.parameters(), before):
        assert torch.equal(p.detach(), b)  # lr 0: nothing moves


@cuda
def test_graphed_step_follows_a_changed_python_value(isolated_accel):
    net = _net()

    class Scaled:
        def __init__(self):
            self.scale = 1.0

        def loss(self, x, y):
            prediction = net(x).squeeze(-1)
            return (prediction - y).square().mean(), {"scaled": prediction.detach().mean() * self.scale}

    owner = Scaled()
    step = accelerate_step(owner.loss, torch.optim.Adam(net.parameters(), lr=0.0), precision="fp32")
    x, y = _batches(1)[0]
    for _ in range(CALLS):
        _, metrics = step(x, y)
    first = metrics["scaled"].item()
    owner.scale = 3.0
    for _ in range(CALLS):
        _, metrics = step(x, y)
        assert metrics["scaled"].item() == pytest.approx(3.0 * first, rel=1e-5)
    assert step.graph_captures == 2


@cuda
def test_graphed_step_recreates_cleared_optimizer_state_outside_the_graph(isolated_accel):
    net = _net()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    step = accelerate_step(_regression(net), optimizer, precision="fp32")
    x, y = _batches(1)[0]
    for _ in range(CALLS):
        step(x, y)
    optimizer.state.clear()  # e.g. resetting Adam's moments
    for _ in range(CALLS):
        step(x, y)
    assert step.graph_captures == 2
    first = next(net.parameters())
    assert optimizer.state[first]["step"].item() == CALLS  # counted on: not recreated (zeroed) by every replay


@cuda
def test_a_step_that_reads_the_host_falls_back_to_eager(isolated_accel):
    batches = _batches(CALLS)
    plain, graphed = _net(), _net()
    plain_losses = _plain_steps(plain, batches)

    def loss(x, y):
        value, metrics = _regression(graphed)(x, y)
        if value.item() > 1e9:  # a host read: not capturable
            raise AssertionError
        return value, metrics

    step = accelerate_step(loss, torch.optim.Adam(graphed.parameters(), lr=1e-3), precision="fp32")
    losses = [step(x, y)[0].item() for x, y in batches]
    assert step.graph_captures == 0
    assert "synchronises with the host" in str(step.report)  # seen in the last warm-up call: no capture tried
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(plain_losses), rtol=1e-4, atol=1e-6)


@cuda
def test_a_failed_capture_falls_back_and_leaves_random_numbers_working(isolated_accel, monkeypatch):
    # The warm-up's sync check misses a host read here, so the capture itself fails; torch then leaves its random
    # generator in capture mode and its capture stream current, which StepGraphs puts right.
    monkeypatch.setattr(StepGraphs, "_watching_syncs", lambda self, args, kwargs: (self._on_side_stream(args, kwargs),
                                                                                   None))
    net = _net()

    def loss(x, y):
        value, metrics = _regression(net)(x, y)
        if value.item() > 1e9:
            raise AssertionError
        return value + 0.0 * torch.randn_like(value), metrics

    step = accelerate_step(loss, torch.optim.Adam(net.parameters(), lr=1e-3), precision="fp32")
    for x, y in _batches(CALLS):
        step(x, y)
    assert step.graph_captures == 0
    assert "capture failed" in str(step.report)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    torch.randn(3, device="cuda")  # raised "Offset increment outside graph capture" without the repair


@cuda
def test_graphed_step_draws_fresh_random_numbers_on_each_replay(isolated_accel):
    net = _net()

    def loss(x, y):
        noise = torch.randn_like(y)
        prediction = net(x).squeeze(-1)
        return (prediction + noise - y).square().mean(), {"noise": noise.mean()}

    step = accelerate_step(loss, torch.optim.Adam(net.parameters(), lr=1e-3), precision="fp32")
    x, y = _batches(1)[0]
    noises = [step(x, y)[1]["noise"].item() for _ in range(CALLS)]
    assert step.graph_replays >= 3
    assert len(set(noises[-3:])) == 3


@cuda
def test_graphed_step_keeps_one_graph_per_batch_size(isolated_accel):
    net = _net()
    step = accelerate_step(_regression(net), torch.optim.Adam(net.parameters(), lr=1e-3), precision="fp32")
    full, partial = _batches(CALLS, rows=32), _batches(CALLS, rows=17, seed=2)
    for a, b in zip(full, partial):
        step(*a)
        step(*b)
    assert step.graph_captures == 2
    assert step.graph_replays == 2 * (CALLS - WARMUP_CALLS)


@cuda
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_graphed_step_with_reduced_precision(isolated_accel, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    batches = _batches(CALLS)
    plain, graphed = _net(), _net()
    plain_losses = _plain_steps(plain, batches)
    step = accelerate_step(_regression(graphed), torch.optim.Adam(graphed.parameters(), lr=1e-3),
                           precision=precision)
    losses = [step(x, y)[0].item() for x, y in batches]
    assert step.strategy.graphs and step.graph_captures == 1
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(plain_losses), rtol=3e-2, atol=1e-3)


@cuda
def test_graphs_false_keeps_the_step_eager(isolated_accel):
    net = _net()
    step = accelerate_step(_regression(net), torch.optim.Adam(net.parameters(), lr=1e-3), precision="fp32",
                           compile=False, graphs=False)
    for x, y in _batches(CALLS):
        step(x, y)
    assert not step.strategy.graphs and step.graph_captures == 0


@cuda
def test_ppo_annealing_its_learning_rate_and_clip_range_keeps_one_capture(isolated_accel):
    """PPO on CUDA anneals its learning rate (a tensor the optimizer reads, filled in place) and its clip range (a
    tensor argument of every step) each iteration: the whole run replays one capture."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", device="cuda", seed=0, num_envs=8, num_steps=32, batch_size=128, n_epochs=2,
                anneal_lr=True, anneal_clip=True)
    model.learn(8 * 32 * 6, progress_bar=False)
    assert model.update_summary()["implementation"] == "autograd+graphs"
    step = model._update_step.fn
    assert step.graph_captures == 1 and step.graph_replays > 0
    assert isinstance(model.optimizer.param_groups[0]["lr"], torch.Tensor)
