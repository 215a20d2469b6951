"""A user's own encoder (docs/algorithms.md, "Your own encoder": a subclass's `_make_encoder`): the networks act in
eval mode and update in train mode, as Stable-Baselines3's do, so Dropout and BatchNorm behave as their users
expect."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rlspeed import DQN, PPO, SAC
from rlspeed.errors import UserError
from rlspeed.nn import Encoder, acting_mode, mode_dependent


class NoisyNormed(Encoder):
    """A linear layer, BatchNorm and Dropout: its output depends on the mode."""

    kind = "noisy encoder"

    def __init__(self, obs_dim: int, features_dim: int = 16):
        super().__init__()
        self.features_dim = features_dim
        self.net = nn.Sequential(nn.Linear(obs_dim, features_dim), nn.BatchNorm1d(features_dim), nn.ReLU(),
                                 nn.Dropout(0.5))

    def forward(self, obs):
        return self.net(obs.flatten(1).float())


class NoisyPPO(PPO):
    def _make_encoder(self, network):
        return NoisyNormed(self.spec.obs_dim)


def test_networks_act_in_eval_mode_and_update_in_train_mode(tmp_path):
    """One env (a BatchNorm in train mode refuses a batch of one), deterministic `predict` repeatable with Dropout,
    BatchNorm's statistics moved by the updates only, and the export (eval mode) giving predict's actions."""
    model = NoisyPPO("CartPole-v1", device="cpu", seed=0, num_envs=1, num_steps=32, batch_size=32, n_epochs=2)
    norm = model.policy.encoder.net[1]
    model.learn(64, progress_bar=False)  # (acting on batches of one: eval mode)
    assert norm.num_batches_tracked.item() == 2 * 2  # two rollouts, two epochs of one minibatch: the updates only
    assert model.policy.training and norm.training  # (put back after acting)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    first, _ = model.predict(obs)
    for _ in range(3):
        assert np.array_equal(model.predict(obs)[0], first)
    assert norm.num_batches_tracked.item() == 4  # (predict does not move the statistics)
    model.predict(obs[0])
    loaded = NoisyPPO.load(model.save(tmp_path / "noisy"))
    assert np.array_equal(loaded.predict(obs)[0], first)
    model.export(tmp_path / "noisy.pt")  # (refused where the eval-mode graph disagreed with predict)
    # a layer the user put in eval mode stays so for the updates
    norm.eval()
    model.learn(32, progress_bar=False)
    assert not norm.training and model.policy.training and norm.num_batches_tracked.item() == 4


def test_rlspeeds_own_networks_are_left_alone():
    """The default networks' output does not depend on the mode: acting does not walk them into eval mode."""
    model = PPO("CartPole-v1", device="cpu", seed=0)
    assert not mode_dependent(model.policy)
    assert mode_dependent(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    own = nn.Sequential(nn.Linear(2, 2), NoisyNormed(2))
    with acting_mode(own):
        assert not own.training and not own[1].net[3].training
    assert own.training and own[1].net[3].training


def test_a_compiled_network_is_as_mode_dependent_as_the_network_it_wraps():
    """`model.policy = torch.compile(model.policy)` (a wrapper of the same parameters, which the model takes): its
    wrapper is no layer of the user's own, so acting leaves rlspeed's network alone as uncompiled (no mode switch,
    which would make torch.compile trace it again in eval mode)."""
    model = PPO("CartPole-v1", device="cpu", seed=0)
    assert not mode_dependent(torch.compile(model.policy))
    assert mode_dependent(torch.compile(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))))


@pytest.mark.parametrize("mode", [True, False])
def test_acting_mode_puts_back_each_layers_mode(mode):
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.BatchNorm1d(2))
    net.train(mode)
    net[2].eval()
    with acting_mode(net), torch.no_grad():
        assert not any(layer.training for layer in net.modules())
    assert [layer.training for layer in net.modules()] == [mode, mode, mode, False]


