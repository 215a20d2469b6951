"""Observation spaces beyond float vectors (issue 20): the encoder each space gets, observations kept in their dtype
from the env to the storage, Dict storage, save/load of every policy kind, and one-sentence refusals.

Real envs where they are cheap: MiniGrid (Dict with a uint8 image, a Discrete direction and a text mission), MinAtar
(a bool 10x10x4 grid), FrozenLake (Discrete); both third-party packages are optional (the tests that need them skip).
Pendulum wrapped into a Dict / an image gives Box-action algorithms (SAC, TD3, DDPG) the same observation kinds.
"""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlspeed
from rlspeed.algos.recurrent_ppo import RecurrentPPO
from rlspeed.buffers import ReplayBuffer, RolloutBuffer
from rlspeed.envs import make_env
from rlspeed.envs.base import EnvSpec, check_observation_space, space_from_json, space_to_json
from rlspeed.envs.wrappers import DictRunningMeanStd
from rlspeed.errors import EncoderWarning, UserError
from rlspeed.nn import (
    CNNEncoder,
    FlattenEncoder,
    MultiInputEncoder,
    OneHotEncoder,
    image_shape,
    image_side,
    make_encoder,
)

SMALL = {"cnn_features_dim": 16, "net_arch": (16,)}
ON_POLICY = {"num_envs": 4, "num_steps": 8, "batch_size": 16, "n_epochs": 1, **SMALL}


def _box(shape, dtype=np.uint8, low=0, high=255):
    return gym.spaces.Box(low, high, shape, dtype)


@pytest.fixture(scope="module")
def minigrid_id():
    pytest.importorskip("minigrid")
    return "MiniGrid-DoorKey-5x5-v0"


@pytest.fixture(scope="module")
def minatar_id():
    minatar = pytest.importorskip("minatar.gym")
    minatar.register_envs()
    return "MinAtar/Breakout-v1"


# --- which encoder each space gets ---------------------------------------------------------------------------------
@pytest.mark.parametrize("space, kind, features", [
    (gym.spaces.Box(-1.0, 1.0, (5,)), None, None),  # float vectors: no encoder module (the plain-MLP path)
    (_box((84, 84, 3)), "Nature CNN encoder", 512),  # channels last
    (_box((4, 84, 84)), "Nature CNN encoder", 512),  # channels first
    (_box((7, 7, 3)), "small CNN encoder", 512),  # MiniGrid's 7x7: Nature-CNN's 8x8 kernel does not fit
    (gym.spaces.Box(np.zeros((10, 10, 4), bool), np.ones((10, 10, 4), bool), dtype=bool), "small CNN encoder",
     512),  # MinAtar
    (gym.spaces.Discrete(16), "one-hot encoder", 16),
    (gym.spaces.MultiDiscrete([3, 4]), "one-hot encoder", 7),
    (gym.spaces.MultiBinary(6), "flatten encoder", 6),
    (_box((6,), low=0, high=10), "flatten encoder", 6),  # uint8 vector, not an image
])
def test_encoder_is_chosen_from_the_observation_space(space, kind, features):
    encoder = make_encoder(space)
    assert (encoder.kind if encoder is not None else None) == kind
    if encoder is not None:
        assert encoder.features_dim == features


def test_image_channel_layout_is_detected_as_sb3_does():
    last, first = CNNEncoder(_box((84, 84, 3))), CNNEncoder(_box((3, 84, 84)))
    assert last.channels_last and not first.channels_last
    image = torch.randint(0, 256, (2, 84, 84, 3), dtype=torch.uint8)
    with torch.no_grad():
        first.load_state_dict(last.state_dict())
        # the same image channels-last and channels-first gives the same features
        assert torch.allclose(last(image), first(image.permute(0, 3, 1, 2).contiguous()), atol=1e-5)


def test_an_images_sides_are_read_alike_in_either_layout():
    """`image_shape` gives (channels, height, width) of a channels-first and a channels-last image alike, and the CNN
    built on each, the side `cnn=auto` picks by and the CNN it picks follow it (20 rows: the strided CNN)."""
    first, last = _box((3, 20, 60)), _box((20, 60, 3))
    assert image_shape(first) == image_shape(last) == (3, 20, 60)
    # (a tie of the first and last sides: channels last, 4 rows of 20, where the smallest-first rule read 4 channels)
    assert image_shape(_box((4, 20, 4), np.bool_, 0, 1)) == (4, 4, 20)
    assert image_shape(_box((20, 60))) is None and image_side(_box((20, 60))) is None
    assert image_side(first) == image_side(last) == 20
    cnn_first, cnn_last = CNNEncoder(first, 8), CNNEncoder(last, 8)
    assert cnn_first.arch == cnn_last.arch == "strided"
    assert cnn_first.linear[0].in_features == cnn_last.linear[0].in_features == 64 * 3 * 13  # (halved twice, less 2)


def test_uint8_images_are_scaled_to_unit_range_on_the_device_unless_told_not_to():
    """Features and weight gradients equal the unscaled encoder's on the image divided by 255."""
    space = _box((7, 7, 3))
    scaled, raw = CNNEncoder(space), CNNEncoder(space, normalize_images=False)
    raw.load_state_dict(scaled.state_dict())
    image = torch.randint(0, 256, (3, 7, 7, 3), dtype=torch.uint8)
    scaled(image).square().sum().backward()  # (the scaling is folded into the first convolution's weights)
    raw(image.float() / 255.0).square().sum().backward()
    for (name, mine), theirs in zip(scaled.named_parameters(), raw.parameters(), strict=True):
        # (float32 rounding of a different summation order: errors about 1e-7 of the largest gradient)
        scale = theirs.grad.abs().max().item()
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6 * scale, msg=name)
    with torch.no_grad():
        assert torch.allclose(scaled(image), raw(image.float() / 255.0), atol=1e-6)
    flat = make_encoder(space, encoder="mlp")
    assert isinstance(flat, FlattenEncoder) and torch.allclose(flat(image), image.flatten(1).float() / 255.0, atol=1e-7)


def test_one_hot_encodes_discrete_and_multi_discrete_observations():
    encoder = OneHotEncoder(gym.spaces.Discrete(3, start=2))
    assert encoder(torch.tensor([2, 4])).tolist() == [[1, 0, 0], [0, 0, 1]]
    multi = OneHotEncoder(gym.spaces.MultiDiscrete([2, 3]))
    assert multi(torch.tensor([[1, 0], [0, 2]])).tolist() == [[0, 1, 1, 0, 0], [1, 0, 0, 0, 1]]


def test_dict_observations_get_one_encoder_per_key_concatenated():
    space = gym.spaces.Dict({"image": _box((7, 7, 3)), "direction": gym.spaces.Discrete(4),
                             "state": gym.spaces.Box(-1.0, 1.0, (2,))})
    encoder = make_encoder(space, cnn_features_dim=8)
    assert isinstance(encoder, MultiInputEncoder) and encoder.features_dim == 8 + 4 + 2
    obs = {"image": torch.zeros(5, 7, 7, 3, dtype=torch.uint8), "direction": torch.tensor([0, 1, 2, 3, 0]),
           "state": torch.ones(5, 2)}
    features = encoder(obs)
    assert features.shape == (5, 14) and features[:, -2:].eq(1).all()  # the float key as it is, last in key order
    # a Tuple is a Dict keyed "0", "1", ...
    tuple_encoder = make_encoder(gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,)))))
    assert tuple_encoder.keys == ["0", "1"] and tuple_encoder.features_dim == 5


@pytest.mark.parametrize("shape, fix", [((2, 64, 64, 3), "fold the stacked frames into the channel axis"),
                                        ((50, 40), "give the frame a channel axis"),
                                        ((4, 84, 84, 1), r"ReshapeObservation\(env, \(4, 84, 84\)\)"),
                                        ((4, 3, 64, 64), r"ReshapeObservation\(env, \(12, 64, 64\)\)")])
