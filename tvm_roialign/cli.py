"""``tvm-roialign``: a tvmc-style command line (tvmc itself no longer ships with TVM).

Subcommands
-----------
``compile MODEL -o OUT.so``
    Import a ``.pt2`` (``torch.export.save``) or ``.onnx`` model with tvm-roialign's importers,
    ConvertLayout it (``--desired-layout NHWC``, ops chosen by ``--desired-layout-ops``), build it
    for ``--target`` and export the library. A ``OUT.so.json`` next to it records the target and the
    input names, shapes and dtypes for ``run``.
``compile maskrcnn_resnet50_fpn --input-size 512x512 -o model.so``
    A whole torchvision detector (or a ``.pt2`` exported with
    ``tvm_roialign.frontend.detection.export_detector``) as one artifact, with its metadata.
``run OUT.so --inputs in.npz --outputs out.npz``
    Run ``main`` of a compiled library; inputs are matched by name (else by order), outputs saved
    as ``output_0``, ``output_1``, ...
``run model.so --image photo.jpg --out result.png``
    A detector artifact on a photo, with TVM's runtime, NumPy and Pillow only (no PyTorch):
    the picture with boxes, labels and masks, and the detections as JSON.
``maskrcnn [--image PATH] [--weights PATH] [--target llvm] [--layout NHWC] --out result.png``
    torchvision's Mask R-CNN with its static graphs in TVM (:mod:`tvm_roialign.models.maskrcnn`), on
    a photo (default: scikit-image's astronaut), compared with PyTorch eager; writes the annotated
    picture and a JSON report next to it.

Every failure the user can cause (unreadable model, unknown target, bad layout, missing input)
exits with status 1 (2 for command-line syntax) and one line ``tvm-roialign: error: ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .target import TARGETS, target_config  # noqa: F401 - TARGETS re-exported

LAYOUTS = ("NCHW", "NHWC")

#: ``--desired-layout-ops`` names -> Relax ops.
LAYOUT_OPS = {
    "conv2d": ["relax.nn.conv2d"],
    "roi_align": ["relax.vision.roi_align", "relax.vision.multiscale_roi_align"],
    "multiscale_roi_align": ["relax.vision.multiscale_roi_align"],
    "max_pool2d": ["relax.nn.max_pool2d"],
    "avg_pool2d": ["relax.nn.avg_pool2d"],
    "resize2d": ["relax.image.resize2d"],
}


class CLIError(Exception):
    """A user error: printed as one line, exit status 1."""


def parse_target(text):
    """:func:`tvm_roialign.target.parse_target`, with the message naming ``--target``."""
    from .target import parse_target as _parse

    try:
        return _parse(text)
    except ValueError as err:
        raise ValueError(f"--target: {err}") from None


def desired_layouts(layout: str, ops: str | None) -> dict:
    """ConvertLayout's dictionary for ``--desired-layout`` and ``--desired-layout-ops``."""
    layout = str(layout).upper()
    if layout not in LAYOUTS:
        raise ValueError(f"--desired-layout must be NCHW or NHWC, got {layout!r}")
    names = [n.strip() for n in (ops or "conv2d,roi_align").split(",") if n.strip()]
    if not names:
        raise ValueError("--desired-layout-ops is empty; e.g. roi_align,conv2d")
    out = {}
    for name in names:
        key = name.split(".")[-1]
        if key not in LAYOUT_OPS:
            raise ValueError(
                f"--desired-layout-ops: unknown op {name!r}; known: {', '.join(LAYOUT_OPS)}"
            )
        for op in LAYOUT_OPS[key]:
            out[op] = [layout, "default"]
    return out


def _device_for(target):
    from .target import device_for

    try:
        return device_for(target)
    except ValueError as err:
        raise CLIError(str(err)) from None


# ------------------------------------------------------------------------------------------------
# progress display


