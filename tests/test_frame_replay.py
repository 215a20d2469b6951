"""Frame-deduplicated replay (`FrameStackReplayBuffer`): the stacks it rebuilds are exactly those the dense buffer
stores, for the same inserts, across episode starts (both padding styles), lost lives that end the learner's episode
but not the game, truncation, wrap-around, n-step returns and several envs; checkpoints and the Atari run use it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlspeed.buffers import FrameStackReplayBuffer, ReplayBuffer, SharedObservationReplayBuffer
from rlspeed.buffers.replay import _HostStaging

STACK, SIDE = 4, 3
SPACE = gym.spaces.Box(0, 255, (STACK, SIDE, SIDE), np.uint8)


class FrameStacker:
    """N envs of frame stacks as the batched contract gives them (SAME_STEP autoreset, `final_obs`, the restarted
    rows on the host), with random episode ends: terminations, truncations and lost lives (terminated, but the game
    goes on, as `AtariTraining` does). Every frame is distinct, so a frame from the wrong place shows."""

    def __init__(self, num_envs: int, seed: int, padding: str = "reset", end_rate: float = 0.08):
        self.num_envs, self.padding, self.end_rate = num_envs, padding, end_rate
        self.rng = np.random.default_rng(seed)
        self.counter = 0
        self.stacks = np.stack([self._first() for _ in range(num_envs)])

    def _frame(self) -> np.ndarray:
        self.counter += 1
        return self.rng.integers(1, 256, (SIDE, SIDE), dtype=np.uint8)

    def _first(self) -> np.ndarray:
        frame = self._frame()
        if self.padding == "reset":  # Gymnasium's FrameStackObservation: the first frame repeated
            return np.stack([frame] * STACK)
        return np.stack([np.zeros_like(frame)] * (STACK - 1) + [frame])

    def _next(self, stack: np.ndarray) -> np.ndarray:
        return np.concatenate((stack[1:], self._frame()[None]))

    def step(self):
        obs = torch.as_tensor(self.stacks.copy())
        final = np.stack([self._next(stack) for stack in self.stacks])
        draw = self.rng.random(self.num_envs)
        terminated = draw < self.end_rate
        truncated = (draw >= self.end_rate) & (draw < 1.5 * self.end_rate)
        lost_life = (draw >= 1.5 * self.end_rate) & (draw < 2.5 * self.end_rate)  # terminated, same game
        restarted = np.flatnonzero(terminated | truncated)
        self.stacks = final.copy()
        for row in restarted:
            self.stacks[row] = self._first()
        return (obs, torch.as_tensor(final), torch.as_tensor(terminated | lost_life), torch.as_tensor(truncated),
                restarted)


def buffers(capacity, num_envs, n_step=1, mask_size=None):
    args = (capacity, num_envs, SPACE, (), torch.int64, "cpu")
    return (ReplayBuffer(*args, n_step=n_step, gamma=0.9, mask_size=mask_size),
            FrameStackReplayBuffer(*args, n_step=n_step, gamma=0.9, mask_size=mask_size))


def fill(dense, lean, env, steps, give_rows=True, generator=None):
    generator = generator or torch.Generator().manual_seed(0)
    for _ in range(steps):
        obs, final, terminated, truncated, restarted = env.step()
        actions = torch.randint(0, 4, (env.num_envs,), generator=generator)
        rewards = torch.randn(env.num_envs, generator=generator)
        masks = None
        if dense.next_action_masks is not None:
            masks = torch.rand(env.num_envs, 4, generator=generator) < 0.5
        dense.add(obs, actions, rewards, final, terminated, truncated, masks)
        lean.add(obs, actions, rewards, final, terminated, truncated, masks, restarted if give_rows else None)


def assert_same_rows(dense, lean):
    """Every transition the frame buffer holds equals the dense buffer's in the same storage row."""
    assert (lean.pos, len(lean)) == (dense.pos, len(dense))
    index = (torch.arange(len(lean)) + lean.pos - len(lean)) % lean.capacity
    want, got = dense.gather(index), lean.gather(index)
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key


@pytest.mark.parametrize(("capacity", "num_envs", "n_step", "padding"),
                         [(40, 1, 1, "reset"), (30, 3, 1, "reset"), (30, 3, 1, "zeros"), (36, 4, 3, "reset"),
                          (500, 2, 1, "reset"), (25, 5, 2, "zeros")])