def test_images_in_a_layout_the_cnn_does_not_take_are_flattened_with_a_warning(shape, fix):
    """Stacked colour frames (FrameStackObservation over RGB frames: 4-D) and a grey frame without its channel axis
    (2-D) went into an MLP, pixel by pixel, without a word (24,576 inputs for two 64x64 RGB frames); encoder='mlp'
    keeps that silently, and small integer tables are no images. Grey frames stacked with their channel axis
    (GrayscaleObservation(keep_dim=True) then FrameStackObservation) or channels-first frames are folded by a reshape,
    which the warning names with its shape."""
    with pytest.warns(UserWarning, match=rf"shape {re.escape(str(shape))} .* look like images.*{fix}"):
        assert isinstance(make_encoder(_box(shape)), FlattenEncoder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(make_encoder(_box(shape), encoder="mlp"), FlattenEncoder)
        assert isinstance(make_encoder(_box((10, 4))), FlattenEncoder)
        assert isinstance(make_encoder(_box((4, 84, 84))), CNNEncoder)


def test_a_dict_key_of_float_images_follows_the_solo_rule_and_its_warning_names_the_key():
    """Under encoder=auto a float image key in [0, 1] is flattened with the warning a float image Box alone gets,
    which names the key (it read as the whole observation's shape), and a uint8 image key gets a CNN; encoder=cnn
    gives the float key its CNN, encoder=mlp keeps the MLP without a warning."""
    space = gym.spaces.Dict({"camera": _box((3, 64, 64), dtype=np.float32, low=0.0, high=1.0),
                             "grid": _box((7, 7, 3)), "state": gym.spaces.Box(-1.0, 1.0, (2,))})
    with pytest.warns(UserWarning) as said:
        encoder = make_encoder(space, cnn_features_dim=8)
    assert len(said) == 1 and str(said[0].message).startswith(
        "The 'camera' observations of shape (3, 64, 64) (float32 in [0, 1]) look like images, but only uint8 Boxes in "
        "[0, 255] and bool Boxes get a CNN by themselves")
    assert set(encoder.encoders) == {"grid"} and isinstance(encoder.encoders["grid"], CNNEncoder)
    assert encoder.features_dim == 3 * 64 * 64 + 8 + 2
    assert isinstance(make_encoder(space, encoder="cnn", cnn_features_dim=8).encoders["camera"], CNNEncoder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make_encoder(space, encoder="mlp").encoders.keys() == {"grid"}


def test_encoder_overrides_that_do_not_fit_the_space_are_one_sentence():
    with pytest.raises(UserError, match="encoder=cnn needs image observations|CNN encoder needs image"):
        make_encoder(gym.spaces.Box(-1.0, 1.0, (4,)), encoder="cnn")
    with pytest.raises(UserError, match="Unknown encoder 'resnet'"):
        make_encoder(gym.spaces.Box(-1.0, 1.0, (4,)), encoder="resnet")
    with pytest.raises(UserError, match="encoder must be one of"):
        rlspeed.PPO("CartPole-v1", encoder="resnet")


@pytest.mark.parametrize("space, channels_last", [
    (_box((3, 40, 40), dtype=np.float32, low=0.0, high=1.0), False),  # float images in [0, 1], channels first
    (_box((40, 40, 3), low=0, high=10), True),  # uint8 of other bounds: no image to auto (nor to SB3)
])
def test_encoder_cnn_takes_any_3d_box_as_an_image_as_it_is(space, channels_last):
    """Float images in [0, 1] and uint8 Boxes of other bounds: `auto` flattens them with a warning naming
    encoder='cnn', which gives the CNN that SB3's CnnPolicy with normalize_images=False gives (they were refused as
    "no image observations", leaving an MLP over every pixel the only choice); the CNN takes them unscaled."""
    with pytest.warns(UserWarning, match=rf"shape {re.escape(str(space.shape))} .*pass encoder='cnn'"):
        assert not isinstance(make_encoder(space), CNNEncoder)
    cnn = make_encoder(space, encoder="cnn", cnn_features_dim=8)
    assert isinstance(cnn, CNNEncoder) and cnn.channels_last == channels_last and cnn.kind == "Nature CNN encoder"
    raw = CNNEncoder(space, 8, normalize_images=False)
    raw.load_state_dict(cnn.state_dict())
    obs = torch.as_tensor(np.stack([space.sample() for _ in range(2)]))
    with torch.no_grad():
        assert torch.equal(cnn(obs), raw(obs))  # unscaled: normalize_images scales only uint8 in [0, 255]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (an unbounded 3-D Box is no image)
        assert make_encoder(gym.spaces.Box(-np.inf, np.inf, (3, 40, 40))) is None
    dict_cnn = make_encoder(gym.spaces.Dict({"image": space, "state": gym.spaces.Discrete(2)}), encoder="cnn")
    assert isinstance(dict_cnn.encoders["image"], CNNEncoder)


@pytest.mark.parametrize("shape, fix", [((21, 37), r"ReshapeObservation\(env, \(1, 21, 37\)\)"),
                                        ((2, 64, 64, 3), "fold the stacked frames into the channel axis")])
def test_encoder_cnn_on_an_image_of_another_rank_names_the_wrapper_that_makes_it_3d(shape, fix):
    """A grey frame without its channel axis (GrayscaleObservation without keep_dim) or stacked colour frames: the
    refusal said only "use encoder=auto", which flattens them."""
    with pytest.raises(UserError, match=rf"{re.escape(str(shape))}.*{fix}") as error:
        make_encoder(_box(shape), encoder="cnn")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("shape, cnn, named", [
    ((35, 35, 3), "small",
     r"small CNN encoder of 35x35 images has 15\.7 million weights .*pass cnn='strided' \(--set cnn=strided"),
    ((3, 210, 160), "auto",
     r"Nature CNN encoder of 210x160 images has 11\.5 million .*ResizeObservation\(env, \(84, 84\)\)"),
])
def test_a_cnn_of_millions_of_linear_weights_warns_naming_the_resize(shape, cnn, named, monkeypatch):
    """A 35x35 image's small CNN has 480 times the linear weights of a 36x36 image's Nature CNN (the small CNN keeps
    the full size; the others stride), and a raw frame ten times Atari's 84x84, without a word: every update was that
    much slower."""
    monkeypatch.setattr(rlspeed.nn, "_init_conv_net", lambda module: None)  # (the orthogonal init takes seconds)
    with pytest.warns(UserWarning, match=named):
        make_encoder(_box(shape), cnn=cnn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_encoder(_box(shape), cnn_features_dim=64, cnn=cnn)  # (the fix it names)
        if cnn == "small":
            make_encoder(_box(shape))  # (auto: the strided CNN)
        make_encoder(_box((36, 36, 3)))
        make_encoder(_box((4, 84, 84)))


def test_the_large_cnn_warning_of_a_dict_key_names_the_key(monkeypatch):
    """A Dict observation's image key whose CNN crosses the size a warning starts at is said with its key (the
    warning read as of the whole observation); a Box alone is said without one."""
    monkeypatch.setattr(rlspeed.nn, "LARGE_CNN_WEIGHTS", 1_000)  # (12x12's small CNN: 2,048 outputs x 8)
    space = gym.spaces.Dict({"camera": _box((12, 12, 3)), "state": gym.spaces.Box(-1.0, 1.0, (2,))})
    with pytest.warns(EncoderWarning) as said:
        make_encoder(space, cnn_features_dim=8)
    assert [str(warning.message).split(" has ")[0] for warning in said] == [
        "The small CNN encoder of 12x12 images ('camera')"]
    with pytest.warns(EncoderWarning, match=r"^The small CNN encoder of 12x12 images has 0\.0 million weights in its "
                                            r"linear layer \(2,048 convolution outputs x cnn_features_dim 8\)"):
        make_encoder(_box((12, 12, 3)), cnn_features_dim=8)


# --- spaces no encoder handles ------------------------------------------------------------------------------------
@pytest.mark.parametrize("space, named", [
    (gym.spaces.Text(10), "Text"),
    (gym.spaces.Graph(gym.spaces.Box(-1.0, 1.0, (2,)), None), "Graph"),
    (gym.spaces.Sequence(gym.spaces.Discrete(3)), "Sequence"),
    (gym.spaces.Dict({"outer": gym.spaces.Dict({"inner": gym.spaces.Discrete(2)})}), "nested Dict"),
    (gym.spaces.Dict({"mission": gym.spaces.Text(10)}), "no key rlspeed can encode"),
    (gym.spaces.Box(-1.0, 1.0, ()), "scalar Box observation space"),  # (no axis for the networks to take)
    (gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,)), "t": gym.spaces.Box(0.0, 1.0, ())}),
     "scalar Box \\(shape \\(\\)\\) under the observation key 't'"),  # (the key named, with a fix that fits a Dict)
])
def test_spaces_no_encoder_handles_are_refused_in_one_sentence(space, named):
    with pytest.raises(UserError, match=named) as error:
        check_observation_space(space, "Some-v0")
    message = str(error.value)
    assert "\n" not in message and "'Some-v0'" in message and "gymnasium" in message  # names the fix


