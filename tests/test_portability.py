"""Windows and macOS: what the library and the command line use that those platforms lack (Unix-only `os` calls,
signals, float64 on Apple's MPS) degrades instead of failing. Simulated on Linux by removing what they lack."""

from __future__ import annotations

import os

from rlspeed import files


def test_run_files_are_written_without_fchmod(tmp_path, monkeypatch):
    # os.fchmod is Unix-only before Python 3.13: on Windows every run file (config.yaml, summary.json) went through it
    monkeypatch.delattr(os, "fchmod")
    files.write_text_atomic(tmp_path / "summary.json", "{}")
    assert (tmp_path / "summary.json").read_text(encoding="utf-8") == "{}"
    assert not list(tmp_path.glob("*.tmp"))
