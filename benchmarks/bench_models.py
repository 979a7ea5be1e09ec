"""The model zoo on the CPU: TVM (``tvm-roialign compile m.pt2 -o m.so``, no flag) against PyTorch
eager, ONNX Runtime and OpenVINO, in one process.

    python benchmarks/bench_models.py [--models resnet18,mobilenet_v2,...] [--repeat 7]
        [--threads N] [--no-openvino] [--profile] [--detectors] [--precisions fp32,bf16,int8]
        [--out-dir benchmarks/results]

Classifiers: torchvision's resnet18, resnet50, mobilenet_v2, mobilenet_v3_large, efficientnet_b0,
convnext_tiny, vit_b_16, swin_t and resnext50_32x4d, random weights (seed 0) with the batch norms
calibrated by three train-mode passes over the sample photos
(:func:`tvm_roialign.models.classifier_zoo.build_classifier`: without it, activations turn denormal
and every runtime crawls), on the astronaut photo at 1x3x224x224. Each is saved with
``torch.export`` and compiled by the CLI with no flag; ONNX Runtime and OpenVINO run the same
``torch.onnx.export(..., dynamo=False, opset_version=17)`` file, OpenVINO twice: with
``INFERENCE_PRECISION_HINT=f32`` and with the plugin's default precision (bf16 where the CPU has
AMX or AVX512-BF16; the JSON records which).

Every runtime has the same threads (``--threads``, default: the cores this process may use).
Eager runs every model once before anything else starts (so PyTorch's threads are up before
TVM's pool), then, model by model, the runtimes take turns in blocks of calls (a block lasts about
a quarter of a second), round after round; the median of ``--repeat`` rounds is reported per call.
Each output is compared with eager's (max abs diff over the output's largest magnitude).
PyTorch's OpenMP threads sleep between calls (``OMP_WAIT_POLICY=PASSIVE``, set before PyTorch loads unless
the environment sets it): spinning, they took the cores from the next runtime's turn and TVM's threads
from theirs, which made the eager column a measure of the contention (docs/limitations.md).
``--precisions``: TVM's builds with ``--precision bf16`` / ``int8`` as columns beside fp32 (int8 adds
ONNX Runtime's own ``quantize_static`` of the ONNX file and OpenVINO's NNCF ``nncf.quantize`` of it,
calibrated on the sample photos, and a table of our int8 against theirs with geometric means), and a
roofline table: each runtime's GFLOP/s (PyTorch's FlopCounterMode count of the model) over the
matrix peak of its precision measured in the same run (``torch.mm`` fp32 / bf16, ``torch._int_mm``).
``--profile`` also times each TVM kernel once (:func:`tvm_roialign.profiling.profile_vm`).

``--detectors``: Mask R-CNN, Faster R-CNN and Keypoint R-CNN (random weights, seed 3) on the
astronaut, coffee and portrait photos, the any-size artifact of ``benchmarks/bench_anyphoto.py``
against eager, ONNX Runtime and OpenVINO (per photo size); for Mask R-CNN, OpenVINO f32 also without
torchvision's mask pasting (``OV f32 unpasted``: its network alone, returning the 28x28 mask
probabilities; the artifact's time always includes its own pasting).

Writes ``models.json`` and ``models.png`` under ``--out-dir`` and prints the table with, per
model, TVM's speed over each peer's (peer time / TVM time) and their geometric means.
"""

from __future__ import annotations

import _omp_passive  # noqa: F401  # isort: skip  (first: before torch loads its OpenMP)

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from _roofline import int8_table, matrix_peaks, model_gflop, precision_table

from tvm_roialign.cli._common import first_line
from tvm_roialign.runtime import LoadedVM

RESULTS = Path(__file__).resolve().parent / "results"
DETECTORS = ("maskrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn", "keypointrcnn_resnet50_fpn")
DETECTOR_PHOTOS = ("astronaut", "coffee", "portrait")
#: A timed block lasts about this long (seconds), so a runtime's spinning threads slow only its own.
BLOCK_S = 0.25


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _rel_diff(got, expected) -> float:
    got, expected = np.asarray(got, dtype="float64"), np.asarray(expected, dtype="float64")
    if got.shape != expected.shape:
        return float("inf")
    return float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30))


