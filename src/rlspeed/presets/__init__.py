"""Tuned hyperparameters per (algorithm, env id): rlspeed's own YAML files in this package, RL-Zoo's translated
(`rlspeed.presets.zoo`, when rl_zoo3 is installed), or a user's YAML file.

A preset file maps env ids to entries (`default` for any other env); an entry holds hyperparameters plus run
settings (total_timesteps, eval_freq, target_return). A user's file may instead be one entry for any env (a flat
mapping of hyperparameters), or be in RL-Zoo's format (SB3 names, n_timesteps, policy, ...), which is translated.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from importlib import resources
from pathlib import Path
from typing import Any

from rlspeed import yamlfile
from rlspeed.errors import UserError
from rlspeed.files import local_path, refuse_irregular_file
from rlspeed.presets.run_settings import RUN_KEYS, coerce_run_settings

#: A preset file's entry for every Atari image id without an entry of its own (RL-Zoo's name for it)
ATARI_KEY = "atari"
SOURCES = ("auto", "rlspeed", "zoo", "none")
#: keys only an RL-Zoo entry has: one of them marks a user's file as RL-Zoo's format
ZOO_KEYS = ("n_timesteps", "policy", "n_envs", "n_steps", "policy_kwargs", "normalize", "noise_type", "noise_std",
            "frame_stack", "env_wrapper")


class Preset(dict[str, Any]):
    """A preset's values (a dict: hyperparameters and run settings) plus where they came from.

    `source`: 'rlspeed' (its own entry for the env), 'rlspeed-default' (its `default` entry, or {} where no file
    ships), 'zoo' (RL-Zoo's, translated), 'file' or 'none' (no preset: the algorithm's defaults); `origin`: the same
    in words for a person; `unsupported`: the entries of an RL-Zoo-format preset that are not honoured ("key: why");
    `notes`: meaning changes applied; `differences`: those of them where rlspeed then behaves otherwise than SB3.
    """

    def __init__(self, values: dict, source: str, origin: str, unsupported: list[str] | None = None,
                 notes: list[str] | None = None, differences: list[str] | None = None):
        super().__init__(values)
        self.source, self.origin = source, origin
        self.unsupported = list(unsupported or [])
        self.notes = list(notes or [])
        self.differences = list(differences or [])

    def message(self) -> str:
        """The line for the CLI to print naming the preset a run uses (and what of it is not honoured)."""
        line = f"rlspeed: using {self.origin}"
        if self.unsupported:
            line += "; not honoured: " + "; ".join(self.unsupported)
        if self.differences:
            line += "; differs from SB3: " + "; ".join(self.differences)
        return line + "."


def load_preset(algo: str, env_id: str, source: str = "rlspeed",
                env_kwargs: dict[str, Any] | None = None) -> Preset:
    """The preset of (`algo`, `env_id`) from `source` (`env_kwargs`: the env's options; an Atari id made with
    `obs_type="ram"` is a task of 128 bytes, not of images: the Atari presets, rlspeed's and RL-Zoo's, are not its):

    - 'rlspeed': rlspeed's own entry for the env, else the algorithm's `default` entry (no merging), else {};
    - 'zoo': RL-Zoo's entry, translated (UserError without rl_zoo3, without an entry for the pair, or when the entry
      needs what rlspeed has not: an image policy, env wrappers, frame stacking);
    - 'auto': rlspeed's own entry for the env if it has one, else RL-Zoo's if rl_zoo3 is installed and its entry
      translates, else rlspeed's `default` entry (`Preset.message` says which and why);
    - 'none': no preset: the algorithm's own defaults (as its Python constructor has them);
    - a path: the user's YAML file (rlspeed's or RL-Zoo's format, detected per entry; unknown keys are a UserError).
    """
    if source == "none":
        return Preset({}, "none", f"{algo}'s own defaults (--preset none: no preset)")
    images = (env_kwargs or {}).get("obs_type") != "ram"
    if source == "rlspeed":
        return _shipped(algo, env_id, images)
    if source == "zoo":
        if not images and atari_image_id(env_id):
            raise UserError(f"RL-Zoo's Atari entry for {env_id} is for its images, not obs_type=ram: use --preset "
                            "rlspeed (its default preset) or a preset file of your own.")
        return _zoo(algo, env_id)
    if source == "auto":
        return _auto(algo, env_id, images)
    return load_preset_file(source, algo, env_id, images)


def atari_image_id(env_id: str) -> bool:
    """`rlspeed.envs.atari.atari_image_id`, imported when asked (presets load without torch)."""
    from rlspeed.envs.atari import atari_image_id as image_id

    return image_id(env_id)


def _shipped(algo: str, env_id: str, images: bool = True) -> Preset:
    """rlspeed's own preset for `env_id` (or the native id behind `rlspeed/ID`), else the `default` entry (`images`
    False: an Atari id's RAM variant, which the Atari preset is not for)."""
    path = resources.files(__package__) / f"{algo}.yaml"
    if not path.is_file():
        return Preset({}, "rlspeed-default", f"{algo}'s defaults (rlspeed ships no {algo} presets)")
    presets = copy.deepcopy(_parsed_shipped(path.read_text(encoding="utf-8"), path.name))
    if env_id not in presets and env_id.startswith("rlspeed/"):  # the Gymnasium view of a native env: same task
        env_id = env_id[len("rlspeed/"):]
    # (asked only where the answer matters: it imports torch, and presets load without it)
    if env_id in presets and env_id not in ("default", ATARI_KEY) and (images or not atari_image_id(env_id)):
        return Preset(presets[env_id], "rlspeed", f"rlspeed's preset for {algo} {env_id}")
    if ATARI_KEY in presets and atari_image_id(env_id):
        if images:
            return Preset(presets[ATARI_KEY], "rlspeed", f"rlspeed's Atari preset for {algo} (every Atari game)")
        return Preset(presets.get("default", {}), "rlspeed-default",
                      f"rlspeed's default {algo} preset (the Atari preset is for images, not obs_type=ram)")
    return Preset(presets.get("default", {}), "rlspeed-default", f"rlspeed's default {algo} preset (none for {env_id})")


