"""A build's precision, decided once: :func:`resolve` takes the target, the precision asked for
(``fp32``, ``bf16``, ``int8`` or ``auto``) and the model, and returns a :class:`PrecisionPlan`
(the precision the build runs, the kernels' instruction family, int8's weight range, the notes
that say why it differs from what was asked, the artifact's metadata). The caller that starts a
build (the CLI, :func:`~tvm_roialign.models.detection.compile_detector`,
:func:`~tvm_roialign.pipeline.build` called from Python) makes the plan and hands it down; the
phases read it instead of asking the target again.

What a target supports: bf16 kernels on AMX, AVX512-BF16 or AArch64 ``bfdot``
(:func:`~tvm_roialign.schedules.lowp.bf16.bf16_instructions`); int8 kernels on AMX-INT8,
AVX512-VNNI, AVX-VNNI, AVX2 or the AArch64 dot products (:func:`int8_kernels`). An ONNX QDQ model
keeps its own quantization whatever was asked: int8 where the target's kernels take its weights,
else float as imported (:func:`~tvm_roialign.precision.qdq.qdq_note`).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the CLI reads the choices before it imports TVM
    import tvm

#: the ``precision`` values a build takes
PRECISIONS = ("fp32", "bf16", "int8")

#: the ``precision`` values of the user-facing builds: :data:`PRECISIONS` and ``auto``
#: (:func:`auto_precision`)
PRECISION_CHOICES = (*PRECISIONS, "auto")

#: the precisions whose contractions leave some layers in fp32 (``keep_fp32``, ``fp32_layers``)
REDUCED = ("bf16", "int8")

#: within :func:`generic_int8`: ``(True, like)``, int8 builds on every llvm target, quantized as
#: the kernels ``like`` are (None: 8-bit weights), compiled by TVM's generic schedules
_GENERIC_INT8 = contextvars.ContextVar("tvm_roialign_generic_int8", default=(False, None))


@contextlib.contextmanager
def generic_int8(like=None):
    """Within it, ``precision="int8"`` builds int8 on any llvm target (:func:`resolve` plans it):
    where the target has no int8 kernels, TVM's generic schedules compile the same int8
    contractions (the same calibration, weights and int32 sums; many times slower), quantized as
    the kernels of the target ``like`` are (anything ``parse_target`` takes: AVX2's +-64 weights and
    fp32 Winograd convs; None: 8-bit weights). The reference the int8 kernels are held to, and an
    int8 model's accuracy measured on any CPU."""
    from ..schedules.lowp.int8 import int8_instructions
    from ..target import parse_target

    token = _GENERIC_INT8.set((True, int8_instructions(parse_target(like)) if like is not None else None))
    try:
        yield
    finally:
        _GENERIC_INT8.reset(token)


def int8_kernels(target: tvm.target.Target) -> str | None:
    """The int8 kernels of ``target``, the one name of their kind
    (:func:`~tvm_roialign.schedules.lowp.int8.int8_instructions` on llvm, None elsewhere);
    within :func:`generic_int8`, where it has none, the kind whose quantization the generic build
    copies."""
    if target.kind.name != "llvm":
        return None
    from ..schedules.lowp.int8 import int8_instructions

    kind = int8_instructions(target)
    generic, like = _GENERIC_INT8.get()
    return like if kind is None and generic else kind


def _generic(target: tvm.target.Target) -> bool:
    """Whether an int8 build of ``target`` runs on TVM's generic schedules (:func:`generic_int8`)."""
    from ..schedules.lowp.int8 import int8_instructions

    return target.kind.name == "llvm" and _GENERIC_INT8.get()[0] and int8_instructions(target) is None


