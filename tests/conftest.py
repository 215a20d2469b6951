"""Shared test setup: one torch thread (the suite runs on a few shared cores) and small helpers."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from rlspeed.device import major_minor
from rlspeed.envs.base import BatchedEnv, EnvSpec
from rlspeed.export import EXPORT_MIN_TORCH
from rlspeed.files import process_running

# Small RL networks are fastest on one thread, and the test machine is shared: no oversubscription.
torch.set_num_threads(1)
os.environ.setdefault("RLSPEED_NUM_THREADS", "1")
# The tests' subprocesses (the CLI, torchrun workers, fresh interpreters) import the rlspeed this process imported: a
# relative PYTHONPATH, or an editable install of another checkout, would have them test other code than the suite.
_SOURCE = Path(importlib.util.find_spec("rlspeed").origin).resolve().parents[1]
if _SOURCE.name == "src":
    _PATHS = [str(_SOURCE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(_PATHS)
# The signal tests send SIGHUP to the CLI's processes, which keep a signal they were started ignoring ignored (nohup's
# SIGHUP, as a user's `nohup rlspeed train` asks): a suite started under nohup gives its processes the default again.
if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
#: a session's cache directory is <temp dir>/rlspeed-tests-cache-<the session's process id>-<random>
TESTS_CACHE_PREFIX = "rlspeed-tests-cache-"


def forget_killed_sessions_caches(directory: str) -> None:
    """Remove the cache directories in `directory` of test sessions that were killed before their end (`timeout`'s
    SIGTERM, a cancelled CI job: no exit handler ran), found by their process ids no longer running."""
    for path in Path(directory).glob(f"{TESTS_CACHE_PREFIX}*-*"):
        pid = path.name[len(TESTS_CACHE_PREFIX):].partition("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and path.is_dir() and not path.is_symlink() \
                and not process_running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


# The tests' caches are their own (rlspeed's accel decisions, matplotlib's fonts, W&B's logs): a test that searches a
# precision must not find what an earlier run on this machine decided, nor leave anything in the user's home (or in
# the temp directory: removed when the tests end, or by the next session where they were killed).
forget_killed_sessions_caches(tempfile.gettempdir())
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix=f"{TESTS_CACHE_PREFIX}{os.getpid()}-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)
os.environ.setdefault("SB3_LOGDIR", os.path.join(os.environ["XDG_CACHE_HOME"], "sb3"))  # (else a /tmp/SB3-* per learn)
os.environ.setdefault("MPLCONFIGDIR", os.path.join(os.environ["XDG_CACHE_HOME"], "matplotlib"))
os.environ.setdefault("WANDB_CACHE_DIR", os.path.join(os.environ["XDG_CACHE_HOME"], "wandb"))
os.environ.setdefault("WANDB_CONFIG_DIR", os.path.join(os.environ["XDG_CACHE_HOME"], "wandb-config"))
os.environ.pop("RLSPEED_CACHE_DIR", None)  # (a test that wants one sets it: isolated_accel)
# Gymnasium before 1.3 (rlspeed's floor is 1.1) names its Taxi "Taxi-v3": the tests' and the docs' "Taxi-v4" is that
# env there (the same TaxiEnv, time limit and threshold)
if "Taxi-v4" not in gym.registry and "Taxi-v3" in gym.registry:
    gym.register("Taxi-v4", entry_point=gym.spec("Taxi-v3").entry_point, max_episode_steps=200, reward_threshold=8)
# The tests that Ctrl-C a run expect Python's SIGINT handling, in this process and in those it starts; a shell's
# background job (`pytest &`, `nohup ... &`) starts with SIGINT ignored, which every process started from it inherits
# (rlspeed keeps a signal ignored at start ignored, by design): the tests run as from a terminal, wherever started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: Box2D envs (LunarLander, BipedalWalker) need the `box2d` extra; CI installs it, `pip install -e ".[test]"` does not
needs_box2d = pytest.mark.skipif(importlib.util.find_spec("Box2D") is None,
                                 reason='needs Box2D: pip install -e ".[box2d]"')
#: MinAtar's and MiniGrid's envs (the image and Dict tasks); CI installs both
needs_minatar = pytest.mark.skipif(importlib.util.find_spec("minatar") is None,
                                   reason="needs MinAtar: pip install MinAtar")
needs_minigrid = pytest.mark.skipif(importlib.util.find_spec("minigrid") is None,
                                    reason="needs MiniGrid: pip install minigrid")
#: Atari games: ale-py (its wheel ships the ROMs) and OpenCV for the preprocessing; CI installs both (`atari` extra)
needs_atari = pytest.mark.skipif(importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
                                 reason='needs ale-py and OpenCV: pip install -e ".[atari]"')
#: EnvPool (its Atari games need no ale-py); CI installs it (`envpool` extra)
needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None,
                                   reason='needs EnvPool: pip install -e ".[envpool]"')
#: torch's fp32_precision settings (reduced-precision matmul regions) and size-independent CPU exponential draws
#: (A2C's rollout noise drawn at once equals its per-step draws) came with torch 2.9; pyproject allows torch 2.6
needs_torch_2_9 = pytest.mark.skipif(major_minor(torch.__version__) < (2, 9), reason="needs torch 2.9 or newer")
#: ONNX and .pt2 export (older torch is refused with a sentence)
_EXPORT_TORCH = ".".join(map(str, EXPORT_MIN_TORCH))
needs_torch_export = pytest.mark.skipif(major_minor(torch.__version__) < EXPORT_MIN_TORCH,
                                        reason=f"ONNX and .pt2 export need torch {_EXPORT_TORCH} or newer")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True, scope="session")
def _run_outside_the_tree(tmp_path_factory):
    """The suite runs in a scratch working directory: files libraries drop into the working directory (MuJoCo's
    MUJOCO_LOG.TXT, a default runs/ directory) land there, not in the source tree."""
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(previous)


@pytest.fixture(autouse=True)
def _plots_only_where_asked(request, monkeypatch):
    """A run's end-of-run plots (learning_curve.png, a population's learning_curves.png) are drawn only in the tests
    marked `plots`: matplotlib's drawing is most of a short training test's time, and the other tests assert nothing
    of the picture. A test that checks a run's files, or calls the plot functions itself, is marked `plots`."""
    if request.node.get_closest_marker("plots") is None:
        from rlspeed.logging import RunLogger
        from rlspeed.population import plot

        monkeypatch.setattr(RunLogger, "plot", lambda self: None)
        monkeypatch.setattr(plot, "plot_learning_curves", lambda summary, path: None)


