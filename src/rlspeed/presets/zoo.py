"""RL-Zoo's tuned hyperparameters (the optional `rl_zoo3` package's hyperparams/*.yml) translated into rlspeed's.

An RL-Zoo entry names Stable-Baselines3 arguments plus a few of its own (`n_envs`, `n_timesteps`, `normalize`,
`frame_stack`, `env_wrapper`, `policy`). Every key either becomes rlspeed hyperparameters or run settings with the
same meaning, or is named in `Translation.unsupported` with the reason: nothing is dropped silently. Where
Stable-Baselines3's default differs from rlspeed's (PPO's 2048-step rollouts, a constant learning rate, one env,
DQN without Double-Q targets, TD3 without action noise), the translation sets SB3's value, so an entry means what it
means in RL-Zoo. The result is checked by building the rlspeed config.

`policy_kwargs` and `normalize` strings are Python expressions in RL-Zoo (it `eval`s them); here they are read by
`parse_python_literal`, which accepts only literals, lists, dicts, `dict(...)` calls and dotted names: nothing runs.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.metadata
import importlib.util
import typing
from pathlib import Path

import yaml

from rlspeed.errors import UserError
from rlspeed.policy_kwargs import ON_POLICY, SDE_ALGORITHMS, translate_policy_kwargs

#: rlspeed's algorithm names -> RL-Zoo's (its YAML file names)
ZOO_NAMES = {"ppo": "ppo", "a2c": "a2c", "dqn": "dqn", "sac": "sac", "td3": "td3", "ddpg": "ddpg",
             "recurrent_ppo": "ppo_lstm"}
#: algorithms whose value loss is 0.5 * MSE (rlspeed's vf_coef = 2 x SB3's, see PPOConfig)
HALF_VALUE_LOSS = ("ppo", "recurrent_ppo")

#: Stable-Baselines3's (and RL-Zoo's) defaults where rlspeed's differ: set unless the entry says otherwise.
SB3_DEFAULTS: dict[str, dict] = {
    "ppo": {"num_envs": 1, "num_steps": 2048, "batch_size": 64, "anneal_lr": False, "anneal_clip": False,
            "vf_coef": 1.0},
    "recurrent_ppo": {"num_envs": 1, "anneal_lr": False, "anneal_clip": False, "vf_coef": 1.0},
    "a2c": {"num_envs": 1},
    # (SB3's off-policy networks keep PyTorch's default initialisation, and their Adam torch's default epsilon)
    "dqn": {"num_envs": 1, "double_q": False, "ortho_init": False, "adam_eps": 1e-8},
    "sac": {"num_envs": 1, "ortho_init": False, "adam_eps": 1e-8},
    "td3": {"num_envs": 1, "action_noise": "none", "ortho_init": False, "adam_eps": 1e-8},
    "ddpg": {"num_envs": 1, "action_noise": "none", "ortho_init": False, "adam_eps": 1e-8},
}

#: keys with the same name and meaning in SB3 and rlspeed (the config build says which algorithm has which)
SAME_NAME = ("gamma", "gae_lambda", "ent_coef", "max_grad_norm", "n_epochs", "batch_size", "buffer_size", "target_kl",
             "learning_starts", "tau", "gradient_steps", "exploration_fraction", "exploration_initial_eps",
             "exploration_final_eps", "target_update_interval", "normalize_advantage", "use_rms_prop",
             "rms_prop_eps", "policy_delay", "target_policy_noise", "target_noise_clip", "clip_range_vf")

#: SB3/RL-Zoo keys rlspeed has no counterpart for, with SB3's default (which is then nothing to translate) and why
NO_COUNTERPART: dict[str, tuple[object, str]] = {
    "optimize_memory_usage": (False, "rlspeed's replay buffer picks its layout itself (frame stacks and large images "
                                     "stored once, frame_dedup)"),
    "stats_window_size": (100, "rlspeed logs its own episode statistics"),
    "callback": (None, "RL-Zoo callbacks do not apply to rlspeed"),
    "monitor_kwargs": (None, "rlspeed records episodes itself"),
    "vec_env_wrapper": (None, "rlspeed has no RL-Zoo vector-env wrappers"),
    "env_kwargs": (None, "the env's options are rlspeed train's --env-kwargs KEY=VALUE, not a preset's"),
}

#: gSDE's keys (rlspeed.sde) with SB3's defaults (`finish` refuses a key that an algorithm's config lacks, such as
#: use_sde_at_warmup outside SAC; the algorithms that have gSDE: `SDE_ALGORITHMS`)
SDE_KEYS = {"use_sde": False, "sde_sample_freq": -1, "use_sde_at_warmup": False}

#: keys that change what the agent observes or learns from: refusing one makes the entry unusable as a preset
BLOCKING = ("policy", "frame_stack", "env_wrapper", "vec_env_wrapper", "env_kwargs", "replay_buffer_class", "config")

#: VecNormalize's clips -> the normalisation whose `<name>_clip` rlspeed's config has for it
_NORMALIZE_CLIPS = {"clip_obs": "normalize_obs", "clip_reward": "normalize_reward"}

#: keys about SB3's own logging only: a user's file that holds them trains as it says (noted, not refused)
BOOKKEEPING = ("stats_window_size", "monitor_kwargs")

#: RL-Zoo's way to write what rlspeed names otherwise: a user's entry in RL-Zoo's format that uses rlspeed's name is
#: told which to write (a copy from a blog post mixes the two formats)
ZOO_SPELLING = {"num_envs": "n_envs", "num_steps": "n_steps", "n_step": "n_steps", "total_timesteps": "n_timesteps",
                "anneal_lr": "learning_rate: lin_X", "anneal_clip": "clip_range: lin_X",
                "net_arch": "policy_kwargs: \"dict(net_arch=[...])\"",
                "activation": "policy_kwargs: \"dict(activation_fn=nn.ReLU)\"",
                "log_std_init": "policy_kwargs: \"dict(log_std_init=...)\"",
                "ortho_init": "policy_kwargs: \"dict(ortho_init=False)\"",
                "normalize_obs": "normalize: \"{'norm_obs': True, 'norm_reward': False}\"",
                "normalize_reward": "normalize: \"{'norm_obs': False, 'norm_reward': True}\"",
                "action_noise": "noise_type", "action_noise_std": "noise_std",
                "her": "replay_buffer_class: HerReplayBuffer",
                "encoder": "policy (CnnPolicy, MultiInputPolicy)"}

#: the keys of RL-Zoo's format that `_Translator.entry` reads (for the likeliest one a misspelt key meant)
ZOO_NAMED = ("n_timesteps", "policy", "n_envs", "n_steps", "normalize", "learning_rate", "clip_range", "vf_coef",
             "ent_coef", "target_entropy", "train_freq", "noise_type", "noise_std", "frame_stack", "env_wrapper",
             "policy_kwargs", "replay_buffer_class", "replay_buffer_kwargs", *SAME_NAME, *SDE_KEYS, *NO_COUNTERPART)


class Symbol(str):
    """A dotted name read from a `policy_kwargs` string (`nn.ReLU`): kept as its text, never imported."""


def parse_python_literal(text: str, what: str = "value"):
    """The value of a Python expression made only of literals, lists, tuples, dicts, `dict(key=...)` calls and
    dotted names (returned as `Symbol`); UserError naming `what` for anything else (calls, operators, attributes of
    values, dunder names): the text is parsed, never run."""
    if len(text) > 10_000:
        raise UserError(f"{what} is {len(text)} characters long; rlspeed reads at most 10,000.")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return _literal(tree.body, what)
    except (SyntaxError, RecursionError, MemoryError) as error:
        raise UserError(f"{what} {text!r} is not a Python literal rlspeed can read ({type(error).__name__}).") from None


def _literal(node: ast.AST, what: str):
    """One node of `parse_python_literal`'s grammar."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, what)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item, what) for item in node.elts]
    elif isinstance(node, ast.Dict):
        if all(isinstance(key, ast.Constant) and isinstance(key.value, str) for key in node.keys):
            return {key.value: _literal(value, what) for key, value in zip(node.keys, node.values)}
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        if not node.args and all(keyword.arg is not None for keyword in node.keywords):  # no *args, no **kwargs
            return {keyword.arg: _literal(keyword.value, what) for keyword in node.keywords}
    elif isinstance(node, (ast.Name, ast.Attribute)):
        name = _dotted(node)
        if name is not None and not any(part.startswith("_") for part in name.split(".")):
            return Symbol(name)
    raise UserError(f"{what} holds {ast.unparse(node)!r}, which rlspeed does not read: only literals, lists, dicts, "
                    "dict(...) and names such as nn.ReLU are accepted (nothing is evaluated).")


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of names, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


