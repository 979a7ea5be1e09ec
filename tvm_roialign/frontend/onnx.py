"""ONNX importer with a correct ``RoiAlign``: TVM's ``from_onnx`` plus tvm-roialign's converter.

The ONNX ``RoiAlign`` node (opset 10, 16, 22) is converted as the specification and its reference
implementation (``onnx.reference``) define it:

* inputs ``X [N, C, H, W]``, ``rois [K, 4]`` of ``(x1, y1, x2, y2)`` in input-image pixels and
  ``batch_indices [K]`` (int64 by the specification; int32 accepted too), concatenated into the
  ``[K, 5]`` rois of ``relax.vision.roi_align`` in ``X``'s dtype;
* ``coordinate_transformation_mode``: ``half_pixel`` subtracts 0.5 *after* scaling
  (``x * spatial_scale - 0.5``, the roi size is not clamped), ``output_half_pixel`` has no shift and
  clamps the roi size to >= 1. Opset 10 has no attribute (``output_half_pixel``); from opset 16 the
  default is ``half_pixel``, also when the attribute is absent. The shift is applied to the roi
  coordinates only (never to the batch index), by :func:`tvm_roialign.roi_align`;
* ``sampling_ratio``: ``> 0`` samples per bin side, ``0`` adaptive ``ceil(roi_size / output_size)``;
* ``mode``: ``avg``, or ``max`` = the maximum over the samples of the largest of the four weighted
  corner terms ``w_i * v_i`` (the reference implementation and onnxruntime), which is
  ``relax.vision.roi_align`` with ``mode="onnx_max"``.

mmdeploy's ``mmcv::MMCVRoIAlignRotated`` (mmcv's rotated RoIAlign; inputs ``features [N, C, H,
W]`` and ``rois [K, 6]`` of ``(batch, cx, cy, w, h, angle)``, angle in radians; attributes
``output_height``, ``output_width``, ``spatial_scale``, ``sampling_ratio``, ``aligned``,
``clockwise``) is converted to ``relax.vision.roi_align_rotated`` (:class:`RoiAlignRotatedConverter`).

``Clip`` with constant bounds becomes ``relax.clip`` (:mod:`._onnx_clip`: TVM's converter emits TE
kernels that ``ConvertLayout`` cannot move). Every other operator goes to TVM's stock converters.
TVM 0.27's ``from_onnx`` has no converter hook: :func:`from_onnx` swaps those entries of the stock
converter table for the duration of the call (under a lock) and restores them afterwards.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from ..ops.roi_align import make_roi_align
from ..ops.roi_align_rotated import make_roi_align_rotated
from ._onnx_clip import ClipConverter
from ._onnx_static import readable_by_tvm

__all__ = [
    "COORDINATE_TRANSFORMATION_MODES",
    "ROI_ALIGN_ROTATED_OPS",
    "RoiAlignConverter",
    "RoiAlignRotatedConverter",
    "from_onnx",
]

COORDINATE_TRANSFORMATION_MODES = ("half_pixel", "output_half_pixel")
_KNOWN_ATTRIBUTES = {
    "coordinate_transformation_mode",
    "mode",
    "output_height",
    "output_width",
    "sampling_ratio",
    "spatial_scale",
    "tvm_custom",  # added by TVM's importer: node name and output count
}
_FLOAT_DTYPES = ("float16", "float32", "float64")
_INDEX_DTYPES = ("int32", "int64")
#: Op types that are RoIAlign variants ONNX does not define (any domain): refused with a clear error.
_FOREIGN_ROI_ALIGN_OPS = (
    "psroialign",
    "psroipooling",
    "roialignrotated",
    "roialign_ps",
)

#: Rotated RoIAlign ops of custom domains that are imported: ``(domain, op_type)``.
ROI_ALIGN_ROTATED_OPS = (("mmcv", "MMCVRoIAlignRotated"),)
_ROTATED_ATTRIBUTES = {
    "output_height",
    "output_width",
    "spatial_scale",
    "sampling_ratio",
    "aligned",
    "clockwise",
    "tvm_custom",
}

_patch_lock = threading.RLock()
# Mode for RoiAlign nodes without the attribute, set for the duration of one from_onnx call.
_state = threading.local()


def _decode(value):
    return value.decode("ascii") if isinstance(value, bytes) else value


def _node_name(attr) -> str:
    custom = attr.get("tvm_custom") or {}
    name = custom.get("name") if isinstance(custom, dict) else None
    return f"RoiAlign node {name!r}" if name else "RoiAlign node"


def _tensor_type(expr, what: str, where: str) -> relax.TensorType:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType):
        raise TypeError(f"{where}: {what} must be a tensor, got {ty}")
    return ty


def _static_dims(ty: relax.TensorType):
    if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(v) if hasattr(v, "value") else None for v in ty.shape.values]


def _check_attribute_names(where: str, attr: dict) -> None:
    """Only ONNX RoiAlign's attributes (position-sensitive variants named as such)."""
    unknown = sorted(set(attr) - _KNOWN_ATTRIBUTES)
    if "position_sensitive" in unknown:
        raise NotImplementedError(
            f"{where}: position-sensitive RoIAlign (attribute position_sensitive, as MXNet's "
            "_contrib_ROIAlign(position_sensitive=True) or R-FCN's PSRoIAlign) is not ONNX "
            "RoiAlign and is not supported; only plain RoiAlign can be imported"
        )
    if unknown:
        raise NotImplementedError(
            f"{where}: unknown attribute(s) {unknown}; ONNX RoiAlign has "
            f"{sorted(_KNOWN_ATTRIBUTES - {'tvm_custom'})}"
        )


