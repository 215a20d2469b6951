"""The documentation's promises: its Python examples run, its relative links resolve, the README stays a front door.

Every ```python block of README.md and docs/*.md runs, in order, one page at a time in one namespace (a later block
may use what an earlier one defined), in a temporary directory. A block is left out only when it needs something
CI does not install (Stable-Baselines3, torch_npu, ...), marked either by an info string with attributes
(```python title="sb3_ppo.py"```, shown as a file) or by a `<!-- skip: reason -->` line right before it; the test
checks that such a block names one of `NOT_IN_CI`, so the mark cannot hide a broken example.
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
    the page and line of the block it came from."""
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for block in code_blocks(page):
        if not block.runs or block.missing:
            continue
        # compile with the page's line numbers, so a traceback points into the Markdown file
        source = "\n" * block.line + block.code
        try:
            exec(compile(source, str(page), "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"the Python block at {block.where} failed: {type(error).__name__}: {error}") \
                from error
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


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it <= {README_MAX_LINES} and move details to a docs/ page")


def relative_links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of each relative Markdown link or image outside code blocks."""
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
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
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