@dataclasses.dataclass
class Translation:
    """An RL-Zoo entry in rlspeed's terms.

    `hyperparameters` build the algorithm's config; `run` holds run settings (total_timesteps); `unsupported` has one
    line per entry that could not be honoured, `"key: why"`; `blocking` the subset that makes the entry a different
    problem (policy, env wrappers, frame stacking, a config that does not build); `notes` the changes of meaning
    applied (vf_coef doubled, SB3 defaults set) and the entries that needed nothing set; `differences` the notes on
    what rlspeed then does otherwise than SB3 (the run says them); `translated` which rlspeed keys each entry key set;
    `source` where the entry came from.
    """

    hyperparameters: dict
    run: dict
    unsupported: list[str]
    source: str
    notes: list[str] = dataclasses.field(default_factory=list)
    blocking: list[str] = dataclasses.field(default_factory=list)
    translated: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # entry key -> rlspeed keys it set
    differences: list[str] = dataclasses.field(default_factory=list)  # the notes where rlspeed behaves otherwise

    @property
    def status(self) -> str:
        """'full' (everything honoured), 'partial' (some entries not honoured) or 'none' (`blocking` refusals)."""
        return "none" if self.blocking else "partial" if self.unsupported else "full"


def _package_dir() -> Path | None:
    """The installed rl_zoo3 package's directory, found without importing it (it imports SB3 and optuna)."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def zoo_version() -> str | None:
    """The installed rl_zoo3's version, or None when it is not installed."""
    if _package_dir() is None:
        return None
    try:
        return importlib.metadata.version("rl_zoo3")
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def hyperparams_file(algo: str) -> Path:
    """The installed rl_zoo3's YAML for rlspeed algorithm `algo`; UserError without rl_zoo3 or for an algorithm
    RL-Zoo has no file for."""
    if algo not in ZOO_NAMES:
        raise UserError(f"RL-Zoo has no presets for rlspeed's '{algo}'; it has {', '.join(sorted(ZOO_NAMES))}.")
    package = _package_dir()
    if package is None:
        raise UserError("RL-Zoo's presets need the rl_zoo3 package: pip install rl_zoo3 (or pip install "
                        "\"rlspeed[zoo]\").")
    path = package / "hyperparams" / f"{ZOO_NAMES[algo]}.yml"
    if not path.is_file():
        raise UserError(f"The installed rl_zoo3 has no {path.name} (looked in {path.parent}).")
    return path


