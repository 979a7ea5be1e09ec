"""Tuned against untuned build of one model, in one process: ``compile`` without and with
``--tuning-records``, timed interleaved in alternating order (median of ``--repeat`` rounds, each the
mean of 3 calls of ``time_evaluator``).

    python benchmarks/bench_tuning.py resnet18.pt2 records/ [--repeat 10]

Prints the coverage line of the tuned build, both medians and their ratio (untuned / tuned: above
1 means the records made the model faster), and whether the outputs agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np


def _compile(model: str, out: Path, records: str | None) -> None:
    from tvm_roialign import cli

    argv = ["compile", model, "-o", str(out)]
    if records:
        argv += ["--tuning-records", records]
    if cli.main(argv) != 0:
        sys.exit(f"compile {' '.join(argv)} failed")


def _vm(lib: Path):
    import tvm

    from tvm_roialign.runtime import LoadedVM

    return LoadedVM(tvm.runtime.load_module(str(lib)), tvm.cpu())


def main() -> int:
    import json

    import tvm

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model")
    parser.add_argument("records")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"untuned": Path(tmp) / "untuned.so", "tuned": Path(tmp) / "tuned.so"}
        _compile(args.model, libs["untuned"], None)
        _compile(args.model, libs["tuned"], args.records)
        specs = json.loads(Path(f"{libs['untuned']}.json").read_text())["inputs"]
        rng = np.random.default_rng(0)
        inputs = [tvm.runtime.tensor(rng.random(s["shape"]).astype(s["dtype"])) for s in specs]
        vms = {name: _vm(lib) for name, lib in libs.items()}
        outs = {}
        for name, vm in vms.items():
            out = vm["main"](*inputs)
            outs[name] = (out if hasattr(out, "numpy") else out[0]).numpy()
        times = {name: [] for name in vms}
        names = list(vms)
        for round_ in range(args.repeat):  # interleaved rounds, order alternating: drift hits both
            for name in names if round_ % 2 == 0 else names[::-1]:
                vm = vms[name]
                timer = vm.time_evaluator("main", tvm.cpu(), number=3, repeat=1)
                times[name].append(float(timer(*inputs).mean))
    medians = {name: statistics.median(t) for name, t in times.items()}
    agree = np.allclose(outs["tuned"], outs["untuned"], rtol=1e-4, atol=1e-4)
    untuned, tuned = medians["untuned"] * 1e3, medians["tuned"] * 1e3
    print(f"median of {args.repeat}: untuned {untuned:.2f} ms, tuned {tuned:.2f} ms")
    print(f"untuned / tuned = {medians['untuned'] / medians['tuned']:.3f}; outputs agree: {agree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
