"""The phases of the CPU build pipeline that come before and after tuning: the graph rewrites, legalize
and fuse, layout-free weights (phases 1-3, :func:`prepare_pipeline`) and the default schedule rules
(phase 5, :func:`cpu_schedule_pass`).

They live apart from :mod:`tvm_roialign.pipeline`, which composes them with the tuned schedules of
phase 4 (:mod:`tvm_roialign.tuning`), so that tuning can extract its tasks and measure its
baselines with the same phases without importing the pipeline that imports it.
"""

from __future__ import annotations

import tvm
from tvm import relax

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
) -> list:
    from .passes import (
        BoundConstantTakes,
        ConvertLayoutWherePossible,
        FoldBatchNorm,
        FoldConstantNumPy,
        PadChannels,
        WinogradConv2D,
        desired_layouts,
    )
    from .schedules import cpu_info

    passes = [BoundConstantTakes()]
    if layout is not None:
        # the convolutions, and RoIAlign so that no transpose sits between them; where the
        # conversion fails, that region keeps its layout (a warning says so)
        passes.append(ConvertLayoutWherePossible(desired_layouts(layout)))
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
    ]
    if pad_channels:
        passes.append(PadChannels(multiple=cpu_info(target).lanes()))
    if winograd:
        passes.append(WinogradConv2D(tile=winograd, reference_side=reference_side))
    return passes


def prepare_pipeline(
    target: tvm.target.Target,
    *,
    layout: str | None = "NHWC",
    fold_batch_norm: bool = True,
    pad_channels: bool = True,
    winograd: int = 4,
    reference_side: int = 320,
) -> tvm.transform.Pass:
    """Phases 1-3 of :func:`~tvm_roialign.pipeline.cpu_pipeline` for the llvm ``target``: what
    schedules (and tuning records) apply to."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

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
                ),
                # 2. legalize and fuse
                *cpu_generic.library_dispatch_passes(target),
                *cpu_generic.legalize_passes(target),
                # 3. constant weights are layout-free
                relax.transform.AttachAttrLayoutFreeBuffers(),
            ]
            return tvm.transform.Sequential(phases)(mod)

    return prepare


__all__ = ["cpu_schedule_pass", "prepare_pipeline"]