def _onnx_file(model, inputs, path: str) -> str:
    import torch

    from tvm_roialign.bench.onnxruntime_peer import OPSET

    # with autograd on: under no_grad, nn.MultiheadAttention takes a fused path (vit_b_16) that
    # the TorchScript exporter cannot write
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, path, dynamo=False, opset_version=OPSET)
    return path


def _tvm_classifier(model, x, workdir: str, name: str, precision: str = "fp32"):
    """``(call, vm module, compile seconds)``: ``model`` through ``torch.export`` and the CLI
    (``--precision``, int8 calibrated on the CLI's default photos)."""
    import torch
    import tvm

    from tvm_roialign import cli

    pt2, lib = os.path.join(workdir, f"{name}.pt2"), os.path.join(workdir, f"{name}_{precision}.so")
    if not os.path.exists(pt2):
        torch.export.save(torch.export.export(model, (x,)), pt2)
    t0 = time.perf_counter()
    code = cli.main(["--quiet", "compile", pt2, "-o", lib, "--precision", precision])
    if code:
        raise RuntimeError(f"tvm-roialign compile {name}.pt2 failed (exit code {code})")
    compile_s = time.perf_counter() - t0
    module = tvm.runtime.load_module(lib)
    vm = LoadedVM(module, tvm.cpu())
    data = tvm.runtime.tensor(x.numpy())

    def call():
        out = vm["main"](data)
        return out if hasattr(out, "numpy") else out[0]

    return call, module, compile_s


def _peers(model, inputs, onnx_path: str, threads: int, args) -> tuple[dict, dict]:
    """``({runtime: call}, {"openvino_default_precision": ...})`` for the ONNX file's peers (with
    ``int8`` among ``args.precisions``, ONNX Runtime's own int8 quantization of the file and
    OpenVINO's, NNCF's ``nncf.quantize``, at the plugin's default precision elsewhere, too, both
    calibrated on the sample photos)."""
    from tvm_roialign.bench.onnxruntime_peer import cpu_session, quantized_int8
    from tvm_roialign.models.classifier_zoo import photo_batch

    _onnx_file(model, inputs, onnx_path)
    session = cpu_session(onnx_path, threads)
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
    calls = {"onnxruntime": lambda: session.run(None, feed)[0]}
    if "int8" in args.precisions:
        photos = [p[None].numpy() for p in photo_batch()]
        name = session.get_inputs()[0].name
        int8 = cpu_session(quantized_int8(onnx_path, onnx_path + ".int8.onnx", {name: photos}), threads)
        calls["onnxruntime_int8"] = lambda: int8.run(None, feed)[0]
    openvino = args.openvino
    info = {}
    if openvino:
        from tvm_roialign.bench.openvino_peer import OpenVINOModel, nncf_available, nncf_int8

        arrays = [t.numpy() for t in inputs]
        f32 = OpenVINOModel(onnx_path, threads, "f32")
        default = OpenVINOModel(onnx_path, threads, None)
        calls["openvino_f32"] = lambda: f32(*arrays)[0]
        calls["openvino_default"] = lambda: default(*arrays)[0]
        info["openvino_default_precision"] = default.precision
        if "int8" in args.precisions and nncf_available():
            photos = [p[None].numpy() for p in photo_batch()]
            quantized = OpenVINOModel(nncf_int8(onnx_path, photos), threads, None)
            calls["openvino_int8"] = lambda: quantized(*arrays)[0]
    return calls, info


def timed_blocks(calls: dict, repeat: int, number: int) -> dict:
    """Seconds per call of each runtime: ``_common.interleaved_seconds`` over blocks of
    ``number`` calls (the runtimes take turns block by block), divided by ``number``."""
    from _common import interleaved_seconds, repeated

    medians = interleaved_seconds({name: repeated(fn, number) for name, fn in calls.items()}, repeat)
    return {name: seconds / number for name, seconds in medians.items()}


def _top_kernels(module, x, count: int = 4) -> list[dict]:
    import tvm

    from tvm_roialign.profiling import profile_vm

    vm = LoadedVM(module, tvm.cpu())
    kernels, wall = profile_vm(vm, tvm.cpu(), [tvm.runtime.tensor(x.numpy())], runs=2)
    return [
        {"kernel": k.name, "calls": k.calls, "ms": k.total_s * 1e3, "share": k.total_s / wall}
        for k in kernels[:count]
    ]


