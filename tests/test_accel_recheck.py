"""Rule 5 of docs/acceleration.md for the autograd update steps of rlspeed's algorithms (a CNN or Dict encoder under
`accelerate="auto"`): a reduced precision chosen by a search or from the cache is checked against fp32 again as
training goes on, as the hand-derived updates' is (tests/test_fused_precision.py); a user's `accelerate_step` is
checked once. The search is stubbed to choose bf16 autocast (any CPU runs it), so that what is tested is the checks."""

from __future__ import annotations

import math
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlspeed
from rlspeed.accel import recheck, search
from rlspeed.accel.report import Decision
from rlspeed.accel.step import AcceleratedStep
from rlspeed.accel.strategy import EAGER_FP32, Strategy

pytestmark = pytest.mark.usefixtures("isolated_accel")  # (conftest: own cache, nothing forced, short timing)

# 2 envs x 16 steps in minibatches of 8, 2 epochs: 8 updates per iteration
PPO_OPTIONS = {"num_envs": 2, "num_steps": 16, "batch_size": 8, "n_epochs": 2, "cnn_features_dim": 8,
               "net_arch": (8,), "seed": 0, "device": "cpu", "accelerate": "auto"}
NEVER = 10**9


@pytest.fixture(autouse=True)
def searched_bf16(monkeypatch):
    """The update step's search (at its second call) chooses bf16 autocast, the rollout policy's fp32 (a measured
    choice would differ from run to run); the checks count where they ran."""
    monkeypatch.setattr("rlspeed.accel.module.SEARCH_COST_SHARE", 1e6)
    monkeypatch.setattr("rlspeed.accel.module.run_search", lambda candidates, *args, **kwargs: (
        candidates[0], [], "stub"))
    monkeypatch.setattr("rlspeed.accel.step.run_search", lambda candidates, *args, **kwargs: (
        Strategy("bf16"), [], "1.50x faster than fp32"))
    checks: list[int] = []
    check_again = recheck.check_again

    def counted(strategy, *args, **kwargs):
        checks.append(strategy.precision)
        return check_again(strategy, *args, **kwargs)

    monkeypatch.setattr(recheck, "check_again", counted)
    return checks


def _tolerance(monkeypatch, passing: bool) -> None:
    """bf16 against fp32: any difference fails (`passing` False), or none does."""
    loose, none = search.Tolerance(math.inf, -1.0, math.inf), search.Tolerance(0.0, 1.0, 0.0)
    monkeypatch.setitem(search.TOLERANCES, "bf16", loose if passing else none)


def _cartpole_with_an_image(num_envs: int = 2) -> gym.vector.VectorEnv:
    """CartPole-v1 whose observation is a Dict: its state and a 6x6 uint8 image of the cart's position (a CNN
    encoder's input), so its PPO trains with the autograd update step."""
    space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                             "image": gym.spaces.Box(0, 255, (6, 6, 1), np.uint8)})

    def observe(obs):
        return {"state": obs, "image": np.full((6, 6, 1), int(np.clip(obs[0] + 2.4, 0, 4.8) * 50), np.uint8)}

    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync",
                        wrappers=[lambda env: gym.wrappers.TransformObservation(env, observe, space)],
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})


def _ppo() -> rlspeed.PPO:
    model = rlspeed.PPO(_cartpole_with_an_image(), **PPO_OPTIONS)
    assert model.update_summary()["implementation"] == "autograd"
    return model


def test_a_reduced_precision_an_autograd_update_chose_is_checked_again_and_a_passing_run_is_unchanged(
        monkeypatch, searched_bf16, tmp_path):
    """Checks after 2 updates, then after twice as many more each time (2, 6, 14 of 16); passing ones keep bf16 and
    leave no trace: the weights equal those of the same run without checks."""
    _tolerance(monkeypatch, passing=True)
    monkeypatch.setattr(recheck, "RECHECK_FIRST", 2)
    checked = _ppo()
    checked.learn(64, progress_bar=False)
    assert checked._n_updates == 16 and searched_bf16 == ["bf16"] * 3
    assert checked._update_step.fn.rechecks.updates == 15  # (the first update ran fp32, then the search)
    assert checked.acceleration_summary()["precision"] == "bf16"
    assert checked.acceleration_summary()["chosen_by"] == "search"

    monkeypatch.setattr(recheck, "RECHECK_FIRST", NEVER)
    monkeypatch.setenv("RLSPEED_CACHE_DIR", str(tmp_path / "another"))  # (searched at the same update, not cached)
    unchecked = _ppo()
    unchecked.learn(64, progress_bar=False)
    assert searched_bf16 == ["bf16"] * 3
    for name, weight in checked.policy.state_dict().items():
        assert torch.equal(weight, unchecked.policy.state_dict()[name]), name


