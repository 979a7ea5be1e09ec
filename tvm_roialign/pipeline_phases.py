"""The phases of the CPU build pipeline that come before and after tuning: the graph rewrites, legalize
and fuse, layout-free weights (phases 1-3, :func:`prepare_pipeline`) and the default schedule rules
(phase 5, :func:`cpu_schedule_pass`).

They live apart from :mod:`tvm_roialign.pipeline`, which composes them with the tuned schedules of
phase 4 (:mod:`tvm_roialign.tuning`), so that tuning can extract its tasks and measure its
baselines with the same phases without importing the pipeline that imports it.
"""

from __future__ import annotations

import warnings

import tvm
from tvm import relax

from .precision.qdq import int8_keeps, qdq_note, qdq_passes
from .schedules import default_rules


def cpu_schedule_pass(rules=None) -> tvm.transform.Pass:
    """``ApplyDefaultSchedule`` with ``rules`` (default: :func:`default_rules`)."""
    from tvm.s_tir.dlight.base.transform import ApplyDefaultSchedule

    return ApplyDefaultSchedule(*(rules if rules is not None else default_rules()))


def _graph_passes(
    target: tvm.target.Target,
    *,
    layout: str | None,
    fold_batch_norm: bool,
    pad_channels: bool,
    winograd: int,
    reference_side: int,
    precision: str = "fp32",
    calibration=None,
    keep_fp32=None,
    qdq_weights: int | None = None,
) -> list:
    from .passes import (
        BF16Contractions,
        BoundConstantTakes,
        ConvertLayoutWherePossible,
        FoldBatchNorm,
        FoldConstantNumPy,
        HoistActivations,
        PadChannels,
        TakesAsSlices,
        WinogradConv2D,
        desired_layouts,
    )
    from .schedules import cpu_info

    passes = [BoundConstantTakes()]
    if layout is not None:
        # the convolutions, and RoIAlign so that no transpose sits between them; where the
        # conversion fails, that region keeps its layout (a warning says so)
        passes.append(ConvertLayoutWherePossible(desired_layouts(layout)))
    if qdq_weights is not None:
        # an ONNX QDQ model's own quantization, before constant folding makes its int8 weights fp32
        passes += qdq_passes(target, precision, calibration, keep_fp32, qdq_weights,
                             winograd=winograd, reference_side=reference_side)
    # weights in a converted layout (permute_dims of a constant) become constants: NumPy folds
    # layout and arithmetic ops on constants without compiling them, FoldConstant the rest
    # gathers of constant in-bounds indices, before and after constant folding computes them
    # (FoldConstant legalizes the gathers it meets, so those NumPy folded are bounded before it)
    passes += [
        FoldConstantNumPy(),
        BoundConstantTakes(),
        relax.transform.FoldConstant(),
        BoundConstantTakes(),
    ]
    if fold_batch_norm:
        passes.append(FoldBatchNorm())
    passes += [
        relax.transform.DecomposeOpsForInference(),
        relax.transform.FoldConstant(),
        # gathers of one constant index as slices, which fuse with their consumers
        TakesAsSlices(),
        # a transformer MLP's GELU next to its matmul's bias add, so that they fuse
        HoistActivations(),
    ]
    if precision == "bf16" and qdq_weights is None and bf16_supported(target):
        # before the channel padding and Winograd, which would take the same convolutions
        passes.append(BF16Contractions(keep_fp32=keep_fp32))
    if precision == "int8" and qdq_weights is None and int8_supported(target):
        passes.append(_int8_pass(target, calibration, keep_fp32 or (), winograd, reference_side))
    if pad_channels:
        passes.append(PadChannels(multiple=cpu_info(target).lanes()))
    if winograd:
        passes.append(WinogradConv2D(tile=winograd, reference_side=reference_side))
    return passes


def int8_kind(target: tvm.target.Target) -> str | None:
    """The int8 kernels of ``target`` (:func:`~.schedules.int8_contraction.int8_instructions`); under
    :func:`tvm_roialign.testing.generic_int8`, where it has none, those whose quantization the
    generic build copies (``like``'s), else None."""
    from .schedules.int8_contraction import int8_instructions

    kind = int8_instructions(target)
    return GENERIC_INT8["like"] if kind is None and GENERIC_INT8["on"] else kind