def test_rebuilt_stacks_equal_the_dense_buffers(capacity, num_envs, n_step, padding):
    dense, lean = buffers(capacity, num_envs, n_step)
    env = FrameStacker(num_envs, seed=capacity + num_envs, padding=padding)
    for _ in range(12):  # up to several wrap-arounds, checked after each stretch
        fill(dense, lean, env, 7)
        assert_same_rows(dense, lean)
    assert lean.evicted == 0
    # the same generator draws the same rows from both
    for want, got in zip(dense.sample_batches(3, 16, generator=torch.Generator().manual_seed(5)),
                         lean.sample_batches(3, 16, generator=torch.Generator().manual_seed(5))):
        assert all(torch.equal(want[key], got[key]) for key in want)


def test_without_the_restarted_rows_every_finished_row_is_stored_whole_and_stays_exact():
    dense, lean = buffers(30, 3)
    told, told_env = buffers(30, 3)[1], FrameStacker(3, seed=1)
    env = FrameStacker(3, seed=1)
    fill(dense, lean, env, 40, give_rows=False)
    fill(buffers(30, 3)[0], told, told_env, 40)
    assert_same_rows(dense, lean)
    assert lean._frames_written > told._frames_written  # lost lives were stored as restarts: more frames, same data


def test_masks_are_stored_per_row():
    dense, lean = buffers(30, 2, n_step=3, mask_size=4)
    fill(dense, lean, FrameStacker(2, seed=3), 50)
    assert_same_rows(dense, lean)


@pytest.mark.parametrize(("capacity", "num_envs", "n_step", "end_rate"), [(64, 2, 1, 0.5), (97, 5, 2, 0.2)])
def test_when_episodes_restart_too_often_the_oldest_rows_are_given_up_never_corrupted(capacity, num_envs, n_step,
                                                                                      end_rate):
    """More restarts than the reserve allows (0.5: three in four steps end an episode); 97 rows of 5 envs: writes
    that wrap around in part."""
    dense, lean = buffers(capacity, num_envs, n_step)
    env = FrameStacker(num_envs, seed=capacity + n_step, end_rate=end_rate)
    for _ in range(20):
        fill(dense, lean, env, 9)
        assert sum(rows for _, rows in lean._floors) == len(lean)
        index = (torch.arange(len(lean)) + lean.pos - len(lean)) % lean.capacity
        want, got = dense.gather(index), lean.gather(index)
        assert all(torch.equal(want[key], got[key]) for key in want)
    assert lean.evicted > 0
    assert "given up" in lean.describe()
    batch = lean.sample(256, generator=torch.Generator().manual_seed(0))  # samples only the rows it still holds
    valid = {tuple(row.flatten().tolist()) for row in dense.gather(index)["obs"]}
    assert all(tuple(row.flatten().tolist()) in valid for row in batch["obs"])


