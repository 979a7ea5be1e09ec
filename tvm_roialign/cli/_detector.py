"""Whole detectors in ``compile`` and ``run``: one artifact that runs without PyTorch.

``compile maskrcnn_resnet50_fpn --input-size 512x512 -o model.so`` (any name of
:data:`tvm_roialign.models.detection.DETECTORS`, or a ``.pt2`` written by
``tvm_roialign.frontend.detection.export_detector``) builds the artifact of
:mod:`tvm_roialign.models.detection`; ``run model.so --image photo.jpg --out result.png`` runs it
with :mod:`tvm_roialign.runtime` (TVM's runtime, NumPy and Pillow only).
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

from . import _photos
from ._common import CLIError, add_total, first_line, format_times, output_path, size_text
from ._precision import print_precision_line, reject_fp32_layers
from ._progress import progress_session

#: What marks a .pt2 as a detector exported in the static form (its NMS custom op).
_DETECTOR_OP = b"tvm_roialign.batched_nms"

#: The defaults of the options that only detector names take (None in the parser: "not given").
DEFAULT_SEED = 3
DEFAULT_MIN_SIZE = 512
DEFAULT_MAX_SIZE = 512

#: ``--fast`` and ``--exact`` of ``compile DETECTOR``, ``maskrcnn`` and ``tune maskrcnn``.
HELP_FAST = (
    "fast build (the default): the 3x3 convolutions as Winograd F(4x4, 3x3) or F(5x5, 3x3); detections "
    "scored >= 0.1 match eager's with box IoU >= 0.99, near ties excepted (docs/detectors.md, build modes); "
    "a model file's 3x3 convolutions as Winograd F(4x4, 3x3) where it pays"
)
HELP_EXACT = (
    "exact build: direct 3x3 convolutions, as PyTorch's, every detection equal to eager's, "
    "decision for decision (slower than the default fast build: Mask R-CNN 1.2-1.8x); a model file: "
    "no Winograd, results as the framework's within float32 rounding"
)


def add_mode_arguments(parser) -> None:
    """``--fast`` / ``--exact`` (one of them, into ``args.fast``; None when neither is given:
    :func:`build_fast` reads the default)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fast", dest="fast", action="store_const", const=True, default=None, help=HELP_FAST)
    group.add_argument("--exact", dest="fast", action="store_const", const=False, help=HELP_EXACT)


def build_fast(args) -> bool:
    """Whether ``args`` asks for a fast build: ``--fast``, ``--exact``, else the default
    (:data:`~tvm_roialign.models.detector_sizes.DEFAULT_FAST`)."""
    from ..models.detector_sizes import DEFAULT_FAST

    fast = getattr(args, "fast", None)
    return DEFAULT_FAST if fast is None else bool(fast)

#: The options that only detector names take: (attribute, flag).
_NAME_OPTIONS = (
    ("weights", "--weights"),
    ("input_size", "--input-size"),
    ("seed", "--seed"),
    ("min_size", "--min-size"),
    ("max_size", "--max-size"),
)


def _names() -> str:
    from ..models.detection import DETECTORS

    return ", ".join(DETECTORS)


def alternatives() -> str:
    """The other kind of ``compile`` MODEL, for the unknown-format message."""
    return f", or a detector name ({_names()})"