@dataclass(frozen=True)
class PrecisionPlan:
    """What :func:`resolve` decided for one build.

    ``precision``: ``fp32``, ``bf16`` or ``int8``, what the build runs; ``asked``: what was asked
    for. ``kernels``: the bf16 or int8 kernels' instruction family (``amx``, ``avx512bf16``,
    ``bfdot``; ``amx``, ``avx512vnni``, ``avxvnni``, ``avx2``, ``usdot``, ``sdot``), the kind whose
    quantization int8 follows (None: 8-bit weights). ``generic``: int8 on TVM's generic schedules
    (:func:`generic_int8`). ``weight_limit``: int8 weights lie in ``[-limit, limit]``. ``notes``:
    why the build differs from what was asked (one line each; the maker of the plan shows them);
    ``summary``: what ``auto`` chose, for a summary line. ``qdq_weights``: an ONNX QDQ model's
    largest int8 weight magnitude (None: not a QDQ model)."""

    precision: str = "fp32"
    asked: str = "fp32"
    kernels: str | None = None
    generic: bool = False
    weight_limit: int = 127
    notes: tuple[str, ...] = ()
    summary: str | None = None
    qdq_weights: int | None = None

    @property
    def quantized(self) -> bool:
        """Whether the model is an ONNX QDQ model (its own quantization)."""
        return self.qdq_weights is not None

    @property
    def uses_amx(self) -> bool:
        """Whether running the library needs Linux's AMX tile state."""
        return self.precision in REDUCED and self.kernels == "amx" and not self.generic

    def metadata(self, fp32_layers=None) -> dict:
        """An artifact's metadata: ``precision``; for bf16 ``bf16_kernels``, for int8
        ``int8_kernels`` (``"generic"``: TVM's own schedules); for a QDQ model ``"quantization":
        "qdq"`` and its kernels (null: fake-quant float); ``fp32_layers`` (a detector's layers
        kept in fp32, by name) for bf16 and int8."""
        if self.quantized:
            kernels = None if self.precision == "fp32" else ("generic" if self.generic else self.kernels)
            meta = {"precision": self.precision, "int8_kernels": kernels, "quantization": "qdq"}
        elif self.precision == "int8":
            meta = {"precision": "int8", "int8_kernels": "generic" if self.generic else self.kernels}
        elif self.precision == "bf16":
            meta = {"precision": "bf16", "bf16_kernels": self.kernels}
        else:
            meta = {"precision": self.precision}
        if fp32_layers is not None and self.precision in REDUCED and not self.quantized:
            meta["fp32_layers"] = list(fp32_layers)
        return meta


#: the plan of an fp32 build of a float model
FP32 = PrecisionPlan()


def check_precision(precision: str, choices=PRECISION_CHOICES) -> str:
    """``precision`` when it is one of ``choices``, else a one-line ``ValueError``."""
    if precision not in choices:
        raise ValueError(f"precision must be one of {', '.join(choices)}, got {precision!r}")
    return precision


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


def auto_precision(target: tvm.target.Target) -> tuple[str, str]:
    """``(precision, why)`` of ``precision="auto"``: the fastest precision ``target``'s matrix
    units serve, bf16 where it has AMX bf16; fp32 elsewhere, also with AVX512-BF16 alone, whose
    bf16 kernels run slower than fp32, and on AArch64 with bf16, whose ``bfdot`` kernels were
    checked on an emulated board only, where no speed was measured (docs/precision.md)."""
    from ..schedules import cpu_info

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


def _bf16(target, avx512_bf16: bool) -> PrecisionPlan:
    from ..schedules.lowp.bf16 import bf16_instructions
    from ..target import describe

    kernels = bf16_instructions(target) if target.kind.name == "llvm" else None
    if kernels is not None and (avx512_bf16 or kernels != "avx512bf16"):
        return PrecisionPlan("bf16", "bf16", kernels)
    if kernels == "avx512bf16":
        why = "has AVX512-BF16 but no AMX, where bf16 runs slower than fp32"
    else:
        why = "has no AMX, AVX512-BF16 or AArch64 bf16"
    return PrecisionPlan("fp32", "bf16", notes=(f"precision bf16: {describe(target)} {why}; building fp32",))