def bench_classifier(name, model, x, args, threads, workdir) -> dict:
    """One classifier: compile, peers, outputs compared with eager, interleaved timing."""
    import torch

    _log(f"{name}: compile with the CLI")
    tvm_call, module, compile_s = _tvm_classifier(model, x, workdir, name)
    _log(f"{name}: ONNX export, ONNX Runtime and OpenVINO sessions")
    try:
        peers, info = _peers(model, (x,), os.path.join(workdir, f"{name}.onnx"), threads, args)
    except Exception as err:  # noqa: BLE001 - an exporter or peer that cannot take the model
        why = f"{type(err).__name__}: {first_line(err)}"
        _log(f"{name}: no ONNX Runtime / OpenVINO: {why}")
        peers, info = {}, {"peer_error": why}

    def eager():
        with torch.no_grad():
            return model(x)

    calls = {"tvm": lambda: tvm_call().numpy(), "eager": eager}
    for precision in args.precisions[1:]:
        _log(f"{name}: compile with the CLI, --precision {precision}")
        other = _tvm_classifier(model, x, workdir, name, precision)[0]
        calls[f"tvm_{precision}"] = lambda other=other: other().numpy()
    calls.update(peers)
    expected = eager().numpy()
    row = {"compile_s": compile_s, "gflop": model_gflop(model, (x,)), **info}
    row["max_rel_diff_vs_eager"] = {
        k: _rel_diff(fn() if k != "eager" else expected, expected) for k, fn in calls.items() if k != "eager"
    }
    t0 = time.perf_counter()
    eager()
    number = max(1, round(BLOCK_S / max(time.perf_counter() - t0, 1e-4)))
    _log(f"{name}: {args.repeat} rounds of {number} calls per runtime")
    row["number"] = number
    row["seconds"] = timed_blocks(calls, args.repeat, number)
    if args.profile:
        row["tvm_top_kernels"] = _top_kernels(module, x)
    return row


def bench_detectors(detectors: dict, args, threads: int, workdir: str) -> dict:
    """The any-size artifact of each detector (``bench_anyphoto.compiled``) on three photos
    against eager, ONNX Runtime and OpenVINO, interleaved (``_common.interleaved_seconds``)."""
    import torch
    from _common import interleaved_seconds
    from bench_anyphoto import compiled, photos

    from tvm_roialign.bench.onnxruntime_peer import OnnxRuntimeDetector
    from tvm_roialign.bench.openvino_peer import OpenVINOModel, detector_model

    rgbs = photos()
    rows = {}
    for name, model in detectors.items():
        artifact, build = compiled(model, None, "native", Path(workdir) / f"{name}.so", _log, name)
        for photo in DETECTOR_PHOTOS:
            rgb = rgbs[photo]
            image = torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0

            def eager(image=image, model=model):
                with torch.no_grad():
                    return model([image])

            calls = {"tvm": lambda rgb=rgb, a=artifact: a(rgb), "eager": eager}
            _log(f"{name} {photo}: ONNX Runtime and OpenVINO")
            ort = OnnxRuntimeDetector(model, image, threads)
            calls["onnxruntime"] = lambda ort=ort, image=image: ort(image)
            info = {}
            if args.openvino:
                converted, array = detector_model(model, image), image.numpy()
                f32 = OpenVINOModel(converted, threads, "f32")
                default = OpenVINOModel(converted, threads, None)
                calls["openvino_f32"] = lambda m=f32, a=array: m(a)
                calls["openvino_default"] = lambda m=default, a=array: m(a)
                if "mask" in name:
                    # OpenVINO's network alone: the 28x28 mask probabilities, no pasting
                    network = OpenVINOModel(detector_model(model, image, paste=False), threads, "f32")
                    calls["openvino_f32_network"] = lambda m=network, a=array: m(a)
                info["openvino_default_precision"] = default.precision
            _log(f"{name} {photo}: {args.repeat} rounds")
            rows[f"{name} {photo} {rgb.shape[0]}x{rgb.shape[1]}"] = {
                **info,
                "build": build,
                "seconds": interleaved_seconds(calls, args.repeat),
            }
    return rows


