"""The documentation's promises: its Python examples run, its relative links resolve, the README stays a front door.

Every ```python block of README.md and docs/*.md runs, in order, one page at a time in one namespace (a later block
may use what an earlier one defined), in a temporary directory. A block is left out only when it needs something
CI does not install (Stable-Baselines3, torch_npu, ...), marked either by an info string with attributes
(```python title="sb3_ppo.py"```, shown as a file) or by a `<!-- skip: reason -->` line right before it; the test
checks that such a block names one of `NOT_IN_CI`, so the mark cannot hide a broken example.

The API reference covers the public API: every name in the `__all__` of `PUBLIC_MODULES` has a docstring and is named
in docs/, the docstrings of the top-level names and of the submodules' names the docs point to name each argument
(the configs' fields: docs/algorithms.md), and every `rlspeed.x.y` and `Name(keyword=...)` the docs' prose gives
exists.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150
#: What a skipped block must import or name: packages CI (`pip install -e ".[test]"`) does not install.
NOT_IN_CI = ("stable_baselines3", "sb3_contrib", "torch_npu", "onnx")

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>.*)$")
_SKIP = re.compile(r"^\s*<!--\s*skip\b.*-->\s*$")
#: `<!-- needs: module ... -->` right before a block: it runs where those optional modules import (CI installs the
#: extras), and is left out where they do not (a bare `pip install -e ".[test]"`, the README's command)
_NEEDS = re.compile(r"^\s*<!--\s*needs:\s*(?P<modules>[\w. ]+?)\s*-->\s*$")
_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    attributes: str  # what follows the language in the info string
    skip_comment: bool  # a <!-- skip ... --> line right before the fence
    code: str
    needs: tuple[str, ...] = ()  # a <!-- needs: ... --> line right before the fence: optional modules it imports

    @property
    def missing(self) -> list[str]:
        """The modules this block needs that do not import here."""
        return [name for name in self.needs if importlib.util.find_spec(name) is None]

    @property
    def runs(self) -> bool:
        return self.language == "python" and not self.attributes and not self.skip_comment

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with their language and exclusion marks."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        fence, indent = match["fence"], len(match["indent"])
        language, _, attributes = match["info"].strip().partition(" ")
        start, body = index, []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index][indent:] if lines[index][:indent].strip() == "" else lines[index])
            index += 1
        skip = start > 0 and bool(_SKIP.match(lines[start - 1]))
        needs = _NEEDS.match(lines[start - 1]) if start > 0 else None
        blocks.append(Block(page, start + 1, language, attributes.strip(), skip, "\n".join(body) + "\n",
                            tuple(needs["modules"].split()) if needs else ()))
        index += 1
    return blocks


def python_pages() -> list[Path]:
    return [page for page in PAGES if any(block.language == "python" for block in code_blocks(page))]


@pytest.fixture
def docs_sandbox(tmp_path, monkeypatch):
    """Run examples in a temporary directory, with the acceleration cache there too (not the user's)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSPEED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    monkeypatch.delenv("RLSPEED_DEVICE", raising=False)
    yield tmp_path
    # settings a page's example may set (the checkpoint key) must not reach the next page, even when it failed
    for name in ("RLSPEED_CHECKPOINT_KEY", "RLSPEED_CHECKPOINT_KEY_FILE", "RLSPEED_CHECKPOINT_CIPHER"):
        os.environ.pop(name, None)


def run_page(page: Path) -> int:
    """Execute a page's runnable Python blocks in order in one namespace; returns how many ran. An exception names
    the page and line of the block it came from, and so does a warning of rlspeed's that a block's own line gets (a
    reader running the example would see it: `UnusedSettingWarning` for a batch larger than the rollout, ...); an
    example that shows a warning on purpose catches it."""
    import warnings

    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for block in code_blocks(page):
        if not block.runs or block.missing:
            continue
        # compile with the page's line numbers, so a traceback points into the Markdown file
        source = "\n" * block.line + block.code
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                exec(compile(source, str(page), "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"the Python block at {block.where} failed: {type(error).__name__}: {error}") \
                from error
        warned = [warning for warning in caught if warning.filename == str(page)
                  and (warning.category.__module__.startswith("rlspeed") or str(warning.message).startswith("rlspeed"))]
        if warned:
            raise AssertionError(f"the Python block at {block.where} warns at line {warned[0].lineno}: "
                                 f"{warned[0].category.__name__}: {warned[0].message}")
        ran += 1
    return ran


@pytest.mark.parametrize("page", python_pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_python_blocks_run(page, docs_sandbox):
    blocks = [block for block in code_blocks(page) if block.runs]
    if blocks and all(block.missing for block in blocks):
        pytest.skip(f"needs {', '.join(sorted({name for block in blocks for name in block.missing}))}")
    assert run_page(page) > 0 or not blocks


def test_readme_example_is_collected():
    """The README's example is among the blocks that run (a change to the fences cannot make this test vacuous)."""
    runnable = [block for block in code_blocks(ROOT / "README.md") if block.runs]
    assert runnable and "model.learn(" in runnable[0].code


def test_skipped_blocks_need_what_ci_lacks():
    for page in PAGES:
        for block in code_blocks(page):
            if block.language == "python" and not block.runs:
                assert any(name in block.code for name in NOT_IN_CI), (
                    f"the Python block at {block.where} is not run by the tests but needs nothing CI lacks "
                    f"({', '.join(NOT_IN_CI)}): make it runnable and drop its mark")


def test_a_broken_block_fails(tmp_path, docs_sandbox):
    page = tmp_path / "broken.md"
    page.write_text("# Example\n\n```python\nimport rlspeed\nrlspeed.make_env('CartPole-v1').reset()\n```\n\n"
                    "```python\nrlspeed.PPO('CartPole-v1', n_epoch=3)\n```\n")
    with pytest.raises(AssertionError, match=r"broken\.md:8 failed: UserError"):
        run_page(page)
    page.write_text("# Example\n\n```python\nimport rlspeed\n"
                    "rlspeed.PPO('CartPole-v1', num_envs=2, num_steps=8)\n```\n")
    with pytest.raises(AssertionError, match=r"broken\.md:3 warns at line 5: UnusedSettingWarning: batch_size 256"):
        run_page(page)


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it <= {README_MAX_LINES} and move details to a docs/ page")


def relative_links(page: Path, within: bool = False) -> list[tuple[int, str]]:
    """(line, target) of each relative Markdown link or image outside code blocks (`within`: the links within the
    page, `#section`, too)."""
    fenced = set()
    for block in code_blocks(page):
        fenced.update(range(block.line, block.line + block.code.count("\n") + 2))
    links = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if number in fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for match in _LINK.finditer(line):
            target = match["target"]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or (target.startswith("#") and not within):
                continue  # http:, https:, mailto: ... and links within the page
            links.append((number, target))
    return links


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_point_to_files(page):
    missing = [f"{page.relative_to(ROOT)}:{number}: {target}" for number, target in relative_links(page)
               if not (page.parent / target.split("#", 1)[0]).exists()]
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def test_link_check_sees_links():
    """The link check finds the README's links to the docs (so it cannot pass by finding none)."""
    targets = [target for _, target in relative_links(ROOT / "README.md")]
    assert "docs/getting-started.md" in targets and "benchmarks/README.md" in targets



# --- the API reference: every public name documented, every documented name real ------------------------------------

#: the public modules whose `__all__` the docs must cover (their submodules' own `__all__`s are internal)
PUBLIC_MODULES = ("rlspeed", "rlspeed.algos", "rlspeed.accel", "rlspeed.buffers", "rlspeed.callbacks", "rlspeed.envs",
                  "rlspeed.population")
#: inline code spans that look like dotted names but are files a run writes
FILE_NAMES = {"rlspeed.json", "rlspeed.lock"}
#: calls the docs show to say a keyword is refused (with advice): (span, keyword); the test checks it stays refused
REFUSED_KEYWORDS = {("A2C(..., batch_size=64)", "batch_size")}
_DOTTED = re.compile(r"(?<![\w/.])rlspeed(?:\.[A-Za-z_]\w*)+")
_DIRECTIVE = re.compile(r"^::: (?P<name>[\w.]+)\s*$", re.MULTILINE)
_CALL = re.compile(r"(?:\b(?P<owner>\w+)\.)?(?P<name>\w+)\((?P<args>[^()]*)\)")
_KEYWORD = re.compile(r"(?<![\w.])(\w+)\s*=(?!=)")


def docs_prose(page: Path) -> str:
    """A page's text outside its fenced code blocks (those run: `test_python_blocks_run`)."""
    fenced = set()
    for block in code_blocks(page):
        fenced.update(range(block.line, block.line + block.code.count("\n") + 2))
    return "\n".join(line for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1)
                     if number not in fenced)


def inline_code(page: Path) -> list[str]:
    return re.findall(r"`([^`\n]+)`", docs_prose(page))


def resolve(dotted: str):
    """The object a dotted name names: its longest importable module prefix, then attributes."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
            break
        except ModuleNotFoundError:
            continue
    for part in parts[cut:]:
        value = getattr(value, part)
    return value


def public_names() -> list[tuple[str, str]]:
    import importlib

    return [(module, name) for module in PUBLIC_MODULES for name in importlib.import_module(module).__all__]


def test_public_names_are_documented():
    """Every name in a public module's `__all__` has a docstring of its own (classes and functions) and is named in the
    docs (docs/api.md or its topic's page)."""
    import inspect

    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES if page.parent.name == "docs")
    undocumented, unnamed = [], []
    for module, name in public_names():
        value = resolve(f"{module}.{name}")
        if (inspect.isclass(value) or inspect.isfunction(value)) and not (value.__doc__ or "").strip():
            undocumented.append(f"{module}.{name}")
        if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text):
            unnamed.append(f"{module}.{name}")
    assert not undocumented, "public names without a docstring: " + ", ".join(undocumented)
    assert not unnamed, "public names the docs never name (add them to docs/api.md): " + ", ".join(unnamed)


def undocumented_arguments(value, doc: str | None = None) -> list[str]:
    """The arguments of a class or function (a class's: its `__init__`'s) that `doc` does not name; `doc` is by default
    its docstrings: a function's, or a class's own, its bases' and its `__init__`'s. `self` and `*args`/`**kwargs`
    need no mention; a value that is neither a class nor a function (a constant, a property) has none to name."""
    import inspect

    if not (inspect.isclass(value) or inspect.isroutine(value)):
        return []
    if doc is None:
        doc = "\n".join(klass.__doc__ or "" for klass in getattr(value, "__mro__", (value,)))
        if inspect.isclass(value):
            doc += "\n" + (value.__init__.__doc__ or "")
    function = value.__init__ if inspect.isclass(value) else value
    return [parameter.name for parameter in inspect.signature(function).parameters.values()
            if parameter.name != "self" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
            and not re.search(rf"\b{parameter.name}\b", doc)]


def test_top_level_docstrings_name_every_argument():
    """The docstring of each class and function in `rlspeed.__all__` (a class's: its own, its bases' or `__init__`'s)
    names each of its arguments."""
    import rlspeed

    missing = [f"{name}({argument})" for name in rlspeed.__all__
               for argument in undocumented_arguments(getattr(rlspeed, name))]
    assert not missing, "arguments their docstring does not name: " + ", ".join(missing)


_IMPORT = re.compile(r"^\s*from (?P<module>rlspeed(?:\.\w+)+) import (?P<names>\([^)]*\)|.*)$", re.MULTILINE)
_MEMBERS = re.compile(r"^::: (?P<name>[\w.]+)\s*\n(?:[ \t]+\S.*\n)*?[ \t]+members: \[(?P<members>[^\]]*)\]",
                      re.MULTILINE)
#: classes whose arguments a page documents instead of their docstring: the configs, whose fields are the
#: hyperparameters docs/algorithms.md tabulates (default, Stable-Baselines3's name, meaning)
ARGUMENTS_ON_PAGE = {
    f"rlspeed.algos.{name}": ROOT / "docs" / "algorithms.md"
    for name in ("on_policy.OnPolicyConfig", "ppo.PPOConfig", "a2c.A2CConfig", "recurrent_ppo.RecurrentPPOConfig",
                 "off_policy.OffPolicyConfig", "dqn.DQNConfig", "sac.SACConfig", "td3.TD3Config", "ddpg.DDPGConfig")}


def directed_names() -> set[str]:
    """The names of submodules the docs direct users to, as `rlspeed.x.y`: each imported by a page
    (`from rlspeed.buffers import ReplayBuffer`), given dotted (`rlspeed.envs.NormalizeReward`, in prose, code or a
    `:::` directive), or listed as a directive's `members:` (`rlspeed.buffers.ReplayBuffer.add`). The top-level names
    (`rlspeed.PPO`) are `test_top_level_docstrings_name_every_argument`'s."""
    names = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _IMPORT.finditer(text):
            for imported in re.sub(r"#.*", "", match["names"]).strip("() \n").split(","):
                if imported.strip():
                    names.add(f"{match['module']}.{imported.split()[0]}")
        names |= {dotted for dotted in _DOTTED.findall(text) if dotted.count(".") >= 2}
        for match in _MEMBERS.finditer(text):
            names |= {f"{match['name']}.{member.strip()}" for member in match["members"].split(",") if member.strip()}
    return names - FILE_NAMES


def test_directed_names_name_every_argument():
    """Each class and function of a submodule the docs direct users to (`directed_names`) names each of its arguments
    in its docstring, as the top-level names do (a config's: docs/algorithms.md, `ARGUMENTS_ON_PAGE`)."""
    missing = []
    for dotted in sorted(directed_names()):
        page = ARGUMENTS_ON_PAGE.get(dotted)
        doc = " ".join(f"`{span}`" for span in inline_code(page)) if page else None
        missing += [f"{dotted}({argument})" for argument in undocumented_arguments(resolve(dotted), doc)]
    assert not missing, "arguments their documentation does not name: " + ", ".join(missing)


def test_documented_names_exist():
    """Each `rlspeed.x.y` in the docs' prose and each `::: rlspeed.x.y` of the API reference imports."""
    broken = []
    for page in PAGES:
        names = {dotted for span in inline_code(page) for dotted in _DOTTED.findall(span)} - FILE_NAMES
        names |= set(_DIRECTIVE.findall(page.read_text(encoding="utf-8")))
        for dotted in sorted(names):
            try:
                resolve(dotted)
            except (ImportError, AttributeError) as error:
                broken.append(f"{page.relative_to(ROOT)}: {dotted} ({type(error).__name__}: {error})")
    assert not broken, "names the docs give that do not exist:\n" + "\n".join(broken)


def documented_calls() -> list[tuple[Path, str, object, list[str]]]:
    """(page, span, callable, keywords) for each call with keywords in the docs' inline code whose callable is a name
    of `rlspeed.__all__` (`PPO(...)`, `rlspeed.evaluate(...)`) or a model's method (`model.learn(...)`)."""
    import rlspeed
    from rlspeed.algos.base import Algorithm

    calls = []
    for page in PAGES:
        for span in inline_code(page):
            for call in _CALL.finditer(span):
                owner, name = call["owner"], call["name"]
                keywords = _KEYWORD.findall(call["args"])
                if not keywords:
                    continue
                if owner in (None, "rlspeed") and name in rlspeed.__all__:
                    calls.append((page, span, getattr(rlspeed, name), keywords))
                elif owner == "model" and not name.startswith("_") and callable(getattr(Algorithm, name, None)):
                    calls.append((page, span, getattr(Algorithm, name), keywords))
    return calls


def test_documented_keywords_exist():
    """A keyword the docs pass (`PPO(env_id, n_epochs=...)`, `model.learn(..., target_return=...)`) is one the
    callable takes: a parameter, or for an algorithm a hyperparameter of its config (but those of
    `REFUSED_KEYWORDS`, shown as refused, which must stay so)."""
    import dataclasses
    import inspect

    from rlspeed.algos.base import Algorithm

    wrong = []
    for page, span, value, keywords in documented_calls():
        is_algorithm = inspect.isclass(value) and issubclass(value, Algorithm)
        function = value.__init__ if inspect.isclass(value) else value
        parameters = inspect.signature(function).parameters
        taken = set(parameters)
        if is_algorithm:
            taken |= {field.name for field in dataclasses.fields(value.config_cls)}
        elif any(parameter.kind == parameter.VAR_KEYWORD for parameter in parameters.values()):
            continue  # (passed on: make_env's env options, ...)
        for keyword in keywords:
            if (keyword in taken) == ((span, keyword) in REFUSED_KEYWORDS):
                wrong.append(f"{page.relative_to(ROOT)}: `{span}`: {keyword}=")
    assert not wrong, "keywords the docs pass that the callable does not take:\n" + "\n".join(wrong)


def test_api_checks_see_names_and_calls():
    """The checks above find what they check (so they cannot pass by finding nothing)."""
    api = ROOT / "docs" / "api.md"
    assert "rlspeed.buffers.ReplayBuffer" in _DIRECTIVE.findall(api.read_text(encoding="utf-8"))
    assert "rlspeed.stats.median" in {name for span in inline_code(ROOT / "docs" / "population.md")
                                      for name in _DOTTED.findall(span)}
    spans = [span for _, span, _, _ in documented_calls()]
    assert any(span.startswith("PPO(") for span in spans) and any(span.startswith("model.learn(") for span in spans)
    assert ("rlspeed.population", "PER_MEMBER") in public_names()
    directed = directed_names()
    assert {"rlspeed.checkpoint.is_encrypted", "rlspeed.envs.NormalizeReward", "rlspeed.buffers.ReplayBuffer.add",
            "rlspeed.algos.update.UpdateStep"} <= directed and set(ARGUMENTS_ON_PAGE) <= directed
    assert undocumented_arguments(lambda env_id, *args, seed=0, **kwargs: None, "the `seed`") == ["env_id"]


# --- docs/cli.md's synopsis and the command line's parser agree ------------------------------------------------------

_SYNOPSIS_OPTION = re.compile(r"--(?P<no>\[no-\])?(?P<name>[a-z][\w-]*)(?: (?P<value>[^\s\]\[]+))?")


def cli_synopsis() -> dict[str, str]:
    """docs/cli.md's first code block, the text of each `rlspeed COMMAND ...` entry (its continuation lines
    included) by command; `rlspeed --version` is the entry of "rlspeed"."""
    block = next(block for block in code_blocks(ROOT / "docs" / "cli.md") if not block.language)
    entries: dict[str, str] = {}
    command = None
    for line in block.code.splitlines():
        start = re.match(r"rlspeed (\w+|--[\w-]+)", line)
        if start:
            command = start[1] if not start[1].startswith("--") else "rlspeed"
        entries[command] = entries.get(command, "") + " " + line.split("#")[0]
    return entries


def test_the_cli_synopsis_names_every_option_with_the_parsers_choices_and_defaults():
    """docs/cli.md's synopsis gives each command's every option and no other (it lacked eval's --no-progress and
    tune's, eval's, export's and doctor's --debug); where it shows choices (`auto|off`) they are the parser's, and
    where it shows a number (`--trials 64`) that is the option's default, as `--help` states it."""
    import argparse

    from rlspeed import cli

    parser = cli.build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices
    synopsis = cli_synopsis()
    problems = []
    for name, command in [("rlspeed", parser), *commands.items()]:
        label = name if name == "rlspeed" else f"rlspeed {name}"
        shown = {}
        for match in _SYNOPSIS_OPTION.finditer(synopsis.get(name, "")):
            shown.setdefault(f"--{match['name']}", match["value"])
            if match["no"]:
                shown.setdefault(f"--no-{match['name']}", None)
        actions = {option: action for action in command._actions for option in action.option_strings
                   if option.startswith("--") and option != "--help"}
        if name == "rlspeed":  # (its --debug is each command's too: the synopsis gives it there)
            actions = {option: action for option, action in actions.items() if option != "--debug"}
        problems += [f"{label}: {option} not in docs/cli.md" for option in sorted(set(actions) - set(shown))]
        problems += [f"{label}: docs/cli.md's {option} is no option"
                     for option in sorted(set(shown) - set(actions))]
        for option, value in shown.items():
            action = actions.get(option)
            if action is None or value is None:
                continue
            if action.choices and "|" in value and value.split("|") != list(action.choices):
                problems.append(f"{label} {option}: docs/cli.md shows {value}, the parser takes "
                                f"{'|'.join(action.choices)}")
            if re.fullmatch(r"\d+", value) and str(action.default) != value and f"default {value}" not in action.help:
                problems.append(f"{label} {option}: docs/cli.md shows {value}, the default is {action.default}")
    assert not problems, "\n".join(problems)


def test_profiling_page_words_the_phases_as_the_profiler_does():
    """docs/profiling.md's phase table and its sample report describe each phase as `rlspeed profile` prints it (the
    sample said "(PPO)" and "replay sampling included ..." after the profiler had reworded both)."""
    from rlspeed.diagnostics.profiler import _PHASE_TEXT

    page = ROOT / "docs" / "profiling.md"
    table = {name: text.replace("`", "") for name, text in
             re.findall(r"^\| `(\w+)` \| (.+?) \|$", docs_prose(page), re.MULTILINE)}
    sample = next(block.code for block in code_blocks(page) if block.code.startswith("rlspeed profile:"))
    shown = dict(re.findall(r"^  (\w+) +[\d.]+ +\d+%   (.+)$", sample, re.MULTILINE))
    assert table == _PHASE_TEXT and shown == _PHASE_TEXT


def heading_anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks), as the site's Markdown (Python-Markdown's toc) makes
    them: the text without its Markdown, lower case, punctuation dropped, runs of spaces and hyphens one hyphen; a
    repeated one gets `_1`, `_2`, ..."""
    import unicodedata

    anchors: set[str] = set()
    for line in docs_prose(page).splitlines():
        heading = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading[1]).replace("`", "")
        text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
        anchor = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())
        unique, count = anchor, 0
        while unique in anchors:
            count += 1
            unique = f"{anchor}_{count}"
        anchors.add(unique)
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_links_to_sections_point_to_headings(page):
    """A link's `#section` (in the page or another one) is a heading's anchor there: a renamed heading would break
    its links silently (`mkdocs build --strict` reports a missing anchor as info only, and GitHub not at all)."""
    broken = []
    for number, target in relative_links(page, within=True):
        if "#" not in target:
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file) if file else page
        if linked.suffix == ".md" and linked.exists() and anchor not in heading_anchors(linked):
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target}")
    assert not broken, "links to sections that do not exist:\n" + "\n".join(broken)


def test_section_anchors_are_the_sites():
    """The anchors the link check expects are those the site makes (`cli.md#rlspeed-report` from "`rlspeed report`",
    presets.md's "Where a preset comes from (`--preset`)" with its hyphens merged)."""
    assert "rlspeed-report" in heading_anchors(ROOT / "docs" / "cli.md")
    assert "where-a-preset-comes-from-preset" in heading_anchors(ROOT / "docs" / "presets.md")


#: flags the docs show a command refusing (CleanRL's names), which must stay refused: (command, flag)
REFUSED_FLAGS = {("train", "--clip-coef")}


def test_commands_the_docs_give_take_their_flags():
    """Each `rlspeed COMMAND ... --flag` of the docs (in a shell block or inline code) names an option of that
    command's parser (a renamed flag left the examples naming the old one; the synopsis test covers docs/cli.md's
    first block only); those of `REFUSED_FLAGS` are shown refused and stay so."""
    import argparse

    from rlspeed import cli

    parser = cli.build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices
    options = {name: {option for action in command._actions for option in action.option_strings}
               for name, command in commands.items()}
    wrong, seen = [], 0
    for page in PAGES:
        texts = [block.code for block in code_blocks(page) if block.language in ("bash", "sh", "")]
        for text in [*texts, *inline_code(page)]:
            for command in re.finditer(rf"rlspeed ({'|'.join(options)})\b([^\n#`]*)", text):
                for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command[2]):
                    seen += 1
                    if (flag in options[command[1]]) == ((command[1], flag) in REFUSED_FLAGS):
                        wrong.append(f"{page.relative_to(ROOT)}: rlspeed {command[1]} {flag}")
    assert seen > 100 and not wrong, "flags the docs give that the command does not take:\n" + "\n".join(wrong)


