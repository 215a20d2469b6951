"""CNN encoders by image size: `cnn=auto` gives the Nature CNN from 36 pixels a side, the strided 3x3 CNN from 16 and
the small 3x3 CNN below (MinAtar, MiniGrid); `cnn` picks one, and files saved before it load with the rule of then."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import cli_error

import rlspeed
from rlspeed import PPO
from rlspeed.checkpoint import load_checkpoint, save_checkpoint
from rlspeed.envs.base import EnvSpec
from rlspeed.errors import EncoderWarning, UnusedSettingWarning, UserError
from rlspeed.nn import make_encoder


def _image(shape, dtype=np.uint8):
    return gym.spaces.Box(0, 1 if dtype is bool else 255, shape, dtype)


def _weights(encoder) -> dict[str, tuple[int, ...]]:
    return {name: tuple(param.shape) for name, param in encoder.named_parameters()}


@pytest.mark.parametrize("shape, kind", [
    ((15, 15, 3), "small CNN encoder"),
    ((16, 16, 3), "strided CNN encoder"),
    ((3, 28, 28), "strided CNN encoder"),  # (MiniGrid's RGBImgPartialObsWrapper(tile_size=4))
    ((35, 35, 3), "strided CNN encoder"),
    ((21, 37, 3), "strided CNN encoder"),  # (the smaller side decides)
    ((36, 36, 3), "Nature CNN encoder"),
])
def test_auto_gives_images_of_16_to_35_pixels_a_strided_cnn_of_at_most_2_million_linear_weights(shape, kind,
                                                                                                 monkeypatch):
    """The small CNN keeps an image's full size: 35x35 had 15.7 million linear weights (against 0.03 million in
    the Nature CNN at 36x36), 21x37 9.2 million; the strided CNN quarters the image first."""
    monkeypatch.setattr(rlspeed.nn, "_init_conv_net", lambda module: None)  # (the orthogonal init takes a while)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoder = make_encoder(_image(shape))
    assert encoder.kind == kind
    assert encoder.linear[0].weight.numel() <= 2_000_000
    features = encoder(torch.zeros((2, *shape), dtype=torch.uint8))
    assert features.shape == (2, 512)


def test_minatar_and_minigrid_images_keep_the_small_cnn_as_it_was():
    """Benchmarks and presets rest on these networks: 16 and 32 3x3/1 convolutions, padded below 5 pixels."""
    minatar = make_encoder(_image((10, 10, 4), bool))
    assert _weights(minatar) == {"cnn.0.weight": (16, 4, 3, 3), "cnn.0.bias": (16,), "cnn.2.weight": (32, 16, 3, 3),
                                 "cnn.2.bias": (32,), "linear.0.weight": (512, 1152), "linear.0.bias": (512,)}
    minigrid = make_encoder(_image((7, 7, 3)))
    assert minigrid.kind == "small CNN encoder" and minigrid.linear[0].in_features == 32 * 3 * 3
    assert minigrid.cnn[0].padding == (0, 0)


def test_the_strided_cnn_is_the_one_docs_algorithms_md_describes(monkeypatch):
    """docs/algorithms.md: 32 3x3 stride 2 and 64 3x3 stride 2, each padded by one pixel, then 64 3x3 stride 1; 32x32
    images leave 64 x 6 x 6 values for the linear layer, 1.2 million weights, where the small CNN's has 12.8 million."""
    monkeypatch.setattr(rlspeed.nn, "_init_conv_net", lambda module: None)  # (the orthogonal init takes a while)
    strided = make_encoder(_image((32, 32, 3)), cnn="strided")
    convolutions = [(layer.out_channels, layer.kernel_size, layer.stride, layer.padding) for layer in strided.cnn
                    if isinstance(layer, torch.nn.Conv2d)]
    assert convolutions == [(32, (3, 3), (2, 2), (1, 1)), (64, (3, 3), (2, 2), (1, 1)), (64, (3, 3), (1, 1), (0, 0))]
    assert strided.linear[0].in_features == 64 * 6 * 6 and round(strided.linear[0].weight.numel() / 1e6, 1) == 1.2
    with pytest.warns(EncoderWarning, match="12.8 million weights"):
        small = make_encoder(_image((32, 32, 3)), cnn="small")
    assert round(small.linear[0].weight.numel() / 1e6, 1) == 12.8


