"""``tvm-roialign maskrcnn``: torchvision's Mask R-CNN through TVM on a photo, against PyTorch eager.

Its static graphs are built with TVM (:mod:`tvm_roialign.models.maskrcnn`), run on a photo
(default: scikit-image's astronaut) and compared with PyTorch eager by the measuring harness
(:mod:`tvm_roialign.bench`); the annotated picture and the JSON report
(:class:`~tvm_roialign.bench.MaskRCNNReport`) are written.
"""

from __future__ import annotations

import sys

from ._common import CLIError, device_for, first_line, output_path, resolve_target
from ._detector import _bounds, add_mode_arguments, build_fast
from ._precision import add_precision_arguments, print_precision_line, resolve_precision
from ._progress import progress_session
from ._tuning import add_records_argument, open_records, print_coverage
from .compile import HELP_TARGET

PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg")


HELP = "Mask R-CNN through TVM on a photo, compared with PyTorch"

DESCRIPTION = (
    "Build torchvision's Mask R-CNN with TVM as three graphs (backbone, box branch, mask branch; by "
    "default one build serves every photo size, --shapes static builds per padded size) with the "
    "data-dependent glue in PyTorch, run it on a photo next to PyTorch eager and ONNX Runtime, compare "
    "the detections, and write the annotated picture and a JSON report."
)


def add_arguments(p) -> None:
    """The options of `maskrcnn` (its parser: :func:`._common.add_command`)."""
    p.add_argument("--target", default="native", help=HELP_TARGET)
    add_model_arguments(p)
    add_precision_arguments(p, pieces=True)
    p.add_argument(
        "--calibrate", default=None, metavar="DIR",
        help="--precision int8: calibrate on the photos of DIR, each as it is (default: the package's "
        "sample photos)",
    )
    add_records_argument(p)
    p.add_argument("--out", default="result.png", help="annotated picture (.png/.jpg)")
    p.add_argument("--report", default=None, help="JSON report (default: --out with .json)")
    p.add_argument("--repeat", type=int, default=2, help="timed runs per piece (the best is reported)")
    p.add_argument("--draw-top", type=int, default=8, help="detections drawn on the picture")
    p.add_argument("--no-roi-timing", action="store_true", help="skip ours-vs-stock roi_align timing")
    p.add_argument(
        "--no-onnxruntime",
        action="store_true",
        help="skip the ONNX Runtime peer (the whole model through torch.onnx.export; needs the onnx extra)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 3 when TVM and PyTorch disagree (by the criteria of the build's mode: exact, "
        "or fast's (the default); a bf16 build by the bf16 criterion against the fp32 reference, "
        "docs/precision.md; an int8 build by the int8 criterion, docs/int8.md, which random weights "
        "do not meet: give --weights of a trained model)",
    )
    p.add_argument(
        "--shapes",
        choices=("any", "static"),
        default=None,
        help="any: one build serves every photo size (symbolic image size); static: a build for "
        "this photo's padded size, its kernels tiled for it (default: any; static with "
        "--tuning-records, which are tuned for one size)",
    )
    p.add_argument(
        "--compile-only",
        action="store_true",
        help="only build the three graphs (any target, e.g. cuda or aarch64 here) and write the report",
    )


def add_model_arguments(p) -> None:
    """The model, its photo and its graphs' sizes (shared with ``tune maskrcnn``)."""
    p.add_argument("--image", default=None, help="a photo (default: scikit-image's astronaut)")
    p.add_argument(
        "--weights", default=None, help="maskrcnn_resnet50_fpn state_dict (default: random, seeded)"
    )
    p.add_argument("--seed", type=int, default=3, help="seed of the random weights")
    p.add_argument(
        "--layout", default="NHWC", type=str.upper, metavar="{NHWC,NCHW}",
        help="NHWC (ConvertLayout) or NCHW (default: NHWC)",
    )
    p.add_argument(
        "--min-size", type=int, default=None,
        help="torchvision's resize min_size (default: 512; torchvision's own and its weights': 800)",
    )
    p.add_argument(
        "--max-size", type=int, default=None,
        help="torchvision's resize max_size (default: 512, or --min-size in torchvision's ratio "
        "800:1333, as compile NAME takes it: --min-size 800 is torchvision's 800 / 1333)",
    )
    p.add_argument("--proposals", type=int, default=1000, help="RPN proposals kept")
    p.add_argument("--detections", type=int, default=100, help="detections per image at most")
    p.add_argument("--score-thresh", type=float, default=0.05, help="box score threshold")
    add_mode_arguments(p)


