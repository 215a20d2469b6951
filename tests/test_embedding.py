"""rlspeed inside a larger program or a notebook: it leaves the process's torch thread count as the caller set it
(outside `learn`), refuses arguments of the wrong type in one sentence, and reads well in IPython (errors without
rlspeed's internal frames, a model's repr)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rlspeed import PPO, UserError, make_env
from rlspeed.population import Population

SMALL = {"num_envs": 4, "num_steps": 16, "batch_size": 32, "n_epochs": 1}

needs_two_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to tell thread counts apart")


@pytest.fixture
def caller_threads():
    """The caller's torch thread count is 2 during the test (the suite's 1 again afterwards)."""
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(1)


def _model(**options) -> PPO:
    return PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", **SMALL, **options)


@needs_two_cores
def test_learn_trains_with_the_models_threads_and_gives_the_callers_back(caller_threads):
    """A model's num_threads holds while learn runs, its callbacks and evaluations included; the caller's count holds
    again when learn returns, and when it raises."""
    model = _model(num_threads=1)
    seen = []
    evaluate = model.evaluate

    def evaluate_and_record(*args, **kwargs):
        seen.append(("evaluate", torch.get_num_threads()))
        return evaluate(*args, **kwargs)

    model.evaluate = evaluate_and_record
    model.learn(128, progress_bar=False, target_return=1e9, eval_freq=64, eval_episodes=1,
                callback=lambda local: seen.append(("callback", torch.get_num_threads())))
    assert {kind for kind, _ in seen} == {"evaluate", "callback"}
    assert {threads for _, threads in seen} == {1}
    assert torch.get_num_threads() == caller_threads

    def fail(local):
        raise RuntimeError("the caller's own error")

    with pytest.raises(RuntimeError, match="the caller's own error"):
        model.learn(64, progress_bar=False, callback=fail)
    assert torch.get_num_threads() == caller_threads


@needs_two_cores
def test_learn_gives_the_callers_threads_back_when_it_stops_right_after_its_setup(caller_threads):
    """An interrupt (a notebook's stop button) landing in learn between its setup, which runs on the model's threads,
    and its training loop gives the caller's thread count back too."""
    model = _model(num_threads=1)

    def interrupted() -> None:
        raise KeyboardInterrupt

    model._follow_learning_rate = interrupted
    with pytest.raises(KeyboardInterrupt):
        model.learn(64, progress_bar=False)
    assert torch.get_num_threads() == caller_threads


@needs_two_cores
def test_building_loading_and_predicting_leave_the_callers_threads(caller_threads, tmp_path):
    """Making a model (also one whose constructor refuses an argument), loading one and predicting with it leave
    torch's thread count as the caller set it."""
    with pytest.raises(UserError, match="Unknown hyperparameter 'learning_rat'"):
        PPO("CartPole-v1", num_threads=1, learning_rat=3e-4)
    assert torch.get_num_threads() == caller_threads
    model = _model(num_threads=1)
    assert torch.get_num_threads() == caller_threads
    path = model.save(tmp_path / "model")
    loaded = PPO.load(path, device="cpu")
    loaded.predict(torch.zeros(4).numpy())
    assert torch.get_num_threads() == caller_threads


@needs_two_cores
def test_the_same_seed_builds_the_same_model_whatever_the_callers_threads():
    """A model's initial weights (an orthogonal init) are drawn under its own thread count, so the same seed and
    settings give the same model whatever the caller's (or the machine's) torch thread count is."""
    def weights(threads: int) -> list[torch.Tensor]:
        torch.set_num_threads(threads)
        try:
            return [p.detach().clone() for p in PPO("CartPole-v1", seed=0, net_arch=[256, 256]).policy.parameters()]
        finally:
            torch.set_num_threads(1)

    assert all(torch.equal(a, b) for a, b in zip(weights(1), weights(2)))


def test_a_setting_without_effect_warns_when_the_model_is_made_not_when_it_is_loaded(tmp_path):
    """The warning for a setting that does nothing on the env is said once, where the model is made; loading the
    saved model (rlspeed eval, a member model) does not repeat it."""
    import warnings

    from rlspeed.errors import UnusedSettingWarning

    with pytest.warns(UnusedSettingWarning, match="cnn_features_dim=16 has no effect"):
        model = PPO("CartPole-v1", seed=0, cnn_features_dim=16, **SMALL)
    path = model.save(tmp_path / "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedSettingWarning)
        PPO.load(path)
    with pytest.warns(UnusedSettingWarning, match="normalize_images=False has no effect"):  # (a value given now)
        PPO.load(path, normalize_images=False)


@needs_two_cores
def test_a_population_trains_with_its_members_threads(caller_threads):
    """A population's learn runs with its members' num_threads and gives the caller's count back."""
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], device="cpu", num_threads=1, **SMALL)
    assert torch.get_num_threads() == caller_threads
    seen = []
    train_iteration = population.train_iteration

    def train_and_record():
        seen.append(torch.get_num_threads())
        return train_iteration()

    population.train_iteration = train_and_record
    population.learn(64, progress_bar=False)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == caller_threads