# --- docs/algorithms.md's tables of defaults and the configs' defaults ------------------------------------------------

#: each section of docs/algorithms.md with a table of defaults (`| rlspeed | default | ... |`) -> the configs whose
#: defaults its rows and its "Defaults: `key=value`" sentences state: a shared table's base config and the algorithms
#: that keep its defaults unchanged (A2C's, DQN's and TD3's own sections give those they change)
DEFAULTS_SECTIONS = {
    "On-policy: PPO, A2C, RecurrentPPO": ("on_policy.OnPolicyConfig", "ppo.PPOConfig",
                                          "recurrent_ppo.RecurrentPPOConfig"),
    "PPO": ("ppo.PPOConfig",),
    "A2C": ("a2c.A2CConfig",),
    "RecurrentPPO": ("recurrent_ppo.RecurrentPPOConfig",),
    "Off-policy: DQN, SAC, TD3, DDPG": ("off_policy.OffPolicyConfig", "sac.SACConfig"),
    "DQN": ("dqn.DQNConfig",),
    "SAC": ("sac.SACConfig",),
    "TD3 and DDPG": ("td3.TD3Config",),
    "gSDE: state-dependent exploration (PPO, A2C, RecurrentPPO, SAC)": ("ppo.PPOConfig", "a2c.A2CConfig",
                                                                        "recurrent_ppo.RecurrentPPOConfig",
                                                                        "sac.SACConfig"),
    "Observations: encoders (every algorithm)": ("ppo.PPOConfig", "a2c.A2CConfig", "recurrent_ppo.RecurrentPPOConfig",
                                                 "dqn.DQNConfig", "sac.SACConfig", "td3.TD3Config", "ddpg.DDPGConfig"),
}
#: sections whose "Defaults: `key=value`" sentence is of other configs than its table ("TD3 and DDPG": both's rates)
DEFAULTS_SENTENCE_CONFIGS = {"TD3 and DDPG": ("td3.TD3Config", "ddpg.DDPGConfig")}
_DEFAULTS_ROW = re.compile(r"^\| (?P<names>`\w+`(?:, `\w+`)*) \| (?P<default>[^|]+?) \|", re.MULTILINE)
_DEFAULTS_SENTENCE = re.compile(r"(?:Defaults(?: are SB3's)?|`(?P<config>\w+Config)`):\s+(?P<spans>`\w+=[^`]+`"
                                r"(?:,\s+`\w+=[^`]+`)*)")