class _TextObservationEnv(gym.Env):
    observation_space = gym.spaces.Text(8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return "a", {}

    def step(self, action):
        return "b", 0.0, True, False, {}


def test_an_env_with_a_text_observation_is_refused_before_training():
    vector_env = gym.vector.SyncVectorEnv([_TextObservationEnv], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(UserError, match="Text observation space"):
        rlspeed.PPO(vector_env)


def test_an_unencodable_dict_key_is_dropped_with_one_warning_naming_it():
    space = gym.spaces.Dict({"image": _box((7, 7, 3)), "mission": gym.spaces.Text(10)})
    with pytest.warns(UserWarning, match="'mission' \\(Text\\)"):
        checked = check_observation_space(space, "Some-v0")
    assert list(checked.spaces) == ["image"]


def test_spaces_round_trip_through_strict_json():
    import json

    for space in [gym.spaces.Box(-np.inf, np.inf, (3,)), _box((7, 7, 3)), gym.spaces.Discrete(5, start=1),
                  gym.spaces.MultiDiscrete([2, 3]), gym.spaces.MultiBinary(4),
                  gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Box(0.0, 1.0, (2,))}),
                  gym.spaces.Box(np.array([-np.inf, 0.0]), np.array([1.0, 1.0])), gym.spaces.Box(-1.0, 1.0, ()),
                  gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)]:
        restored = space_from_json(json.loads(json.dumps(space_to_json(space), allow_nan=False)))
        assert restored == space and restored.dtype == space.dtype
    # an image's bounds are one number each, not one per pixel (checkpoint metadata and export sidecars hold them)
    assert len(json.dumps(space_to_json(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)))) < 200


# --- dtypes kept from the env to the storage ----------------------------------------------------------------------
def test_minigrid_dict_observations_stay_uint8_and_int64_from_env_to_rollout_storage(minigrid_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the dropped mission key: see test_an_unencodable_dict_key_...)
        env = make_env(minigrid_id, num_envs=2, seed=0)
    obs, _ = env.reset()
    assert obs["image"].dtype == torch.uint8 and obs["image"].shape == (2, 7, 7, 3)
    assert obs["direction"].dtype == torch.int64 and "mission" not in obs
    env.close()
    model = rlspeed.PPO(minigrid_id, seed=0, **ON_POLICY)
    seen = []  # what the CNN gets in the update: minibatches of uint8 rows, never a float copy of the rollout
    model.policy.encoder.encoders["image"].register_forward_pre_hook(lambda _, args: seen.append(
        (args[0].dtype, args[0].shape[0])))
    model.learn(64, progress_bar=False)
    buffer = model.buffer
    assert buffer.obs["image"].dtype == torch.uint8 and buffer.obs["direction"].dtype == torch.int64
    assert buffer.next_obs is None  # (stored once: see test_encoded_observations_are_stored_once_...)
    assert {dtype for dtype, _ in seen} == {torch.uint8}
    # rollout steps (4 rows), minibatches (16 rows), never the whole rollout (32 rows) at once
    assert max(rows for _, rows in seen) == ON_POLICY["batch_size"] < ON_POLICY["num_envs"] * ON_POLICY["num_steps"]
    # bytes per step: image 147 + direction 8, an int64 action, 4 float32 (log-prob, value, reward, final value), a
    # float64 episode return, 3 flags (terminated, done, episode end)
    assert buffer.bytes_per_step() == (147 + 8) + 8 + 4 * 4 + 8 + 3


def test_minatar_bool_images_stay_bool_in_the_replay_buffer_and_its_memory_report_counts_bytes(minatar_id):
    model = rlspeed.DQN(minatar_id, seed=0, learning_starts=32, batch_size=8, buffer_size=1000, **SMALL)
    model.learn(64, progress_bar=False)
    assert model.buffer.obs.dtype == torch.bool and model.buffer.next_obs.dtype == torch.bool
    assert model.buffer.bytes_per_transition == 2 * 400 + 4 * 3 + 8  # obs + next obs as bytes, 3 floats, an index
    assert "small CNN encoder" in model.report()


def test_replay_buffer_stores_dict_observations_per_key_and_samples_them_back():
    space = gym.spaces.Dict({"image": _box((2, 2, 1)), "id": gym.spaces.Box(-np.inf, np.inf, (1,))})
    buffer = ReplayBuffer(16, 2, space, (), torch.int64, "cpu")
    assert buffer.obs["image"].dtype == torch.uint8 and buffer.obs["id"].dtype == torch.float32
    for step in range(5):
        ids = torch.tensor([[2.0 * step], [2.0 * step + 1]])
        obs = {"image": ids.view(2, 1, 1, 1).expand(2, 2, 2, 1).to(torch.uint8), "id": ids}
        next_obs = {"image": obs["image"] + 100, "id": ids + 100}
        buffer.add(obs, torch.tensor([step, step]), ids.view(-1), next_obs, torch.zeros(2, dtype=torch.bool),
                   torch.zeros(2, dtype=torch.bool))
    batch = buffer.sample(64, generator=torch.Generator().manual_seed(0))
    ids = batch["obs"]["id"].view(-1)
    assert batch["obs"]["image"].dtype == torch.uint8
    assert torch.equal(batch["obs"]["image"][:, 0, 0, 0].float(), ids)  # each key's rows stay together
    assert torch.equal(batch["next_obs"]["id"].view(-1), ids + 100) and torch.equal(batch["rewards"], ids)
    assert torch.equal(batch["actions"].float(), torch.div(ids, 2, rounding_mode="floor"))


def test_n_step_steps_of_dict_observations_waiting_for_their_return_survive_save_and_load():
    """A 3-step buffer of Dict observations saved with two steps still waiting for their n-step return (each
    observation key a tensor of the checkpoint's) gives them back on load, per key: the transitions they complete
    are those of the buffer that kept going."""
    space = gym.spaces.Dict({"image": _box((2, 2, 1)), "id": gym.spaces.Box(-np.inf, np.inf, (1,))})

    def step(buffer, t):
        ids = torch.tensor([[2.0 * t], [2.0 * t + 1]])
        obs = {"image": ids.view(2, 1, 1, 1).expand(2, 2, 2, 1).to(torch.uint8), "id": ids}
        buffer.add(obs, torch.tensor([t, t]), ids.view(-1), {"image": obs["image"] + 100, "id": ids + 100},
                   torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))

    kept = ReplayBuffer(16, 2, space, (), torch.int64, "cpu", n_step=3, gamma=0.5)
    for t in range(4):
        step(kept, t)
    tensors, meta = kept.state_dict()
    assert meta["window"] == 2 and {"window.0.0.image", "window.0.0.id", "window.1.3.id"} <= set(tensors)
    loaded = ReplayBuffer(16, 2, space, (), torch.int64, "cpu", n_step=3, gamma=0.5)
    assert loaded.load_state_dict({name: value.clone() for name, value in tensors.items()}, meta) is None
    for t in range(4, 6):
        step(kept, t)
        step(loaded, t)
    assert len(loaded) == len(kept) == 8
    for key in ("image", "id"):
        assert torch.equal(loaded.obs[key][:8], kept.obs[key][:8]) and torch.equal(loaded.next_obs[key][:8],
                                                                                kept.next_obs[key][:8])
    assert torch.equal(loaded.rewards[:8], kept.rewards[:8]) and torch.equal(loaded.actions[:8], kept.actions[:8])


def test_rollout_buffer_stores_dict_observations_per_key():
    space = gym.spaces.Dict({"image": _box((3, 3, 1)), "direction": gym.spaces.Discrete(4)})
    buffer = RolloutBuffer(2, 3, space, (), torch.int64, torch.device("cpu"))
    obs = {"image": torch.full((3, 3, 3, 1), 7, dtype=torch.uint8), "direction": torch.tensor([0, 1, 3])}
    zeros = torch.zeros(3)
    buffer.add(1, obs, obs, torch.zeros(3, dtype=torch.int64), zeros, zeros, zeros, zeros.bool(), zeros.bool(),
               zeros.bool(), zeros)
    assert buffer.obs["image"].dtype == torch.uint8 and buffer.obs["image"][1].eq(7).all()
    assert buffer.obs["direction"][1].tolist() == [0, 1, 3] and buffer.obs["direction"][0].eq(0).all()