@needs_two_cores
def test_setting_up_off_policy_training_and_populations_run_on_the_members_threads(caller_threads):
    """A replay buffer's allocation (learn's setup), a population's stacking of its members' weights and its final
    evaluation ran on the caller's thread count, outside the model's: they started torch's OpenMP threads, on which a
    process forked afterwards (a sweep's multiprocessing.Pool worker) hangs."""
    from rlspeed import SAC
    from rlspeed.population import SACPopulation

    model, seen = SAC("Pendulum-v1", seed=0, num_threads=1, learning_starts=32, batch_size=16), []
    start = model._start
    model._start = lambda *args: seen.append(("setup", torch.get_num_threads())) or start(*args)
    model.learn(64, progress_bar=False)
    build, summary = SACPopulation._build, SACPopulation._summary

    def building(self, solos):
        seen.append(("stacking", torch.get_num_threads()))
        return build(self, solos)

    def summarising(self, *args, **kwargs):
        seen.append(("summary", torch.get_num_threads()))
        return summary(self, *args, **kwargs)

    SACPopulation._build, SACPopulation._summary = building, summarising
    try:
        population = Population(SAC, "Pendulum-v1", seeds=[0, 1], num_threads=1, learning_starts=32, batch_size=16)
        assert torch.get_num_threads() == caller_threads
        population.learn(64, progress_bar=False, eval_episodes=1)
    finally:
        SACPopulation._build, SACPopulation._summary = build, summary
    assert {what for what, _ in seen} == {"setup", "stacking", "summary"} and {n for _, n in seen} == {1}, seen
    assert torch.get_num_threads() == caller_threads


def _forking_script(body: str, tmp_path) -> subprocess.CompletedProcess:
    """`body` run in a fresh Python whose torch uses 2 threads (a caller's count): a process forked from the test
    suite's own would find OpenMP threads of earlier tests, which no rlspeed change controls."""
    script = textwrap.dedent("""
        import multiprocessing, sys, torch
        torch.set_num_threads(2)
        from rlspeed import SAC

        def train_in_a_worker():
            return SAC("Pendulum-v1", seed=1, learning_starts=32, batch_size=16).learn(
                64, progress_bar=False).num_timesteps

        def load_in_a_worker(path):
            model = SAC.load(path)
            model.resume(path)
            return model.num_timesteps
        """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)


