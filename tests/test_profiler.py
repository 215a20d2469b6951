"""`rlspeed profile` / `profile_run`: the loop's phases are timed, the report and advice follow from them."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rlspeed import DQN, PPO, SAC, UserError, cli
from rlspeed.diagnostics import profiler
from rlspeed.diagnostics.phases import PREFIX
from rlspeed.diagnostics.profiler import PhaseTime, Profile, advise, profile_run

SMALL_PPO = dict(num_envs=8, num_steps=16, batch_size=64, n_epochs=2, net_arch=(16, 16))


def test_profile_splits_a_ppo_run_into_the_phases_of_its_loop():
    model = PPO("CartPole-v1", device="cpu", seed=0, env_backend="torch", **SMALL_PPO)
    result = profile_run(model, steps=256)  # (2 iterations timed, then profiled)
    names = [p.name for p in result.phases]
    assert names == ["act", "env", "buffer", "gae", "update", "metrics", "other"]
    assert all(p.host_ms >= 0 and 0 <= p.share <= 1 for p in result.phases)
    assert sum(p.share for p in result.phases) == pytest.approx(1.0, abs=1e-6)  # "other" is the rest of the wall
    assert result.share("update") > 0 and result.share("env") > 0
    assert result.steps == 256 and result.sps > 0 and result.profiled_sps > 0
    assert result.parameters == sum(p.numel() for p in model.policy.parameters())
    assert result.top_ops and all(not op.name.startswith(PREFIX) for op in result.top_ops)
    text = str(result)
    for name in names:
        assert f"\n  {name} " in text
    assert "advice:" in text and result.advice


def test_a_profile_of_a_subclass_names_the_class_not_the_algorithm_it_inherits(monkeypatch):
    """profile_run(MyPPO(...)) printed 'rlspeed profile: ppo CartPole-v1 ...', rlspeed's algorithm, not the class
    profiled (which inherits PPO's `name`)."""
    from rlspeed.diagnostics import profiler

    class MyPPO(PPO):
        pass

    model = MyPPO("CartPole-v1", device="cpu", seed=0, env_backend="torch", **SMALL_PPO)
    monkeypatch.setattr(profiler, "PROFILED_MAX_STEPS", 128)
    result = profile_run(model, steps=128, warmup_steps=0)
    assert result.algo == "MyPPO" and str(result).startswith("rlspeed profile: MyPPO CartPole-v1")


def test_the_profiled_run_records_at_most_a_bounded_number_of_steps(monkeypatch):
    """The profiler keeps every operation in memory: the unprofiled timing runs the steps asked for, the profiled run
    at most PROFILED_MAX_STEPS, whole iterations, at least one. What `--accelerate auto` would time (a device probe)
    is looked up only for the advice that names it: an update-bound run of a large network without acceleration."""
    from rlspeed.diagnostics import profiler

    model = PPO("CartPole-v1", device="cpu", seed=0, env_backend="torch", **SMALL_PPO)  # 128 steps per iteration
    monkeypatch.setattr(profiler, "PROFILED_MAX_STEPS", 200)
    learned, looked_up = [], []
    learn = model.learn
    monkeypatch.setattr(model, "learn", lambda steps, **kwargs: learned.append(steps) or learn(steps, **kwargs))
    monkeypatch.setattr(profiler, "auto_candidates", lambda model, _=None: looked_up.append(model) or ["bf16-matmul"])
    result = profile_run(model, steps=1024, warmup_steps=0)
    assert learned == [1024, 128] and result.steps == 128  # (whole iterations within the cap)
    assert looked_up == [] and result.auto_candidates is None  # (a small network)
    monkeypatch.setattr(profiler, "PROFILED_MAX_STEPS", 10)
    monkeypatch.setattr(profiler, "SMALL_NETWORK", 0)
    monkeypatch.setattr(profiler, "UPDATE_SHARE", 0.0)
    result = profile_run(model, steps=1024, warmup_steps=0)
    assert result.steps == 128  # (one iteration)
    assert looked_up == [model] and result.auto_candidates == ["bf16-matmul"]
    assert any("try --accelerate auto (it times bf16-matmul" in line for line in result.advice)


def test_profile_times_off_policy_gradient_steps_and_rounds_steps_to_iterations():
    model = SAC("Pendulum-v1", device="cpu", seed=0, env_backend="torch", num_envs=2, learning_starts=20,
                batch_size=32, net_arch=(16, 16))
    result = profile_run(model, steps=31)  # 16 iterations of 2 envs
    assert result.steps == 32
    assert result.share("update") > 0 and result.share("act") > 0 and result.share("buffer") > 0
    assert "gae" not in [p.name for p in result.phases]
    assert result.device_busy_ms is None and result.host_syncs is None  # device figures exist for CUDA only
    networks = {*model.actor.parameters(), *model.critic.parameters()}
    assert result.parameters == sum(p.numel() for p in networks) + 1  # and the learnt temperature, log_alpha
    with pytest.raises(UserError, match="steps must be positive"):
        profile_run(model, steps=0, warmup_steps=0)


def test_an_off_policy_profile_records_a_bounded_number_of_gradient_steps(monkeypatch):
    """The profiler's record grows with the operations run, hundreds per gradient step: SAC HalfCheetah-v5's profile
    recorded 2,000 of them (one per env step) and held gigabytes while reading them back. The profiled run takes at
    most PROFILED_MAX_UPDATES gradient steps now (whole iterations), and an on-policy run keeps its env-step bound."""
    model = SAC("Pendulum-v1", device="cpu", seed=0, env_backend="torch", num_envs=2, gradient_steps=3,
                learning_starts=20, batch_size=32, net_arch=(16, 16))  # 2 env steps and 3 updates per iteration
    monkeypatch.setattr(profiler, "PROFILED_MAX_UPDATES", 10)
    assert profiler.planned_steps(model, 64) == (64, 24, 6)  # (3 iterations: 9 updates)
    model.config.gradient_steps = -1  # (one per env step: 2 per iteration)
    assert profiler.planned_steps(model, 64)[2] == 10
    model.close()
    ppo = PPO("CartPole-v1", device="cpu", seed=0, env_backend="torch", **SMALL_PPO)  # 128 env steps an iteration
    assert profiler.planned_steps(ppo, 1024)[2] == 1024


def test_rlspeed_profile_sizes_the_replay_buffer_to_the_env_steps_it_runs(monkeypatch, capsys):
    """`rlspeed profile sac HalfCheetah-v5` built the preset's buffer of 1,000,000 transitions for a run of some
    12,000 env steps: the profiled model's buffer holds the steps the profile runs (warm-up, timed and profiled
    runs), never wrapping, with the rest of the preset as it is, and the output says so."""
    built = []

    def stop(model, steps=None, **kwargs):
        built.append((model.config.buffer_size, sum(profiler.planned_steps(model, steps)), model.config.batch_size))
        raise UserError("stopped before profiling")

    monkeypatch.setattr(profiler, "profile_run", stop)
    code = cli.main(["profile", "sac", "Pendulum-v1", "--steps", "64", "--device", "cpu", "--env-backend", "torch",
                     "--set", "buffer_size=100000", "--set", "batch_size=48"])
    (capacity, runs, batch_size), = built
    assert code == 2 and capacity == runs < 100_000 and batch_size == 48
    assert f"replay buffer of {runs:,} transitions, the env steps this profile runs" in capsys.readouterr().err
    assert profiler.profile_buffer_size(PPO("CartPole-v1", device="cpu", env_backend="torch", **SMALL_PPO).config) \
        is None  # (no replay buffer)


def test_dqn_profile_covers_staged_collection_over_several_steps():
    model = DQN("CartPole-v1", device="cpu", seed=0, env_backend="torch", num_envs=4, train_freq=8,
                gradient_steps=2, learning_starts=64, batch_size=16, net_arch=(16, 16), activation="gelu")
    result = profile_run(model, steps=64)
    assert result.steps == 64
    assert result.update == model.update_summary() and result.to_dict()["update"]["reason"].startswith("activation=")
    assert all(result.share(name) > 0 for name in ("act", "env", "buffer", "update"))
    assert sum(p.share for p in result.phases) == pytest.approx(1.0, abs=1e-6)


def test_auto_candidates_of_an_autograd_update_follow_its_optimizer_as_accelerate_step_does(monkeypatch):
    """On CUDA `accelerate_step` captures an Adam step as a whole-step graph and leaves torch.compile out, while a
    step a graph cannot capture (A2C's RMSprop) keeps the compiled candidates (their graphs cover the forward and
    backward passes): the profile names what auto would time for this model's optimizer. (It named no compile
    candidate for RMSprop.) The device is CUDA by name only: nothing runs there."""
    import rlspeed.accel.strategy as strategy
    from rlspeed import A2C

    monkeypatch.setattr(strategy, "compile_backend", lambda device, name="on": "inductor")
    rmsprop = A2C("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=4, fused_update=False, net_arch=(8,))
    adam = PPO("CartPole-v1", device="cpu", seed=0, fused_update=False, **SMALL_PPO)
    for model in (rmsprop, adam):
        assert model.update_summary()["implementation"] == "autograd"
        monkeypatch.setattr(model, "device", torch.device("cuda"))
    assert any("compile" in label for label in profiler.auto_candidates(rmsprop))
    assert not any("compile" in label for label in profiler.auto_candidates(adam))


def test_auto_candidates_follow_every_optimizer_of_the_model(monkeypatch):
    """A model of several optimizers (an algorithm of the user's own whose `_optimizers` names an actor's and a
    critic's) had its candidates looked up from `model.optimizer` alone: a second optimizer that a CUDA graph cannot
    capture (RMSprop) left the compiled candidates out, which its update step keeps. The device is CUDA by name
    only: nothing runs there."""
    import rlspeed.accel.strategy as strategy
    from rlspeed.nn import optimizers_without_dynamo

    monkeypatch.setattr(strategy, "compile_backend", lambda device, name="on": "inductor")
    model = PPO("CartPole-v1", device="cpu", seed=0, fused_update=False, **SMALL_PPO)
    with optimizers_without_dynamo():  # (built on the CPU, without the seconds of importing torch._dynamo)
        actor, critic = model.optimizer, torch.optim.RMSprop(model.policy.parameters())
    monkeypatch.setattr(model, "_optimizers", lambda: {"actor_optimizer": actor, "critic_optimizer": critic})
    monkeypatch.setattr(model, "device", torch.device("cuda"))
    assert any("compile" in label for label in profiler.auto_candidates(model))


def test_a_users_own_torch_profiler_sees_the_phases():
    model = PPO("CartPole-v1", device="cpu", seed=0, env_backend="torch", **SMALL_PPO)
    with torch.profiler.profile() as prof:
        model.learn(128, progress_bar=False)
    names = {e.name for e in prof.events()}
    assert {PREFIX + name for name in ("act", "env", "buffer", "gae", "update")} <= names


def _profile(**changes) -> Profile:
    settings = dict(algo="ppo", env_id="CartPole-v1", device="cpu", env_backend="torch", num_envs=32,
                    parameters=9_000, accelerate={}, steps=1000, sps=1000.0, profiled_sps=800.0,
                    phases=[PhaseTime("act", 1, 0.2), PhaseTime("env", 1, 0.2), PhaseTime("update", 1, 0.3),
                            PhaseTime("other", 1, 0.3)])
    settings.update(changes)
    return Profile(**settings)


NOTHING = ["no phase stands out; the top operations above are where the time goes."]


def test_advice_on_env_bound_runs_names_the_faster_backend_where_there_is_one(monkeypatch):
    assert advise(_profile()) == NOTHING
    env_bound = [PhaseTime("env", 60, 0.6), PhaseTime("update", 1, 0.2), PhaseTime("other", 1, 0.2)]
    [line] = advise(_profile(env_backend="gymnasium", phases=env_bound))
    assert "--env-backend torch" in line and "60%" in line
    # with few envs on a CPU Gymnasium's version is the faster one (CPU_NATIVE_MIN_ENVS): no native advice then
    [line] = advise(_profile(env_backend="gymnasium", num_envs=2, phases=env_bound))
    assert "--env-backend torch" not in line and "--num-envs" in line
    # subprocess envs: for envs of 1 ms a step or more on 4 cores or more (on 2 cores, LunarLander's 60 us a step
    # trained 3x slower in them)
    slow_env = [PhaseTime("env", 2_000, 0.6), PhaseTime("other", 1, 0.4)]
    monkeypatch.setattr(profiler, "usable_cores", lambda: 8)
    [line] = advise(_profile(env_backend="gymnasium", env_id="Slow-v0", phases=slow_env))
    assert "gymnasium-async" in line and "2000 us per env step" in line and "on 8 cores" in line
    monkeypatch.setattr(profiler, "usable_cores", lambda: 8)
    [line] = advise(_profile(env_backend="gymnasium", env_id="Fast-v0", phases=[PhaseTime("env", 60, 0.6),
                                                                                 PhaseTime("other", 1, 0.4)]))
    assert "gymnasium-async" not in line and "--num-envs" in line
    # a slow env (highway-env: 26 ms a step) in one process: more envs step in turn, so --num-envs is no lever (it
    # was advised, 'to spread its fixed cost'); subprocesses with 4 envs or more on 4 cores or more, else the env
    [line] = advise(_profile(env_backend="gymnasium", env_id="Slow-v0", num_envs=2, phases=slow_env))
    assert "--env-backend gymnasium-async with --num-envs 4 or more steps each env" in line
    monkeypatch.setattr(profiler, "usable_cores", lambda: 2)
    [line] = advise(_profile(env_backend="gymnasium", env_id="Slow-v0", phases=slow_env))
    assert line == ("env.step takes 60% of the time (2000 us per env step), the env's own computation: more envs in "
                    "this process step one after another, and subprocess envs (--env-backend gymnasium-async) pay "
                    "off from 4 cores (2 here); a cheaper setting of the env itself is what speeds this run.")
    [line] = advise(_profile(phases=[PhaseTime("act", 1, 0.5), PhaseTime("other", 1, 0.5)]))
    assert "choosing actions takes 50%" in line
    # subprocess envs already, for a fast env or on few cores: back to one process (it advised more envs, while
    # CartPole on 2 cores trained 3,353 steps/s in-process against 1,814-2,200 in 4 subprocesses)
    for cores, phases in ((2, slow_env), (8, [PhaseTime("env", 60, 0.6), PhaseTime("other", 1, 0.4)])):
        monkeypatch.setattr(profiler, "usable_cores", lambda cores=cores: cores)
        [line] = advise(_profile(env_backend="gymnasium-async", env_id="Fast-v0", num_envs=4, phases=phases))
        assert "--env-backend gymnasium steps the envs in this process" in line
    monkeypatch.setattr(profiler, "usable_cores", lambda: 8)
    [line] = advise(_profile(env_backend="gymnasium-async", env_id="Slow-v0", num_envs=4, phases=slow_env))
    assert "--num-envs" in line  # (slow envs on many cores: the subprocesses are the right choice)


def test_advice_on_update_bound_runs_depends_on_network_size_and_acceleration():
    update_bound = [PhaseTime("update", 1, 0.8), PhaseTime("other", 1, 0.2)]
    [line] = advise(_profile(parameters=200_000, phases=update_bound, auto_candidates=["bf16-matmul"]))
    assert "--accelerate auto (it times bf16-matmul against fp32 eager" in line and "80%" in line
    [line] = advise(_profile(parameters=200_000, phases=update_bound, device="cuda:0",
                             auto_candidates=["tf32", "bf16"]))
    assert "it times tf32, bf16 against fp32 eager" in line
    with pytest.raises(ValueError, match="auto_candidates"):  # (profile_run looks them up for such a run)
        advise(_profile(parameters=200_000, phases=update_bound))
    [line] = advise(_profile(parameters=200_000, phases=update_bound, accelerate={"precision": "bf16-matmul"}))
    assert "80%" in line and "bf16-matmul" in line and "--accelerate auto" not in line
    [line] = advise(_profile(phases=update_bound))  # a tiny network: precision is not the lever
    assert "per-operation overhead" in line and "keeps fp32 eager when nothing is faster" in line


def test_advice_for_accelerators_small_networks_and_host_syncs():
    lines = advise(_profile(device="cuda:0", device_busy_ms=5.0, host_syncs=50.0))
    assert any("--device cpu" in line for line in lines) and any("50 host syncs" in line for line in lines)
    assert advise(_profile(device="cuda:0", parameters=200_000, device_busy_ms=5.0, host_syncs=2.0)) == NOTHING


def test_report_shows_device_figures_on_cuda_only_and_wraps_advice():
    cpu = str(_profile(advice=["word " * 60]))
    cuda = str(_profile(device="cuda:0", device_busy_ms=500.0, host_syncs=50.0, profiled_sps=800.0))
    assert "device busy" not in cpu and "host syncs" not in cpu
    assert "device busy 500.0 ms per 1k steps (40% of the wall time); host syncs 50.0 per 1k steps" in cuda
    assert max(len(line) for line in cpu.splitlines() if line.lstrip().startswith(("-", "word"))) <= 116


def test_report_fits_a_terminal_narrower_than_its_width(monkeypatch):
    """At 80 columns the report's lines of up to 116 characters (advice, the phases' descriptions, the heading) each
    wrapped mid-word into a ragged second line; it is now wrapped at the terminal's width, and at 116 elsewhere."""
    report = _profile(advice=["word " * 60], caveats=["caveat " * 30],
                      phases=[PhaseTime("act", 1, 0.5), PhaseTime("other", 1, 0.5)])
    monkeypatch.setenv("COLUMNS", "80")
    narrow = str(report)
    assert max(map(len, narrow.splitlines())) < 80
    other = next(line for line in narrow.splitlines() if line.startswith("  other"))
    assert other.endswith("the Python loop, schedules and everything")  # (its description goes on aligned below it)
    assert "    " * 8 + " not in a phase" in narrow
    monkeypatch.setenv("COLUMNS", "200")
    assert 100 < max(map(len, str(report).splitlines())) <= 116


def test_profile_command_prints_the_report_json_and_a_trace(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    code = cli.main(["profile", "ppo", "CartPole-v1", "--device", "cpu", "--env-backend", "torch", "--steps", "256",
                     "--num-envs", "8", "--set", "num_steps=16", "--set", "n_epochs=2", "--trace", str(trace),
                     "--json"])
    assert code == 0
    captured = capsys.readouterr()
    # with --json, stdout is the JSON alone (for `| jq`): the report and the progress go to stderr
    assert "rlspeed profile: ppo CartPole-v1 on cpu" in captured.err and "advice:" in captured.err
    assert "profiling PPO" in captured.err and "trace written" in captured.err
    data = json.loads(captured.out)
    assert data["steps"] == 256 and {p["name"] for p in data["phases"]} >= {"env", "update", "other"}
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == PREFIX + "update" for e in events)


def test_a_trace_is_written_under_a_name_that_is_not_utf8(tmp_path):
    """torch takes the trace's path as UTF-8 text: a name of other bytes (a GBK-named directory, or any non-ASCII
    name where the locale's encoding is ASCII and UTF-8 mode is off) was a TypeError traceback after profiling."""
    trace = tmp_path / os.fsdecode(b"trace-\xff.json")
    model = PPO("CartPole-v1", device="cpu", seed=0, env_backend="torch", **SMALL_PPO)
    profile_run(model, steps=128, warmup_steps=0, trace=trace)
    assert json.loads(trace.read_bytes())["traceEvents"]
    assert os.listdir(tmp_path) == [trace.name]


@pytest.mark.parametrize("args, message", [(["--steps", "0"], "--steps must be positive"),
                                           (["--trace", "/nonexistent-dir/t.json"], "--trace"),
                                           (["--trace", "."], "--trace"),
                                           (["--trace", "/proc/t.json"], "--trace /proc/t.json: cannot write there")])
def test_profile_command_refuses_bad_arguments_before_training(args, message, capsys):
    assert cli.main(["profile", "ppo", "CartPole-v1", "--device", "cpu", *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "profiling" not in captured.err + captured.out


def test_profile_trace_replaces_a_trace_but_not_another_file(tmp_path, monkeypatch, capsys):
    """`--trace notes.json` profiled over the user's file without a word (profile has no --overwrite): a file that is
    not a profiler trace is refused before training; an earlier trace (or an empty file) is rewritten, as a rerun of
    the same command does."""
    from rlspeed import UserError

    def past_the_trace_check(args):  # (where the command builds the model: no training in this test)
        raise UserError("past the trace check.")

    monkeypatch.setattr(cli, "_settings", past_the_trace_check)
    argv = ["profile", "ppo", "CartPole-v1", "--device", "cpu", "--steps", "256", "--trace"]
    (tmp_path / "notes.json").write_text('{"mine": 1}\n')
    assert cli.main([*argv, str(tmp_path / "notes.json")]) == 2
    assert "notes.json exists and is not a trace the profiler wrote" in capsys.readouterr().err
    assert (tmp_path / "notes.json").read_text() == '{"mine": 1}\n'
    (tmp_path / "trace.json").write_text('  {\n    "schemaVersion": 1,\n  "traceEvents": []\n}')  # (as torch writes)
    (tmp_path / "empty.json").touch()
    for name in ("trace.json", "empty.json", "new.json"):
        assert cli.main([*argv, str(tmp_path / name)]) == 2
        assert "past the trace check" in capsys.readouterr().err


def test_update_advice_names_the_setting_that_changes_gradient_steps_per_env_step():
    """'Fewer, larger minibatches' cannot help where each epoch is already one minibatch (batch_size above the
    rollout is cut to it): the advice names the setting that would change something under this config."""
    from rlspeed.algos import A2CConfig, DQNConfig, PPOConfig

    one = profiler.update_lever(PPOConfig(num_envs=32, num_steps=8, batch_size=512, n_epochs=20))
    assert one.startswith("fewer epochs (n_epochs, now 20; each epoch is already one minibatch of the 256-step")
    several = profiler.update_lever(PPOConfig(num_envs=32, num_steps=8, batch_size=64, n_epochs=4))
    assert "batch_size, now 64: 4 per epoch" in several and "n_epochs, now 4" in several
    assert "gradient_steps, now 1 per iteration" in profiler.update_lever(DQNConfig())
    assert "one per env step collected" in profiler.update_lever(DQNConfig(gradient_steps=-1))
    assert profiler.update_lever(A2CConfig(num_steps=5)).startswith("longer rollouts (num_steps, now 5")
    line = advise(_profile(parameters=1_000, update_lever=one,
                           phases=[PhaseTime("update", 1, 0.6), PhaseTime("other", 1, 0.4)]))[0]
    assert "fewer epochs (n_epochs, now 20" in line and "larger minibatches" not in line


def test_the_header_names_nested_acceleration_choices_in_words():
    """An on-policy model's acceleration choice holds its rollout policy's (a dict): the header shows it in the same
    words, not as a Python dict."""
    choice = {"precision": "fp32", "compile": "off", "rollout_policy": {"precision": "fp32", "graphs": "false"}}
    assert profiler._describe(choice) == ("precision fp32, compile off, rollout_policy (precision fp32, graphs "
                                          "false)")
    assert profiler._describe({}) == "off"


def test_profile_says_it_reads_the_record_back_and_caveats_a_run_of_a_few_steps(capsys):
    """Off-policy profiles spent minutes reading the profiler's events back without a word; `--steps 1` (one
    iteration: 2 envs x the preset's train_freq 16 here, start-up and the closing metrics read included) was
    reported as if it were representative. A run of the default length gets no caveat."""
    small = ["--device", "cpu", "--env-backend", "torch", "--num-envs", "2", "--set", "learning_starts=16",
             "--set", "batch_size=16", "--set", "net_arch=[16, 16]"]
    assert cli.main(["profile", "dqn", "CartPole-v1", "--steps", "1", *small]) == 0
    captured = capsys.readouterr()
    err = captured.err
    assert "rlspeed: 32 env steps profiled in" in err and "reading back the profiler's record of every operation" in err
    assert err.index("reading back") > err.index("profiling DQN")
    report = " ".join(captured.out.split())
    # (the default: the preset's 16 gradient steps an iteration, PROFILED_MAX_UPDATES of them in 16 iterations)
    assert "caveat: only 32 env steps (1 iteration) were profiled, fewer than the 512 of the default run" in report
    assert report.index("caveat:") < report.index("advice:")
    model = DQN("CartPole-v1", device="cpu", seed=0, env_backend="torch", num_envs=2, train_freq=16)
    assert profiler.too_few_steps(model, 2_016) == [] and profiler.too_few_steps(model, 1_984)


def test_advice_for_an_env_that_waits_names_subprocess_envs_on_any_number_of_cores(monkeypatch):
    """A sleeping env (a simulator over a socket) keeps no core busy: subprocesses wait side by side even on 2
    cores (8 envs of 5 ms: 178 steps/s in-process, 934 in subprocesses on this project's 2 cores)."""
    monkeypatch.setattr(profiler, "usable_cores", lambda: 2)
    slow_env = [PhaseTime("env", 5_700, 0.98), PhaseTime("other", 1, 0.02)]
    [line] = advise(_profile(env_backend="gymnasium", env_id="Slow-v0", num_envs=8, phases=slow_env, cores_busy=0.1))
    assert "--env-backend gymnasium-async" in line and "mostly waits" in line
    # in subprocesses already, 700 us per env step (8 envs side by side): keep them, not back to one process
    amortised = [PhaseTime("env", 700, 0.9), PhaseTime("other", 1, 0.1)]
    [line] = advise(_profile(env_backend="gymnasium-async", env_id="Slow-v0", num_envs=8, phases=amortised,
                             cores_busy=0.2))
    assert "in this process" not in line and "--num-envs" in line
    # an env that computes (the cores busy) keeps the core-count rule: subprocesses need 4 cores or more
    [line] = advise(_profile(env_backend="gymnasium", env_id="Slow-v0", num_envs=8, phases=slow_env, cores_busy=1.0))
    assert "mostly waits" not in line and "pay off from 4 cores (2 here)" in line


def test_profile_of_a_sleeping_env_reports_idle_cores_and_advises_subprocesses(monkeypatch):
    import helpers.slow_env  # noqa: F401  (registers SlowSleeping-v0)

    monkeypatch.setattr(profiler, "usable_cores", lambda: 2)
    model = PPO("SlowSleeping-v0", device="cpu", seed=0, env_backend="gymnasium", num_envs=2, num_steps=16,
                batch_size=32, n_epochs=1, net_arch=(8,))
    result = profile_run(model, steps=64, warmup_steps=0)
    assert result.cores_busy is not None and result.cores_busy < profiler.WAITING_CORES
    assert any("--env-backend gymnasium-async" in line for line in result.advice)
    assert result.to_dict()["cores_busy"] == result.cores_busy


def test_update_advice_names_accelerate_auto_only_where_it_has_a_faster_precision_to_try():
    """On a CPU without AMX a hand-derived update has nothing but fp32 for --accelerate auto to choose: the advice
    names what can help there instead, and where auto has candidates it names them."""
    update_bound = [PhaseTime("update", 1, 0.8), PhaseTime("other", 1, 0.2)]
    [line] = advise(_profile(parameters=200_000, phases=update_bound, auto_candidates=[]))
    assert "no faster precision" in line and "try --accelerate auto" not in line
    assert "fewer gradient steps per env step" in line
    [line] = advise(_profile(parameters=200_000, phases=update_bound, auto_candidates=["bf16"]))
    assert "try --accelerate auto" in line and "bf16 against fp32" in line
    # (an activation the hand-derived update does not cover: the advice said nothing of why the update was autograd)
    gelu = {"implementation": "autograd", "reason": "activation=gelu (the hand-derived update covers tanh and relu)"}
    for candidates in ([], ["bf16"]):
        [line] = advise(_profile(parameters=200_000, phases=update_bound, auto_candidates=candidates, update=gelu,
                                 activation="gelu"))
        assert line.endswith(" They run by autograd, not the hand-derived update: activation=gelu (the hand-derived "
                             "update covers tanh and relu).")
    # (the sentence keys on the run's activation, not on the reason's wording: gelu kept on autograd by another rule
    # gives that rule's reason; tanh on autograd for any reason is no activation's doing)
    for activation, said in (("gelu", " They run by autograd, not the hand-derived update: fused_update=false."),
                             ("tanh", "")):
        kept = {"implementation": "autograd", "reason": "fused_update=false"}
        [line] = advise(_profile(parameters=200_000, phases=update_bound, auto_candidates=["bf16"], update=kept,
                                 activation=activation))
        assert line.endswith("and keeps fp32 eager where nothing is faster)." + said)


def test_auto_candidates_are_those_the_hand_derived_update_would_time(monkeypatch):
    import rlspeed.fused.precision as precision

    model = PPO("CartPole-v1", device="cpu", seed=0, **SMALL_PPO)
    assert model.update_summary()["implementation"] == "hand-derived"
    monkeypatch.setattr(precision, "reduced_matmul_supported", lambda device, p: False)  # (x86 without AMX)
    assert profiler.auto_candidates(model) == []
    monkeypatch.setattr(precision, "reduced_matmul_supported", lambda device, p: p == "bf16-matmul")  # (with AMX)
    assert profiler.auto_candidates(model) == ["bf16-matmul"]
