"""How long a detector takes to compile, beside OpenVINO's conversion of the same model.

    python benchmarks/bench_compile.py [--models maskrcnn_resnet50_fpn,...] [--rounds 1]

For each model, in turn and in fresh processes (the wall time a user waits, the interpreter's start
and imports included): ``tvm-roialign compile NAME`` (the default: any photo size, fast mode),
``tvm-roialign compile NAME --exact``, and OpenVINO's ``convert_model`` + ``compile_model`` of the
same torchvision model (seeded, random weights) traced for the astronaut photo returning boxes,
labels, scores and a Mask R-CNN's mask logits (so that it converts the work our artifact does;
OpenVINO's model is for that one size, ours for any). With ``--rounds`` above 1 the three
alternate and each column's median is printed. Prints one table with the CPU and the date; the
library's size against the model's fp32 weights beside ours.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT_MODELS = (
    "maskrcnn_resnet50_fpn",
    "fasterrcnn_resnet50_fpn",
    "keypointrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn_v2",
    "fasterrcnn_resnet50_fpn_v2",
    "fasterrcnn_mobilenet_v3_large_fpn",
)

#: OpenVINO's side, run in its own process: build, convert (mask logits returned), compile
OPENVINO = """
import sys, time
t0 = time.perf_counter()
import torch
from tvm_roialign.bench.openvino_peer import OpenVINOModel, detector_model
from tvm_roialign.host import usable_cores
from tvm_roialign.models import detection
model = detection.build_torch_detector(sys.argv[1])
image = torch.from_numpy(detection.sample_photo("astronaut")).permute(2, 0, 1).float() / 255
t1 = time.perf_counter()
converted = detector_model(model, image, paste=False)
t2 = time.perf_counter()
OpenVINOModel(converted, threads=usable_cores(), precision=None)
t3 = time.perf_counter()
print(f"convert {t2 - t1:.2f} compile {t3 - t2:.2f}")
"""


def _wall(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds, done.stdout


def _weights_mib(name: str) -> float:
    from tvm_roialign.models import detection

    model = detection.build_torch_detector(name)
    return sum(t.numel() * 4 for t in model.state_dict().values() if t.is_floating_point()) / 2**20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated detector names (default: every name compile knows)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (medians)")
    args = parser.parse_args(argv)
    import tvm

    from tvm_roialign.host import usable_cores

    cli = [sys.executable, "-m", "tvm_roialign", "compile", "-q"]
    print(f"{tvm.target.codegen.llvm_get_system_cpu()}, {usable_cores()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; wall seconds, fresh processes")
    print(f"{'model':<36} {'fast':>7} {'exact':>7} {'OV conv+comp':>13} {'(convert':>9} "
          f"{'compile)':>9} {'fast/OV':>8} {'library/weights':>16}")
    with tempfile.TemporaryDirectory() as folder:
        for name in [m for m in args.models.split(",") if m]:
            library = os.path.join(folder, f"{name}.so")
            rows = {"fast": [], "exact": [], "openvino": [], "convert": [], "compile": []}
            for _ in range(args.rounds):
                rows["fast"].append(_wall([*cli, name, "-o", library])[0])
                size = os.path.getsize(library) / 2**20
                rows["exact"].append(_wall([*cli, name, "--exact", "-o", library])[0])
                seconds, out = _wall([sys.executable, "-c", OPENVINO, name])
                words = out.split()
                rows["openvino"].append(seconds)
                rows["convert"].append(float(words[words.index("convert") + 1]))
                rows["compile"].append(float(words[words.index("compile") + 1]))
            med = {key: statistics.median(values) for key, values in rows.items()}
            print(f"{name:<36} {med['fast']:7.1f} {med['exact']:7.1f} {med['openvino']:13.1f} "
                  f"{med['convert']:9.1f} {med['compile']:9.1f} {med['fast'] / med['openvino']:8.2f} "
                  f"{size / _weights_mib(name):15.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