@functools.lru_cache(maxsize=16)
def _parsed_shipped(text: str, name: str) -> dict:
    """The entries of a shipped preset file whose text is `text`, parsed once per text: every command and run reads
    its algorithm's file, and parsing it costs more than the read (the caller copies what it hands out)."""
    return yamlfile.read(text, f"rlspeed's {name}") or {}


def _zoo(algo: str, env_id: str) -> Preset:
    """RL-Zoo's preset, translated; UserError when it cannot be honoured as a whole."""
    from rlspeed.presets import zoo

    translation = zoo.translate(algo, env_id)
    if translation.blocking:
        raise UserError(f"{translation.source} cannot be used: {'; '.join(translation.blocking)}.")
    return _from_translation(translation, "zoo")


def _from_translation(translation, source: str) -> Preset:
    return Preset({**translation.run, **translation.hyperparameters}, source, translation.source,
                  translation.unsupported, translation.notes, translation.differences)


def _auto(algo: str, env_id: str, images: bool = True) -> Preset:
    """rlspeed's own preset, else RL-Zoo's (when installed, with an entry that translates), else the default."""
    from rlspeed.presets import zoo

    own = _shipped(algo, env_id, images)
    if own.source == "rlspeed" or not images:  # (RL-Zoo's Atari entries are for images too)
        return own
    version = zoo.zoo_version()
    if algo not in zoo.ZOO_NAMES:
        return own
    if version is None:
        own.origin += "; pip install rl_zoo3 for RL-Zoo's tuned presets"
        return own
    if not zoo.has_entry(algo, env_id):
        own.origin += f"; RL-Zoo (rl_zoo3 {version}) has none either"
        return own
    translation = zoo.translate(algo, env_id)
    if translation.blocking:
        own.origin += f"; {translation.source} needs what rlspeed has not: {'; '.join(translation.blocking)}"
        return own
    if any(line.startswith("use_sde") for line in translation.unsupported):
        # values tuned around gSDE's exploration (log_std_init, learning rates) would be used without it
        own.origin += (f"; {translation.source} was tuned with gSDE, which rlspeed's {algo} lacks (--preset zoo "
                       "uses it anyway)")
        return own
    return _from_translation(translation, "zoo")


