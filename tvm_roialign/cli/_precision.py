"""``--precision`` and ``--fp32-layers`` (``compile`` and ``maskrcnn``): parsed, checked with
one-line errors, resolved for the target (``auto``)."""

from __future__ import annotations

import sys

from ._common import CLIError

HELP_PRECISION = (
    "fp32, bf16 (convolutions and matmuls in bf16 with fp32 accumulation, on AMX or AArch64 bf16; "
    "elsewhere fp32, with a note saying why), int8 (quantized convolutions and matmuls calibrated "
    "on photos, --calibrate, on AMX-INT8, AVX512-VNNI, AVX-VNNI, AVX2 or the AArch64 dot product; "
    "elsewhere fp32, with a note) or auto (bf16 where the target has AMX bf16, else fp32; the "
    "summary says which); an ONNX QDQ model keeps its own int8 quantization"
)


#: ``--precision``'s help in ``maskrcnn``, which runs the detector in pieces that int8 does not calibrate
HELP_PIECES_PRECISION = (
    "fp32, bf16 (convolutions and matmuls in bf16 with fp32 accumulation, on AMX or AArch64 bf16; "
    "elsewhere fp32, with a note saying why), int8 (the detector as one artifact calibrated on "
    "--calibrate's photos, judged against eager by the int8 criterion, docs/int8.md) or auto (bf16 "
    "where the target has AMX bf16, else fp32)"
)


def add_precision_arguments(p, detector: bool = True, pieces: bool = False) -> None:
    """``--precision`` and (``detector``) ``--fp32-layers``; ``pieces``: ``maskrcnn``'s help."""
    p.add_argument("--precision", default="fp32", metavar="{fp32,bf16,int8,auto}",
                   help=HELP_PIECES_PRECISION if pieces else HELP_PRECISION)
    if detector:
        from ..precision.layers import DEFAULT_FP32_LAYERS, FP32_LAYERS

        p.add_argument(
            "--fp32-layers",
            default=None,
            metavar="LAYERS",
            help="a bf16 or int8 detector's layers kept in fp32, by torchvision module: 'none' or a "
            f"comma-separated list of {', '.join(FP32_LAYERS)} (default: "
            + "; ".join(f"{k} {','.join(v)}" for k, v in DEFAULT_FP32_LAYERS.items())
            + "; see docs/precision.md)",
        )


def check_precision_arguments(args) -> None:
    """A one-line error for a ``--precision`` or ``--fp32-layers`` value that is not one of the
    choices (before anything is built)."""
    from ..precision.layers import parse_fp32_layers
    from ..precision.policy import PRECISION_CHOICES

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


def resolve_precision(args, target, model=None, note=None):
    """The build's :class:`~tvm_roialign.precision.PrecisionPlan`, resolved once here
    (:func:`~tvm_roialign.precision.resolve`; bf16 only where it runs faster than fp32) and handed
    down to the build: its notes to ``note`` (default: stderr, unless ``-q``); for ``auto``, what it
    chose in ``args.precision_line`` (the summary prints it). ``model``: the imported model file (an
    ONNX QDQ model keeps its own quantization; ``--calibrate`` and ``--keep-fp32`` have nothing to
    calibrate or keep in it: a one-line error)."""
    from ..precision.policy import resolve

    check_precision_arguments(args)
    plan = resolve(target, args.precision, model, avx512_bf16=False)
    if plan.quantized and (getattr(args, "calibrate", None) is not None or getattr(args, "keep_fp32", None)):
        raise CLIError(
            f"--calibrate and --keep-fp32 apply to fp32 models: {args.model!r} is already quantized "
            "(ONNX QDQ) and keeps its own scales"
        )
    args.precision_line = plan.summary
    for line in plan.notes:
        if note is not None:
            note(f"note: {line}")
        elif not args.quiet:
            print(f"note: {line}", file=sys.stderr)
    return plan


def print_precision_line(args) -> None:
    """What ``--precision auto`` chose, as a line of the summary (nothing otherwise)."""
    line = getattr(args, "precision_line", None)
    if line:
        print(line)


def precision_label(meta: dict) -> str:
    """The precision in ``compile``'s summary line: ``meta``'s, and a QDQ model's quantization."""
    label = meta.get("precision", "fp32")
    return f"{label}, quantized ONNX QDQ" if meta.get("quantization") == "qdq" else label
