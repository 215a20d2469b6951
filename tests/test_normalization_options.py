"""The clips of observation and reward normalisation (`normalize_obs_clip`, `normalize_reward_clip`, SB3's
VecNormalize clip_obs and clip_reward): validated, used in training, acting, saving and export, for populations too."""

import re
import warnings

import pytest
import torch

import rlspeed
from rlspeed.envs import NormalizeObservation, NormalizeReward
from rlspeed.envs.base import find_wrapper
from rlspeed.errors import UserError

CLIPS = {"normalize_obs": True, "normalize_reward": True, "normalize_obs_clip": 0.5, "normalize_reward_clip": 0.25}
TINY = {"num_envs": 2, "num_steps": 16, "batch_size": 32, "n_epochs": 1}


def test_the_clips_bound_what_the_model_trains_on_acts_on_saves_and_exports(tmp_path):
    from rlspeed.export import export_module

    model = rlspeed.PPO("Pendulum-v1", device="cpu", seed=0, **TINY, **CLIPS)
    model.learn(32, progress_bar=False)
    env = model.make_training_env()
    assert (find_wrapper(env, NormalizeObservation).clip, find_wrapper(env, NormalizeReward).clip) == (0.5, 0.25)
    obs, reward, *_ = env.step(torch.zeros(2, 1))
    assert obs.abs().max() <= 0.5 and reward.abs().max() <= 0.25 and reward.abs().max() == 0.25
    # an observation normalised to 0.5 and one far past it are the same observation to the model
    at_clip = model.obs_rms.mean + 0.5 * torch.sqrt(model.obs_rms.var + 1e-8)
    far = model.obs_rms.mean + 1e3 * torch.sqrt(model.obs_rms.var + 1e-8)
    assert torch.equal(model.act(at_clip.float().unsqueeze(0)), model.act(far.float().unsqueeze(0)))
    model.save(tmp_path / "model.pt")
    loaded = rlspeed.PPO.load(tmp_path / "model.pt", device="cpu")
    assert (loaded.config.normalize_obs_clip, loaded.config.normalize_reward_clip) == (0.5, 0.25)
    assert torch.equal(loaded.act(far.float().unsqueeze(0)), model.act(far.float().unsqueeze(0)))
    assert export_module(loaded).observation_clip == 0.5


@pytest.mark.parametrize("setting", ["normalize_obs_clip=0", "normalize_reward_clip=-1"])
def test_a_clip_that_is_not_positive_is_one_sentence_and_exit_2(tmp_path, capsys, setting):
    from rlspeed import cli

    assert cli.main(["train", "sac", "Pendulum-v1", "--set", "normalize_obs=true", "--set", setting, "--out",
                     str(tmp_path / "run"), "--dry-run"]) == 2
    name = setting.split("=")[0]
    assert re.fullmatch(rf"rlspeed: error: {name} must be a positive finite number \(normalised values are clipped "
                        rf"to \[-{name}, {name}\]\), got -?[01]\.0\.", capsys.readouterr().err.strip())


def test_a_normalising_env_passed_in_keeps_its_clip_unless_the_model_sets_another():
    env = rlspeed.make_env("Pendulum-v1", num_envs=2, device="cpu")
    model = rlspeed.PPO(NormalizeObservation(env, clip=3.0), device="cpu", **TINY)
    model.make_training_env()
    assert model.config.normalize_obs_clip == 3.0 and model.config.normalize_obs
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a clip beside an env that normalises is no setting without effect)
        other = rlspeed.PPO(NormalizeObservation(env, clip=3.0), device="cpu", normalize_obs_clip=5.0, **TINY)
    with pytest.raises(UserError, match=r"^This env's NormalizeObservation clips at 3.0 and the model's "
                                        r"normalize_obs_clip is 5.0: give one value \(or leave one at 10\)\.$"):
        other.make_training_env()


def test_a_clip_changed_between_learn_calls_applies_to_the_next():
    model = rlspeed.PPO("Pendulum-v1", device="cpu", seed=0, **TINY, **CLIPS)
    model.learn(32, progress_bar=False)
    model.config.normalize_obs_clip, model.config.normalize_reward_clip = 2.0, 10.0
    model.learn(32, progress_bar=False)
    env = model.make_training_env()
    assert (find_wrapper(env, NormalizeObservation).clip, find_wrapper(env, NormalizeReward).clip) == (2.0, 10.0)
    assert (model.config.normalize_obs_clip, model.config.normalize_reward_clip) == (2.0, 10.0)