PEERS = ("eager", "onnxruntime", "openvino_f32", "openvino_f32_network", "openvino_default")
PRECISIONS = ("fp32", "bf16", "int8")
LABELS = {
    "eager": "eager",
    "onnxruntime": "ORT",
    "openvino_f32": "OV f32",
    "openvino_f32_network": "OV f32 unpasted",
    "openvino_default": "OV default",
}


def add_ratios(rows: dict) -> dict:
    """Each row's ``tvm_speedup`` (peer seconds / TVM seconds) and, over the rows, their geometric
    means (``{peer: mean}``)."""
    means = {}
    for peer in PEERS:
        ratios = []
        for row in rows.values():
            seconds = row["seconds"]
            if peer in seconds:
                row.setdefault("tvm_speedup", {})[peer] = seconds[peer] / seconds["tvm"]
                ratios.append(row["tvm_speedup"][peer])
        if ratios:
            means[peer] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return means


def table_rows(rows: dict, means: dict) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows: times (ms), then TVM's speed over each peer."""
    peers = [p for p in PEERS if any(p in r["seconds"] for r in rows.values())]
    head = ["model", "TVM ms", *[f"{LABELS[p]} ms" for p in peers], *[f"x vs {LABELS[p]}" for p in peers]]
    body = []
    for name, row in rows.items():
        s = row["seconds"]
        cells = [name, f"{s['tvm'] * 1e3:.2f}"]
        cells += [f"{s[p] * 1e3:.2f}" if p in s else "-" for p in peers]
        cells += [f"{row['tvm_speedup'][p]:.2f}" if p in s else "-" for p in peers]
        body.append(cells)
    body.append(["geometric mean", "", *["" for _ in peers], *[f"{means[p]:.2f}" for p in peers]])
    return head, body


def print_table(title: str, head, body) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, column in enumerate(head):
        table.add_column(column, justify="left" if i == 0 else "right")
    for cells in body:
        table.add_row(*cells)
    Console(width=200).print(table)


def markdown(head, body) -> str:
    """The table as Markdown (what docs/benchmarks.md holds)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def chart(result: dict, path: Path) -> None:
    """TVM's speed over each peer per model (log scale; above 1: TVM is faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {**result["classifiers"], **result.get("detectors", {})}
    peers = [p for p in PEERS if any(p in r.get("tvm_speedup", {}) for r in rows.values())]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows)), 4.5))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, [r["tvm_speedup"].get(peer, 0) for r in rows.values()], width, label=f"vs {peer}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    centers = [j + width * (len(peers) - 1) / 2 for j in range(len(rows))]
    ax.set_xticks(centers, list(rows), rotation=30, ha="right")
    ax.set_ylabel("TVM speed / peer speed")
    cpu = result["cpu"]
    ax.set_title(f"{cpu['model']} ({cpu['llvm_cpu']}), {result['threads']} threads, {result['date']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _parse(argv):
    from tvm_roialign.models.classifier_zoo import CLASSIFIERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CLASSIFIERS), help="comma-separated classifiers")
    parser.add_argument("--repeat", type=int, default=7, help="rounds (the median is reported)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: all usable cores)")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false", help="skip OpenVINO")
    parser.add_argument("--profile", action="store_true", help="also TVM's slowest kernels per model")
    parser.add_argument("--detectors", action="store_true", help="also the three detectors (minutes each)")
    parser.add_argument("--precisions", default="fp32",
                        help="TVM builds to time, comma-separated from fp32,bf16,int8 (fp32 always; "
                             "int8 adds ONNX Runtime's and OpenVINO's (NNCF) int8 quantizations of the "
                             "ONNX file)")
    parser.add_argument("--out-dir", default=str(RESULTS), help="where models.json and models.png go")
    args = parser.parse_args(argv)
    asked = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if any(p not in PRECISIONS for p in asked):
        parser.error(f"--precisions: expected a comma-separated list of {', '.join(PRECISIONS)}, "
                     f"got {args.precisions!r}")
    args.precisions = [p for p in PRECISIONS if p == "fp32" or p in asked]
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in CLASSIFIERS]
    if unknown or args.repeat < 1:
        parser.error(f"--models: unknown {unknown}; known: {', '.join(CLASSIFIERS)}" if unknown
                     else "--repeat must be at least 1")
    return args