@pytest.fixture
def isolated_accel(tmp_path, monkeypatch):
    """For acceleration tests: an own strategy cache, no forced strategy, a short timing budget."""
    from rlspeed.accel import search

    monkeypatch.setenv("RLSPEED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    monkeypatch.setattr(search, "TIMING_BUDGET_S", 0.03)
    monkeypatch.setattr(search, "ROUNDS", 3)


def update(step, *inputs, accelerated: bool = True):
    """One update through an `accelerate_step` `step`, or (`accelerated=False`) through the plain loop it stands for:
    zero_grad, its loss's backward, its optimizers' step (the reference the accelerated step must match)."""
    if accelerated:
        return step(*inputs)
    for optimizer in step.optimizers:
        optimizer.zero_grad()
    loss = step.loss_fn(*inputs)
    loss.backward()
    for optimizer in step.optimizers:
        optimizer.step()
    return loss


def cli_error(capsys, argv: list[str]) -> str:
    """The one error line (`rlspeed: error: ...`) of an `rlspeed` command that must exit with code 2."""
    from rlspeed import cli

    assert cli.main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("rlspeed: error: ")
    return lines[0]


def run_in_ascii_locale(script: str) -> str:
    """Run the Python `script` in a process of an ASCII locale without UTF-8 mode (LC_ALL=C, PYTHONUTF8=0: the
    file-name and text encodings ASCII); its stdout, asserting that it succeeded."""
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    done = subprocess.run([sys.executable, "-X", "utf8=0", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def read_only_directory(monkeypatch, directory) -> None:
    """Make `directory` behave as on a read-only file system for rlspeed's writability check (`rlspeed.files.
    unwritable`, a temporary file made there), also where the tests run as root, whom permissions do not stop."""
    import errno

    real = tempfile.TemporaryFile

    def temporary_file(*args, dir=None, **kwargs):
        if dir is not None and os.path.samefile(dir, directory):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", temporary_file)


@pytest.fixture
def run_dir(tmp_path):
    """A fresh, not yet existing run directory under pytest's tmp_path."""
    return tmp_path / "run"


def plain_and_fused(algo, env_id: str, fused_type: type, **config):
    """Two models with the same initial weights: autograd's update (fused_update=False) and the hand-derived one."""
    models = []
    for fused in (False, True):
        torch.manual_seed(0)
        models.append(algo(env_id, device="cpu", seed=0, fused_update=fused, **config))
    plain, fused = models
    assert plain._update_step.hand_derived is None and plain.update_summary()["implementation"] == "autograd"
    assert isinstance(fused._update_step.hand_derived, fused_type)
    assert fused.update_summary()["implementation"] == "hand-derived"
    return plain, fused


def assert_gradient_matches_autograd(plain, fused, module_name: str, batch) -> None:
    """The hand-derived gradient of `fused` equals autograd's gradient of `plain._loss` (same weights)."""
    loss, _ = plain._loss(*batch)
    expected = torch.autograd.grad(loss, list(getattr(plain, module_name).parameters()))
    fused._update_step.hand_derived.gradient(*batch)
    for grad, param in zip(expected, getattr(fused, module_name).parameters()):
        torch.testing.assert_close(param.grad, grad, rtol=1e-5, atol=1e-7)


def assert_updates_match(plain, fused, steps: int, make_batch) -> torch.Tensor:
    """`plain` and `fused` take `steps` updates, each on `make_batch(step)` (made when its step comes: a batch may
    depend on the current weights), the learning rate set before each as a schedule sets it (so it must be read on
    every step); their losses, statistics and policy parameters agree after every step. Returns `plain`'s statistics
    of the last step."""
    for step in range(steps):
        batch = make_batch(step)
        for group in (*plain.optimizer.param_groups, *fused.optimizer.param_groups):
            group["lr"] = 1e-3 / (step + 1)
        loss_a, stats_a = plain._update_step(*batch)
        loss_b, stats_b = fused._update_step(*batch)
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stats_b, stats_a, rtol=1e-5, atol=1e-6)
        fused_params = dict(fused.policy.named_parameters())
        for name, param in plain.policy.named_parameters():
            torch.testing.assert_close(fused_params[name], param, rtol=1e-5, atol=1e-6, msg=f"{name} after step {step}")
    return stats_a


def update_summaries(tmp_path, monkeypatch, algo: str, total_timesteps: int, runs: dict[str, list[str]]) -> dict:
    """`summary.json`'s `update` of a short `rlspeed train ALGO CartPole-v1` per entry of `runs` (name: extra CLI
    arguments), each run under tmp_path/name."""
    import json

    from rlspeed import cli

    monkeypatch.chdir(tmp_path)
    updates = {}
    for name, extra in runs.items():
        code = cli.main(["train", algo, "CartPole-v1", "--total-timesteps", str(total_timesteps), "--target-return",
                         "none", "--no-progress", "--out", str(tmp_path / name), *extra])
        assert code == 0
        updates[name] = json.loads((tmp_path / name / "summary.json").read_text())["update"]
    return updates


def assert_loaded_update_continues(model, loaded, state_key: str, batch) -> list[int]:
    """`loaded`, loaded from `model`'s checkpoint, holds its policy and its optimizer's state (`state_key`, e.g.
    "exp_avg"), and its next update on `batch` gives the same parameters as `model`'s; returns the hand-derived
    updates' step counts (loaded, model)."""
    for (name, a), b in zip(model.policy.state_dict().items(), loaded.policy.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name)
    state = loaded.optimizer.state_dict()["state"]
    torch.testing.assert_close(state[0][state_key], model.optimizer.state_dict()["state"][0][state_key])
    model._update_step(*batch)
    loaded._update_step(*batch)
    for a, b in zip(model.policy.parameters(), loaded.policy.parameters()):
        torch.testing.assert_close(b, a)
    return [int(m._update_step.hand_derived.adam.step_count) for m in (loaded, model)]


def checkpoint_tensors(path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint, by name."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def checkpoint_metadata(path) -> dict:
    """rlspeed's JSON metadata of a checkpoint."""
    import json

    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return json.loads(handle.metadata()["rlspeed"])


def first_ou_noise(trainer, learn) -> torch.Tensor:
    """The Ornstein-Uhlenbeck noise `trainer` (a TD3 model or population) holds when the first exploring step of
    `learn()` (a call that trains it) starts; warnings of resumed Gymnasium envs and replay buffers are ignored."""
    import warnings

    first = []
    explore = trainer._explore

    def recording(obs, timesteps):
        if not first:
            first.append(trainer._ou_noise.clone())
        return explore(obs, timesteps)

    trainer._explore = recording
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        learn()
    return first[0]


def assert_same_members(population, other, pairs) -> None:
    """Member k of `population` equals member j of `other` (to 1e-6) for each (k, j) in `pairs`."""
    for k, j in pairs:
        mine = {**population.member_state(k), **population.member_statistics(k)}  # (statistics: where normalising)
        theirs = {**other.member_state(j), **other.member_statistics(j)}
        assert mine.keys() == theirs.keys()
        for name, value in theirs.items():
            torch.testing.assert_close(mine[name], value, atol=1e-6, rtol=0)


def members_collection_epsilons(population, before: int, monkeypatch) -> list[list[float]]:
    """The epsilons `[train_freq]` of each member's epsilon-greedy draws for the collection from env step `before`,
    in `population.alive`'s order: what `DQNPopulation._before_collect` gives `collection_epsilons` back (recorded)."""
    from rlspeed.population import offpolicy

    recorded, collection_epsilons = [], offpolicy.collection_epsilons
    with monkeypatch.context() as patch:
        patch.setattr(offpolicy, "collection_epsilons",
                      lambda *args: recorded.append(collection_epsilons(*args)) or recorded[-1])
        population._before_collect(before)
    return [epsilons.tolist() for epsilons in recorded]


def assert_member_is_its_solo_run(initial: dict, trained: dict, solo_initial: dict, solo_trained: dict,
                                  rtol: float = 0.0, unmoved: tuple[str, ...] = ()) -> None:
    """A member's tensors before (`initial`) and after training (`trained`) are its solo run's: the same names, the
    same start, moved by the training (all but those named in `unmoved`), the same after it (atol 1e-5, `rtol`)."""
    assert trained.keys() == solo_trained.keys()
    for name, value in solo_initial.items():
        assert torch.equal(initial[name], value), name
        assert name in unmoved or not torch.allclose(solo_trained[name], value), name  # (training moved it)
    for name, value in solo_trained.items():
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=rtol, msg=name)


def assert_a_diverging_member_is_dropped(algo, hyper: dict, learning_rate: float, steps: int, eval_freq: int) -> None:
    """Of three members, the middle one diverges (a huge learning rate): it is reported and dropped, and the other two
    end as a population of those two alone."""
    from rlspeed.population import Population

    hyper = {**hyper, "max_grad_norm": 1e30}
    population = Population(algo, "CartPole-v1", seeds=[3, 5, 7],
                            **{**hyper, "learning_rate": [learning_rate, 1e30, learning_rate]})
    with pytest.warns(UserWarning, match="diverged"):
        summary = population.learn(steps, eval_freq=eval_freq, eval_episodes=2, on_eval=lambda steps, means: None)
    members = summary["members"]
    assert members[1]["diverged_at"] > 0 and members[1]["final_eval"] is None and summary["diverged"] == 1
    assert "diverged_at" not in members[0] and members[0]["final_eval"]["mean"] > 0
    assert population.alive == [0, 2]
    without = Population(algo, "CartPole-v1", seeds=[3, 7], **{**hyper, "learning_rate": learning_rate})
    without.learn(steps, eval_freq=eval_freq, eval_episodes=2, on_eval=lambda steps, means: None)
    assert_same_members(population, without, [(0, 0), (2, 1)])


def assert_pruned_member_matches_reruns(population, algo, env_id: str, steps: int, eval_freq: int,
                                        **config) -> None:
    """`population` (seeds 0, 1, 2) pruned member 1 at the first evaluation and trained `steps`: members 0 and 2 end
    as a population that never had member 1 (env rows, optimiser, draws), and member 1 keeps the parameters it had
    when it left (a population stopped at that evaluation)."""
    from rlspeed.population import Population

    without = Population(algo, env_id, seeds=[0, 2], **config)
    without.learn(steps, eval_freq=eval_freq, eval_episodes=2, on_eval=lambda steps, means: None)
    assert_same_members(population, without, [(0, 0), (2, 1)])
    stopped = Population(algo, env_id, seeds=[0, 1, 2], **config)
    stopped.learn(eval_freq, eval_freq=eval_freq, eval_episodes=2)
    assert_same_members(population, stopped, [(1, 1)])


def random_population_batch(population, batch: int, generator: torch.Generator):
    """(obs, out, values, actions) of random observations `[K, batch, obs_dim]` for an on-policy population: its
    outputs and values there (no gradient), and random actions (indices for a categorical policy, the mean plus
    N(0, 1) noise for a Gaussian one)."""
    size = len(population.alive)
    obs = torch.randn(size, batch, population.spec.obs_dim, generator=generator)
    with torch.no_grad():
        out, values = population.forward(obs)
    if population.kind == "categorical":
        actions = torch.randint(0, out.shape[-1], (size, batch), generator=generator)
    else:
        actions = out + torch.randn(out.shape, generator=generator)
    return obs, out, values, actions


def network_layers(policy: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight [out, fan_in], bias) of every linear and convolution layer (ensemble members one by one), in module
    order."""
    from rlspeed.nn import EnsembleMLP

    layers = []
    for module in policy.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            layers.append((module.weight.flatten(1), module.bias))
        elif isinstance(module, EnsembleMLP):
            layers += [(w[k].T, b[k].flatten()) for w, b in zip(module.weights, module.biases) for k in range(len(w))]
    return layers


class ScriptedEnv(BatchedEnv):
    """Replays observations `[T + 1, N, D]` and rewards `[T, N]`, and the terminations, truncations and final
    observations `[T, N, ...]` where given (else no episode ends), as the batched env contract gives them
    (`info["final_obs"]` is `obs` itself on steps where no row finished)."""

    backend = "scripted"

    def __init__(self, observations, rewards, terminated=None, truncated=None, final_observations=None):
        goes_on = torch.zeros(rewards.shape, dtype=torch.bool)
        self.observations, self.rewards, self.final_observations = observations, rewards, final_observations
        self.terminated = goes_on if terminated is None else terminated
        self.truncated = goes_on if truncated is None else truncated
        self.num_envs, self.device = observations.shape[1], torch.device("cpu")
        self.spec = EnvSpec("Scripted", tuple(observations.shape[2:]), gym.spaces.Discrete(2), None, None)
        self.t = 0

    def reset(self, seed=None):
        self.t = 0
        return self.observations[0].clone(), {}

    def step(self, actions):
        t, self.t = self.t, self.t + 1
        obs = self.observations[t + 1].clone()
        ended = bool((self.terminated[t] | self.truncated[t]).any())
        final = self.final_observations[t].clone() if ended else obs
        return obs, self.rewards[t].clone(), self.terminated[t].clone(), self.truncated[t].clone(), {"final_obs": final}


def masked_vector_env_id() -> str:
    """A registered Gymnasium env with float-vector observations and a random action mask each step (at least one of
    three actions allowed): masks without an encoder, so only they make an update autograd."""
    import gymnasium as gym
    import numpy as np

    class MaskedRandomVector(gym.Env):
        observation_space = gym.spaces.Box(-5.0, 5.0, (3,), np.float32)
        action_space = gym.spaces.Discrete(3)

        def _mask(self):
            mask = self.np_random.random(3) < 0.6
            mask[self.np_random.integers(3)] = True
            return mask

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.normal(size=3).astype(np.float32), {"action_mask": self._mask()}

        def step(self, action):
            self.t += 1
            obs = self.np_random.normal(size=3).astype(np.float32)
            return obs, float(action) - 1.0, False, self.t >= 6, {"action_mask": self._mask()}

    env_id = "RlspeedTest/MaskedRandomVector-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=MaskedRandomVector, max_episode_steps=6)
    return env_id


def binary_vector_env_id() -> str:
    """A registered Gymnasium env with MultiBinary(6) observations (the flatten encoder's: bool to float, no
    parameters), two actions, and a reward that depends on the observation, so the networks' input matters."""
    import gymnasium as gym
    import numpy as np

    class RandomBits(gym.Env):
        observation_space = gym.spaces.MultiBinary(6)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            self.bits = self.np_random.integers(0, 2, 6).astype(np.int8)
            return self.bits, {}

        def step(self, action):
            self.t += 1
            reward = float(self.bits[int(action)] == 1)
            self.bits = self.np_random.integers(0, 2, 6).astype(np.int8)
            return self.bits, reward, False, self.t >= 8, {}

    env_id = "RlspeedTest/RandomBits-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=RandomBits, max_episode_steps=8)
    return env_id


def endless_pendulum_id() -> str:
    """A registered Gymnasium env whose episodes never end: Pendulum without its time limit."""
    env_id = "rlspeed_test/EndlessPendulum-v1"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point="gymnasium.envs.classic_control:PendulumEnv")
    return env_id


CRASHING_ENV = """import os
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class CrashingEnv(CartPoleEnv):
    steps = 0

    def step(self, action):
        CrashingEnv.steps += 1  # (the process's steps over all its envs)
        if CrashingEnv.steps == int(os.environ.get("CRASH_AT", "1000000")):
            raise RuntimeError("sensor cable unplugged")
        return super().step(action)


gym.register("CrashingEnv-v0", entry_point="crashing_env:CrashingEnv", max_episode_steps=200)
"""


@pytest.fixture
def train_crashing(tmp_path, monkeypatch, capsys):
    """`train(crash_at, *more)`: `rlspeed train ppo` (512 steps, checkpoints every 128) in `tmp_path/run` on
    CRASHING_ENV, whose process raises at its `crash_at`-th env step; in this process (the env's module imported
    afresh at each command, its step count from 0 as in a new process), the command's output as a process's."""
    (tmp_path / "crashing_env.py").write_text(CRASHING_ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def forget() -> None:
        sys.modules.pop("crashing_env", None)
        gym.registry.pop("CrashingEnv-v0", None)

    def train(crash_at: int, *more: str) -> subprocess.CompletedProcess:
        forget()
        monkeypatch.setenv("CRASH_AT", str(crash_at))
        argv = ["train", "ppo", "crashing_env:CrashingEnv-v0", "--env-backend", "gymnasium", "--num-envs", "2",
                "--preset", "none", "--set", "num_steps=32", "--set", "batch_size=64", "--total-timesteps", "512",
                "--checkpoint-freq", "128", "--target-return", "none", "--no-progress", "--out", "run", *more]
        capsys.readouterr()
        from rlspeed import cli

        code = cli.main(argv)
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, captured.out, captured.err)

    yield train
    forget()
