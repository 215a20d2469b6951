"""Rule 5 of docs/acceleration.md: a reduced precision an algorithm's update chose is checked against fp32 again.

A search checks a candidate on one batch (rule 1); a gradient that passed then may not later, as a critic fits its
targets and its output layer's gradients become small next to the rest, or on another batch of images. So a reduced
precision that an algorithm's update chose by a search or from the cache is checked again, on the batch of the
moment, after `RECHECK_FIRST` of its updates and then after twice as many more each time (two gradients per check:
a negligible share of the updates between checks); once a check fails the update runs fp32 for the rest of the run,
its decision says at which update and why, and the cache keeps fp32 for the next run.

`Rechecks` is that schedule, check and fallback, for both kinds of update an algorithm trains with under
`--accelerate auto`: the hand-derived ones (`rlspeed.fused.precision.AutoMatmulPrecision`) and the autograd ones
(`rlspeed.accel.step.AcceleratedStep` made with `recheck=True` by `rlspeed.algos.update.select_update`). A user's own
`auto_accelerate` and `accelerate_step` are checked once, and a precision forced by `RLSPEED_ACCELERATE` not at all.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Sequence

import torch

from rlspeed.accel import cache
from rlspeed.accel.report import Decision
from rlspeed.accel.search import Runner, check_again
from rlspeed.accel.strategy import EAGER_FP32, Strategy

#: a reduced precision chosen is checked against fp32 again after this many of its updates, then after twice as many
#: more each time
RECHECK_FIRST = 500


class Rechecks:
    """When the update's reduced precision is checked against fp32 again, and what a failed check decides.

    `active`: a reduced precision chosen by a search or the cache runs (`follow`); `precision`: which; `updates`: the
    updates it has run since (`count`); `next_check`: the count at which it is checked next (`check`). A checkpoint
    keeps where the schedule stands (`state`), and a resumed run goes on from there (`resume`)."""

    def __init__(self) -> None:
        self.active = False
        self.precision: str | None = None
        self.updates = 0
        self.next_check = RECHECK_FIRST
        self._resumed: dict | None = None  # (a checkpoint's `state`, for the next final `follow`)

    def follow(self, decision: Decision, final: bool = True) -> None:
        """Check from now on where `decision` chose a reduced precision by a search or from the cache; not fp32, a
        forced precision (`RLSPEED_ACCELERATE`) or a fallback. The schedule starts anew, or, after `resume` of a
        run that ran the same precision, goes on from where that run's stood. A resumed schedule is for the first
        `final` decision only: one that is not (what a step runs while its search waits) keeps it for the decision
        to come; a final one of another precision, fp32 included, drops it, so that a later decision starts anew."""
        self.active = decision.chosen.precision != "fp32" and decision.source in ("search", "cache")
        self.precision = decision.chosen.precision if self.active else None
        self.updates, self.next_check = 0, RECHECK_FIRST
        resumed, self._resumed = self._resumed, None
        if resumed is not None and self.active:
            self.resume(resumed)
        elif not final:
            self._resumed = resumed

    def state(self) -> dict[str, typing.Any]:
        """Where the schedule stands, as a checkpoint keeps it: the precision checked, its updates so far and the
        count of the next check; {} while nothing is checked."""
        if not self.active:
            return {}
        return {"precision": self.precision, "updates": self.updates, "next_check": self.next_check}

    def resume(self, state: dict[str, typing.Any]) -> None:
        """Go on from `state` (a checkpoint's `state()`) where the precision it checked runs: now if it runs, else
        from the decision that chooses it (`follow`; a run that decides on another precision starts anew). A
        malformed state, or none (a checkpoint written before schedules were saved), leaves the schedule as it is."""
        try:
            precision, updates, next_check = state["precision"], int(state["updates"]), int(state["next_check"])
        except (KeyError, TypeError, ValueError):
            return
        if updates < 0 or next_check < 1:
            return
        if self.active:
            if precision == self.precision:
                self.updates, self.next_check = updates, next_check
        else:
            self._resumed = state

    def count(self, updates: int = 1) -> bool:
        """Count `updates` updates run in the chosen precision; whether a check is due now."""
        if not self.active:
            return False
        self.updates += updates
        return self.updates >= self.next_check

    def due(self, updates: int = 1) -> bool:
        """Whether a check falls due within the next `updates` updates."""
        return self.active and self.updates + updates >= self.next_check

    def check(self, strategy: Strategy, build: Callable[[Strategy], Runner], params: Sequence[torch.Tensor],
              device: torch.device, cache_keys: Iterable[str | None],
              names: Sequence[str | None] = ()) -> Decision | None:
        """`strategy` checked against fp32 on what `build`'s runners compute now (`rlspeed.accel.search.check_again`:
        the search's tolerances, RNG streams and `.grad` put back). None while it passes (the next check after twice
        as many updates); else the decision to run fp32 eager from here on, which is stored in the cache under
        `cache_keys` (those a later run looks up; None entries skipped), and the checks stop. Its reason names the
        parameter whose gradient missed the tolerance by most (`names`, one per parameter, else its index) and its
        largest absolute difference from fp32."""
        self.next_check = 2 * self.updates + RECHECK_FIRST
        trial = check_again(strategy, build, params, device, names)
        if trial.passed:
            return None
        self.active, self.precision = False, None
        reason = (f"{strategy.label} failed its check again after {self.updates:,} updates ({trial.error}): fp32 "
                  "from there on")
        # (stored directly, not through `search.store_choice`, which keeps a choice without timings out of the cache)
        record = {"chosen": EAGER_FP32.to_dict(), "reason": reason, "trials": [trial.to_dict()]}
        for key in dict.fromkeys(cache_keys):
            if key is not None:
                cache.store(key, record)
        return Decision("all calls", EAGER_FP32, "search", reason, [trial])