def test_dict_replay_buffer_survives_save_and_resume(minigrid_id, tmp_path):
    options = {"learning_starts": 10_000, "buffer_size": 512, "train_freq": 4, **SMALL}
    model = rlspeed.DQN(minigrid_id, seed=0, save_replay_buffer=True, **options)
    model.learn(64, progress_bar=False)
    model.save(tmp_path / "model")
    resumed = rlspeed.DQN(minigrid_id, seed=0, **options)
    resumed.resume(tmp_path / "model")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (Gymnasium envs restart their episodes on resume, with a warning)
        resumed.learn(4, progress_bar=False)
    for key in ("image", "direction"):
        assert torch.equal(resumed.buffer.obs[key][:64], model.buffer.obs[key][:64])


# --- every policy kind: save/load gives the same actions; predict takes numpy dicts --------------------------------
def _pendulum(kind: str, num_envs: int = 2) -> gym.vector.VectorEnv:
    """Pendulum-v1 whose observation is a Dict (the float state and a coarse uint8 image of it) or that image."""
    image_space = _box((6, 6, 1))

    def image(obs):
        return np.full((6, 6, 1), int((obs[0] + 1) * 100), dtype=np.uint8)

    if kind == "dict":
        space = gym.spaces.Dict({"state": gym.spaces.Box(-8.0, 8.0, (3,)), "image": image_space})

        def wrap(env):
            return gym.wrappers.TransformObservation(env, lambda o: {"state": o, "image": image(o)}, space)
    else:
        def wrap(env):
            return gym.wrappers.TransformObservation(env, image, image_space)
    return gym.make_vec("Pendulum-v1", num_envs=num_envs, vectorization_mode="sync", wrappers=[wrap],
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})


def _same_actions_after_load(model, tmp_path, obs):
    model.save(tmp_path / "model")
    loaded = type(model).load(tmp_path / "model")
    assert loaded.spec.observation_space == model.spec.observation_space
    if isinstance(model, RecurrentPPO):
        expected, _ = model.act_with_state(obs, None, None)
        got, _ = loaded.act_with_state(obs, None, None)
    else:
        expected, got = model.act(obs), loaded.act(obs)
    assert torch.equal(expected, got)
    return loaded


@pytest.mark.parametrize("algo", ["ppo", "a2c", "recurrent_ppo", "dqn"])
def test_discrete_action_policies_on_dict_observations_save_and_load(algo, minigrid_id, tmp_path):
    cls = {"ppo": rlspeed.PPO, "a2c": rlspeed.A2C, "recurrent_ppo": RecurrentPPO, "dqn": rlspeed.DQN}[algo]
    options = {"dqn": {"learning_starts": 16, "batch_size": 8, **SMALL},
               "a2c": {"num_envs": 4, **SMALL},
               "recurrent_ppo": {**ON_POLICY, "lstm_hidden_size": 8}}.get(algo, ON_POLICY)
    model = cls(minigrid_id, seed=0, **options)
    model.learn(64, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = make_env(minigrid_id, num_envs=3, seed=1)
    obs, _ = env.reset()
    env.close()
    _same_actions_after_load(model, tmp_path, obs)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_image_and_discrete_observation_policies_save_and_load(algo, minatar_id, tmp_path):
    cls = rlspeed.PPO if algo == "ppo" else rlspeed.DQN
    options = ON_POLICY if algo == "ppo" else {"learning_starts": 16, "batch_size": 8, **SMALL}
    for env_id in (minatar_id, "FrozenLake-v1"):
        model = cls(env_id, seed=0, **options)
        model.learn(64, progress_bar=False)
        obs, _ = make_env(env_id, num_envs=3, seed=1).reset()
        _same_actions_after_load(model, tmp_path, obs)


@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg", "ppo"])
@pytest.mark.parametrize("kind", ["dict", "image"])
def test_box_action_policies_on_dict_and_image_observations_save_and_load(algo, kind, tmp_path):
    cls = {"sac": rlspeed.SAC, "td3": rlspeed.TD3, "ddpg": rlspeed.DDPG, "ppo": rlspeed.PPO}[algo]
    options = ({"num_envs": 2, "num_steps": 8, "batch_size": 16, "n_epochs": 1, **SMALL} if algo == "ppo"
               else {"learning_starts": 16, "batch_size": 8, **SMALL})
    model = cls(_pendulum(kind), seed=0, **options)
    model.learn(48, progress_bar=False)
    assert model.update_summary()["implementation"] != "hand-derived"  # encoders train with the autograd reference
    obs, _ = make_env(_pendulum(kind, num_envs=3)).reset(seed=3)
    _same_actions_after_load(model, tmp_path, obs)


def _float_image_pendulum(num_envs: int) -> gym.vector.VectorEnv:
    """Pendulum seen as a float image in [0, 1], channels first (1, 6, 6)."""
    space = _box((1, 6, 6), dtype=np.float32, low=0.0, high=1.0)

    def wrap(env):
        return gym.wrappers.TransformObservation(env, lambda o: np.full((1, 6, 6), (o[0] + 1) / 2, np.float32), space)

    return gym.make_vec("Pendulum-v1", num_envs=num_envs, vectorization_mode="sync", wrappers=[wrap],
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})


def test_a_float_image_env_trains_with_encoder_cnn_keeps_float_storage_and_saves(tmp_path):
    """SAC with encoder=cnn trains a CNN on float images (they were refused as no image), stores the observations as
    float32, and a loaded model acts the same."""
    model = rlspeed.SAC(_float_image_pendulum(2), seed=0, encoder="cnn", learning_starts=16, batch_size=8, **SMALL)
    model.learn(32, progress_bar=False)
    assert isinstance(model.actor.encoder, CNNEncoder) and not model.actor.encoder.channels_last
    assert model.buffer.obs.dtype == torch.float32
    obs, _ = make_env(_float_image_pendulum(3)).reset(seed=3)
    _same_actions_after_load(model, tmp_path, obs)


def test_ppo_stores_the_float_images_it_encodes_once():
    """encoder=cnn on float images: PPO's rollout kept every next observation beside each observation (the storage of
    small float vectors), twice what uint8 images take, where encoded observations are stored once."""
    model = rlspeed.PPO(_float_image_pendulum(2), seed=0, encoder="cnn", **{**ON_POLICY, "num_envs": 2})
    model.learn(16, progress_bar=False)
    assert isinstance(model.policy.encoder, CNNEncoder)
    assert model.buffer.obs.dtype == torch.float32 and model.buffer.next_obs is None


_CNN_ALGOS = {"ppo": rlspeed.PPO, "dqn": rlspeed.DQN, "sac": rlspeed.SAC, "td3": rlspeed.TD3}


def _cnn_model(algo: str, minatar_id: str):
    """A small model of `algo` with CNN encoders (MinAtar's grid, or an image Pendulum for Box actions)."""
    env = minatar_id if algo in ("ppo", "dqn") else _pendulum("image")
    options = ON_POLICY if algo == "ppo" else {"learning_starts": 16, "batch_size": 8, **SMALL}
    return _CNN_ALGOS[algo](env, seed=0, **options)


