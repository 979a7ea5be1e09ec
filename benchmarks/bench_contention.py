"""The main job's PyTorch glue next to TVM's thread pool, alone and beside busy CPU jobs, both orders of use.

The split Mask R-CNN (``tvm-roialign maskrcnn``'s pipeline: three TVM pieces, torchvision's glue between them
in PyTorch) is built once (any-size pieces, NHWC, this machine's CPU) and its pieces are saved to a folder.
Each condition then runs in a fresh process that loads them, so that the order of first use is its own:

* order ``eager first``: one PyTorch eager Mask R-CNN run before TVM's first piece; ``TVM first``: the
  reverse;
* load ``alone``, or beside ``--busy`` CPU-bound jobs (``python -c 'while 1: pass'``, started before the
  process and killed after it).

Each process runs the detector ``--repeat`` times (after its warm-up) and reports the medians of the glue's
seconds, the TVM pieces' seconds and end to end, and of PyTorch eager end to end. The table gives the glue's
share of end to end per condition, for each of two thread settings of the glue: ``package`` (``TVMMaskRCNN``'s
default, PyTorch on one thread while the detector runs) and ``pytorch`` (``glue_threads=None``: PyTorch's own
thread count, every core).

    python benchmarks/bench_contention.py [--busy 1] [--repeat 3] [--settings package,pytorch]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PIECES = ("backbone", "box_branch", "mask_branch")
ORDERS = ("eager first", "TVM first")
#: ``glue_threads`` of the detector per setting
SETTINGS = {"package": 1, "pytorch": None}
#: the thread settings each process reports
ENV_VARS = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "OMP_WAIT_POLICY")


def _model_and_image():
    from tvm_roialign.models import maskrcnn as mr

    return mr.build_torch_model(mr.MaskRCNNConfig()), mr.load_image(None)


def build_pieces(folder: Path) -> None:
    """Build the any-size pieces once and save each as ``<piece>.so``."""
    from tvm_roialign.models.maskrcnn import TVMMaskRCNN

    model, image = _model_and_image()
    detector = TVMMaskRCNN(model, "native", "NHWC", progress=lambda m: print(m, flush=True))
    for name, piece in detector.compile(detector.padded_shape(image)).items():
        piece.executable.export_library(str(folder / f"{name}.so"))


def _loaded_detector(folder: Path, model, image, setting: str):
    """A detector whose pieces are the saved libraries (nothing is compiled)."""
    import tvm

    from tvm_roialign.models.maskrcnn import Piece, TVMMaskRCNN

    detector = TVMMaskRCNN(model, "native", "NHWC", glue_threads=SETTINGS[setting])
    padded = detector.padded_shape(image)
    key = "any" if detector.symbolic(padded) else tuple(padded)
    detector.pieces[key] = {
        name: Piece(name, None, None, tvm.runtime.load_module(str(folder / f"{name}.so")), tvm.cpu(),
                    0.0, 0.0)
        for name in PIECES
    }
    return detector


def child(folder: Path, order: str, repeat: int, setting: str) -> dict:
    """One condition in this process: warm-up in ``order``, then ``repeat`` detector runs and eager runs."""
    import torch

    model, image = _model_and_image()
    detector = _loaded_detector(folder, model, image, setting)

    def eager():
        with torch.no_grad():
            model([image])

    first, second = (eager, lambda: detector.run(image)) if order == ORDERS[0] else (
        lambda: detector.run(image), eager)
    first()
    second()
    runs, totals, eager_s = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        runs.append(detector.run(image))
        totals.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        eager()
        eager_s.append(time.perf_counter() - t0)
    median = statistics.median
    return dict(
        end_to_end_s=median(totals),
        glue_s=median(r.glue_s for r in runs),
        glue_share=median(r.glue_s / t for r, t in zip(runs, totals)),
        pieces_s=median(sum(r.piece_s.values()) for r in runs),
        eager_s=median(eager_s),
        torch_threads=torch.get_num_threads(),
        env={k: os.environ.get(k) for k in ENV_VARS},
    )


def _busy_jobs(count: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count)]


def run_condition(folder: Path, order: str, busy: int, repeat: int, setting: str) -> dict:
    print(f"{setting}: {order}, {'alone' if busy == 0 else f'beside {busy} busy job(s)'} ...", flush=True)
    jobs = _busy_jobs(busy)
    try:
        cmd = [sys.executable, __file__, "--child", str(folder), "--order", order, "--repeat", str(repeat),
               "--settings", setting]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    finally:
        for job in jobs:
            job.kill()
            job.wait()
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=1, help="busy-loop jobs beside the loaded runs")
    parser.add_argument("--repeat", type=int, default=3, help="timed detector runs per condition (median)")
    parser.add_argument("--settings", default="package,pytorch",
                        help="comma-separated subset of package,pytorch")
    parser.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    parser.add_argument("--pieces", default=None,
                        help="folder for the built pieces, kept and reused (default: a temporary one)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--order", default=ORDERS[0], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    settings = args.settings.split(",")
    if any(setting not in SETTINGS for setting in settings):
        parser.error(f"--settings must be a comma-separated subset of package,pytorch, got {args.settings!r}")
    if args.child:
        print(json.dumps(child(Path(args.child), args.order, args.repeat, settings[0])))
        return
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as tmp:
        folder = Path(args.pieces or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if not all((folder / f"{name}.so").exists() for name in PIECES):
            build_pieces(folder)
        rows = [
            dict(setting=setting, order=order, busy=busy,
                 **run_condition(folder, order, busy, args.repeat, setting))
            for setting in settings
            for busy in (0, args.busy)
            for order in ORDERS
        ]
    _print_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_contention.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {out / 'bench_contention.json'}")


def _print_table(rows) -> None:
    from rich.console import Console
    from rich.table import Table

    from tvm_roialign.host import usable_cores

    table = Table(title=f"Mask R-CNN, TVM pieces and PyTorch glue, {usable_cores()} cores (medians)")
    for col in ("glue threads", "order", "load", "end to end s", "TVM pieces s", "glue s", "glue share",
                "eager s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["setting"], r["order"], "alone" if r["busy"] == 0 else f"+{r['busy']} busy",
                      f"{r['end_to_end_s']:.3f}", f"{r['pieces_s']:.3f}", f"{r['glue_s']:.3f}",
                      f"{100 * r['glue_share']:.1f}%", f"{r['eager_s']:.3f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