class _Progress:
    """A rich spinner with the current step on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console

        self.console = Console(stderr=True, quiet=quiet)
        self.status = None
        self.t0 = time.perf_counter()

    def __enter__(self):
        if self.console.is_terminal:
            self.status = self.console.status("starting")
            self.status.__enter__()
        return self

    def __call__(self, message: str):
        elapsed = time.perf_counter() - self.t0
        if self.status is not None:
            self.status.update(f"[bold]{message}[/] ({elapsed:.0f} s)")
        self.console.log(message) if self.status is not None else self.console.print(
            f"[{elapsed:6.1f} s] {message}", highlight=False
        )

    def __exit__(self, *exc):
        if self.status is not None:
            self.status.__exit__(*exc)


# ------------------------------------------------------------------------------------------------
# compile


def _load_model(path: Path, input_shapes: dict | None):
    """Import ``path`` (.pt2 or .onnx) into a Relax IRModule with tvm-roialign's importers."""
    if not path.is_file():
        raise CLIError(f"model file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".pt2", ".pt", ".ep"):
        import logging
        import zipfile

        import torch

        from .frontend import from_exported_program

        if not zipfile.is_zipfile(path):
            raise CLIError(
                f"cannot read {str(path)!r} as a torch.export program (.pt2): not a zip archive "
                "(write it with torch.export.save)"
            )
        logger = logging.getLogger("torch.export")
        level = logger.level
        logger.setLevel(logging.CRITICAL)  # torch logs a traceback before raising
        try:
            exported = torch.export.load(str(path))
        except Exception as err:  # noqa: BLE001
            raise CLIError(
                f"cannot read {str(path)!r} as a torch.export program (.pt2): {_first_line(err)}"
            ) from None
        finally:
            logger.setLevel(level)
        return from_exported_program(exported, keep_params_as_input=False)
    if suffix == ".onnx":
        import onnx

        from .frontend import from_onnx

        try:
            model = onnx.load(str(path))
        except Exception as err:  # noqa: BLE001
            raise CLIError(
                f"cannot read {str(path)!r} as an ONNX model: {_first_line(err)}"
            ) from None
        return from_onnx(model, shape_dict=input_shapes or None)
    raise CLIError(
        f"unknown model format {suffix!r} for {str(path)!r}: expected .pt2 or .onnx"
    )


def _first_line(err) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _parse_shapes(items) -> dict:
    shapes = {}
    for item in items or []:
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise CLIError(
                f"--input-shape {item!r} must look like NAME:1,3,224,224"
            ) from None
    return shapes


def _signature(mod) -> list[dict]:
    from tvm import relax

    params = []
    for var in mod["main"].params:
        ty = var.ty
        shape = None
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
            shape = [int(v) if hasattr(v, "value") else str(v) for v in ty.shape.values]
        params.append(
            {
                "name": var.name,
                "shape": shape,
                "dtype": str(ty.dtype) if isinstance(ty, relax.TensorType) else None,
            }
        )
    return params


def cmd_compile(args) -> int:
    from .pipeline import build
    from .passes import ConvertLayout

    try:
        target = parse_target(args.target)
        layouts = (
            desired_layouts(args.desired_layout, args.desired_layout_ops)
            if args.desired_layout
            else None
        )
    except ValueError as err:
        raise CLIError(str(err)) from None
    out = Path(args.output)
    if out.suffix not in (".so", ".tar", ".dylib"):
        raise CLIError(f"-o {str(out)!r}: the library must end in .so, .tar or .dylib")
    if _is_detector(args.model):
        return _compile_detector(args, target, out)
    with _Progress(args.quiet) as progress:
        progress(f"import {args.model}")
        mod = _load_model(Path(args.model), _parse_shapes(args.input_shape))
        if layouts:
            progress(
                f"ConvertLayout to {args.desired_layout} ({', '.join(sorted(layouts))})"
            )
            mod = ConvertLayout(layouts)(mod)
        progress(f"build for {target.kind.name}")
        t0 = time.perf_counter()
        try:
            executable = build(mod, target)
        except Exception as err:  # noqa: BLE001
            raise CLIError(
                f"build for target {target.kind.name} failed: {_first_line(err)}"
            ) from None
        build_s = time.perf_counter() - t0
        progress(f"export {out}")
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            executable.export_library(str(out))
        except Exception as err:  # noqa: BLE001
            raise CLIError(
                f"cannot link {str(out)!r} for {target.kind.name} "
                f"{target.attrs.get('mtriple', '') if hasattr(target, 'attrs') else ''}: "
                f"{_first_line(err)} (use -o NAME.tar for a cross target without a cross compiler)"
            ) from None
    meta = {
        "target": json.loads(json.dumps(target_config(target))),
        "layout": args.desired_layout,
        "inputs": _signature(mod),
        "build_s": build_s,
    }
    Path(str(out) + ".json").write_text(json.dumps(meta, indent=2))
    print(f"compiled {args.model} -> {out} ({target.kind.name}, {build_s:.1f} s)")
    return 0


def _is_detector(model: str) -> bool:
    """A torchvision detector name, or a .pt2 holding tvm_roialign::batched_nms (a detector
    exported with tvm_roialign.frontend.detection.export_detector)."""
    import zipfile

    from .models.detection import DETECTORS

    if model in DETECTORS:
        return True
    path = Path(model)
    if path.suffix.lower() != ".pt2" or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(
            b"tvm_roialign.batched_nms" in archive.read(name)
            for name in archive.namelist()
            if name.endswith(".json")
        )


def _compile_detector(args, target, out: Path) -> int:
    """``compile`` of a whole detector: one artifact that ``run --image`` runs without PyTorch."""
    from .models.detection import DETECTORS, DetectorConfig, compile_detector

    size = None
    if args.model in DETECTORS:
        try:
            height, width = (int(v) for v in args.input_size.lower().split("x"))
            if height < 1 or width < 1:
                raise ValueError
        except ValueError:
            raise CLIError(
                f"--input-size {args.input_size!r} must look like 512x512 (height x width)"
            ) from None
        size = (height, width)
    layout = args.desired_layout or "NHWC"
    if layout not in LAYOUTS:
        raise CLIError(f"--desired-layout must be NCHW or NHWC, got {layout!r}")
    config = DetectorConfig(seed=args.seed, weights=args.weights)
    with _Progress(args.quiet) as progress:
        try:
            artifact = compile_detector(
                args.model, size, target, layout, config, progress=progress
            )
            progress(f"export {out}")
            artifact.export(out)
        except (ValueError, FileNotFoundError) as err:
            raise CLIError(_first_line(err)) from None
    meta = artifact.meta
    print(
        f"compiled {args.model} ({meta['input']['shape'][1]}x{meta['input']['shape'][2]}, "
        f"{target.kind.name}, {artifact.compile_s:.1f} s) -> {out} (+ {out.name}.json)"
    )
    return 0


# ------------------------------------------------------------------------------------------------
# run


def cmd_run(args) -> int:
    import numpy as np
    import tvm
    from tvm import relax

    lib_path = Path(args.library)
    if not lib_path.is_file():
        raise CLIError(f"compiled library {str(lib_path)!r} does not exist")
    if args.image is not None:
        return _run_detector(args, lib_path)
    if args.inputs is None or args.outputs is None:
        raise CLIError("run needs --inputs and --outputs (or --image for a detector)")
    meta_path = Path(str(lib_path) + ".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    target = parse_target(meta.get("target", {"kind": "llvm"}))
    device = _device_for(target)
    try:
        lib = tvm.runtime.load_module(str(lib_path))
        vm = relax.VirtualMachine(lib, device)
    except Exception as err:  # noqa: BLE001
        raise CLIError(
            f"cannot load {str(lib_path)!r} as a compiled model: {_first_line(err)}"
        ) from None
    in_path = Path(args.inputs)
    if not in_path.is_file():
        raise CLIError(f"--inputs {str(in_path)!r} does not exist")
    try:
        with np.load(in_path) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as err:  # noqa: BLE001
        raise CLIError(
            f"--inputs {str(in_path)!r} is not a readable .npz: {_first_line(err)}"
        ) from None
    specs = meta.get("inputs")
    if specs:
        names = [s["name"] for s in specs]
        if all(n in arrays for n in names):
            ordered = [arrays[n] for n in names]
        elif len(arrays) == len(names) and not set(arrays) & set(names):
            ordered = list(arrays.values())  # unnamed (arr_0, ...): by order
        else:
            missing = [n for n in names if n not in arrays]
            raise CLIError(
                f"--inputs lacks input(s) {', '.join(missing)} (the model takes "
                f"{', '.join(names)}; the file has {', '.join(arrays) or 'nothing'})"
            )
        for spec, array in zip(specs, ordered):
            shape = spec.get("shape")
            if (
                shape
                and all(isinstance(d, int) for d in shape)
                and list(array.shape) != shape
            ):
                raise CLIError(
                    f"input {spec['name']!r} has shape {list(array.shape)}, the model expects {shape}"
                )
            if spec.get("dtype") and str(array.dtype) != spec["dtype"]:
                raise CLIError(
                    f"input {spec['name']!r} has dtype {array.dtype}, the model expects {spec['dtype']}"
                )
    else:
        ordered = list(arrays.values())
    with _Progress(args.quiet) as progress:
        progress(f"run {lib_path.name} on {device}")
        t0 = time.perf_counter()
        try:
            result = vm["main"](
                *[tvm.runtime.tensor(np.ascontiguousarray(a), device) for a in ordered]
            )
        except Exception as err:  # noqa: BLE001
            raise CLIError(
                f"running {lib_path.name} failed: {_first_line(err)}"
            ) from None
        run_s = time.perf_counter() - t0
    outputs = _flatten(result)
    out_path = Path(args.outputs)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out_path, **{f"output_{i}": o for i, o in enumerate(outputs)})
    shapes = ", ".join(str(list(o.shape)) for o in outputs)
    print(
        f"ran {lib_path.name} in {run_s * 1e3:.1f} ms -> {out_path} ({len(outputs)} outputs: {shapes})"
    )
    return 0


def _run_detector(args, lib_path: Path) -> int:
    """``run --image``: a detector artifact on a photo (TVM runtime, NumPy, Pillow only)."""
    from .runtime import detect_to_files

    out = Path(args.out)
    report = Path(args.json) if args.json else out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        summary = detect_to_files(lib_path, args.image, out, report, top=args.draw_top)
    except (ValueError, FileNotFoundError) as err:
        raise CLIError(_first_line(err)) from None
    print(
        f"{summary['num_detections']} detections in {summary['run_ms']:.0f} ms "
        f"({summary['total_ms']:.0f} ms with the mask paste) -> {out}, {report}"
    )
    return 0


def _flatten(result) -> list:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    out = []
    for item in result:
        out.extend(_flatten(item))
    return out


# ------------------------------------------------------------------------------------------------
# maskrcnn


def cmd_maskrcnn(args) -> int:
    from .models import maskrcnn as mr

    try:
        target = parse_target(args.target)
    except ValueError as err:
        raise CLIError(str(err)) from None
    layout = str(args.layout).upper()
    if layout not in LAYOUTS:
        raise CLIError(f"--layout must be NCHW or NHWC, got {args.layout!r}")
    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".jpg", ".jpeg"):
        raise CLIError(f"--out {str(out)!r} must end in .png or .jpg")
    if not args.compile_only:
        _device_for(target)
    try:
        image = mr.load_image(args.image)
    except (FileNotFoundError, ValueError) as err:
        raise CLIError(str(err)) from None
    config = mr.MaskRCNNConfig(
        seed=args.seed,
        weights=args.weights,
        min_size=args.min_size,
        max_size=args.max_size or args.min_size,
        rpn_pre_nms_top_n_test=args.proposals,
        rpn_post_nms_top_n_test=args.proposals,
        box_detections_per_img=args.detections,
        box_score_thresh=args.score_thresh,
    )
    if args.weights is not None and not Path(args.weights).is_file():
        raise CLIError(f"--weights {args.weights!r} does not exist")
    try:
        model = mr.build_torch_model(config)
    except (FileNotFoundError, ValueError) as err:
        raise CLIError(str(err)) from None

    if args.compile_only:
        return _maskrcnn_compile_only(args, model, image, target, layout, out)
    with _Progress(args.quiet) as progress:
        report = mr.run_maskrcnn_report(
            model,
            image,
            target,
            layout,
            progress=progress,
            repeat=args.repeat,
            roi_timing=not args.no_roi_timing,
        )
        progress(f"write {out}")
        out.parent.mkdir(parents=True, exist_ok=True)
        mr.draw_detections(image, report.pop("_detections"), out, top=args.draw_top)
    report["config"] = {
        "image": args.image or "skimage.data.astronaut()",
        "weights": args.weights
        or f"random (weights=None, weights_backbone=None, seed {args.seed})",
        "target": target_config(target),
        "layout": layout,
        "min_size": config.min_size,
        "max_size": config.max_size,
        "proposals": config.rpn_post_nms_top_n_test,
        "detections_per_img": config.box_detections_per_img,
        "box_score_thresh": config.box_score_thresh,
        "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS"),
    }
    report_path = Path(args.report) if args.report else out.with_suffix(".json")
    report_path.write_text(json.dumps(report, indent=2))
    _print_summary(report, out, report_path)
    ok = report["comparison"]["passed"]
    return 0 if ok or not args.check else 3