def documented_default(text: str):
    """A default as docs/algorithms.md writes it (`3e-4`, `1,000,000`, `(64, 64)`, `tanh`, `"huber"`) as a value."""
    import ast

    text = text.strip()
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+", text):
        text = text.replace(",", "")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # (a bare word: a string option's value)


def documented_defaults() -> list[tuple[str, str, str, object]]:
    """(section, config, field, value) for each default docs/algorithms.md's tables and "Defaults: `key=value`"
    sentences state: a row `| `a`, `b` | x, y |` gives a x and b y (or both x), `x (SAC: y)` gives SAC's config y."""
    sections = re.split(r"^#{2,3} (.+)$", docs_prose(ROOT / "docs" / "algorithms.md"), flags=re.MULTILINE)
    stated = []
    for title, body in zip(sections[1::2], sections[2::2]):
        if title not in DEFAULTS_SECTIONS:
            assert "| rlspeed | default |" not in body, (
                f"docs/algorithms.md's section {title!r} has a table of defaults: add it to DEFAULTS_SECTIONS")
            continue
        configs = DEFAULTS_SECTIONS[title]
        for row in _DEFAULTS_ROW.finditer(body):
            names = re.findall(r"`(\w+)`", row["names"])
            default, _, exception = row["default"].partition(" (")
            values = default.split(", ") if len(names) > 1 else [default]
            values = values if len(values) == len(names) else values * len(names)
            special = re.fullmatch(r"(\w+): (.+)\)", exception)  # (`0.0 (SAC: -3.0)`)
            for name, value in zip(names, values):
                for config in configs:
                    if special and config.split(".")[0] == special[1].lower():
                        value_there = special[2]
                    else:
                        value_there = value
                    stated.append((title, config, name, documented_default(value_there)))
        for sentence in _DEFAULTS_SENTENCE.finditer(body):
            owners = ([f"{sentence['config'][:-6].lower()}.{sentence['config']}"] if sentence["config"] else
                      DEFAULTS_SENTENCE_CONFIGS.get(title, configs))
            for span in re.findall(r"`(\w+=[^`]+)`", sentence["spans"]):
                name, _, value = span.partition("=")
                stated += [(title, owner, name, documented_default(value)) for owner in owners]
    return stated


