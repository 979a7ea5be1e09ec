"""Relax passes of tvm-roialign, one per file.

* :mod:`.layout`: ``FRelaxInferLayout`` for ``relax.vision.roi_align`` (and RoIAlign-like ops,
  :func:`~.layout.infer_layout_roi_align_like`), :mod:`.layout_clip`: the same for
  ``relax.clip`` (ReLU6, hardswish), and :mod:`.layout_qdq`: for per-tensor ``relax.quantize`` /
  ``relax.dequantize`` (an ONNX QDQ model's activations), which stock TVM leaves without one;
  registered on import of the package;
* :class:`ConvertLayout` (:mod:`.convert_layout`): Relay-style ``ConvertLayout`` (Relay op names,
  ``"default"``, no conversion to layouts without legalization) after
  :class:`NormalizeSqueezeAxes` (:mod:`.normalize_squeeze_axes`) and followed by the two folds;
  :class:`ConvertLayoutWherePossible` (:mod:`.convert_layout_where_possible`): the same, with the
  region where TVM's conversion fails kept in its own layout (the CLI and the build pipeline);
* :class:`FoldPermuteDims` (:mod:`.fold_permute_dims`): ``permute_dims`` pairs that cancel or merge;
* :class:`FoldFlattenPermute` (:mod:`.fold_flatten_permute`): a transpose feeding flatten + dense
  moves into the dense weight;
* :class:`HoistActivations` (:mod:`.hoist_activations`): an activation of a reshape moves ahead
  of it (a transformer MLP's GELU into its matmul's epilogue), chains of reshapes merge;
* :class:`FoldConstantIfFoldable` (:mod:`.fold_constant_if_foldable`): ``FoldConstant`` only when the
  module has something it folds (TVM's legalizes every call first: a second per detector pass);
* :class:`BoundConstantTakes` (:mod:`.bound_constant_takes`): gathers of constant in-bounds
  indices in mode ``"clip"`` (no out-of-bounds warning from TVM); :class:`TakesAsSlices`
  (:mod:`.takes_as_slices`): a gather of one constant index as a slice; :class:`WrapTakes`
  (:mod:`.wrap_takes`): a detector's gathers in mode ``"wrap"``, torch's indexing;
* :class:`BF16Contractions` (:mod:`.bf16_contractions`): constant-weight conv2d / matmul as bf16
  contractions (``precision="bf16"``); :class:`RequestAMXState` (:mod:`.request_amx_state`, a TIR
  pass): kernels with AMX tiles ask Linux for the tile state themselves;
* :class:`Int8Contractions` (:mod:`.int8_contractions`): the same contractions quantized to int8,
  calibrated on photos (``precision="int8"``);
* :class:`QDQContractions` (:mod:`.qdq_contractions`): an ONNX QDQ model's quantized conv2d /
  matmul as int8 contractions with the model's own scales;
* :class:`MergeEqualKernels` (:mod:`.merge_equal_kernels`): structurally equal PrimFuncs (a
  pyramid's per-level copies of a kernel, once scheduled) merged into one, compiled once;
* :class:`LiftWeightTransforms` (:mod:`.lift_weight_transforms`): the Winograd weights that a
  :class:`WinogradWeights` record knows computed when the library is loaded (``load_weights``),
  not stored;
* :class:`ShareSymbolicStorage` (:mod:`.share_symbolic_storage`): after
  ``StaticPlanBlockMemory``, storages of symbolic size whose lives do not overlap allocated once
  (the size of the largest), as a static build's plan shares them;
* :class:`DefineBranchStorages` (:mod:`.define_branch_storages`): after ``StaticPlanBlockMemory``,
  a branch of an ``If`` allocates the storages it uses (TVM's plan let it read one the other branch
  allocates: a segfault when that branch ran);
* :func:`desired_layouts` (:mod:`.desired_layouts`): the ConvertLayout dictionary for a whole model
  in NHWC (or NCHW).
"""

from . import layout, layout_clip, layout_qdq
from .bf16_contractions import BF16Contractions
from .bound_constant_takes import BoundConstantTakes
from .convert_layout import ConvertLayout
from .convert_layout_where_possible import ConvertLayoutWherePossible
from .define_branch_storages import DefineBranchStorages
from .desired_layouts import LAYOUT_OPS, desired_layouts
from .fold_batch_norm import FoldBatchNorm
from .fold_constant_if_foldable import FoldConstantIfFoldable
from .fold_constant_numpy import FoldConstantNumPy
from .fold_flatten_permute import FoldFlattenPermute
from .fold_layout_rewrite import FoldLayoutRewrite
from .fold_permute_dims import FoldPermuteDims
from .hoist_activations import HoistActivations
from .int8_contractions import Int8Contractions
from .layout import register
from .lift_weight_transforms import LOAD_WEIGHTS, LiftWeightTransforms, WinogradWeights
from .merge_equal_kernels import MergeEqualKernels
from .normalize_squeeze_axes import NormalizeSqueezeAxes
from .pad_channels import PadChannels
from .qdq_contractions import QDQContractions
from .request_amx_state import RequestAMXState
from .share_symbolic_storage import ShareSymbolicStorage
from .takes_as_slices import TakesAsSlices
from .winograd import WinogradConv2D
from .wrap_takes import WrapTakes

__all__ = [
    "LAYOUT_OPS",
    "LOAD_WEIGHTS",
    "BF16Contractions",
    "BoundConstantTakes",
    "ConvertLayout",
    "ConvertLayoutWherePossible",
    "DefineBranchStorages",
    "FoldBatchNorm",
    "FoldConstantIfFoldable",
    "FoldConstantNumPy",
    "FoldFlattenPermute",
    "FoldLayoutRewrite",
    "FoldPermuteDims",
    "HoistActivations",
    "Int8Contractions",
    "LiftWeightTransforms",
    "MergeEqualKernels",
    "NormalizeSqueezeAxes",
    "PadChannels",
    "QDQContractions",
    "RequestAMXState",
    "ShareSymbolicStorage",
    "TakesAsSlices",
    "WinogradConv2D",
    "WinogradWeights",
    "WrapTakes",
    "desired_layouts",
    "layout",
    "layout_clip",
    "layout_qdq",
    "register",
]