def zoo_entries(algo: str) -> dict[str, dict]:
    """Every entry of the installed RL-Zoo YAML for `algo`, by env id (and RL-Zoo's `atari` entry)."""
    # read as RL-Zoo reads it (`yaml.safe_load`), not by `yamlfile.read`'s rules: an installed package's file, whose
    # entries mean in rlspeed what they mean in RL-Zoo; a person's own file in RL-Zoo's format is a `--preset FILE`,
    # read by those rules (`load_preset_file`)
    entries = yaml.safe_load(hyperparams_file(algo).read_text(encoding="utf-8")) or {}
    return {str(env_id): dict(entry or {}) for env_id, entry in entries.items()}


def has_entry(algo: str, env_id: str) -> bool:
    """Whether rl_zoo3 is installed and has an entry for (`algo`, `env_id`)."""
    if algo not in ZOO_NAMES or zoo_version() is None:
        return False
    return _entry_key(zoo_entries(algo), env_id) is not None


def _entry_key(entries: dict, env_id: str) -> str | None:
    """The key of `env_id`'s entry: the id itself, the native id behind `rlspeed/ID`, `atari` for every id of an
    Atari game (RL-Zoo's rule: an env made by ale-py's AtariEnv), or the newest older entry of a MuJoCo `-v5` id
    or a Gymnasium-Robotics id where RL-Zoo has none for the id's own version (`_older_versions`); None when there
    is none."""
    for key in (env_id, env_id.removeprefix("rlspeed/")):
        if key in entries:
            return key
    from rlspeed.envs.atari import atari_image_id  # (late: presets load without torch)

    if "atari" in entries and (env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4")
                               or atari_image_id(env_id)):
        return "atari"
    return next((older for older in _older_versions(env_id)[0] if older in entries), None)


#: how a preset says that a MuJoCo v5 id took an older entry of RL-Zoo's ({skipped}: the versions between, with none)
MUJOCO_V4_NOTE = ("its {older} entry: RL-Zoo has none for {skipped}, whose envs revise {version}'s (Ant-v5's "
                  "observations differ from Ant-v4's, for one)")
#: how a preset says that a Gymnasium-Robotics id took an older entry of RL-Zoo's
ROBOTICS_NOTE = ("its {older} entry: RL-Zoo has none for {skipped}, Gymnasium-Robotics' later versions of the same "
                 "task")


def _older_versions(env_id: str) -> tuple[list[str], str]:
    """The ids of older versions of a registered env whose RL-Zoo entry may stand for it, newest first, and the note
    that says so: `Name-v4`, `Name-v3`, `Name-v2` for a Gymnasium MuJoCo `Name-v5` id (RL-Zoo's entries are for v4,
    a few of PPO's still for v2; `MUJOCO_V4_NOTE`); `Name-v{N-1}` down to `Name-v1` for a Gymnasium-Robotics
    `Name-vN` id (RL-Zoo's Fetch entries are for v1; `ROBOTICS_NOTE`); else no ids."""
    import gymnasium as gym

    spec = gym.registry.get(env_id)
    entry = str(getattr(spec, "entry_point", "")) if spec is not None else ""
    name, _, version = env_id.rpartition("-v")
    if entry.startswith("gymnasium.envs.mujoco") and version == "5":
        return [f"{name}-v{older}" for older in (4, 3, 2)], MUJOCO_V4_NOTE
    if entry.startswith("gymnasium_robotics") and name and version.isdigit():
        return [f"{name}-v{older}" for older in range(int(version) - 1, 0, -1)], ROBOTICS_NOTE
    return [], ""