def test_the_algorithms_pages_defaults_are_the_configs():
    """Each default docs/algorithms.md states for a hyperparameter, in its tables and its "Defaults are SB3's:
    `key=value`" sentences, is that config field's default (a changed default left the page giving the old one; a
    reader copying the table into SB3 comparisons got the wrong run)."""
    import dataclasses

    wrong, configs_seen, found = [], set(), {}
    for title, config, name, value in documented_defaults():
        fields = {field.name: field for field in dataclasses.fields(resolve(f"rlspeed.algos.{config}"))}
        configs_seen.add(config)
        found.setdefault((title, name), False)
        if name not in fields:  # (a row of a section on several algorithms may be one's: SAC's use_sde_at_warmup)
            continue
        found[title, name] = True
        field = fields[name]
        actual = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        if actual != value or type(actual) is not type(value):  # (True is not 1, 5 is not 5.0)
            wrong.append(f"{title}: `{name}` documented {value!r}, {config}'s default is {actual!r}")
    wrong += [f"{title}: `{name}` is no field of {', '.join(DEFAULTS_SECTIONS[title])}"
              for (title, name), there in found.items() if not there]
    assert not wrong, "docs/algorithms.md's defaults that are not the code's:\n" + "\n".join(wrong)
    assert len(configs_seen) == 9


