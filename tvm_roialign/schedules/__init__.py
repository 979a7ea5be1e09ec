"""The package's schedule rules (dlight style: ``ScheduleRule.apply(func, target, tunable)``), in
sub-packages by concern: :mod:`.roi_align` (RoIAlign's rules and its hand-scheduled adaptive-grid
kernel, applied by :mod:`tvm_roialign.strategies` when an op is legalized), :mod:`.contraction` (the
fp32 conv and matmul rules and the register-tiled contraction they share), :mod:`.lowp` (the bf16 and
int8 contraction rules) and :mod:`.intrin` (their 32 x 32 block micro-kernels as TensorIntrins, one
file per instruction family). What every rule shares stays here: the guard and helpers
(:mod:`.base`), the target's vector width, registers and caches (:mod:`.target_info`), vectorizable
math (:mod:`.vector_math`), and the general rules (:mod:`.elementwise`, :mod:`.row_reduction`,
:mod:`.transpose`, :mod:`.fallback`).

Each model rule recognizes one kind of fused PrimFunc and returns a schedule, or None to let the next
rule try. All are :class:`~.base.CPURule` subclasses (llvm targets only, a fresh schedule handed to
their ``schedule(sch, func, target)``; ``apply`` returns None for anything that is not a TIR PrimFunc
and for a target the rule does not serve). :func:`default_rules` is the ordered list the pipeline
applies (first match wins), ending with :class:`CPUDefault`, which schedules anything left. Tiles and
vector lanes come from the target (:func:`~.target_info.cpu_info`), never from the machine the
compiler runs on.

==============================  ========================================================================
rule                            what
==============================  ========================================================================
:class:`BF16Contraction`       bf16 conv2d / matmul (``precision="bf16"``): AMX, AVX512-BF16, ARM bfdot
:class:`Int8Contraction`       int8 conv2d / matmul (``precision="int8"``): AMX, VNNI, AVX2, ARM dot
:class:`Conv2DNHWC`             NHWC conv2d + epilogue: register tile, packed constant weights
:class:`DepthwiseConv2DNHWC`    NHWC depthwise conv2d + epilogue: taps unrolled over a channel vector
:class:`GroupedConv2DNHWC`      grouped NHWC conv2d + epilogue: a register tile per group, packed weights
:class:`Matmul`                 dense / matmul / batch matmul + epilogue: register tile, packed weights,
                                reduction chunks for long reductions
:class:`RowReduction`          softmax, layer norm (reductions over a row's last axis) + epilogue, row
                                by row: one parallel step per row, vector partial sums, exp once
:class:`WinogradTransforms`     input / output transforms of a Winograd conv (unrolled tile points)
:class:`Elementwise`            functions without reductions (elementwise, pad, slice, concat)
:class:`CPUDefault`             everything else (fallback)
==============================  ========================================================================

Functions marked ``tirx.is_scheduled`` (RoIAlign's strategies, MetaSchedule's tuned functions) are
never offered to the rules.
"""

from __future__ import annotations

from .base import CPURule
from .contraction.conv2d_nhwc import Conv2DNHWC
from .contraction.depthwise import DepthwiseConv2DNHWC
from .contraction.grouped import GroupedConv2DNHWC
from .contraction.matmul import Matmul
from .contraction.winograd import WinogradTransforms
from .elementwise import Elementwise
from .fallback import CPUDefault
from .lowp.bf16 import BF16Contraction
from .lowp.int8 import Int8Contraction
from .row_reduction import RowReduction
from .target_info import CPUInfo, cpu_info


def default_rules() -> list:
    """The rules :func:`tvm_roialign.pipeline.cpu_pipeline` applies, in order."""
    return [
        BF16Contraction(),
        Int8Contraction(),
        Conv2DNHWC(),
        DepthwiseConv2DNHWC(),
        GroupedConv2DNHWC(),
        Matmul(),
        RowReduction(),
        WinogradTransforms(),
        Elementwise(),
        CPUDefault(),
    ]


__all__ = [
    "BF16Contraction",
    "CPUDefault",
    "CPUInfo",
    "CPURule",
    "Conv2DNHWC",
    "DepthwiseConv2DNHWC",
    "Elementwise",
    "GroupedConv2DNHWC",
    "Int8Contraction",
    "Matmul",
    "RowReduction",
    "WinogradTransforms",
    "cpu_info",
    "default_rules",
]