class Widened(Encoder):
    """A linear layer to `features_dim` features (the heads then take another width than the observation's)."""

    kind = "widening encoder"

    def __init__(self, obs_dim: int, features_dim: int):
        super().__init__()
        self.features_dim = features_dim
        self.linear = nn.Linear(obs_dim, features_dim)

    def forward(self, obs):
        return torch.tanh(self.linear(obs.flatten(1).float()))


class WidePPO(PPO):
    def __init__(self, env, features_dim: int = 8, **kwargs):
        self.features_dim = features_dim
        super().__init__(env, **kwargs)

    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, self.features_dim)


@pytest.mark.parametrize("features_dim", [8, 4])
def test_loading_a_subclass_file_with_rlspeeds_class_names_the_subclass(tmp_path, features_dim):
    """PPO.load of a file a subclass with its own encoder saved: one sentence naming the class to load it with, not
    a hint at net_arch (heads of another width) or load_state_dict's RuntimeError (heads of the same width, the
    encoder's tensors left over), and no warning before it (it warned that PPO.load makes it a PPO, then refused)."""
    path = WidePPO("CartPole-v1", device="cpu", seed=0, features_dim=features_dim).save(tmp_path / "wide")
    with warnings.catch_warnings(record=True) as said, \
            pytest.raises(UserError, match=rf"was saved by {__name__}\.WidePPO, whose networks PPO\.load does not "
                                           rf"build \(the checkpoint.*policy\..*\): load it with WidePPO\.load, with "
                                           rf"WidePPO imported from {__name__}\.$"):
        warnings.simplefilter("always")
        PPO.load(path)
    assert [str(warning.message) for warning in said] == []
    assert WidePPO.load(path).policy.encoder.features_dim == features_dim


class Misshapen(Encoder):
    """Features that do not fit the heads: another width, a tuple, float64 or one value per observation."""

    kind = "misshapen encoder"

    def __init__(self, obs_dim: int, fault: str):
        super().__init__()
        self.features_dim, self.fault = 16, fault
        self.linear = nn.Linear(obs_dim, 12 if fault == "width" else 16)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, obs):
        self.calls += 1
        x = self.linear(obs.flatten(1).float())
        return {"width": x, "tuple": (x, None), "float64": x.double(), "flat": x.sum(1), "fine": x}[self.fault]


class MisshapenPPO(PPO):
    def __init__(self, env, fault: str = "fine", **kwargs):
        self.fault = fault
        super().__init__(env, **kwargs)

    def _make_encoder(self, network):
        return Misshapen(self.spec.obs_dim, self.fault)


@pytest.mark.parametrize(("fault", "words"), [
    ("width", r"returned features of shape \[2, 12\] for a batch of 2 observations, and the heads were built for its "
              r"features_dim 16: return \[batch, 16\], or set features_dim"),
    ("flat", r"returned features of shape \[2\] for a batch"),
    ("tuple", r"returned a tuple, and the heads take its features as one tensor \[batch, features_dim\]"),
    ("float64", r"returned torch.float64 features on cpu, and the heads take float32 on cpu"),
])
def test_an_encoder_whose_features_do_not_fit_the_heads_is_refused_when_made(fault, words, monkeypatch):
    """One sentence naming the encoder when the model is made, not torch's error from the heads' matrix products at
    the first rollout; a fitting encoder is run once for it without moving its buffers or the random streams."""
    with pytest.raises(UserError, match=rf"^Misshapen \(the policy's encoder\) {words}"):
        MisshapenPPO("CartPole-v1", device="cpu", seed=0, fault=fault)

    def made_and_drawn():
        torch.manual_seed(5)
        model = MisshapenPPO("CartPole-v1", device="cpu", seed=None)
        return model.policy.encoder.calls.item(), torch.rand(3)

    checked = made_and_drawn()
    monkeypatch.setattr(MisshapenPPO, "_check_own_encoders", lambda self: None)
    unchecked = made_and_drawn()
    assert checked[0] == unchecked[0] == 0 and torch.equal(checked[1], unchecked[1])


