"""Whole detectors in ``compile`` and ``run``: one artifact that runs without PyTorch.

``compile maskrcnn_resnet50_fpn --input-size 512x512 -o model.so`` (any name of
:data:`tvm_roialign.models.detection.DETECTORS`, or a ``.pt2`` written by
``tvm_roialign.frontend.detection.export_detector``) builds the artifact of
:mod:`tvm_roialign.models.detection`; ``run model.so --image photo.jpg --out result.png`` runs it
with :mod:`tvm_roialign.runtime` (TVM's runtime, NumPy and Pillow only).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from ._common import CLIError, first_line, output_path
from ._progress import Progress

#: What marks a .pt2 as a detector exported in the static form (its NMS custom op).
_DETECTOR_OP = b"tvm_roialign.batched_nms"


def add_compile_arguments(p) -> None:
    group = p.add_argument_group("detectors (MODEL is a torchvision detector name or its .pt2)")
    group.add_argument("--input-size", default="512x512", help="height x width of the photos")
    group.add_argument("--weights", default=None, help="a state_dict (default: random weights, --seed)")
    group.add_argument("--seed", type=int, default=3, help="seed of the random weights")


def add_run_arguments(p) -> None:
    group = p.add_argument_group("detectors (a library written by `compile DETECTOR`)")
    group.add_argument("--image", default=None, help="a photo (any Pillow format): run the detector on it")
    group.add_argument("--out", default="result.png", help="the annotated picture")
    group.add_argument("--json", default=None, help="the detections (default: --out with .json)")
    group.add_argument("--draw-top", type=int, default=8, help="detections drawn on the picture")


def is_detector(model: str) -> bool:
    """A detector name, or a .pt2 holding the static form's NMS op."""
    from ..models.detection import DETECTORS

    if model in DETECTORS:
        return True
    path = Path(model)
    if path.suffix.lower() != ".pt2" or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(_DETECTOR_OP in archive.read(n) for n in archive.namelist() if n.endswith(".json"))


def _input_size(text: str) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in text.lower().split("x"))
        if height < 1 or width < 1:
            raise ValueError
    except ValueError:
        raise CLIError(f"--input-size {text!r} must look like 512x512 (height x width)") from None
    return height, width


def compile_main(args, target, out: Path, layout: str) -> int:
    """``compile`` of a whole detector (``layout``: NHWC or NCHW)."""
    from ..models.detection import DETECTORS, DetectorConfig, compile_detector
    from ..target import describe

    size = _input_size(args.input_size) if args.model in DETECTORS else None
    if args.weights is not None and not Path(args.weights).is_file():
        raise CLIError(f"--weights {args.weights!r} does not exist")
    config = DetectorConfig(seed=args.seed, weights=args.weights)
    with Progress(args.quiet) as progress:
        try:
            artifact = compile_detector(args.model, size, target, layout, config, progress=progress)
            progress(f"export {out}")
            artifact.export(out)
        except (ValueError, FileNotFoundError) as err:
            raise CLIError(first_line(err)) from None
    height, width = artifact.meta["input"]["shape"][1:3]
    print(
        f"compiled {args.model} ({height}x{width}, {describe(target)}, layout {layout}) in "
        f"{artifact.compile_s:.1f} s -> {out} (+ {out.name}.json)"
    )
    return 0


def run_main(args) -> int:
    """``run --image``: the detector artifact on a photo."""
    from ..runtime import detect_to_files

    if args.draw_top < 0:
        raise CLIError(f"--draw-top must be >= 0, got {args.draw_top}")
    out = output_path(args.out, "--out", (".png", ".jpg", ".jpeg"))
    report = output_path(args.json, "--json", (".json",)) if args.json else out.with_suffix(".json")
    try:
        summary = detect_to_files(args.library, args.image, out, report, top=args.draw_top)
    except (ValueError, FileNotFoundError) as err:
        raise CLIError(first_line(err)) from None
    print(
        f"{summary['num_detections']} detections in {summary['run_ms']:.0f} ms "
        f"({summary['total_ms']:.0f} ms with the mask paste) -> {out}, {report}"
    )
    return 0
