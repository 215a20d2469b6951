"""Checkpoints: PPO save/load round trips, the safetensors + JSON format, no unpickling, clear errors."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import safetensors
import torch
from safetensors.torch import save_file

import rlspeed
from rlspeed import PPO
from rlspeed.algos import ALGORITHMS
from rlspeed.errors import UserError

TINY = {"num_envs": 4, "num_steps": 32, "batch_size": 64, "n_epochs": 2}


@pytest.fixture(scope="module")
def cartpole_model():
    return PPO("CartPole-v1", seed=0, device="cpu", **TINY).learn(256, progress_bar=False)


@pytest.fixture(scope="module")
def pendulum_model():
    return PPO("Pendulum-v1", seed=0, device="cpu", normalize_obs=True, **TINY).learn(256, progress_bar=False)


def observation_batch(model, size=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(size, *model.spec.observation_shape, generator=generator)


def deterministic_actions(model, obs):
    actions, _ = model.predict(obs.numpy(), deterministic=True)
    return torch.as_tensor(actions)


@pytest.mark.parametrize("which", ["cartpole_model", "pendulum_model"])
def test_round_trip_gives_identical_deterministic_actions(request, tmp_path, which):
    model = request.getfixturevalue(which)
    obs = observation_batch(model)
    path = model.save(tmp_path / "model.safetensors")
    loaded = PPO.load(path, device="cpu")
    assert torch.equal(deterministic_actions(loaded, obs), deterministic_actions(model, obs))
    saved_state, loaded_state = model.policy.state_dict(), loaded.policy.state_dict()
    assert saved_state.keys() == loaded_state.keys()
    assert all(torch.equal(saved_state[k], loaded_state[k]) for k in saved_state)
    assert loaded.env_id == model.env_id and loaded.num_timesteps == model.num_timesteps == 256
    assert loaded.config == model.config
    # The actions must depend on what was saved: an untrained model of the same shape acts differently.
    fresh = PPO(model.env_id, seed=1, device="cpu", **TINY, normalize_obs=model.config.normalize_obs)
    fresh_state = fresh.policy.state_dict()
    assert not all(torch.equal(fresh_state[k], loaded_state[k]) for k in fresh_state)


@pytest.mark.parametrize(("algo", "env_id", "activation"), [
    ("sac", "Pendulum-v1", "gelu"), ("dqn", "CartPole-v1", "leaky_relu"), ("ppo", "Pendulum-v1", "mish"),
    ("td3", "Pendulum-v1", "hardswish"), ("recurrent_ppo", "Pendulum-v1", "softplus")])
def test_every_activation_round_trips_with_identical_actions(tmp_path, algo, env_id, activation):
    """The activations SB3 users bring (nn.GELU, nn.LeakyReLU, ...) are saved by name and rebuilt as they trained:
    the loaded model acts as the saved one (the same weights through another activation would not)."""
    model = ALGORITHMS[algo](env_id, seed=0, device="cpu", activation=activation, net_arch=[16, 16])
    obs = observation_batch(model)
    loaded = rlspeed.load(model.save(tmp_path / "model"), device="cpu")
    assert loaded.config.activation == activation
    assert torch.equal(deterministic_actions(loaded, obs), deterministic_actions(model, obs))


def test_round_trip_restores_observation_statistics(tmp_path, pendulum_model):
    rms = pendulum_model.obs_rms
    assert rms is not None
    assert not torch.equal(rms.mean, torch.zeros_like(rms.mean))  # trained: not the initial statistics
    loaded = PPO.load(pendulum_model.save(tmp_path / "model.safetensors"), device="cpu")
    assert loaded.obs_rms is not None
    for name in ("mean", "var", "count"):
        assert torch.equal(getattr(loaded.obs_rms, name), getattr(rms, name))
    # The statistics are applied in predict: raw observations in, same actions out as before saving.
    obs = torch.tensor([[1.0, 0.0, 0.0], [-0.5, 0.8, 3.0]])
    assert torch.equal(deterministic_actions(loaded, obs), deterministic_actions(pendulum_model, obs))


def test_round_trip_restores_optimizer_state(tmp_path, cartpole_model):
    """The moments come from the checkpoint; the hyperparameters from the config (an annealed learning rate is
    recomputed by the schedule; a learning_rate given to load is the one used)."""
    path = cartpole_model.save(tmp_path / "model.safetensors")
    loaded = PPO.load(path, device="cpu")
    saved, restored = cartpole_model.optimizer.state_dict(), loaded.optimizer.state_dict()
    assert saved["param_groups"][0]["lr"] != cartpole_model.config.learning_rate  # annealed, not the default
    assert [g["lr"] for g in restored["param_groups"]] == [cartpole_model.config.learning_rate]
    overridden = PPO.load(path, device="cpu", learning_rate=1e-3, anneal_lr=False)
    assert [g["lr"] for g in overridden.optimizer.param_groups] == [1e-3]
    overridden.learn(256, progress_bar=False)
    assert [g["lr"] for g in overridden.optimizer.param_groups] == [1e-3]
    assert saved["state"].keys() == restored["state"].keys() and len(saved["state"]) > 0
    for index, entries in saved["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(restored["state"][index][key]), torch.as_tensor(entries[key])), key


def test_loaded_model_can_keep_training(tmp_path, cartpole_model):
    loaded = PPO.load(cartpole_model.save(tmp_path / "model.safetensors"), device="cpu")
    loaded.learn(128, progress_bar=False)
    assert loaded.num_timesteps == 256 + 128


def test_file_is_safetensors_with_rlspeed_metadata(tmp_path, cartpole_model):
    path = cartpole_model.save(tmp_path / "model.safetensors")
    with safetensors.safe_open(str(path), framework="pt") as handle:
        keys = list(handle.keys())
        metadata = handle.metadata()
        tensor = handle.get_tensor(keys[0])
    assert any(key.startswith("policy.") for key in keys)
    assert isinstance(tensor, torch.Tensor)
    header = json.loads(metadata["rlspeed"])
    assert header["format"] == "rlspeed-checkpoint"
    assert header["algo"] == "ppo" and header["env_id"] == "CartPole-v1"


def test_save_is_atomic_and_adds_the_suffix(tmp_path, cartpole_model):
    path = cartpole_model.save(tmp_path / "model")
    assert path == tmp_path / "model.safetensors" and path.is_file()
    cartpole_model.save(path)  # overwriting an existing checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no temporary files left
    assert PPO.load(tmp_path / "model", device="cpu").env_id == "CartPole-v1"


def test_names_with_dots_load_what_was_saved_under_them(tmp_path, cartpole_model):
    """The suffix is appended, not swapped for the part after the last dot, by save and load alike."""
    other = PPO("CartPole-v1", device="cpu", seed=1, learning_rate=0.5)
    other.save(tmp_path / "ppo_lr0")  # a sibling that replacing ".001" would find instead
    path = cartpole_model.save(tmp_path / "ppo_lr0.001")
    assert path.name == "ppo_lr0.001.safetensors"
    loaded = PPO.load(tmp_path / "ppo_lr0.001", device="cpu")
    assert loaded.config.learning_rate == cartpole_model.config.learning_rate != 0.5


def test_loading_never_unpickles(tmp_path, monkeypatch, pendulum_model):
    path = pendulum_model.save(tmp_path / "model.safetensors")

    def forbidden(*args, **kwargs):
        raise AssertionError("checkpoint loading unpickled something")

    class ForbiddenUnpickler:
        def __init__(self, *args, **kwargs):
            forbidden()

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", ForbiddenUnpickler)
    monkeypatch.setattr(torch, "load", forbidden)
    loaded = PPO.load(path, device="cpu")
    assert loaded.obs_rms is not None


def test_missing_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(rlspeed.UserError, match="does not exist"):
        PPO.load(tmp_path / "nope.safetensors")


@pytest.mark.parametrize("content", ["text", "garbage", "foreign-safetensors", "pickle"])
def test_non_checkpoint_file_is_a_user_error(tmp_path, content):
    path = tmp_path / "model.safetensors"
    if content == "text":
        path.write_text("hello, I am not a checkpoint\n")
    elif content == "garbage":
        path.write_bytes(bytes(range(256)) * 8)
    elif content == "foreign-safetensors":
        save_file({"weight": torch.zeros(3)}, str(path), metadata={"format": "pt"})
    else:
        torch.save({"weight": torch.zeros(3)}, path)
    with pytest.raises(rlspeed.UserError, match=r"model\.safetensors' .*not an rlspeed checkpoint"):
        PPO.load(path, device="cpu")


@pytest.mark.parametrize(("version", "words"), [
    (10**6, r"written by a newer rlspeed \(format 1000000\); upgrade rlspeed"),
    ("2", "unreadable format version '2': the file is damaged")])
def test_a_checkpoint_of_a_newer_or_unreadable_format_version_is_refused(tmp_path, cartpole_model, version, words):
    """A file of a format this rlspeed does not know (a newer rlspeed's) is refused in one sentence that says to
    upgrade, before its contents are read as this version's; a version that is no number is a damaged file."""
    path = cartpole_model.save(tmp_path / "model.safetensors")
    with safetensors.safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        header = json.loads(handle.metadata()["rlspeed"])
    save_file(tensors, str(path), metadata={"rlspeed": json.dumps({**header, "version": version})})
    for read in (lambda: PPO.load(path, device="cpu"), lambda: rlspeed.checkpoint.load_checkpoint(path)):
        with pytest.raises(rlspeed.UserError, match=words):
            read()


def test_a_pipe_or_device_given_as_a_checkpoint_is_refused_without_reading_it(tmp_path, monkeypatch):
    # (reading a FIFO blocks until a writer comes, /dev/zero never ends: neither may be read)
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(rlspeed.UserError, match="is a device or a pipe, not a regular file: give a checkpoint file"):
        PPO.load(fifo, device="cpu")
    with pytest.raises(rlspeed.UserError, match="is a device or a pipe, not a regular file: give a checkpoint file"):
        PPO.load("/dev/zero", device="cpu")
    monkeypatch.setenv("RLSPEED_CHECKPOINT_KEY_FILE", str(fifo))
    with pytest.raises(rlspeed.UserError, match="key file .* is a device or a pipe, not a regular file: give the"):
        rlspeed.checkpoint.encryption_key()
    monkeypatch.setenv("RLSPEED_CHECKPOINT_KEY_FILE", str(tmp_path))
    with pytest.raises(rlspeed.UserError, match="key file .* is a directory, not a regular file: give the file"):
        rlspeed.checkpoint.encryption_key()


def test_loading_with_another_algorithm_is_a_user_error(tmp_path, cartpole_model):
    others = [cls for name, cls in ALGORITHMS.items() if name != "ppo"]
    if not others:
        pytest.skip("only PPO exists")
    path = cartpole_model.save(tmp_path / "model.safetensors")
    for other in others:
        with pytest.raises(rlspeed.UserError, match=rf"holds a model of PPO, not of {other.__name__}; load it with "
                                                    r"rlspeed\.PPO\.load, or rlspeed\.load\(path\)"):
            other.load(path, device="cpu")
    from rlspeed.algos.base import Algorithm

    assert type(Algorithm.load(path, device="cpu")) is PPO  # (the base class takes whichever algorithm it holds)


class SubclassedDQN(rlspeed.DQN):
    """A user's DQN subclass, its module imported where its file is loaded."""


def test_rlspeed_load_gives_the_model_of_whichever_class_saved_it(tmp_path, cartpole_model):
    """docs/checkpoints.md: `rlspeed.load(path)` (Stable-Baselines3's `PPO.load` without knowing the class) gives the
    model as the class that saved it: each algorithm, a user's subclass whose module is imported, from a file or a run
    directory; a file that is no rlspeed model, or of an algorithm not imported, is one sentence."""
    small = {"num_envs": 1, "net_arch": [8], "learning_starts": 8, "batch_size": 8}
    dqn = SubclassedDQN("CartPole-v1", seed=0, device="cpu", **small)
    (tmp_path / "run").mkdir()
    files = {PPO: cartpole_model.save(tmp_path / "ppo"), SubclassedDQN: dqn.save(tmp_path / "run" / "model"),
             rlspeed.SAC: rlspeed.SAC("Pendulum-v1", seed=0, device="cpu", **small).save(tmp_path / "sac")}
    for cls, path in files.items():
        loaded = rlspeed.load(path, device="cpu")
        assert type(loaded) is cls
        obs = observation_batch(loaded, size=4).numpy()
        assert np.array_equal(loaded.predict(obs, deterministic=True)[0],
                              cls.load(path, device="cpu").predict(obs, deterministic=True)[0])
    assert type(rlspeed.load(tmp_path / "run", device="cpu")) is SubclassedDQN  # (a run directory: its model)
    tensors, meta = rlspeed.checkpoint.load_checkpoint(files[PPO])
    rlspeed.checkpoint.save_checkpoint(tmp_path / "other", tensors, {**meta, "algo": "trpo",
                                                                      "class": "their_trpo_module.TRPO"})
    with pytest.raises(UserError, match=r"holds a model of their_trpo_module.TRPO, which is not one of rlspeed's "
                                        r"algorithms and whose module is not imported: import their_trpo_module "
                                        r"first, then load it again\.$"):
        rlspeed.load(tmp_path / "other")
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(UserError, match=r"notes.txt' is not an rlspeed checkpoint"):
        rlspeed.load(tmp_path / "notes.txt")


class OwnAlgorithm(PPO):
    """A user's algorithm of its own name, derived from PPO, its module imported where its file is loaded."""

    name = "own_algorithm"


def test_an_algorithm_of_a_users_own_loads_as_its_class_or_the_one_it_derives_from(tmp_path):
    """A file saved by a user's algorithm of its own name (not one of rlspeed's): `rlspeed.load` gives its class where
    its module is imported, else the rlspeed algorithm it derives from (the file records it), with a warning naming
    the class; `PPO.load` makes a PPO, as of a subclass's file; another algorithm's load names it. A file without a
    base (saved before it was recorded, or of a class of no rlspeed algorithm) is one sentence naming the class and
    what to do: its module not imported, the class renamed since, a script's own class."""
    path = OwnAlgorithm("CartPole-v1", seed=0, device="cpu", **TINY).save(tmp_path / "own")
    tensors, meta = rlspeed.checkpoint.load_checkpoint(path)
    assert meta["derives_from"] == "ppo" and meta["class"] == f"{__name__}.OwnAlgorithm"
    assert type(rlspeed.load(path, device="cpu")) is OwnAlgorithm
    with pytest.warns(UserWarning, match=r"saved by .*OwnAlgorithm, a subclass of rlspeed's ppo; PPO.load makes it"):
        assert type(PPO.load(path, device="cpu")) is PPO
    with pytest.raises(UserError, match=r"holds a model of .*OwnAlgorithm, not of DQN; load it with "
                                        r"OwnAlgorithm.load, or rlspeed.load\(path\)"):
        rlspeed.DQN.load(path, device="cpu")

    def saved_by(cls: str):
        other = tmp_path / f"{len(list(tmp_path.iterdir()))}.safetensors"
        rlspeed.checkpoint.save_checkpoint(other, tensors, {**meta, "class": cls})
        return other

    renamed = f"{__name__}.OwnAlgorithmRenamed"  # (its module imported, without the class)
    with pytest.warns(UserWarning, match=r"a subclass of rlspeed's ppo; PPO.load makes it a PPO.*: use its class's "
                                         r"load under its name now \(.* no longer defines OwnAlgorithmRenamed"):
        assert type(rlspeed.load(saved_by(renamed), device="cpu")) is PPO
    with pytest.warns(UserWarning, match=r"saved by not_imported_module.OwnAlgorithm, a subclass of rlspeed's ppo"):
        assert type(rlspeed.load(saved_by("not_imported_module.OwnAlgorithm"), device="cpu")) is PPO
    # (another algorithm's load names the class, not only the rlspeed algorithm it derives from)
    with pytest.raises(UserError, match=r"holds a model of not_imported_module.OwnAlgorithm, an algorithm derived "
                                        r"from rlspeed's PPO, not of DQN; load it with its class \(its module "
                                        r"imported\), or with rlspeed.PPO.load or rlspeed.load\(path\), which make "
                                        r"a PPO of it\.$"):
        rlspeed.DQN.load(saved_by("not_imported_module.OwnAlgorithm"), device="cpu")
    meta.pop("derives_from")
    sentences = {"not_imported_module.OwnAlgorithm": r"holds a model of not_imported_module.OwnAlgorithm, which is "
                 r"not one of rlspeed's algorithms and whose module is not imported: import not_imported_module "
                 r"first, then load it again\.$",
                 renamed: rf"holds a model of {renamed} \(algorithm 'own_algorithm'\), which {__name__} no longer "
                 r"defines \(renamed or moved since the file was saved\?\): load it with that class's load under its "
                 r"name now\.$",
                 f"{__name__}.SubclassedDQN": r"which as imported now is no rlspeed algorithm named 'own_algorithm'",
                 "__main__.OwnAlgorithm": r"holds a model of OwnAlgorithm, an algorithm of the script that saved it: "
                 r"load it with OwnAlgorithm.load, with OwnAlgorithm defined in this script as in the one that saved "
                 r"it\.$"}
    for cls, sentence in sentences.items():
        for load in (rlspeed.load, PPO.load):
            with pytest.raises(UserError, match=sentence):
                load(saved_by(cls), device="cpu")


def test_resume_of_a_subclass_file_warns_only_once_the_resume_passed(tmp_path):
    """`PPO.resume` of a file a user's PPO subclass saved warns that it makes it a PPO, and that the env options
    differ, once every step that can refuse the resume passed: a refused resume (other networks) is its error alone
    (it warned first, then refused)."""
    tensors, meta = rlspeed.checkpoint.load_checkpoint(PPO("CartPole-v1", seed=0, device="cpu", **TINY).save(
        tmp_path / "ppo"))
    path = tmp_path / "mine.safetensors"
    rlspeed.checkpoint.save_checkpoint(path, tensors, {**meta, "class": "their_module.MyPPO",
                                                       "env_kwargs": {"sutton_barto_reward": True}})
    with warnings.catch_warnings(record=True) as caught, pytest.raises(UserError, match="net_arch"):
        warnings.simplefilter("always")
        PPO("CartPole-v1", seed=0, device="cpu", net_arch=[8], **TINY).resume(path)
    assert [str(warning.message) for warning in caught] == []
    with pytest.warns(UserWarning) as caught:
        PPO("CartPole-v1", seed=0, device="cpu", **TINY).resume(path)
    said = [str(warning.message) for warning in caught]
    assert sum("saved by their_module.MyPPO, a subclass of rlspeed's ppo; PPO.resume makes it" in text
               for text in said) == 1
    assert sum("made with the options {'sutton_barto_reward': True}" in text for text in said) == 1


def test_load_of_a_file_onto_an_env_it_does_not_fit_is_its_refusal_alone(tmp_path):
    """`load(path, env=id)` of a file trained with env options warned that the env is made without them, then refused
    the env (other spaces): a refused load is its error alone; a load that succeeds says it once."""
    path = PPO("CartPole-v1", seed=0, device="cpu", env_kwargs={"sutton_barto_reward": True}, **TINY).save(
        tmp_path / "options")
    with warnings.catch_warnings(record=True) as caught, pytest.raises(UserError, match="MountainCar-v0"):
        warnings.simplefilter("always")
        PPO.load(path, device="cpu", env="MountainCar-v0")
    assert [str(warning.message) for warning in caught] == []
    with pytest.warns(UserWarning, match=r"made with the options \{'sutton_barto_reward': True\}; "
                                         r"load\(env='CartPole-v1'\) makes that env without them") as caught:
        PPO.load(path, device="cpu", env="CartPole-v1").close()
    assert len(caught) == 1


def test_a_load_refused_after_it_made_its_env_closes_that_env(tmp_path, monkeypatch):
    """`load(path, env=id, ...)` makes the env from the id, then builds the model: a build or restore that fails left
    that env open (its worker processes too, for an async backend); it is closed. A bad override (learning_rate=-1) is
    refused before the env is made."""
    import rlspeed.algos.base
    from rlspeed.envs import NormalizeObservation
    from rlspeed.envs.base import find_wrapper

    path = PPO("CartPole-v1", seed=0, device="cpu", **TINY).save(tmp_path / "model")
    closed, made = [], []

    def make_env(*args, **kwargs):
        made.append(kwargs)
        env = rlspeed.make_env(*args, **kwargs)
        close = env.close
        env.close = lambda: closed.append(close())
        return env

    monkeypatch.setattr(rlspeed.algos.base, "make_env", make_env)
    with pytest.raises(UserError, match="learning_rate must be > 0"):  # (now refused before the env is made)
        PPO.load(path, device="cpu", env="CartPole-v1", learning_rate=-1.0)
    assert not made
    # (the env is made with the values the model reads: bool('no') made an Atari game's envs end at a lost life)
    model = PPO.load(path, device="cpu", env="CartPole-v1", episodic_life="no", clip_rewards="false",
                     normalize_obs="no")
    assert made[-1]["episodic_life"] is False and made[-1]["clip_rewards"] is False
    assert find_wrapper(model._env, NormalizeObservation) is None  # (the model's normalize_obs is False)
    model.close()
    closed.clear()
    # (and a model built whose restore of the file's state fails)

    def refused(*args, **kwargs):
        raise UserError("refused")

    monkeypatch.setattr(PPO, "_restore", refused)
    with pytest.raises(UserError, match="refused"):
        PPO.load(path, device="cpu", env="CartPole-v1")
    assert len(closed) == 1
    # (and a Ctrl-C in the restore, which left it open)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(PPO, "_restore", interrupted)
    with pytest.raises(KeyboardInterrupt):
        PPO.load(path, device="cpu", env="CartPole-v1")
    assert len(closed) == 2
    # (a bad value the env is made with is the model's sentence, before any env: int('x') was a bare ValueError)
    for key, value, kind in (("num_envs", "x", "int"), ("gamma", "high", "float")):
        with pytest.raises(UserError, match=f"^Hyperparameter '{key}' got '{value}', which is not a valid {kind}"):
            PPO.load(path, device="cpu", env="CartPole-v1", **{key: value})
    assert len(closed) == 2
    monkeypatch.setattr(PPO, "__init__", refused)  # (and a build that refuses once the env is made)
    with pytest.raises(UserError, match="refused"):
        PPO.load(path, device="cpu", env="CartPole-v1")
    assert len(closed) == 3


class ClashingName(rlspeed.DQN):
    """A user's DQN named as another rlspeed algorithm is."""

    name = "ppo"


def test_an_algorithm_of_a_users_own_named_as_another_rlspeed_algorithm_is_the_one_it_derives_from(tmp_path):
    """A file of `class ClashingName(DQN): name = "ppo"` (its own name is PPO's) is a DQN's, as its `derives_from`
    says: `rlspeed.load` gives its class (a PPO's load of it said it held settings PPO does not have), `DQN.load` a DQN
    with the warning of a subclass, `PPO.load` names DQN, its own load takes it and refuses a PPO's, and without its
    module `rlspeed.load` and `rlspeed export` build a DQN (export made a PPO of it, which failed)."""
    from rlspeed.export import export_checkpoint

    path = ClashingName("CartPole-v1", seed=0, device="cpu", buffer_size=64).save(tmp_path / "clash")
    assert type(rlspeed.load(path, device="cpu")) is ClashingName
    with pytest.warns(UserWarning, match=r"saved by .*ClashingName, a subclass of rlspeed's dqn; DQN.load makes it"):
        assert type(rlspeed.DQN.load(path, device="cpu")) is rlspeed.DQN
    with pytest.raises(UserError, match=r"holds a model of DQN, not of PPO; load it with rlspeed.DQN.load"):
        PPO.load(path, device="cpu")
    # (its own load takes its file, which it refused as "a model of DQN, not of ClashingName"; a PPO's file it
    # refuses as a PPO's, which it made a ClashingName of, then said it held settings ClashingName does not have)
    assert type(ClashingName.load(path, device="cpu")) is ClashingName
    ppo_file = PPO("CartPole-v1", seed=0, device="cpu", **TINY).save(tmp_path / "ppo")
    with pytest.raises(UserError, match=r"holds a model of PPO, not of ClashingName; load it with rlspeed.PPO.load"):
        ClashingName.load(ppo_file, device="cpu")
    with pytest.raises(UserError, match=r"holds a model of ppo, not of ppo \(derived from dqn\): set_parameters"):
        ClashingName("CartPole-v1", device="cpu", buffer_size=64).set_parameters(ppo_file)
    tensors, meta = rlspeed.checkpoint.load_checkpoint(path)
    rlspeed.checkpoint.save_checkpoint(path, tensors, {**meta, "class": "not_imported_module.ClashingName"})
    with pytest.warns(UserWarning, match=r"a subclass of rlspeed's dqn; DQN.load makes it a DQN"):
        assert type(rlspeed.load(path, device="cpu")) is rlspeed.DQN
    with pytest.warns(UserWarning, match=r"a subclass of rlspeed's dqn"):
        export_checkpoint(path, "torchscript", tmp_path / "policy.pt", algorithms=ALGORITHMS)
    assert json.loads((tmp_path / "policy.pt.json").read_text())["algo"] == "dqn"


def test_rlspeed_eval_of_an_algorithm_of_a_users_own(tmp_path, capsys):
    """`rlspeed eval` of a file saved by a user's algorithm of its own name: its class with its module imported
    (--gym-packages), else the rlspeed algorithm it derives from (a warning); a file that records none, its module not
    imported, is one sentence saying to add --gym-packages (before: "holds an unknown algorithm"). The warnings of
    `rlspeed eval` and `rlspeed export` give a command line's advice, not Python's."""
    from rlspeed import cli

    path = OwnAlgorithm("CartPole-v1", seed=0, device="cpu", **TINY).save(tmp_path / "own")
    assert cli.main(["eval", str(path), "--episodes", "1"]) == 0
    assert "rlspeed: OwnAlgorithm on CartPole-v1" in capsys.readouterr().out  # (its module is this one, imported)
    tensors, meta = rlspeed.checkpoint.load_checkpoint(path)
    rlspeed.checkpoint.save_checkpoint(path, tensors, {**meta, "class": "not_imported_module.OwnAlgorithm"})
    with pytest.warns(UserWarning, match=r"a subclass of rlspeed's ppo; rlspeed eval makes it a PPO, .*: add "
                                         r"--gym-packages not_imported_module \(importable from here: PYTHONPATH\) to "
                                         r"evaluate it as OwnAlgorithm\.$"):  # (it said "use OwnAlgorithm.load")
        assert cli.main(["eval", str(path), "--episodes", "1"]) == 0
    assert "rlspeed: PPO on CartPole-v1" in capsys.readouterr().out
    with pytest.warns(UserWarning, match=r"rlspeed export makes it a PPO, .*: add --gym-packages not_imported_module "
                                         r"\(importable from here: PYTHONPATH\) to export it as OwnAlgorithm\.$"):
        assert cli.main(["export", str(path), "--out", str(tmp_path / "policy.pt")]) == 0
    with pytest.warns(UserWarning, match=r"; PPO.load makes it a PPO"):  # (Python's words again after the commands)
        PPO.load(path, device="cpu")
    meta.pop("derives_from")
    rlspeed.checkpoint.save_checkpoint(path, tensors, {**meta, "class": "not_imported_module.OwnAlgorithm"})
    assert cli.main(["eval", str(path), "--episodes", "1"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "which is not one of rlspeed's algorithms and whose module is not imported: add --gym-packages "
        "not_imported_module (importable from here: PYTHONPATH).")


def test_a_stable_baselines3_zip_is_named(tmp_path):
    import zipfile

    path = tmp_path / "ppo_cartpole.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data", "{}")
    with pytest.raises(rlspeed.UserError, match="is a zip archive \\(a Stable-Baselines3 model"):
        PPO.load(path)
    # (SB3's PPO.load("ppo_cartpole") finds its .zip: the same refusal, not "does not exist")
    with pytest.raises(rlspeed.UserError, match="'.*ppo_cartpole.zip' is a zip archive \\(a Stable-Baselines3 model"):
        PPO.load(tmp_path / "ppo_cartpole")


def test_a_pickle_is_named_as_one_with_the_way_in_for_transitions(tmp_path):
    """Stable-Baselines3's save_replay_buffer file given to load_replay_buffer read "is not an rlspeed checkpoint (its
    contents are not safetensors: header too large): give a model file", which a replay buffer is not."""
    import pickle

    from rlspeed import DQN

    path = tmp_path / "replay_buffer.pkl"
    path.write_bytes(pickle.dumps({"observations": [0.0] * 8}, protocol=4))
    with pytest.raises(rlspeed.UserError, match=r"'.*replay_buffer\.pkl' is a pickle \(Stable-Baselines3's "
                                                r"save_replay_buffer .*rlspeed\.buffers\.ReplayBuffer you fill"):
        DQN("CartPole-v1", device="cpu").load_replay_buffer(path)


def test_a_stable_baselines3_zip_name_of_an_rlspeed_file_names_the_file(tmp_path):
    """A ported script's PPO.load("best/best_model.zip") (SB3's EvalCallback file): where rlspeed's
    best_model.safetensors is there, the error names it."""
    PPO("CartPole-v1", seed=0, device="cpu", num_envs=2, num_steps=8).save(tmp_path / "best_model.safetensors")
    with pytest.raises(rlspeed.UserError, match=r"does not exist: rlspeed saves '.*best_model\.safetensors' there, "
                                                r"not Stable-Baselines3's \.zip"):
        PPO.load(tmp_path / "best_model.zip")
    assert PPO.load(tmp_path / "best_model", device="cpu").num_timesteps == 0


def test_action_space_metadata_keeps_the_box_dtype():
    import gymnasium as gym
    import numpy as np

    from rlspeed.algos.base import space_from_json, space_to_json

    box = gym.spaces.Box(-2.0, 2.0, (3,), dtype=np.float64)
    loaded = space_from_json(json.loads(json.dumps(space_to_json(box))))
    assert loaded == box and loaded.dtype == np.float64
    older = {"type": "box", "shape": [1], "low": [-2.0], "high": [2.0]}  # written before the dtype was recorded
    assert space_from_json(older).dtype == np.float32
    assert space_from_json(space_to_json(gym.spaces.Discrete(4))) == gym.spaces.Discrete(4)


def test_a_normalising_env_passed_in_gives_the_model_its_statistics(tmp_path):
    """predict, evaluate and save use the statistics of a normalising env the user built; loading with such an
    env continues the saved statistics in it."""
    env = rlspeed.make_env("Pendulum-v1", num_envs=4, device="cpu", seed=0, normalize_obs=True)
    model = PPO(env, seed=0, device="cpu", **TINY).learn(256, progress_bar=False)
    assert model.obs_rms is env.obs_rms and model.obs_rms.count > 256
    path = model.save(tmp_path / "model")
    saved_count = float(model.obs_rms.count)
    fresh_env = rlspeed.make_env("Pendulum-v1", num_envs=4, device="cpu", seed=1, normalize_obs=True)
    loaded = PPO.load(path, device="cpu", env=fresh_env)
    loaded.learn(256, progress_bar=False)
    assert loaded.obs_rms is fresh_env.obs_rms and float(loaded.obs_rms.count) > saved_count + 256


@pytest.mark.filterwarnings("ignore:.*CartPole-v0 is out of date")
def test_evaluating_on_another_env_id_picks_its_backend():
    """A model trained on native envs evaluates on an env that has no native version (CartPole-v0)."""
    native = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", **TINY)
    assert native.env_backend == "torch"
    result = native.evaluate(episodes=2, env_id="CartPole-v0")
    assert len(result["returns"]) == 2


def test_reward_normalisation_statistics_are_saved_and_resumed(tmp_path):
    settings = dict(seed=0, device="cpu", normalize_reward=True, **TINY)
    model = PPO("Pendulum-v1", **settings).learn(256, progress_bar=False)
    assert model.return_rms is model._env.return_rms and float(model.return_rms.count) > 256
    path = model.save(tmp_path / "model")
    restarted = PPO("Pendulum-v1", **settings)
    restarted.make_training_env()
    restarted.resume(path)
    assert restarted.return_rms is restarted._env.return_rms
    torch.testing.assert_close(restarted.return_rms.var, model.return_rms.var)
    assert float(restarted.return_rms.count) == float(model.return_rms.count)
    loaded = PPO.load(path, device="cpu")
    torch.testing.assert_close(loaded.return_rms.var, model.return_rms.var)


def test_resume_with_a_bigger_budget_stretches_the_schedule(tmp_path):
    """PPO's annealed learning rate continues from the checkpoint and reaches 0 at the new, larger budget's end,
    not at the old one's (it trained at 0 past the old end)."""
    settings = dict(seed=0, device="cpu", **TINY)
    first = PPO("CartPole-v1", **settings)
    first.learn(512, progress_bar=False, run_dir=tmp_path / "run", checkpoint_freq=128)
    restarted = PPO("CartPole-v1", **settings)
    restarted.resume(tmp_path / "run" / "checkpoint.safetensors")
    rates = []
    restarted.learn(512, progress_bar=False,
                    callback=lambda local: rates.append(restarted.optimizer.param_groups[0]["lr"]) or True)
    assert min(rates) > 0 and rates == sorted(rates, reverse=True)
    assert rates[0] < restarted.config.learning_rate  # continued from the checkpoint's place, not from the top
    # a copy of the checkpoint saved by a loaded model (moved, re-encrypted) resumes as the checkpoint does
    copy = PPO.load(tmp_path / "run" / "checkpoint.safetensors", device="cpu").save(tmp_path / "copy")
    from_copy = PPO("CartPole-v1", **settings)
    from_copy.resume(copy)
    copied = []
    from_copy.learn(512, progress_bar=False,
                    callback=lambda local: copied.append(from_copy.optimizer.param_groups[0]["lr"]) or True)
    assert copied == rates


def test_resume_from_a_save_between_learn_calls_starts_the_schedules_as_the_next_learn_would(tmp_path):
    """A model saved after its learn call returned, resumed and trained on: its annealed learning rate and clip range
    start afresh over the new call, as the saved model's own next learn call (and a population's resume from a save
    between calls) does. They continued the finished call's schedule from its start, stretched to the new end: the
    rate began at half the rate. A checkpoint written during learn still continues its run (the test above)."""
    settings = dict(seed=0, device="cpu", num_envs=2, num_steps=16, batch_size=32, n_epochs=1, anneal_clip=True)

    def schedule(model, steps):
        seen = []
        model.learn(steps, progress_bar=False, callback=lambda local: seen.append(
            (float(model.optimizer.param_groups[0]["lr"]), model.config.clip_range * model._progress_remaining()))
            or True)
        return seen

    first = PPO("CartPole-v1", **settings).learn(128, progress_bar=False)
    path = first.save(tmp_path / "between")
    resumed = PPO("CartPole-v1", **settings)
    resumed.resume(path)
    expected = schedule(first, 128)
    assert expected[0][0] == first.config.learning_rate
    assert schedule(resumed, 128) == expected


def test_a_model_trained_on_a_normalising_env_rebuilds_one_after_load(tmp_path):
    env = rlspeed.make_env("Pendulum-v1", num_envs=4, device="cpu", seed=0, normalize_obs=True)
    model = PPO(env, seed=0, device="cpu", **TINY).learn(256, progress_bar=False)
    assert model.config.normalize_obs
    loaded = PPO.load(model.save(tmp_path / "model"), device="cpu")
    training_env = loaded.make_training_env()
    assert training_env.obs_rms is loaded.obs_rms and float(loaded.obs_rms.count) == float(model.obs_rms.count)


@pytest.mark.parametrize("ent_coef", [0.0, 0.2])
def test_sac_with_a_fixed_entropy_coefficient_round_trips(ent_coef, tmp_path):
    """A fixed temperature comes from the config and is not saved: a fixed 0 (log 0 = -inf) must still load, and a
    checkpoint's NaN/inf refusal must not catch it."""
    from rlspeed import SAC

    model = SAC("Pendulum-v1", device="cpu", seed=0, ent_coef=ent_coef, learning_starts=64).learn(
        256, progress_bar=False)
    loaded = SAC.load(model.save(tmp_path / "sac.safetensors"), device="cpu")
    assert torch.equal(loaded.log_alpha, model.log_alpha)
    obs = np.zeros((2, 3), dtype=np.float32)
    np.testing.assert_array_equal(loaded.predict(obs)[0], model.predict(obs)[0])


def test_load_and_resume_pass_the_integrity_switches_on(tmp_path):
    from rlspeed import PPO

    path = PPO("CartPole-v1", device="cpu", seed=0).save(tmp_path / "m.safetensors")
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # a flipped byte in the tensor data
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"m\.safetensors' does not match its SHA256 digest"):
        PPO.load(path, device="cpu")
    assert PPO.load(path, device="cpu", verify=False).num_timesteps == 0
    model = PPO("CartPole-v1", device="cpu", seed=0)
    with pytest.raises(UserError, match=r"m\.safetensors' does not match its SHA256 digest"):
        model.resume(path)
    model.resume(path, verify=False)


