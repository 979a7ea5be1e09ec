"""The whole-model build pipeline: ``build(mod, target)`` for every model compiled by tvm-roialign.

On llvm targets (x86, AArch64) the Relax module goes through :func:`cpu_pipeline`, registered as
the named Relax pipeline ``"tvm_roialign_cpu"`` (so ``tvm.compile(mod, target,
relax_pipeline="tvm_roialign_cpu")`` works after ``import tvm_roialign``). Its phases:

1. **graph rewrites** on Relax ops, before legalization: convolutions (and RoIAlign) to NHWC,
   the layout the rules are written for (``ConvertLayout``; a no-op for an NHWC model); fold
   inference batch-norms into the convolutions in front of them
   (:class:`~tvm_roialign.passes.FoldBatchNorm`), decompose the rest
   (``DecomposeOpsForInference``), fold constants; gathers of one constant index as slices
   (:class:`~tvm_roialign.passes.TakesAsSlices`, which fuse with their consumers) and
   activations moved ahead of reshapes (:class:`~tvm_roialign.passes.HoistActivations`: a
   transformer MLP's GELU joins its matmul's epilogue); in a bf16 or int8 build (the
   :class:`~tvm_roialign.precision.PrecisionPlan` that :func:`build` is handed or resolves once),
   constant-weight convolutions and matmuls as bf16 or calibrated int8 contractions
   (:class:`~tvm_roialign.passes.BF16Contractions`, :class:`~tvm_roialign.passes.Int8Contractions`),
   and an ONNX QDQ model's quantized layers on the int8 kernels with its own scales
   (:func:`~tvm_roialign.precision.qdq.qdq_passes`); pad the output channels of constant-weight
   conv2d / matmul to a multiple of the target's vector width
   (:class:`~tvm_roialign.passes.PadChannels`); 3x3 stride-1 convolutions as Winograd
   ``F(m x m, 3x3)`` (:class:`~tvm_roialign.passes.WinogradConv2D`);
2. **legalize and fuse**: TVM's CPU library dispatch, ``LegalizeOps``, ``AnnotateTIROpPattern``,
   ``FoldConstant``, ``FuseOps``, ``FuseTIR`` (a conv and its bias / residual add / ReLU become one
   PrimFunc);
3. **mark constant weights layout-free** (``AttachAttrLayoutFreeBuffers``), so schedules may pick
   their layout;
4. **tuned schedules** (slot): ``MetaScheduleApplyDatabase`` with the records given as
   ``tuning_records``; what it schedules is marked ``tirx.is_scheduled`` and skipped below;
5. **default schedule rules** (:func:`tvm_roialign.schedules.default_rules`): register-tiled conv2d
   and matmul with packed weights and fused epilogues, elementwise, then the ``CPUDefault``
   fallback. Functions marked ``tirx.is_scheduled`` (RoIAlign's strategies) are never touched;
   the AMX kernels ask Linux for the tile state themselves
   (:class:`~tvm_roialign.passes.RequestAMXState`: a library may be run from C++);
   then kernels that came out equal (a pyramid's per-level copies) are merged
   (:class:`~tvm_roialign.passes.MergeEqualKernels`);
6. **pack weights at compile time**: ``SplitLayoutRewritePreproc`` moves the weight-packing stages
   the schedules asked for into functions of their own, :class:`~tvm_roialign.passes.FoldLayoutRewrite`
   evaluates them on the constant weights with NumPy (``FoldConstant`` takes any other form),
   ``DeadCodeElimination`` drops them; with ``weights_at_load``, the Winograd-transformed weights
   (4-5.4x their 3x3 weights) are not folded but computed when the library is loaded, from the
   3x3 weights it stores (:class:`~tvm_roialign.passes.LiftWeightTransforms`: a function
   ``load_weights`` whose results every public function takes after its own arguments;
   :class:`tvm_roialign.runtime.LoadedVM` passes them);
7. **lower** to the VM (TVM's CPU dataflow-lowering and finalization passes).

Other targets: metal without dlight's Matmul rule (:func:`_metal_pipeline`), anything else TVM's
default pipeline. :func:`bind_symbolic_vars` gives a symbolic dimension (a roi count) a static value,
so that its kernels can be tiled.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from .codegen import compile_parallel
from .host import request_amx, use_usable_cores
from .pipeline_phases import cpu_schedule_pass, lowering_phases, prepare_pipeline
from .precision.policy import check_keep_fp32
from .schedules import CPUDefault
from .target import is_cross

#: The name under which :func:`cpu_pipeline` is registered with ``tvm.relax.pipeline``.
PIPELINE_NAME = "tvm_roialign_cpu"


def cpu_pipeline(
    target: tvm.target.Target | None = None,
    *,
    tuning_records=None,
    pack_weights: bool = True,
    rules=None,
    symbolic_report=None,
    weights_at_load: bool = False,
    **graph_options,
) -> tvm.transform.Pass:
    """The llvm build pipeline (see the module docstring for its phases).

    Parameters
    ----------
    target : tvm.target.Target or None
        The llvm target; None: the target in scope when the pass runs (``tvm.compile`` sets it).
    tuning_records : str, os.PathLike, tvm_roialign.tuning.TuningRecords, Pass or None
        A MetaSchedule database directory (``tvm-roialign tune``, :func:`tvm_roialign.tuning.tune`)
        or its :class:`~tvm_roialign.tuning.TuningRecords`; its records schedule the functions
        they cover, the default rules the rest (the coverage goes to the records' ``report``).
        Or the phase-4 pass itself (:func:`tvm_roialign.tuning.apply_database_pass`, which says
        where the coverage goes; :func:`build` makes one).
    pack_weights : bool
        Phase 6 (False: the packing stages stay inside the kernels, run at every call; for tests).
    rules : list of ScheduleRule or None
        Phase 5 rules (default :func:`tvm_roialign.schedules.default_rules`).
    symbolic_report : callable(SymbolicCoverage) or None
        Called after phase 5 when kernels have symbolic shapes: which the rules tiled, vectorized
        and parallelized, and which fell back and why
        (:class:`~tvm_roialign.schedules.symbolic_report.SymbolicCoverage`).
    weights_at_load : bool
        Phase 6: the Winograd weights computed by the library's ``load_weights``, not stored
        (:func:`_weight_phases`). False: stored, the public functions' signatures kept.
    graph_options
        Phases 1-3 (:func:`prepare_pipeline`): ``layout`` of the convolutions (and RoIAlign)
        after phase 1 (``"NHWC"``, the layout the conv rules and Winograd are written for;
        ``ConvertLayout`` adds transposes at the edges of an NCHW model and folds those that
        cancel; None keeps the model's layouts), ``fold_batch_norm`` and ``pad_channels``
        (True), ``winograd``: output tile of the Winograd rewrite of 3x3 convolutions (4:
        ``F(4x4, 3x3)``, 2, 5, 6, a tuple of them: each conv takes the one of fewest products, or
        0: off), ``reference_side``: the image side (320) at which a conv
        of symbolic size is judged worth Winograd (one library serves every size),
        ``precision``: a :class:`~tvm_roialign.precision.PrecisionPlan`, or ``"fp32"``, ``"bf16"``,
        ``"int8"`` (calibrated on ``calibration``) or ``"auto"``, resolved when the pass runs.
    """

    from .passes import MergeEqualKernels, RequestAMXState, WinogradWeights

    record = graph_options["winograd_record"] = WinogradWeights() if weights_at_load else None
    prepare = prepare_pipeline(target, **graph_options) if target is not None else None

    @tvm.transform.module_pass(opt_level=0, name="tvm_roialign.CPUPipeline")
    def pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        # the named pipeline is made without a target: tvm.compile's is in scope when it runs
        tgt = target if target is not None else tvm.target.Target.current(allow_none=False)
        with tgt:
            # 1-3. graph rewrites, legalize and fuse, layout-free weights
            phases = [prepare if prepare is not None else prepare_pipeline(tgt, **graph_options)]
            if tuning_records is not None:
                # 4. tuned schedules from a MetaSchedule database
                phases.append(_tuning_pass(tuning_records, tgt))
            # 5. default schedule rules (skip tirx.is_scheduled functions)
            phases.append(cpu_schedule_pass(rules))
            # AMX kernels ask Linux for the tile state themselves (a library may be run from C++)
            phases.append(RequestAMXState())
            if symbolic_report is not None:
                from .schedules.symbolic_report import symbolic_report_pass

                phases.append(symbolic_report_pass(symbolic_report))
            phases.append(MergeEqualKernels())  # the rules' equal kernels compiled once
            # 6. weight packing at compile time, the Winograd weights at load
            phases += _weight_phases(pack_weights, record)
            # 7. lowering
            phases += lowering_phases(tgt)
            return tvm.transform.Sequential(phases)(mod)

    return pipeline


def _weight_phases(pack_weights: bool, record) -> list:
    """Phase 6: the packing stages the schedules asked for split out and evaluated on the
    constant weights (``pack_weights``); with a :class:`~tvm_roialign.passes.WinogradWeights`
    ``record``, the Winograd weights it knows (and their packing) moved into ``load_weights``
    first (:class:`~tvm_roialign.passes.LiftWeightTransforms`), which the folding leaves alone."""
    from .passes import FoldConstantIfFoldable, FoldLayoutRewrite, LiftWeightTransforms

    lift = [LiftWeightTransforms(record)] if record is not None else []
    if not pack_weights:
        return lift
    return [
        _split_layout_rewrite_preproc(),
        *lift,
        _without_load_weights(FoldLayoutRewrite(), FoldConstantIfFoldable()),
        relax.transform.DeadCodeElimination(),
    ]


def _tuning_pass(tuning_records, target) -> tvm.transform.Pass:
    """Phase 4: ``tuning_records`` if it is the pass already, else its records' pass."""
    if isinstance(tuning_records, tvm.transform.Pass):
        return tuning_records
    from .tuning import apply_database_pass

    return apply_database_pass(tuning_records, target=target)


def _has_preproc_block(func) -> bool:
    from .schedules.base import PREPROC_ATTR, walk

    found = []
    walk(func.body, tvm.s_tir.SBlock, lambda block: found.append(PREPROC_ATTR in block.annotations))
    return any(found)


def _without_load_weights(*passes) -> tvm.transform.Pass:
    """``passes`` on the module with its ``load_weights`` function (all constants, computed when
    the library is loaded: :class:`~tvm_roialign.passes.LiftWeightTransforms`) set aside."""
    from ._names import LOAD_WEIGHTS

    @tvm.transform.module_pass(opt_level=0, name="tvm_roialign.WithoutLoadWeights")
    def run(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        aside = [(gv, f) for gv, f in mod.functions_items() if gv.name_hint == LOAD_WEIGHTS]
        if aside:
            kept = {g: f for g, f in mod.functions_items() if g.name_hint != LOAD_WEIGHTS}
            mod = tvm.IRModule(kept, attrs=mod.attrs)
        out = tvm.transform.Sequential(list(passes))(mod)
        for gv, func in aside:
            out[gv] = func
        return out

    return run


def _split_layout_rewrite_preproc() -> tvm.transform.Pass:
    """``SplitLayoutRewritePreproc`` over the functions that have weight-packing stages only. TVM's
    pass visits every PrimFunc and stops at one whose root holds a single opaque block (an extern
    ``argsort``, the NMS kernel), so those are set aside while it runs and put back after."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_roialign.SplitLayoutRewritePreproc")
    def split(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        aside = {
            gv: func
            for gv, func in mod.functions_items()
            if isinstance(func, tvm.tirx.PrimFunc) and not _has_preproc_block(func)
        }
        if all(isinstance(f, relax.Function) or gv in aside for gv, f in mod.functions_items()):
            return mod  # nothing to split
        kept = {gv: func for gv, func in mod.functions_items() if gv not in aside}
        out = relax.transform.SplitLayoutRewritePreproc()(tvm.IRModule(kept, attrs=mod.attrs))
        for gv, func in aside.items():
            out[gv] = func
        return out

    return split


def register() -> None:
    """Register :func:`cpu_pipeline` as the named Relax pipeline ``"tvm_roialign_cpu"`` (done on
    ``import tvm_roialign``; ``tvm_roialign.unregister()`` removes it)."""
    from . import _registry

    _registry.register_pipeline(PIPELINE_NAME, cpu_pipeline)


def bind_symbolic_vars(mod: tvm.IRModule, values: dict) -> tvm.IRModule:
    """``mod`` with symbolic dimensions fixed: ``values`` maps a name (``"num_rois"``) or a
    ``tirx.Var`` to an int. Names that are not in ``mod`` raise ValueError."""
    found = {}
    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for var in relax.analysis.defined_symbolic_vars(func):
                found.setdefault(var.name, var)
    binding = {}
    for key, value in values.items():
        var = found.get(key) if isinstance(key, str) else key
        if var is None:
            names = ", ".join(sorted(found)) or "none"
            raise ValueError(
                f"no symbolic dimension {key!r} in the module (it has: {names})"
            )
        binding[var] = int(value)
    return relax.transform.BindSymbolicVars(binding)(mod)


def symbolic_vars(mod: tvm.IRModule) -> list[str]:
    """Names of the symbolic dimensions of ``mod``'s Relax functions."""
    names = []
    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for var in relax.analysis.defined_symbolic_vars(func):
                if var.name not in names:
                    names.append(var.name)
    return names


def _metal_pipeline(target):
    """gpu_generic's pipeline without dlight's ``Matmul`` rule, which segfaults TVM 0.27 on metal
    for conv2d (``ApplyDefaultSchedule(dl.gpu.Matmul())`` on a legalized conv2d crashes the
    process); GEMV, Reduction, GeneralReduction and Fallback schedule the rest."""
    from tvm.relax.backend.gpu_generic import pipeline as gpu_generic
    from tvm.s_tir import dlight as dl

    @tvm.transform.module_pass(opt_level=0, name="tvm_roialign.MetalPipeline")
    def pipeline(mod, _ctx):
        with target:
            seq = tvm.transform.Sequential(
                [
                    *gpu_generic.library_dispatch_passes(target),
                    relax.transform.LegalizeOps(),
                    relax.transform.AnnotateTIROpPattern(),
                    relax.transform.FoldConstant(),
                    relax.transform.FuseOps(),
                    relax.transform.FuseTIR(),
                    dl.ApplyDefaultSchedule(
                        dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
                    ),
                    *gpu_generic.dataflow_lower_passes(target),
                    *gpu_generic.finalize_passes(target),
                ]
            )
            return seq(mod)

    return pipeline


@dataclass(frozen=True)
class Built:
    """What :func:`build` returns.

    ``executable``: the ``tvm.compile`` result. ``coverage``: the
    :class:`~tvm_roialign.tuning.Coverage` of its tuning records (None: built without records, or
    with the phase-4 pass given, whose coverage goes where that pass says). ``symbolic``: the
    :class:`~tvm_roialign.schedules.symbolic_report.SymbolicCoverage` of its kernels of symbolic
    shape (None: it has none, or it is not an llvm build)."""

    executable: Any
    coverage: Any = None
    symbolic: Any = None


def build(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    *,
    tuning_records=None,
    **options,
) -> Built:
    """``tvm.compile`` for ``target`` (a ``tvm.target.Target``: see
    :func:`tvm_roialign.target.parse_target`): on llvm through :func:`cpu_pipeline`
    (``tuning_records`` and ``options`` are its keyword arguments), on metal without dlight's
    Matmul rule, elsewhere TVM's default.

    ``tuning_records``: a database directory, its :class:`~tvm_roialign.tuning.TuningRecords`, or
    the phase-4 pass (:func:`~tvm_roialign.tuning.apply_database_pass`). The coverage of a
    directory's or TuningRecords' records is returned in :attr:`Built.coverage` and also goes to
    the records' ``report`` (by default a warning when some tasks had no record).

    ``precision``: the build's :class:`~tvm_roialign.precision.PrecisionPlan` (made by the
    caller: the CLI, :func:`~tvm_roialign.models.detection.compile_detector`), or what is asked
    for, resolved here once (:func:`~tvm_roialign.precision.resolve`; its notes as warnings):
    ``"fp32"`` (the default), ``"auto"`` (bf16 where ``target`` has AMX bf16, else fp32),
    ``"bf16"``: constant-weight convolutions and matmuls in bf16 with fp32 accumulation on AMX,
    AVX512-BF16 or AArch64 ``bfdot`` (else fp32, with a warning; see ``docs/precision.md``),
    ``"int8"``: the same convolutions and matmuls quantized (int8 weights per output channel,
    uint8 activations per tensor, calibrated on ``calibration``: None for the sample photos, a
    directory of photos, or a list of input arrays) on AMX-INT8, AVX512-VNNI, AVX-VNNI, AVX2 or
    the AArch64 dot product (else fp32, with a warning; ``docs/int8.md``). A ValueError for any
    other value. ``keep_fp32`` leaves some of those layers in fp32: for bf16 a predicate of a
    layer's ``[K, N]`` weight (:class:`~tvm_roialign.passes.BF16Contractions`), for int8 their
    positions in the graph's order of the contractions int8 takes (-1: the last). An ONNX QDQ
    model keeps its own quantization whatever ``precision`` (int8 kernels with its scales where
    ``target`` has them, else float as imported, with a warning; see docs/int8.md, "QDQ models").

    For a target of this machine's architecture, TVM's CPU thread pool is sized first
    (:func:`~tvm_roialign.host.use_usable_cores`: every core this process may use, unless
    ``TVM_NUM_THREADS`` is set), so the executable run in this process uses them."""
    kind = target.kind.name
    if kind == "llvm" and not is_cross(target):
        # TVM's pool sized to the cores this process may use before the build's constant folding
        # starts it (a TVM_NUM_THREADS the user set is kept): the executable usually runs here
        use_usable_cores()
    plan = _plan(mod, target, options.pop("precision", "fp32"))
    keep_fp32 = options.pop("keep_fp32", None)
    if kind == "llvm":
        options["precision"] = plan
        if keep_fp32 is not None and plan.quantized:
            options["keep_fp32"] = keep_fp32  # refused by the QDQ phase: nothing to keep
        elif keep_fp32 is not None and plan.precision != "fp32":
            options["keep_fp32"] = check_keep_fp32(plan.precision, keep_fp32)
        if not is_cross(target) and plan.uses_amx:
            request_amx()  # the executable is usually run by this process
    if kind != "llvm":
        options.pop("weights_at_load", None)  # the GPU pipelines store their weights as they are
    if kind == "metal":
        return Built(tvm.compile(mod, target=target, relax_pipeline=_metal_pipeline(target)))
    if kind != "llvm":
        return Built(tvm.compile(mod, target=target))
    return _build_cpu(mod, target, tuning_records, options)


def _plan(mod: tvm.IRModule, target: tvm.target.Target, precision):
    """The build's :class:`~tvm_roialign.precision.PrecisionPlan`: ``precision`` when the caller
    made it, else :func:`~tvm_roialign.precision.resolve` of what it names (its notes as
    warnings)."""
    from .precision.policy import PrecisionPlan, resolve

    if isinstance(precision, PrecisionPlan):
        return precision
    plan = resolve(target, precision, mod)
    for note in plan.notes:
        warnings.warn(note, stacklevel=3)
    return plan


def _build_cpu(mod, target, tuning_records, options: dict) -> Built:
    coverages: list = []
    symbolic: list = []
    records = None
    if tuning_records is not None:
        if not isinstance(tuning_records, tvm.transform.Pass):
            from .tuning import TuningRecords, apply_database_pass

            records = tuning_records
            if not isinstance(records, TuningRecords):
                records = TuningRecords(records)
            tuning_records = apply_database_pass(records, report=coverages.append, target=target)
        options["tuning_records"] = tuning_records
    pipeline = cpu_pipeline(target, symbolic_report=symbolic.append, **options)
    # the kernels lowered and compiled in as many threads as this process has cores
    executable = compile_parallel(mod, target, pipeline)
    coverage = coverages[-1] if coverages else None
    if records is not None and coverage is not None:
        records.report(coverage)
    return Built(executable, coverage, symbolic[-1] if symbolic else None)


__all__ = [
    "PIPELINE_NAME",
    "Built",
    "CPUDefault",
    "bind_symbolic_vars",
    "build",
    "cpu_pipeline",
    "cpu_schedule_pass",
    "prepare_pipeline",
    "symbolic_vars",
]
