"""Stable-Baselines3's schedule functions of progress_remaining (its docs' `linear_schedule(initial_value)`) for
learning_rate and PPO's clip_range and clip_range_vf: called with SB3's progress at every update, on every update
path, and named (not pickled) in model files, whose load asks for them again."""

import warnings

import pytest
import torch

import rlspeed
from rlspeed import UserError


def linear_schedule(initial_value: float):
    """SB3's docs' schedule: the value times the progress remaining."""
    def func(progress_remaining: float) -> float:
        return progress_remaining * initial_value
    return func


def squared(progress_remaining: float) -> float:
    return 0.2 * progress_remaining ** 2 + 0.05


def _learning_rate(model) -> float:
    return float(next(iter(model._optimizers().values())).param_groups[0]["lr"])


@pytest.mark.parametrize("fused_update", [True, False])
def test_ppo_calls_its_schedule_functions_at_every_update_with_sb3s_progress(fused_update):
    """Users' own schedule functions were refused ("A schedule is not a hyperparameter value here"): each is
    called once per rollout with SB3's progress_remaining, 1 - steps after the rollout / total, and its values are
    what the update takes, on the hand-derived update and on the autograd reference alike."""
    learning_rate, clip_range_vf = linear_schedule(1e-3), linear_schedule(0.5)
    model = rlspeed.PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=2, num_steps=16,
                        batch_size=32, n_epochs=1, fused_update=fused_update, learning_rate=learning_rate,
                        clip_range=squared, clip_range_vf=clip_range_vf)
    # (the config holds the values at progress 1, which the optimiser starts with, as SB3's does; PPO's own
    # anneal_lr is off: the function is the schedule)
    config = model.config
    assert (config.learning_rate, config.clip_range, config.clip_range_vf, config.anneal_lr) == (
        learning_rate(1.0), squared(1.0), clip_range_vf(1.0), False)
    taken, value_clips = [], []
    update_epochs = model._update_epochs

    def recorded(buf, advantages, returns, clip_range):
        hand_derived = getattr(model._update_step, "hand_derived", None)
        value_clip = hand_derived.clip_range_vf if hand_derived is not None else model.config.clip_range_vf
        value_clips.append(value_clip)
        taken.append((_learning_rate(model), clip_range, float(model.config.clip_range_vf), float(value_clip)))
        return update_epochs(buf, advantages, returns, clip_range)

    model._update_epochs = recorded
    model.learn(128, progress_bar=False)
    assert (getattr(model._update_step, "hand_derived", None) is not None) is fused_update
    progress = [1 - steps / 128 for steps in (32, 64, 96, 128)]
    expected = [(learning_rate(p), squared(p), clip_range_vf(p), clip_range_vf(p)) for p in progress]
    assert [value for update in taken for value in update] == pytest.approx(
        [value for update in expected for value in update])
    assert model.config.clip_range_vf == clip_range_vf(1.0)  # (its start value again between updates)
    # the updates read clip_range_vf from one device tensor filled in place (as a scheduled learning rate): a whole-step
    # graph captured at the first update replays with every later value, where a float would stay the first one
    assert all(isinstance(value, torch.Tensor) and value is value_clips[0] for value in value_clips)


def test_sb3_schedule_objects_without_a_setting_here_are_called_as_functions():
    """SB3's LinearSchedule(start, 0, 1.0) for PPO (whose anneal_lr decays at CleanRL's progress) and schedules
    that end above 0 were refused: a model calls them as any schedule function."""
    utils = pytest.importorskip("stable_baselines3.common.utils")
    for key, switch, schedule in (("learning_rate", "anneal_lr", utils.LinearSchedule(1e-3, 0.0, 1.0)),
                                  ("clip_range", "anneal_clip", utils.LinearSchedule(0.3, 0.1, 0.5))):
        model = rlspeed.PPO("CartPole-v1", device="cpu", **{key: schedule})
        assert model._schedule_functions == {key: schedule}
        assert (getattr(model.config, key), getattr(model.config, switch)) == (schedule(1.0), False)


