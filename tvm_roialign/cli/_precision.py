"""``--precision`` and ``--fp32-layers`` (``compile`` and ``maskrcnn``): parsed, checked with
one-line errors, resolved for the target (``auto``)."""

from __future__ import annotations

import sys

from ._common import CLIError

HELP_PRECISION = (
    "fp32, bf16 (convolutions and matmuls in bf16 with fp32 accumulation, on AMX; "
    "a target without AMX builds fp32, with a note saying why), int8 (quantized "
    "convolutions and matmuls calibrated on photos, --calibrate, on AMX-INT8, AVX512-VNNI, AVX2 or the "
    "AArch64 dot product; detectors with compile NAME) or "
    "auto (bf16 where the target has AMX bf16, else fp32; the summary says which)"
)


#: ``--precision``'s help in ``maskrcnn``, which runs the detector in pieces that int8 does not calibrate
HELP_PIECES_PRECISION = (
    "fp32, bf16 (convolutions and matmuls in bf16 with fp32 accumulation, on AMX; a target without "
    "AMX builds fp32, with a note saying why), int8 (the detector as one artifact calibrated on "
    "--calibrate's photos, judged against eager by the int8 criterion, docs/int8.md) or auto (bf16 "
    "where the target has AMX bf16, else fp32)"
)


def add_precision_arguments(p, detector: bool = True, pieces: bool = False) -> None:
    """``--precision`` and (``detector``) ``--fp32-layers``; ``pieces``: ``maskrcnn``'s help."""
    p.add_argument("--precision", default="fp32", metavar="{fp32,bf16,int8,auto}",
                   help=HELP_PIECES_PRECISION if pieces else HELP_PRECISION)
    if detector:
        from ..models.detector_precision import DEFAULT_FP32_LAYERS, FP32_LAYERS

        p.add_argument(
            "--fp32-layers",
            default=None,
            metavar="LAYERS",
            help="a bf16 or int8 detector's layers kept in fp32, by torchvision module: 'none' or a "
            f"comma-separated list of {', '.join(FP32_LAYERS)} (default: "
            f"{','.join(DEFAULT_FP32_LAYERS)}; see docs/precision.md)",
        )


def check_precision_arguments(args) -> None:
    """A one-line error for a ``--precision`` or ``--fp32-layers`` value that is not one of the
    choices (before anything is built)."""
    from ..models.detector_precision import parse_fp32_layers
    from ..pipeline_phases import PRECISION_CHOICES

    if args.precision not in PRECISION_CHOICES:
        raise CLIError(
            f"--precision must be one of {', '.join(PRECISION_CHOICES)}, got {args.precision!r}"
        )
    if getattr(args, "fp32_layers", None) is not None:
        try:
            parse_fp32_layers(args.fp32_layers, "--fp32-layers")
        except ValueError as err:
            raise CLIError(str(err)) from None


def reject_fp32_layers(args) -> None:
    """``--fp32-layers`` given with a model file: a one-line error (it names detector modules)."""
    if getattr(args, "fp32_layers", None) is not None:
        raise CLIError(
            f"--fp32-layers only applies to a detector name, not to the model file {args.model!r}"
        )


def resolve_precision(args, target) -> str:
    """The precision the build uses (:func:`~tvm_roialign.pipeline_phases.chosen_precision`):
    a note on stderr (unless ``-q``) where bf16 falls back to fp32; for ``auto``, what it chose
    in ``args.precision_line`` (the summary prints it)."""
    from ..pipeline_phases import chosen_precision

    check_precision_arguments(args)
    precision, note = chosen_precision(args.precision, target)
    args.precision_line = note if args.precision == "auto" else None
    if note and args.precision != "auto" and not args.quiet:
        print(f"note: {note}", file=sys.stderr)
    return precision


def print_precision_line(args) -> None:
    """What ``--precision auto`` chose, as a line of the summary (nothing otherwise)."""
    line = getattr(args, "precision_line", None)
    if line:
        print(line)


def model_precision(args, target, imported, progress) -> tuple[str, int | None]:
    """``(precision, qdq_weights)`` of a model file: :func:`resolve_precision`'s and None, or for an
    ONNX QDQ model its own quantization whatever ``--precision`` (int8 where the target has int8
    kernels for its weights, else fp32: fake-quant float, with a note) and its weights' largest
    magnitude; a one-line error for ``--calibrate`` and ``--keep-fp32``, which have nothing to
    calibrate or keep."""
    from ..passes.qdq_contractions import has_qdq, qdq_weight_peak
    from ..pipeline_phases import qdq_note

    if not has_qdq(imported):
        return resolve_precision(args, target), None
    if args.calibrate is not None or args.keep_fp32:
        raise CLIError(
            f"--calibrate and --keep-fp32 apply to fp32 models: {args.model!r} is already quantized "
            "(ONNX QDQ) and keeps its own scales"
        )
    args.precision_line = None
    if args.precision == "bf16":
        progress.note("note: --precision bf16: the model is already quantized (ONNX QDQ): it keeps "
                      "its own int8 quantization")
    weights = qdq_weight_peak(imported)
    note = qdq_note(target, weights)
    if note is not None:
        progress.note(f"note: {note}")
    return ("fp32" if note else "int8"), weights


def precision_label(meta: dict) -> str:
    """The precision in ``compile``'s summary line: ``meta``'s, and a QDQ model's quantization."""
    label = meta.get("precision", "fp32")
    return f"{label}, quantized ONNX QDQ" if meta.get("quantization") == "qdq" else label