def add_compile_arguments(p) -> None:
    group = p.add_argument_group(
        "detectors (MODEL is a torchvision detector name; --input-size, --min-size, --max-size, "
        "--weights and --seed only apply to a name; --fast / --exact to every MODEL)"
    )
    group.add_argument(
        "--input-size",
        default=None,
        help="the photo sizes the artifact serves: any (the default: one function for every "
        "photo, its padded size symbolic), HxW[,HxW...] (one function compiled per padded "
        "size), or all (every padded size, one build each)",
    )
    group.add_argument(
        "--min-size",
        type=int,
        default=None,
        help=f"torchvision's min_size: the short side's target (default: {DEFAULT_MIN_SIZE}; "
        "torchvision's own and its published weights': 800)",
    )
    group.add_argument(
        "--max-size",
        type=int,
        default=None,
        help=f"torchvision's max_size: the long side's bound (default: {DEFAULT_MAX_SIZE}, or "
        "--min-size x 1333 / 800 when --min-size is given: --min-size 800 alone is torchvision's "
        "own 800 / 1333)",
    )
    group.add_argument("--weights", default=None, help="a state_dict (default: random weights, --seed)")
    add_mode_arguments(group)
    group.add_argument(
        "--seed", type=int, default=None, help=f"seed of the random weights (default: {DEFAULT_SEED})"
    )


def reject_detector_options(args, exported_detector: bool = False) -> None:
    """The options of detector names, given with a model file: an error naming the first;
    ``--fp32-layers`` too unless the file is an ``exported_detector`` (a .pt2 in the static form).
    ``--fast`` / ``--exact`` apply to every model (a model file's: Winograd or direct convolutions)."""
    for attr, flag in _NAME_OPTIONS:
        if getattr(args, attr, None) is not None:
            raise CLIError(
                f"{flag} only applies to a detector name ({_names()}), not to the model file "
                f"{args.model!r}"
            )
    if not exported_detector:
        reject_fp32_layers(args)


def add_run_arguments(p) -> None:
    group = p.add_argument_group("detectors (a library written by `compile DETECTOR`)")
    _photos.add_image_argument(group)
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


def _input_sizes(text: str | None):
    """``--input-size``: ``"any"`` (the default), ``"all"`` or a list of ``(H, W)``."""
    if text is None or text.strip().lower() in ("any", "all"):
        return "any" if text is None else text.strip().lower()
    sizes = []
    for part in text.split(","):
        try:
            height, width = (int(v) for v in part.strip().lower().split("x"))
            if height < 1 or width < 1:
                raise ValueError
        except ValueError:
            raise CLIError(
                f"--input-size {text!r} must be any, all, or positive sizes like 512x512 or "
                "400x600,600x400 (height x width of the photos)"
            ) from None
        sizes.append((height, width))
    return sizes


def _bounds(args) -> tuple[int, int]:
    """``(min_size, max_size)``: 512 / 512 by default; ``--min-size`` alone keeps torchvision's
    ratio (``--min-size 800`` is torchvision's own 800 / 1333)."""
    low = DEFAULT_MIN_SIZE if args.min_size is None else args.min_size
    if args.max_size is not None:
        high = args.max_size
    elif args.min_size is None:
        high = DEFAULT_MAX_SIZE
    else:
        high = round(args.min_size * 1333 / 800)
    for flag, value in (("--min-size", low), ("--max-size", high)):
        if value < 32:
            raise CLIError(f"{flag} must be at least 32 pixels, got {value}")
    return low, high


