"""Reading YAML a person wrote (preset files, search spaces, `--set` values) without silent surprises: a key given
twice, or an integer with a leading zero (YAML 1.1, which PyYAML reads, takes `010` as the octal number 8) or with
colons (`1:30` is the base-60 number 90), is refused in one sentence instead of being read as something else."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rlspeed.env_options import rebuild
from rlspeed.errors import UserError

_OCTAL = re.compile(r"[-+]?0[0-7_]+")


class InvalidYAML(UserError):
    """Text that is not YAML at all (a refused key or value is a plain UserError)."""


class _Surprise(yaml.YAMLError):
    """A value or key the reader refuses (its message is the sentence's end)."""


#: YAML's tag of a Python tuple (`!!python/tuple [128, 64]`): env options an env takes only as tuples
TUPLE_TAG = "tag:yaml.org,2002:python/tuple"


def _tuple(loader: yaml.SafeLoader, node):
    return tuple(loader.construct_sequence(node, deep=True))


class _RunFileLoader(yaml.SafeLoader):
    """PyYAML's safe loader that also reads tuples (`TUPLE_TAG`), as a run's config.yaml writes env options."""


class _TaggedTuple(tuple):
    """A tuple `dump_run_file` writes with `TUPLE_TAG` (other tuples are written as lists, as safe_dump does)."""


class _RunFileDumper(yaml.SafeDumper):
    """PyYAML's safe dumper that writes `_TaggedTuple`s as tuples."""


_RunFileLoader.add_constructor(TUPLE_TAG, _tuple)  # (before `_StrictLoader` copies the constructors it inherits)
_RunFileDumper.add_representer(_TaggedTuple, lambda dumper, data: dumper.represent_sequence(TUPLE_TAG, data,
                                                                                            flow_style=True))


class _StrictLoader(_RunFileLoader):
    """`_RunFileLoader` that refuses duplicate keys and octal or base-60 integers: the reader of what a person wrote
    (`read`)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            lines = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # (`<<: *base` overrides on purpose)
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    first = lines.get(key)
                except TypeError:  # (an unhashable key: the base loader's own error)
                    continue
                if first is not None:
                    where = f"line {line}" if first == line else f"lines {first} and {line}"
                    raise _Surprise(f"gives {key} twice ({where}): give it once")
                lines[key] = line
        return super().construct_mapping(node, deep=deep)


def _int(loader: _StrictLoader, node):
    text = node.value
    if _OCTAL.fullmatch(text):
        raise _Surprise(f"writes {text} with a leading zero, which YAML reads as the octal number "
                        f"{loader.construct_yaml_int(node)}: write it without the zero")
    if ":" in text:
        raise _Surprise(f"writes {text}, which YAML reads as the base-60 number {loader.construct_yaml_int(node)}: "
                        "quote it or write the number")
    return loader.construct_yaml_int(node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _int)


class _ValueLoader(_StrictLoader):
    """`_StrictLoader` that reads an unquoted number with an exponent and no dot (`1e-3`, `1e999`) and an unquoted
    `inf`, `infinity` or `nan` (any case, signed) as a float, as YAML 1.2 and Python do, where YAML 1.1 reads them as
    text: the reader of a `--set` or `--env-kwargs` value (`read_value`). A quoted scalar stays text."""


_ValueLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+"
               r"|[-+]?(?:[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[nN][aA][nN]))$"),
    list("-+0123456789.iInN"))


def dump_run_file(config: dict, tuples_under: tuple[str, ...] = ("env_kwargs",)) -> str:
    """A run's config.yaml: `yaml.safe_dump` in the order of the keys, non-ASCII text as it is, with the tuples under
    the keys `tuples_under` tagged as tuples (an env may take only a tuple: highway-env's `observation_shape`), so
    that `load_run_file` gives them back."""
    config = {key: rebuild(value, lambda items, path, was_tuple: _TaggedTuple(items) if was_tuple else items)
              if key in tuples_under else value for key, value in config.items()}
    return yaml.dump(config, Dumper=_RunFileDumper, sort_keys=False, allow_unicode=True)


def load_run_file(text: str):
    """The data of a run's config.yaml (`dump_run_file`): `yaml.safe_load`'s, with its tuples (yaml.YAMLError where
    it is not YAML). Without `read`'s refusals: the file is rlspeed's own writing, whose values read back as written;
    a config.yaml a person gives as input (`--preset`) is read by `read`."""
    return yaml.load(text, Loader=_RunFileLoader)  # noqa: S506 (a SafeLoader subclass)


def read(text: str, where: str):
    """The data of the YAML `text`; UserError naming `where` (a file, a flag) for invalid YAML, a key given twice in
    one mapping, or an integer YAML would read in another base."""
    return _read(text, where, _StrictLoader)


def read_value(text: str, where: str):
    """`read`, with an unquoted `1e-3`, `inf` or `nan` a float at any depth (`_ValueLoader`): a `--set` or
    `--env-kwargs` value, which a person writes as on Python's command line; `'1e3'` quoted stays text."""
    return _read(text, where, _ValueLoader)


def _read(text: str, where: str, loader: type):
    """`read` with `loader`."""
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 (a SafeLoader subclass)
    except _Surprise as error:
        raise UserError(f"{where} {error}.") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        # (what is wrong there, "found character '\t' that cannot start any token", rather than what PyYAML was
        # doing, "while scanning for the next token")
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        if problem.startswith("but ") and getattr(error, "context", None):  # ("expected a single document ...")
            problem = f"{error.context} {problem}"
        if "'\\t'" in problem:
            problem += ": write spaces there, not a tab"
        raise InvalidYAML(f"{where} is not valid YAML{at}: {problem}.") from None


def read_file(path: Path) -> tuple[str, object]:
    """(text, data) of the YAML file at `path`, read as UTF-8 whatever the locale (as rlspeed writes its files);
    UserError naming the file where it is not UTF-8 text, or as `read`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}): "
                        "save it as UTF-8.") from None
    return text, read(text, str(path))