def _model(shape=(20, 20, 3), **hyper) -> PPO:
    spec = EnvSpec.from_spaces("custom", _image(shape), gym.spaces.Discrete(3), 20, None)
    return PPO(spec, seed=0, net_arch=(8,), cnn_features_dim=16, **hyper)


def test_cnn_picks_the_architecture_and_refuses_one_the_images_are_too_small_for():
    assert _model(cnn="small").policy.encoder.kind == "small CNN encoder"
    assert _model((40, 40, 3), cnn="strided").policy.encoder.kind == "strided CNN encoder"
    with pytest.raises(UserError, match=r"^cnn=nature needs both image sides >= 36 pixels, and these images are "
                                        r"20x20; use cnn=small or cnn=auto\.$"):
        _model(cnn="nature")
    with pytest.raises(UserError, match=r"^cnn must be one of auto, nature, strided, small, nature_or_small, got "
                                        r"'impala'\.$"):
        _model(cnn="impala")


def test_the_cli_refuses_an_unknown_cnn_in_one_sentence(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--set", "cnn=impala", "--no-progress"])
    assert "cnn must be one of auto, nature, strided, small, nature_or_small" in line


def test_a_file_saved_before_cnn_loads_with_the_small_cnn_it_was_built_with(tmp_path):
    """A 20x20 model saved before the strided CNN existed (its config without `cnn`) holds the small CNN's weights:
    it loads with them (cnn=nature_or_small, the rule of then) and acts as it did, where auto would build another."""
    old = _model(cnn="nature_or_small")
    path = old.save(tmp_path / "old")
    _without_cnn(path, lambda meta: meta["config"])
    loaded = PPO.load(path)
    assert loaded.config.cnn == "nature_or_small" and loaded.policy.encoder.kind == "small CNN encoder"
    obs = torch.randint(0, 256, (6, 20, 20, 3), dtype=torch.uint8).numpy()
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], old.predict(obs, deterministic=True)[0])
    assert _model().policy.encoder.kind == "strided CNN encoder"


def test_load_takes_a_cnn_that_builds_the_networks_the_file_holds_and_refuses_another(tmp_path):
    """load(path, cnn=...) is refused only where the CNN it names differs from the file's: a file saved before `cnn`
    (the rule of then) loads with cnn=small at 20x20 and cnn=nature at 40x40, which build its networks (both were
    refused as other values than nature_or_small and auto), and refuses cnn=auto at 20x20 (a strided CNN); resume
    likewise."""
    for shape, same, other in [((20, 20, 3), "small", "auto"), ((40, 40, 3), "nature", "strided")]:
        old = _model(shape, cnn="nature_or_small")
        path = old.save(tmp_path / f"old{shape[0]}")
        _without_cnn(path, lambda meta: meta["config"])
        loaded = PPO.load(path, cnn=same)
        assert loaded.policy.encoder.kind == old.policy.encoder.kind
        obs = torch.randint(0, 256, (6, *shape), dtype=torch.uint8).numpy()
        np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0],
                                      old.predict(obs, deterministic=True)[0])
        with pytest.raises(UserError, match=rf"^load\(\.\.\., cnn='{other}'\): .* holds networks built with cnn="):
            PPO.load(path, cnn=other)
        _model(shape, cnn=same).resume(path)  # (resume, likewise)
        with pytest.raises(UserError, match=rf"holds networks built with cnn=.*, this model has cnn='{other}'"):
            _model(shape, cnn=other).resume(path)