def test_run_model_names_what_a_directory_without_a_model_holds(tmp_path):
    """`rlspeed eval` / `export` of a directory: its model, else one sentence on what to give instead."""
    from rlspeed.checkpoint import run_model

    (tmp_path / "model.safetensors").write_bytes(b"")
    assert run_model(tmp_path) == tmp_path / "model.safetensors"
    assert run_model(tmp_path / "model.safetensors") == tmp_path / "model.safetensors"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="without a model.safetensors"):
        run_model(empty)
    (empty / "checkpoint.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="did not finish .* --resume"):
        run_model(empty)
    population = tmp_path / "population"
    (population / "members").mkdir(parents=True)
    for seed in (10, 2, 31):
        (population / "members" / f"seed_{seed}.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match=r"population's run directory: .*seed_2\.safetensors"):
        run_model(population)


def test_a_model_of_an_env_with_unbounded_actions_loads(tmp_path):
    """Infinite Box bounds are written as null (strict JSON) and read back as infinities: the model loads and acts
    as it did."""
    import gymnasium as gym
    import numpy as np

    class Unbounded(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Box(np.array([-np.inf, -1.0], np.float32), np.array([np.inf, np.inf], np.float32))

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), -float(np.square(action).sum()), False, False, {}

    gym.register("rlspeed-test/Unbounded-v0", entry_point=Unbounded, max_episode_steps=20)
    try:
        model = PPO("rlspeed-test/Unbounded-v0", num_envs=2, num_steps=16, batch_size=32, device="cpu", seed=0)
        model.learn(64, progress_bar=False)
        loaded = PPO.load(model.save(tmp_path / "model.safetensors"), device="cpu")
        assert loaded.action_space == model.action_space
        obs = np.zeros((3, 2), np.float32)
        np.testing.assert_array_equal(loaded.predict(obs)[0], model.predict(obs)[0])
    finally:
        gym.registry.pop("rlspeed-test/Unbounded-v0")


def test_an_env_given_to_load_must_have_the_models_spaces(tmp_path, pendulum_model):
    """`load(path, env=...)` refuses an env whose actions or observations differ from the saved model's, in one
    sentence (an action Box with other bounds would rescale every action); the same spaces load."""
    import gymnasium as gym

    class HalfPendulum(gym.Env):  # Pendulum's observation shape, actions in [-1, 1] instead of [-2, 2]
        observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

        def reset(self, seed=None, options=None):
            return np.zeros(3, np.float32), {}

        def step(self, action):
            return np.zeros(3, np.float32), 0.0, False, False, {}

    gym.register("RlspeedTestHalfPendulum-v0", entry_point=HalfPendulum, max_episode_steps=10)
    path = pendulum_model.save(tmp_path / "model")
    cls = type(pendulum_model)
    with pytest.raises(UserError, match=r"does not fit the model .*its actions differ"):
        cls.load(path, env="RlspeedTestHalfPendulum-v0")
    with pytest.raises(UserError, match=r"does not fit the model .*its observations and actions differ"):
        cls.load(path, env="MountainCarContinuous-v0")
    assert cls.load(path, env="Pendulum-v1").env_id == "Pendulum-v1"


def test_a_path_from_the_home_directory_is_expanded(tmp_path, monkeypatch, cartpole_model):
    """`save("~/x")` writes into the home directory (not a directory named "~"), and load reads it from there."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    path = cartpole_model.save("~/ppo")
    assert path == tmp_path / "home" / "ppo.safetensors" and path.is_file() and not (tmp_path / "~").exists()
    assert type(cartpole_model).load("~/ppo").num_timesteps == cartpole_model.num_timesteps


def test_a_saved_model_has_the_mode_of_the_users_other_files(tmp_path, cartpole_model):
    """A model written through a temporary file gets the mode a plain write would give it (0666 less the umask),
    not the temporary file's 0600."""
    import os
    import stat

    previous = os.umask(0o022)
    try:
        path = cartpole_model.save(tmp_path / "model")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_load_with_an_env_id_makes_as_many_envs_as_the_run_trained_with(tmp_path):
    """SB3's `PPO.load(path, env=...)`: with an id, the model keeps its num_envs (further training runs the run's
    rollout size); a built env keeps its own."""
    from rlspeed import PPO, make_env

    model = PPO("CartPole-v1", device="cpu", num_envs=8, num_steps=16, batch_size=64, seed=0)
    path = model.save(tmp_path / "model")
    loaded = PPO.load(path, env="CartPole-v1")
    assert loaded.config.num_envs == 8 and loaded.make_training_env().num_envs == 8
    assert PPO.load(path, env=make_env("CartPole-v1", num_envs=4)).config.num_envs == 4


def test_load_with_an_env_id_normalises_as_the_run_did_and_an_override_turns_it_off(tmp_path):
    """load(path, env=id) made a plain env while predict normalised; load(path, normalize_reward=False) was turned
    back on by the saved statistics."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", seed=0, num_envs=2, num_steps=16, batch_size=32, normalize_obs=True,
                normalize_reward=True)
    model.learn(64, progress_bar=False)
    model.save(tmp_path / "model")
    loaded = PPO.load(tmp_path / "model", env="CartPole-v1")
    env = loaded.make_training_env()
    assert env.obs_rms is loaded.obs_rms and getattr(env, "return_rms", None) is not None
    plain = PPO.load(tmp_path / "model", normalize_reward=False)
    assert getattr(plain.make_training_env(), "return_rms", None) is None and not plain.config.normalize_reward
    # normalize_obs=False at load (or resume): the statistics go too, or predict would normalise what trains raw
    raw = PPO.load(tmp_path / "model", normalize_obs=False)
    assert raw.obs_rms is None and getattr(raw.make_training_env(), "obs_rms", None) is None
    obs = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    with torch.no_grad():
        own = raw._policy_actions(torch.as_tensor(obs), True).numpy()
    np.testing.assert_array_equal(raw.predict(obs)[0], own)
    resumed = PPO("CartPole-v1", num_envs=2, num_steps=16, batch_size=32, normalize_obs=False)
    resumed.resume(tmp_path / "model")
    assert resumed.obs_rms is None
    # (a model built on a normalising env passed in keeps them: its config says so only once learn adopts the env's)
    passed_in = PPO(rlspeed.make_env("CartPole-v1", num_envs=2, normalize_obs=True), num_steps=16, batch_size=32)
    passed_in.resume(tmp_path / "model")
    assert passed_in.obs_rms is not None and float(passed_in.obs_rms.count) == float(model.obs_rms.count)


def _same_step_vector_env(env_id: str, num: int):
    import gymnasium as gym

    return gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def test_normalisation_asked_for_applies_to_a_vector_env_passed_in_and_to_a_callers_env_at_load(tmp_path):
    """PPO(vector_env, normalize_obs=True, normalize_reward=True) trained on raw observations and rewards (the
    options were recorded but nothing normalised); a normalising run loaded with an env of the caller's trained it
    raw while predict normalised (an off-policy model's too). Rewards are counted before normalisation."""
    from rlspeed import SAC

    model = PPO(_same_step_vector_env("CartPole-v1", 2), normalize_obs=True, normalize_reward=True, seed=0,
                device="cpu", num_steps=16, batch_size=32).learn(64, progress_bar=False)
    assert model.obs_rms is model._env.obs_rms and float(model.obs_rms.count) >= 64
    assert model.return_rms is model._env.return_rms
    env, finished, scaled = model._env, [], []
    env.reset()
    for _ in range(40):  # (always pushing left ends CartPole's episodes in about ten steps)
        _, reward, _, _, info = env.step(torch.zeros(2, dtype=torch.long))
        scaled.append(reward)
        finished += info["episode_return"][info["done"]].tolist()
    assert not torch.all(torch.cat(scaled) == 1)  # the learner's rewards are scaled ...
    assert finished and all(r >= 5 and r == int(r) for r in finished)  # ... the episode returns are CartPole's own
    model.save(tmp_path / "ppo")
    loaded = PPO.load(tmp_path / "ppo", env=_same_step_vector_env("CartPole-v1", 2), device="cpu")
    assert loaded.make_training_env().obs_rms is loaded.obs_rms

    sac = SAC(rlspeed.make_env("Pendulum-v1", normalize_obs=True), learning_starts=10, seed=0, device="cpu")
    sac.learn(64, progress_bar=False).save(tmp_path / "sac")
    count = float(sac.obs_rms.count)
    loaded = SAC.load(tmp_path / "sac", env=_same_step_vector_env("Pendulum-v1", 1), device="cpu")
    loaded.learn(64, progress_bar=False)
    assert loaded.obs_rms is loaded._env.obs_rms and float(loaded.obs_rms.count) >= count + 64


def test_a_vecnormalize_env_with_the_same_normalisation_asked_for_again_warns():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    with pytest.warns(UserWarning, match=r"VecNormalize \(norm_obs=True\) already normalises what normalize_obs=True"):
        PPO(VecNormalize(make_vec_env("CartPole-v1", 2), norm_reward=False), normalize_obs=True, device="cpu")


def test_a_seed_given_to_load_seeds_what_the_loaded_model_draws(tmp_path):
    """Fine-tuning one saved model with several seeds (`PPO.load(path, seed=s)`): the same seed repeats whatever the
    caller's random state, other seeds differ, and the model records the seed it was given (it kept the file's and
    left the draws to the caller's state). The seed is the model's own streams: loading leaves the caller's
    generator as it was (load reseeded it)."""
    from rlspeed import PPO

    options = {"num_envs": 4, "num_steps": 64, "batch_size": 128, "device": "cpu", "env_backend": "torch"}
    path = PPO("CartPole-v1", seed=0, **options).save(tmp_path / "pretrained")

    def fine_tuned(seed: int, caller_state: int) -> torch.Tensor:
        torch.manual_seed(caller_state)
        caller = torch.get_rng_state()
        model = PPO.load(path, device="cpu", seed=seed)
        assert model.seed == seed
        assert torch.equal(torch.get_rng_state(), caller)
        model.learn(512, progress_bar=False)
        return torch.cat([p.detach().flatten() for p in model.policy.parameters()])

    assert torch.equal(fine_tuned(1, caller_state=5), fine_tuned(1, caller_state=6))
    assert not torch.equal(fine_tuned(1, caller_state=5), fine_tuned(2, caller_state=5))


def test_resume_refuses_a_checkpoint_of_another_algorithm_or_env(tmp_path):
    """A PPO CartPole-v1 checkpoint holds tensors an A2C model or a CartPole-v0 one would take (same networks): resume
    continues the same run only, so both are refused in one sentence; the run's own model resumes from it."""
    from rlspeed import A2C, PPO, UserError

    path = PPO("CartPole-v1", seed=0, num_envs=2, num_steps=16).save(tmp_path / "model")
    for other, words in ((A2C("CartPole-v1", num_envs=2), "ppo CartPole-v1 checkpoint; cannot resume a2c CartPole-v1"),
                         (PPO("CartPole-v0", num_envs=2, num_steps=16),
                          "ppo CartPole-v1 checkpoint; cannot resume ppo CartPole-v0")):
        with pytest.raises(UserError, match=words):
            other.resume(path)
    PPO("CartPole-v1", num_envs=2, num_steps=16).resume(path)


@pytest.mark.parametrize(("key", "value"), [("activation", "relu"), ("net_arch", [32])])
def test_load_and_resume_refuse_other_networks_for_the_saved_weights(tmp_path, key, value):
    """`load(path, activation="relu")` ran tanh-trained weights through ReLUs silently (same shapes), and so did a
    resume with another activation: both name the setting; another learning rate or env backend is taken."""
    from rlspeed import PPO, UserError

    path = PPO("CartPole-v1", seed=0, num_envs=2, num_steps=16).save(tmp_path / "model")
    with pytest.raises(UserError, match=f"holds networks built with {key}="):
        PPO.load(path, **{key: value})
    with pytest.raises(UserError, match=f"holds networks built with {key}="):
        PPO("CartPole-v1", num_envs=2, num_steps=16, **{key: value}).resume(path)
    # (SB3's policy_kwargs, the same settings: checked as them, and the file's own network taken)
    with pytest.raises(UserError, match=f"holds networks built with {key}="):
        PPO.load(path, policy_kwargs={"activation_fn": "nn.ReLU"} if key == "activation" else {key: value})
    assert PPO.load(path, policy_kwargs={"net_arch": [64, 64], "activation_fn": "nn.Tanh"}).config.net_arch == (64, 64)
    loaded = PPO.load(path, learning_rate=1e-4, env_backend="torch")
    assert loaded.config.learning_rate == 1e-4 and loaded.env_backend == "torch"
    with pytest.raises(UserError, match="env_backend='bogus'.*expected one of auto, torch"):
        PPO.load(path, env_backend="bogus")
    with pytest.raises(UserError, match="num_envs=8.* with an env of 2 envs"):  # (the env's 2 trained, silently)
        PPO.load(path, env=rlspeed.make_env("CartPole-v1", num_envs=2), num_envs=8)


def test_a_file_with_settings_this_rlspeed_lacks_is_said_to_be_from_a_newer_rlspeed(tmp_path):
    """A newer rlspeed adds settings without a new file format: loading its file said "Unknown hyperparameter ... for
    DQN" without naming the file; it names the file, the settings and the upgrade."""
    from rlspeed import DQN, UserError
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    path = DQN("CartPole-v1", seed=0).save(tmp_path / "model")
    tensors, meta = load_checkpoint(path)
    meta["config"]["future_knob"] = 3
    save_checkpoint(path, tensors, meta)
    with pytest.raises(UserError, match=r"model.safetensors' holds settings this rlspeed's DQN does not have "
                                        r"\(future_knob\): a newer rlspeed wrote it"):
        DQN.load(path)


def test_a_damaged_files_message_names_the_way_to_read_that_kind_of_file_anyway(tmp_path):
    """The digest refusal said "load it in Python with Algorithm.load(path, verify=False)" for every file: no such
    top-level name, and for a population's checkpoint or a replay buffer that call fails too."""
    from rlspeed import DQN, PPO
    from rlspeed.checkpoint import load_checkpoint
    from rlspeed.population import Population

    def damaged(path):
        data = bytearray(path.read_bytes())
        data[-8] ^= 0xFF
        path.write_bytes(bytes(data))
        return path

    model = DQN("CartPole-v1", device="cpu", seed=0, learning_starts=16, buffer_size=256, num_envs=2)
    model.learn(32, progress_bar=False)
    path = damaged(model.save(tmp_path / "m.safetensors"))
    with pytest.raises(UserError, match=r"rlspeed\.DQN\.load\(path, verify=False\)"):
        load_checkpoint(path)
    assert DQN.load(path, device="cpu", verify=False).num_timesteps == 32  # (what the message says works)
    replay = damaged(model.save_replay_buffer(tmp_path / "m.replay.safetensors"))
    with pytest.raises(UserError, match="delete it"):
        model.load_replay_buffer(replay)
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], device="cpu", num_envs=2, num_steps=16, batch_size=32)
    path = damaged(population.save(tmp_path / "p.safetensors"))
    with pytest.raises(UserError, match=r"population\.resume\(path, verify=False\)"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], device="cpu", num_envs=2, num_steps=16,
                   batch_size=32).resume(path)
    Population(PPO, "CartPole-v1", seeds=[0, 1], device="cpu", num_envs=2, num_steps=16,
               batch_size=32).resume(path, verify=False)


