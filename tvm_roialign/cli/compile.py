"""``tvm-roialign compile MODEL -o OUT.so``: import, ConvertLayout, build, export (as ``tvmc compile``).

Besides the library it writes ``OUT.so.json`` (target, layout, the inputs' names, shapes and
dtypes for ``run``, and the time of each stage) and, with ``--dump-code``, ``OUT.so.relax`` (the
module built), ``OUT.so.tir`` (its scheduled TIR), ``OUT.so.ll`` and ``OUT.so.asm`` (LLVM IR and
assembly of the host code).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import _detector
from ._common import (
    CLIError,
    add_total,
    first_line,
    format_times,
    output_path,
    resolve_target,
    size_text,
)
from ._dump_code import DUMP_FORMATS, dump_formats, write_dumps
from ._model_file import (
    LIBRARY_SUFFIXES,
    check_int8_calibration,
    check_model_file,
    load_model,
    parse_input_shapes,
    signature,
    symbolic_inputs_note,
)
from ._precision import (
    add_precision_arguments,
    check_precision_arguments,
    precision_label,
    print_precision_line,
    resolve_precision,
)
from ._progress import progress_session
from ._tuning import add_records_argument, open_records, print_coverage

HELP_TARGET = (
    "native (this machine's CPU), llvm or llvm-generic (portable: generic CPU, as tvmc's 'llvm'), "
    "x86, aarch64, cuda, metal; a tvmc string such as 'llvm -mcpu=native' or "
    "'llvm -mtriple=aarch64-linux-gnu'; or a JSON target"
)


HELP = "import a .pt2 / .onnx model, ConvertLayout it and build a library"

DESCRIPTION = (
    "Import a .pt2 (torch.export.save) or .onnx model, convert it to NHWC on CPU targets (--desired-"
    "layout), build it for --target and export the library, with LIBRARY.json (target, inputs, stage "
    "times) beside it. MODEL may also be a torchvision detector name (maskrcnn_resnet50_fpn, ...): "
    "the whole detector becomes one artifact that `run --image` runs without PyTorch."
)


def add_arguments(p) -> None:
    """The options of `compile` (its parser: :func:`._common.add_command`)."""
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="after the summary, the longest TVM passes of the build with their times and calls "
        "(as tvmc's --print-pass-times)",
    )
    p.add_argument(
        "model",
        help="a torch.export program (.pt2, torch.export.save), an .onnx model, or a torchvision "
        "detector (maskrcnn_resnet50_fpn, fasterrcnn_resnet50_fpn, ...: one artifact that runs "
        "without PyTorch)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="the compiled library (.so; for a cross target, a .so where its cross linker is "
        "installed, else a .tar with a note)",
    )
    p.add_argument("--target", default="native", help=HELP_TARGET)
    add_precision_arguments(p)
    p.add_argument(
        "--calibrate",
        default=None,
        metavar="DIR",
        help="--precision int8: calibrate the activations' ranges on the photos of DIR, resized "
        "to the model's input and normalized as torchvision's classifiers expect; a detector "
        "takes each photo as it is (default: the package's sample photos)",
    )
    p.add_argument(
        "--keep-fp32",
        default=None,
        metavar="POSITIONS",
        help="--precision int8: the convolutions and matmuls to leave in fp32, as positions in the "
        "model's order of those int8 takes (comma-separated, negative from the end: -1 is the "
        "classifier's last layer)",
    )
    add_model_arguments(p)
    add_records_argument(p)
    _detector.add_compile_arguments(p)
    p.add_argument(
        "--dump-code",
        default=None,
        metavar="FORMATS",
        help=f"also write OUTPUT.FORMAT for each of {','.join(DUMP_FORMATS)} (comma-separated)",
    )


def add_model_arguments(p) -> None:
    """How a model file is imported and converted (shared with ``tune``)."""
    p.add_argument(
        "--desired-layout",
        default="auto",
        type=str.upper,
        metavar="{NHWC,NCHW,none,auto}",
        help="layout of the converted ops; auto: NHWC on CPU targets (the fast path), none elsewhere",
    )
    p.add_argument(
        "--desired-layout-ops",
        default="conv2d,roi_align",
        help="comma-separated ops to convert (conv2d, roi_align, multiscale_roi_align, "
        "max_pool2d, avg_pool2d, resize2d)",
    )
    p.add_argument(
        "--input-shapes",
        default=None,
        metavar='"NAME:[D0,D1,...] ..."',
        help='static shapes of ONNX inputs, as tvmc: "x:[1,3,224,224] rois:[6,4]" (without it, the '
        "model's dynamic axes stay symbolic: one library for every size)",
    )
    p.add_argument(
        "--input-shape",
        action="append",
        default=None,
        metavar="NAME:D0,D1,...",
        help="one static ONNX input shape (repeatable; older form of --input-shapes)",
    )


def model_options(args, target) -> tuple:
    """``(ConvertLayout's layouts or None, layout name, input shapes)`` from the arguments of
    :func:`add_model_arguments`; their errors come before any work."""
    layouts, layout_name = _layouts(args, target)
    return layouts, layout_name, parse_input_shapes(args.input_shapes, args.input_shape)


def import_model(args, options: tuple, progress, times: dict):
    """``(mod, layout name)``: ``args.model`` imported and ConvertLayout-ed with ``options``
    (:func:`model_options`), the stage times added to ``times``."""
    _imported, mod, layout_name = _import_and_convert(args, options, progress, times)
    return mod, layout_name


def _import_and_convert(args, options: tuple, progress, times: dict):
    """``(imported module, converted module, layout name)``; where the conversion fails on part
    of the model, that part keeps its layout and one note says so."""
    from ..passes.convert_layout_where_possible import ConvertLayoutWherePossible

    layouts, layout_name, shapes = options
    progress(f"import {args.model}")
    t0 = time.perf_counter()
    imported = load_model(Path(args.model), shapes)
    times["import_s"] = time.perf_counter() - t0
    note = symbolic_inputs_note(Path(args.model), imported)
    if note:
        progress.note(note)
    if not layouts:
        return imported, imported, layout_name
    progress(f"ConvertLayout {args.desired_layout_ops} to {layout_name}")
    t0 = time.perf_counter()
    mod = ConvertLayoutWherePossible(layouts, report=progress.note)(imported)
    times["convert_layout_s"] = time.perf_counter() - t0
    return imported, mod, layout_name


def _layouts(args, target):
    """ConvertLayout's dictionary for ``--desired-layout`` (None: no conversion), and its name."""
    from ..passes import desired_layouts

    layout = args.desired_layout
    if layout not in ("NCHW", "NHWC", "NONE", "AUTO"):
        raise CLIError(f"--desired-layout must be NHWC, NCHW, none or auto, got {layout!r}")
    if layout == "AUTO":
        layout = "NHWC" if target.kind.name == "llvm" else "NONE"
    if layout == "NONE":
        return None, "none"
    try:
        return desired_layouts(layout, args.desired_layout_ops), layout
    except ValueError as err:
        raise CLIError(f"--desired-layout-ops: {err}") from None


class _LastRelaxModule:
    """A pass instrument keeping the last module that still had Relax functions: after the build
    pipeline, its PrimFuncs are the scheduled TIR that is lowered and compiled."""

    def __init__(self):
        self.mod = None

    def run_after_pass(self, mod, _info):
        from tvm import relax

        if any(isinstance(f, relax.Function) for f in mod.functions.values()):
            self.mod = mod


def _precision(args, target):
    """A detector's precision plan (:func:`resolve_precision`), after the one-line errors of the int8
    options (``--keep-fp32`` counts a model's layers; a detector's are ``--fp32-layers``)."""
    _int8_options(args)
    if args.keep_fp32 is not None:
        raise CLIError(
            "--keep-fp32 counts a model file's layers; a detector's layers are kept in fp32 with "
            "--fp32-layers (e.g. box_predictor,mask_predictor)"
        )
    return resolve_precision(args, target)


def _checked_precision(args, target, detector: bool):
    """A detector's :func:`_precision`; for a model file, its own one-line errors (its existence,
    the options of detector names) and those of the precision options, None: its precision is
    resolved once it is imported (:func:`resolve_precision` of the model: a QDQ model keeps its own)."""
    if detector:
        return _precision(args, target)
    check_model_file(Path(args.model), _detector.alternatives())
    _detector.reject_detector_options(args)
    _int8_options(args)
    check_precision_arguments(args)
    return None


def _int8_options(args) -> dict:
    """``calibration`` and ``keep_fp32`` of an int8 build from ``--calibrate`` and ``--keep-fp32``
    (only with ``--precision int8``, a directory and integers: else one line)."""
    for flag, value in (("--calibrate DIR", args.calibrate), ("--keep-fp32 POSITIONS", args.keep_fp32)):
        if value is not None and args.precision != "int8":
            raise CLIError(f"{flag} applies to --precision int8")
    if args.calibrate is not None and not Path(args.calibrate).is_dir():
        raise CLIError(f"--calibrate: {args.calibrate!r} is not a directory of photos")
    try:
        keep = [int(p) for p in args.keep_fp32.split(",")] if args.keep_fp32 else []
    except ValueError:
        raise CLIError(
            f"--keep-fp32: expected comma-separated integers such as 0,-1, got {args.keep_fp32!r}"
        ) from None
    return {"calibration": args.calibrate, "keep_fp32": keep}


def _mode(args) -> str:
    """A model file's build mode: ``exact`` (``--exact``: direct convolutions, as the framework's)
    or ``fast`` (the default: 3x3 convolutions as Winograd where it pays)."""
    return "exact" if getattr(args, "fast", None) is False else "fast"


def _build_options(args, plan) -> dict:
    """The pipeline's options of a model file's build: :func:`_int8_options` for a calibrated int8
    build, no Winograd in the exact mode, and the Winograd weights computed at load
    (``weights_at_load``: the library holds the 3x3 weights)."""
    options = _int8_options(args) if plan.precision == "int8" and not plan.quantized else {}
    # a library stores the 3x3 weights, not their Winograd transforms (computed when it is loaded)
    options["weights_at_load"] = True
    return {**options, "winograd": 0} if _mode(args) == "exact" else options


def _build(mod, target, records, plan, build_options=None):
    """The pipeline's build without its own layout conversion (``--desired-layout`` decided it):
    ``(Built, the last Relax module)``; the records' coverage is printed by :func:`main`, not
    reported by the records. ``build_options``: :func:`_build_options`."""
    import tvm

    from ..pipeline import build

    instrument = tvm.ir.instrument.pass_instrument(_LastRelaxModule)()
    ctx = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(
        opt_level=ctx.opt_level,
        required_pass=list(ctx.required_pass),
        disabled_pass=list(ctx.disabled_pass),
        config=dict(ctx.config),
        instruments=[*ctx.instruments, instrument],
    ):
        built = build(mod, target, tuning_records=records, layout=None, precision=plan,
                      **(build_options or {}))
    return built, instrument.mod


def _printed_by_main(_coverage) -> None:
    """The records' report in ``compile``: :func:`main` prints the coverage the build returns."""


def _build_keeping_layouts(imported, mod, layouts, target, records, progress, plan, build_options=None):
    """:func:`_build` of ``mod``; where that fails and ``mod`` is ``imported`` converted, the
    conversion again with every converted op checked to legalize (the ops that do not keep their
    layout, with a note), and its build. ``(built, the last Relax module, the module built)``."""
    from ..passes.convert_layout_where_possible import (
        ConvertLayoutWherePossible,
        legalize_check,
        native_stderr_dropped_on_failure,
    )
    from ..target import describe

    try:
        with native_stderr_dropped_on_failure():
            return (*_build(mod, target, records, plan, build_options), mod)
    except Exception as err:  # noqa: BLE001
        failure = CLIError(f"build for target {describe(target)} failed: {first_line(err)}")
    if not layouts or mod.same_as(imported):
        raise failure from None
    notes = []
    checked = ConvertLayoutWherePossible(
        layouts, report=notes.append, check=legalize_check(target)
    )(imported)
    if not notes:  # every converted op legalizes: the failure is not the layout's
        raise failure from None
    for note in notes:
        progress.note(note)
    progress(f"build for {describe(target)}, those ops in their own layout")
    try:
        return (*_build(checked, target, records, plan, build_options), checked)
    except Exception as err:  # noqa: BLE001
        raise CLIError(f"build for target {describe(target)} failed: {first_line(err)}") from None


def _export(executable, out: Path, target, link_note, progress) -> None:
    """The library written to ``out`` (a one-line error where it cannot be linked)."""
    from ..linking import export_library
    from ..target import describe

    try:
        export_library(executable, out, target)
    except Exception as err:  # noqa: BLE001
        raise CLIError(
            f"cannot link {str(out)!r} for {describe(target)}: {first_line(err)} "
            "(use -o NAME.tar for a cross target without a cross compiler)"
        ) from None
    if link_note:
        progress.note(f"note: {link_note}")


def main(args) -> int:
    from ._pass_times import recorded

    with recorded(args.verbose) as pass_times:
        code = _main(args)
    if pass_times is not None:
        print("\n".join(pass_times.lines()))
    return code


def _main(args) -> int:
    from .._version import __version__
    from ..linking import choose_library
    from ..profiling import kernel_signatures
    from ..runtime.artifact_check import RECORD_KEY, library_record
    from ..target import describe, target_config

    t_start = time.perf_counter()
    target = resolve_target(args.target)
    options = model_options(args, target)
    formats = dump_formats(args.dump_code)
    out, link_note = choose_library(output_path(args.output, "-o", LIBRARY_SUFFIXES), target)
    detector = _detector.is_detector(args.model)
    plan = _checked_precision(args, target, detector)
    if detector:
        layouts, layout_name, _ = options
        layout = layout_name if layouts else "NCHW"
        return _detector.compile_main(args, target, out, layout, t_start, link_note, plan)
    times = {}
    with progress_session(args.quiet) as progress:
        records = open_records(args.tuning_records, target, report=_printed_by_main)
        imported, mod, layout_name = _import_and_convert(args, options, progress, times)
        plan = resolve_precision(args, target, imported, progress.note)
        if plan.precision == "int8" and not plan.quantized:
            check_int8_calibration(Path(args.model), imported)
        progress(f"build for {describe(target)}")
        t0 = time.perf_counter()
        # the built module also gives the kernels' signatures, for run --rpc --profile
        built, tir_mod, mod = _build_keeping_layouts(
            imported, mod, options[0], target, records, progress,
            plan, _build_options(args, plan),
        )
        times["build_s"] = time.perf_counter() - t0
        executable = built.executable
        coverages = [built.coverage] if built.coverage is not None else []
        symbolic = [built.symbolic] if built.symbolic is not None else []
        progress(f"export {out}")
        t0 = time.perf_counter()
        _export(executable, out, target, link_note, progress)
        times["export_s"] = time.perf_counter() - t0
        dumps = write_dumps(out, formats, mod, tir_mod, executable)
    times = add_total(times, t_start, args.startup_s)
    meta = {
        "target": target_config(target),
        "layout": layout_name,
        "mode": _mode(args),
        **plan.metadata(),
        "inputs": signature(mod),
        "times": times,
        "kernels": kernel_signatures(tir_mod) if tir_mod is not None else [],
        "versions": {"tvm-roialign": __version__, "tvm": _tvm_version()},
    }
    if records is not None:
        meta["tuning"] = {
            "records": str(args.tuning_records),
            "tuned": sorted({name for c in coverages for name in c.tuned}),
            "default_faster": sorted({name for c in coverages for name in c.default_faster}),
            "untuned": sorted({name for c in coverages for name in c.untuned}),
            "expected_gain_ms": sum(c.gain_s for c in coverages) * 1e3,
        }
    for coverage in symbolic:
        meta["symbolic_shapes"] = {
            "served": coverage.served,
            "fell_back": [{"kernel": k, "why": why} for k, why in coverage.fell_back],
        }
    meta[RECORD_KEY] = library_record(out)
    Path(f"{out}.json").write_text(json.dumps(meta, indent=2))
    extra = f"; wrote {', '.join(dumps)}" if dumps else ""
    print_coverage(coverages)
    for coverage in symbolic:
        print(coverage)
    print(
        f"compiled {args.model} -> {out} ({describe(target)}, layout {layout_name}, "
        f"{precision_label(meta)}, {meta['mode']}, {size_text(out.stat().st_size)}) in "
        f"{format_times(times)}{extra}"
    )
    print_precision_line(args)
    return 0


def _tvm_version() -> str:
    import tvm

    return str(tvm.__version__)
