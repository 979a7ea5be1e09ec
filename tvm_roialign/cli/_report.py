"""Tables that ``run`` prints: top values, the time summary (tvmc's layout) and the kernel profile."""

from __future__ import annotations

import numpy as np


def print_top(output: np.ndarray, count: int) -> None:
    """The ``count`` largest values of ``output``'s first row (a classifier's scores)."""
    row = output.reshape(-1) if output.ndim < 2 else output.reshape(output.shape[0], -1)[0]
    order = np.argsort(-row, kind="stable")[:count]
    print(f"top {len(order)} of output 0 (row 0 of {list(output.shape)}):")
    print(f"{'rank':>6} {'index':>8} {'value':>14}")
    for rank, index in enumerate(order, 1):
        print(f"{rank:>6} {int(index):>8} {float(row[index]):>14.6g}")


def print_time(summary) -> None:
    """mean / median / max / min / std in ms, as tvmc's ``--print-time`` printed them."""
    print(
        f"Execution time summary ({summary.repeat} measurement(s) of {summary.number} call(s), "
        "after a warm-up call):"
    )
    print(f"{'mean (ms)':>12} {'median (ms)':>12} {'max (ms)':>12} {'min (ms)':>12} {'std (ms)':>12}")
    values = (summary.mean_s, summary.median_s, summary.max_s, summary.min_s, summary.std_s)
    print(" ".join(f"{v * 1e3:>12.4f}" for v in values))


def print_profile(kernels, wall_s: float, runs: int) -> None:
    """One row per kernel: calls, ms per run, mean us per call, share of the run."""
    from rich.console import Console
    from rich.table import Table

    kernel_s = sum(k.total_s for k in kernels)
    print(
        f"Profile: per run, mean of {runs} run(s) after a warm-up; wall {wall_s * 1e3:.3f} ms, "
        f"kernels {kernel_s * 1e3:.3f} ms"
    )
    table = Table()
    for name, justify in (
        ("kernel", "left"),
        ("calls", "right"),
        ("ms", "right"),
        ("us per call", "right"),
        ("% of run", "right"),
    ):
        table.add_column(name, justify=justify)
    for k in kernels:
        table.add_row(
            k.name,
            str(k.calls),
            f"{k.total_s * 1e3:.3f}",
            f"{k.mean_s * 1e6:.1f}",
            f"{100 * k.total_s / wall_s:.1f}" if wall_s > 0 else "-",
        )
    Console(width=max(100, max((len(k.name) for k in kernels), default=0) + 50)).print(table)
