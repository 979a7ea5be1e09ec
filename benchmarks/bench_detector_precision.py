"""A detector's any-size artifact in bf16 or int8 against fp32 and OpenVINO (default precision and
f32): time on photos of three sizes, and the bf16 / int8 build's detections against the fp32 build's.

One process; on each photo the runners take turns, round after round (median of ``--rounds``).
Accuracy (:func:`tvm_roialign.models.compare.match_confident`): the fp32 artifact's detections of
score >= 0.5 matched by a same-label bf16 detection at box IoU >= 0.9, both ways, with the mask IoU
and score difference of the pairs; also at ``--low-score`` (random weights may give few
confident detections) and at IoU >= 0.5 (random weights give clusters of near-equal boxes and
scores, which a small perturbation reshuffles).

    python benchmarks/bench_detector_precision.py [--precision bf16|int8] [--fp32 fp32.so]
        [--bf16 bf16.so | --int8 int8.so] [--rounds 5] [--photos astronaut,coffee,portrait]
        [--generic-int8] [--out benchmarks/results/bench_detector_precision.json]

Without ``--fp32``/``--bf16``/``--int8`` the artifacts are compiled first (each takes minutes).
``--generic-int8``: the int8 artifact compiled under :func:`tvm_roialign.testing.generic_int8` where
this CPU has no int8 kernels (its int8 contractions on TVM's generic schedules: the kernels'
results, so the accuracy holds; its time is not the kernels').
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import interleaved_seconds, write_report

from tvm_roialign.host import use_usable_cores
from tvm_roialign.models import detection as det
from tvm_roialign.models.compare import match_confident, sum_matches
from tvm_roialign.models.compare_bf16 import BF16_BOX_IOU, BF16_CRITERIA, BF16_SCORE, bf16_passed
from tvm_roialign.runtime import Detector
from tvm_roialign.testing import generic_int8


def photos(names) -> dict:
    """The bundled photos by name; ``portrait``: coffee turned upright (600 x 400 -> 400 x 600)."""
    out = {}
    for name in names:
        if name == "portrait":
            out[name] = np.ascontiguousarray(np.rot90(det.sample_photo("coffee")))
        else:
            out[name] = det.sample_photo(name)
    return out


def openvino_runners(model, rgb) -> dict:
    """OpenVINO's default precision (bf16 on AMX) and f32, converted for this photo's size."""
    import openvino

    from tvm_roialign.bench.openvino_peer import detector_model

    image = torch.from_numpy(rgb).permute(2, 0, 1).float().div(255.0).contiguous()
    converted = detector_model(model.eval(), image)
    data = image.numpy()
    runners = {}
    for label, config in (("OpenVINO default", {}), ("OpenVINO f32", {"INFERENCE_PRECISION_HINT": "f32"})):
        compiled = openvino.compile_model(converted, "CPU", config)
        hint = compiled.get_property("INFERENCE_PRECISION_HINT")
        request = compiled.create_infer_request()
        runners[f"{label} ({getattr(hint, 'get_type_name', lambda h=hint: str(h))()})"] = (
            lambda r=request: r.infer([data])
        )
    return runners


def artifacts(args, model, workdir: Path) -> dict:
    """The fp32 and ``--precision`` any-size artifacts (given, or compiled here) as Detectors."""
    out = {}
    for precision in ("fp32", args.precision):
        path = getattr(args, precision)
        if path is None:
            print(f"compile the {precision} any-size artifact", file=sys.stderr, flush=True)
            generic = args.generic_int8 and precision == "int8"
            with generic_int8() if generic else contextlib.nullcontext():
                art = det.compile_detector(
                    model, None, args.target, precision=precision,
                    fp32_layers=args.fp32_layers if precision != "fp32" else None,
                )
            path = art.export(workdir / f"{precision}.so")
        out[precision] = Detector(path)
        meta = out[precision].meta
        if meta.get("precision", "fp32") != precision:
            raise SystemExit(f"--{precision} {path}: the artifact's precision is {meta.get('precision')}")
    return out


def print_report(report) -> None:
    names = list(next(iter(report["photos"].values()))["seconds"])
    print(f"{'photo':10s} {'size':>8s} " + " ".join(f"{n:>26s}" for n in names))
    for photo, row in report["photos"].items():
        cells = " ".join(f"{1e3 * row['seconds'][n]:23.0f} ms" for n in names)
        print(f"{photo:10s} {'x'.join(map(str, row['size'])):>8s} {cells}")
    for acc in report["accuracy"].values():
        line = (f"all photos, score >= {acc['score']:g}, IoU >= {acc['iou']:g}: fp32 {acc['ref_matched']}/"
                f"{acc['ref_confident']} matched, {report['precision']} {acc['ours_matched']}/"
                f"{acc['ours_confident']}")
        if "mask_iou_mean" in acc:
            line += f"; mask IoU min {acc['mask_iou_min']:.3f} mean {acc['mask_iou_mean']:.3f}"
        if "score_diff_mean" in acc:
            line += f"; |score diff| max {acc['score_diff_max']:.4f} mean {acc['score_diff_mean']:.4f}"
        print(line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="maskrcnn_resnet50_fpn")
    parser.add_argument("--target", default="native")
    parser.add_argument("--fp32", type=Path, default=None, help="a compiled fp32 any-size artifact")
    parser.add_argument("--precision", choices=("bf16", "int8"), default="bf16",
                        help="the build compared with fp32")
    parser.add_argument("--bf16", type=Path, default=None, help="a compiled bf16 any-size artifact")
    parser.add_argument("--int8", type=Path, default=None, help="a compiled int8 any-size artifact")
    parser.add_argument("--generic-int8", action="store_true",
                        help="compile int8 on TVM's generic schedules where this CPU has no int8 kernels")
    parser.add_argument("--photos", default="astronaut,coffee,portrait")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--low-score", type=float, default=0.1)
    parser.add_argument("--fp32-layers", default=None, help="the bf16 / int8 build's layers kept in fp32")
    parser.add_argument("--out", default="benchmarks/results/bench_detector_precision.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(use_usable_cores())
    model = det.build_torch_detector(args.model)
    reduced = args.precision
    report = {"model": args.model, "target": args.target, "precision": reduced, "rounds": args.rounds,
              "photos": {}}
    matches = {(BF16_SCORE, BF16_BOX_IOU): [], (args.low_score, 0.9): [], (0.5, 0.5): []}
    with tempfile.TemporaryDirectory() as workdir:
        tvm = artifacts(args, model, Path(workdir))
        for name, rgb in photos(args.photos.split(",")).items():
            print(f"{name} {rgb.shape[0]}x{rgb.shape[1]}", file=sys.stderr, flush=True)
            fp32, ours = tvm["fp32"](rgb), tvm[reduced](rgb)
            for (score, iou), found in matches.items():
                found.append(match_confident(fp32, ours, score=score, iou=iou))
            kernels = tvm[reduced].meta.get(f"{reduced}_kernels")
            runners = {
                f"tvm-roialign {reduced} ({kernels})": lambda rgb=rgb: tvm[reduced](rgb),
                "tvm-roialign fp32": lambda rgb=rgb: tvm["fp32"](rgb),
                **openvino_runners(model, rgb),
            }
            report["photos"][name] = {
                "size": list(rgb.shape[:2]),
                "seconds": interleaved_seconds(runners, args.rounds),
                "accuracy": {f"score {s:g}, IoU {i:g}": m[-1] for (s, i), m in matches.items()},
            }
    report["accuracy"] = {f"score {s:g}, IoU {i:g}": sum_matches(m) for (s, i), m in matches.items()}
    verdict = bf16_passed(sum_matches(matches[(BF16_SCORE, BF16_BOX_IOU)]))
    report["criterion"] = {"criteria": BF16_CRITERIA, "passed": verdict}
    write_report(report, args.out, print_report)
    print(f"{reduced} criterion ({BF16_CRITERIA}): {'PASS' if verdict else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