def _int8_pass(target: tvm.target.Target, calibration, keep_fp32=(), winograd=0,
               reference_side: int = 320) -> tvm.transform.Pass:
    """:class:`~tvm_roialign.passes.Int8Contractions` calibrated, when it runs, on ``calibration``
    (:func:`~tvm_roialign.precision.calibration.calibration_inputs`'s ``source``), the observed
    module built in fp32 for ``target`` (no Winograd, the layouts as they are by then) where this
    machine runs ``target``'s code, else for this machine's own CPU (:func:`_runs_here`: an AArch64
    board built on x86, or an AMX target built on a CPU without AMX, whose library would die of
    SIGILL here). The weights' range and the convs left to Winograd (``winograd``, its tile) are
    those of ``target``'s kernels (:func:`int8_kind`)."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from .precision.calibration import calibration_entry, calibration_inputs
    from .passes import Int8Contractions
    from .schedules.int8_contraction import int8_weight_limit
    from .target import parse_target

    kind = int8_kind(target)
    keep_call = int8_keeps(kind, winograd, reference_side)
    observed = target if _runs_here(target) else parse_target("native")

    def run(mod: tvm.IRModule):
        with observed:
            phases = [
                prepare_pipeline(observed, layout=None, winograd=0),
                cpu_schedule_pass(),
                *cpu_generic.dataflow_lower_passes(observed),
                *cpu_generic.finalize_passes(observed),
            ]
            executable = tvm.compile(mod, target=observed, relax_pipeline=tvm.transform.Sequential(phases))
        vm = relax.VirtualMachine(executable, tvm.cpu())
        entry = vm[calibration_entry(mod)]
        return lambda *arrays: entry(*(tvm.runtime.tensor(a) for a in arrays))

    return Int8Contractions(
        inputs=lambda mod: calibration_inputs(mod, calibration), run=run, keep_fp32=keep_fp32,
        weight_limit=int8_weight_limit(kind), keep_call=keep_call,
    )


def _runs_here(target: tvm.target.Target) -> bool:
    """Whether code for llvm ``target`` runs on this machine: the same architecture, and every CPU
    feature LLVM reports for ``target`` one this machine's CPU has too."""
    from .schedules import cpu_info
    from .target import is_cross, parse_target

    if is_cross(target):
        return False
    return cpu_info(target).features <= cpu_info(parse_target("native")).features


#: the ``precision`` values a build takes
PRECISIONS = ("fp32", "bf16", "int8")


#: the ``precision`` values of the user-facing builds: :data:`PRECISIONS` and ``auto``
#: (:func:`auto_precision`)
PRECISION_CHOICES = (*PRECISIONS, "auto")


def auto_precision(target: tvm.target.Target) -> tuple[str, str]:
    """``(precision, why)`` of ``precision="auto"``: the fastest precision ``target``'s matrix
    units serve, bf16 where it has AMX bf16; fp32 elsewhere, also with AVX512-BF16 alone, whose
    bf16 kernels run slower than fp32, and on AArch64 with bf16, whose ``bfdot`` kernels were
    checked on an emulated board only, where no speed was measured (docs/precision.md)."""
    from .schedules import cpu_info

    if target.kind.name != "llvm":
        return "fp32", f"target kind {target.kind.name} has no bf16 kernels here"
    info = cpu_info(target)
    if info.has_amx_bf16:
        return "bf16", "the target has AMX bf16"
    if info.has_avx512_bf16:
        return "fp32", "the target has AVX512-BF16 but no AMX, where bf16 runs slower than fp32"
    if info.has_bf16:
        return "fp32", "the target has AArch64 bf16, where bf16 was not shown faster than fp32"
    return "fp32", "the target has no AMX bf16"


def check_keep_fp32(precision: str, keep_fp32):
    """``keep_fp32`` when it fits ``precision`` (bf16: a predicate of a layer's weight; int8: a
    sequence of integer positions or such a predicate), else a one-line ``ValueError``."""
    if precision == "bf16" and not callable(keep_fp32):
        raise ValueError("keep_fp32 of a bf16 build must be a predicate of a layer's [K, N] weight")
    if precision == "int8" and not callable(keep_fp32) and not all(isinstance(p, int) for p in keep_fp32):
        raise ValueError(
            "keep_fp32 of an int8 build must be a sequence of integer positions or a predicate of a "
            "layer's [K, N] weight"
        )
    return keep_fp32