def _maskrcnn_compile_only(args, model, image, target, layout, out) -> int:
    import torch

    from .models import maskrcnn as mr

    with _Progress(args.quiet) as progress:
        detector = mr.TVMMaskRCNN(model, target, layout, progress)
        with torch.no_grad():
            image_list, _ = model.transform([image])
        try:
            pieces = detector.compile(image_list.tensors.shape)
        except Exception as err:  # noqa: BLE001
            raise CLIError(
                f"build for target {target.kind.name} failed: {_first_line(err)}"
            ) from None
    report = {
        "compile_only": True,
        "target": target_config(target),
        "layout": layout,
        "pieces": {
            n: {"tvm_import_s": p.import_s, "tvm_compile_s": p.compile_s}
            for n, p in pieces.items()
        },
        "transposes": detector.permute_counts(),
    }
    report_path = Path(args.report) if args.report else out.with_suffix(".json")
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2))
    total = sum(p.compile_s for p in pieces.values())
    adjacent = sum(
        c["adjacent_to_roi_align_after"] for c in report["transposes"].values()
    )
    print(
        f"compiled Mask R-CNN for {target.kind.name} ({layout}) in {total:.1f} s; "
        f"permute_dims next to roi_align: {adjacent}; wrote {report_path}"
    )
    return 0