def _int8(target) -> PrecisionPlan:
    from ..schedules.lowp.int8 import int8_weight_limit
    from ..target import describe

    kind, generic = int8_kernels(target), _generic(target)
    if kind is None and not generic:
        return PrecisionPlan("fp32", "int8", notes=(
            f"precision int8: {describe(target)} has no AMX-INT8, AVX512-VNNI, AVX-VNNI, AVX2 or "
            "AArch64 dot product; building fp32",
        ))
    return PrecisionPlan("int8", "int8", kind, generic, int8_weight_limit(kind))


def qdq_note(target: tvm.target.Target, weights: int = 127) -> str | None:
    """Why an ONNX QDQ model whose int8 weights reach ``weights`` in magnitude
    (:func:`~tvm_roialign.passes.qdq_contractions.qdq_weight_peak`) runs its quantized layers in
    float (fake-quant) on ``target``: it has no int8 kernels, or AVX2's, which take weights up to 64
    (ONNX Runtime's ``reduce_range``); None where its kernels take them."""
    from ..schedules.lowp.int8 import int8_weight_limit
    from ..target import describe

    kind = int8_kernels(target)
    if kind is None and not _generic(target):
        return (
            f"quantized (ONNX QDQ) model: target {describe(target)} has no int8 kernels (AMX-INT8, "
            "AVX512-VNNI, AVX-VNNI, AVX2, AArch64 dot product); its quantized layers run in float "
            "(fake-quant)"
        )
    limit = int8_weight_limit(kind)
    if weights <= limit:
        return None
    return (
        f"quantized (ONNX QDQ) model: its int8 weights reach {weights}, and the int8 kernels of target "
        f"{describe(target)} ({kind}) take up to {limit} (ONNX Runtime's quantize_static(..., "
        "reduce_range=True) keeps to it); its quantized layers run in float (fake-quant)"
    )


def _qdq(target, asked: str, weights: int) -> PrecisionPlan:
    from ..schedules.lowp.int8 import int8_weight_limit

    kind = int8_kernels(target)
    notes = ()
    if asked == "bf16":
        notes += ("precision bf16: the model is already quantized (ONNX QDQ): it keeps its own int8 "
                  "quantization, not bf16",)
    note = qdq_note(target, weights)
    notes += (note,) if note else ()
    return PrecisionPlan("fp32" if note else "int8", asked, kind, _generic(target),
                         int8_weight_limit(kind), notes, qdq_weights=weights)


def resolve(target: tvm.target.Target, asked: str = "fp32", model: tvm.IRModule | None = None, *,
            avx512_bf16: bool = True) -> PrecisionPlan:
    """The :class:`PrecisionPlan` of building ``model`` (a Relax module; None: a float model not
    imported yet, a detector) for ``target`` in the precision ``asked`` (:data:`PRECISION_CHOICES`;
    a one-line ValueError for any other). ``auto``: :func:`auto_precision`. bf16 or int8 where
    ``target`` has no kernels for it: fp32, and a note saying why. ``avx512_bf16``: bf16 asked for
    on AVX512-BF16 without AMX, where its kernels run slower than fp32, is built (Python's
    :func:`~tvm_roialign.pipeline.build`) or turned to fp32 with a note (False: the CLI and
    detectors). An ONNX QDQ ``model`` keeps its own quantization whatever was asked."""
    from ..passes.qdq_contractions import has_qdq, qdq_weight_peak

    check_precision(asked)
    if model is not None and target.kind.name == "llvm" and has_qdq(model):
        return _qdq(target, asked, qdq_weight_peak(model))
    if asked == "auto":
        chosen, why = auto_precision(target)
        plan = _bf16(target, avx512_bf16) if chosen == "bf16" else FP32
        return PrecisionPlan(
            plan.precision, "auto", plan.kernels, summary=f"precision auto: {chosen} ({why})"
        )
    if asked == "bf16":
        return _bf16(target, avx512_bf16)
    if asked == "int8":
        return _int8(target)
    return FP32


__all__ = [
    "FP32",
    "PRECISIONS",
    "PRECISION_CHOICES",
    "REDUCED",
    "PrecisionPlan",
    "auto_precision",
    "check_keep_fp32",
    "check_precision",
    "generic_int8",
    "int8_kernels",
    "qdq_note",
    "resolve",
]
