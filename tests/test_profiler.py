"""`rlspeed profile` / `profile_run`: the loop's phases are timed, the report and advice follow from them."""

from __future__ import annotations

import json

import pytest
import torch

from rlspeed import PPO, SAC, UserError, cli
from rlspeed.diagnostics.phases import PREFIX
from rlspeed.diagnostics.profiler import PhaseTime, Profile, advise, profile_run

SMALL_PPO = dict(num_envs=8, num_steps=16, batch_size=64, n_epochs=2, net_arch=(16, 16))


def test_profile_splits_a_ppo_run_into_the_phases_of_its_loop():
    model = PPO("CartPole-v1", device="cpu", seed=0, env_backend="torch", **SMALL_PPO)
    result = profile_run(model, steps=512)
    names = [p.name for p in result.phases]
    assert names == ["act", "env", "buffer", "gae", "update", "metrics", "other"]
    assert all(p.host_ms >= 0 and 0 <= p.share <= 1 for p in result.phases)
    assert sum(p.share for p in result.phases) == pytest.approx(1.0, abs=1e-6)  # "other" is the rest of the wall
    assert result.share("update") > 0 and result.share("env") > 0
    assert result.steps == 512 and result.sps > 0 and result.profiled_sps > 0
    assert result.parameters == sum(p.numel() for p in model.policy.parameters())
    assert result.top_ops and all(not op.name.startswith(PREFIX) for op in result.top_ops)
    text = str(result)
    for name in names:
        assert f"\n  {name} " in text
    assert "advice:" in text and result.advice


def test_profile_times_off_policy_gradient_steps_and_rounds_steps_to_iterations():
    model = SAC("Pendulum-v1", device="cpu", seed=0, env_backend="torch", num_envs=2, learning_starts=20,
                batch_size=32, net_arch=(16, 16))
    result = profile_run(model, steps=31)  # 16 iterations of 2 envs
    assert result.steps == 32
    assert result.share("update") > 0 and result.share("act") > 0 and result.share("buffer") > 0
    assert "gae" not in [p.name for p in result.phases]
    with pytest.raises(UserError, match="steps must be positive"):
        profile_run(model, steps=0, warmup_steps=0)


def test_a_users_own_torch_profiler_sees_the_phases():
    model = PPO("CartPole-v1", device="cpu", seed=0, env_backend="torch", **SMALL_PPO)
    with torch.profiler.profile() as prof:
        model.learn(128, progress_bar=False)
    names = {e.name for e in prof.events()}
    assert {PREFIX + name for name in ("act", "env", "buffer", "gae", "update")} <= names


def _profile(**changes) -> Profile:
    settings = dict(algo="ppo", env_id="CartPole-v1", device="cpu", env_backend="torch", num_envs=32,
                    parameters=9_000, accelerate={}, steps=1000, sps=1000.0, profiled_sps=800.0,
                    phases=[PhaseTime("act", 1, 0, 0.2), PhaseTime("env", 1, 0, 0.2), PhaseTime("update", 1, 0, 0.3),
                            PhaseTime("other", 1, 0, 0.3)])
    settings.update(changes)
    return Profile(**settings)


def test_advice_follows_the_measured_shares_and_settings():
    assert advise(_profile()) == ["no phase stands out; the top operations above are where the time goes."]
    env_bound = [PhaseTime("env", 1, 0, 0.6), PhaseTime("update", 1, 0, 0.2), PhaseTime("other", 1, 0, 0.2)]
    [line] = advise(_profile(env_backend="gymnasium", phases=env_bound))
    assert "--env-backend torch" in line and "60%" in line
    [line] = advise(_profile(env_backend="gymnasium", env_id="Acrobot-v1x", phases=env_bound))
    assert "gymnasium-async" in line
    update_bound = [PhaseTime("update", 1, 0, 0.8), PhaseTime("other", 1, 0, 0.2)]
    [line] = advise(_profile(parameters=200_000, phases=update_bound))
    assert "--accelerate auto" in line and "80%" in line
    assert advise(_profile(parameters=200_000, phases=update_bound, accelerate={"precision": "bf16-matmul"})) == [
        "no phase stands out; the top operations above are where the time goes."]
    [line] = advise(_profile(phases=update_bound))  # a tiny network: precision is not the lever
    assert "per-operation overhead" in line and "keeps fp32 eager when nothing is faster" in line
    lines = advise(_profile(device="cuda:0", host_syncs=50.0))
    assert any("--device cpu" in line for line in lines) and any("host syncs" in line for line in lines)
    assert not any("--device cpu" in line for line in advise(_profile(device="cuda:0", parameters=200_000)))


def test_report_shows_device_times_and_syncs_on_cuda_only():
    cpu, cuda = str(_profile()), str(_profile(device="cuda:0", host_syncs=50.0))
    assert "device ms" not in cpu and "host syncs" not in cpu
    assert "device ms" in cuda and "host syncs: 50.0 per 1k steps" in cuda


def test_profile_command_prints_the_report_json_and_a_trace(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    code = cli.main(["profile", "ppo", "CartPole-v1", "--device", "cpu", "--env-backend", "torch", "--steps", "256",
                     "--num-envs", "8", "--set", "num_steps=16", "--set", "n_epochs=2", "--trace", str(trace),
                     "--json"])
    assert code == 0
    out = capsys.readouterr().out
    assert "rlspeed profile: ppo CartPole-v1 on cpu" in out and "advice:" in out
    data = json.loads(out.strip().splitlines()[-1])
    assert data["steps"] == 256 and {p["name"] for p in data["phases"]} >= {"env", "update", "other"}
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == PREFIX + "update" for e in events)