@pytest.mark.parametrize("algo", sorted(_CNN_ALGOS))
def test_cnn_encoders_run_channels_last_on_the_cpu_with_the_contiguous_layouts_numbers(algo, minatar_id):
    """On the CPU (`DeviceRules.channels_last_convs`) every CNN encoder of a model (actors, critics, Q-networks and
    their targets) holds its convolution weights in channels-last memory and feeds them channels-last input; the
    features equal those of the same encoder in contiguous memory (same maths up to summation order)."""
    import copy

    model = _cnn_model(algo, minatar_id)
    modules = [m for m in model._modules().values() if isinstance(m, torch.nn.Module)]
    encoders = [m for module in modules for m in module.modules() if isinstance(m, CNNEncoder)]
    assert len(encoders) >= (1 if algo == "ppo" else 2)  # (off-policy: the online network's and the target's)
    obs = torch.as_tensor(np.stack([model.spec.observation_space.sample() for _ in range(5)]))
    for encoder in encoders:
        convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d)]
        assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
        contiguous = copy.deepcopy(encoder)
        for conv in (m for m in contiguous.modules() if isinstance(m, torch.nn.Conv2d)):
            conv.weight.data = conv.weight.data.contiguous()
        contiguous.input_format = torch.contiguous_format
        torch.testing.assert_close(encoder(obs), contiguous(obs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("algo", sorted(_CNN_ALGOS))
def test_a_loaded_cnn_model_takes_the_same_optimizer_step_as_the_original(algo, minatar_id, tmp_path):
    """Checkpoints store tensors contiguous; the loaded Adam moments of channels-last convolution weights must be
    put back in the weights' layout, or a fused Adam step applies each moment to another weight element. One step
    with the same gradients gives the original's weights exactly."""
    model = _cnn_model(algo, minatar_id)
    model.learn(64, progress_bar=False)
    loaded = type(model).load(model.save(tmp_path / "model"))
    stepped = []
    for m in (model, loaded):
        generator = torch.Generator().manual_seed(1)
        weights = []
        for optimizer in m._optimizers().values():
            for group in optimizer.param_groups:  # (PPO's annealed rate is not the loaded model's: the same for both)
                group["lr"] = 1e-3
            params = [p for group in optimizer.param_groups for p in group["params"]]
            for p in params:  # (a gradient in the parameter's own layout, as autograd gives it)
                p.grad = torch.empty_like(p).copy_(torch.randn(p.shape, generator=generator))
            optimizer.step()
            weights += [p.detach().clone() for p in params]
        stepped.append(weights)
    assert len(stepped[0]) == len(stepped[1]) > 0
    for original, reloaded in zip(*stepped):
        assert torch.equal(original, reloaded)


def test_float_vector_policies_keep_the_hand_derived_update():
    for model in (rlspeed.PPO("CartPole-v1", seed=0), rlspeed.DQN("CartPole-v1", seed=0),
                  rlspeed.SAC("Pendulum-v1", seed=0)):
        assert model.update_summary()["implementation"] == "hand-derived"
        assert getattr(model.policy, "encoder", None) is None


def test_predict_takes_a_numpy_dict_as_the_env_returns_it(minigrid_id):
    model = rlspeed.PPO(minigrid_id, seed=0, **ON_POLICY)
    env = gym.make(minigrid_id)
    obs, _ = env.reset(seed=0)  # with its text mission, which the model ignores
    action, _ = model.predict(obs)
    assert isinstance(action, np.integer) and action.shape == () and 0 <= int(action) < 7
    batch = {key: np.stack([obs[key]] * 3) for key in ("image", "direction")}
    actions, _ = model.predict(batch)
    assert actions.shape == (3,) and len(set(actions.tolist())) == 1  # deterministic: the same obs, the same action
    with pytest.raises(UserError, match="Dict observations"):
        model.predict(obs["image"])
    # keys of different batch sizes (a torch error from the encoder), a key of the wrong shape (the key unnamed)
    with pytest.raises(UserError, match=r"keys hold different numbers of rows \(direction 2, image 3\)"):
        model.predict({"image": batch["image"], "direction": batch["direction"][:2]})
    single = {"image": obs["image"][None], "direction": obs["direction"]}  # (a batch of one beside a lone index)
    assert model.predict(single)[0].shape == (1,)
    with pytest.raises(UserError, match="The observation's key 'image': This model takes observations of shape"):
        model.predict({"image": obs["image"][:3], "direction": obs["direction"]})


def test_predict_takes_a_tuple_env_s_observation_as_the_env_returns_it():
    """Blackjack-v1's Tuple(Discrete(32), Discrete(11), Discrete(2)): a single tuple and a vector env's tuple of arrays,
    the same actions as the dict keyed "0", "1", "2" the model's space is."""
    model = rlspeed.PPO("Blackjack-v1", seed=0, **ON_POLICY)
    obs, _ = gym.make("Blackjack-v1").reset(seed=0)
    assert isinstance(obs, tuple)
    action, _ = model.predict(obs, deterministic=True)
    keyed, _ = model.predict({str(i): value for i, value in enumerate(obs)}, deterministic=True)
    assert action.shape == () and action == keyed
    batch, _ = gym.make_vec("Blackjack-v1", num_envs=3).reset(seed=1)
    actions, _ = model.predict(batch, deterministic=True)
    expected = [model.predict(tuple(int(part[i]) for part in batch), deterministic=True)[0] for i in range(3)]
    assert actions.shape == (3,) and actions.tolist() == [int(a) for a in expected]
    # a list of observations, one tuple each (3 rows of a 3-element tuple: not to be read as one tuple of columns)
    rows = [tuple(int(part[i]) for part in batch) for i in range(3)]
    assert model.predict(rows, deterministic=True)[0].tolist() == actions.tolist()
    # rows as lists (`[list(o) for o in history]`) are rows too, however many
    assert model.predict([list(row) for row in rows], deterministic=True)[0].tolist() == actions.tolist()
    four = model.predict([list(row) for row in rows] + [list(obs)], deterministic=True)[0]
    assert four.tolist() == actions.tolist() + [int(action)]
    for wrong in (obs[0], obs[:2], [list(obs[:2])]):
        with pytest.raises(UserError, match="takes Tuple observations of 3 elements"):
            model.predict(wrong)
    # where a part is a vector, a list of lists is one observation, element by element (a JSON round trip)
    from rlspeed.algos.base import as_observation_batch

    vectors = check_observation_space(gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,)),) * 2), "Vectors-v0")
    batch, _, single = as_observation_batch([[0.1, 0.2], [0.3, 0.4]], vectors, torch.device("cpu"))
    assert single and torch.equal(batch["0"], torch.tensor([[0.1, 0.2]])) and torch.equal(batch["1"],
                                                                                   torch.tensor([[0.3, 0.4]]))


def test_a_tuple_of_eleven_elements_or_with_a_dropped_element_is_read_by_position():
    """Dict keys sort as text ("0", "1", "10", "2", ...) and an element no encoder takes is dropped ("0", "2"): a
    tuple still maps by position."""
    from rlspeed.algos.base import as_observation_batch

    eleven = check_observation_space(gym.spaces.Tuple([gym.spaces.Discrete(11)] * 11), "Eleven-v0")
    batch, _, single = as_observation_batch(tuple(range(11)), eleven, torch.device("cpu"))
    assert single and {key: int(value[0]) for key, value in batch.items()} == {str(i): i for i in range(11)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warning that the Text element is skipped)
        dropped = check_observation_space(gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Text(4),
                                                            gym.spaces.Discrete(4))), "Dropped-v0")
    batch, _, _ = as_observation_batch((2, "word", 3), dropped, torch.device("cpu"))
    assert {key: int(value[0]) for key, value in batch.items()} == {"0": 2, "2": 3}


def test_a_tuple_envs_space_is_said_as_the_tuple_it_gave(tmp_path):
    """Sentences describe a Tuple env's observations as the Tuple the env gave, not as the Dict of positions rlspeed
    keeps it as ("Dict('0': ..., '1': ...)"); an env's own Dict of digit keys stays a Dict."""
    from rlspeed.envs.base import space_text

    model = rlspeed.PPO("Blackjack-v1", seed=0, **ON_POLICY)
    model.save(tmp_path / "blackjack")
    tuple_text = "Tuple(Discrete(32), Discrete(11), Discrete(2))"
    with pytest.raises(UserError, match=r"trained on Blackjack-v1 \(observations " + re.escape(tuple_text)):
        rlspeed.PPO.load(tmp_path / "blackjack", env="FrozenLake-v1")
    with pytest.raises(UserError, match=r"the model's " + re.escape(tuple_text)):
        model.evaluate(env_id="FrozenLake-v1", episodes=1)
    digits = check_observation_space(gym.spaces.Dict({"0": gym.spaces.Discrete(3), "1": gym.spaces.Discrete(4)}),
                                     "Digits-v0")
    assert space_text(digits).startswith("Dict(")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warning that the Text element is skipped)
        dropped = check_observation_space(gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Text(4),
                                                            gym.spaces.Discrete(4))), "Dropped-v0")
    assert space_text(dropped) == "Tuple(0: Discrete(3), 2: Discrete(4))"