def test_set_parameters_and_init_from_take_a_cnn_that_builds_the_files_networks(tmp_path, capsys, monkeypatch):
    """set_parameters and --init-from hold a file's `cnn` to load's rule (the CNN each image gets): a 20x20 file of
    nature_or_small (the small CNN) goes into a model with cnn=small, which set_parameters refused as another value,
    and --set cnn=small with it; cnn=auto (a strided CNN) is still refused by both."""
    from rlspeed import cli

    source = _model(cnn="nature_or_small")
    path = source.save(tmp_path / "small")
    model = _model(cnn="small")
    model.set_parameters(path)
    obs = torch.randint(0, 256, (6, 20, 20, 3), dtype=torch.uint8).numpy()
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0],
                                  source.predict(obs, deterministic=True)[0])
    with pytest.raises(UserError, match=r"holds networks built with cnn='nature_or_small', this model's have "
                                        r"cnn='auto'"):
        _model(cnn="auto").set_parameters(path)
    gym.register("Grid20-v0", entry_point=_Grid20, max_episode_steps=20)
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "Grid20-v0", "--init-from", str(path), "--set", "num_envs=2", "--dry-run"]
    try:
        assert cli.main([*argv, "--set", "cnn=small"]) == 0
        capsys.readouterr()
        assert "--set cnn=auto and --init-from" in cli_error(capsys, [*argv, "--set", "cnn=auto"])
    finally:
        gym.registry.pop("Grid20-v0", None)


def _without_cnn(path, config_of) -> None:
    """The checkpoint at `path` rewritten as an rlspeed before `cnn` wrote it (`config_of(meta)`: its config)."""
    tensors, meta = load_checkpoint(path)
    del config_of(meta)["cnn"], meta["digest"]
    save_checkpoint(path, tensors, meta)


def test_a_population_checkpoint_saved_before_cnn_resumes(tmp_path):
    """Its config has no `cnn`, which resume compared as a changed hyperparameter (None against auto) and refused."""
    from rlspeed.population import Population

    options = {"seeds": [0, 1], "num_envs": 4, "num_steps": 16, "batch_size": 64, "net_arch": (8,)}
    path = Population(PPO, "CartPole-v1", **options).save(tmp_path / "population")
    _without_cnn(path, lambda meta: meta["population"]["config"])
    Population(PPO, "CartPole-v1", **options).resume(path)
    with pytest.warns(UnusedSettingWarning, match=r"^cnn=small has no effect: CartPole-v1 has no image observations"):
        other = Population(PPO, "CartPole-v1", cnn="small", **options)
    with pytest.raises(UserError, match=r"trained with cnn='auto', this population has 'small'"):
        other.resume(path)


class _Grid20(gym.Env):
    """20x20 RGB images (a size the strided CNN took over from the small one), a random walk of 20 steps."""

    observation_space = _image((20, 20, 3))
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), float(action == 1), False, False, {}


def test_rlspeed_train_resume_of_a_run_saved_before_cnn_keeps_its_small_cnn(tmp_path, monkeypatch):
    """A run's config.yaml of then holds no `cnn`: --resume took the default (auto: the strided CNN) and refused the
    run's own checkpoint ('holds networks built with cnn=nature_or_small'); it goes on with the network it has."""
    from rlspeed import cli

    gym.register("Grid20-v0", entry_point=_Grid20, max_episode_steps=20)
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "Grid20-v0", "--target-return", "none", "--no-progress", "--checkpoint-freq", "32",
            "--set", "num_envs=2", "--set", "num_steps=16", "--set", "n_epochs=1", "--set", "cnn_features_dim=8",
            "--out", "run"]
    try:
        assert cli.main([*argv, "--total-timesteps", "64", "--set", "cnn=nature_or_small"]) == 0
        config = tmp_path / "run" / "config.yaml"
        config.write_text("".join(line for line in config.read_text().splitlines(keepends=True)
                                  if not line.lstrip().startswith("cnn:")))
        _without_cnn(tmp_path / "run" / "checkpoint.safetensors", lambda meta: meta["config"])
        assert cli.main([*argv, "--total-timesteps", "128", "--resume"]) == 0
    finally:
        gym.registry.pop("Grid20-v0", None)
    assert PPO.load(tmp_path / "run" / "model.safetensors").policy.encoder.kind == "small CNN encoder"
