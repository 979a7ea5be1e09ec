"""A detector's any-size artifacts (the fast default, ``--exact``, ``--precision bf16`` and, with
``--builds ...,int8``, ``--precision int8``) against
OpenVINO in f32 and at its default precision with every head kept (the converted model returns the
masks or keypoints: :func:`tvm_roialign.bench.openvino_peer.detector_model`), and PyTorch eager;
with ``int8`` among the builds also OpenVINO's int8 of a Mask R-CNN, NNCF's ``nncf.quantize``
calibrated on the five sample photos resized to the photo's size
(:func:`tvm_roialign.bench.openvino_peer.detector_int8`: without the mask pasting, returning the
28x28 mask probabilities), beside OpenVINO f32 of that same unpasted model;
astronaut, coffee and portrait; the runners take turns, median of ``--repeat`` rounds; each fp32 build's
detections checked against eager's by its mode's criterion. ``--model``:
Mask R-CNN (the default), Faster R-CNN or Keypoint R-CNN (ResNet-50 FPN).

    python benchmarks/bench_detector_peers.py [--model maskrcnn|fasterrcnn|keypointrcnn]
        [--repeat 5] [--workdir /tmp] [--builds exact,fast,bf16,int8] [--reuse]
        [--out benchmarks/results/detector_peers.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read once, when PyTorch loads its OpenMP

import torch
from _common import interleaved_seconds
from bench_anyphoto import photos

from tvm_roialign.host import use_usable_cores

PHOTOS = ("astronaut", "coffee", "portrait")
BUILDS = {"tvm exact": {"fast": False}, "tvm fast": {"fast": True}, "tvm bf16": {"precision": "bf16"},
          "tvm int8": {"precision": "int8"}}
#: ``--model``'s names: the torchvision detectors (:data:`tvm_roialign.models.detection.DETECTORS`)
MODELS = {
    "maskrcnn": "maskrcnn_resnet50_fpn",
    "fasterrcnn": "fasterrcnn_resnet50_fpn",
    "keypointrcnn": "keypointrcnn_resnet50_fpn",
}


def _image(rgb) -> torch.Tensor:
    return torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0


def _artifacts(model, workdir: str, builds: list[str], short: str, reuse: bool = False) -> dict:
    from tvm_roialign.models import detection as det
    from tvm_roialign.runtime import Detector

    out = {}
    for label in builds:
        options = BUILDS[label]
        start = time.perf_counter()
        path = os.path.join(workdir, f"{short}_{label.split()[1]}.so")
        if reuse and os.path.exists(path):
            out[label] = Detector(path)
            print(f"{label}: {path} as built before", file=sys.stderr, flush=True)
            continue
        out[label] = Detector(det.compile_detector(model, None, target="native", **options).export(path))
        print(f"{label}: built in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return out


def _runners(model, artifacts: dict, rgb, threads: int) -> dict:
    from tvm_roialign.bench.openvino_peer import OpenVINOModel, detector_model

    image = _image(rgb)
    converted, array = detector_model(model, image), image.numpy()
    f32, default = OpenVINOModel(converted, threads, "f32"), OpenVINOModel(converted, threads, None)

    def eager():
        with torch.no_grad():
            return model([image])

    runners = {label: (lambda d=artifact: d(rgb)) for label, artifact in artifacts.items()}
    runners["OV f32"] = lambda: f32(array)
    runners[f"OV default ({default.precision})"] = lambda: default(array)
    if "tvm int8" in artifacts:
        runners.update(_openvino_int8(model, image, threads))
    runners["eager"] = eager
    return runners


def _openvino_int8(model, image, threads: int) -> dict:
    """OpenVINO f32 and its NNCF int8 (default precision elsewhere) of the unpasted detector."""
    import tempfile

    import torch.nn.functional as F

    from tvm_roialign.bench.openvino_peer import OpenVINOModel, detector_int8, detector_model
    from tvm_roialign.models import detection as det

    size = tuple(image.shape[-2:])
    calibration = [F.interpolate(_image(det.sample_photo(n))[None], size=size, mode="bilinear")[0].numpy()
                   for n in det.SAMPLE_PHOTOS]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        int8 = OpenVINOModel(detector_int8(model, image, calibration, folder), threads, None)
    print(f"OV int8: NNCF quantized in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    unpasted, array = OpenVINOModel(detector_model(model, image, paste=False), threads, "f32"), image.numpy()
    return {"OV f32 unpasted": lambda: unpasted(array), "OV int8 (NNCF, unpasted)": lambda: int8(array)}


def _checks(model, artifacts: dict, rgb) -> dict:
    """Each fp32 TVM build's detections against eager's by its mode's criterion
    (:func:`~tvm_roialign.models.compare.compare_for_mode`; a bf16 build is judged in
    benchmarks/bench_detector_precision.py)."""
    from tvm_roialign.models import detection as det
    from tvm_roialign.models.compare import compare_for_mode, model_limits

    ref, limits = det.torch_detections(model, rgb), model_limits(model)
    out = {}
    for label, artifact in artifacts.items():
        if artifact.meta.get("precision", "fp32") != "fp32":
            continue
        out[label] = compare_for_mode(artifact(rgb), ref, artifact.mode, **limits)  # (exact: no limits)
    return out


def _summary(result: dict) -> str:
    keys = ("num_detections_tvm", "num_detections_torch", "checked_torch", "unmatched_torch", "unmatched_tvm",
            "min_box_iou", "max_box_diff", "max_score_diff", "mask_pixel_agreement", "max_keypoint_diff")
    shown = {k: result[k] for k in keys if result.get(k) is not None}
    return f"{result['mode']} criterion {'PASS' if result['passed'] else 'FAIL'} {shown}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="maskrcnn", choices=sorted(MODELS),
                        help="the detector (ResNet-50 FPN, random weights of seed 3)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workdir", default="/tmp", help="where the three artifacts are written")
    parser.add_argument("--builds", default="exact,fast,bf16", help="TVM builds timed, comma-separated")
    parser.add_argument("--out", default="benchmarks/results/detector_peers.json")
    parser.add_argument("--reuse", action="store_true",
                        help="load WORKDIR/MODEL_BUILD.so where it exists (same model, seed and target) "
                             "instead of compiling it again")
    args = parser.parse_args(argv)
    builds = [f"tvm {b.strip()}" for b in args.builds.split(",") if b.strip()]
    unknown = [b for b in builds if b not in BUILDS]
    if unknown or not builds:
        parser.error(f"--builds: expected names from {', '.join(k.split()[1] for k in BUILDS)}")
    threads = use_usable_cores(None)
    torch.set_num_threads(threads)
    from tvm_roialign.bench.report import cpu_identity
    from tvm_roialign.models import detection as det

    model = det.build_torch_detector(MODELS[args.model])
    rgbs = photos()
    for name in PHOTOS:  # eager warmed up before any TVM module runs
        with torch.no_grad():
            model([_image(rgbs[name])])
    artifacts = _artifacts(model, args.workdir, builds, args.model, args.reuse)
    rows, checks = {}, {}
    for name in PHOTOS:
        rgb = rgbs[name]
        checks[name] = _checks(model, artifacts, rgb)
        seconds = interleaved_seconds(_runners(model, artifacts, rgb, threads), args.repeat)
        rows[name] = {label: 1e3 * s for label, s in seconds.items()}
        size = "x".join(map(str, rgb.shape[:2]))
        print(name, size, {k: round(v) for k, v in rows[name].items()}, flush=True)
        if "tvm int8" in rows[name]:
            ms = rows[name]
            peers = ("OV int8 (NNCF, unpasted)", "tvm fast", "tvm exact")
            ratios = ", ".join(f"{k} {ms[k] / ms['tvm int8']:.2f}x" for k in peers if k in ms)
            print(f"  tvm int8 speed over {ratios}", flush=True)
        for label, result in checks[name].items():
            print(f"  {label}: {_summary(result)}", flush=True)
    with open(args.out, "w") as fh:
        json.dump(
            {"model": MODELS[args.model], "cpu": cpu_identity(), "threads": threads, "ms": rows,
             "checks": checks},
            fh,
            indent=1,
            default=str,
        )
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