def fill_alike(buffers_, env, steps, device="cpu"):
    """The same steps (restarted rows given) into every buffer of `buffers_`, from tensors on `device`."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        obs, final, terminated, truncated, restarted = env.step()
        actions = torch.randint(0, 4, (env.num_envs,), generator=generator)
        rewards = torch.randn(env.num_envs, generator=generator)
        masks = torch.rand(env.num_envs, 4, generator=generator) < 0.5
        for buffer in buffers_:
            buffer.add(*(v.to(device) for v in (obs, actions, rewards, final, terminated, truncated, masks)),
                       reset_rows=restarted)


@pytest.mark.parametrize("layout", [ReplayBuffer, FrameStackReplayBuffer])
@pytest.mark.parametrize("n_step", [1, 3])
def test_host_storage_samples_what_device_storage_samples(layout, n_step):
    """The host-storage path (storage rows gathered into reused staging tensors, copied to the device from there; new
    frames brought in through staging) stores and samples exactly what device storage does, and a batch it returned
    is not overwritten by the next sample. Here the CPU stands in for the accelerator, with unpinned staging (pinning
    needs CUDA): the path's arithmetic, not its transfers."""
    args = (30, 3, SPACE, (), torch.int64, "cpu")
    device_storage = layout(*args, n_step=n_step, gamma=0.9, mask_size=4)
    host_storage = layout(*args, n_step=n_step, gamma=0.9, mask_size=4)
    host_storage._staging = _HostStaging(torch.device("cpu"), pin=False)
    fill_alike((device_storage, host_storage), FrameStacker(3, seed=2), 40)
    assert_same_rows(device_storage, host_storage)
    want = device_storage.sample_batches(3, 16, generator=torch.Generator().manual_seed(5))
    got = host_storage.sample_batches(3, 16, generator=torch.Generator().manual_seed(5))
    assert len(got) == 3 and want[0].keys() == got[0].keys()
    for want_batch, got_batch in zip(want, got):
        assert all(torch.equal(want_batch[key], got_batch[key]) for key in want_batch)
    host_storage.sample_batches(3, 16, generator=torch.Generator().manual_seed(6))
    for want_batch, got_batch in zip(want, got):
        assert all(torch.equal(want_batch[key], got_batch[key]) for key in want_batch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", [ReplayBuffer, FrameStackReplayBuffer])
def test_pinned_host_storage_on_cuda_samples_exactly_without_a_pin_per_sample(layout, monkeypatch):
    """Storage in pinned host memory feeding CUDA: what it stores and samples equals the same rows gathered on the
    host and moved to the device, and sampling pins nothing (the staging tensors are pinned once)."""
    host_storage = layout(30, 3, SPACE, (), torch.int64, "cuda", n_step=2, gamma=0.9, mask_size=4,
                          storage_device="cpu")
    host_only = layout(30, 3, SPACE, (), torch.int64, "cpu", n_step=2, gamma=0.9, mask_size=4)
    fill_alike((host_storage,), FrameStacker(3, seed=2), 40, device="cuda")
    fill_alike((host_only,), FrameStacker(3, seed=2), 40)
    assert host_storage.frames.is_pinned() if layout is FrameStackReplayBuffer else host_storage.obs.is_pinned()
    assert_same_rows(host_only, host_storage)

    def refuse(*args, **kwargs):
        raise AssertionError("pin_memory() in the sampling path")

    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)
    index = torch.randint(0, len(host_only), (2 * 16,), generator=torch.Generator().manual_seed(5))
    if len(host_only) < host_only.capacity:  # (sampling draws among the stored rows, in ring order)
        index = (index + host_only.pos - len(host_only)) % host_only.capacity
    expected = host_only.gather(index)
    for _ in range(2):  # (the second sample reuses the staging tensors)
        got = host_storage.sample_batches(2, 16, generator=torch.Generator().manual_seed(5))
        for k, batch in enumerate(got):
            for key, value in batch.items():
                assert value.device.type == "cuda"
                assert torch.equal(value.cpu(), expected[key][16 * k:16 * (k + 1)]), key


def test_observations_that_are_not_frame_stacks_are_refused():
    _, lean = buffers(30, 1)
    obs = torch.randint(0, 255, (1, STACK, SIDE, SIDE), dtype=torch.uint8)
    with pytest.raises(ValueError, match="not frame stacks"):
        lean.add(obs, torch.zeros(1, dtype=torch.int64), torch.zeros(1), obs.flip(1), torch.zeros(1, dtype=torch.bool),
                 torch.zeros(1, dtype=torch.bool), reset_rows=[])


def test_state_dict_round_trip_continues_exactly():
    dense, lean = buffers(30, 3, n_step=2)
    env = FrameStacker(3, seed=6)
    fill(dense, lean, env, 25)
    tensors, meta = lean.state_dict()
    restored = buffers(30, 3, n_step=2)[1]
    assert restored.load_state_dict(tensors, meta) is None
    assert_same_rows(dense, restored)
    fill(dense, restored, env, 25)  # (the restored buffer stores the next observations whole: the same stacks)
    assert_same_rows(dense, restored)
    assert "layout" in buffers(30, 3, n_step=2)[0].load_state_dict(tensors, meta)  # a dense buffer refuses it