def test_observation_normalisation_applies_to_float_keys_only():
    env = make_env(_pendulum("dict"), normalize_obs=True)
    model = rlspeed.PPO(env, seed=0, num_steps=8, batch_size=16, n_epochs=1, **SMALL)
    model.learn(32, progress_bar=False)
    assert set(model.obs_rms.stats) == {"state"}
    assert model.buffer.obs["image"].dtype == torch.uint8 and model.buffer.obs["image"].max() > 1  # not normalised
    assert model.buffer.obs["state"].abs().max() <= 10.0  # normalised and clipped
    with pytest.raises(UserError, match="normalize_obs applies to float vector observations"):
        make_env(_pendulum("image"), normalize_obs=True)
    with pytest.raises(UserError, match="normalize_obs applies to float vector observations"):  # (when made, not
        rlspeed.PPO("FrozenLake-v1", normalize_obs=True)  # at learn: it accepted them before)


def test_evaluating_on_an_env_with_other_observations_is_refused():
    model = rlspeed.PPO("FrozenLake-v1", seed=0)
    with pytest.raises(UserError, match="does not fit this model"):
        model.evaluate(episodes=1, env_id="Taxi-v3" if "Taxi-v3" in gym.registry else "Taxi-v4")


def test_env_spec_defaults_to_float_vectors_for_native_envs():
    spec = EnvSpec("X-v0", (3,), gym.spaces.Discrete(2), None, None)
    assert spec.observation_space == gym.spaces.Box(-np.inf, np.inf, (3,)) and spec.float_vector_obs


def test_encoded_observations_are_stored_once_with_the_same_bootstrap_values(minigrid_id):
    """Images are not stored a second time as next observations: the bootstrap values of finished rows are taken
    during the rollout instead, and GAE gets the same advantages as from stored next observations."""

    class StoringNextObs(rlspeed.PPO):
        def _start(self, env, total_timesteps):
            super()._start(env, total_timesteps)
            buf = self.buffer
            self.buffer = RolloutBuffer(buf.num_steps, buf.num_envs, self.spec.observation_space, (), buf.actions.dtype,
                                        self.device, store_next_obs=True)

    results = []
    for cls in (rlspeed.PPO, StoringNextObs):
        # 2 envs x 300 steps: MiniGrid's time limit (250) truncates episodes, whose bootstrap values matter
        model = cls(minigrid_id, seed=0, num_envs=2, num_steps=300, batch_size=600, n_epochs=1, **SMALL)
        captured = {}

        def capture(buf, advantages, returns, captured=captured):
            captured.update(advantages=advantages, truncated=(buf.dones & ~buf.terminated).sum())
            return {}

        model._update_rollout = capture
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.learn(600, progress_bar=False)
        results.append((model.buffer, captured))
    (stored_once, once), (stored_twice, twice) = results
    assert stored_once.next_obs is None and stored_twice.next_obs is not None
    assert stored_once.bytes_per_step() < stored_twice.bytes_per_step() - 147  # one image (7x7x3 bytes) less
    assert int(once["truncated"]) > 0
    torch.testing.assert_close(once["advantages"], twice["advantages"], rtol=1e-5, atol=1e-5)


def test_gym_packages_calls_a_modules_register_envs_once(recwarn):
    """`--gym-packages minatar.gym`: that module only defines register_envs(); rlspeed calls it (once)."""
    pytest.importorskip("minatar")
    import gymnasium as gym

    from rlspeed.envs import import_gym_packages

    import_gym_packages(["minatar.gym"])
    import_gym_packages(["minatar.gym"])
    assert "MinAtar/Breakout-v1" in gym.registry
    assert not [w for w in recwarn if "Overriding environment" in str(w.message)]


FAMILY_IDS = [("MinAtar/Breakout-v1", "minatar"), ("MiniGrid-DoorKey-5x5-v0", "minigrid")]


@pytest.fixture(scope="module")
def fresh_family_ids():
    """One fresh interpreter (nothing imported or registered first) that checks that no id of `FAMILY_IDS` whose
    package is installed is registered, then makes each one's spec: (the process, {id: its action count})."""
    import importlib.util
    import subprocess
    import sys

    ids = [env_id for env_id, package in FAMILY_IDS if importlib.util.find_spec(package) is not None]
    code = ("import gymnasium as gym; from rlspeed.envs import env_spec\n"
            f"for env_id in {ids!r}:\n    assert env_id not in gym.registry, env_id\n"
            f"for env_id in {ids!r}:\n    print(env_id, env_spec(env_id).action_space.n)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return done, dict(line.rsplit(" ", 1) for line in done.stdout.splitlines() if line.rsplit(" ", 1)[0] in ids)


@pytest.mark.parametrize("env_id, package", FAMILY_IDS)
def test_a_minatar_or_minigrid_id_registers_its_package_without_gym_packages(env_id, package, fresh_family_ids):
    """As for Atari ids: the id alone is enough (a fresh interpreter, nothing imported or registered first)."""
    pytest.importorskip(package)
    done, actions = fresh_family_ids
    assert done.returncode == 0, done.stderr
    assert int(actions[env_id]) > 1


def test_a_family_id_without_its_package_names_the_pip_command(monkeypatch):
    import importlib.util

    from rlspeed.envs import env_spec

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "minatar" else real(name, *a))
    with pytest.raises(UserError, match="MinAtar envs need minatar: pip install minatar"):
        env_spec("MinAtar/NoSuchGame-v1")


def test_a_square_channel_tie_is_read_as_channels_last():
    """MinAtar Seaquest's 10x10x10 bool grid is height x width x channels: a tie does not make it channels first."""
    import gymnasium as gym
    import numpy as np

    from rlspeed.nn import image_channels_first

    assert image_channels_first(gym.spaces.Box(0, 1, (10, 10, 10), dtype=np.bool_)) is False
    assert image_channels_first(gym.spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8)) is True
    assert image_channels_first(gym.spaces.Box(0, 255, (84, 84, 3), dtype=np.uint8)) is False


def test_dict_statistics_keep_their_names_inside_a_parent_module():
    """Per-key names (`<key>.mean`) alone and under a parent's prefix; a strict load refuses missing statistics."""
    stats = DictRunningMeanStd({"pos": (3,), "stats": (2,)})
    stats.update({"pos": torch.randn(16, 3) + 5, "stats": torch.randn(16, 2)})
    parent = torch.nn.Module()
    parent.obs_rms = stats
    names = set(parent.state_dict())
    assert names == {f"obs_rms.{k}.{s}" for k in ("pos", "stats") for s in ("mean", "var", "count")}
    assert set(stats.state_dict()) == {f"{k}.{s}" for k in ("pos", "stats") for s in ("mean", "var", "count")}
    other = torch.nn.Module()
    other.obs_rms = DictRunningMeanStd({"pos": (3,), "stats": (2,)})
    other.load_state_dict(parent.state_dict())
    for name, value in parent.state_dict().items():
        assert torch.equal(other.state_dict()[name], value)
    fresh = DictRunningMeanStd({"pos": (3,), "stats": (2,)})
    fresh.load_state_dict(stats.state_dict())
    assert torch.equal(fresh.stats["pos"].mean, stats.stats["pos"].mean)
    with pytest.raises(RuntimeError):
        fresh.load_state_dict({"pos.mean": torch.zeros(3)})


def test_predict_refuses_a_discrete_observation_outside_its_space():
    """A one-hot encoder indexes by the observation: a value outside Discrete(n) would fail inside torch."""
    model = rlspeed.DQN("FrozenLake-v1", device="cpu", seed=0)
    assert model.predict(15)[0] in range(4)
    for wrong in (16, [1, -1]):
        with pytest.raises(UserError, match=r"outside Discrete\(16\) \(values from 0 to 15\)"):
            model.predict(wrong)
    assert model.predict(3.0)[0] == model.predict(3)[0]
    for cut in (3.5, [1.0, 2.5]):  # (cast to 3 and [1, 2] without a word before)
        with pytest.raises(UserError, match=r"predict takes whole numbers for Discrete\(16\)"):
            model.predict(cut)


def test_predict_refuses_a_multi_discrete_observation_of_another_length_in_one_sentence():
    """The shape is checked before the values: MultiDiscrete([3, 3, 3])'s per-component bounds broadcast against a
    7-vector, which failed inside torch ("The size of tensor a (7) must match the size of tensor b (3)")."""
    space = gym.spaces.MultiDiscrete([3, 3, 3])
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", wrappers=[
        lambda env: gym.wrappers.TransformObservation(env, lambda o: (o[:3] > 0).astype(np.int64), space)],
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = rlspeed.PPO(env, seed=0, num_envs=2, num_steps=8, batch_size=16, net_arch=(16,))
    assert model.predict(np.array([2, 0, 1]))[0] in range(2)
    for wrong in (np.zeros(7, np.int64), torch.zeros(2, 4, dtype=torch.int64), [[0, 1]]):
        with pytest.raises(UserError, match=r"^This model takes observations of shape \(3,\) \(one\) or \(N, 3\) "):
            model.predict(wrong)