def test_the_defaults_check_reads_rows_pairs_and_sentences():
    """The reader of the defaults finds a plain row, a pair row, a `(SAC: ...)` exception and a Defaults sentence (so
    the check above cannot pass by reading nothing)."""
    stated = {(config, name): value for _, config, name, value in documented_defaults()}
    assert stated[("ppo.PPOConfig", "batch_size")] == 256
    assert stated[("off_policy.OffPolicyConfig", "buffer_size")] == 10**6
    assert stated[("td3.TD3Config", "ou_theta")] == 0.15 and stated[("td3.TD3Config", "ou_dt")] == 0.01
    assert stated[("sac.SACConfig", "log_std_init")] == -3.0 and stated[("ppo.PPOConfig", "log_std_init")] == 0.0
    assert stated[("a2c.A2CConfig", "num_steps")] == 5 and stated[("ddpg.DDPGConfig", "policy_delay")] == 1
    assert stated[("dqn.DQNConfig", "net_arch")] == (64, 64) and stated[("dqn.DQNConfig", "td_loss")] == "huber"
    assert len(stated) > 120


def test_the_run_directory_table_names_what_a_run_writes():
    """docs/cli.md's run directory table names each file and folder a run writes (`rlspeed.cli.RUN_FILES`: it named
    the TensorBoard events without their `tensorboard/` folder, and neither `videos/` nor `wandb/`), a population's
    (`members/`, `learning_curves.png`) in its Populations bullet, and nothing a run does not write; with the lock file
    every run leaves (`RUN_LOCK`, which the table lacked), and the job file of a run under torchrun started by hand."""
    from rlspeed.cli import RUN_FILES, RUN_LOCK, TORCHRUN_JOB_FILE

    left = {*RUN_FILES, RUN_LOCK, TORCHRUN_JOB_FILE}  # (the files and folders a run leaves)

    page = docs_prose(ROOT / "docs" / "cli.md")
    section = page[page.index("## The run directory"):page.index("`metrics.csv`'s columns")]
    table = {name.rstrip("/") for row in re.findall(r"^\| (`[^|]+`) \|", section, re.MULTILINE)
             for name in re.findall(r"`([^`]+)`", row)}
    population = re.search(r"^- \*\*Populations\.\*\*.*?(?=^- \*\*)", page, re.MULTILINE | re.DOTALL)[0]
    named = table | {name.split("/")[0] for name in re.findall(r"`([\w./<>]+)`", population)}
    staged = {name for name in left if ".next." in name}  # (the table's replay row says `*.replay.next...`)
    assert left - staged - named == set(), "files a run writes that docs/cli.md's run directory lacks"
    assert table - left == set(), "docs/cli.md's run directory table names files a run does not write"