def test_one_frame_per_transition_and_the_footprint_says_so():
    atari = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    dense = ReplayBuffer(1000, 1, atari, (), torch.int64, "cpu")
    lean = FrameStackReplayBuffer(20_000, 1, atari, (), torch.int64, "cpu")
    frame, row = 84 * 84, 4 * 3 + 8  # a frame; rewards, terminated, discounts and the int64 action
    assert dense.bytes_per_transition == 8 * frame + row
    # one frame per row, plus the reserve for restarted episodes and eight int32 frame indices
    assert lean.pool_size == 20_000 + 20_000 // 16 + 5 * 5
    assert lean.nbytes == lean.pool_size * frame + 20_000 * (8 * 4 + row)
    assert lean.bytes_per_transition == lean.nbytes / 20_000 < 1.07 * frame + 8 * 4 + row
    assert lean.nbytes == sum(t.numel() * t.element_size() for t in lean.storage_tensors().values()) + \
        lean.frames.numel()
    assert "frames: each frame stored once" in lean.describe() and "bytes per transition" in lean.describe()
    assert lean.summary()["layout"] == "frames" and dense.summary()["layout"] == "dense"


def _atari():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from rlspeed.envs import atari, make_env

    atari.register_atari()
    return make_env


def test_breakout_frames_rebuild_exactly_what_the_env_gave():
    """The training env's own frame stacks (lost lives end learner episodes, games restart), stored side by side."""
    make_env = _atari()
    env = make_env("BreakoutNoFrameskip-v4", num_envs=2, seed=0, backend="gymnasium", device="cpu")
    space = env.spec.observation_space
    dense = ReplayBuffer(96, 2, space, (), torch.int64, "cpu")
    lean = FrameStackReplayBuffer(96, 2, space, (), torch.int64, "cpu")
    obs, _ = env.reset()
    generator = torch.Generator().manual_seed(0)
    lives_lost = restarts = 0
    for _ in range(300):
        actions = torch.randint(0, 4, (2,), generator=generator)
        next_obs, reward, terminated, truncated, info = env.step(actions)
        dense.add(obs, actions, reward, info["final_obs"], terminated, truncated)
        lean.add(obs, actions, reward, info["final_obs"], terminated, truncated, reset_rows=info["final_rows"])
        lives_lost += int(terminated.sum()) - len(info["final_rows"])
        restarts += len(info["final_rows"])
        obs = next_obs
    env.close()
    assert lives_lost >= 2 and restarts >= 1  # both kinds of episode end, and several wrap-arounds (600 rows, 96)
    assert_same_rows(dense, lean)


def test_dqn_on_atari_runs_on_the_frame_layout_and_its_replay_survives_resume(tmp_path):
    _atari()
    from rlspeed import DQN

    options = dict(device="cpu", env_backend="gymnasium", encoder="cnn", net_arch=(), buffer_size=256,
                   learning_starts=64, batch_size=16, target_update_interval=64, num_envs=2, train_freq=4)
    model = DQN("BreakoutNoFrameskip-v4", seed=0, save_replay_buffer=True, **options)
    model.learn(320, progress_bar=False)
    assert model.buffer.layout == "frames" and model.replay_summary()["layout"] == "frames"
    assert "frames: each frame stored once" in model.report()
    assert all(bool(torch.isfinite(p).all()) for p in model.q_network.parameters())
    buffer = model.buffer
    assert len(buffer) == buffer.capacity  # (640 transitions went through 256 rows)
    saved = buffer.gather(torch.arange(buffer.capacity))
    model.save(tmp_path / "dqn")
    resumed = DQN("BreakoutNoFrameskip-v4", seed=0, **options)
    resumed.resume(tmp_path / "dqn")
    with pytest.warns(UserWarning):  # (Gymnasium envs restart their games on resume, with a warning)
        resumed.learn(8, progress_bar=False)  # one iteration: 4 steps of 2 envs, in the 8 rows after `pos`
    untouched = (torch.arange(8, buffer.capacity) + buffer.pos) % buffer.capacity
    restored = resumed.buffer.gather(untouched)
    assert all(torch.equal(saved[key][untouched], restored[key]) for key in saved)
    assert resumed.buffer.pos == (buffer.pos + 8) % buffer.capacity

    dense = DQN("BreakoutNoFrameskip-v4", seed=0, frame_dedup=False, **options)
    dense.learn(8, progress_bar=False)
    assert dense.buffer.layout == "dense" and "dense" in dense.report()


# --- images that are not frame stacks: each observation stored once (`SharedObservationReplayBuffer`) -----------