class GridCell(gym.Env):
    """A cell on a 5x5 grid as two ids 0..4 in a uint8 Box of 0..255 (as MiniGrid's object ids): random values of the
    space are outside what the env gives."""

    observation_space = gym.spaces.Box(0, 255, (2,), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = np.zeros(2, np.uint8)
        return self.cell.copy(), {}

    def step(self, action):
        self.cell = np.clip(self.cell + [(1, 0), (0, 1), (-1, 0), (0, -1)][action], 0, 4).astype(np.uint8)
        reached = bool((self.cell == 4).all())
        return self.cell.copy(), float(reached), reached, False, {}


class CellIds(Encoder):
    """An embedding of the ids the env gives (0..4): it raises on other values."""

    kind = "id embedding"

    def __init__(self):
        super().__init__()
        self.features_dim = 16
        self.embed = nn.Embedding(5, 8)

    def forward(self, obs):
        return self.embed(obs.long()).flatten(1)


class CellPPO(PPO):
    def _make_encoder(self, network):
        return CellIds()


def test_an_encoder_that_raises_on_random_observations_is_not_checked():
    """The check's random observations may lie outside what the env gives (ids 0..4 in a uint8 Box): an encoder that
    raises on them is made and trains as before the check, not refused with its IndexError."""
    if "rlspeed-test/GridCell-v0" not in gym.registry:
        gym.register("rlspeed-test/GridCell-v0", entry_point=GridCell, max_episode_steps=20)
    model = CellPPO("rlspeed-test/GridCell-v0", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
    model.learn(32, progress_bar=False)
    assert model.num_timesteps == 32


def test_rlspeed_eval_builds_a_subclass_whose_module_gym_packages_imports(tmp_path, monkeypatch, capsys):
    """`rlspeed eval` of a model a subclass with its own encoder saved: with `--gym-packages MODULE` it loads with
    that class; without, one error line saying so (not PPO.load's error and warning)."""
    import sys

    from conftest import cli_error

    from rlspeed import cli

    (tmp_path / "my_encoders.py").write_text("from test_custom_encoder import WidePPO\n\n\n"
                                             "class MinePPO(WidePPO):\n"
                                             "    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_encoders", raising=False)
    import my_encoders

    path = my_encoders.MinePPO("CartPole-v1", device="cpu", seed=0).save(tmp_path / "mine")
    monkeypatch.delitem(sys.modules, "my_encoders")
    error = cli_error(capsys, ["eval", str(path), "--episodes", "1", "--seed", "0", "--no-progress"])
    assert error.endswith("was saved by my_encoders.MinePPO, whose networks rlspeed eval builds with its module "
                          "imported: add --gym-packages my_encoders (importable from here: PYTHONPATH).")
    from rlspeed import PPO
    from rlspeed.errors import UserError

    def short_of_memory(*args, **kwargs):
        raise UserError(f"'{path}' needs 9 GiB of memory, more than the 2 GiB free.")

    with monkeypatch.context() as patched:  # (another failure of the load is said as it is, not as the class's)
        patched.setattr(PPO, "load", short_of_memory)
        error = cli_error(capsys, ["eval", str(path), "--episodes", "1", "--seed", "0", "--no-progress"])
    assert error.endswith("needs 9 GiB of memory, more than the 2 GiB free."), error
    assert cli.main(["eval", str(path), "--episodes", "1", "--seed", "0", "--no-progress", "--json",
                     "--gym-packages", "my_encoders"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 1


class WideDQN(DQN):
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, 8)


class WideSAC(SAC):
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, 6 if network == "actor" else 10)


@pytest.mark.parametrize(("algo", "env_id", "widths"), [(WideDQN, "CartPole-v1", {"q_network": 8, "q_target": 8}),
                                                        (WideSAC, "Pendulum-v1", {"actor": 6, "critic": 10,
                                                                                  "critic_target": 10})])
def test_make_encoder_gives_every_network_its_own_encoder(tmp_path, algo, env_id, widths):
    """`_make_encoder(network)`: an encoder of the user's own for the off-policy algorithms, whose networks `_setup`
    builds (no `_build_policy` to override); each network a new one, the targets a copy of theirs; it trains, and a
    load rebuilds it with the same actions."""
    model = algo(env_id, device="cpu", seed=0, learning_starts=64, batch_size=32).learn(128, progress_bar=False)
    modules = model._modules()
    encoders = {name: modules[name].encoder for name in widths}
    assert {name: encoder.features_dim for name, encoder in encoders.items()} == widths
    assert all(type(encoder) is Widened for encoder in encoders.values())
    assert len({id(encoder) for encoder in encoders.values()}) == len(widths)
    obs = np.random.default_rng(0).normal(size=(16, *model.spec.observation_shape)).astype(np.float32)
    loaded = algo.load(model.save(tmp_path / "wide"))
    assert np.array_equal(loaded.predict(obs)[0], model.predict(obs)[0])


def test_overlapping_acting_blocks_put_the_modes_back_when_the_last_ends():
    """Threads predicting at once (a server) overlap their blocks: the first to end must not put train mode back
    under the others, nor the last leave eval mode for the updates."""
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    first, second = acting_mode(net), acting_mode(net)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not net[1].training  # (the second block still acts)
    second.__exit__(None, None, None)
    assert net.training and net[1].training


class ChosenPPO(PPO):
    """The encoder's class an argument (SB3's features_extractor_class): a file keeps no class."""

    def __init__(self, env, encoder_class=Widened, **kwargs):
        self.encoder_class = encoder_class
        super().__init__(env, **kwargs)

    def _make_encoder(self, network):
        return self.encoder_class(self.spec.obs_dim, 8)


class RequiredPPO(ChosenPPO):
    def __init__(self, env, encoder_class=None, **kwargs):
        super().__init__(env, encoder_class=encoder_class, **kwargs)


class Narrowed(Widened):
    kind = "narrowing encoder"


def test_an_unsaved_encoder_class_argument_is_asked_for_again_at_load(tmp_path, monkeypatch):
    """A subclass's `__init__` argument a file cannot keep (a class) and load is not given: its default builds the
    model with a warning naming it (another network may act otherwise) in a process that was not told so when it
    saved, and where the subclass fails on the default, one sentence naming it instead of the subclass's TypeError."""
    from rlspeed.algos import base

    with pytest.warns(UserWarning, match="encoder_class is not saved"):
        path = ChosenPPO("CartPole-v1", device="cpu", seed=0, encoder_class=Narrowed).save(tmp_path / "chosen")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (this process was told when it saved)
        assert type(ChosenPPO.load(path).policy.encoder) is Widened
    monkeypatch.setattr(base, "_UNSAVED_ARGUMENTS_SAID", set())  # (another process)
    with pytest.warns(UserWarning, match=r"saved by a ChosenPPO made with encoder_class \(a type\), which its file "
                                         r"does not keep: this model has the default; pass it again "
                                         r"\(ChosenPPO.load\(path, encoder_class=\.\.\.\)\)"):
        assert type(ChosenPPO.load(path).policy.encoder) is Widened
    assert type(ChosenPPO.load(path, encoder_class=Narrowed).policy.encoder) is Narrowed
    with pytest.warns(UserWarning, match="encoder_class is not saved"):
        path = RequiredPPO("CartPole-v1", device="cpu", seed=0, encoder_class=Narrowed).save(tmp_path / "required")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserError, match=r"^RequiredPPO.load could not build the model of '.*' without "
                                            r"encoder_class, a type its file does not keep \(TypeError: .*\): pass it "
                                            r"again \(RequiredPPO.load\(path, encoder_class=\.\.\.\)\)\.$"):
            RequiredPPO.load(path)


def test_a_population_of_a_subclass_is_refused_as_a_subclass():
    """Populations batch rlspeed's own networks: a subclass with its own encoder is refused saying so (it was told
    that populations do not cover "WidePPO", as if it were an algorithm of its own)."""
    from rlspeed.population import Population

    with pytest.raises(UserError, match=r"^Populations train rlspeed's own PPO, not WidePPO, a subclass of it: .*"
                                        r"train WidePPO solo, one model per seed\.$"):
        Population(WidePPO, "CartPole-v1", seeds=[0, 1])


class NoisyDQN(DQN):
    def _make_encoder(self, network):
        return NoisyNormed(self.spec.obs_dim)


class NoisySAC(SAC):
    def _make_encoder(self, network):
        return NoisyNormed(self.spec.obs_dim)


@pytest.mark.parametrize(("algo", "env_id", "pairs", "options"), [
    (NoisyDQN, "CartPole-v1", [("q_target", "q_network")], {"target_update_interval": 1}),
    (NoisySAC, "Pendulum-v1", [("critic_target", "critic")], {})])
def test_targets_compute_in_eval_mode_with_the_online_statistics(algo, env_id, pairs, options):
    """Target networks stayed in train mode (Dropout's noise in every TD target, BatchNorm normalising by the
    batch) and BatchNorm's running statistics were never copied to them (Polyak moves parameters). As SB3's: the
    targets are in eval mode and each target update copies the statistics whole."""
    model = algo(env_id, device="cpu", seed=0, learning_starts=64, batch_size=32, train_freq=1, gradient_steps=1,
                 **options).learn(160, progress_bar=False)
    modules = model._modules()
    for target_name, online_name in pairs:
        target, online = modules[target_name], modules[online_name]
        assert not any(layer.training for layer in target.modules())
        assert online.training  # (the online network updates in train mode)
        statistics = {name: value for name, value in online.named_buffers()}
        assert statistics and all(torch.equal(value, statistics[name]) for name, value in target.named_buffers())
        assert statistics["encoder.net.1.num_batches_tracked"].item() > 0


class Constant(Widened):
    """An initialisation of the encoder's own (every weight 0.5), which the model must keep."""

    def __init__(self, obs_dim: int, features_dim: int):
        super().__init__(obs_dim, features_dim)
        nn.init.constant_(self.linear.weight, 0.5)


class ConstantPPO(PPO):
    def _make_encoder(self, network):
        return Constant(self.spec.obs_dim, 8)


class ConstantDQN(DQN):
    def _make_encoder(self, network):
        return Constant(self.spec.obs_dim, 8)


class ConstantSAC(SAC):
    def _make_encoder(self, network):
        return Constant(self.spec.obs_dim, 8)


@pytest.mark.parametrize(("algo", "env_id", "networks"), [(ConstantPPO, "CartPole-v1", ("policy",)),
                                                          (ConstantDQN, "CartPole-v1", ("q_network", "q_target")),
                                                          (ConstantSAC, "Pendulum-v1", ("actor", "critic"))])
def test_ortho_init_false_keeps_the_encoders_own_initialisation(algo, env_id, networks):
    """`ortho_init=False` (SB3's, RL-Zoo's off-policy presets) re-initialises rlspeed's layers as PyTorch would; it
    re-initialised the user's encoder too, silently replacing the initialisation its code chose (SB3 leaves a custom
    features extractor's alone)."""
    orthogonal = algo(env_id, device="cpu", seed=0)
    default = algo(env_id, device="cpu", seed=0, ortho_init=False)
    for name in networks:
        encoder = default._modules()[name].encoder
        assert torch.equal(encoder.linear.weight, torch.full_like(encoder.linear.weight, 0.5))
    heads = [(name, value) for name, value in default._modules()[networks[0]].named_parameters()
             if not name.startswith("encoder.") and value.dim() >= 2]
    before = dict(orthogonal._modules()[networks[0]].named_parameters())
    assert heads and not any(torch.equal(value, before[name]) for name, value in heads)  # (rlspeed's: PyTorch's init)


@pytest.mark.parametrize("features_dim", [8, 4])
def test_resume_and_set_parameters_name_the_class_whose_networks_a_file_holds(tmp_path, features_dim):
    """A file of a subclass with its own encoder resumed or warm-started by rlspeed's class, or rlspeed's file by the
    subclass (and loaded by it): one sentence naming the class that saved it, not a hint at net_arch or "damaged"."""
    wide = WidePPO("CartPole-v1", device="cpu", seed=0, features_dim=features_dim)
    plain = PPO("CartPole-v1", device="cpu", seed=0)
    wide_file, plain_file = wide.save(tmp_path / "wide"), plain.save(tmp_path / "plain")
    for call in ("resume", "set_parameters"):
        with pytest.raises(UserError, match=rf"was saved by {__name__}\.WidePPO, whose networks PPO\.{call} does not "
                                            rf"build \(the checkpoint.*\): use WidePPO\.{call}, with WidePPO "
                                            rf"imported from {__name__}\.$"):
            getattr(PPO("CartPole-v1", device="cpu", seed=0), call)(wide_file)
        with pytest.raises(UserError, match=rf"was saved by rlspeed's PPO, whose networks WidePPO\.{call} does not "
                                            rf"build \(the checkpoint has no 'policy\.encoder\..*\): use PPO\.{call}, "
                                            rf"or train WidePPO afresh\.$"):
            getattr(wide, call)(plain_file)
    with pytest.raises(UserError, match=r"was saved by rlspeed's PPO, whose networks WidePPO\.load does not build"):
        WidePPO.load(plain_file)
    wide.resume(wide_file)  # (its own class's file, as before)
    plain.set_parameters(plain_file)


@pytest.mark.parametrize("command", ["train", "profile"])
def test_the_command_line_says_a_class_of_ones_own_trains_from_python(capsys, command):
    """`rlspeed train my_module:MyPPO ENV`, as `module:EnvId` names an env, was "Unknown algorithm" with the list of
    rlspeed's: it names what trains a subclass, and what takes its file."""
    from conftest import cli_error

    for name in ("my_encoders:WidePPO", "my_encoders.WidePPO"):
        assert cli_error(capsys, [command, name, "CartPole-v1"]).endswith(
            f"'{name}' names a Python class: the command line trains rlspeed's algorithms by name (ppo, a2c, dqn, "
            "sac, td3, ddpg, recurrent_ppo); a subclass of one trains from Python (WidePPO(env_id, ...).learn(...), "
            ".save(...)), and rlspeed eval and rlspeed export take its file with --gym-packages my_encoders "
            "(docs/algorithms.md).")
    assert "Unknown algorithm 'ppo.yaml'" in cli_error(capsys, [command, "ppo.yaml", "CartPole-v1"])  # (no class)
    # (another library's class is not one's own subclass: its name's advice, with no --gym-packages for its file)
    for name in ("sb3_contrib:MaskablePPO", "sb3_contrib.MaskablePPO"):
        assert cli_error(capsys, [command, name, "CartPole-v1"]).startswith(
            f"rlspeed: error: Unknown algorithm '{name}': rlspeed's ppo masks actions as sb3-contrib's "
            "MaskablePPO does")
    for name in ("rlspeed.PPO", "stable_baselines3:PPO"):  # (not one's own: no --gym-packages rlspeed)
        assert cli_error(capsys, [command, name, "CartPole-v1"]) == (
            f"rlspeed: error: Unknown algorithm '{name}': the command line names the algorithm alone: use ppo.")


@pytest.mark.parametrize("algo", [PPO, SAC])
def test_an_encoder_given_as_a_setting_names_make_encoder(algo):
    """SB3's way (`policy_kwargs=dict(features_extractor_class=MyEncoder)`) and a new user's guess (`encoder=MyEncoder`,
    a class or a module) name the subclass's `_make_encoder`: `encoder=Widened` said "encoder must be one of auto,
    mlp, cnn, got 'widened'" (the class's name lowercased), and the policy_kwargs refusal named no way to use one."""
    env_id = "CartPole-v1" if algo is PPO else "Pendulum-v1"
    own = r"an encoder of your own is what a subclass's _make_encoder returns \(docs/algorithms.md\)"
    for value in (Widened, Widened(3, 4)):
        with pytest.raises(UserError, match=rf"^Hyperparameter 'encoder' takes a name \(auto, mlp, cnn\), not "
                                            rf"{__name__}\.Widened: {own}\.$"):
            algo(env_id, device="cpu", encoder=value)
    with pytest.raises(UserError, match=rf"^encoder must be one of auto, mlp, cnn, got 'my.Encoder': {own}\.$"):
        algo(env_id, device="cpu", encoder="my.Encoder")  # (--set encoder=my.Encoder)
    with pytest.raises(UserError, match=rf"policy_kwargs.features_extractor_class=Widened: .*not from a class; {own}"):
        algo(env_id, device="cpu", policy_kwargs={"features_extractor_class": Widened})


class Pixels(gym.Env):
    """8x8 RGB uint8 frames: an image rlspeed's `auto` encoder would give a CNN."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), float(action), False, False, {}


class PixelsPPO(PPO):
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, 8)


class PixelsConfigPPO(PPO):
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, self.config.cnn_features_dim)


def test_encoder_settings_an_own_encoder_never_reads_are_said_to_do_nothing(tmp_path):
    """`cnn_features_dim`, `cnn`, `normalize_images` given to a subclass whose `_make_encoder` builds every network's
    encoder without reading `self.config`: they did nothing, silently. One warning each when the model is made (not
    again at load); none where `_make_encoder` reads the config, nor for the settings at their defaults."""
    from rlspeed.errors import UnusedSettingWarning

    if "rlspeed-test/Pixels-v0" not in gym.registry:
        gym.register("rlspeed-test/Pixels-v0", entry_point=Pixels, max_episode_steps=8)
    settings = {"cnn": "small", "cnn_features_dim": 64, "normalize_images": False}  # (in the order they are said)
    with pytest.warns(UnusedSettingWarning) as said:
        model = PixelsPPO("rlspeed-test/Pixels-v0", device="cpu", seed=0, **settings)
    told = [str(warning.message) for warning in said if warning.category is UnusedSettingWarning]
    assert told == [f"{name}={value!r} has no effect: PixelsPPO._make_encoder gives the networks encoders of its own "
                    f"(Widened), which rlspeed's encoder settings do not reach (read self.config.{name} there to use "
                    "it)." for name, value in settings.items()]
    path = model.save(tmp_path / "pixels")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedSettingWarning)
        PixelsPPO.load(path)
        PixelsPPO("rlspeed-test/Pixels-v0", device="cpu", seed=0)
        assert PixelsConfigPPO("rlspeed-test/Pixels-v0", device="cpu", seed=0, cnn_features_dim=16,
                               normalize_images=False).policy.encoder.features_dim == 16


def _config_width(model) -> int:
    return model.config.cnn_features_dim


class HelperConfigPPO(PPO):
    def _make_encoder(self, network):
        return self._own_encoder()

    def _own_encoder(self):
        return Widened(self.spec.obs_dim, self.config.cnn_features_dim)


class ComprehensionConfigPPO(PPO):
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, [self.config.cnn_features_dim for _ in range(1)][0])


class FunctionConfigPPO(PPO):
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, _config_width(self))


def _unwrapped(function):
    """A decorator without functools.wraps."""
    def call(*args, **kwargs):
        return function(*args, **kwargs)
    return call


class DecoratedConfigPPO(PPO):
    @torch.no_grad()
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, self.config.cnn_features_dim)


class PlainlyDecoratedConfigPPO(PPO):
    @_unwrapped
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, self.config.cnn_features_dim)


class GetattrConfigPPO(PPO):
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, getattr(self, "config", None).cnn_features_dim)


class DecoratedPPO(PPO):
    @torch.no_grad()
    def _make_encoder(self, network):
        return Widened(self.spec.obs_dim, 8)


@pytest.mark.parametrize("algo", [HelperConfigPPO, ComprehensionConfigPPO, FunctionConfigPPO, DecoratedConfigPPO,
                                  PlainlyDecoratedConfigPPO, GetattrConfigPPO])
def test_encoder_settings_read_through_a_helper_are_not_said_to_do_nothing(algo):
    """A `_make_encoder` that reads `self.config` in a method or function it calls, in a comprehension, under a
    decorator (`@torch.no_grad()`) or by `getattr(self, "config")` uses the setting: it was said to have no effect
    (the check read only `_make_encoder`'s own names, a decorator's wrapper's where decorated)."""
    from rlspeed.errors import UnusedSettingWarning

    if "rlspeed-test/Pixels-v0" not in gym.registry:
        gym.register("rlspeed-test/Pixels-v0", entry_point=Pixels, max_episode_steps=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedSettingWarning)
        model = algo("rlspeed-test/Pixels-v0", device="cpu", seed=0, cnn_features_dim=16)
    assert model.policy.encoder.features_dim == 16


def test_a_decorated_make_encoder_never_reading_the_config_is_said_to_leave_the_settings_idle():
    """Following a decorator's wrapped function reads it, not the decorator's own code as the model's."""
    from rlspeed.errors import UnusedSettingWarning

    if "rlspeed-test/Pixels-v0" not in gym.registry:
        gym.register("rlspeed-test/Pixels-v0", entry_point=Pixels, max_episode_steps=8)
    with pytest.warns(UnusedSettingWarning, match=r"^cnn_features_dim=16 has no effect: DecoratedPPO\._make_encoder"):
        DecoratedPPO("rlspeed-test/Pixels-v0", device="cpu", seed=0, cnn_features_dim=16)


class AroundCNN(Encoder):
    """rlspeed's CNN (`make_encoder`) with a linear layer of the user's own after it (every weight 0.5)."""

    kind = "wrapped CNN"

    def __init__(self, space: gym.Space):
        super().__init__()
        from rlspeed.nn import make_encoder

        self.cnn = make_encoder(space, "cnn", cnn_features_dim=8)
        self.linear = nn.Linear(8, 4)
        self.features_dim = 4
        nn.init.constant_(self.linear.weight, 0.5)

    def forward(self, obs):
        return torch.tanh(self.linear(self.cnn(obs)))


class AroundCNNPPO(PPO):
    def _make_encoder(self, network):
        return AroundCNN(self.spec.observation_space)


def test_ortho_init_false_reinitialises_rlspeeds_encoder_inside_ones_own():
    """`ortho_init=False` gives rlspeed's layers PyTorch's initialisation, the CNN `make_encoder` built inside an
    encoder of the user's own too (it kept its orthogonal one); the user's own layer keeps its initialisation."""
    if "rlspeed-test/Pixels-v0" not in gym.registry:
        gym.register("rlspeed-test/Pixels-v0", entry_point=Pixels, max_episode_steps=8)
    orthogonal = AroundCNNPPO("rlspeed-test/Pixels-v0", device="cpu", seed=0).policy.encoder
    default = AroundCNNPPO("rlspeed-test/Pixels-v0", device="cpu", seed=0, ortho_init=False).policy.encoder
    assert torch.equal(default.linear.weight, torch.full_like(default.linear.weight, 0.5))
    convs = [(name, value) for name, value in default.cnn.named_parameters() if value.dim() >= 2]
    before = dict(orthogonal.cnn.named_parameters())
    assert convs and not any(torch.equal(value, before[name]) for name, value in convs)