def compile_main(args, target, out: Path, layout: str, t_start: float, link_note=None,
                 plan=None) -> int:
    """``compile`` of a whole detector (``layout``: NHWC or NCHW); ``t_start``: when ``main``
    started (the total time printed counts from it); ``link_note``: how ``out`` is linked
    (:func:`tvm_roialign.linking.choose_library`); ``plan``: the build's
    :class:`~tvm_roialign.precision.PrecisionPlan`, resolved by ``compile`` (None: fp32)."""
    from ..models._torchvision import file_origin, weights_origin
    from ..models.detection import DETECTORS, DetectorConfig, build_torch_detector, compile_detector
    from ..precision.policy import FP32
    from ..runtime.detector import accepted_sizes
    from ..target import describe

    name = args.model if args.model in DETECTORS else None
    if name is None:  # an exported .pt2: its size, weights and seed are fixed in it
        reject_detector_options(args, exported_detector=True)
    sizes = _input_sizes(args.input_size) if name else None
    min_size, max_size = _bounds(args) if name else (None, None)
    if args.weights is not None and not Path(args.weights).is_file():
        raise CLIError(f"--weights {args.weights!r} does not exist")
    seed = DEFAULT_SEED if args.seed is None else args.seed
    times = {}
    with progress_session(args.quiet) as progress:
        model = args.model
        if name is not None:
            progress(f"build torchvision {name}")
            t0 = time.perf_counter()
            try:
                config = DetectorConfig(
                    seed=seed, weights=args.weights, min_size=min_size, max_size=max_size
                )
                model = build_torch_detector(name, config)
            except (ValueError, FileNotFoundError) as err:
                raise CLIError(f"--weights: {first_line(err)}") from None
            times["model_s"] = time.perf_counter() - t0
        try:
            fast = build_fast(args)
            artifact = compile_detector(
                model, sizes, target, layout, progress=progress, name=name, fast=fast,
                precision=plan or FP32, fp32_layers=getattr(args, "fp32_layers", None),
                calibration=getattr(args, "calibrate", None) if plan and plan.precision == "int8" else None,
            )
            times["import_s"], times["build_s"] = artifact.import_s, artifact.compile_s
            # an exported program holds its weights: the file they are fixed in
            artifact.meta["weights"] = (
                weights_origin(args.weights, seed) if name else f"fixed in {file_origin(args.model)}"
            )
            progress(f"export {out}")
            t0 = time.perf_counter()
            artifact.export(out)
            times["export_s"] = time.perf_counter() - t0
            if link_note:
                progress.note(f"note: {link_note}")
        except (ValueError, FileNotFoundError) as err:
            raise CLIError(first_line(err)) from None
    times = add_total(times, t_start, args.startup_s)
    print(
        f"compiled {args.model} ({accepted_sizes(artifact.meta, most=8)}; {describe(target)}, "
        f"layout {layout}, {artifact.meta['mode']}, {artifact.meta.get('precision', 'fp32')}) -> "
        f"{out} ({size_text(out.stat().st_size)}, + {out.name}.json) in {format_times(times)}"
    )
    print_precision_line(args)
    return 0


def run_main(args, session=None) -> int:
    """``run --image``: the detector artifact on each photo (on a remote device: ``session``);
    ``run`` has checked the library."""
    from ..runtime import Detector, detect_to_files, read_metadata
    from ..runtime.detector import precision_suffix, weights_suffix

    if args.draw_top < 0:
        raise CLIError(f"--draw-top must be >= 0, got {args.draw_top}")
    _photos.reject_model_options(args)
    out = output_path(args.out, "--out", (".png", ".jpg", ".jpeg"))
    report = output_path(args.json, "--json", (".json",)) if args.json else out.with_suffix(".json")
    pairs = _photos.output_pairs(args.image, out, report)
    photos = _photos.read_photos(args.image)
    image = args.image[0]
    try:
        detector = Detector(args.library, session, verify=False)
        masks = "masks" in (read_metadata(args.library).get("outputs") or ())
        for image, rgb, (picture, json_path) in zip(args.image, photos, pairs):
            summary = detect_to_files(
                detector, image, picture, json_path, top=args.draw_top, rgb=rgb
            )
            paste = f" ({summary['total_ms']:.0f} ms with the mask paste)" if masks else ""
            print(
                f"{summary['num_detections']} detections in {summary['run_ms']:.0f} ms{paste} "
                f"({detector.mode} build{precision_suffix(summary)}{weights_suffix(summary)}) -> "
                f"{picture}, {json_path}"
            )
        if args.print_time:
            _photos.print_detector_time(detector, photos, args.number, args.repeat)
    except (ValueError, FileNotFoundError) as err:
        message = first_line(err)
        if message.startswith("a photo of"):  # its padded size is not the artifact's
            message = f"--image {image!r}: {message}"
        raise CLIError(message) from None
    return 0
