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

from .precision.qdq import int8_keeps, qdq_passes
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
    plan,
    calibration=None,
    keep_fp32=None,
    winograd_record=None,
) -> list:
    from .passes import (
        BF16Contractions,
        BoundConstantTakes,
        ConvertLayoutWherePossible,
        FoldBatchNorm,
        FoldConstantIfFoldable,
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
    if plan.quantized:
        # an ONNX QDQ model's own quantization, before constant folding makes its int8 weights fp32
        passes += qdq_passes(plan, calibration, keep_fp32, winograd=winograd, reference_side=reference_side)
    # weights in a converted layout (permute_dims of a constant) become constants: NumPy folds
    # layout and arithmetic ops on constants without compiling them, FoldConstant the rest
    # gathers of constant in-bounds indices, before and after constant folding computes them
    # (FoldConstant legalizes the gathers it meets, so those NumPy folded are bounded before it)
    passes += [
        FoldConstantNumPy(),
        BoundConstantTakes(),
        FoldConstantIfFoldable(),
        BoundConstantTakes(),
    ]
    if fold_batch_norm:
        passes.append(FoldBatchNorm())
    passes += [
        relax.transform.DecomposeOpsForInference(),
        FoldConstantIfFoldable(),
        # gathers of one constant index as slices, which fuse with their consumers
        TakesAsSlices(),
        # a transformer MLP's GELU next to its matmul's bias add, so that they fuse
        HoistActivations(),
    ]
    if plan.precision == "bf16" and not plan.quantized:
        # before the channel padding and Winograd, which would take the same convolutions
        passes.append(BF16Contractions(keep_fp32=keep_fp32))
    if plan.precision == "int8" and not plan.quantized:
        passes.append(_int8_pass(target, plan, calibration, keep_fp32 or (), winograd, reference_side))
    if pad_channels:
        passes.append(PadChannels(multiple=cpu_info(target).lanes()))
    if winograd:
        passes.append(WinogradConv2D(tile=winograd, reference_side=reference_side, record=winograd_record))
    return passes


def _int8_pass(target: tvm.target.Target, plan, calibration, keep_fp32=(), winograd=0,
               reference_side: int = 320) -> tvm.transform.Pass:
    """:class:`~tvm_roialign.passes.Int8Contractions` calibrated, when it runs, on ``calibration``
    (:func:`~tvm_roialign.precision.calibration.calibration_inputs`'s ``source``), the observed
    module built in fp32 for ``target`` (no Winograd, the layouts as they are by then) where this
    machine runs ``target``'s code, else for this machine's own CPU (:func:`_runs_here`: an AArch64
    board built on x86, or an AMX target built on a CPU without AMX, whose library would die of
    SIGILL here). The weights' range and the convs left to Winograd (``winograd``, its tile) are
    those of the plan's kernels."""
    from .codegen import compile_parallel
    from .passes import Int8Contractions
    from .precision.calibration import calibration_entry, calibration_inputs
    from .precision.policy import FP32
    from .target import parse_target

    keep_call = int8_keeps(plan.kernels, winograd, reference_side)
    observed = target if _runs_here(target) else parse_target("native")

    def run(mod: tvm.IRModule):
        with observed:
            phases = [
                prepare_pipeline(observed, layout=None, winograd=0, precision=FP32),
                cpu_schedule_pass(),
                *lowering_phases(observed),
            ]
            executable = compile_parallel(mod, observed, tvm.transform.Sequential(phases))
        vm = relax.VirtualMachine(executable, tvm.cpu())
        entry = vm[calibration_entry(mod)]
        return lambda *arrays: entry(*(tvm.runtime.tensor(a) for a in arrays))

    return Int8Contractions(
        inputs=lambda mod: calibration_inputs(mod, calibration), run=run, keep_fp32=keep_fp32,
        weight_limit=plan.weight_limit, keep_call=keep_call,
    )


def _runs_here(target: tvm.target.Target) -> bool:
    """Whether code for llvm ``target`` runs on this machine: the same architecture, and every CPU
    feature LLVM reports for ``target`` one this machine's CPU has too."""
    from .schedules import cpu_info
    from .target import is_cross, parse_target

    if is_cross(target):
        return False
    return cpu_info(target).features <= cpu_info(parse_target("native")).features


def prepare_pipeline(
    target: tvm.target.Target,
    *,
    layout: str | None = "NHWC",
    fold_batch_norm: bool = True,
    pad_channels: bool = True,
    winograd: int = 4,
    reference_side: int = 320,
    precision="fp32",
    calibration=None,
    keep_fp32=None,
    winograd_record=None,
) -> tvm.transform.Pass:
    """Phases 1-3 of :func:`~tvm_roialign.pipeline.cpu_pipeline` for the llvm ``target``: what
    schedules (and tuning records) apply to. ``precision``: the build's
    :class:`~tvm_roialign.precision.PrecisionPlan`, or what is asked for (``"fp32"``, ``"bf16"``,
    ``"int8"``, ``"auto"``), resolved on the module when the pass runs
    (:func:`~tvm_roialign.precision.resolve`; its notes as warnings). bf16: constant-weight
    convolutions and matmuls as bf16 contractions (:class:`~tvm_roialign.passes.BF16Contractions`);
    int8: as int8 contractions calibrated on ``calibration`` (:func:`_int8_pass`). ``keep_fp32``:
    for bf16 a predicate of a layer's ``[K, N]`` weight that leaves it in fp32, for int8 the
    positions of the contractions left in fp32
    (:func:`~tvm_roialign.precision.check_keep_fp32`). An ONNX QDQ model keeps its own
    quantization (:func:`~tvm_roialign.precision.qdq.qdq_passes`): int8 kernels with its scales
    where the target has kernels for its weights, else float as imported (fake-quant); nothing
    calibrated. ``winograd_record``: a :class:`~tvm_roialign.passes.WinogradWeights` the Winograd
    rewrite writes its transformed weights into (phase 6 computes them at load instead of storing
    them: ``cpu_pipeline``'s ``weights_at_load``)."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from .precision.policy import PrecisionPlan, check_precision

    if not isinstance(precision, PrecisionPlan):
        check_precision(precision)

    @tvm.transform.module_pass(opt_level=0, name="tvm_roialign.CPUPrepare")
    def prepare(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        plan = precision if isinstance(precision, PrecisionPlan) else _resolved(target, precision, mod)
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
                    plan=plan,
                    calibration=calibration,
                    keep_fp32=keep_fp32,
                    winograd_record=winograd_record,
                ),
                # 2. legalize and fuse
                *cpu_generic.library_dispatch_passes(target),
                *cpu_generic.legalize_passes(target),
                # 3. constant weights are layout-free
                relax.transform.AttachAttrLayoutFreeBuffers(),
            ]
            return tvm.transform.Sequential(phases)(mod)

    return prepare


def _resolved(target: tvm.target.Target, precision: str, mod: tvm.IRModule):
    """:func:`~tvm_roialign.precision.resolve` of a build that was given no plan, its notes as
    warnings."""
    from .precision.policy import resolve

    plan = resolve(target, precision, mod)
    for note in plan.notes:
        warnings.warn(note, stacklevel=4)
    return plan


def lowering_phases(target) -> list:
    """TVM's CPU lowering, and right after its memory plan (``StaticPlanBlockMemory``) each branch's
    storages allocated in the branch and storages of symbolic size shared across sizes; the build's
    and int8 calibration's."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from .passes import DefineBranchStorages, ShareSymbolicStorage

    finalize = cpu_generic.finalize_passes(target)
    names = [p.info.name for p in finalize]
    at = names.index("StaticPlanBlockMemory") + 1 if "StaticPlanBlockMemory" in names else 0
    return [*cpu_generic.dataflow_lower_passes(target), *finalize[:at], DefineBranchStorages(),
            ShareSymbolicStorage(), *finalize[at:]]


__all__ = ["cpu_schedule_pass", "lowering_phases", "prepare_pipeline"]