def translate(algo: str, env_id: str) -> Translation:
    """The installed RL-Zoo preset for (`algo`, `env_id`) in rlspeed's terms; UserError without rl_zoo3 or entry."""
    entries = zoo_entries(algo)
    key = _entry_key(entries, env_id)
    if key is None:
        raise UserError(f"RL-Zoo (rl_zoo3 {zoo_version()}) has no {ZOO_NAMES[algo]} preset for {env_id}: use --preset "
                        "auto (rlspeed's, else the defaults) or a preset file.")
    source = f"RL-Zoo's preset for {algo} {env_id} (rl_zoo3 {zoo_version()})"
    older, note = _older_versions(env_id)
    if key in older:
        version = key.rsplit("-", 1)[1]
        skipped = [env_id.rsplit("-", 1)[1], *(name.rsplit("-", 1)[1] for name in older[:older.index(key)])]
        skipped = " or ".join([", ".join(skipped[:-1]), skipped[-1]] if len(skipped) > 1 else skipped)
        source = f"{source[:-1]}; {note.format(older=key, skipped=skipped, version=version)})"
    from rlspeed.envs.atari import atari_image_id  # (late: presets load without torch)

    return translate_entry(algo, entries[key], source, atari=atari_image_id(env_id))


#: The SB3 wrapper RL-Zoo's Atari entries name, whose preprocessing rlspeed's Atari envs apply (rlspeed.envs.atari)
ATARI_WRAPPER = "stable_baselines3.common.atari_wrappers.AtariWrapper"


def translate_entry(algo: str, entry: dict, source: str, strict: bool = False, atari: bool = False) -> Translation:
    """`entry` (RL-Zoo's format: SB3 argument names plus n_envs, n_timesteps, normalize, ...) in rlspeed's terms.

    With `strict` (a user's own file), a key that is neither RL-Zoo's nor SB3's is blocking, as a typo would be.
    With `atari` (the entry is for an Atari image id), SB3's `AtariWrapper` and `frame_stack: 4` are what rlspeed's
    Atari envs apply already (`rlspeed.envs.atari`), noted rather than refused.
    """
    if algo not in ZOO_NAMES:
        raise UserError(f"RL-Zoo's format has no presets for rlspeed's '{algo}'; it has "
                        f"{', '.join(sorted(ZOO_NAMES))}.")
    translator = _Translator(algo, strict, atari)
    for key, value in entry.items():
        translator.entry(str(key), value)
    return translator.finish(source)


#: AtariWrapper's options that are rlspeed hyperparameters (`rlspeed.envs.atari.AtariTraining`), and the defaults of
#: the others, which rlspeed's fixed Atari preprocessing is
_ATARI_WRAPPER_SETTINGS = {"terminal_on_life_loss": "episodic_life", "clip_reward": "clip_rewards"}
_ATARI_WRAPPER_DEFAULTS = {"noop_max": 30, "frame_skip": 4, "screen_size": 84, "action_repeat_probability": 0.0}


def _atari_wrapper_options(value) -> dict | None:
    """The options RL-Zoo's `env_wrapper` value gives SB3's AtariWrapper where it names that wrapper alone (its path,
    alone or in a list, or `{path: options}` so): {} without options; else None."""
    names = value if isinstance(value, list) else [value]
    if len(names) != 1:
        return None
    name = names[0]
    if name == ATARI_WRAPPER:
        return {}
    if isinstance(name, dict) and list(name) == [ATARI_WRAPPER] and isinstance(name[ATARI_WRAPPER] or {}, dict):
        return dict(name[ATARI_WRAPPER] or {})
    return None