def test_a_resumed_run_goes_on_with_its_recheck_schedule(monkeypatch, searched_bf16, tmp_path):
    """The checkpoint keeps where the re-check schedule stands, and a resumed run that runs the same precision goes
    on from there: it checked again after 2, 6 and 14 updates of its own, as if it were a new run. A checkpoint
    without the schedule (written before) starts it anew."""
    _tolerance(monkeypatch, passing=True)
    monkeypatch.setattr(recheck, "RECHECK_FIRST", 2)
    first = _ppo()
    first.learn(64, progress_bar=False, run_dir=tmp_path / "run", checkpoint_freq=64)
    path = tmp_path / "run" / "checkpoint.safetensors"
    assert searched_bf16 == ["bf16"] * 3 and rechecks_of(first) == (15, 30)  # (checked at 2, 6 and 14)
    resumed = _ppo()
    resumed.resume(path)
    resumed.learn(64, progress_bar=False)  # (16 updates more, bf16 from the cache: a check at the 30th)
    assert resumed.acceleration_summary()["chosen_by"] == "cache"
    assert searched_bf16 == ["bf16"] * 4 and rechecks_of(resumed) == (31, 62)

    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    tensors, meta = load_checkpoint(path)
    del meta["resume"]["rechecks"]
    save_checkpoint(tmp_path / "older.safetensors", tensors, meta)
    older = _ppo()
    older.resume(tmp_path / "older.safetensors")
    older.learn(64, progress_bar=False)
    assert searched_bf16 == ["bf16"] * 7 and rechecks_of(older) == (16, 30)  # (at 2, 6 and 14 again)


def rechecks_of(model: rlspeed.PPO) -> tuple[int, int]:
    """(updates counted, the count of the next check) of the model's update step's re-check schedule."""
    rechecks = model._update_step.fn.rechecks
    return rechecks.updates, rechecks.next_check


def test_a_cached_reduced_precision_that_fails_a_check_runs_fp32_from_there_and_the_cache_keeps_fp32(
        monkeypatch, searched_bf16):
    monkeypatch.setattr(recheck, "RECHECK_FIRST", NEVER)
    _ppo().learn(32, progress_bar=False)  # (searches: bf16, cached)
    _tolerance(monkeypatch, passing=False)
    monkeypatch.setattr(recheck, "RECHECK_FIRST", 3)
    model = _ppo()
    model.learn(96, progress_bar=False)
    summary = model.acceleration_summary()
    assert searched_bf16 == ["bf16"]  # (one check, at the 3rd update; none once fp32 runs)
    assert summary["precision"] == "fp32" and summary["chosen_by"] == "search"
    assert summary["reason"].startswith("bf16 failed its check again after 3 updates (output error")
    # (named by the model's attribute and the parameter's name in it, once, after the measures it missed)
    assert re.search(r"(gradient cosine [0-9.]+ < 1; )?gradient norm error [0-9.e-]+ > 0 \(parameter "
                     r"policy\.\S+, shape \[[0-9, ]+\]: max abs difference [0-9.e-]+, fp32's largest \|gradient\| "
                     r"[0-9.e-]+\)\): fp32 from there on$", summary["reason"]), summary["reason"]
    assert "[all calls] -> bf16 (cache" in model.report() and summary["reason"] in model.report()
    assert model._update_step.fn.strategy == Strategy("fp32")
    again = _ppo()  # (the next run starts on fp32, from the cache, and checks nothing)
    again.learn(48, progress_bar=False)
    assert again.acceleration_summary()["precision"] == "fp32"
    assert again.acceleration_summary()["chosen_by"] == "cache" and searched_bf16 == ["bf16"]


def test_a_users_accelerate_step_is_checked_once(monkeypatch, searched_bf16):
    _tolerance(monkeypatch, passing=False)
    monkeypatch.setattr(recheck, "RECHECK_FIRST", 1)
    model = torch.nn.Linear(4, 1)
    step = rlspeed.accelerate_step(lambda x: model(x).square().mean(), torch.optim.Adam(model.parameters()))
    for _ in range(8):
        step(torch.randn(16, 4))
    assert step.strategy == Strategy("bf16") and not searched_bf16


SAVED_SCHEDULE = {"precision": "bf16", "updates": 700, "next_check": 1500}


def test_a_resumed_schedule_goes_on_from_the_first_final_decision_only():
    """A checkpoint's schedule is for the first final decision: a step that decides fp32 (from the cache) drops it,
    so that a later decision of the saved precision (the step deciding anew) starts the checks anew, as a run that
    never ran it; a decision of the saved precision goes on from it."""
    dropped = recheck.Rechecks()
    dropped.resume(SAVED_SCHEDULE)
    dropped.follow(Decision("all calls", EAGER_FP32, "cache", ""))
    assert dropped.state() == {}
    dropped.follow(Decision("all calls", Strategy("bf16"), "search", ""))
    assert dropped.state() == {"precision": "bf16", "updates": 0, "next_check": recheck.RECHECK_FIRST}

    kept = recheck.Rechecks()
    kept.resume(SAVED_SCHEDULE)
    kept.follow(Decision("all calls", Strategy("bf16"), "cache", ""))
    assert kept.state() == SAVED_SCHEDULE


def test_a_resumed_schedule_waits_for_the_search_of_a_step_that_runs_fp32_until_it(searched_bf16):
    """What a step runs while its search waits (fp32, `waiting`) is no decision: the saved schedule goes on from the
    search's choice of its precision at the second call (one update of it counted)."""
    model = torch.nn.Linear(4, 1)
    step = AcceleratedStep(lambda x: model(x).square().mean(), torch.optim.Adam(model.parameters()), recheck=True)
    step.rechecks.resume(SAVED_SCHEDULE)
    step(torch.randn(16, 4))
    assert step.report.decisions[-1].source == "waiting" and step.rechecks.state() == {}
    step(torch.randn(16, 4))
    assert step.strategy == Strategy("bf16") and step.rechecks.state() == {**SAVED_SCHEDULE, "updates": 701}
    assert not searched_bf16
