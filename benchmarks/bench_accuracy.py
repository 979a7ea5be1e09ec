"""Accuracy of every build mode on a trained detector: the reference Mask R-CNN or Keypoint R-CNN
(tvm_roialign.datasets.reference, trained by tools/train_reference.py) on the synthetic dataset's
held-out split, each build's box and mask mAP (Keypoint R-CNN: box mAP and keypoint AP) by
pycocotools, and the share of fp32's confident detections (PyTorch eager's, score >= 0.5) that the
build keeps with the same label at box IoU >= 0.9.

Rows: PyTorch eager fp32; our artifacts (``compile_detector``, any size, this machine's CPU):
exact (``fast=False``), fast (Winograd, the default), bf16 (fast; on AVX512-BF16 without AMX
``compile_detector`` builds fp32, so it is built here with the AVX512-BF16 kernels that
``pipeline.build`` makes when asked), int8 (fast; calibrated on ``--calibration`` train-split
photos); ONNX Runtime's QDQ int8 (``quantize_static`` of the exported model) and OpenVINO's
NNCF int8 (``nncf.quantize`` of the converted model), on the same photos.
Each row is judged by its bound (``tvm_roialign.datasets.evaluation.PRECISION_BOUNDS``):
fast against exact, bf16 and int8 against eager fp32.

    nice -n 5 python benchmarks/bench_accuracy.py [--model maskrcnn|keypointrcnn] [--images 100]
        [--calibration 16] [--rows eager,exact,fast,bf16,int8,ort-int8] [--keep DIR] [--out results.json]

Compiling takes minutes per build; ``--keep DIR`` keeps the artifacts (named by the weights' hash)
and reuses them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from _common import write_report

from tvm_roialign.datasets import reference, synthetic
from tvm_roialign.datasets.evaluation import (
    PRECISION_BOUNDS,
    coco_scores,
    confident_matches,
    judge,
    score_separation,
)
from tvm_roialign.models import detection as det
from tvm_roialign.models.detector_reference import torch_detections
from tvm_roialign.runtime import Detector

ROWS = ("eager", "exact", "fast", "bf16", "int8", "ort-int8", "nncf-int8")
#: our builds: row -> (fast, precision)
BUILDS = {"exact": (False, "fp32"), "fast": (True, "fp32"), "bf16": (True, "bf16"), "int8": (True, "int8")}
#: the row each row's bound is taken against
AGAINST = {"fast": "exact", "bf16": "eager", "int8": "eager", "ort-int8": "eager", "nncf-int8": "eager"}


def plan(precision: str):
    """The build's precision plan: bf16 on AVX512-BF16 without AMX built as ``pipeline.build``
    builds it when asked (``compile_detector`` and the CLI build fp32 there, its kernels running
    slower than fp32: docs/precision.md), so that the row measures those kernels."""
    from tvm_roialign.precision import resolve
    from tvm_roialign.target import parse_target

    return resolve(parse_target("native"), precision, avx512_bf16=True)


def build(row: str, model, calibration, keep: Path, key: str) -> Detector:
    fast, precision = BUILDS[row]
    path = keep / f"{key}-{row}.so"
    if not path.exists():
        print(f"compile {row}", file=sys.stderr, flush=True)
        artifact = det.compile_detector(
            model, None, "native", fast=fast, precision=plan(precision),
            calibration=calibration if precision == "int8" else None,
        )
        artifact.export(path)
    detector = Detector(path)
    got = detector.meta.get("precision", "fp32")
    if got != precision:
        raise SystemExit(f"{path}: built {got}, not {precision}")
    return detector


def ort_int8_runner(model, photos, calibration, workdir: Path):
    """ONNX Runtime's QDQ int8 of the whole model exported for the photos' size, calibrated on the
    same photos as ours; a function of a photo giving its detections."""
    from tvm_roialign.bench.onnxruntime_peer import OPSET, cpu_session, quantized_int8

    tensor = lambda rgb: torch.from_numpy(rgb).permute(2, 0, 1).float().div(255.0).contiguous()
    path = str(workdir / "detector.onnx")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, ([tensor(photos[0])],), path, dynamo=False, opset_version=OPSET)
    name = cpu_session(path, torch.get_num_threads()).get_inputs()[0].name
    here = os.getcwd()
    os.chdir(workdir)  # the quantizer writes its temporary files into the working directory
    try:
        # the convolutions and matmuls, as ours and NNCF's (ONNX Runtime's default also calibrates
        # every tensor of the detector's graph: NMS, RoIAlign and box decoding included)
        out = quantized_int8(path, str(workdir / "detector_int8.onnx"),
                             {name: [tensor(p).numpy() for p in calibration]},
                             op_types=["Conv", "ConvTranspose", "MatMul", "Gemm"])
    finally:
        os.chdir(here)
    session = cpu_session(out, torch.get_num_threads())

    def run(rgb):
        return _named(session.run(None, {name: tensor(rgb).numpy()}))

    return run


def _named(outputs) -> dict:
    """A peer's outputs (boxes, labels, scores, then masks ``[n, 1, h, w]`` or keypoints and
    their scores) as :func:`torch_detections` names them."""
    boxes, labels, scores, *rest = (np.asarray(v) for v in outputs)
    out = {"boxes": boxes, "labels": labels, "scores": scores}
    if len(rest) == 1:
        out["masks"] = rest[0][:, 0]
    elif len(rest) == 2:
        out["keypoints"], out["keypoints_scores"] = rest
    return out


def nncf_int8_runner(model, photos, calibration, workdir: Path):
    """OpenVINO's int8 as its user makes it (tvm_roialign.bench.openvino_peer.detector_int8: the
    model converted for the photos' size without the mask paste, saved as IR and read back,
    ``nncf.quantize`` with the post-processing in its ``ignored_scope``) on the same photos, run in
    OpenVINO's CPU plugin in f32 otherwise; the masks pasted by the package's NumPy paste."""
    import openvino as ov

    from tvm_roialign.bench.openvino_peer import cpu_config, detector_int8
    from tvm_roialign.runtime.masks import paste_masks

    tensor = lambda rgb: torch.from_numpy(rgb).permute(2, 0, 1).float().div(255.0).contiguous()
    arrays = [tensor(p).numpy() for p in calibration]
    quantized = detector_int8(model, tensor(photos[0]), arrays, str(workdir))
    compiled = ov.Core().compile_model(quantized, "CPU", cpu_config(torch.get_num_threads(), "f32"))
    request = compiled.create_infer_request()

    def run(rgb):
        out = _named(request.infer([tensor(rgb).numpy()]).values())
        if "masks" in out:  # the 28x28 probabilities, pasted as ours are
            out["masks"] = paste_masks(out["masks"], out["boxes"], *rgb.shape[:2])
        return out

    return run


#: the peers' rows: name -> the function making a runner of a photo
PEERS = {"ort-int8": ort_int8_runner, "nncf-int8": nncf_int8_runner}


def detections(args, model, photos, calibration, key: str):
    """``(row, detections on the photos, metadata of our build or None)`` of each row in turn
    (our artifacts kept under ``key``, the weights' hash)."""
    keep = Path(args.keep or tempfile.mkdtemp(prefix="bench_accuracy_"))
    keep.mkdir(parents=True, exist_ok=True)
    for row in args.rows:
        meta = None
        if row == "eager":
            found = [torch_detections(model, p) for p in photos]
        elif row in BUILDS:
            detector = build(row, model, calibration, keep, key)
            meta = {k: detector.meta.get(k) for k in ("mode", "precision", "int8_kernels", "bf16_kernels")}
            found = [detector(p) for p in photos]
        else:
            run = PEERS[row](model, photos, calibration, keep)
            found = [run(p) for p in photos]
        print(f"ran {row}", file=sys.stderr, flush=True)
        yield row, found, meta


def table(dets: dict, data, keypoints: bool) -> dict:
    rows = {}
    for row, found in dets.items():
        rows[row] = coco_scores(found, data, "val", keypoints=keypoints)
        if row != "eager" and "eager" in dets:
            rows[row]["matched"] = confident_matches(dets["eager"], found)
    for row, against in AGAINST.items():
        if row in rows and against in rows:
            rows[row]["bound"] = judge(row, rows[row], rows[against])
    if "int8" in rows and "nncf-int8" in rows:  # issue 44: no worse than OpenVINO's NNCF int8
        rows["int8"]["vs_nncf"] = {k: 100 * (rows["int8"][k] - rows["nncf-int8"][k])
                                   for k in ("box_map", "mask_map", "keypoint_ap") if k in rows["int8"]}
    return rows


def _drops(row: str, bound: dict) -> str:
    if "box_drop" not in bound:
        return "-"
    second = "keypoint_drop" if "keypoint_drop" in bound else "mask_drop"
    return f"{bound['box_drop']:+.2f}, {bound.get(second, 0):+.2f} ({AGAINST[row]})"


def print_report(report) -> None:
    print(f"{report['cpu']}, {report['date']}; {report['images']} held-out images "
          f"({report['size']} px), calibration {report['calibration']} train photos; "
          f"weights {report['weights']}")
    for row, m in report.get("builds", {}).items():
        print(f"  {row}: {m}")
    sep = report["separation"]
    print(f"eager fp32 scores: {sep['confident']} confident (>= 0.5, median {sep['confident_median']:.3f}), "
          f"{sep['others']} others (median {sep['others_median']:.3f}), {sep['near']} within 0.1 of 0.5")
    keypoints = report.get("model") == "keypointrcnn"
    label, second, second50 = ("keypoint", "keypoint_ap", "keypoint_ap50") if keypoints else (
        "mask", "mask_map", "mask_ap50")
    head = ("build", "box mAP", "keypoint AP" if keypoints else "mask mAP", "box AP50",
            f"{label} AP50", "fp32 conf. matched", f"drop (box, {label}) vs", "bound", "holds")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row, r in report["rows"].items():
        matched = r.get("matched")
        share = (f"{matched['ref_matched']}/{matched['ref_confident']} ({100 * matched['ref_share']:.1f}%)"
                 if matched else "-")
        bound = r.get("bound", {})
        print(f"| {row} | {100 * r['box_map']:.2f} | {100 * r.get(second, 0):.2f} | "
              f"{100 * r['box_ap50']:.2f} | {100 * r.get(second50, 0):.2f} | {share} | "
              f"{_drops(row, bound)} | {bound.get('text', '-')} | "
              f"{'yes' if bound.get('holds') else ('no' if bound else '-')} |")
    vs = report["rows"].get("int8", {}).get("vs_nncf")
    if vs:
        parts = ", ".join(f"{k} {v:+.2f}" for k, v in vs.items())
        verdict = "no worse" if all(v >= 0 for v in vs.values()) else "worse"
        print(f"int8 against OpenVINO's NNCF int8 (points): {parts}: {verdict}")


def merged(paths) -> dict:
    """The reports at ``paths`` as one: their rows together (each row's figures are against the
    eager rows, which are the same where the weights and images are), the bounds judged again."""
    reports = [json.loads(Path(path).read_text()) for path in paths]
    first = reports[0]
    for other in reports[1:]:
        for key in ("weights", "images", "size", "calibration"):
            if other[key] != first[key]:
                raise SystemExit(f"--merge: the reports differ in {key}: {first[key]} and {other[key]}")
    out = {**first, "rows": {}, "builds": {}}
    for report in reports:
        out["rows"].update(report["rows"])
        out["builds"].update(report["builds"])
    for row, against in AGAINST.items():
        if row in out["rows"] and against in out["rows"]:
            out["rows"][row]["bound"] = judge(row, out["rows"][row], out["rows"][against])
    return out


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=tuple(reference.MODELS), default="maskrcnn")
    p.add_argument("--images", type=int, default=100, help="held-out images")
    p.add_argument("--calibration", type=int, default=16, help="train-split photos int8 is calibrated on")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    p.add_argument("--keep", default=None, help="a folder the artifacts are kept in and reused from")
    p.add_argument("--iterations", type=int, default=None,
                   help="the reference trained for this many iterations (tools/train_reference.py; "
                   "default: its default schedule)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="default: benchmarks/results/bench_accuracy_MODEL.json")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="print one table of the rows of several reports of the same weights and images "
                   "(runs of other --rows, e.g. in parallel), written to --out")
    args = p.parse_args(argv)
    args.out = args.out or f"benchmarks/results/bench_accuracy_{args.model}.json"
    if args.merge:
        write_report(merged(args.merge), args.out, print_report)
        return 0
    args.rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(args.rows) - set(ROWS))
    if unknown:
        p.error(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    torch.set_num_threads(args.threads)
    config = reference.TrainConfig.defaults(args.model)
    if args.iterations is not None:
        config = dataclasses.replace(config, iterations=args.iterations)
    model = reference.load_reference(config)
    data = config.data
    photos = [synthetic.sample(data, "val", i)[0] for i in range(args.images)]
    calibration = [synthetic.sample(data, "train", i)[0] for i in range(args.calibration)]
    dets, meta = {}, {}
    for row, found, built in detections(args, model, photos, calibration, f"{args.model}-{config.key()}"):
        dets[row] = found
        if built:
            meta[row] = built
        # the report so far after each row: a long run stopped early keeps what it measured
        report = {
            "model": args.model, "cpu": cpu_name(), "date": datetime.date.today().isoformat(),
            "images": args.images, "size": data.size, "calibration": args.calibration,
            "weights": str(reference.weights_path(config)), "builds": meta, "bounds": PRECISION_BOUNDS,
            "separation": score_separation(dets["eager"]) if "eager" in dets else {},
            "rows": table(dets, data, keypoints=args.model == "keypointrcnn"),
        }
        write_report(report, args.out, print_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