def _checked_inputs(where: str, inputs):
    """``(X, rois, batch_indices, X dtype, rois dtype)``, each input's rank and dtype checked."""
    if len(inputs) != 3 or any(x is None for x in inputs):
        raise ValueError(
            f"{where}: expects 3 inputs (X [N, C, H, W], rois [K, 4], batch_indices [K]), "
            f"got {len([x for x in inputs if x is not None])}"
        )
    data, rois, batch_indices = inputs
    data_ty = _tensor_type(data, "X", where)
    rois_ty = _tensor_type(rois, "rois", where)
    index_ty = _tensor_type(batch_indices, "batch_indices", where)
    dtype = str(data_ty.dtype)
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{where}: X must be one of {_FLOAT_DTYPES}, got {dtype}")
    if int(data_ty.ndim) not in (-1, 4):
        raise ValueError(f"{where}: X must be 4-D [N, C, H, W], got {int(data_ty.ndim)}-D")
    rois_dims = _static_dims(rois_ty)
    if int(rois_ty.ndim) not in (-1, 2) or (
        rois_dims is not None and rois_dims[1] is not None and rois_dims[1] != 4
    ):
        raise ValueError(
            f"{where}: rois must be [K, 4] rows of (x1, y1, x2, y2), got shape {rois_dims}"
        )
    if str(rois_ty.dtype) not in _FLOAT_DTYPES:
        raise TypeError(f"{where}: rois must be a float tensor, got {rois_ty.dtype}")
    if str(index_ty.dtype) not in _INDEX_DTYPES:
        raise TypeError(f"{where}: batch_indices must be int64 (or int32), got {index_ty.dtype}")
    if int(index_ty.ndim) not in (-1, 1):
        raise ValueError(f"{where}: batch_indices must be 1-D [K], got {int(index_ty.ndim)}-D")
    return data, rois, batch_indices, dtype, str(rois_ty.dtype)


def _pooling_attributes(where: str, attr: dict, default_mode: str) -> dict:
    """The node's attributes as :func:`make_roi_align` keywords, each range checked."""
    mode = _decode(attr.get("mode", "avg"))
    if mode not in ("avg", "max"):
        raise ValueError(f"{where}: mode must be 'avg' or 'max', got {mode!r}")
    output_height = int(attr.get("output_height", 1))
    output_width = int(attr.get("output_width", 1))
    if output_height <= 0 or output_width <= 0:
        raise ValueError(
            f"{where}: output_height and output_width must be positive, got "
            f"{output_height} x {output_width}"
        )
    sampling_ratio = int(attr.get("sampling_ratio", 0))
    if sampling_ratio < 0:
        raise ValueError(
            f"{where}: sampling_ratio must be >= 0 (0 = adaptive), got {sampling_ratio}"
        )
    spatial_scale = float(attr.get("spatial_scale", 1.0))
    if not math.isfinite(spatial_scale) or spatial_scale <= 0:
        raise ValueError(
            f"{where}: spatial_scale must be a positive finite float, got {spatial_scale}"
        )
    override = getattr(_state, "default_mode", None)
    transform = _decode(attr.get("coordinate_transformation_mode", override or default_mode))
    if transform not in COORDINATE_TRANSFORMATION_MODES:
        raise ValueError(
            f"{where}: coordinate_transformation_mode must be one of "
            f"{COORDINATE_TRANSFORMATION_MODES}, got {transform!r}"
        )
    return dict(
        output_size=(output_height, output_width),
        spatial_scale=spatial_scale,
        sampling_ratio=sampling_ratio,
        aligned=transform == "half_pixel",
        mode="onnx_max" if mode == "max" else "avg",
    )


