"""Accuracy of every precision on a trained classifier: the reference resnet18
(tvm_roialign.datasets.reference, trained by ``tools/train_reference.py --model resnet18`` on the
synthetic dataset's one-object images, 4 classes) on the held-out split: each build's top-1
accuracy, its top-1 agreement with PyTorch eager fp32 and the cosine of its logits to eager's.

Rows: eager fp32; ours fp32 (the default build), bf16 (the AVX512-BF16 or AMX kernels, built as
``pipeline.build`` builds them when asked), int8 (this CPU's kernels, calibrated on ``--calibration``
train-split images); ONNX Runtime's ``quantize_static`` QDQ int8 and OpenVINO's NNCF int8 of the
ONNX export, calibrated on the same images.

    python benchmarks/bench_accuracy_classifier.py [--images 500] [--calibration 32]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import write_report
from bench_accuracy import cpu_name

from tvm_roialign.datasets import reference, synthetic

ROWS = ("eager", "fp32", "bf16", "int8", "ort-int8", "nncf-int8")


def _ours(model, example, precision: str, calibration):
    import tvm
    from tvm import relax

    from tvm_roialign.frontend import from_exported_program
    from tvm_roialign.pipeline import build
    from tvm_roialign.precision import resolve
    from tvm_roialign.target import parse_target

    target = parse_target("native")
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, (torch.from_numpy(example),)),
                                    keep_params_as_input=False)
    plan = resolve(target, precision, mod, avx512_bf16=True)
    options = {"calibration": [c[None] for c in calibration]} if precision == "int8" else {}
    built = build(mod, target, precision=plan, **options)
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    meta = {"precision": plan.precision, "kernels": plan.kernels}

    def run(x):
        out = vm["main"](tvm.runtime.tensor(x))
        return (out[0] if not hasattr(out, "numpy") else out).numpy()

    return run, meta


def _onnx(model, example, folder: Path) -> Path:
    path = folder / "classifier.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.from_numpy(example),), str(path), input_names=["x"],
                          output_names=["y"], dynamo=False)
    return path


def _ort_int8(onnx_path: Path, calibration, folder: Path):
    from tvm_roialign.bench.onnxruntime_peer import cpu_session, quantized_int8

    out = quantized_int8(str(onnx_path), str(folder / "classifier_int8.onnx"),
                         {"x": [c[None] for c in calibration]})
    session = cpu_session(out, torch.get_num_threads())
    return lambda x: session.run(None, {"x": x})[0]


def _nncf_int8(onnx_path: Path, calibration):
    from tvm_roialign.bench.openvino_peer import OpenVINOModel, nncf_int8

    quantized = OpenVINOModel(nncf_int8(onnx_path, [c[None] for c in calibration]), torch.get_num_threads(),
                              "f32")
    return lambda x: quantized(x)[0]


def _scores(logits: np.ndarray, labels: np.ndarray, eager: np.ndarray | None) -> dict:
    out = {"top1": float(np.mean(logits.argmax(1) == labels))}
    if eager is not None:
        a, b = logits.astype(np.float64), eager.astype(np.float64)
        cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        out.update(agreement=float(np.mean(logits.argmax(1) == eager.argmax(1))),
                   cosine_min=float(cosine.min()), cosine_mean=float(cosine.mean()))
    return out


def print_report(report) -> None:
    print(f"{report['cpu']}, {report['date']}; {report['images']} held-out images ({report['size']} px), "
          f"calibration {report['calibration']} train images; weights {report['weights']}")
    for row, meta in report["builds"].items():
        print(f"  {row}: {meta}")
    print("| build | top-1 | top-1 agreement with eager fp32 | cosine to eager (min / mean) |")
    print("|---|---|---|---|")
    for row, r in report["rows"].items():
        agreement = f"{100 * r['agreement']:.1f}%" if "agreement" in r else "-"
        cosine = f"{r['cosine_min']:.5f} / {r['cosine_mean']:.5f}" if "cosine_min" in r else "-"
        print(f"| {row} | {100 * r['top1']:.1f}% | {agreement} | {cosine} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=tuple(reference.CLASSIFIERS), default="resnet18")
    p.add_argument("--images", type=int, default=500, help="held-out images")
    p.add_argument("--calibration", type=int, default=32, help="train-split images int8 is calibrated on")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/bench_accuracy_classifier.json")
    args = p.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        p.error(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    config = reference.TrainConfig.defaults(args.model)
    model = reference.load_reference(config)
    images, labels = synthetic.classification_batch(config.data, "val", range(args.images))
    calibration, _ = synthetic.classification_batch(config.data, "train", range(args.calibration))
    example = images[:1]
    logits, builds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        onnx_path = None
        for row in rows:
            start = time.perf_counter()
            if row == "eager":  # called under no_grad below
                run = lambda x: model(torch.from_numpy(x)).numpy()
            elif row in ("fp32", "bf16", "int8"):
                run, builds[row] = _ours(model, example, row, calibration)
            else:
                onnx_path = onnx_path or _onnx(model, example, folder)
                here = os.getcwd()
                os.chdir(folder)  # the quantizers write temporary files into the working directory
                try:
                    run = _ort_int8(onnx_path, calibration, folder) if row == "ort-int8" else _nncf_int8(
                        onnx_path, calibration)
                finally:
                    os.chdir(here)
            with torch.no_grad():
                logits[row] = np.concatenate([run(images[i : i + 1]) for i in range(len(images))])
            print(f"{row}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    report = {
        "model": args.model, "cpu": cpu_name(), "date": datetime.date.today().isoformat(),
        "images": args.images, "size": config.data.size, "calibration": args.calibration,
        "weights": str(reference.weights_path(config)), "builds": builds,
        "rows": {row: _scores(values, labels, logits.get("eager") if row != "eager" else None)
                 for row, values in logits.items()},
    }
    write_report(report, args.out, print_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
