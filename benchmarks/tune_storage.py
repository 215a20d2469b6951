"""What `rlspeed tune` pays its Optuna storage per trial: asking, reporting, telling and marking failed, in SQLite.

    python benchmarks/tune_storage.py [--trials 300] [--population 100] [--rounds 2] [--quick] [--no-write]

Each round stores `--trials` trials into a fresh SQLite study file twice, the two paths taking turns: through the
calls `tune` makes itself (`rlspeed.tune._direct_storage`: one write per asked trial, one per evaluation of the
batch, one per told trial and one for a batch's user attributes, one per trial marked failed), and through Optuna's
public calls (`study.ask`, each `suggest_*`, `Trial.report` and `set_user_attr`, `study.tell`), the path `tune` takes
where an Optuna lacks the private names. Per batch of `--population` trials, timed apart: asking for it
(`_ask_batch`), reporting 4 evaluations of each trial (as `_run_batch` reports), telling the results (`_tell_batch`:
a quarter pruned, the rest complete); then `--trials` more trials are asked and marked failed (`_fail_unfinished`, a
stopped batch's). No training: the values are made up; the sampler's own arithmetic (TPE) is in the ask times of
both paths.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from functools import partial
from pathlib import Path

import common

import rlspeed.tune
from rlspeed import PPO

#: the search space sampled (two of PPO's default ones)
SPACE = {"learning_rate": {"low": 1e-5, "high": 1e-2, "log": True}, "clip_range": {"low": 0.1, "high": 0.4}}
STEPS = (256, 512, 768, 1024)  # the evaluations reported to each trial
PHASES = ("ask", "report", "tell", "mark failed")


@contextlib.contextmanager
def public_calls(public: bool):
    """Within: `tune`'s storage calls through Optuna's public API where `public` (as where the private names differ)."""
    direct = rlspeed.tune._direct_storage
    if public:
        rlspeed.tune._direct_storage = lambda study, trials=(): None
    try:
        yield
    finally:
        rlspeed.tune._direct_storage = direct


def one_run(directory: Path, trials: int, population: int, public: bool) -> dict[str, float]:
    """Seconds per phase for `trials` trials into a fresh study file in `directory`."""
    from optuna.trial import TrialState

    seconds = dict.fromkeys(PHASES, 0.0)
    path = directory / f"{'public' if public else 'direct'}-{time.perf_counter_ns()}.db"
    record = {"algo": "ppo", "env_id": "CartPole-v1"}
    with public_calls(public):
        study = rlspeed.tune._open_study(str(path), "s", 0, population, STEPS[-1], record)
        setup = rlspeed.tune._Setup(PPO, "CartPole-v1", {}, SPACE, STEPS[-1], None, STEPS[0], 0, "cpu", STEPS[-1],
                                    at_once=population)
        for start in range(0, trials, population):
            asked, told = [], set()
            clock = time.perf_counter()
            rlspeed.tune._ask_batch(study, setup, min(population, trials - start), asked, lambda: None)
            seconds["ask"] += time.perf_counter() - clock
            clock = time.perf_counter()
            direct = rlspeed.tune._direct_storage(study, [trial for trial, _ in asked])  # (as `_run_batch` reports)
            for step in STEPS:
                for trial, values in asked:
                    report = trial.report if direct is None else partial(direct.report, trial)
                    report(-values["clip_range"] * step, step)
                if direct is not None:
                    direct.write_reports()
            seconds["report"] += time.perf_counter() - clock
            results = [(trial, TrialState.PRUNED if trial.number % 4 == 0 else None,
                        None if trial.number % 4 == 0 else -values["clip_range"],
                        {"steps_to_target": None, "final_eval": values["clip_range"]}) for trial, values in asked]
            clock = time.perf_counter()
            rlspeed.tune._tell_batch(study, results, told)
            seconds["tell"] += time.perf_counter() - clock
        for start in range(0, trials, population):
            asked = []
            rlspeed.tune._ask_batch(study, setup, min(population, trials - start), asked, lambda: None)
            clock = time.perf_counter()
            rlspeed.tune._fail_unfinished(study, asked, set())
            seconds["mark failed"] += time.perf_counter() - clock
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(TrialState.FAIL) == trials and states.count(TrialState.RUNNING) == 0, "not all were stored"
    return seconds


def main() -> None:
    parser = common.script_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--population", type=int, default=100, help="trials per batch")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, trials=20, population=10, rounds=1)
    args.threads = common.set_threads(args.threads)  # (the machine block names it; no torch work is timed)
    directory = Path(common.temporary_directory("rlspeed-tune-storage-"))
    load_before = common.load_average()
    runs = common.alternate({path: lambda public=(path == "public"): one_run(directory, args.trials, args.population,
                                                                             public)
                             for path in ("direct", "public")}, args.rounds)
    load_after = common.load_average()
    median = {path: {phase: statistics.median(run[phase] for run in runs[path]) for phase in PHASES} for path in runs}
    rows = [[phase, *(f"{median[path][phase]:.2f}" for path in runs),
             *(f"{1000 * median[path][phase] / args.trials:.1f}" for path in runs),
             common.fmt_ratio(common.ratio(median["public"][phase], median["direct"][phase]))] for phase in PHASES]
    lines = ["## `rlspeed tune`'s storage calls (`benchmarks/tune_storage.py`)", "",
             f"`rlspeed tune`'s storage calls for {args.trials} trials into a fresh SQLite study file, batches of "
             f"{args.population}, through the calls tune makes itself (direct) and Optuna's public ones (public: "
             f"study.ask, Trial.report, set_user_attr, study.tell), median of {args.rounds} round(s), the paths in "
             f"turn; {len(STEPS)} evaluations reported to each trial. Load average (1, 5, 15 min): {load_before} "
             f"before, {load_after} after.", "",
             common.markdown_table(["phase", "direct s", "public s", "direct ms/trial", "public ms/trial",
                                    "public / direct"], rows), "",
             "Storage writes on the direct path: one per asked trial, one per evaluation of a batch, one per told "
             "trial plus one per batch for the trials' user attributes, one per trial marked failed; the public "
             "path's ask reads every running trial at each `study.ask`, and its mark-failed reads the trial first."]
    common.publish("tune_storage", lines, {"trials": args.trials, "population": args.population,
                                           "rounds": args.rounds, "runs": runs, "load": [load_before, load_after]},
                   write=not args.no_write)


if __name__ == "__main__":
    main()