def test_a_file_that_is_not_safetensors_is_named_as_no_checkpoint_with_what_to_give(tmp_path):
    """`rlspeed eval RUN/config.yaml` said "is not a readable rlspeed checkpoint (Error while deserializing header:
    header too large)", the reader's words and no fix."""
    from rlspeed.checkpoint import load_checkpoint

    path = tmp_path / "config.yaml"
    path.write_text("algo: ppo\nenv_id: CartPole-v1\n")
    with pytest.raises(UserError, match=r"is not an rlspeed checkpoint .*give a model file \(\.safetensors\)"):
        load_checkpoint(path)


def test_a_checkpoint_frequency_without_a_run_directory_is_refused():
    """learn(checkpoint_freq=64) without run_dir wrote nothing, without a word (a population's learn refused it)."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
    with pytest.raises(UserError, match="checkpoint_freq=64 needs a run_dir"):
        model.learn(128, checkpoint_freq=64, progress_bar=False)


def test_metadata_nested_deeper_than_rlspeed_writes_is_one_sentence(tmp_path):
    """An edited file whose metadata nests lists thousands deep made loading (and `rlspeed eval`) end in a
    RecursionError traceback instead of saying the file is damaged."""
    from safetensors.torch import save

    deep = "[" * 5000 + "]" * 5000
    path = tmp_path / "deep.safetensors"
    path.write_bytes(save({"x": torch.zeros(1)}, metadata={
        "rlspeed": '{"format": "rlspeed-checkpoint", "version": 1, "algo": "ppo", "low": ' + deep + "}"}))
    with pytest.raises(UserError, match="nested deeper than any rlspeed writes"):
        rlspeed.checkpoint.load_checkpoint(path)
    from rlspeed.checkpoint import _MAX_NESTING, _nesting

    assert _nesting({"a": [[1], {"b": []}]}) == 4 and _MAX_NESTING >= 16


def test_a_replay_file_named_outside_the_checkpoints_directory_is_never_read(tmp_path):
    """An off-policy checkpoint names its replay buffer's file beside it; an edited one naming `../x` made load raise
    ValueError (a traceback), and resume must not read from elsewhere: the buffer refills, with a warning."""
    from rlspeed import DQN
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    settings = dict(seed=0, device="cpu", num_envs=2, learning_starts=32, batch_size=16, buffer_size=500,
                    net_arch=(16, 16), save_replay_buffer=True)
    path = DQN("CartPole-v1", **settings).learn(64, progress_bar=False).save(tmp_path / "run" / "dqn")
    tensors, meta = load_checkpoint(path)
    meta = {key: value for key, value in meta.items() if key not in ("format", "version", "digest")}
    meta["resume"]["replay_buffer"]["file"] = "../dqn.replay.safetensors"
    (tmp_path / "dqn.replay.safetensors").write_bytes((tmp_path / "run" / "dqn.replay.safetensors").read_bytes())
    edited = save_checkpoint(tmp_path / "run" / "edited", tensors, meta)
    DQN.load(edited, device="cpu")
    model = DQN("CartPole-v1", **settings)
    model.resume(edited)
    with pytest.warns(UserWarning) as said:
        model.learn(96, progress_bar=False)
    assert any("names '../dqn.replay.safetensors', no file beside it" in str(w.message) for w in said), \
        [str(w.message) for w in said]
    from rlspeed.checkpoint import beside

    assert [beside(path, name) for name in ("..", ".", "", "a/b", "/etc/passwd")] == [None] * 5
    assert beside(path, "x.safetensors") == path.with_name("x.safetensors")



BOUNDED_SAVE = """
import resource, sys, torch
from rlspeed.checkpoint import save_checkpoint
size = 64 * 2**20
storage = torch.zeros(2 * size, dtype=torch.uint8)
frames = storage[:size]  # (the written rows of a replay buffer's storage, as its state_dict gives them)
with open("/proc/self/status") as handle:
    used = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmData:"))
