"""``maskrcnn --precision int8``: the main job with an int8 detector.

int8 is calibrated: the activations' ranges are taken by running the detector on photos, which
the three-piece route (PyTorch glue between the graphs) does not do. So an int8 ``maskrcnn``
builds the whole Mask R-CNN as one calibrated artifact
(:func:`tvm_roialign.models.detection.compile_detector`, any size, ``--calibrate DIR`` or the
sample photos), runs it on the photo next to PyTorch eager (fp32), and judges it by the int8
bound (:data:`tvm_roialign.models.compare_bf16.INT8_CRITERIA`: >= 95% of each side's confident
detections matched by label at box IoU >= 0.9; not equality, which int8 does not keep). It writes
the annotated picture of the int8 detections and a JSON report.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from ._common import CLIError

#: what the report says about each of its keys
SCHEMA = {
    "precision": "int8",
    "int8_kernels": "the int8 instructions the artifact's kernels run (avx512vnni, amx, avx2, ...)",
    "mode": "the build mode of the artifact's fp32 convolutions (fast: Winograd; exact: direct)",
    "fp32_layers": "the layers kept in fp32",
    "calibration": "the photos int8 was calibrated on",
    "weights": "the model's weights",
    "image": "the photo",
    "compile_s": "seconds to import and compile the artifact (with calibration)",
    "tvm_s": "the artifact's best run on the photo (transform, network, mask paste), seconds",
    "torch_s": "PyTorch eager fp32's best run on the photo, seconds",
    "comparison": "the int8 detections against PyTorch eager's by the int8 criterion",
}


def check_int8_arguments(args) -> None:
    """One-line errors for what an int8 ``maskrcnn`` does not take."""
    if args.tuning_records is not None:
        raise CLIError("--tuning-records: an int8 maskrcnn builds its own int8 kernels; leave it out")
    if args.shapes == "static":
        raise CLIError("--shapes static: an int8 maskrcnn is one artifact for any size "
                       "(calibrated through it)")
    if args.calibrate is not None and not Path(args.calibrate).is_dir():
        raise CLIError(f"--calibrate: {args.calibrate!r} is not a directory of photos")


def _best(fn, repeat: int):
    out, best = None, float("inf")
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def run_int8(args, target, image, config, model, progress) -> dict:
    """Compile, run and compare; the report (see :data:`SCHEMA`)."""
    import numpy as np

    from ..models import detection as det
    from ..models.compare_bf16 import compare_bf16
    from ..models.detector_reference import torch_detections
    from ..runtime import Detector
    from ._detector import build_fast

    rgb = np.ascontiguousarray((image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    t0 = time.perf_counter()
    artifact = det.compile_detector(
        model, None, target, fast=build_fast(args), precision=args.resolved_precision,
        fp32_layers=args.fp32_layers,
        calibration=args.calibrate, progress=progress, name="maskrcnn_resnet50_fpn",
    )
    compile_s = time.perf_counter() - t0
    if artifact.meta.get("precision") != "int8":
        raise CLIError(f"--precision int8: {artifact.meta.get('precision')} was built (no int8 kernels)")
    with tempfile.TemporaryDirectory() as tmp:
        detector = Detector(artifact.export(Path(tmp) / "maskrcnn_int8.so"))
        progress("run the int8 artifact and PyTorch eager")
        ours, tvm_s = _best(lambda: detector(rgb), args.repeat)
    ref, torch_s = _best(lambda: torch_detections(model, rgb), args.repeat)
    meta = artifact.meta
    return {
        "precision": "int8", "int8_kernels": meta.get("int8_kernels"), "mode": meta.get("mode"),
        "fp32_layers": meta.get("fp32_layers"), "calibration": args.calibrate or "the sample photos",
        "weights": config.describe_weights(), "image": args.image or "skimage.data.astronaut()",
        "compile_s": compile_s, "tvm_s": tvm_s, "torch_s": torch_s,
        "comparison": compare_bf16(ours, ref, precision="int8"), "detections": ours,
    }


def caption(report: dict) -> str:
    cmp = report["comparison"]
    verdict = "PASS" if cmp["passed"] else "FAIL"
    return (
        f"TVM int8 ({report['int8_kernels']}, {report['mode']}); {report['weights']}; {verdict} "
        f"against PyTorch eager fp32 ({cmp['matched_torch']}/{cmp['confident_torch']} confident matched)"
    )


def write_outputs(report: dict, image, out, report_path, top: int) -> None:
    """The picture of the int8 detections and the JSON report (without the detections)."""
    import torch

    from ..models import maskrcnn as mr

    found = report.pop("detections")
    tensors = {k: torch.from_numpy(found[k]) for k in ("boxes", "labels", "scores")}
    tensors["masks"] = torch.from_numpy(found["masks"])[:, None]
    mr.draw_detections(image, tensors, out, top=top, caption=caption(report))
    Path(report_path).write_text(json.dumps({**report, "schema": SCHEMA}, indent=2, default=float))


def print_int8_summary(report: dict, out, report_path) -> None:
    cmp = report["comparison"]
    speed = report["torch_s"] / report["tvm_s"] if report["tvm_s"] else float("nan")
    print(
        f"Mask R-CNN int8 artifact ({report['int8_kernels']} kernels, {report['mode']} fp32 convs, "
        f"{', '.join(report['fp32_layers'] or []) or 'no layer'} in fp32): compiled in "
        f"{report['compile_s']:.1f} s; {report['tvm_s']:.3f} s, PyTorch eager fp32 {report['torch_s']:.3f} s "
        f"({speed:.2f}x)"
    )
    print(
        f"detections: TVM int8 {cmp['num_detections_tvm']}, PyTorch {cmp['num_detections_torch']}; "
        f"scored >= {cmp['score_threshold']:g} and matched at box IoU >= {cmp['box_iou']:g}: PyTorch "
        f"{cmp['matched_torch']}/{cmp['confident_torch']}, TVM {cmp['matched_tvm']}/{cmp['confident_tvm']}"
        + (f"; mask IoU mean {cmp['mean_mask_iou']:.3f}" if cmp["mean_mask_iou"] is not None else "")
        + (f", largest score difference {cmp['max_score_diff']:.4f}"
           if cmp["max_score_diff"] is not None else "")
        + f" -> {'PASS' if cmp['passed'] else 'FAIL'} ({cmp['criteria']})"
    )
    if not cmp["passed"] and report["weights"].startswith("random"):
        print("note: with random weights (the default) a detector's scores are clusters of near-equal "
              "values that int8's rounding reorders, so few boxes match; the int8 criterion is meant for "
              "a trained detector (--weights; measured on one: docs/int8.md, 96.9% of its confident "
              "boxes kept)")
    print(f"wrote {out} and {report_path}")


__all__ = ["SCHEMA", "check_int8_arguments", "print_int8_summary", "run_int8", "write_outputs"]