def test_predict_refuses_observations_it_would_change_silently():
    """A NaN observation (a policy's argmax of NaN is action 0), a float image in [0, 1] as a tensor (the uint8 cast
    would make it black), an image value past 255 (the cast would wrap it to 0) and a fractional Discrete tensor (cut
    to the index below): one sentence each, numpy or tensor alike."""
    cartpole = rlspeed.PPO("CartPole-v1", seed=0, device="cpu")
    for bad in (np.array([np.nan, 0, 0, 0], np.float32), torch.tensor([[0.1, 0, 0, 0], [0, 0, float("inf"), 0]])):
        with pytest.raises(UserError, match=r"holds (nan at position \[0\]|inf at position \[1, 2\]) for Box"):
            cartpole.predict(bad)
    image = rlspeed.PPO(_pendulum("image", 4), seed=0, **ON_POLICY)
    frame = np.random.default_rng(0).integers(0, 256, image.spec.observation_space.shape, dtype=np.uint8)
    assert image.predict(frame)[0] == image.predict(torch.from_numpy(frame))[0].numpy()
    for scaled in (frame / 255.0, torch.from_numpy(frame / 255.0)):
        with pytest.raises(UserError, match=r"whole numbers .*not scaled to \[0, 1\]"):
            image.predict(scaled)
    wrapped = frame.astype(np.int64)
    wrapped.flat[5] = 256
    with pytest.raises(UserError, match=r"holds 256 at position .*\(torch.uint8: 0 to 255\)"):
        image.predict(wrapped)
    frozen = rlspeed.DQN("FrozenLake-v1", device="cpu", seed=0)
    with pytest.raises(UserError, match=r"predict takes whole numbers for Discrete\(16\)"):
        frozen.predict(torch.tensor(3.5))
    assert frozen.predict(torch.tensor(3))[0] == frozen.predict(3)[0]
    # narrower integers fit as they are (EnvPool's int32 indices; an int8 image), and a float64 past float32's range
    # is the infinity the cast makes of it
    for narrow in (np.array([3], np.int32), np.array([3], np.int8), torch.tensor([3], dtype=torch.int32)):
        assert frozen.predict(narrow)[0].tolist() == [int(frozen.predict(3)[0])]
    assert image.predict((frame // 2).astype(np.int8))[0] == image.predict(frame // 2)[0]
    with pytest.raises(UserError, match=r"holds inf at position \[0\] for Box"):
        cartpole.predict(np.full(4, 1e300))


def test_predict_refuses_a_multibinary_observation_other_than_zeros_and_ones():
    """A MultiBinary observation is bits: a 2 is outside the space (the network would take it as a value it never
    trained on, silently)."""
    space = gym.spaces.MultiBinary(4)
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync", wrappers=[
        lambda env: gym.wrappers.TransformObservation(env, lambda o: (o > 0).astype(np.int8), space)],
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = rlspeed.PPO(env, seed=0, num_envs=4, num_steps=8, batch_size=16, net_arch=(16,))
    assert model.predict(np.array([1, 0, 1, 1], dtype=np.int8))[0] in range(2)
    for wrong in ([1, 0, 2, 1], [[0, 0, 0, 0], [0, -1, 0, 0]]):
        with pytest.raises(UserError, match=r"holds (2 at position \[2\]|-1 at position \[1, 1\]), outside "
                                            r"MultiBinary\(4\) \(values 0 and 1\)"):
            model.predict(np.array(wrong))


def test_predict_refuses_an_observation_of_no_numbers_not_converting_it():
    """None was NaN (refused as "an observation holds nan ... find where the env produced it"), the string "3" the
    index 3 and a complex observation its real part, silently; numbers of mixed types are still taken."""
    cartpole = rlspeed.PPO("CartPole-v1", seed=0, device="cpu")
    frozen = rlspeed.DQN("FrozenLake-v1", device="cpu", seed=0)
    for model, wrong in ((cartpole, None), (cartpole, [0.1, None, 0.2, 0.3]), (cartpole, np.zeros(4, np.complex64)),
                         (frozen, "3"), (frozen, np.array(["1", "2"]))):
        with pytest.raises(UserError, match=r"^predict takes observations of shape \((4,)?\) \(or a batch of them\) "
                                            r"as numbers, got "):
            model.predict(wrong)
    mixed = [np.float32(0.1), 0, 0.2, np.int8(1)]
    assert cartpole.predict(mixed)[0] == cartpole.predict(np.array(mixed, np.float32))[0]


def test_a_uint64_observation_past_int64_is_refused_naming_the_value_given():
    """A uint64 index past int64's range was refused as the negative number its cast made of it ("holds -1" for
    2**64 - 1): the value named is the one given."""
    frozen = rlspeed.DQN("FrozenLake-v1", device="cpu", seed=0)
    with pytest.raises(UserError, match=r"^An observation holds 18446744073709551615, outside what Discrete\(16\)"):
        frozen.predict(np.uint64(2**64 - 1))
    with pytest.raises(UserError, match=r"^An observation holds 9223372036854775808 at position \[1\], outside"):
        frozen.predict(np.array([3, 2**63], np.uint64))
    assert frozen.predict(np.array([3], np.uint64))[0].tolist() == [int(frozen.predict(3)[0])]


def test_predict_refuses_a_bool_observation_other_than_zeros_and_ones():
    """A bool Box observation (MinAtar's grid) takes 0 and 1: the cast to bool made 0.5, 2, -1 and NaN True, and the
    policy acted on a grid the caller never gave."""
    space = gym.spaces.Box(0, 1, (4,), bool)
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync", wrappers=[
        lambda env: gym.wrappers.TransformObservation(env, lambda o: o > 0, space)],
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = rlspeed.PPO(env, seed=0, num_envs=4, num_steps=8, batch_size=16, net_arch=(16,))
    bits = np.array([[True, False, True, True], [False, False, True, False]])
    expected = model.predict(bits)[0]
    for same in (bits.astype(np.float32), bits.astype(np.uint8), torch.from_numpy(bits).double()):
        assert np.array_equal(np.asarray(model.predict(same)[0]), expected)
    for wrong, value in ((bits * 0.5, r"0\.5"), (np.where(bits, np.nan, 0.0), "nan"), (bits * 2, "2"),
                         (torch.from_numpy(bits).long() - 2, "-1")):
        with pytest.raises(UserError, match=rf"^predict takes 0 and 1 \(False and True\) for Box\(False, True, "
                                            rf"\(4,\), bool\); an observation holds {value} at position \[0, 0\]"):
            model.predict(wrong)


@pytest.mark.parametrize("space", [
    gym.spaces.MultiBinary(4), gym.spaces.Box(-1.0, 1.0, (4,)),
    gym.spaces.Dict({"bits": gym.spaces.MultiBinary(4), "index": gym.spaces.Discrete(3)})])
def test_predict_on_an_empty_batch_gives_an_empty_batch_of_actions(space):
    """A batch of 0 observations (a server's empty request) gives 0 actions whatever the encoder: the flatten encoder's
    reshape to [0, -1] failed inside torch ("cannot reshape tensor of 0 elements")."""
    def observe(o):
        bits = (o > 0).astype(np.int8)
        if isinstance(space, gym.spaces.Dict):
            return {"bits": bits, "index": int(bits[:2].sum())}
        return bits if isinstance(space, gym.spaces.MultiBinary) else np.tanh(o).astype(np.float32)

    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", wrappers=[
        lambda env: gym.wrappers.TransformObservation(env, observe, space)],
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = rlspeed.PPO(env, seed=0, num_envs=2, num_steps=8, batch_size=16, net_arch=(16,))
    one = space.sample()
    empty = ({key: np.zeros((0, *np.shape(value)), np.asarray(value).dtype) for key, value in one.items()}
             if isinstance(one, dict) else np.zeros((0, 4), space.dtype))
    actions, _ = model.predict(empty)
    assert actions.shape == (0,) and actions.dtype == np.int64
    tensors = ({key: torch.from_numpy(value) for key, value in empty.items()} if isinstance(empty, dict)
               else torch.from_numpy(empty))
    assert model.predict(tensors)[0].shape == (0,)