def _print_summary(report, out, report_path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="Mask R-CNN: TVM vs PyTorch eager")
    table.add_column("piece")
    table.add_column("TVM compile s", justify="right")
    table.add_column("TVM run s", justify="right")
    table.add_column("PyTorch run s", justify="right")
    for name, row in report["pieces"].items():
        table.add_row(
            name,
            f"{row['tvm_compile_s']:.1f}"
            if row.get("tvm_compile_s") is not None
            else "-",
            f"{row['tvm_run_s']:.3f}" if row.get("tvm_run_s") is not None else "-",
            f"{row['torch_run_s']:.3f}" if row.get("torch_run_s") is not None else "-",
        )
    console.print(table)
    cmp = report["comparison"]
    console.print(
        f"detections: TVM {cmp['num_detections_tvm']}, PyTorch {cmp['num_detections_torch']}; "
        f"same labels: {cmp['same_labels']}; max box diff {cmp['max_box_diff']:.2e} px; "
        f"mask pixels equal {100 * cmp['mask_pixel_agreement']:.4f}% -> "
        f"{'PASS' if cmp['passed'] else 'FAIL'}"
        + (
            " (no detections to compare: lower --score-thresh or use another --seed)"
            if cmp["num_detections_tvm"] == 0
            else ""
        ),
        highlight=False,
    )
    perm = report["transposes"]
    console.print(
        f"permute_dims before/after ConvertLayout: {perm['total_before']} / {perm['total_after']}; "
        f"adjacent to roi_align after: {perm['adjacent_to_roi_align_after']}",
        highlight=False,
    )
    roi = report.get("roi_align")
    if roi:
        console.print(
            f"roi_align in the heads: ours (fused multiscale op) {roi['ours_s'] * 1e3:.2f} ms, "
            f"stock TVM (per level) {roi['stock_s'] * 1e3:.2f} ms ({roi['speedup']:.1f}x; ours per "
            f"level {roi['ours_per_level_s'] * 1e3:.2f} ms, {roi['speedup_per_level']:.1f}x); "
            f"share of TVM head time {100 * roi['share_of_heads']:.1f}%",
            highlight=False,
        )
    console.print(f"wrote {out} and {report_path}", highlight=False)


# ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvm-roialign",
        description="Compile and run models with tvm-roialign's RoIAlign (a tvmc-style CLI).",
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="no progress display"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "compile", help="import, ConvertLayout and build a .pt2 / .onnx model or a detector"
    )
    p.add_argument(
        "model",
        help="a torch.export program (.pt2, torch.export.save), an .onnx model, or a "
        "torchvision detector: maskrcnn_resnet50_fpn, fasterrcnn_resnet50_fpn, ...",
    )
    p.add_argument(
        "--input-size",
        default="512x512",
        help="detector: height x width of the photos (default 512x512)",
    )
    p.add_argument(
        "--weights", default=None, help="detector: a state_dict (default: random, --seed)"
    )
    p.add_argument("--seed", type=int, default=3, help="detector: seed of random weights")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="the compiled library (.so; .tar for cross)",
    )
    p.add_argument(
        "--target", default="llvm", help="llvm, aarch64, cuda, metal or a JSON target"
    )
    p.add_argument(
        "--desired-layout", type=str.upper, default=None, help="NCHW or NHWC"
    )
    p.add_argument(
        "--desired-layout-ops",
        default=None,
        help="comma-separated ops to convert (default: conv2d,roi_align)",
    )
    p.add_argument(
        "--input-shape",
        action="append",
        default=None,
        metavar="NAME:D0,D1,...",
        help="static shape of an ONNX input (repeatable)",
    )
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser(
        "run", help="run a compiled library on an .npz, or a detector on a photo"
    )
    p.add_argument("library", help="library written by `compile`")
    p.add_argument("--inputs", default=None, help=".npz with one array per model input")
    p.add_argument(
        "--outputs", default=None, help=".npz to write (output_0, output_1, ...)"
    )
    p.add_argument("--image", default=None, help="detector: a photo (any Pillow format)")
    p.add_argument(
        "--out", default="result.png", help="detector: the annotated picture (result.png)"
    )
    p.add_argument(
        "--json", default=None, help="detector: the detections (default: --out with .json)"
    )
    p.add_argument(
        "--draw-top", type=int, default=8, help="detector: detections drawn (default 8)"
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "maskrcnn", help="Mask R-CNN through TVM on a photo, compared with PyTorch"
    )
    p.add_argument(
        "--image", default=None, help="a photo (default: scikit-image's astronaut)"
    )
    p.add_argument(
        "--weights",
        default=None,
        help="maskrcnn_resnet50_fpn state_dict (default: random, seeded)",
    )
    p.add_argument(
        "--seed", type=int, default=3, help="seed of the random weights (default 3)"
    )
    p.add_argument(
        "--target", default="llvm", help="llvm, aarch64, cuda, metal or a JSON target"
    )
    p.add_argument("--layout", default="NHWC", help="NHWC (ConvertLayout) or NCHW")
    p.add_argument("--out", default="result.png", help="annotated picture (.png/.jpg)")
    p.add_argument(
        "--report", default=None, help="JSON report (default: --out with .json)"
    )
    p.add_argument(
        "--min-size", type=int, default=512, help="torchvision resize min_size (512)"
    )
    p.add_argument(
        "--max-size", type=int, default=None, help="torchvision resize max_size (= min)"
    )
    p.add_argument(
        "--proposals", type=int, default=1000, help="RPN proposals kept (1000)"
    )
    p.add_argument(
        "--detections", type=int, default=100, help="detections per image (100)"
    )
    p.add_argument(
        "--score-thresh", type=float, default=0.05, help="box score threshold (0.05)"
    )
    p.add_argument(
        "--repeat", type=int, default=2, help="timed runs per piece (min reported)"
    )
    p.add_argument(
        "--draw-top", type=int, default=8, help="detections drawn on the picture"
    )
    p.add_argument(
        "--no-roi-timing",
        action="store_true",
        help="skip ours-vs-stock roi_align timing",
    )
    p.add_argument(
        "--check", action="store_true", help="exit 3 when TVM and PyTorch disagree"
    )
    p.add_argument(
        "--compile-only",
        action="store_true",
        help="only build the three graphs (any target, e.g. cuda or aarch64 here) and write the report",
    )
    p.set_defaults(func=cmd_maskrcnn)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CLIError as err:
        print(f"tvm-roialign: error: {err}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as err:  # an optional dependency of this subcommand
        print(
            f"tvm-roialign: error: {args.command} needs the Python package {err.name!r}; "
            'install the extras: pip install "tvm-roialign[torch,onnx,cli]"',
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print("tvm-roialign: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
