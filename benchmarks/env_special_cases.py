"""The special cases for speed on the Gymnasium backend's every step, each against the general path it skips, in one
run: CPU time per call, alternating rounds (a busy patch of a shared machine hits both sides).

    python benchmarks/env_special_cases.py [--envs 1,8,64] [--rounds 7] [--calls 2000] [--quick] [--no-write]

  - `float32_rewards`: `astype` for an array of rewards vs `np.array`'s conversion, and the 1-D batch read as it is
    vs `ravel()` (the whole function's time beside them);
  - `HostObservations.write`: a Box observation of the space's shape put into its row at once vs through
    `check_shape` (the path every other observation takes: `write` with its first case off);
  - `GymnasiumEnv._records_returns`: a step of envs without a RecordEpisodeStatistics under reward wrappers that
    skips the recorded-returns tensors vs one that builds them (and `EpisodeStatistics` reads them);
  - `EpisodeStatistics._restart`: the finished rows' totals restarted by `torch.where` with cached 0-dim zeros vs an
    out-of-place `masked_fill`.
Each figure is the median over --rounds of the CPU seconds per call (microseconds); general / special above 1: the
special case saves time. A special case whose ratio is within the rounds' spread of 1 saves nothing measurable; the
time it saves is also given as a share of the whole step (the `_records_returns` row's special side: a CartPole step
of the envs through `make_env`'s wrappers; `_restart` runs twice a step, its row times one).
"""

from __future__ import annotations

import statistics
import time

import common
import gymnasium as gym
import numpy as np
import torch
from common import publish

import rlspeed
from rlspeed.envs.gymnasium_env import GymnasiumEnv, HostObservations, float32_rewards


def cpu_us(call, calls: int) -> float:
    """CPU microseconds per call of `call`, over `calls` calls (after a few untimed)."""
    for _ in range(3):
        call()
    started = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - started) / calls * 1e6


def pairs(num_envs: int) -> dict:
    """{case: (special, general)}: zero-argument calls, each one step's worth of the case for `num_envs` envs."""
    rewards = np.ones(num_envs)  # (float64, as Gymnasium's vector envs give them)
    stored = rewards.astype(np.float32)
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    host, general_host = HostObservations(space), HostObservations(space)
    general_host._plain_shape = None  # (its first case never taken: `write`'s path for every other observation)
    target, observation = host.empty(num_envs), np.zeros(4, np.float32)

    def writes(host: HostObservations):
        for row in range(num_envs):
            host.write(target, row, observation)

    env = rlspeed.make_env("CartPole-v1", num_envs=num_envs, backend="gymnasium", device="cpu", seed=0)
    env.reset(seed=0)
    adapter, actions = env, torch.zeros(num_envs, dtype=torch.int64)
    while not isinstance(adapter, GymnasiumEnv):  # (the adapter under make_env's wrappers, whose switch is timed)
        adapter = adapter.env

    def step(records: bool):
        adapter._records_returns = records
        env.step(actions)

    total, done = torch.zeros(num_envs, dtype=torch.float64), torch.zeros(num_envs, dtype=torch.bool)
    done[::3] = True
    zero = torch.zeros((), dtype=torch.float64)
    return {
        "float32_rewards, whole": (lambda: float32_rewards(rewards, env), None),
        "float32_rewards: astype": (lambda: rewards.astype(np.float32), lambda: np.array(rewards, dtype=np.float32)),
        "float32_rewards: 1-D as it is": (lambda: stored if stored.ndim == 1 else stored.ravel(),
                                          lambda: stored.ravel()),
        "HostObservations.write (all rows)": (lambda: writes(host), lambda: writes(general_host)),
        "_records_returns (whole step)": (lambda: step(False), lambda: step(True)),
        "EpisodeStatistics._restart": (lambda: torch.where(done, zero, total), lambda: total.masked_fill(done, 0)),
    }


def measure(num_envs: int, rounds: int, calls: int) -> dict:
    cases = pairs(num_envs)
    result = {}
    for name, (special, general) in cases.items():
        runners = {"special": lambda special=special: cpu_us(special, calls)}
        if general is not None:
            runners["general"] = lambda general=general: cpu_us(general, calls)
        times = common.alternate(runners, rounds)
        row = {side: statistics.median(values) for side, values in times.items()}
        if general is not None:
            ratios = [g / s for g, s in zip(times["general"], times["special"])]
            row.update(ratio=statistics.median(ratios), ratio_low=min(ratios), ratio_high=max(ratios))
        result[name] = row
    return result


def main() -> None:
    parser = common.script_arguments(__doc__.splitlines()[0])
    parser.add_argument("--envs", default="1,8,64", help="numbers of envs, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, envs="8", rounds=2, calls=50)
    common.set_threads(args.threads)
    load = {"before": common.uptime()}
    results = {int(n): measure(int(n), args.rounds, args.calls) for n in args.envs.split(",")}
    for rows in results.values():
        step_us = rows["_records_returns (whole step)"]["special"]
        for row in rows.values():
            if "general" in row:
                row["saved_share_of_step"] = (row["general"] - row["special"]) / step_us
    load["after"] = common.uptime()
    lines = [
        "## Special cases for speed on the Gymnasium backend's steps (`benchmarks/env_special_cases.py`)",
        "",
        "Each special case against the general path it skips, CPU microseconds per call (median of "
        f"{args.rounds} alternating rounds of {args.calls} calls), torch.set_num_threads({args.threads}); general / "
        "special (min-max over the rounds): above 1, the special case saves time.",
        "",
        "| envs | case | special (us) | general (us) | general / special | saved, share of a step |",
        "|---|---|---|---|---|---|",
    ]
    for num_envs, rows in results.items():
        for name, row in rows.items():
            general = common.fmt(row.get("general"), ",.2f")
            ratio = (f"{row['ratio']:.2f} ({row['ratio_low']:.2f}-{row['ratio_high']:.2f})" if "ratio" in row
                     else "—")
            saved = f"{row['saved_share_of_step']:.2%}" if "ratio" in row else "—"
            lines.append(f"| {num_envs} | {name} | {row['special']:,.2f} | {general} | {ratio} | {saved} |")
    lines += ["", f"Load (`uptime`): before: `{load['before']}`; after: `{load['after']}`."]
    publish("env_special_cases", lines, {"results": results, "load": load, "settings": vars(args)},
            write=not args.no_write)


if __name__ == "__main__":
    main()