def test_load_and_resume_keep_the_image_scale_and_take_gsde_options_without_gsde(tmp_path):
    """normalize_images decides the scale a CNN's weights were trained on (same shapes, another input): load and
    resume refuse another value, as they refuse another activation. gSDE's full_std with use_sde off builds nothing:
    load takes it (with the warning that it does nothing)."""
    from rlspeed.errors import UnusedSettingWarning

    path = rlspeed.PPO(_pendulum("image", 4), seed=0, **ON_POLICY).save(tmp_path / "model")
    with pytest.raises(UserError, match="holds networks built with normalize_images=True"):
        rlspeed.PPO.load(path, normalize_images=False)
    with pytest.raises(UserError, match="holds networks built with normalize_images=True"):
        rlspeed.PPO(_pendulum("image", 4), normalize_images=False, **ON_POLICY).resume(path)
    with pytest.warns(UnusedSettingWarning, match="full_std=False has no effect"):
        assert rlspeed.PPO.load(path, full_std=False).config.full_std is False


class _OutOfSpace(gym.Env):
    """An env whose observation leaves its Discrete or MultiDiscrete space at the fifth step (a bug of its own)."""

    def __init__(self, kind: str = "multi"):
        self.kind = kind
        inner = gym.spaces.Discrete(4) if kind.startswith("discrete") else gym.spaces.MultiDiscrete([3, 3])
        self.observation_space = gym.spaces.Dict({"cell": inner}) if kind == "dict" else inner
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self, value):
        if self.kind == "discrete_array":  # (a Discrete value as a one-element array)
            return np.array([value])
        obs = np.array([value, 1]) if self.kind != "discrete" else value
        return {"cell": obs} if self.kind == "dict" else obs

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(0), {}

    def step(self, action):
        self.t += 1
        return self._obs(4 if self.t == 5 else 1), 1.0, False, self.t >= 20, {}


@pytest.mark.parametrize("kind", ["multi", "discrete", "dict"])
@pytest.mark.parametrize("vector", ["sync", "async"])
def test_an_observation_outside_its_discrete_space_is_one_sentence(kind, vector):
    """MultiDiscrete([3, 3]) observation [4, 1] was one-hot encoded into the second component's slots (trained on
    silently), and a Discrete value past n failed with a raw index error (a device assert on a GPU)."""
    make = gym.vector.SyncVectorEnv if vector == "sync" else gym.vector.AsyncVectorEnv
    env = make([lambda: _OutOfSpace(kind)] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        model = rlspeed.PPO(env, device="cpu", num_envs=2, num_steps=16)
        with pytest.raises(rlspeed.UserError, match=r"observation value 4.*outside its observation space"):
            model.learn(64, progress_bar=False)
    finally:
        env.close()


gym.register("OutOfSpace-v0", entry_point=_OutOfSpace, disable_env_checker=True)


@pytest.mark.parametrize("kind, message", [
    ("discrete", r"'OutOfSpace-v0'\.step\(\) returned the observation value 4 outside its observation space"),
    ("discrete_array", r"'OutOfSpace-v0'\.reset\(\) returned an observation of shape \(1,\) where its "
                       r"observation_space declares \(\)")])
def test_a_registered_envs_observation_outside_its_discrete_space_names_it(kind, message):
    """A registered env's refused observation was told as "An env returned ...", naming neither the env nor its
    method, and a Discrete value returned as a one-element array failed in Gymnasium's batching as the env's own error,
    "The env 'X' raised ValueError in reset(): Output array has wrong dimensionality". Both name the env and the method
    now, as other breaches of the contract do."""
    model = rlspeed.PPO("OutOfSpace-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8,
                        batch_size=16, env_kwargs={"kind": kind})
    with pytest.raises(rlspeed.UserError, match=message) as raised:
        model.learn(16, progress_bar=False)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("space, observation, message", [
    (gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(3))), (np.zeros(2, np.float32),),
     r"'X' returned an observation without the part 1 its observation_space declares \(1 part\)"),
    (gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32), "b": gym.spaces.Discrete(3)}),
     (np.zeros(2, np.float32), 1), r"'X' returned an observation without the key 'a' its observation_space declares "
                                   r"\(2 values\)")])
def test_an_observation_without_a_part_of_its_tuple_or_dict_space_names_the_part(space, observation, message):
    """A Tuple observation lacking a position was refused as lacking "the key '1'" (the space is keyed "0", "1", ...
    by then), and a tuple returned for a Dict space failed as int('a')'s ValueError. Each names the missing part of
    the space now, as the user's env declares it."""
    from rlspeed.envs.gymnasium_env import HostObservations

    host = HostObservations(check_observation_space(space, "X"), "'X'")
    with pytest.raises(UserError, match=message):
        host.write(host.empty(1), 0, observation)


def test_a_keyed_observations_part_is_reached_by_its_layout_key():
    """`HostObservations.part` is the one way to a keyed observation's part (an env adapter finding which call
    returned a refused batch used the class's private helper): a Tuple's position by its key "0", "1", ..., a Dict's
    entry by its key, and a missing part raises for the caller to name it."""
    from rlspeed.envs.gymnasium_env import HostObservations

    assert HostObservations.part((np.zeros(2), 7), "1") == 7
    assert HostObservations.part({"a": 1, "b": 2}, "b") == 2
    with pytest.raises(IndexError):
        HostObservations.part((np.zeros(2),), "1")


def _registered_sampling_env(env_id: str, observation_space: gym.Space) -> str:
    """`env_id`, registered as a Gymnasium env of random observations of `observation_space`, two actions, episodes
    of 2 steps."""

    class Sampling(gym.Env):
        action_space = gym.spaces.Discrete(2)

        def __init__(self):
            self.observation_space = observation_space

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, False, True, {}

    if env_id not in gym.registry:
        gym.register(env_id, entry_point=Sampling, max_episode_steps=2)
    return env_id


def test_a_dict_observation_space_with_keys_that_are_not_text_is_one_sentence_at_model_creation():
    """`Dict({0: Box, 1: Box})`: saved models and exports name each part by a text key, which the env's own
    observation (int keys) would not match; the model is refused when made, naming the keys and the wrapper that
    fixes it (before: its keys became "0", "1", the first reset failed with "raised KeyError in reset(): '0'")."""
    env_id = _registered_sampling_env("RlspeedTest/IntKeyedDict-v0", gym.spaces.Dict(
        {0: gym.spaces.Box(-1.0, 1.0, (3,)), 1: gym.spaces.Box(-1.0, 1.0, (2,))}))
    with pytest.raises(UserError, match=r"^'RlspeedTest/IntKeyedDict-v0' has a Dict observation space with keys that "
                                        r"are not text \(0, 1\); .*gymnasium.ObservationWrapper"):
        rlspeed.PPO(env_id, num_envs=2, num_steps=8, batch_size=16, device="cpu")


def test_an_encoder_warning_is_said_when_the_model_is_made_not_again_at_load_or_eval(tmp_path, capsys):
    """Flattened images warn when the model is made, naming the setting in Python's and the command line's form;
    `load` and `rlspeed eval` of its file said it again each time (and only as encoder='mlp'), a population once per
    member."""
    from rlspeed import cli
    from rlspeed.population import Population

    # (grey frames without a channel axis: flattened with a warning)
    env_id = _registered_sampling_env("RlspeedTest/GreyFrames-v0", gym.spaces.Box(0, 255, (20, 16), np.uint8))
    with pytest.warns(EncoderWarning, match=r"pass encoder='mlp' \(--set encoder=mlp\) to keep the MLP"):
        model = rlspeed.PPO(env_id, num_envs=2, num_steps=8, batch_size=16, net_arch=[8], device="cpu")
    path = model.save(tmp_path / "grey")
    with warnings.catch_warnings():
        warnings.simplefilter("error", EncoderWarning)
        rlspeed.PPO.load(path, device="cpu")
        assert cli.main(["eval", str(path), "--episodes", "1", "--device", "cpu"]) == 0
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        Population(rlspeed.PPO, env_id, seeds=[0, 1, 2], num_envs=2, num_steps=8, batch_size=16, net_arch=[8],
                   device="cpu")
    assert [warning.category for warning in said].count(EncoderWarning) == 1  # (not once per member)