def load_preset_file(path: str | Path, algo: str, env_id: str, images: bool = True) -> Preset:
    """The entry for `env_id` (else `atari` for an Atari game's images, as in rlspeed's and RL-Zoo's files; else
    `default`) of the user's YAML file at `path`, or the file itself when it is one flat entry; an entry in RL-Zoo's
    format is translated (for an Atari game's images, its AtariWrapper and frame_stack 4 are what rlspeed's Atari envs
    do). UserError for a missing or unreadable file, no entry for the env, unknown keys or bad values (naming the
    file and the key). `images` False: the env is made with obs_type="ram", which no Atari entry is for."""
    from rlspeed.algos import ALGORITHMS
    from rlspeed.algos.base import MODEL_ARGUMENTS, build_config

    path = local_path(path)
    # (named as the preset file, not as `--preset` or `load_preset`'s `source`: the file is what either caller gave)
    refuse_irregular_file(path, f"The preset file {path}", f"a YAML file, or one of {', '.join(SOURCES)}")
    if not path.is_file():
        raise UserError(f"The preset file {path}: no such file; give a YAML file, or one of {', '.join(SOURCES)}.")
    text, data = yamlfile.read_file(path)
    tuned_for = _tuned_algorithm(text)
    if tuned_for is not None and tuned_for != algo:
        raise UserError(f"{path} was tuned for {tuned_for} by rlspeed tune, not for {algo}: train {tuned_for} with "
                        f"it (rlspeed train {tuned_for} ... --preset {path}), or tune {algo}.")
    if not isinstance(data, dict) or not data:
        holds = "nothing" if data is None or data == {} else f"a {type(data).__name__}"
        raise UserError(f"{path} must map env ids to presets (or hyperparameter names to values); it holds "
                        f"{holds}.")
    names = set(RUN_KEYS) | set(ZOO_KEYS) | set(MODEL_ARGUMENTS) | {field.name for cls in ALGORITHMS.values()
                                             for field in dataclasses.fields(cls.config_cls)}
    # (a hyperparameter may hold a mapping too, net_arch: {pi: [...], vf: [...]}: not an env entry)
    nested = [isinstance(value, dict) and str(key) not in names for key, value in data.items()]
    taken = ""  # (what of a run's config.yaml the preset takes: said where it is used, not in a refusal)
    if isinstance(data.get("hyperparameters"), dict) and "algo" in data and "env_id" in data:
        entry, where, taken = _from_run_config(path, data, algo, env_id)  # (checked below as any entry)
    elif all(nested):  # env id -> entry
        atari = ATARI_KEY if ATARI_KEY in data and images and atari_image_id(env_id) else None
        key = next((k for k in (env_id, env_id.removeprefix("rlspeed/"), atari, "default") if k in data), None)
        if key is None:
            name = re.sub(r"-v\d+$", "", env_id.removeprefix("rlspeed/"))
            versions = [str(k) for k in data if re.fullmatch(rf"{re.escape(name)}-v\d+", str(k))]
            hint = (f": {versions[0]} is another version of the env (rename the entry to {env_id} if its values suit "
                    "it)" if versions else "")
            algorithms = [str(k) for k in data if str(k) in ALGORITHMS]
            if algorithms and not hint:  # (several algorithms' presets in one file: rlspeed takes one's)
                named = f"{algorithms[0]} names an algorithm" if len(algorithms) == 1 else \
                    f"{', '.join(algorithms)} name algorithms"
                hint = (f": {named}; a preset file holds one algorithm's entries by env id (give {algo}'s as a file "
                        "of its own)")
            raise UserError(f"{path} has no entry for {env_id} and no default entry (it has "
                            f"{', '.join(map(str, data))}){hint}.")
        entry, where = data[key], f"{path} ({key} entry)"
    elif env_like := [key for key, is_entry in zip(data, nested) if not is_entry and isinstance(key, str)
                      and (key in (env_id, "default", ATARI_KEY) or re.search(r"-v\d+$", key))]:
        # (an env's entry that is not a mapping: its lines left unindented, or all commented out)
        held = "nothing" if data[env_like[0]] is None else repr(data[env_like[0]])
        raise UserError(f"{path}: the entry {env_like[0]} holds {held}, not hyperparameters; write them under it as "
                        f"`name: value` lines, indented.")
    elif not any(nested):  # one entry for any env
        entry, where = data, f"{path}"
    else:
        raise UserError(f"{path} mixes env entries and hyperparameters at the top level: put every hyperparameter "
                        "under an env id (or `default`), or none.")
    entry = {str(k): v for k, v in entry.items()}
    if any(k in entry for k in ZOO_KEYS):
        from rlspeed.presets import zoo

        translation = zoo.translate_entry(algo, entry, f"{where}{taken}, RL-Zoo's format", strict=True,
                                          atari=images and atari_image_id(env_id))
        if translation.blocking:
            raise UserError(f"{where} (RL-Zoo's format) cannot be used: {'; '.join(translation.blocking)}.")
        return _from_translation(translation, "file")
    if algo not in ALGORITHMS:
        raise UserError(f"Unknown algorithm '{algo}': use one of {', '.join(ALGORITHMS)}.")
    try:
        _, hyper = split_run_settings(entry)  # (the run settings' numbers checked too: attributed to the file)
        build_config(ALGORITHMS[algo].config_cls, hyper)
    except UserError as error:
        raise UserError(f"{where}: {error}") from None
    return Preset(entry, "file", f"{where}{taken}, rlspeed's format")


