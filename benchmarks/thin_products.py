"""The ensembles' thin batched products on a CPU: MKL's `bmm`/`baddbmm` against the forms `rlspeed.fused.flat` writes
them in (see its `THIN_COLUMNS` comment), and torch's tanh against the hand-derived updates' `tanh_`.

    python benchmarks/thin_products.py [--threads 1] [--repeats 7] [--quick] [--no-write]

For ensembles of K members, B rows and H-wide hidden layers (value and Q heads of 1 column, 2-logit heads):
  - forward, 1 output column: `baddbmm(bias, h, w)` vs multiply and sum over the inner dimension, plus the bias;
  - weight gradient of a 1-column head: `bmm(h^T, g)` vs the product of its transpose `bmm(g^T, h)`, copied back;
  - input gradient through a 1-column head (one inner column): `bmm(g, w^T)` vs a broadcast multiply;
  - forward, 2 output columns: row-major output vs column-major output (flat.py takes it from 64 rows: the
    10-row shape shows why);
  - tanh of the hidden activations `[K, B, H]`: `tanh_()` vs `rlspeed.fused.flat.tanh_`.
Each timing is the best of --repeats loops (microseconds per call); the ratio is old / new (above 1: the new form is
faster). The rule in flat.py holds where every ratio of its row is above 1.
"""

from __future__ import annotations

import common
import torch
from common import publish

from rlspeed.fused.flat import tanh_

SHAPES = [(2, 64, 64), (2, 256, 64), (2, 256, 256), (16, 128, 64), (32, 10, 64), (64, 32, 64), (64, 256, 64)]


def best_us(call, repeats: int, loops: int) -> float:
    return common.best_seconds_per_call(call, repeats, loops) * 1e6


def measure(members: int, rows: int, width: int, repeats: int) -> dict:
    h, g = torch.randn(members, rows, width), torch.randn(members, rows, 1)
    w, bias = torch.randn(members, width, 1), torch.randn(members, 1, 1)
    out, scratch = torch.empty(members, rows, 1), torch.empty(members, rows, width)
    dw, dw_t = torch.empty(members, width, 1), torch.empty(members, 1, width)
    w2, bias2 = torch.randn(members, width, 2), torch.randn(members, 1, 2)
    out2, out2_t = torch.empty(members, rows, 2), torch.empty(members, 2, rows).transpose(1, 2)
    loops = max(5, int(2e6 // (members * rows * width)))

    def mul_sum():
        torch.mul(h, w.transpose(1, 2), out=scratch)
        torch.sum(scratch, 2, keepdim=True, out=out).add_(bias)

    def transposed():
        dw.copy_(torch.bmm(g.transpose(1, 2), h, out=dw_t).transpose(1, 2))

    pairs = {
        "forward, 1 column": (lambda: torch.baddbmm(bias, h, w, out=out), mul_sum),
        "weight gradient, 1 column": (lambda: torch.bmm(h.transpose(1, 2), g, out=dw), transposed),
        "input gradient, 1 inner column": (lambda: torch.bmm(g, w.transpose(1, 2), out=scratch),
                                           lambda: torch.mul(g, w.transpose(1, 2), out=scratch)),
        "forward, 2 columns": (lambda: torch.baddbmm(bias2, h, w2, out=out2),
                               lambda: torch.baddbmm(bias2, h, w2, out=out2_t)),
        "tanh": (lambda: scratch.copy_(h).tanh_(), lambda: tanh_(scratch.copy_(h))),
    }
    copy_us = best_us(lambda: scratch.copy_(h), repeats, loops)
    result = {}
    for name, (old, new) in pairs.items():
        old_us, new_us = best_us(old, repeats, loops), best_us(new, repeats, loops)
        if name == "tanh":  # (both time the copy that restores the input: taken out)
            old_us, new_us = old_us - copy_us, new_us - copy_us
        result[name] = {"old_us": old_us, "new_us": new_us, "ratio": old_us / new_us}
    return result


def main() -> None:
    parser = common.script_arguments(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, repeats=2)
    common.set_threads(args.threads)
    load = {"before": common.uptime()}
    shapes = SHAPES[:2] if args.quick else SHAPES
    results = {f"{k}x{b}x{h}": measure(k, b, h, args.repeats) for k, b, h in shapes}
    load["after"] = common.uptime()
    names = list(next(iter(results.values())))
    lines = [
        "## Thin batched products and tanh on a CPU (`benchmarks/thin_products.py`)",
        "",
        "The ensembles' thin batched products and the hidden layers' tanh on a CPU (`benchmarks/thin_products.py`): "
        "torch's `bmm`/`baddbmm`/`tanh_` (old) against the forms `rlspeed.fused.flat` uses (new), "
        f"torch.set_num_threads({args.threads}), best of {args.repeats} loops; old / new per ensemble shape "
        "(members x rows x width; above 1: the new form is faster).",
        "",
        "| members x rows x width | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for shape, row in results.items():
        lines.append(f"| {shape} | " + " | ".join(common.fmt_ratio(row[name]["ratio"]) for name in names) + " |")
    lines += ["", f"Load (`uptime`): before: `{load['before']}`; after: `{load['after']}`."]
    publish("thin_products", lines, {"results": results, "load": load, "settings": vars(args)},
            write=not args.no_write)


if __name__ == "__main__":
    main()
