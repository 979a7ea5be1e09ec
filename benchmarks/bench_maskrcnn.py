"""Mask R-CNN (and ResNet-18) on the CPU: TVM vs PyTorch eager vs ONNX Runtime, in one run.

    python benchmarks/bench_maskrcnn.py [--repeat 5] [--threads N] [--image PATH]
                                        [--no-ort] [--no-resnet18]

Same photo, same weights (torchvision ``maskrcnn_resnet50_fpn``, ``weights=None``, seed 3, 512x512),
same number of threads for all three. Per piece (backbone + FPN + RPN head, box branch, mask
branch, PyTorch glue) and end to end, the median of ``--repeat`` runs, the three runtimes
interleaved run by run so that a slow minute slows all of them. TVM is the project's default build
(``tvm_roialign.pipeline``, the host CPU as target, no tuning records). ONNX Runtime runs the
whole model (``torch.onnx.export(..., dynamo=False, opset_version=17)``), so its per-piece
cells are ``-``. The TVM detections are checked against eager's (same labels, boxes within 1e-2
px, >= 99.9% mask pixels), ORT's boxes too.

ResNet-18 row: torchvision ``resnet18`` (random weights, ``[1, 3, 224, 224]``) saved with
``torch.export`` and compiled by ``tvm-roialign compile model.pt2 -o model.so`` with no flag (the
target and layout the CLI defaults to are recorded), against eager and ORT.

Writes ``benchmarks/results/maskrcnn.json`` and ``maskrcnn.png`` (bar chart) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def _median(values):
    return statistics.median(values) if values else None


def _host_target(threads: int):
    import tvm

    cpu = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": threads})


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# --------------------------------------------------------------------------------------------------
# ONNX Runtime


def _export_onnx(model, args, path: str) -> float:
    import torch

    from tvm_roialign.bench.onnxruntime_peer import OPSET

    t0 = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(model, args, path, dynamo=False, opset_version=OPSET)
    return time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------
# Mask R-CNN


def bench_maskrcnn(args, threads: int, target) -> dict:
    import torch

    from tvm_roialign.bench import OnnxRuntimeDetector
    from tvm_roialign.models import maskrcnn as mr

    model = mr.build_torch_model(mr.MaskRCNNConfig())
    image = mr.load_image(args.image)
    shape = mr.TVMMaskRCNN(model, target).padded_shape(image)
    # "tvm": built for this photo's size (like the tuned build); "tvm_any": the one build that
    # serves every photo size (TVMMaskRCNN's default)
    builds = {
        "tvm": mr.TVMMaskRCNN(model, target, "NHWC", shapes="static"),
        "tvm_any": mr.TVMMaskRCNN(model, target, "NHWC", shapes="any"),
    }
    if args.tuning_records:
        builds["tvm_tuned"] = mr.TVMMaskRCNN(model, target, "NHWC", tuning_records=args.tuning_records)
    compile_s = {}
    for name, detector in builds.items():
        seconds, pieces = _timed(lambda d=detector: d.compile(shape))
        compile_s[name] = {
            "wall_s": seconds,
            "pieces": {k: p.compile_s for k, p in pieces.items()},
            "import": {k: p.import_s for k, p in pieces.items()},
        }

    ort = None
    if not args.no_ort:
        ort = OnnxRuntimeDetector(model, image, threads)
        compile_s["ort_export_s"], compile_s["ort_session_s"] = ort.export_s, ort.session_s

    # warm up, then interleave end-to-end runs
    runs = {"eager": lambda: model([image])[0]}
    for name, detector in builds.items():
        runs[name] = lambda d=detector: d.run(image)
    if ort is not None:
        runs["ort"] = lambda: ort(image)
    outs = {}
    e2e = {name: [] for name in runs}
    glue = {name: [] for name in builds}  # each TVM run says how long its PyTorch glue took
    with torch.no_grad():
        for name, fn in runs.items():
            outs[name] = fn()
        for _ in range(args.repeat):
            for name, fn in runs.items():
                seconds, outs[name] = _timed(fn)
                e2e[name].append(seconds)
                if name in glue:
                    glue[name].append(outs[name].glue_s)

    base = outs["tvm"]
    pieces = _pieces(mr, model, image, builds, base, args.repeat)
    pieces["glue (PyTorch)"] = {name: _median(v) for name, v in glue.items()}
    comparison = {}
    for name in builds:  # with ``passed``: the package's one criterion
        comparison[name] = mr.compare_detections(outs[name].detections, outs["eager"])
    if ort is not None:
        from tvm_roialign.bench.onnxruntime_peer import max_box_diff

        comparison["ort"] = {
            "num_detections": int(np.asarray(outs["ort"][0]).shape[0]),
            "max_box_diff": max_box_diff(outs["ort"], outs["eager"]),
        }
    return {
        "end_to_end_s": {k: _median(v) for k, v in e2e.items()},
        "end_to_end_runs_s": e2e,
        "pieces_s": pieces,
        "compile_s": compile_s,
        "comparison": comparison,
        "num_proposals": int(base.proposals.shape[0]),
        "num_detections": int(base.detections["boxes"].shape[0]),
    }


def _pieces(mr, model, image, builds, base, repeat: int) -> dict:
    """Median seconds per piece: TVM builds and PyTorch eager on the same inputs, interleaved.
    ``base`` is a :class:`~tvm_roialign.models.maskrcnn.DetectionRun` of the default build (its
    features, proposals and detection boxes are the inputs)."""
    import torch

    detector = builds["tvm"]
    key = detector.padded_shape(image)
    max_proposals, max_detections = detector.roi_bounds()
    eager = mr.piece_modules(model, "NCHW", key[-2:], rewrite=False)
    with torch.no_grad():
        images = model.transform([image])[0].tensors
        feats = eager[0](images)[:4]
    rois, boxes, feats_io = base.proposals, base.detection_boxes, base.features
    calls = {
        "backbone": (lambda p: p(images.numpy()), lambda: eager[0](images)),
        "box_branch": (
            lambda p: p(*feats_io, mr.static_rois(rois, max_proposals)),
            lambda: eager[1](*feats, torch.from_numpy(rois)),
        ),
        "mask_branch": (
            lambda p: p(*feats_io, mr.static_rois(boxes, max_detections)),
            lambda: eager[2](*feats, torch.from_numpy(boxes)),
        ),
    }
    times = {name: {b: [] for b in [*builds, "eager"]} for name in calls}
    with torch.no_grad():
        for _ in range(repeat):
            for name, (tvm_call, eager_call) in calls.items():
                for build, det in builds.items():
                    piece = det.compile(key)[name]
                    times[name][build].append(_timed(lambda c=tvm_call, p=piece: c(p))[0])
                times[name]["eager"].append(_timed(eager_call)[0])
    return {name: {b: _median(v) for b, v in t.items()} for name, t in times.items()}


# --------------------------------------------------------------------------------------------------
# ResNet-18 through the CLI's default path


def bench_resnet18(args, threads: int, workdir: str) -> dict:
    import torch
    import torchvision
    import tvm

    from tvm_roialign import cli
    from tvm_roialign.bench.onnxruntime_peer import cpu_session
    from tvm_roialign.runtime import LoadedVM

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    pt2 = os.path.join(workdir, "resnet18.pt2")
    lib = os.path.join(workdir, "resnet18.so")
    with torch.no_grad():
        torch.export.save(torch.export.export(model, (x,)), pt2)
    compile_s, code = _timed(lambda: cli.main(["--quiet", "compile", pt2, "-o", lib]))
    if code:
        raise RuntimeError(f"tvm-roialign compile failed with exit code {code}")
    meta = json.loads(Path(lib + ".json").read_text())
    vm = LoadedVM(tvm.runtime.load_module(lib), tvm.cpu())
    data = tvm.runtime.tensor(x.numpy())
    runs = {"tvm": lambda: vm["main"](data), "eager": lambda: model(x)}
    session = None
    if not args.no_ort:
        onnx_path = os.path.join(workdir, "resnet18.onnx")
        _export_onnx(model, (x,), onnx_path)
        session = cpu_session(onnx_path, threads)
        feed = {session.get_inputs()[0].name: x.numpy()}
        runs["ort"] = lambda: session.run(None, feed)
    # rounds of blocks: `number` calls of one runtime, then of the next. A runtime's worker threads
    # spin for a while after a call (OpenMP, ONNX Runtime's intra-op pool), which would slow the
    # next runtime's first call; a block pays that once, and a 20-ms model is not measured
    # against its neighbour's spinning threads.
    number = 10
    times = {name: [] for name in runs}
    with torch.no_grad():
        ours = vm["main"](data)
        ours = (ours[0] if not hasattr(ours, "numpy") else ours).numpy()
        expected = model(x).numpy()
        for fn in runs.values():
            fn()
        for _ in range(max(args.repeat, 5)):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                times[name].append((time.perf_counter() - t0) / number)
    return {
        "cli": "tvm-roialign compile resnet18.pt2 -o resnet18.so (no flags)",
        "cli_target": meta.get("target"),
        "cli_layout": meta.get("layout"),
        "compile_s": compile_s,
        "max_rel_diff_vs_eager": float(
            np.abs(ours - expected).max() / np.abs(expected).max()
        ),
        "run_s": {k: _median(v) for k, v in times.items()},
    }


# --------------------------------------------------------------------------------------------------
# report


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def _ms(value):
    return f"{value * 1e3:8.1f}" if value is not None else "       -"


def table(result: dict) -> str:
    m = result["maskrcnn"]
    builds = [k for k in ("tvm", "tvm_tuned") if k in m["end_to_end_s"]]
    has_ort = "ort" in m["end_to_end_s"]
    head = ["", *[f"{b} ms" for b in builds], "eager ms"]
    head += ["ORT ms"] if has_ort else []
    head += [f"eager/{b}" for b in builds] + (
        [f"ORT/{b}" for b in builds] if has_ort else []
    )
    rows = []
    for piece, cells in m["pieces_s"].items():
        row = [piece, *[_ms(cells.get(b)) for b in builds], _ms(cells.get("eager"))]
        row += [_ms(None)] if has_ort else []
        row += [_ratio(cells.get("eager"), cells.get(b)) for b in builds]
        row += ["-" for _ in builds] if has_ort else []
        rows.append(row)
    e2e = m["end_to_end_s"]
    row = ["end to end", *[_ms(e2e[b]) for b in builds], _ms(e2e["eager"])]
    row += [_ms(e2e["ort"])] if has_ort else []
    row += [_ratio(e2e["eager"], e2e[b]) for b in builds]
    row += [_ratio(e2e["ort"], e2e[b]) for b in builds] if has_ort else []
    rows.append(row)
    if "resnet18" in result:
        r = result["resnet18"]["run_s"]
        row = [
            "resnet18 (CLI)",
            _ms(r["tvm"]),
            *(["       -"] if "tvm_tuned" in builds else []),
        ]
        row += [_ms(r["eager"])] + ([_ms(r.get("ort"))] if has_ort else [])
        row += [_ratio(r["eager"], r["tvm"])] + (["-"] if "tvm_tuned" in builds else [])
        row += [_ratio(r.get("ort"), r["tvm"])] if has_ort else []
        row += ["-"] * (len(head) - len(row))
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in [head, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = result["maskrcnn"]
    groups = [*m["pieces_s"], "end to end"]
    series = [b for b in ("tvm", "tvm_tuned", "eager", "ort") if b in m["end_to_end_s"]]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        values = [m["pieces_s"][g].get(name) for g in groups[:-1]] + [
            m["end_to_end_s"][name]
        ]
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [(v or 0) * 1e3 for v in values], width, label=name)
    ax.set_xticks(
        [j + width * (len(series) - 1) / 2 for j in range(len(groups))], groups
    )
    ax.set_ylabel("ms (median)")
    ax.set_title(f"Mask R-CNN 512x512, {result['threads']} threads, {result['cpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=5, help="runs per measurement (median)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="threads (default: all cores)"
    )
    parser.add_argument(
        "--image", default=None, help="photo (default: scikit-image astronaut)"
    )
    parser.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    parser.add_argument(
        "--tuning-records",
        default=None,
        metavar="DIR",
        help="also time a build with these MetaSchedule records (tvm-roialign tune maskrcnn)",
    )
    parser.add_argument(
        "--no-resnet18", action="store_true", help="skip the ResNet-18 row"
    )
    parser.add_argument(
        "--no-maskrcnn", action="store_true", help="only the ResNet-18 row (quick)"
    )
    parser.add_argument(
        "--out-dir", default=str(RESULTS), help="where the JSON and PNG go"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    from tvm_roialign.host import use_usable_cores

    threads = use_usable_cores(args.threads)  # before TVM's thread pool starts
    import torch
    import tvm

    torch.set_num_threads(threads)
    target = _host_target(threads)
    result = {
        "threads": threads,
        "cpu": tvm.target.codegen.llvm_get_system_cpu(),
        "target": str(target),
        "repeat": args.repeat,
    }
    with tempfile.TemporaryDirectory() as workdir:
        if not args.no_maskrcnn:
            result["maskrcnn"] = bench_maskrcnn(args, threads, target)
        if not args.no_resnet18:
            result["resnet18"] = bench_resnet18(args, threads, workdir)
    if args.no_maskrcnn:
        r = result.get("resnet18", {}).get("run_s", {})
        print("resnet18 (CLI, no flags): " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in r.items()))
        return 0
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "maskrcnn.json").write_text(json.dumps(result, indent=1, default=str))
    try:
        chart(result, out / "maskrcnn.png")
    except ImportError:
        print("matplotlib is not installed: no chart", file=sys.stderr)
    print(table(result))
    for name, cmp in result["maskrcnn"]["comparison"].items():
        print(f"{name} vs eager: {json.dumps(cmp)}")
    if "resnet18" in result:
        r = result["resnet18"]
        print(
            f"resnet18 via the CLI: target {r['cli_target']}, layout {r['cli_layout']}, "
            f"max rel diff vs eager {r['max_rel_diff_vs_eager']:.1e}"
        )
    print(f"results: {out / 'maskrcnn.json'}, {out / 'maskrcnn.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