def test_off_policy_learning_rate_function_is_called_before_each_training_as_sb3_does():
    """DQN (SAC, TD3 and DDPG alike): the function is called at the step count after each collection that trains,
    past learning_starts, as SB3's `_update_learning_rate` in `train`."""
    learning_rate = linear_schedule(1e-3)
    model = rlspeed.DQN("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=1, train_freq=4,
                        gradient_steps=1, learning_starts=100, batch_size=16, learning_rate=learning_rate)
    rates = []
    gradient_steps = model._gradient_steps
    model._gradient_steps = lambda steps: (rates.append(_learning_rate(model)), gradient_steps(steps))[1]
    model.learn(200, progress_bar=False)
    assert rates == pytest.approx([learning_rate(1 - steps / 200) for steps in range(104, 201, 4)])


def test_a_model_file_names_its_schedule_functions_and_load_asks_for_them(tmp_path):
    """A file holds no code: save records the functions' names; a model loaded (or resumed) without them predicts
    and evaluates, and its learn is refused in one sentence naming them and the fix; given again it goes on with
    them, given a number it trains at that constant value."""
    options = dict(seed=0, device="cpu", env_backend="torch", num_envs=2, num_steps=16, batch_size=32, n_epochs=1)
    model = rlspeed.PPO("CartPole-v1", learning_rate=linear_schedule(1e-3), **options)
    model.learn(32, progress_bar=False)
    path = model.save(tmp_path / "model")
    loaded = rlspeed.PPO.load(path, device="cpu")
    loaded.predict(torch.zeros(4).numpy(), deterministic=True)
    with pytest.raises(UserError, match=r"saved with the schedule function learning_rate=linear_schedule\.<locals>"
                                        r"\.func, .*give it again in Python \(PPO\.load\(path, learning_rate=\.\.\.\)"):
        loaded.learn(32, progress_bar=False)
    again = rlspeed.PPO.load(path, device="cpu", learning_rate=linear_schedule(2e-3))
    again.learn(64, progress_bar=False)
    assert _learning_rate(again) == pytest.approx(linear_schedule(2e-3)(0.0))
    constant = rlspeed.PPO.load(path, device="cpu", learning_rate=1e-4)
    constant.learn(32, progress_bar=False)
    assert _learning_rate(constant) == pytest.approx(1e-4)
    resumed = rlspeed.PPO("CartPole-v1", **options)
    resumed.resume(path)
    with pytest.raises(UserError, match=r"schedule function learning_rate=.*\.resume\(path\)"):
        resumed.learn(64, progress_bar=False)


def test_a_cli_resume_of_a_scheduled_run_is_refused_before_it_writes_in_the_run(tmp_path, monkeypatch, capsys):
    """`rlspeed train --resume` of a run Python's learn made with a schedule function was refused (exit 2) only at
    learn, after it had written config.yaml (the preset's settings, not the run's) and summary.json into the run: a
    refusal writes nothing, and its sentence says that the command line cannot give a function."""
    from rlspeed import cli

    monkeypatch.chdir(tmp_path)
    model = rlspeed.PPO("CartPole-v1", learning_rate=linear_schedule(1e-3), seed=0, device="cpu", env_backend="torch",
                        num_envs=2, num_steps=16, batch_size=32, n_epochs=1)
    model.learn(32, progress_bar=False, run_dir="run", checkpoint_freq=32)
    model.close()
    before = {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir() if path.is_file()}
    assert "checkpoint.safetensors" in before
    capsys.readouterr()
    assert cli.main(["train", "ppo", "CartPole-v1", "--out", "run", "--resume", "--total-timesteps", "64",
                     "--no-progress"]) == 2
    after = {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir() if path.is_file()
             and path.name != ".rlspeed.lock"}  # (the command's lock on the directory)
    assert after == before
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "learning_rate=linear_schedule.<locals>.func" in err[0], err
    assert "the command line cannot give" in err[0] and "PPO(env, learning_rate=...).resume(path)" in err[0]


@pytest.mark.parametrize(("schedule", "said"), [
    (lambda progress: "x", r"returned 'x' at progress_remaining=1: a schedule returns a finite number >= 0"),
    (lambda progress: progress - 0.5, r"returned -0.5 at progress_remaining=0: a schedule returns a finite number"),
    (lambda progress: 1 / 0, r"raised ZeroDivisionError \(division by zero\) at progress_remaining=1"),
])
def test_a_schedule_function_that_gives_no_number_is_one_sentence(schedule, said):
    """A function that raises or returns no finite number >= 0 is refused where it is called: when the model is
    made (at progress 1) or at the update that calls it, never trained with."""
    with pytest.raises(UserError, match=f"learning_rate=.*<lambda> {said}"):
        rlspeed.A2C("CartPole-v1", device="cpu", env_backend="torch", num_envs=2, num_steps=8,
                    learning_rate=schedule).learn(16, progress_bar=False)