@needs_two_cores
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs the fork start method")
def test_pool_workers_forked_after_training_saving_and_loading_train_and_load_too(tmp_path):
    """A sweep that trained a SAC model in the parent (on torch's default thread count), then trained others in a
    fork-started multiprocessing.Pool, hung for ever: the parent's learn had started torch's OpenMP threads outside
    the model's one thread, and each worker's learn waited on them at its replay buffer's allocation.
    Passing a saved model's path to fork-started Pool workers, which load it, hung for ever where the parent had
    saved or loaded a model itself: a checkpoint's copies and checks and the weights' restoring ran on the caller's
    threads and started torch's OpenMP threads, and each worker's load waited on them. They run on the model's
    threads now, as training does."""
    done = _forking_script("""
        model = SAC("Pendulum-v1", seed=0, learning_starts=32, batch_size=16)
        model.learn(64, progress_bar=False)
        path = str(model.save("model"))
        SAC.load(path).resume(path)
        with multiprocessing.get_context("fork").Pool(1) as pool:
            print(pool.apply_async(train_in_a_worker).get(timeout=120))
            print(pool.apply_async(load_in_a_worker, (path,)).get(timeout=120))
        """, tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["64", "64"], done.stderr[-2000:]


@pytest.mark.parametrize("call, name", [
    (lambda: PPO("CartPole-v1", device=5), "device"),
    (lambda: PPO("CartPole-v1", num_threads="two"), "num_threads"),
    (lambda: PPO("CartPole-v1", num_threads=1.5), "num_threads"),
    (lambda: PPO("CartPole-v1", num_threads=0), "num_threads"),
    (lambda: PPO("CartPole-v1", num_threads=-3), "num_threads"),
    (lambda: _model().learn(64, log_interval_s="x"), "log_interval_s"),
    (lambda: _model().learn(64, log_interval_s=-1), "log_interval_s"),
    (lambda: _model().learn(64, checkpoint_interval_s="x"), "checkpoint_interval_s"),
    (lambda: _model().learn(64, run_dir=123), "run_dir"),
    (lambda: PPO.load(None), "path"),
    (lambda: make_env("CartPole-v1", num_envs="2"), "num_envs"),
], ids=["device", "threads-str", "threads-float", "threads-zero", "threads-negative", "log-interval-str",
        "log-interval-negative", "checkpoint-interval-str", "run-dir-int", "load-none", "make-env-num-envs-str"])
def test_an_argument_of_the_wrong_type_is_refused_in_one_sentence(call, name):
    """An argument of the wrong type or out of range is a UserError: one line naming the argument, not an
    AttributeError, TypeError or a value silently replaced."""
    with pytest.raises(UserError) as raised:
        call()
    message = str(raised.value)
    assert name in message and "\n" not in message


def test_learn_says_how_to_silence_it_when_given_sb3s_verbose():
    """learn(verbose=0) says that verbose is the model's, and how to silence one call (progress_bar=False)."""
    with pytest.raises(UserError, match=r"Algo\(env, verbose=0\).*progress_bar=False"):
        _model().learn(64, verbose=0)


def test_sb3s_verbose_sets_what_learn_prints_and_is_saved(tmp_path, monkeypatch, capsys):
    """Stable-Baselines3's `PPO(env, verbose=...)` is taken: 0 trains without a bar, 1 with it, 2 prints each metrics
    row as a line too; learn's own progress_bar wins (False: no rows either); the model keeps it through save and
    load; other values are one sentence."""
    import rlspeed.algos.base as base

    bars = []
    real_bar = base.ProgressBar
    monkeypatch.setattr(base, "ProgressBar", lambda *args, **kwargs: bars.append(kwargs["enabled"]) or real_bar(
        *args, **kwargs))
    quiet, rows = _model(verbose=0), _model(verbose=2)
    quiet.learn(64)
    _model(verbose=1).learn(64)
    quiet.learn(64, progress_bar=True)
    assert bars == [False, True, True]
    assert "timesteps=64" not in capsys.readouterr().err
    rows.learn(128, log_interval_s=0)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ppo timesteps=")]
    assert [line.split()[1] for line in lines] == ["timesteps=64", "timesteps=128"] and "episode_return=" in lines[1]
    rows.learn(64, log_interval_s=0, progress_bar=False)  # (silences the call: its rows were printed still)
    assert "timesteps=" not in capsys.readouterr().err
    rows.save(tmp_path / "model")
    assert PPO.load(tmp_path / "model").verbose == 2 and PPO.load(tmp_path / "model", verbose=0).verbose == 0
    for wrong in (3, "1", -1):
        with pytest.raises(UserError, match=rf"^verbose is 0 .*, 1 .* or 2 .*, not {wrong!r}\.$"):
            PPO("CartPole-v1", verbose=wrong)
    quiet.verbose = "1"  # (set on the model, as SB3's users do: a TypeError of str >= int before)
    with pytest.raises(UserError, match=r"^verbose is 0 .*, not '1'\.$"):
        quiet.learn(64)


def test_a_missing_device_names_the_python_keyword():
    """From Python, the advice for a device that is not there names the keyword (device='auto'), not only the
    command line's flag."""
    from rlspeed import device as devices

    if devices.is_available("cuda"):
        pytest.skip("a CUDA device is there")
    with pytest.raises(UserError, match=r"device='auto'"):
        PPO("CartPole-v1", device="cuda")


def test_ipython_shows_a_user_error_as_its_message():
    """In IPython and Jupyter a UserError shows as its one-line message (IPython's `_render_traceback_` hook), not
    as a traceback through rlspeed's internals; the error it was raised from, where there is one, follows it."""
    with pytest.raises(UserError) as raised:
        PPO("CartPole-v1", learning_rat=3e-4)
    assert raised.value._render_traceback_() == [f"UserError: {raised.value}"]
    try:
        try:
            int("x")
        except ValueError as error:
            raise UserError("Give a number.") from error
    except UserError as chained:
        lines = chained._render_traceback_()
    assert lines[0] == "UserError: Give a number." and "ValueError" in lines[1] and len(lines) == 2


def test_a_model_shows_its_env_envs_device_and_steps():
    """A model's repr (what a notebook shows for `model.learn(...)`, which returns the model) names its algorithm,
    env, number of envs, device and env steps trained."""
    model = _model()
    assert repr(model) == "PPO('CartPole-v1', num_envs=4, device='cpu', num_timesteps=0)"
    model.learn(64, progress_bar=False)
    assert repr(model) == "PPO('CartPole-v1', num_envs=4, device='cpu', num_timesteps=64)"


def test_a_learn_result_shows_rounded_figures_and_counts_its_evaluations():
    """`model.result` in a notebook: its figures to 6 significant digits, and how many evaluations (not the list)."""
    model = _model()
    model.learn(128, progress_bar=False, eval_freq=64, eval_episodes=1)
    shown = repr(model.result)
    assert shown.startswith("LearnResult(total_timesteps=128, train_wall_s=") and "[2 of (steps" in shown
    assert f"train_wall_s={model.result.train_wall_s:.6g}," in shown


def test_a_notebook_without_ipywidgets_gets_no_tqdm_warning():
    """In a Jupyter kernel without ipywidgets, `import rlspeed` and a progress bar warn nothing (tqdm.auto's
    "IProgress not found" TqdmWarning): the bar is tqdm's console bar there."""
    script = textwrap.dedent("""
        import sys, types, warnings

        # a Jupyter kernel as tqdm recognises one, without ipywidgets
        sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")
        ipython = types.ModuleType("IPython")
        ipython.get_ipython = lambda: type("ZMQInteractiveShell", (), {})()
        sys.modules["IPython"] = ipython
        sys.modules["ipywidgets"] = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import rlspeed  # noqa: F401
            from rlspeed.logging import ProgressBar

            bar = ProgressBar(10, enabled=True)
            bar.update(10)
            bar.close()
        print([str(w.message) for w in caught if w.category.__name__ == "TqdmWarning"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


# Each step prints what it leaves in the process; a step runs after the earlier ones only where they leave nothing it
# checks (nothing before the export imports ale-py).
FRESH_PROCESS = """
import multiprocessing, sys, threading, warnings

import gymnasium as gym

from rlspeed import PPO, evaluate


def small():
    return PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=16, batch_size=32,
               n_epochs=1)


model = small()
filters, ids = list(warnings.filters), set(gym.registry)
model.export(sys.argv[1] + "/policy.pt")
print("export:", "ale_py" in sys.modules, set(gym.registry) - ids, list(warnings.filters) == filters)
model = small()
model.learn(64, progress_bar=False)
evaluate(model, "CartPole-v1", episodes=1, backend="torch")
print("learn:", multiprocessing.get_start_method(allow_none=True), sorted(t.name for t in threading.enumerate()))
from rlspeed.cli import main

code = main(["train", "ppo", "CartPole-v1", "--total-timesteps", "64", "--num-envs", "4", "--env-backend", "torch",
             "--set", "num_steps=16", "--set", "batch_size=32", "--set", "n_epochs=1", "--no-progress", "--out",
             sys.argv[1] + "/run"])
print("command:", code, multiprocessing.get_start_method(allow_none=True))
"""


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    """FRESH_PROCESS run in a new Python (a caller's process, whose state no earlier test touched): what a step
    printed, by its name (with the process's stderr where the step printed nothing)."""
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(tmp_path_factory.mktemp("fresh"))],
                          capture_output=True, text=True, timeout=300)
    said = dict(line.split(": ", 1) for line in done.stdout.splitlines()
                if line.split(":")[0] in ("export", "learn", "command"))
    return lambda step: said.get(step, done.stderr[-2000:])


def test_training_without_a_progress_bar_leaves_no_thread_and_the_start_method_unset(fresh_process):
    """learn and evaluate with progress_bar=False leave no thread running (tqdm's monitor) and the multiprocessing
    start method unset (None), so the caller can still choose one (`multiprocessing.set_start_method("spawn")`)."""
    assert fresh_process("learn") == "None ['MainThread']"


def test_exporting_a_model_of_another_env_leaves_ale_py_unimported(fresh_process):
    """Exporting a CartPole model does not import ale-py, which would add its Atari ids to the caller's Gymnasium
    registry and its own warning filter to the caller's."""
    pytest.importorskip("ale_py")
    assert fresh_process("export") == "False set() True"


def test_the_command_run_from_python_leaves_the_start_method_unset(fresh_process):
    """`rlspeed.cli.main([...])` without a progress bar prints its lines without tqdm, whose lock would fix the
    process's multiprocessing start method (the caller's later `set_start_method` raising)."""
    assert fresh_process("command") == "0 None"


@pytest.fixture
def caller_float64():
    """The caller made float64 torch's default dtype (scientific code does) during the test."""
    torch.set_default_dtype(torch.float64)
    yield torch.float64
    torch.set_default_dtype(torch.float32)


def test_a_callers_float64_default_dtype_trains_the_same_float32_model(caller_float64, tmp_path):
    """Under a caller's `torch.set_default_dtype(torch.float64)` a model is built, trains, predicts, exports and
    trains in a population as under the float32 default (the same seed gives the same weights), and the caller's
    default dtype holds again afterwards."""
    import numpy as np

    from rlspeed import SAC, RecurrentPPO

    def trained() -> list[torch.Tensor]:
        model = _model()
        model.learn(64, progress_bar=False)
        return [p.detach().clone() for p in model.policy.parameters()]

    weights = trained()
    assert torch.get_default_dtype() == caller_float64
    model = PPO.load(_model().save(tmp_path / "model"), device="cpu")
    model.predict(np.zeros((1, 4), dtype=np.float32))
    model.export(tmp_path / "policy.pt")
    RecurrentPPO("CartPole-v1", seed=0, device="cpu", **SMALL).learn(64, progress_bar=False)  # (its LSTM state)
    Population(PPO, "CartPole-v1", seeds=[0, 1], device="cpu", env_backend="torch", **SMALL).learn(
        64, progress_bar=False)
    Population(SAC, "Pendulum-v1", seeds=[0, 1], device="cpu", env_backend="torch", learning_starts=16,
               batch_size=16).learn(32, progress_bar=False)
    assert torch.get_default_dtype() == caller_float64
    torch.set_default_dtype(torch.float32)
    assert all(a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(weights, trained()))


def test_learn_gives_the_callers_default_dtype_back_when_it_raises(caller_float64):
    """learn sets float32 for its own work only: a callback's error, or a reset that fails before training, leaves
    the caller's default dtype as it was."""
    from rlspeed.callbacks import BaseCallback

    class Fails(BaseCallback):
        def _on_step(self) -> bool:
            raise RuntimeError("the callback's own error")

    with pytest.raises(RuntimeError, match="the callback's own error"):
        _model().learn(64, callback=Fails(), progress_bar=False)
    assert torch.get_default_dtype() == caller_float64
    model = _model()
    model.make_training_env = lambda: (_ for _ in ()).throw(RuntimeError("no env today"))
    with pytest.raises(RuntimeError, match="no env today"):
        model.learn(64, progress_bar=False)
    assert torch.get_default_dtype() == caller_float64
