"""RoIAlign on the CPU: tvm-roialign vs torchvision vs stock TVM 0.27, measured in one run.

Shapes (fp32, aligned=False, random rois inside the image):
  A: features 1x256x200x272, 1000 rois inside 800x1088, 7x7, sampling_ratio 2, spatial_scale 0.25
  B: the same map, 100 rois, 14x14
  C: features 1x256x50x68, spatial_scale 1/16, 1000 rois, 7x7

Both layouts; torchvision has NCHW only, so its NCHW time is the reference for both. Stock TVM is
measured inside ``tvm_roialign.stock_tvm()``. Each time is the median of ``--repeat`` rounds after one
warm-up, each round calling torchvision, ours and stock TVM once in turn (a machine's load reaches them
alike). Prints a table of ratios, writes JSON and a PNG bar chart to ``--out`` (a folder).

    python benchmarks/bench_roi_align.py [--repeat 7] [--shapes A,B,C] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np
import torch
import torchvision
from _common import host_target, interleaved_ms, layout_shape, one_op_runner, random_rois, run_meta
from rich.console import Console
from rich.table import Table

import tvm_roialign
from tvm_roialign.host import usable_cores, use_usable_cores
from tvm_roialign.testing import build_roi_align_module

SHAPES = {
    "A": dict(features=(1, 256, 200, 272), image=(800, 1088), rois=1000, pooled=(7, 7), scale=0.25),
    "B": dict(features=(1, 256, 200, 272), image=(800, 1088), rois=100, pooled=(14, 14), scale=0.25),
    "C": dict(features=(1, 256, 50, 68), image=(800, 1088), rois=1000, pooled=(7, 7), scale=1 / 16),
}
SAMPLING_RATIO = 2


def tvm_runner(shape, layout, target, data_nchw, rois):
    spec = SHAPES[shape]
    mod = build_roi_align_module(
        layout_shape(spec["features"], layout), len(rois), spec["pooled"], spec["scale"],
        SAMPLING_RATIO, False, layout,
    )
    return one_op_runner(mod, data_nchw, rois, layout, target)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per measurement (median)")
    parser.add_argument("--shapes", default="A,B,C", help="comma-separated subset of A,B,C")
    parser.add_argument("--layouts", default="NHWC,NCHW")
    parser.add_argument("--no-stock", action="store_true", help="skip stock TVM (slow)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON and PNG")
    args = parser.parse_args(argv)
    use_usable_cores()  # TVM's pool: every core this process may use

    console = Console(width=140)
    target = host_target()
    rng = np.random.default_rng(0)
    rows = []
    for shape in args.shapes.split(","):
        spec = SHAPES[shape]
        data = rng.standard_normal(spec["features"]).astype("float32")
        rois = random_rois(spec["rois"], spec["image"], rng)
        data_t, rois_t = torch.from_numpy(data), torch.from_numpy(rois)

        torchvision_run = functools.partial(
            torchvision.ops.roi_align,
            data_t,
            rois_t,
            spec["pooled"],
            spec["scale"],
            SAMPLING_RATIO,
            False,
        )

        expected = torchvision_run().numpy()
        for layout in args.layouts.split(","):
            console.print(f"[bold]shape {shape} {layout}[/]: compiling ours ...")
            run, result = tvm_runner(shape, layout, target, data, rois)
            err = float(np.abs(result() - expected).max())
            runs = [torchvision_run, run]
            if not args.no_stock:
                console.print(f"[bold]shape {shape} {layout}[/]: compiling stock TVM ...")
                with tvm_roialign.stock_tvm():
                    stock_run, _ = tvm_runner(shape, layout, target, data, rois)
                runs.append(stock_run)
            tv_ms, ours_ms, *stock = interleaved_ms(runs, args.repeat)
            stock_ms = stock[0] if stock else None
            rows.append(
                dict(
                    shape=shape,
                    layout=layout,
                    ours_ms=ours_ms,
                    torchvision_ms=tv_ms,
                    stock_tvm_ms=stock_ms,
                    speedup_vs_torchvision=tv_ms / ours_ms,
                    speedup_vs_stock_tvm=None if stock_ms is None else stock_ms / ours_ms,
                    max_abs_err_vs_torchvision=err,
                )
            )

    table = Table(title=f"RoIAlign CPU, {usable_cores()} cores, target {target}")
    for col in ("shape", "layout", "ours ms", "torchvision ms", "stock TVM ms", "x vs torchvision",
                "x vs stock", "max |err|"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["shape"],
            r["layout"],
            f"{r['ours_ms']:.2f}",
            f"{r['torchvision_ms']:.1f}",
            "-" if r["stock_tvm_ms"] is None else f"{r['stock_tvm_ms']:.1f}",
            f"{r['speedup_vs_torchvision']:.1f}",
            "-" if r["speedup_vs_stock_tvm"] is None else f"{r['speedup_vs_stock_tvm']:.1f}",
            f"{r['max_abs_err_vs_torchvision']:.1e}",
        )
    console.print(table)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_meta(target, args.repeat, SAMPLING_RATIO)
    (out / "bench_roi_align.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
    _plot(rows, out / "bench_roi_align.png")
    console.print(f"wrote {out / 'bench_roi_align.json'} and {out / 'bench_roi_align.png'}")


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['shape']} {r['layout']}" for r in rows]
    series = [("ours", "ours_ms"), ("torchvision", "torchvision_ms"), ("stock TVM", "stock_tvm_ms")]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (name, key) in enumerate(series):
        values = [r[key] or 0.0 for r in rows]
        ax.bar(x + (i - 1) * 0.27, values, 0.27, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale, lower is better)")
    ax.set_xticks(x, labels)
    ax.set_title("RoIAlign on the CPU, fp32, median")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