def check_layout(args) -> None:
    if args.layout not in ("NCHW", "NHWC"):
        raise CLIError(f"--layout must be NCHW or NHWC, got {args.layout!r}")


def model_inputs(args, mr):
    """The photo and the torch model, with their errors naming the flag they came from."""
    try:
        image = mr.load_image(args.image)
    except (FileNotFoundError, ValueError) as err:
        raise CLIError(f"--image: {err}") from None
    min_size, max_size = _bounds(args)
    config = mr.MaskRCNNConfig(
        seed=args.seed,
        weights=args.weights,
        min_size=min_size,
        max_size=max_size,
        rpn_pre_nms_top_n_test=args.proposals,
        rpn_post_nms_top_n_test=args.proposals,
        box_detections_per_img=args.detections,
        box_score_thresh=args.score_thresh,
    )
    try:
        model = mr.build_torch_model(config)
    except (FileNotFoundError, ValueError) as err:
        raise CLIError(f"--weights: {err}") from None
    return image, config, model


def _job_config(args, target, config, records, onnxruntime):
    from ..bench import JobConfig

    return JobConfig(
        target=target,
        layout=args.layout,
        repeat=args.repeat,
        roi_timing=not args.no_roi_timing,
        onnxruntime=onnxruntime,
        tuning_records=records,
        model=config,
        image_name=args.image,
        shapes=args.shapes,
        fast=build_fast(args),
        precision=args.resolved_precision,
        fp32_layers=args.fp32_layers,
    )


def _onnxruntime(args) -> bool:
    """Whether to time ONNX Runtime: asked for, and installed (else a note)."""
    from ..bench import onnxruntime_available

    if args.no_onnxruntime or args.compile_only:
        return False
    if not onnxruntime_available():
        print(
            "note: onnxruntime is not installed, so ONNX Runtime is not timed "
            "(pip install 'tvm-roialign[onnx]', or pass --no-onnxruntime)",
            file=sys.stderr,
        )
        return False
    return True


def main_int8(args, target, out, report_path) -> int:
    """``--precision int8``: the detector as one calibrated artifact against PyTorch eager
    (:mod:`._maskrcnn_int8`), judged by the int8 criterion."""
    from ..models import maskrcnn as mr
    from ._maskrcnn_int8 import check_int8_arguments, print_int8_summary, run_int8, write_outputs

    check_int8_arguments(args)
    if args.compile_only:
        raise CLIError("--compile-only: an int8 maskrcnn is calibrated by running it; compile it with "
                       "tvm-roialign compile maskrcnn_resnet50_fpn --precision int8 instead")
    device_for(target)
    image, config, model = model_inputs(args, mr)
    with progress_session(args.quiet) as progress:
        report = run_int8(args, target, image, config, model, progress)
        progress(f"write {out}")
        write_outputs(report, image, out, report_path, args.draw_top)
    print_int8_summary(report, out, report_path)
    print_precision_line(args)
    return 0 if report["comparison"]["passed"] or not args.check else 3


def main(args) -> int:
    from .. import bench
    from ..models import maskrcnn as mr

    target = resolve_target(args.target)
    check_layout(args)
    args.resolved_precision = resolve_precision(args, target)
    out = output_path(args.out, "--out", PICTURE_SUFFIXES)
    report_path = output_path(args.report, "--report") if args.report else out.with_suffix(".json")
    if args.resolved_precision.precision == "int8":
        return main_int8(args, target, out, report_path)
    if args.calibrate is not None:
        raise CLIError("--calibrate applies to --precision int8")
    if not args.compile_only:
        device_for(target)
    image, config, model = model_inputs(args, mr)
    onnxruntime = _onnxruntime(args)
    with progress_session(args.quiet) as progress:
        coverages: list = []
        records = open_records(args.tuning_records, target, report=coverages.append)
        job = _job_config(args, target, config, records, onnxruntime)
        if args.compile_only:
            try:
                report = bench.compile_maskrcnn_report(model, image, job, progress)
            except Exception as err:  # noqa: BLE001 - a build failure: one line
                raise CLIError(f"build for target {target.kind.name} failed: {first_line(err)}") from None
        else:
            report = bench.run_maskrcnn_report(model, image, job, progress)
            progress(f"write {out}")
            mr.draw_detections(image, report.detections, out, top=args.draw_top, caption=report.caption())
    report.write_json(report_path)
    from ._maskrcnn_summary import print_compile_only, print_summary

    print_coverage(coverages)
    if args.compile_only:
        print_compile_only(report, report_path)
        print_precision_line(args)
        return 0
    print_summary(report, out, report_path)
    print_precision_line(args)
    return 0 if report.comparison.passed or not args.check else 3
