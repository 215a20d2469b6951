"""A population's learning curves in one picture: every member's evaluation curve, and the interquartile mean (IQM)
across members with its 95% bootstrap band (`rlspeed.stats`), against env steps per member.

A member's curve ends where it stopped training (target reached with `stop="each"`, or pruned); from there on it
counts in the IQM with its last evaluation, since its weights no longer change. A member that diverged counts up to
the step it diverged at and not from there on, as summary.json's final-evaluation aggregate leaves it out. Members
without a curve are left out of the picture and the IQM.
"""

from __future__ import annotations

from pathlib import Path

from rlspeed.logging import agg_figure, save_figure
from rlspeed.stats import CURVE_REPS, iqm_curve

#: bootstrap replicates per evaluation step for the band (the band is a picture, not a reported number)
BAND_REPS = CURVE_REPS


def iqm_band(curves: list[list[tuple[int, float]]], reps: int = BAND_REPS, ends: list[int | None] | None = None
             ) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, IQM, band low, band high) across `curves` (each a list of `(steps, eval_mean)` pairs, steps rising):
    `rlspeed.stats.iqm_curve`'s, at every step where any curve has an evaluation; a curve that ended holds its last
    value, a curve that has not started yet (or holds no finite value) is not counted at that step. `ends[i]`, where
    given and not None: curve i is not counted at that step and after (the step its member diverged at)."""
    band = iqm_curve(curves, ends=ends, reps=reps)
    return band["steps"], band["iqm"], band["ci_low"], band["ci_high"]


def plot_learning_curves(summary: dict, path: str | Path) -> Path | None:
    """Save the learning curves of a population's summary (`Population.learn`'s dict; each member's `curve` is a
    list of `[steps, eval_mean]`) as a PNG at `path` and return the path: one thin line per member, the IQM across
    members as a thick line with its 95% bootstrap band, and the target return as a dashed line when there is one.
    None, with a warning, where matplotlib cannot be imported (`rlspeed.logging.agg_figure`)."""
    path = Path(path)
    fig = agg_figure(path, figsize=(7, 4.5))
    if fig is None:  # (matplotlib cannot be imported: warned, no plot)
        return None
    members = summary.get("members", [])
    curves = [[(int(step), float(value)) for step, value in member.get("curve") or []] for member in members]
    # (a diverged member's parameters are not finite from `diverged_at` on: it stops counting there)
    ends = [member.get("diverged_at") for member in members]
    ax = fig.add_subplot()
    # (a curve of one evaluation, a run as long as its eval_freq, is a line of no length: drawn as a dot, its band as
    # a bar, or the picture showed nothing)
    drawn = [curve for curve in curves if curve]
    for index, curve in enumerate(drawn):  # (one legend entry names them all)
        ax.plot(*zip(*curve), color="tab:blue", alpha=0.25, linewidth=0.8, marker="o" if len(curve) == 1 else None,
                markersize=3, label="each member" if index == 0 else "_")
    if drawn:
        steps, centre, low, high = iqm_band(drawn, ends=[end for curve, end in zip(curves, ends) if curve])
        if len(steps) == 1:
            ax.vlines(steps, low, high, color="tab:orange", alpha=0.3, linewidth=8, label="IQM 95% bootstrap CI")
        else:
            ax.fill_between(steps, low, high, color="tab:orange", alpha=0.3, label="IQM 95% bootstrap CI")
        ax.plot(steps, centre, color="tab:orange", linewidth=2.2, marker="o" if len(steps) == 1 else None,
                label=f"IQM over {len(drawn)} members")
    if summary.get("target_return") is not None:
        ax.axhline(summary["target_return"], color="grey", linestyle="--", linewidth=1, label="target")
    env_id = str(summary.get("env_id") or "")
    if not env_id.isascii():  # (matplotlib's default font has no CJK glyphs: boxes and a warning per character)
        env_id = ""
    title = " ".join(part for part in (str(summary.get("algo") or "").upper(), env_id) if part)
    title = f"{title}: {len(curves)} members"
    ax.set_title(title)
    ax.set_xlabel("env steps per member")
    ax.set_ylabel("evaluation return (deterministic)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="best")  # (where it covers the fewest points: curves may end low or high)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    return path