class _Translator:
    """Builds one Translation: `entry` per RL-Zoo key, then `finish` fills SB3's defaults and checks the config."""

    def __init__(self, algo: str, strict: bool, atari: bool = False):
        self.algo, self.strict, self.atari = algo, strict, atari
        self.hyper: dict = {}
        self.origin: dict[str, str] = {}  # rlspeed key -> the RL-Zoo key it came from (for refusal lines)
        self.run: dict = {}
        self.unsupported: list[str] = []
        self.blocking: list[str] = []
        self.notes: list[str] = []
        self.differences: list[str] = []
        self.episode_train_freq: list | None = None  # (an entry's `[n, "episode"]` train_freq, refused)
        self.normalize_gamma = None  # (`normalize`'s gamma, checked in `finish` against the entry's gamma)

    def differ(self, note: str) -> None:
        """A note on what rlspeed does otherwise than SB3 with the entry (among `notes`, and said by the run)."""
        self.notes.append(note)
        self.differences.append(note)

    def atari_wrapper(self, key: str, options: dict) -> None:
        """SB3's AtariWrapper, whose preprocessing rlspeed's Atari envs apply: its `terminal_on_life_loss` and
        `clip_reward` options set `episodic_life` and `clip_rewards`; other options at their defaults need nothing,
        and another value of one is refused (the preprocessing is fixed)."""
        for option, value in options.items():
            if option in _ATARI_WRAPPER_SETTINGS and isinstance(value, bool):
                self.set(_ATARI_WRAPPER_SETTINGS[option], value, key)
            elif _ATARI_WRAPPER_DEFAULTS.get(option, object()) != value:
                self.refuse(key, f"AtariWrapper's {option}={value!r}: rlspeed's Atari preprocessing is fixed at "
                                 "AtariWrapper's defaults (but terminal_on_life_loss and clip_reward)", blocking=True)
                return
        applied = ["no-op reset", "frame skip 4", "84x84 grey"]
        for option, setting in _ATARI_WRAPPER_SETTINGS.items():
            if options.get(option, True):
                applied.append(setting.replace("_", " ").replace("clip rewards", "clipped rewards"))
            else:
                self.notes.append(f"AtariWrapper's {option} False -> {setting} false")
        self.differ(f"AtariWrapper: rlspeed's Atari envs apply its preprocessing ({', '.join(applied)}), except FIRE "
                    "after each reset (the env option fire_reset=true adds it)")

    def set(self, key: str, value, origin: str) -> None:
        self.hyper[key] = value
        self.origin[key] = origin

    def refuse(self, key: str, why: str, blocking: bool = False) -> None:
        """`key` not honoured; `blocking` (or a key in BLOCKING): the entry cannot be used without it. The lines are
        joined with '; ' into one sentence: a reason that is a sentence of its own (a config's error) loses its
        full stop."""
        line = f"{key}: {why.removesuffix('.')}"
        self.unsupported.append(line)
        # (in a user's own file, `strict`, every value is honoured or the entry refused: the run would not be the one
        # the file describes, as a key of another algorithm's is refused in rlspeed's own format)
        if blocking or key.split(".")[0] in BLOCKING or (self.strict and key.split(".")[0] not in BOOKKEEPING):
            self.blocking.append(line)

    def refuse_option(self, key: str, shown: str, rule: str) -> None:
        """`PolicySettings`'s refusal: one line per option, "key: shown: rule"."""
        self.refuse(key, f"{shown}: {rule}")

    def policy(self, value) -> None:
        """SB3's policy class -> rlspeed's encoder: MlpPolicy (MlpLstmPolicy) the flat MLP, CnnPolicy (CnnLstmPolicy)
        the CNN encoder (on-policy algorithms and DQN: linear heads on its features unless policy_kwargs set
        net_arch, as SB3's CnnPolicy has), MultiInputPolicy the multi-input encoder of Dict observations."""
        recurrent = self.algo == "recurrent_ppo"
        kinds = {"MlpLstmPolicy" if recurrent else "MlpPolicy": "mlp",
                 "CnnLstmPolicy" if recurrent else "CnnPolicy": "cnn",
                 "MultiInputLstmPolicy" if recurrent else "MultiInputPolicy": "auto"}
        if value not in kinds:
            self.refuse("policy", f"{value}: rlspeed's {self.algo} takes {', '.join(kinds)}")
            return
        self.notes.append(f"policy {value}: rlspeed's {self.algo} network with encoder {kinds[value]}")
        if kinds[value] == "cnn":
            self.set("encoder", "cnn", "policy")
            if self.algo in (*ON_POLICY, "dqn") and "net_arch" not in self.hyper:
                self.set("net_arch", [], "policy")
        elif kinds[value] == "auto":
            self.set("encoder", "auto", "policy")

    # --- one RL-Zoo key ------------------------------------------------------------------------------------------
    def entry(self, key: str, value) -> None:  # noqa: C901 (one branch per RL-Zoo key reads best as a table)
        algo = self.algo
        if key == "n_timesteps":  # (checked in `finish`, as rlspeed's own total_timesteps)
            self.run["total_timesteps"] = value
            self.origin["total_timesteps"] = key
        elif key in ("eval_freq", "target_return"):  # (rlspeed's run settings, which RL-Zoo's format has not)
            self.run[key] = value
            self.origin[key] = key
        elif key == "policy":
            self.policy(value)
        elif key == "n_envs":
            self.set("num_envs", value, key)
        elif key == "n_steps":  # rollout length on-policy; n-step returns in SB3's off-policy algorithms
            self.set("num_steps" if algo in ON_POLICY else "n_step", value, key)
        elif key == "normalize":
            self.normalize(value)
        elif key in ("learning_rate", "clip_range"):
            self.schedule(key, value)
        elif key == "vf_coef":
            if algo in HALF_VALUE_LOSS:
                from rlspeed.algos.base import coerce  # (late: presets load without torch)

                try:
                    number = coerce(key, value, float)
                except UserError as error:  # (a bad value: as `finish` refuses one)
                    self.refuse(key, str(error), blocking=self.strict)
                    return
                self.set("vf_coef", 2 * number, key)
                self.notes.append(f"vf_coef {value} -> {2 * number:g} (rlspeed's {algo} value loss is 0.5 * MSE)")
            else:
                self.set("vf_coef", value, key)
        elif key == "ent_coef" and algo == "sac":
            self.sac_entropy(key, value, "ent_coef", auto_init="ent_coef_init")
        elif key == "target_entropy" and algo == "sac":
            self.sac_entropy(key, value, "target_entropy", auto_init=None)
        elif key == "train_freq":
            self.train_freq(value)
        elif key == "noise_type":
            if value in ("normal", "ornstein-uhlenbeck"):
                self.set("action_noise", value, key)
            else:
                self.refuse(key, f"{value!r}: rlspeed has normal and ornstein-uhlenbeck action noise")
        elif key == "noise_std":
            self.set("action_noise_std", value, key)
        elif key == "frame_stack" and self.atari and value == 4:
            self.notes.append("frame_stack 4: rlspeed's Atari envs stack 4 frames")
        elif key == "env_wrapper" and self.atari and _atari_wrapper_options(value) is not None:
            self.atari_wrapper(key, _atari_wrapper_options(value))
        elif key == "frame_stack":
            self.refuse(key, f"{value}: rlspeed stacks frames only in its Atari envs (rlspeed.envs.atari, which its "
                             "own Atari presets use), not for other env ids yet")
        elif key == "env_wrapper":
            names = value if isinstance(value, list) else [value]
            shown = ", ".join(next(iter(n)) if isinstance(n, dict) else str(n) for n in names)
            self.refuse(key, f"{shown}: rlspeed does not apply RL-Zoo's env wrappers yet")
        elif key == "policy_kwargs":
            self.policy_kwargs(value)
        elif key == "replay_buffer_class":
            if value is None:
                self.notes.append(f"{key} None: SB3's default, nothing to set")
            elif value == "HerReplayBuffer" and algo not in ON_POLICY:
                self.set("her", True, key)
            elif algo in ON_POLICY:
                self.refuse(key, f"{value!r}: a replay buffer, which rlspeed's {algo} (on-policy) has not")
            else:
                self.refuse(key, f"{value!r}: rlspeed's off-policy algorithms have their own replay buffer, and "
                                 "HerReplayBuffer (her=True)")
        elif key == "replay_buffer_kwargs":
            self.replay_buffer_kwargs(value)
        elif key == "clip_range_vf":
            self.schedule(key, value)
            if self.hyper.get(key) is not None:  # (None: no value clipping, as SB3's)
                self.differ("clip_range_vf: rlspeed's PPO takes the larger of the clipped and unclipped value "
                            "errors (SB3 the clipped one)")
        elif key in SAME_NAME:
            self.set(key, value, key)
        elif key in SDE_KEYS:
            if value == SDE_KEYS[key]:
                self.notes.append(f"{key} {value}: SB3's default, nothing to set")
            elif self.algo not in SDE_ALGORITHMS:
                self.refuse(key, f"{value!r}: rlspeed's {self.algo} has no gSDE (state-dependent exploration)")
            else:
                self.set(key, value, key)
        elif key in NO_COUNTERPART:
            default, why = NO_COUNTERPART[key]
            if value == default:
                self.notes.append(f"{key} {value}: SB3's default, nothing to set")
            else:
                self.refuse(key, f"{value!r}: {why}")
        elif self.strict:
            self.unsupported.append(f"{key}: {self.unknown(key)}")
            self.blocking.append(self.unsupported[-1])
        else:
            self.refuse(key, f"{value!r}: not a key rlspeed knows how to translate")

    def unknown(self, key: str) -> str:
        """Why a user's entry in RL-Zoo's format cannot hold `key`: rlspeed's own name for something (where RL-Zoo
        writes it otherwise: which), or no name of either format (a typo)."""
        from rlspeed.algos import ALGORITHMS  # (late: presets load without torch)
        from rlspeed.presets.run_settings import RUN_KEYS

        own = {field.name for field in dataclasses.fields(ALGORITHMS[self.algo].config_cls)} | set(RUN_KEYS)
        if key not in own:
            close = difflib.get_close_matches(key, ZOO_NAMED, n=1)
            return "not a key of RL-Zoo's format that rlspeed knows" + (f" (did you mean {close[0]}?)" if close else "")
        instead = f"write {ZOO_SPELLING[key]} there" if key in ZOO_SPELLING else "RL-Zoo's format has no such key"
        return (f"rlspeed's name, in an entry that RL-Zoo's keys make RL-Zoo's format: {instead} (or write the whole "
                "entry in rlspeed's names)")

    def options(self, key: str, value, expected: str) -> dict:
        """An RL-Zoo value of keyword arguments (a dict, or its Python text) as a dict; an empty one, with `key`
        refused, where it is neither."""
        try:
            options = parse_python_literal(value, key) if isinstance(value, str) else value
        except UserError as error:
            self.refuse(key, str(error))
            return {}
        if not isinstance(options, dict):
            self.refuse(key, f"{value!r}: expected {expected}")
            return {}
        return options

    def replay_buffer_kwargs(self, value) -> None:
        """HerReplayBuffer's options (a dict, or its string): n_sampled_goal and goal_selection_strategy, rlspeed's
        hyperparameters of the same names; copy_info_dict is refused (rlspeed's compute_reward gets empty infos)."""
        options = self.options("replay_buffer_kwargs", value, "a dict of HerReplayBuffer options")
        for option, option_value in options.items():
            if option in ("n_sampled_goal", "goal_selection_strategy"):
                self.set(option, option_value, "replay_buffer_kwargs")
            elif option == "copy_info_dict" and option_value is False:
                self.notes.append("replay_buffer_kwargs copy_info_dict False: SB3's default, nothing to set")
            else:
                self.refuse(f"replay_buffer_kwargs.{option}", f"{option_value!r}: rlspeed's replay buffer has no such "
                                                              "option (HerReplayBuffer's n_sampled_goal and "
                                                              "goal_selection_strategy are taken)")

    def normalize(self, value) -> None:
        """RL-Zoo's `normalize`: a bool, or a dict (or its string) of VecNormalize arguments."""
        if isinstance(value, bool):
            options = {"norm_obs": value, "norm_reward": value}
        else:
            try:
                options = parse_python_literal(value, "normalize") if isinstance(value, str) else value
            except UserError as error:
                self.refuse("normalize", str(error))
                return
            if not isinstance(options, dict):
                self.refuse("normalize", f"{value!r}: expected true, false or a dict of VecNormalize options")
                return
            options = {"norm_obs": True, "norm_reward": True, **options}  # VecNormalize's defaults
        from rlspeed.algos import ALGORITHMS  # (late: presets load without torch)

        own = {field.name for field in dataclasses.fields(ALGORITHMS[self.algo].config_cls)}
        for option, option_value in options.items():
            name = "normalize_" + option.removeprefix("norm_")
            if option == "norm_reward" and option_value is False and name not in own:
                continue  # (VecNormalize's rewards left as they are: what an algorithm without the setting does)
            if option == "norm_reward" and option_value is True and name not in own:
                self.refuse("normalize.norm_reward", f"rlspeed's {self.algo} normalises observations only "
                                                     "(normalize_obs), not rewards")
            elif option in ("norm_obs", "norm_reward") and isinstance(option_value, bool):
                self.set(name, option_value, "normalize")
            elif option in _NORMALIZE_CLIPS and f"{_NORMALIZE_CLIPS[option]}_clip" in own:
                if options[f"norm_{option.removeprefix('clip_')}"] is True:
                    self.set(f"{_NORMALIZE_CLIPS[option]}_clip", option_value, f"normalize.{option}")
                else:
                    self.notes.append(f"normalize {option} without norm_{option.removeprefix('clip_')}: unused, as "
                                      "VecNormalize leaves it")
            elif option == "gamma":
                self.normalize_gamma = option_value
            elif option == "epsilon" and option_value == 1e-8:
                self.notes.append("normalize epsilon 1e-8: rlspeed's too")
            else:
                self.refuse(f"normalize.{option}", f"{option_value!r}: rlspeed's normalisation takes clip_obs, "
                                                   "clip_reward and gamma, with epsilon 1e-8, and has no other options")

    def schedule(self, key: str, value) -> None:
        """A number, or `lin_X` / `linear_X` (linear from X to 0 over the run, RL-Zoo's schedules): the value plus
        rlspeed's annealing flag. A number written as text (YAML 1.1 reads `3e-4` so) is that number, held constant.
        A schedule rlspeed cannot follow is refused, and in a user's own file (`strict`) the entry with it: trained
        with another value, the run would not be the one the file describes."""
        flag = {"learning_rate": "anneal_lr", "clip_range": "anneal_clip"}.get(key)
        # every algorithm anneals its learning rate (`anneal_lr`); PPO's clip range too; clip_range_vf never
        has_flag = flag == "anneal_lr" or flag is not None and self.algo in ("ppo", "recurrent_ppo")
        if isinstance(value, str):
            try:
                value = float(value)  # (text that is a number: a constant, as rlspeed's own format reads it)
            except ValueError:
                pass
        if isinstance(value, str):
            kind, _, start = value.partition("_")
            try:
                number = float(start)
            except ValueError:
                number = None
            if kind not in ("lin", "linear") or number is None:
                self.refuse(key, f"{value!r}: rlspeed reads constant values and lin_X or linear_X (linear decay to 0) "
                                 "schedules", blocking=self.strict)
                return
            self.set(key, number, key)
            if has_flag:
                self.set(flag, True, key)
                if self.algo in ON_POLICY:
                    self.differ(f"{key} {value}: rlspeed takes each update's {key} at the step count before its "
                                "rollout, SB3 after it (one update's worth lower, 0 in the last update)")
            else:
                held = "" if self.strict else f"; {number:g} is held constant"  # (strict: the entry is refused)
                self.refuse(key, f"{value!r}: rlspeed's {self.algo} has no {key} schedule{held}", blocking=self.strict)
        else:
            self.set(key, value, key)
            if has_flag:
                self.set(flag, False, key)

    def sac_entropy(self, key: str, value, target: str, auto_init: str | None) -> None:
        """SAC's `auto`, `auto_X` (tuned, starting at X) or a number."""
        if isinstance(value, str) and value.startswith("auto"):
            self.set(target, None, key)
            start = value.removeprefix("auto").removeprefix("_")
            if start and auto_init is not None:
                try:
                    self.set(auto_init, float(start), key)
                except ValueError:
                    self.refuse(key, f"{value!r}: expected auto, auto_X or a number")
            elif start:
                self.refuse(key, f"{value!r}: expected auto or a number")
        else:
            self.set(target, value, key)

    def train_freq(self, value) -> None:
        """An int (steps of every env), `[n, "step"]`, or `[n, "episode"]` (not in rlspeed)."""
        if isinstance(value, (list, tuple)) and len(value) == 2 and value[1] == "step":
            value = value[0]
        if isinstance(value, (list, tuple)) and self.strict:  # (a user's own file: refused, saying what to write)
            self.refuse("train_freq", f"{list(value)}: rlspeed collects a fixed number of steps per iteration, not "
                                      "whole episodes: give train_freq in steps (the env's episode length, e.g. 200, "
                                      "with the entry's gradient_steps, or 1 with gradient_steps -1, one update per "
                                      "env step collected, as SB3's -1)")
        elif isinstance(value, (list, tuple)):
            self.refuse("train_freq", f"{list(value)}: rlspeed collects a fixed number of steps per iteration, not "
                                      "whole episodes; its train_freq 1 (with the entry's gradient_steps) is used")
            self.episode_train_freq = list(value)
        else:
            self.set("train_freq", value, "train_freq")

    def policy_kwargs(self, value) -> None:
        """SB3 policy arguments (a dict, or its text): `rlspeed.policy_kwargs.translate_policy_kwargs`, the rule a
        model's refusal of the keyword names the same settings by."""
        translate_policy_kwargs(self.algo, self.options("policy_kwargs", value, "dict(...)"), self)

    # --- the result ----------------------------------------------------------------------------------------------
    def check_normalize_gamma(self) -> None:
        """`normalize`'s gamma: RL-Zoo replaces it by the entry's gamma where the entry has one; rlspeed discounts the
        normalised return at the algorithm's gamma, so another value there is refused."""
        if self.normalize_gamma is None:
            return
        from rlspeed.algos import ALGORITHMS

        if "gamma" in self.hyper:
            self.notes.append("normalize gamma: RL-Zoo replaces it by the entry's gamma, at which rlspeed discounts")
            return
        algorithm_gamma = {field.name: field.default
                           for field in dataclasses.fields(ALGORITHMS[self.algo].config_cls)}["gamma"]
        if self.normalize_gamma == algorithm_gamma:
            self.notes.append(f"normalize gamma {algorithm_gamma}: the algorithm's, at which rlspeed discounts")
        else:
            self.refuse("normalize.gamma", f"{self.normalize_gamma!r}: rlspeed discounts the normalised return at the "
                                           f"algorithm's gamma ({algorithm_gamma}); give the entry gamma: "
                                           f"{self.normalize_gamma} to use it for both")

    def finish(self, source: str) -> Translation:
        """SB3's defaults where the entry is silent, then the check against the rlspeed config: a key the config
        lacks or a value of the wrong kind is refused; values that fail together refuse the whole entry."""
        from rlspeed.algos import ALGORITHMS
        from rlspeed.algos.base import build_config, coerce
        from rlspeed.presets.run_settings import coerce_run_settings

        for key in list(self.run):  # (n_timesteps: a whole number of steps >= 1, 1e6 or !!float 1e6 too, not truncated)
            try:
                self.run.update(coerce_run_settings({key: self.run[key]}))
            except UserError as error:
                self.refuse(self.origin[key], str(error), blocking=self.strict)
                self.run.pop(key)
        self.check_normalize_gamma()
        steps = self.hyper.get("gradient_steps", 1)  # (SB3's default)
        if self.episode_train_freq is not None and steps != -1:
            # (SB3: that many updates per collected episode; here per env step: an episode's length times as many)
            self.refuse("train_freq", f"{self.episode_train_freq} with gradient_steps {steps} ({steps} updates per "
                        f"episode) would be {steps} per env step here, an episode's length times as many: give "
                        "train_freq in steps (the env's episode length, e.g. 200) or gradient_steps -1 (one update per "
                        "env step collected, as SB3's -1)", blocking=True)
        filled = {k: v for k, v in SB3_DEFAULTS[self.algo].items() if k not in self.hyper}
        if filled:
            self.notes.append("SB3's defaults where rlspeed's differ: "
                              + ", ".join(f"{k} {v}" for k, v in filled.items()))
        hyper = {**filled, **self.hyper}
        config_cls = ALGORITHMS[self.algo].config_cls
        hints = typing.get_type_hints(config_cls)
        missing: dict[str, list[str]] = {}
        for key in list(self.hyper):
            if key not in hints or key in getattr(config_cls, "refused", {}):
                missing.setdefault(self.origin[key], []).append(key)
                hyper.pop(key)
                continue
            try:
                coerce(key, hyper[key], hints[key])
            except UserError as error:  # (a bad value: in a user's own file, the entry is refused, as for a typo)
                self.refuse(self.origin[key], str(error), blocking=self.strict)
                hyper.pop(key)
        for origin, keys in missing.items():
            self.refuse(origin, f"rlspeed's {self.algo} has no {' or '.join(keys)}")
        try:
            build_config(config_cls, hyper)
        except UserError as error:
            self.refuse("config", f"the translated values do not make a valid {config_cls.__name__}: {error}")
        translated: dict[str, list[str]] = {}
        for key, origin in self.origin.items():
            if key in hyper or key in self.run:
                translated.setdefault(origin, []).append(key)
        return Translation(hyperparameters=hyper, run=self.run, unsupported=self.unsupported, source=source,
                           notes=self.notes, blocking=self.blocking, translated=translated,
                           differences=self.differences)