resource.setrlimit(resource.RLIMIT_DATA, (used + size // 2, resource.RLIM_INFINITY))  # (half the frames' size)
save_checkpoint(sys.argv[1], {"frames": frames, "rewards": torch.ones(10)}, {"replay_buffer": {"rows": 1}})
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux counts every large allocation in RLIMIT_DATA")
def test_a_replay_buffers_checkpoint_is_saved_and_loaded_without_copies_of_it(tmp_path):
    """Saving a replay buffer took twice its size in memory besides it (a copy of each tensor, then the file as one
    bytes object), and loading it twice the file's size (the bytes read, then the tensors made from them): on a
    machine whose memory the buffer filled, a checkpoint with save_replay_buffer was killed for memory. Writing
    takes no copy now (it runs in half the buffer's size), reading only the tensors' own (the bytes read are never
    held whole)."""
    import tracemalloc

    from rlspeed.checkpoint import load_checkpoint

    path = tmp_path / "replay.safetensors"
    completed = subprocess.run([sys.executable, "-c", BOUNDED_SAVE, str(path)], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0 and completed.stdout.strip() == "ok", completed.stderr[-2000:]
    tracemalloc.start()
    try:
        tensors, meta = load_checkpoint(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tensors["frames"].shape == (64 * 2**20,) and not tensors["frames"].any()
    assert meta["replay_buffer"] == {"rows": 1} and peak < 2**20


def _anonymous_mib() -> float:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("RssAnon:")) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_a_mapped_load_takes_no_memory_of_its_own_and_leaves_the_file_as_it_was(tmp_path):
    """A resumed run's replay buffer was filled from a copy of its whole file besides it: with a buffer that took
    most of the memory (80% may), the resume was killed for memory. `mapped=True` (the resume's) reads the tensors
    as views of the file, copied only where written to."""
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    frames = torch.arange(64 * 2**20, dtype=torch.int64).to(torch.uint8)
    path = save_checkpoint(tmp_path / "replay", {"frames": frames}, {"replay_buffer": {"rows": 1}})
    before = _anonymous_mib()
    tensors, meta = load_checkpoint(path, mapped=True)
    assert torch.equal(tensors["frames"], frames) and meta["replay_buffer"] == {"rows": 1}
    assert _anonymous_mib() - before < 16  # (the 64 MiB were read, and none of them copied)
    tensors["frames"][:10] = 255  # (a write copies its page: the file keeps its bytes)
    del tensors
    assert torch.equal(load_checkpoint(path)[0]["frames"], frames)


def test_a_resumed_replay_buffer_is_read_mapped(tmp_path, monkeypatch):
    """The resume reads the replay file mapped (`load_checkpoint(mapped=True)`, above), fills the buffer from it and
    keeps nothing of it: the buffer holds the saved rows, and its n-step window copies of its own."""
    from pathlib import Path

    from rlspeed import DQN, checkpoint

    settings = dict(seed=0, device="cpu", env_backend="torch", learning_starts=16, batch_size=8, n_step=3,
                    buffer_size=300, net_arch=(8,), save_replay_buffer=True)
    saved = DQN("CartPole-v1", **settings)
    saved.learn(64, progress_bar=False, run_dir=tmp_path, checkpoint_freq=64)
    rows = saved.buffer.state_dict()[0]["obs"].clone()
    calls, load = [], checkpoint.load_checkpoint

    def spy(path, *args, **kwargs):
        calls.append((Path(path).name, kwargs.get("mapped", False)))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "load_checkpoint", spy)
    resumed = DQN("CartPole-v1", **settings)
    resumed.resume(tmp_path / "checkpoint.safetensors")
    resumed.learn(128, progress_bar=False)
    assert ("checkpoint.replay.safetensors", True) in calls
    assert torch.equal(resumed.buffer.obs[:len(rows)], rows)


class AuxPPO(PPO):
    """PPO with an auxiliary value head of its own, trained by its loss through the one optimizer."""

    def _setup(self):
        self.aux_head = torch.nn.Linear(4, 1)
        super()._setup()

    def _make_optimizer(self, params):
        return torch.optim.Adam([*params, *self.aux_head.parameters()], lr=self.config.learning_rate)

    def _loss(self, obs, actions, old_log_probs, old_values, advantages, returns, *rest):
        loss, stats = super()._loss(obs, actions, old_log_probs, old_values, advantages, returns, *rest)
        return loss + (self.aux_head(obs).squeeze(-1) - returns).square().mean(), stats


def test_a_module_a_subclass_trains_of_its_own_is_saved_loaded_and_resumed(tmp_path):
    """An auxiliary head a subclass keeps as an attribute and adds to its optimizer, which `_modules` does not list:
    load and resume gave a freshly initialised one, silently (with the saved optimizer moments for the trained one). It
    is saved under its attribute's name; a file without it (rlspeed's own class saved it) says it starts as built."""
    model = AuxPPO("CartPole-v1", seed=0, device="cpu", **TINY)
    before = model.aux_head.weight.detach().clone()
    model.learn(128, progress_bar=False)
    assert not torch.equal(model.aux_head.weight, before)
    path = model.save(tmp_path / "aux")
    torch.testing.assert_close(AuxPPO.load(path).aux_head.weight, model.aux_head.weight, rtol=0, atol=0)
    resumed = AuxPPO("CartPole-v1", seed=1, device="cpu", **TINY)
    resumed.resume(path)
    torch.testing.assert_close(resumed.aux_head.weight, model.aux_head.weight, rtol=0, atol=0)
    plain = PPO("CartPole-v1", seed=0, device="cpu", **TINY).save(tmp_path / "plain")
    with warnings.catch_warnings(record=True) as caught:  # (and that its optimizer starts afresh)
        warnings.simplefilter("always")
        AuxPPO.load(plain)
    assert any("no weights for AuxPPO.aux_head, which this model trains: it starts as built" in str(item.message)
               for item in caught)


def test_observation_statistics_fitted_from_demonstrations_before_the_first_learn_carry_on(tmp_path):
    """docs/checkpoints.md (Demonstrations): statistics folded in through make_training_env() and obs_rms.update go on
    updating in learn, not replaced by fresh ones, and a save carries them."""
    model = PPO("CartPole-v1", seed=0, device="cpu", num_envs=2, num_steps=8, batch_size=16, normalize_obs=True)
    model.make_training_env()
    states = torch.full((100, 4), 3.0)
    model.obs_rms.update(states)
    model.learn(16, progress_bar=False)
    assert float(model.obs_rms.count) > 100 and bool((model.obs_rms.mean > 2.5).all())
    loaded = PPO.load(model.save(tmp_path / "fitted"), device="cpu")
    assert torch.equal(loaded.obs_rms.mean, model.obs_rms.mean)


def test_float32_bounds_are_recorded_as_the_decimals_the_env_gave():
    """A checkpoint's and an export sidecar's float32 bounds read as the env's own numbers (CartPole's 4.8, not
    4.800000190734863) and load back as the same float32 values."""
    import gymnasium as gym
    import numpy as np

    from rlspeed.envs.base import space_from_json, space_to_json

    space = gym.make("CartPole-v1").observation_space
    written = json.loads(json.dumps(space_to_json(space)))
    assert written["high"][0] == 4.8 and written["low"][0] == -4.8
    loaded = space_from_json(written)
    assert loaded == space and np.array_equal(loaded.high, space.high) and loaded.dtype == np.float32


_ACT_FROM_CHECKPOINTS = """
import sys
import numpy as np
import torch
import rlspeed
built = []
_build = torch.optim.Optimizer.__init__
def _counted_build(self, *args, **kwargs):
    built.append(type(self).__name__)
    _build(self, *args, **kwargs)
torch.optim.Optimizer.__init__ = _counted_build
class SGDPPO(rlspeed.PPO):
    def _make_optimizer(self, params):
        return torch.optim.SGD(params, lr=self.config.learning_rate)
for name, path in zip(("PPO", "SAC", "DQN"), sys.argv[1:]):
    model = getattr(rlspeed, name).load(path, device="cpu")
    model.predict(np.zeros(model.spec.observation_shape, np.float32), deterministic=True)
    model.evaluate(episodes=1, deterministic=True)
    model.save(path + "_resaved")
fresh = SGDPPO("CartPole-v1", device="cpu", num_envs=1, num_steps=8, batch_size=8)
SGDPPO.load(fresh.save(sys.argv[1] + "_sgd"), device="cpu").save(sys.argv[1] + "_sgd_resaved")
print("built to act:", built)
for name, path in zip(("PPO", "SAC"), sys.argv[1:]):
    model = getattr(rlspeed, name).load(path, device="cpu")
    model.learn(16, progress_bar=False)
    assert model.update_summary()["implementation"] == "hand-derived"
    steps = model._n_updates  # (the resumed model steps the optimizer its checkpoint's state went into)
    resumed = getattr(rlspeed, name).load(model.save(path + "_trained"), device="cpu").learn(16, progress_bar=False)
    assert steps > 0 and resumed._n_updates > steps, (name, steps, resumed._n_updates)
trained = []
off_policy = {"learning_starts": 4, "batch_size": 4}
on_policy = {"num_steps": 4, "batch_size": 4, "n_epochs": 1}
for name, env_id, settings in (("A2C", "CartPole-v1", {"num_steps": 4}), ("DQN", "CartPole-v1", off_policy),
                               ("TD3", "Pendulum-v1", off_policy), ("DDPG", "Pendulum-v1", off_policy),
                               ("RecurrentPPO", "CartPole-v1", on_policy),
                               ("PPO", "CartPole-v1", {**on_policy, "fused_update": False})):
    model = getattr(rlspeed, name)(env_id, seed=0, device="cpu", num_envs=1, net_arch=[4], **settings)
    model.learn(8, progress_bar=False)
    assert model._n_updates > 0, name  # (an optimizer step taken: the import it would make is what is checked)
    trained.append(f"{name} {model.update_summary()['implementation']}")
print(trained)
print(sorted(name for name in sys.modules if name.startswith("torch._dynamo")))
# a user's own optimiser after rlspeed's learns, under torch.compile: torch keeps compile out of its methods, as it
# would have without rlspeed (torch's own `torch._disable_dynamo` wrappers, none of rlspeed's left in their place)
weight = torch.nn.Parameter(torch.ones(3))
optimizer = torch.optim.Adam([weight], lr=0.1)
def loss(x):
    optimizer.zero_grad()
    return (weight * x).square().sum()
x = torch.arange(3.0)
assert torch.equal(torch.compile(loss, backend="eager")(x), loss(x))
optimizer.load_state_dict(optimizer.state_dict())
methods = [getattr(torch.optim.Optimizer, name).__wrapped__ for name in
           ("add_param_group", "state_dict", "load_state_dict", "zero_grad")]
print("torch's wrappers:", all(vars(method).get("__dynamo_disable") is not method for method in methods))
"""


def test_loading_to_act_builds_no_optimizer_and_training_imports_no_dynamo(tmp_path):
    """docs/checkpoints.md: a model loaded to act (load, predict, evaluate), and saved again, builds no optimizer
    (one a subclass's `_make_optimizer` makes neither); and a fresh process that trains, saves and resumes never
    imports torch._dynamo (which torch's optimizers import when first built, saved, loaded or stepped: seconds of
    every `rlspeed train`'s start), with every algorithm, the hand-derived updates and the fp32 eager autograd ones
    (TD3, DDPG and RecurrentPPO imported it at their first step); a user's own optimiser made after that is as torch
    makes it, for torch.compile."""
    small = {"num_envs": 1, "net_arch": [8], "learning_starts": 8, "batch_size": 8}
    paths = [rlspeed.PPO("CartPole-v1", seed=0, device="cpu", **TINY).save(tmp_path / "ppo"),
             rlspeed.SAC("Pendulum-v1", seed=0, device="cpu", **small).save(tmp_path / "sac"),
             rlspeed.DQN("CartPole-v1", seed=0, device="cpu", **small).save(tmp_path / "dqn")]
    result = subprocess.run([sys.executable, "-c", _ACT_FROM_CHECKPOINTS, *map(str, paths)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-4] == "built to act: []"
    assert lines[-3] == str([f"{name} {implementation}" for name, implementation in (
        ("A2C", "hand-derived"), ("DQN", "hand-derived"), ("TD3", "autograd"), ("DDPG", "autograd"),
        ("RecurrentPPO", "autograd"), ("PPO", "autograd"))])
    assert lines[-2] == "[]"
    assert lines[-1] == "torch's wrappers: True"


class FlakyPPO(PPO):
    """A PPO whose optimizer's first build fails (a subclass's bug, memory running out)."""

    failures = 1

    def _make_optimizer(self, params):
        if type(self).failures:
            type(self).failures -= 1
            raise RuntimeError("out of memory")
        return super()._make_optimizer(params)


def test_an_optimizer_build_that_failed_is_tried_again_with_the_checkpoints_state(tmp_path, monkeypatch,
                                                                                  cartpole_model):
    """A model's optimizer is built on first need; where that build raised, the next read said "'PPO' object has no
    attribute 'optimizer'" (the model held none, and would not build again), and where loading the checkpoint's state
    into it raised, the next read gave an optimizer without that state, silently. Each read builds again, raising the
    cause again, and the state goes in when a build succeeds."""
    path = cartpole_model.save(tmp_path / "model")
    FlakyPPO.failures = 1
    model = FlakyPPO.load(path, device="cpu")
    with pytest.raises(RuntimeError, match="out of memory"):
        model.optimizer  # noqa: B018
    state = model.optimizer.state_dict()["state"]
    assert state and all(torch.equal(state[index]["exp_avg"], cartpole_model.optimizer.state_dict()["state"][index][
        "exp_avg"]) for index in state)
    model = PPO.load(path, device="cpu")

    def refused(*_):
        raise UserError("does not fit")

    monkeypatch.setattr(PPO, "_load_optimizer_state", refused)
    for _ in range(2):
        with pytest.raises(UserError, match="does not fit"):
            model.learn(64, progress_bar=False)
    monkeypatch.undo()
    assert model.optimizer.state_dict()["state"].keys() == state.keys()


@pytest.mark.parametrize("algo, env_id, config", [
    (rlspeed.PPO, "CartPole-v1", TINY),
    (rlspeed.SAC, "Pendulum-v1", {"num_envs": 1, "net_arch": [8], "learning_starts": 16, "batch_size": 8})])
def test_a_loaded_models_optimizer_state_is_saved_unchanged_and_trains_as_one_built_at_load(tmp_path, algo, env_id,
                                                                                             config):
    """The optimizer state a checkpoint holds goes into the optimizer when it is first needed: saving a loaded model
    that never trained writes that state byte for byte, and its learn trains as one whose optimizer was built at
    load."""
    model = algo(env_id, seed=0, device="cpu", **config).learn(128, progress_bar=False)
    path = model.save(tmp_path / "model")
    resaved = algo.load(path, device="cpu").save(tmp_path / "resaved")
    with safetensors.safe_open(path, "pt") as first, safetensors.safe_open(resaved, "pt") as second:
        keys = sorted(key for key in first.keys() if key.startswith("optim."))
        assert keys and keys == sorted(key for key in second.keys() if key.startswith("optim."))
        for key in keys:
            assert first.get_tensor(key).numpy().tobytes() == second.get_tensor(key).numpy().tobytes(), key
        assert (json.loads(first.metadata()["rlspeed"])["optimizers"]
                == json.loads(second.metadata()["rlspeed"])["optimizers"])
    trained = []
    for build_at_load in (False, True):  # (each loaded and trained in turn: the seed sets the global generators)
        loaded = algo.load(path, device="cpu", seed=1)
        if build_at_load:
            loaded.optimizer  # noqa: B018 (built now, as every load built it)
        trained.append(loaded.learn(max(loaded.steps_per_iteration, 32), progress_bar=False))
    lazy, eager = trained
    assert lazy._n_updates > model._n_updates
    for key, value in eager.policy.state_dict().items():
        assert torch.equal(lazy.policy.state_dict()[key], value), key
    for key, value in eager.optimizer.state_dict()["state"].items():
        assert all(torch.equal(lazy.optimizer.state_dict()["state"][key][field], value[field]) for field in value)


def test_set_parameters_and_init_from_take_a_file_of_an_algorithm_derived_from_the_models(tmp_path, capsys):
    """A file of `class OwnAlgorithm(PPO): name = "own_algorithm"` (it records `derives_from: ppo`) is a PPO's to
    `set_parameters` and `--init-from`, as to `PPO.load` (they said it held "a model of own_algorithm, not of ppo");
    a PPO's file goes into an OwnAlgorithm, by set_parameters as by `OwnAlgorithm.load`; a DQN is still refused,
    each algorithm named with the one it derives from."""
    from rlspeed import cli

    own = OwnAlgorithm("CartPole-v1", seed=0, device="cpu", **TINY)
    path = own.save(tmp_path / "own")
    model = PPO("CartPole-v1", seed=1, device="cpu", **TINY)
    model.set_parameters(path)
    assert all(torch.equal(a, b) for a, b in zip(model.policy.state_dict().values(),
                                                 own.policy.state_dict().values()))
    OwnAlgorithm("CartPole-v1", seed=1, device="cpu", **TINY).set_parameters(model.save(tmp_path / "ppo"))
    # (and to its load, as to set_parameters: it refused one as "a model of PPO, not of OwnAlgorithm")
    assert type(OwnAlgorithm.load(tmp_path / "ppo", device="cpu")) is OwnAlgorithm
    with pytest.raises(UserError, match=r"holds a model of own_algorithm \(derived from ppo\), not of dqn: "):
        rlspeed.DQN("CartPole-v1", device="cpu", buffer_size=64).set_parameters(path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--init-from", str(path), "--dry-run"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "dqn", "CartPole-v1", "--init-from", str(path), "--dry-run"]) == 2
    assert "holds a model of own_algorithm (derived from ppo), not of dqn: " in capsys.readouterr().err


def test_rlspeed_eval_of_a_model_file_moved_without_its_run_imports_the_module_that_registers_its_env(
        tmp_path, monkeypatch, capsys):
    """A model trained on a user's env (`rlspeed train ppo myenvs:MyEnv-v0` keeps the id `MyEnv-v0` and the module in
    config.yaml) records the module that registers the id (`gym_packages`): `rlspeed eval` of the file alone, where
    nothing registered the id, imports it and says so (it failed: "not a registered id here"); `--no-imports` says
    what it does not import; the file saved again keeps them. MinAtar's ids record the module whose register_envs()
    registers them. Python's `load` imports none: `evaluate` and `learn` name them and how to import them."""
    import gymnasium as gym

    from rlspeed import cli
    from rlspeed.envs.packages import registering_modules

    (tmp_path / "fu_moved_envs.py").write_text(
        "import gymnasium as gym\nfrom gymnasium.envs.classic_control.cartpole import CartPoleEnv\n\n\n"
        "class Moved(CartPoleEnv):\n    pass\n\n\ngym.register('FuMoved-v0', entry_point=Moved, max_episode_steps=20)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fu_moved_envs", raising=False)
    import fu_moved_envs  # noqa: F401 (registers FuMoved-v0)

    path = PPO("FuMoved-v0", seed=0, device="cpu", **TINY).save(tmp_path / "moved" / "model")
    assert rlspeed.checkpoint.load_checkpoint(path)[1]["gym_packages"] == ["fu_moved_envs"]
    assert registering_modules("MinAtar/Breakout-v1") == ["minatar.gym"] and registering_modules("CartPole-v1") == []
    assert registering_modules("fu_pkg.envs:Fu-v0") == ["fu_pkg.envs"]  # (Python keeps a `module:EnvId` id whole)
    monkeypatch.delitem(sys.modules, "fu_moved_envs")  # (as in a process that never imported it)
    monkeypatch.delitem(gym.registry, "FuMoved-v0")
    again = PPO.load(path, device="cpu").save(tmp_path / "again")  # (saved again, or exported: the file's modules)
    assert rlspeed.checkpoint.load_checkpoint(again)[1]["gym_packages"] == ["fu_moved_envs"]
    # (Python's load imports nothing: evaluate and learn named no module, "import the module that registers it"; they
    # name the file's now, and how to import them)
    loaded = PPO.load(path, device="cpu")
    # (the model says which modules its file records, for a caller to import: evaluate and export read them so)
    assert loaded.recorded_gym_packages == ("fu_moved_envs",) and PPO("CartPole-v1", **TINY).recorded_gym_packages == ()
    for use in (lambda: loaded.evaluate(episodes=1), lambda: loaded.learn(16, progress_bar=False)):
        with pytest.raises(UserError, match=r"'FuMoved-v0', which is not a registered id here: the model's file "
                                            r"records the module that registers it, so import it first \(import "
                                            r"fu_moved_envs"):
            use()
    assert "fu_moved_envs" not in sys.modules
    # (a file that records no module, as an older rlspeed wrote: learn(eval_freq) said the id was "an env built and
    # passed in"; it is the id nothing here registered, as evaluate says)
    loaded._recorded_gym_packages = []
    with pytest.raises(UserError, match=r"'FuMoved-v0', which is not a registered id here: the model's file names no "
                                        r"module that registers it \(.*\), so import the module that registers it "
                                        r"first \(rlspeed eval MODEL --gym-packages MODULE; .*\); or give it an env "
                                        r"you built: PPO\.load\(path, env=env\)"):
        loaded.learn(16, eval_freq=8, progress_bar=False)
    assert cli.main(["eval", str(path), "--episodes", "1", "--no-imports"]) == 2
    assert f"not importing fu_moved_envs, which {path} records" in capsys.readouterr().err
    assert cli.main(["eval", str(path), "--episodes", "1"]) == 0
    captured = capsys.readouterr()
    assert f"rlspeed: importing fu_moved_envs, which {path} records" in captured.err
    assert "PPO on FuMoved-v0" in captured.out


def test_rlspeed_eval_of_a_file_whose_recorded_module_registers_no_id_says_the_file_cannot_name_it(
        tmp_path, monkeypatch, capsys):
    """A package that registers an id whose entry point is in another module (`fu_reg_ids` registers FuRegElse-v0 as
    `fu_reg_impl:Impl`) gets that module recorded (`gym_packages`: the file cannot know the registering one):
    `rlspeed eval` of the moved file imported `fu_reg_impl` and then told the user to import it; it says the file
    cannot name the module and how to pass it (--gym-packages), which then evaluates."""
    import gymnasium as gym

    from rlspeed import cli

    (tmp_path / "fu_reg_impl.py").write_text(
        "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\n\n\nclass Impl(CartPoleEnv):\n    pass\n")
    (tmp_path / "fu_reg_ids.py").write_text(
        "import gymnasium as gym\n\n"
        "gym.register('FuRegElse-v0', entry_point='fu_reg_impl:Impl', max_episode_steps=20)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("fu_reg_ids", "fu_reg_impl"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    import fu_reg_ids  # noqa: F401 (registers FuRegElse-v0)

    path = PPO("FuRegElse-v0", seed=0, device="cpu", **TINY).save(tmp_path / "model")
    assert rlspeed.checkpoint.load_checkpoint(path)[1]["gym_packages"] == ["fu_reg_impl"]
    for module in ("fu_reg_ids", "fu_reg_impl"):  # (as in a process that never imported them)
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.delitem(gym.registry, "FuRegElse-v0")
    assert cli.main(["eval", str(path), "--episodes", "1"]) == 2
    said = capsys.readouterr().err
    assert "fu_reg_impl, which the model's file records as its env's module, is imported and registered no such id " \
           "(another module registers it, which the file cannot name), so import the module that registers it first " \
           "(rlspeed eval MODEL --gym-packages MODULE;" in said
    assert cli.main(["eval", str(path), "--episodes", "1", "--gym-packages", "fu_reg_ids"]) == 0
    assert "PPO on FuRegElse-v0" in capsys.readouterr().out