def check_precision(precision: str) -> str:
    """``precision`` when it is one of :data:`PRECISIONS`, else a one-line ``ValueError``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def bf16_supported(target: tvm.target.Target, note: bool = True) -> bool:
    """Whether ``target`` has the bf16 instructions the bf16 kernels need (AMX: ``amx-tile``,
    ``amx-bf16``; else AVX512-BF16: ``avx512bf16``; on AArch64 ``bf16``, for ``bfdot``); without
    them, a one-line warning (``note``) that the build is fp32."""
    from .schedules.bf16_contraction import bf16_instructions

    if bf16_instructions(target) is not None:
        return True
    if note:
        from .target import describe

        warnings.warn(
            f"precision bf16: target {describe(target)} has neither AMX bf16 nor AVX512-BF16 "
            "(nor AArch64 bf16); building fp32",
            stacklevel=2,
        )
    return False


#: set by :func:`tvm_roialign.testing.generic_int8`: int8 builds on every llvm target, the int8
#: contractions left to TVM's generic schedules where the target has no int8 kernels (exact, slow),
#: quantized as the kernels ``like`` (a kind of :func:`int8_kind`; None: 8-bit weights) are
GENERIC_INT8 = {"on": False, "like": None}


def int8_supported(target: tvm.target.Target, note: bool = True) -> bool:
    """Whether ``target`` has the u8 x s8 dot products the int8 kernels need (AMX-INT8, or
    AVX512-VNNI; on AArch64 I8MM's ``usdot`` or the dot product's ``sdot``); without them, a
    one-line warning (``note``) that the build is fp32."""
    from .schedules.int8_contraction import int8_instructions

    if int8_instructions(target) is not None or (GENERIC_INT8["on"] and target.kind.name == "llvm"):
        return True
    if note:
        from .target import describe

        warnings.warn(
            f"precision int8: target {describe(target)} has neither AMX-INT8, AVX512-VNNI nor AVX2 "
            "(nor the AArch64 dot product); building fp32",
            stacklevel=2,
        )
    return False


def chosen_precision(precision: str, target: tvm.target.Target) -> tuple[str, str | None]:
    """``(precision the build uses, note)`` for the user-facing ``compile``/``compile_detector``:
    ``auto``: :func:`auto_precision`, the note saying what it chose;
    bf16 where ``target`` has AMX bf16 or AArch64 bf16 (``bfdot``); else fp32 and a one-line note
    saying why (no bf16 instructions, or AVX512-BF16 only, where the bf16 kernels run slower than
    fp32: see docs/precision.md). ``pipeline.build`` itself builds bf16 on AVX512-BF16 when asked."""
    from .schedules import cpu_info
    from .target import describe

    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {precision!r}")
    if precision == "auto":
        chosen, why = auto_precision(target)
        return chosen, f"precision auto: {chosen} ({why})"
    if check_precision(precision) == "int8":
        return _chosen_int8(target)
    if precision != "bf16":
        return precision, None
    info = cpu_info(target)
    if info.has_amx_bf16 or info.has_bf16:
        return "bf16", None
    if info.has_avx512_bf16:
        why = "has AVX512-BF16 but no AMX, where bf16 runs slower than fp32"
    else:
        why = "has no AMX, AVX512-BF16 or AArch64 bf16"
    return "fp32", f"--precision bf16: {describe(target)} {why}; building fp32"


def _chosen_int8(target: tvm.target.Target) -> tuple[str, str | None]:
    from .target import describe

    if int8_supported(target, note=False):
        return "int8", None
    return "fp32", (
        f"--precision int8: {describe(target)} has no AMX-INT8, AVX512-VNNI, AVX2 or AArch64 dot product; "
        "building fp32"
    )


def precision_metadata(precision: str, target: tvm.target.Target, qdq_weights: int | None = None) -> dict:
    """An artifact's metadata ``precision``, and the kernels' instructions: for bf16 ``amx``,
    ``avx512bf16`` or ``bfdot`` (whether running the library needs the AMX tile state), for int8
    :func:`~.schedules.int8_contraction.int8_instructions`'s. ``qdq_weights`` (not None): an ONNX
    QDQ model (``"quantization": "qdq"``) whose int8 weights reach it in magnitude: ``precision``
    int8 where ``target`` has int8 kernels that take them (:func:`qdq_note`), else fp32
    (fake-quant float, ``"int8_kernels": null``), whatever was asked."""
    from .schedules.bf16_contraction import bf16_instructions
    from .schedules.int8_contraction import int8_instructions

    if qdq_weights is not None:
        kernels = int8_instructions(target) if qdq_note(target, qdq_weights) is None else None
        return {"precision": "int8" if kernels else "fp32", "int8_kernels": kernels, "quantization": "qdq"}
    if precision == "int8":
        # "generic": TVM's own schedules (tvm_roialign.testing.generic_int8)
        return {"precision": precision, "int8_kernels": int8_instructions(target) or "generic"}
    if precision != "bf16":
        return {"precision": precision}
    return {"precision": precision, "bf16_kernels": bf16_instructions(target)}


def prepare_pipeline(
    target: tvm.target.Target,
    *,
    layout: str | None = "NHWC",
    fold_batch_norm: bool = True,
    pad_channels: bool = True,
    winograd: int = 4,
    reference_side: int = 320,
    precision: str = "fp32",
    calibration=None,
    keep_fp32=None,
) -> tvm.transform.Pass:
    """Phases 1-3 of :func:`~tvm_roialign.pipeline.cpu_pipeline` for the llvm ``target``: what
    schedules (and tuning records) apply to. ``precision="bf16"``: constant-weight convolutions
    and matmuls as bf16 contractions (:class:`~tvm_roialign.passes.BF16Contractions`) where the
    target has AMX bf16, else fp32 with a warning (:func:`bf16_supported`); ``precision="int8"``:
    as int8 contractions calibrated on ``calibration`` (:func:`_int8_pass`), where the target has
    AMX-INT8, AVX512-VNNI, AVX2 or the AArch64 dot product, else fp32 with a warning
    (:func:`int8_supported`). ``keep_fp32``: for
    bf16 a predicate of a layer's ``[K, N]`` weight that leaves it in fp32
    (``BF16Contractions(keep_fp32=...)``), for int8 the positions of the contractions left in fp32
    (:func:`check_keep_fp32`). An ONNX QDQ model (``relax.quantize`` in it) keeps its own
    quantization whatever ``precision`` (:func:`~.qdq_phase.qdq_passes`): int8 kernels with its scales where
    the target has kernels for its weights, else float as imported (fake-quant), with a warning;
    nothing calibrated."""
    check_precision(precision)
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from .passes.qdq_contractions import has_qdq, qdq_weight_peak

    @tvm.transform.module_pass(opt_level=0, name="tvm_roialign.CPUPrepare")
    def prepare(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            phases = [
                # 1. graph rewrites on Relax ops
                *_graph_passes(
                    target,
                    layout=layout,
                    fold_batch_norm=fold_batch_norm,
                    pad_channels=pad_channels,
                    winograd=winograd,
                    reference_side=reference_side,
                    precision=precision,
                    calibration=calibration,
                    keep_fp32=keep_fp32,
                    qdq_weights=qdq_weight_peak(mod) if has_qdq(mod) else None,
                ),
                # 2. legalize and fuse
                *cpu_generic.library_dispatch_passes(target),
                *cpu_generic.legalize_passes(target),
                # 3. constant weights are layout-free
                relax.transform.AttachAttrLayoutFreeBuffers(),
            ]
            return tvm.transform.Sequential(phases)(mod)

    return prepare


__all__ = [
    "PRECISIONS",
    "PRECISION_CHOICES",
    "auto_precision",
    "bf16_supported",
    "check_precision",
    "chosen_precision",
    "cpu_schedule_pass",
    "int8_kind",
    "int8_supported",
    "precision_metadata",
    "prepare_pipeline",
    "qdq_note",
]