def test_the_tune_pages_ppo_space_is_the_default_one():
    """docs/tune.md's PPO search space (its YAML block and the list before it) is `rlspeed tune`'s default for PPO, in
    the format `--search-space` takes."""
    import yaml

    from rlspeed.tune import DEFAULT_SPACES

    page = ROOT / "docs" / "tune.md"
    block = next(block for block in code_blocks(page) if block.language == "yaml" and "one_minus" in block.code)
    assert yaml.safe_load(block.code) == DEFAULT_SPACES["ppo"]
    listed = re.search(r"for PPO by default ((?:`\w+`(?:, )?)+)", docs_prose(page).replace("\n", " "))[1]
    assert re.findall(r"`(\w+)`", listed) == list(DEFAULT_SPACES["ppo"])


def test_the_population_pages_per_member_lists_are_the_codes():
    """docs/population.md's lists of the hyperparameters that may differ per member, PPO's, A2C's, SAC's, TD3's and
    DDPG's, and DQN's, are `rlspeed.population`'s `PER_MEMBER*` (what `--set key=a,b,...` and `rlspeed tune` take)."""
    import rlspeed.population as population

    text = re.sub(r"\s+", " ", docs_prose(ROOT / "docs" / "population.md"))

    def listed(start: str, end: str) -> list[str]:
        """The names in the backquoted spans between `start` and `end` (SAC's list has a remark between two)."""
        span = text[text.index(start):]
        return [name for code in re.findall(r"`([^`]*)`", span[:span.index(end)]) for name in re.findall(r"\w+", code)]

    assert listed("dicts): for PPO", " (") == list(population.PER_MEMBER)
    assert listed("per-member values: `learning_rate", ", and members") == list(population.PER_MEMBER_A2C)
    assert listed("Per-member values: SAC", "; TD3") == list(population.PER_MEMBER_SAC)
    assert listed("; TD3 and DDPG", "; DQN") == list(population.PER_MEMBER_TD3)
    assert listed("; DQN `", "; anything else") == list(population.PER_MEMBER_DQN)