def _from_run_config(path: Path, data: dict, algo: str, env_id: str) -> tuple[dict, str, str]:
    """(entry, where, taken) of a run's config.yaml given as a preset: its hyperparameters and run settings (the
    seed, env backend and env options are the command line's: `taken` names the run's). UserError for another
    algorithm's run or a population's (per-member values)."""
    if data["algo"] != algo:
        raise UserError(f"{path} is the config.yaml of a {data['algo']} run: train {data['algo']} with it, or give "
                        f"{algo} a preset of its own.")
    hyper = dict(data["hyperparameters"])
    if "seeds" in data or any(isinstance(value, list) and key != "net_arch" for key, value in hyper.items()):
        raise UserError(f"{path} is a population's config.yaml: its per-member values do not fit one run (train the "
                        f"population again with --seeds, or copy one member's values into a preset).")
    if hyper.get("use_masking") is True:
        del hyper["use_masking"]  # (its default, which the run did not ask for: no word about masks the env lacks)
    entry = {key: data[key] for key in RUN_KEYS if key in data}
    other_env = data["env_id"] != env_id
    if other_env:  # (its target is the other env's: this env's own threshold applies, or --target-return)
        entry.pop("target_return", None)
    entry.update(hyper)
    given = {key: data[key] for key in ("seed", "env_backend", "env_kwargs", "init_from") if data.get(key) is not None}
    note = f"; not taken from it: {', '.join(f'{k} {v}' for k, v in given.items())} (flags)" if given else ""
    if other_env:
        note += f"; its target_return is {data['env_id']}'s, not taken"
    return entry, f"{path}, a run's config.yaml ({data['env_id']})", note


def _tuned_algorithm(text: str) -> str | None:
    """The algorithm a preset file `rlspeed tune` wrote was tuned for (None for any other file)."""
    from rlspeed.tune import PRESET_HEADER, preset_algorithm

    return preset_algorithm(text) if text.startswith(PRESET_HEADER) else None


def split_run_settings(preset: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate the run settings of `preset` (a preset's dict: total_timesteps, eval_freq, target_return) from its
    algorithm hyperparameters, returning (run settings, hyperparameters); the run settings as `learn` takes them
    (`coerce_run_settings`), so that `model.learn(**run)` runs what the CLI would."""
    run = coerce_run_settings({k: preset[k] for k in RUN_KEYS if k in preset})
    hyper = {k: v for k, v in preset.items() if k not in RUN_KEYS}
    return run, hyper
