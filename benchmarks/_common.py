"""What the benchmarks share: this machine's target, the random boxes, the median timer, a
one-op module's runner and the JSON's ``meta`` (bench_roi_align.py, bench_roi_family.py), and the
report's JSON file (bench_anyphoto.py, bench_detector_precision.py)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

import numpy as np
import torch
import torchvision
import tvm
from tvm import relax

from tvm_roialign.host import usable_cores


def host_target() -> tvm.target.Target:
    """This machine's CPU (so that the x86 strategy vectorizes to its full width)."""
    return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})


def random_rois(num, image_hw, rng):
    """``(0, x1, y1, x2, y2)`` boxes of 16-512 pixels inside an image of ``image_hw``."""
    height, width = image_hw
    x1 = rng.uniform(0, width - 16, num)
    y1 = rng.uniform(0, height - 16, num)
    x2 = np.minimum(x1 + rng.uniform(16, 512, num), width)
    y2 = np.minimum(y1 + rng.uniform(16, 512, num), height)
    return np.stack([np.zeros(num), x1, y1, x2, y2], axis=1).astype("float32")


def median_ms(fn, repeat):
    """Milliseconds: the median of ``repeat`` calls of ``fn`` after one warm-up call."""
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


#: a pause before each timed call or block: the previous runner's idle threads (ONNX Runtime's
#: spin after a run) stop spinning before the next runner is timed
PAUSE_S = 0.05


def interleaved_seconds(runners: dict, repeat: int) -> dict:
    """Median seconds of each runner (a name: a function of no arguments): the median of
    ``repeat`` rounds that call each once in turn (after one warm-up call each), so that a
    machine's load reaches them alike."""
    for fn in runners.values():
        fn()  # warm-up
    times = {name: [] for name in runners}
    for _ in range(repeat):
        for name, fn in runners.items():
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(own) for name, own in times.items()}


def interleaved_ms(fns, repeat):
    """Milliseconds per function of ``fns`` (a list): :func:`interleaved_seconds`."""
    return [1e3 * s for s in interleaved_seconds(dict(enumerate(fns)), repeat).values()]


def repeated(fn, number: int):
    """A function that calls ``fn`` ``number`` times (a timed block)."""

    def run():
        for _ in range(number):
            fn()

    return run


#: a timed block of calls lasts about this long (seconds), so a runner's spinning threads slow only its own
BLOCK_S = 0.25


def interleaved_blocks(runners: dict, rounds: int, block_s: float = BLOCK_S) -> dict:
    """Median seconds per call of each runner: :func:`interleaved_seconds` over blocks of calls,
    each runner's block sized from one timed call (after a warm-up) to last about ``block_s``."""
    numbers = {}
    for name, fn in runners.items():
        fn()
        start = time.perf_counter()
        fn()
        numbers[name] = max(1, round(block_s / max(time.perf_counter() - start, 1e-4)))
    blocks = {name: repeated(fn, numbers[name]) for name, fn in runners.items()}
    return {name: t / numbers[name] for name, t in interleaved_seconds(blocks, rounds).items()}


def one_op_runner(mod, data_nchw, rois, layout, target):
    """``(run, result)`` of a module ``main(data, rois)`` built for ``target``: ``run()`` calls it
    on ``data_nchw`` (given in ``layout``), ``result()`` returns its output in NCHW."""
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    data = data_nchw if layout == "NCHW" else np.ascontiguousarray(data_nchw.transpose(0, 2, 3, 1))
    args = [tvm.runtime.tensor(data), tvm.runtime.tensor(rois)]

    def run():
        return vm["main"](*args)

    def result():
        out = run().numpy()
        return out if layout == "NCHW" else out.transpose(0, 3, 1, 2)

    return run, result


def layout_shape(nchw, layout):
    """An NCHW shape in ``layout``."""
    n, c, h, w = nchw
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def run_meta(target, repeat: int, sampling_ratio: int) -> dict:
    """The machine, the thread counts and the versions a result was measured with."""
    return dict(
        cpu=platform.processor() or platform.machine(),
        mcpu=str(target.attrs.get("mcpu", "")),
        cores=usable_cores(),
        tvm_threads=os.environ.get("TVM_NUM_THREADS"),
        torch_threads=torch.get_num_threads(),
        repeat=repeat,
        sampling_ratio=sampling_ratio,
        tvm=tvm.__version__,
        torch=torch.__version__,
        torchvision=torchvision.__version__,
    )


def write_report(report: dict, path, print_report) -> None:
    """``report`` as JSON at ``path`` (its folder made), then ``print_report(report)`` and the path."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=float))
    print_report(report)
    print(f"written {path}")