def test_the_algorithms_pages_activations_are_the_table():
    """docs/algorithms.md's list of activations (the one the other pages link to) is
    `rlspeed.activations.ACTIVATION_CLASSES`, the table the networks, the config check and RL-Zoo's translation read
    (docs/presets.md listed four when the code took them; a fifth name would go unmentioned)."""
    from rlspeed.activations import ACTIVATION_CLASSES

    text = re.sub(r"\s+", " ", docs_prose(ROOT / "docs" / "algorithms.md"))
    listed = text[text.index("The activations are "):]
    assert re.findall(r"`(\w+)`", listed[:listed.index(": torch.nn's layer")]) == list(ACTIVATION_CLASSES)


def test_the_benchmarks_pages_table_names_every_script():
    """docs/benchmarks.md's table of scripts names each script of benchmarks/ (a file run as `python
    benchmarks/X.py`; its helper modules aside): it lacked slow_envs.py, tune_storage.py, videos.py, action_spaces.py
    and a2c_preset_sweep.py, whose results benchmarks/README.md publishes."""
    page = docs_prose(ROOT / "docs" / "benchmarks.md")
    table = {name for row in re.findall(r"^\| (`[\w.]+\.py`(?:, `[\w.]+\.py`)*) \|", page, re.MULTILINE)
             for name in re.findall(r"`([\w.]+\.py)`", row)}
    scripts = {path.name for path in (ROOT / "benchmarks").glob("*.py")
               if 'if __name__ == "__main__"' in path.read_text(encoding="utf-8")}
    assert len(scripts) > 30 and scripts - table == set(), "scripts docs/benchmarks.md's table lacks"
    assert table - scripts == set(), "docs/benchmarks.md's table names scripts benchmarks/ does not have"