class ImageStream(FrameStacker):
    """N envs of single images (channel-last `[S, S, 3]`, uint8 or bool) as the batched contract gives them, with the
    same random episode ends as `FrameStacker` (lost lives included): a next observation is a new image."""

    def __init__(self, num_envs: int, seed: int, dtype=np.uint8, end_rate: float = 0.08):
        self.dtype = dtype
        super().__init__(num_envs, seed, end_rate=end_rate)

    def _image(self) -> np.ndarray:
        image = self.rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
        return image if self.dtype == np.uint8 else image < 128

    def _first(self) -> np.ndarray:
        return self._image()

    def _next(self, stack: np.ndarray) -> np.ndarray:
        return self._image()


def image_buffers(capacity, num_envs, dtype=np.uint8, n_step=1, mask_size=None):
    space = gym.spaces.Box(0, 255 if dtype == np.uint8 else 1, (SIDE, SIDE, 3), dtype)
    args = (capacity, num_envs, space, (), torch.int64, "cpu")
    return (ReplayBuffer(*args, n_step=n_step, gamma=0.9, mask_size=mask_size),
            SharedObservationReplayBuffer(*args, n_step=n_step, gamma=0.9, mask_size=mask_size))


@pytest.mark.parametrize(("capacity", "num_envs", "n_step", "dtype", "give_rows"),
                         [(40, 1, 1, np.uint8, True), (30, 3, 1, np.bool_, True), (36, 4, 3, np.uint8, True),
                          (25, 5, 2, np.bool_, False), (500, 2, 1, np.uint8, True)])
def test_images_stored_once_equal_the_dense_buffers(capacity, num_envs, n_step, dtype, give_rows):
    """Each observation stored once gives back exactly the dense buffer's transitions, in their dtype, across episode
    starts, lost lives, truncations, wrap-around and n-step returns, told the restarted rows or not."""
    dense, lean = image_buffers(capacity, num_envs, dtype, n_step, mask_size=4)
    env = ImageStream(num_envs, seed=capacity + num_envs, dtype=dtype)
    for _ in range(12):
        fill(dense, lean, env, 7, give_rows=give_rows)
        assert_same_rows(dense, lean)
    assert lean.evicted == 0 and lean.frames.dtype == dense.obs.dtype == torch.as_tensor(np.zeros(1, dtype)).dtype
    for want, got in zip(dense.sample_batches(3, 16, generator=torch.Generator().manual_seed(5)),
                         lean.sample_batches(3, 16, generator=torch.Generator().manual_seed(5))):
        assert all(torch.equal(want[key], got[key]) for key in want)
    tensors, meta = lean.state_dict()  # a checkpoint's buffer continues exactly
    restored = image_buffers(capacity, num_envs, dtype, n_step, mask_size=4)[1]
    assert restored.load_state_dict(tensors, meta) is None
    fill(dense, restored, env, 9, give_rows=give_rows)
    assert_same_rows(dense, restored)


def test_images_stored_once_take_about_half_the_dense_bytes():
    minatar = gym.spaces.Box(0, 1, (10, 10, 4), np.bool_)
    dense = ReplayBuffer(16_000, 1, minatar, (), torch.int64, "cpu")
    lean = SharedObservationReplayBuffer(16_000, 1, minatar, (), torch.int64, "cpu")
    row = 4 * 3 + 8
    assert dense.bytes_per_transition == 2 * 400 + row
    assert lean.pool_size == 16_000 + 16_000 // 4 + 2 * 2  # a row's observation, and first ones of restarts
    assert lean.nbytes == lean.pool_size * 400 + 16_000 * (2 * 4 + row) == \
        sum(t.numel() * t.element_size() for t in lean.storage_tensors().values()) + lean.frames.numel()
    assert lean.bytes_per_transition < 0.65 * dense.bytes_per_transition
    assert lean.summary()["layout"] == "observations" and "each stored once" in lean.describe()


def test_images_stored_once_continue_exactly_after_the_envs_restart():
    """The learn loop restarts the envs (a rollback of non-finite weights) between any two steps: the next add starts
    afresh, also between the first and the second (where the continuity check runs)."""
    dense, lean = image_buffers(30, 2)
    env = ImageStream(2, seed=4)
    for steps in (1, 5, 1, 7):
        fill(dense, lean, env, steps)
        env.stacks = np.stack([env._first() for _ in range(2)])  # (the envs restarted outside the step loop)
        dense.restart_episodes()
        lean.restart_episodes()
    fill(dense, lean, env, 9)
    assert_same_rows(dense, lean)