def _warm_models(args) -> tuple[dict, dict]:
    """Every model built and run once by eager, before any other runtime starts."""
    import torch

    from tvm_roialign.models import detection as det
    from tvm_roialign.models.classifier_zoo import build_classifier, example_input

    classifiers, detectors = {}, {}
    x = example_input()
    with torch.no_grad():
        for name in args.models:
            _log(f"{name}: build, calibrate the batch norms, warm up eager")
            classifiers[name] = build_classifier(name)
            classifiers[name](x)
        if args.detectors:
            image = torch.from_numpy(det.sample_photo("astronaut")).permute(2, 0, 1).float() / 255.0
            for name in DETECTORS:
                _log(f"{name}: build, warm up eager")
                detectors[name] = det.build_torch_detector(name)
                detectors[name]([image])
    return classifiers, detectors


def main(argv=None) -> int:
    args = _parse(argv)
    from tvm_roialign.host import use_usable_cores

    threads = use_usable_cores(args.threads)  # before TVM's thread pool starts
    import torch

    from tvm_roialign.bench.report import cpu_identity
    from tvm_roialign.models.classifier_zoo import example_input

    torch.set_num_threads(threads)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "benchmarks/bench_models.py", *(argv or sys.argv[1:])]),
        "cpu": cpu_identity(),
        "threads": threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "repeat": args.repeat,
        "versions": {"torch": torch.__version__},
        "classifiers": {},
    }
    classifiers, detectors = _warm_models(args)
    _log("matrix peaks (torch.mm, torch._int_mm)")
    result["matrix_peaks"] = matrix_peaks(args.precisions)
    x = example_input()
    with tempfile.TemporaryDirectory(prefix="bench_models-") as workdir:
        for name, model in classifiers.items():
            result["classifiers"][name] = bench_classifier(name, model, x, args, threads, workdir)
        if detectors:
            result["detectors"] = bench_detectors(detectors, args, threads, workdir)
    _versions(result["versions"])
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report(result, out)
    return 0


def _versions(versions: dict) -> None:
    import importlib.metadata

    for package in ("apache-tvm", "onnxruntime", "openvino"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass


def report(result: dict, out: Path) -> None:
    """Ratios, JSON, PNG and the tables (printed, and as Markdown)."""
    cpu = result["cpu"]
    title = (f"{cpu['vendor']} {cpu['model']} (LLVM {cpu['llvm_cpu']}; {' '.join(cpu['isa'])}), "
             f"{result['threads']} threads, {result['date']}, median of {result['repeat']}")
    sections = [("classifiers", result["classifiers"])]
    if "detectors" in result:
        sections.append(("detectors", result["detectors"]))
    for key, rows in sections:
        result[f"{key}_geometric_mean"] = add_ratios(rows)
    (out / "models.json").write_text(json.dumps(result, indent=1, default=str))
    try:
        chart(result, out / "models.png")
    except ImportError:
        _log("matplotlib is not installed: no chart")
    for key, rows in sections:
        head, body = table_rows(rows, result[f"{key}_geometric_mean"])
        print_table(f"{key}: {title}", head, body)
        print(markdown(head, body))
    if "matrix_peaks" in result:
        head, body = precision_table(result["classifiers"], result["matrix_peaks"])
        print_table(f"precisions and the roofline: {title}", head, body)
        print(markdown(head, body))
    if any("tvm_int8" in row["seconds"] for row in result["classifiers"].values()):
        head, body = int8_table(result["classifiers"])
        print_table(f"int8: {title}", head, body)
        print(markdown(head, body))
    for name, row in result["classifiers"].items():
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in row["max_rel_diff_vs_eager"].items())
        precision = row.get("openvino_default_precision")
        extra = f"; OpenVINO default {precision}" if precision else ""
        print(f"{name}: max diff vs eager / output scale: {diffs}{extra}")
        for k in row.get("tvm_top_kernels", []):
            print(f"    {k['share'] * 100:5.1f}%  {k['ms']:8.2f} ms  x{k['calls']:<3d} {k['kernel']}")
    print(f"results: {out / 'models.json'}, {out / 'models.png'}")


if __name__ == "__main__":
    sys.exit(main())