def test_schedule_functions_where_none_is_called_are_refused():
    """A switch that would decay the same setting, one set on model.config, and a population's (its stacked update
    calls none) are each one sentence; before, the population's members took the start value silently."""
    with pytest.raises(UserError, match="is a schedule, called at every update, and anneal_lr=True would decay "
                                        "learning_rate too: give one of them"):
        rlspeed.PPO("CartPole-v1", device="cpu", learning_rate=linear_schedule(1e-3), anneal_lr=True)
    model = rlspeed.PPO("CartPole-v1", device="cpu", env_backend="torch", num_envs=2, num_steps=8, batch_size=16)
    model.config.clip_range = squared
    with pytest.raises(UserError, match=r"A schedule function is given to a model when it is made or loaded"):
        model.learn(16, progress_bar=False)
    from rlspeed.population import Population

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UserError, match=r"clip_range_vf=.*: a population trains its members in one stacked "
                                            r"update, which calls no schedule function: give a number \(or"):
            Population(rlspeed.PPO, "CartPole-v1", seeds=range(2), device="cpu", clip_range_vf=squared)


def test_a_scheduled_setting_changed_on_model_config_is_refused_at_learn():
    """model.config.learning_rate or anneal_lr changed while the model calls a schedule function for it: the function
    would override the change at every update, silently; learn refuses it in one sentence."""
    model = rlspeed.PPO("CartPole-v1", device="cpu", env_backend="torch", num_envs=2, num_steps=8, batch_size=16,
                        learning_rate=linear_schedule(1e-3), clip_range_vf=squared)
    model.config.learning_rate = 5e-4
    with pytest.raises(UserError, match=r"model.config.learning_rate is 0.0005, but this model calls the schedule "
                                        r"function learning_rate=linear_schedule.<locals>.func at every update"):
        model.learn(16, progress_bar=False)
    model.config.learning_rate, model.config.anneal_lr = 1e-3, True
    with pytest.raises(UserError, match=r"model.config.anneal_lr is True, but this model calls the schedule"):
        model.learn(16, progress_bar=False)
    model.config.anneal_lr = False
    model.learn(16, progress_bar=False)


def test_a_population_refuses_members_loaded_without_their_schedule_functions(tmp_path):
    """Members loaded from files saved with a schedule function, given neither again nor as a number, trained in a
    population at the function's start value, silently (a solo learn of the same model refuses): now one sentence
    naming the function and how to load the member with a number."""
    from rlspeed.population import Population

    options = dict(device="cpu", env_backend="torch", num_envs=2, num_steps=8, batch_size=16)
    paths = [rlspeed.PPO("CartPole-v1", seed=seed, learning_rate=linear_schedule(1e-3), **options).save(
        tmp_path / f"member{seed}") for seed in (0, 1)]
    members = [rlspeed.PPO.load(path, device="cpu") for path in paths]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UserError, match=r"^learning_rate=linear_schedule.<locals>.func: a population trains its "
                                            r"members in one stacked update, .*\(load the member with one, "
                                            r"PPO\.load\(path, learning_rate=\.\.\.\)\)\.$"):
            Population(rlspeed.PPO, "CartPole-v1", seeds=[0, 1], device="cpu", env_backend="torch", members=members)


def test_a_function_for_a_setting_that_takes_none_names_those_that_do():
    """A function for another setting (SAC's tau) was told "only learning_rate (anneal_lr=True) and clip_range
    (anneal_clip=True) decay", as if no schedule function were taken: it names the settings that take one."""
    with pytest.raises(UserError, match=r"^Hyperparameter 'tau' got .*not a valid float\. Schedule functions are "
                                        r"taken for learning_rate, and PPO's clip_range and clip_range_vf, as in "
                                        r"Stable-Baselines3: tau takes a number\.$"):
        rlspeed.SAC("Pendulum-v1", device="cpu", tau=linear_schedule(0.005))