def test_observations_that_do_not_continue_are_refused():
    """An env whose next step does not start from the observation it gave as next (not the batched contract) is
    refused at the second step rather than stored wrong."""
    _, lean = image_buffers(30, 2)
    env = ImageStream(2, seed=0, end_rate=0.0)
    obs, final, terminated, truncated, restarted = env.step()
    lean.add(obs, torch.zeros(2, dtype=torch.int64), torch.zeros(2), final, terminated, truncated, reset_rows=restarted)
    obs, final, terminated, truncated, restarted = env.step()
    with pytest.raises(ValueError, match="do not continue"):
        lean.add(obs.flip(1), torch.zeros(2, dtype=torch.int64), torch.zeros(2), final, terminated, truncated,
                 reset_rows=restarted)


def test_dqn_on_minatar_stores_each_observation_once_and_trains_as_the_dense_layout(monkeypatch):
    """Same seed, same samples: the layout changes the bytes, not one weight of the trained network. Images are
    stored once where storing them twice takes 1 GiB or more (here: from 0 bytes); below, and with
    frame_dedup=False, twice."""
    pytest.importorskip("minatar")
    from rlspeed import DQN
    from rlspeed.algos import off_policy

    options = dict(device="cpu", env_backend="gymnasium", buffer_size=300, learning_starts=100, batch_size=16,
                   target_update_interval=50, num_envs=2, train_freq=4, seed=3)
    small = DQN("MinAtar/Breakout-v1", **options)
    small.learn(8, progress_bar=False)
    monkeypatch.setattr(off_policy, "_SHARED_OBSERVATIONS_BYTES", 2 * 300 * 400)  # this buffer's two copies
    lean = DQN("MinAtar/Breakout-v1", **options)
    lean.learn(800, progress_bar=False)
    dense = DQN("MinAtar/Breakout-v1", frame_dedup=False, **options)
    dense.learn(800, progress_bar=False)
    assert small.replay_summary()["layout"] == "dense"
    assert lean.replay_summary()["layout"] == "observations" and dense.replay_summary()["layout"] == "dense"
    assert lean.buffer.bytes_per_transition < 0.7 * dense.buffer.bytes_per_transition
    for (name, want), got in zip(dense.q_network.state_dict().items(), lean.q_network.state_dict().values()):
        assert torch.equal(want, got), name


def test_demonstrations_in_a_replay_buffer_you_fill_name_frame_dedup_where_the_model_stores_images_once(monkeypatch):
    """A ReplayBuffer of demonstrations (dense: the documented way) given to a model whose buffer stores each image
    once was 'another replay layout or other observation keys'; it names frame_dedup=False, which takes it."""
    pytest.importorskip("minatar")
    from rlspeed import DQN
    from rlspeed.algos import off_policy
    from rlspeed.errors import UserError

    monkeypatch.setattr(off_policy, "_SHARED_OBSERVATIONS_BYTES", 0)
    options = dict(device="cpu", env_backend="gymnasium", buffer_size=100, learning_starts=100, num_envs=1, seed=0)
    lean = DQN("MinAtar/Breakout-v1", **options)
    space = lean.observation_space
    demos = ReplayBuffer(20, 1, space, (), torch.int64, "cpu")
    for _ in range(20):
        demos.add(torch.zeros((1, *space.shape), dtype=torch.bool), torch.tensor([1]), torch.ones(1),
                  torch.zeros((1, *space.shape), dtype=torch.bool), torch.tensor([False]), torch.tensor([False]))
    lean.load_replay_buffer(demos)
    with pytest.raises(UserError, match=r"it stores observations whole \(a ReplayBuffer's dense layout\), and this "
                                        r"model's buffer stores each observation once: make the model with "
                                        r"frame_dedup=False"):
        lean.learn(4, progress_bar=False)
    dense = DQN("MinAtar/Breakout-v1", frame_dedup=False, **options)
    dense.load_replay_buffer(demos)
    dense.learn(4, progress_bar=False)
    assert len(dense.buffer) == 24
