"""The benchmark scripts' shared helpers (benchmarks/common.py): what a benchmark run leaves behind."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_a_benchmarks_reference_runs_leave_nothing_in_the_temp_directory(tmp_path):
    """Stable-Baselines3's learn() makes <temp dir>/SB3-<date and time> at each call where SB3_LOGDIR is unset: the
    benchmarks, which train SB3 models seed after seed, left one per run (a hundred after a day of benchmarks); they
    share one now, removed as the script ends, as is the strategy cache `temporary_directory` makes."""
    pytest.importorskip("stable_baselines3")
    temp = tmp_path / "temp"
    temp.mkdir()
    script = ("import common\n"
              "from stable_baselines3 import PPO\n"
              "common.temporary_directory('rlspeed-accel-bench-')\n"
              "for seed in (0, 1):\n"
              "    PPO('MlpPolicy', 'CartPole-v1', n_steps=16, batch_size=16, n_epochs=1, seed=seed).learn(16)\n")
    env = {key: value for key, value in os.environ.items() if key != "SB3_LOGDIR"}
    done = subprocess.run([sys.executable, "-c", script], cwd=BENCHMARKS, env={**env, "TMPDIR": str(temp)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(path.name for path in temp.iterdir() if not path.name.startswith("torchinductor_")) == []


def test_a_benchmarks_readme_made_afresh_starts_with_the_published_introduction():
    """`publish` writes benchmarks/README.md from `common.README_INTRO` where the file is missing (a fork that
    deleted it, a new results directory): that text is the published README's introduction, not an older one (it
    had fallen behind by a paragraph on the scripts' extras and the CUDA check)."""
    spec = importlib.util.spec_from_file_location("benchmarks_common", BENCHMARKS / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    published = (BENCHMARKS / "README.md").read_text().split("<!-- ", 1)[0]
    assert common.README_INTRO.rstrip() == published.rstrip()