class RoiAlignConverter(onnx_frontend.OnnxOpConverter):
    """ONNX ``RoiAlign`` (opsets 10, 16, 22) -> :func:`tvm_roialign.roi_align` (module docstring)."""

    @classmethod
    def _convert(cls, bb, inputs, attr, default_mode):
        where = _node_name(attr)
        _check_attribute_names(where, attr)
        data, rois, batch_indices, dtype, rois_dtype = _checked_inputs(where, inputs)
        pooling = _pooling_attributes(where, attr, default_mode)
        if rois_dtype != dtype:
            rois = bb.emit(relax.op.astype(rois, dtype))
        index = bb.emit(
            relax.op.astype(relax.op.expand_dims(batch_indices, axis=1), dtype)
        )
        rois5 = bb.emit(relax.op.concat([index, rois], axis=1))
        return make_roi_align(data, rois5, layout="NCHW", **pooling)

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr, "output_half_pixel")

    @classmethod
    def _impl_v16(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr, "half_pixel")


class RoiAlignRotatedConverter(onnx_frontend.OnnxOpConverter):
    """mmdeploy's ``mmcv::MMCVRoIAlignRotated`` -> ``relax.vision.roi_align_rotated`` (radians)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        custom = attr.get("tvm_custom") or {}
        name = custom.get("name") if isinstance(custom, dict) else None
        where = f"MMCVRoIAlignRotated node {name!r}" if name else "MMCVRoIAlignRotated node"
        unknown = sorted(set(attr) - _ROTATED_ATTRIBUTES)
        if unknown:
            raise NotImplementedError(
                f"{where}: unknown attribute(s) {unknown}; it has "
                f"{sorted(_ROTATED_ATTRIBUTES - {'tvm_custom'})}"
            )
        if len(inputs) != 2 or any(x is None for x in inputs):
            raise ValueError(f"{where}: expects 2 inputs (features [N, C, H, W], rois [K, 6])")
        data, rois = inputs
        dtype = str(_tensor_type(data, "features", where).dtype)
        rois_dims = _static_dims(_tensor_type(rois, "rois", where))
        if rois_dims is not None and (len(rois_dims) != 2 or rois_dims[1] not in (None, 6)):
            raise ValueError(
                f"{where}: rois must be [K, 6] rows of (batch, cx, cy, w, h, angle), got {rois_dims}"
            )
        size = (int(attr.get("output_height", 1)), int(attr.get("output_width", 1)))
        if min(size) <= 0:
            raise ValueError(f"{where}: output_height and output_width must be positive, got {size}")
        spatial_scale = float(attr.get("spatial_scale", 1.0))
        if not math.isfinite(spatial_scale) or spatial_scale <= 0:
            raise ValueError(
                f"{where}: spatial_scale must be a positive finite float, got {spatial_scale}"
            )
        if str(rois.ty.dtype) != dtype:
            rois = bb.emit(relax.op.astype(rois, dtype))
        return make_roi_align_rotated(
            data,
            rois,
            size,
            spatial_scale=spatial_scale,
            sampling_ratio=int(attr.get("sampling_ratio", 0)),
            aligned=bool(int(attr.get("aligned", 1))),
            clockwise=bool(int(attr.get("clockwise", 0))),
            angle_unit="radians",
            layout="NCHW",
        )


def _check_foreign_roi_align(graph):
    """Refuse RoIAlign variants that ONNX does not define, naming them (before TVM's own error)."""
    for node in graph.node:
        op_type = node.op_type
        if (node.domain, op_type) in ROI_ALIGN_ROTATED_OPS:
            continue
        lowered = op_type.lower()
        is_variant = any(name in lowered for name in _FOREIGN_ROI_ALIGN_OPS) or (
            "roialign" in lowered.replace("_", "")
            and (op_type != "RoiAlign" or node.domain not in ("", "ai.onnx"))
        )
        if is_variant:
            domain = node.domain or "ai.onnx"
            raise NotImplementedError(
                f"node {node.name!r}: {domain}::{op_type} is not ONNX RoiAlign "
                "(position-sensitive and other RoIAlign variants are not supported); the "
                "standard ai.onnx RoiAlign and mmcv::MMCVRoIAlignRotated can be imported"
            )


def from_onnx(
    model,
    shape_dict=None,
    *,
    roi_align_coordinate_transformation_mode: str | None = None,
    **kwargs,
):
    """Import an ONNX model with TVM's ``from_onnx``, converting ``RoiAlign`` correctly.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (``ir_version >= 3``).
    shape_dict : dict of str to list, optional
        Input shapes, as TVM's ``from_onnx``.
    roi_align_coordinate_transformation_mode : str, optional
        Mode of the RoiAlign nodes that do not set ``coordinate_transformation_mode``; None (default)
        follows the specification of the model's opset (``output_half_pixel`` for opset 10-15,
        ``half_pixel`` from opset 16). Nodes that set the attribute always keep it. MXNet 1.9.1's
        exporter writes opset-18 models whose RoiAlign nodes mean ``output_half_pixel`` but do not
        say so: import them with ``"output_half_pixel"``.
    **kwargs
        Passed to ``tvm.relax.frontend.onnx.from_onnx`` (``dtype_dict``, ``opset``,
        ``keep_params_in_input``, ``sanitize_input_names``).

    Returns
    -------
    tvm.IRModule
        ``main`` with ``relax.vision.roi_align`` calls for the RoiAlign nodes.

    Raises
    ------
    ValueError, TypeError
        A RoiAlign node with a bad attribute or input (the message names the node and attribute).
    NotImplementedError
        A position-sensitive or other non-ONNX RoIAlign variant (other than
        ``mmcv::MMCVRoIAlignRotated``), or an unknown attribute.
    """
    mode = roi_align_coordinate_transformation_mode
    if mode is not None and mode not in COORDINATE_TRANSFORMATION_MODES:
        raise ValueError(
            "roi_align_coordinate_transformation_mode must be None or one of "
            f"{COORDINATE_TRANSFORMATION_MODES}, got {mode!r}"
        )
    graph = getattr(model, "graph", None)
    if graph is not None:
        _check_foreign_roi_align(graph)
        if mode is None and not getattr(model, "producer_name", ""):
            _warn_if_ambiguous(model)
    if graph is not None:
        model = readable_by_tvm(model, shape_dict)
    with _roi_align_converters(mode):
        return onnx_frontend.from_onnx(model, shape_dict, **kwargs)


@contextlib.contextmanager
def _roi_align_converters(default_mode):
    """TVM's ONNX importer with this module's converters for ``RoiAlign`` and the rotated ops,
    for the duration of one ``from_onnx`` call.

    Why a patch: TVM 0.27's ``relax.frontend.onnx.from_onnx`` takes no converter table (no
    ``custom_convert_map`` or the like); its importer looks every op up in the module function
    ``_get_convert_map()``, so that function is replaced while the call runs and restored in
    ``finally``, whatever the call raises. The lock serializes this package's imports (the
    replacement is process-wide: a plain TVM ``from_onnx`` in another thread during the call would
    also get the converters, which differ from TVM's only for these ops).
    """
    with _patch_lock:
        stock = onnx_frontend._get_convert_map

        def convert_map():
            table = stock()
            table["RoiAlign"] = RoiAlignConverter
            table["Clip"] = ClipConverter
            for _, op_type in ROI_ALIGN_ROTATED_OPS:
                table[op_type] = RoiAlignRotatedConverter
            return table

        previous = getattr(_state, "default_mode", None)
        onnx_frontend._get_convert_map = convert_map
        _state.default_mode = default_mode
        try:
            yield
        finally:
            onnx_frontend._get_convert_map = stock
            _state.default_mode = previous


def _warn_if_ambiguous(model):
    """Warn about opset-16+ RoiAlign nodes without the mode in a model of unknown producer."""
    opset = max(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        default=0,
    )
    if opset < 16:
        return
    for node in model.graph.node:
        if node.op_type == "RoiAlign" and not any(
            a.name == "coordinate_transformation_mode" for a in node.attribute
        ):
            warnings.warn(
                f"RoiAlign node {node.name!r} has no coordinate_transformation_mode: at opset "
                f"{opset} that means half_pixel, but some exporters (MXNet 1.9.1) write opset-16+ "
                "models meaning output_half_pixel; pass roi_align_coordinate_transformation_mode "
                "to from_onnx to choose",
                stacklevel=3,
            )
            return
