"""The note training gives once where its env waits: in-process Gymnasium envs whose steps take milliseconds of
waiting (a sleep, a socket, a simulator or robot in another process) step one after another, where one subprocess
per env (`gymnasium-async`) would wait side by side (docs/envs.md, "Slow envs").

`rlspeed profile` measures env.step's share of the time; training does not (that would read a clock around every
step). What it reads instead, once per metrics row until it has decided: the CPU time of the process against the
training's wall time. A loop stepping Gymnasium's envs in this process keeps a core busy but where something waits,
and there the env is the part that waits; a machine busy with other work holds the process back without its CPU time
counting, so the time its main thread waited for a core counts as busy (`busy_seconds`).
"""

from __future__ import annotations

import time

from rlspeed.diagnostics.profiler import SLOW_ENV_MS, WAITING_CORES
from rlspeed.errors import WaitingEnvWarning, warn_at_caller

#: training seconds of one learn call measured before deciding (the first iteration's one-off costs weigh little)
MEASURED_S = 5.0
#: whether this process gave the note: once is enough (a tune study's trials, a loop of models, would repeat it)
noted = False


def busy_seconds() -> float:
    """CPU seconds this process has used, plus the seconds its main thread waited for a core (the run queue's
    wait in /proc/self/schedstat, where Linux gives it; elsewhere nothing is added)."""
    busy = time.process_time()
    try:
        with open("/proc/self/schedstat") as stat:
            busy += int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    return busy


def waiting_advice(env_id: str, busy_s: float, wall_s: float, env_steps: int, num_envs: int, switch: str) -> str | None:
    """The note for `env_id`'s `num_envs` in-process envs that took `env_steps` steps in `wall_s` seconds of training
    with `busy_s` busy seconds (`busy_seconds`), or None: unless they are 2 or more, each step took at least
    `SLOW_ENV_MS` / 1000 ms and fewer than `WAITING_CORES` cores were busy. `switch` names the change to make."""
    if num_envs < 2 or env_steps <= 0 or wall_s <= 0:
        return None
    step_ms, cores = 1000.0 * wall_s / env_steps, busy_s / wall_s
    if step_ms < SLOW_ENV_MS / 1000.0 or cores >= WAITING_CORES:
        return None
    # (the opening words are the same for every env: PYTHONWARNINGS="ignore:The env mostly waits" silences the note
    # where the category cannot be named, as the command's PYTHONWARNINGS is read before rlspeed can be imported)
    return (f"The env mostly waits: {env_id}'s steps took {step_ms:.1f} ms of wall time each while this process kept "
            f"{cores:.2f} cores busy (a sleep, a socket, a simulator in another process), and its {num_envs} envs "
            f"wait one after another in this process; {switch} steps each env in a subprocess of its own, where they "
            "wait side by side, on any number of cores: compare the two runs' steps/s "
            "(rlspeed.errors.WaitingEnvWarning is this note's warning category).")


def note_if_waiting(env_id: str, busy_s: float, wall_s: float, env_steps: int, num_envs: int, switch: str) -> None:
    """Give `waiting_advice`'s note as a `WaitingEnvWarning` where it has one, once per process (`noted`)."""
    global noted
    note = waiting_advice(env_id, busy_s, wall_s, env_steps, num_envs, switch)
    if note is not None:
        noted = True
        warn_at_caller(note, WaitingEnvWarning)
