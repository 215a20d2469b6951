"""The readable record of an acceleration decision: what was tried, how fast, how accurate, what won and why.

`str(report)` is meant for people (`print(model.accel_report)`); `report.to_dict()` for logs and `summary.json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlspeed.accel.strategy import Strategy


@dataclass
class Trial:
    """One candidate strategy run on the example inputs.

    strategy: the candidate. ms_per_call: its best timed round, in milliseconds (forward and backward, or forward
    under no_grad). speedup: over the simplest candidate, the median of round-paired time ratios. first_call_s: the
    first call in seconds, compilation included. output_rel_err: ``||y - y_fp32|| / ||y_fp32||`` of its worst output;
    grad_cosine: ``cosine(grad, grad_fp32)`` of its worst parameter; grad_norm_rel_err:
    ``| ||grad|| - ||grad_fp32|| | / ||grad_fp32||`` of its worst parameter (each None where not measured).
    passed: it ran within the tolerances; error: why not (an exception's first line or the tolerance it missed).
    reference: the fp32 eager run the others are compared with.
    """

    strategy: Strategy
    ms_per_call: float | None = None  # best of the timed rounds (forward+backward, or forward under no_grad)
    speedup: float | None = None  # over the simplest candidate: median of round-paired time ratios
    first_call_s: float | None = None  # the first call, which includes compilation for compiled candidates
    output_rel_err: float | None = None  # ||y - y_fp32|| / ||y_fp32||, worst output
    grad_cosine: float | None = None  # cosine(grad, grad_fp32), worst parameter
    grad_norm_rel_err: float | None = None  # | ||grad|| - ||grad_fp32|| | / ||grad_fp32||, worst parameter
    passed: bool = False
    error: str | None = None  # why it failed: an exception's first line or the tolerance it missed
    reference: bool = False  # the fp32 eager run the others are compared with

    def to_dict(self) -> dict[str, Any]:
        """Every field as a JSON-ready dict (plus the strategy's `label`); `from_dict` reads it back."""
        return {"strategy": self.strategy.to_dict(), "label": self.strategy.label, "ms_per_call": self.ms_per_call,
                "speedup": self.speedup, "first_call_s": self.first_call_s, "output_rel_err": self.output_rel_err,
                "grad_cosine": self.grad_cosine, "grad_norm_rel_err": self.grad_norm_rel_err, "passed": self.passed,
                "error": self.error, "reference": self.reference}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trial:
        return cls(Strategy.from_dict(data["strategy"]), data.get("ms_per_call"), data.get("speedup"),
                   data.get("first_call_s"),
                   data.get("output_rel_err"), data.get("grad_cosine"), data.get("grad_norm_rel_err"),
                   bool(data.get("passed")), data.get("error"), bool(data.get("reference")))


@dataclass
class Decision:
    """The strategy chosen for one kind of call (an input signature such as "batch<=256, training").

    signature: that kind of call ("all calls" for an update step). chosen: the strategy it runs. source: how it was
    chosen: ``search``, ``cache``, ``forced`` (``RLSPEED_ACCELERATE`` or fixed arguments), ``only candidate``,
    ``fallback``, or ``waiting`` (eager fp32 until its search runs). reason: why, in words. trials: the candidates
    the search ran (empty without a search). search_s: the search's time in seconds (None without one). calls: the
    calls of this kind so far, where the accelerator counts them (a module's: each forward; 0 for a step's).
    """

    signature: str
    chosen: Strategy
    source: str  # "search" | "cache" | "forced" | "only candidate" | "fallback"
    reason: str
    trials: list[Trial] = field(default_factory=list)
    search_s: float | None = None
    calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: signature, chosen strategy (and its `label`), source, reason, search time, calls,
        trials."""
        return {"signature": self.signature, "chosen": self.chosen.to_dict(), "label": self.chosen.label,
                "source": self.source, "reason": self.reason, "search_s": self.search_s, "calls": self.calls,
                "trials": [trial.to_dict() for trial in self.trials]}


@dataclass
class AccelReport:
    """Everything `auto_accelerate` / `accelerate_step` decided for one model or step function.

    target: what was accelerated ("module ActorCritic", "step critic_loss"). device: the device it runs on. requested:
    the caller's request after ``RLSPEED_ACCELERATE`` (precision, compile, graphs and ``env``, the forcing value or
    None). decisions: one `Decision` per kind of call, in order. notes: remarks for the reader, each once.
    """

    target: str  # "module ActorCritic" or "step critic_loss"
    device: str
    requested: dict[str, Any]
    decisions: list[Decision] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> Strategy | None:
        """The most recent decision's strategy (None before the first call when no example inputs were given)."""
        return self.decisions[-1].chosen if self.decisions else None

    def note(self, text: str) -> None:
        """Add a note to the report, unless the same text is already there."""
        if text not in self.notes:
            self.notes.append(text)

    def to_dict(self) -> dict[str, Any]:
        """The whole report as a JSON-ready dict: target, device, request, every decision and the notes."""
        return {"target": self.target, "device": self.device, "requested": self.requested,
                "decisions": [decision.to_dict() for decision in self.decisions], "notes": list(self.notes)}

    @property
    def main(self) -> Decision | None:
        """The decision of the most-called kind of call (of equals, the latest): what ran for most of the work; None
        before the first decision."""
        if not self.decisions:
            return None
        return max(reversed(self.decisions), key=lambda decision: decision.calls)

    def summary(self) -> dict[str, str]:
        """The short form for summary.json: ``{"precision": ..., "compile": ..., "graphs": ..., "chosen_by": ...,
        "reason": ...}`` of the most-called kind of call (`main`; `chosen_by`: search, cache, forced, only candidate,
        waiting, fallback; "not yet" before one; `reason`: why, in words, as `str(report)` gives it, with its kind of
        call where it is not "all calls"); with several kinds, `kinds` names each with its choice and its calls,
        most-called first."""
        main = self.main
        chosen = main.chosen if main is not None else Strategy()
        summary = {"precision": chosen.precision, "compile": chosen.compile, "graphs": str(chosen.graphs).lower(),
                   "chosen_by": main.source if main is not None else "not yet",
                   "reason": decision_reason(main) if main is not None else ""}
        if len(self.decisions) > 1:
            ranked = sorted(self.decisions, key=lambda decision: -decision.calls)
            summary["kinds"] = "; ".join(f"[{d.signature}] {d.chosen.label} by {d.source}, {d.calls} call"
                                         + ("" if d.calls == 1 else "s") for d in ranked)
        return summary

    def __str__(self) -> str:
        requested = " ".join(f"{key}={value}" for key, value in self.requested.items() if value is not None)
        lines = [f"rlspeed acceleration for {self.target} on {self.device}", f"  requested: {requested}"]
        if not self.decisions:
            lines.append("  no decision yet: its first call outside a step (or example_inputs=) triggers it")
        for decision in self.decisions:
            took = f", {decision.search_s:.2f} s" if decision.search_s is not None else ""
            lines.append(f"  [{decision.signature}] -> {decision.chosen.label} ({decision.source}{took}): "
                         f"{decision.reason}")
            if decision.trials:
                lines.append(f"    {'candidate':<28} {'ms/call':>9} {'speed-up':>8} {'1st call s':>10} {'out err':>9} "
                             f"{'grad cos':>9} {'norm err':>9}  result")
                for trial in decision.trials:
                    result = ("reference" if trial.reference else "ok") if trial.passed else f"FAIL: {trial.error}"
                    speedup = "-" if trial.speedup is None else f"{trial.speedup:.2f}x"
                    lines.append(f"    {trial.strategy.label:<28} {_f(trial.ms_per_call, '.3f'):>9} {speedup:>8} "
                                 f"{_f(trial.first_call_s, '.2f'):>10} {_f(trial.output_rel_err, '.1e'):>9} "
                                 f"{_f(trial.grad_cosine, '.5f'):>9} {_f(trial.grad_norm_rel_err, '.1e'):>9}  "
                                 f"{result}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def decision_reason(decision: Decision) -> str:
    """A decision's reason for summary.json, with its kind of call where that is not "all calls"."""
    return decision.reason if decision.signature == "all calls" else f"[{decision.signature}] {decision.reason}"


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
