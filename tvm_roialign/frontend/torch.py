"""``torch.export`` importer with correct RoIAlign and a fused ``MultiScaleRoIAlign``.

:func:`from_exported_program` is TVM's ``from_exported_program`` plus two converters:

* ``torchvision.roi_align`` (the graph op ``torch.ops.torchvision.roi_align.default``): torchvision's
  ``aligned=True`` shifts the box by -0.5 *after* scaling (``x * spatial_scale - 0.5``); it is
  imported by :func:`tvm_roialign.roi_align`, whose call carries ``half_pixel=True`` to the kernel
  (exact at every scale). TVM's stock converter subtracts 0.5 before scaling, wrong whenever
  ``spatial_scale != 1``.
* ``torch.ops.tvm_roialign.multiscale_roi_align.default`` (below) -> the fused op
  ``relax.vision.multiscale_roi_align``;
* ``torchvision.ps_roi_align`` -> ``relax.vision.ps_roi_align``; a rotated RoIAlign exported as a
  custom op (detectron2's or mmcv's, or a user's ``torch.library`` op) through the converters of
  :func:`roi_align_rotated_convert_map` (:mod:`._torch_family`).

MultiScaleRoIAlign
------------------
torchvision's ``MultiScaleRoIAlign`` assigns each roi to its FPN level in Python with
``torch.where(levels == level)`` and writes the per-level results with ``result[idx] = ...``:
exported, that is data-dependent ``nonzero`` plus ``index_put`` (or does not export at all). The
fused op does the level assignment inside the kernel, so the graph needs none of it. To get the
pooler into the exported graph as one op, export the model with :func:`export` (or inside
:func:`fuse_multiscale_roi_align`): every ``torchvision.ops.MultiScaleRoIAlign`` submodule of the
(unmodified) model is made, for the duration of the export only, to call the custom op
``tvm_roialign::multiscale_roi_align`` (a ``torch.library`` op whose eager kernel is torchvision's
own per-level computation, and whose fake kernel gives ``[K, C, PH, PW]`` for a symbolic ``K``)
with the rois built as torchvision builds them and the scales torchvision infers. The exported
program then holds ``cat`` ops for the rois and one ``multiscale_roi_align`` node; it runs eagerly
too (``ep.module()(...)`` gives torchvision's result), and :func:`from_exported_program` maps it to
``relax.vision.multiscale_roi_align``. This works on torchvision's Mask R-CNN poolers
(``roi_heads.box_roi_pool``, ``roi_heads.mask_roi_pool``).

A model exported plainly (``torch.export.export``) imports too: :func:`from_exported_program`
recognises the pooler's per-level graph and fuses it (:mod:`._torch_levels`); :func:`export`
remains the way for a symbolic number of rois (a plain export specialises the count).
"""

from __future__ import annotations

import ast
import contextlib
import re
import types
import warnings

import torch
import torchvision
from torchvision.ops import poolers
from tvm.relax.frontend.torch import (
    from_exported_program as _stock_from_exported_program,
)

from ..ops.multiscale_roi_align import make_multiscale_roi_align
from ..ops.roi_align import make_roi_align
from ..topi.multiscale_roi_align import LEVEL_EPS
from ._torch_family import (
    convert_ps_roi_align,
    roi_align_rotated_convert_map,
    roi_align_rotated_converter,
)
from ._torch_levels import fuse_per_level_pooling, has_per_level_pooling
from ._torch_ops import decomposition_table, stock_gap_converters

__all__ = [
    "UnsupportedOperators",
    "convert_map",
    "export",
    "from_exported_program",
    "fuse_multiscale_roi_align",
    "multiscale_roi_align",
    "roi_align_rotated_convert_map",
    "roi_align_rotated_converter",
]


@torch.library.custom_op("tvm_roialign::multiscale_roi_align", mutates_args=())
def multiscale_roi_align(
    features: list[torch.Tensor],
    rois: torch.Tensor,
    output_size: list[int],
    spatial_scales: list[float],
    sampling_ratio: int,
    aligned: bool,
    canonical_scale: int,
    canonical_level: int,
) -> torch.Tensor:
    """torchvision's multi-level RoIAlign as one op (eager: torchvision's own computation).

    Parameters
    ----------
    features : list of Tensor
        ``L`` maps ``[N, C, H_l, W_l]``, finest first.
    rois : Tensor
        ``[K, 5]`` rows of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels.
    output_size : list of int
        ``[PH, PW]``.
    spatial_scales : list of float
        One per level (``2 ** -k``).
    sampling_ratio : int
    aligned : bool
        torchvision's ``aligned`` (MultiScaleRoIAlign uses False).
    canonical_scale, canonical_level : int
        The LevelMapper's ``s0`` and ``k0`` (224 and 4).

    Returns
    -------
    Tensor
        ``[K, C, PH, PW]``.
    """
    kwargs = {
        "output_size": tuple(output_size),
        "sampling_ratio": sampling_ratio,
        "aligned": aligned,
    }
    if len(features) == 1:
        return torchvision.ops.roi_align(
            features[0], rois, spatial_scale=spatial_scales[0], **kwargs
        )
    k_min, k_max = _level_bounds(spatial_scales)
    mapper = poolers.initLevelMapper(
        k_min, k_max, canonical_scale=canonical_scale, canonical_level=canonical_level
    )
    levels = mapper([rois[:, 1:]])
    first = features[0]
    result = first.new_zeros((rois.shape[0], first.shape[1], *output_size))
    for level, (feature, scale) in enumerate(zip(features, spatial_scales)):
        index = torch.where(levels == level)[0]
        pooled = torchvision.ops.roi_align(
            feature, rois[index], spatial_scale=scale, **kwargs
        )
        result[index] = pooled.to(result.dtype)
    return result


@multiscale_roi_align.register_fake
def _multiscale_roi_align_fake(
    features,
    rois,
    output_size,
    spatial_scales,
    sampling_ratio,
    aligned,
    canonical_scale,
    canonical_level,
):
    first = features[0]
    return first.new_empty((rois.shape[0], first.shape[1], *output_size))


def _level_bounds(spatial_scales) -> tuple[int, int]:
    """``(k_min, k_max)`` exactly as torchvision's ``_setup_scales`` (float32 log2, truncated)."""
    first = -torch.log2(torch.tensor(spatial_scales[0], dtype=torch.float32)).item()
    last = -torch.log2(torch.tensor(spatial_scales[-1], dtype=torch.float32)).item()
    return int(first), int(last)


def _mapper_matches(pooler, scales) -> bool:
    """Whether the pooler's LevelMapper is the one the fused op recomputes from the scales."""
    mapper = pooler.map_levels
    k_min, k_max = _level_bounds(scales)
    return (
        (mapper.k_min, mapper.k_max) == (k_min, k_max)
        and mapper.s0 == pooler.canonical_scale
        and mapper.lvl0 == pooler.canonical_level
        and mapper.eps == LEVEL_EPS
    )


def _fused_forward(self, x, boxes, image_shapes):
    """``MultiScaleRoIAlign.forward`` through ``tvm_roialign::multiscale_roi_align``."""
    x_filtered = poolers._filter_input(x, self.featmap_names)
    if self.scales is None or self.map_levels is None:
        self.scales, self.map_levels = poolers._setup_scales(
            x_filtered, image_shapes, self.canonical_scale, self.canonical_level
        )
    if len(x_filtered) == 1 or not _mapper_matches(self, self.scales):
        if len(x_filtered) > 1:
            warnings.warn(
                f"{self!r} has a LevelMapper that differs from the one of its scales: exported "
                "with torchvision's own forward",
                stacklevel=2,
            )
        return type(self).forward(
            self, x, boxes, image_shapes
        )  # torchvision: one roi_align
    rois = poolers._convert_to_roi_format(boxes)
    return torch.ops.tvm_roialign.multiscale_roi_align(
        x_filtered,
        rois,
        [int(s) for s in self.output_size],
        [float(s) for s in self.scales],
        int(self.sampling_ratio),
        False,
        int(self.canonical_scale),
        int(self.canonical_level),
    )


_MISSING = object()


@contextlib.contextmanager
def fuse_multiscale_roi_align(model: torch.nn.Module):
    """Within the block, every ``torchvision.ops.MultiScaleRoIAlign`` in ``model`` runs as the
    custom op ``tvm_roialign::multiscale_roi_align`` (same result), so that ``torch.export``
    records one op instead of torchvision's data-dependent level assignment.

    The model is restored on exit (instance attributes only; torchvision is not patched).
    """
    patched = []
    try:
        for module in model.modules():
            if isinstance(module, poolers.MultiScaleRoIAlign):
                patched.append((module, module.__dict__.get("forward", _MISSING)))
                module.forward = types.MethodType(_fused_forward, module)
        yield model
    finally:
        for module, previous in reversed(patched):
            if previous is _MISSING:
                del module.forward
            else:
                module.forward = previous


def export(model: torch.nn.Module, args, kwargs=None, **export_kwargs):
    """``torch.export.export`` with the model's MultiScaleRoIAlign poolers fused (see module doc).

    ``export_kwargs`` go to ``torch.export.export`` (``dynamic_shapes``, ``strict``, ...). Give the
    rois / boxes a symbolic first dimension (``torch.export.Dim``) to import a program that takes
    any number of rois.
    """
    with fuse_multiscale_roi_align(model):
        return torch.export.export(model, tuple(args), kwargs, **export_kwargs)


def _convert_roi_align(node, importer):
    """``torchvision.roi_align(input, rois, spatial_scale, pooled_height, pooled_width,
    sampling_ratio, aligned)`` -> :func:`tvm_roialign.roi_align` (shift after scaling)."""
    args = importer.retrieve_args(node)
    data, rois = args[0], args[1]
    spatial_scale = float(args[2]) if len(args) > 2 else 1.0
    pooled_height = int(args[3]) if len(args) > 3 else 1
    pooled_width = int(args[4]) if len(args) > 4 else pooled_height
    sampling_ratio = int(args[5]) if len(args) > 5 else -1
    aligned = bool(args[6]) if len(args) > 6 else False
    return importer.block_builder.emit(
        make_roi_align(
            data,
            rois,
            (pooled_height, pooled_width),
            spatial_scale=spatial_scale,
            sampling_ratio=sampling_ratio,
            aligned=aligned,
        )
    )


def _convert_multiscale_roi_align(node, importer):
    """``tvm_roialign::multiscale_roi_align`` -> ``relax.vision.multiscale_roi_align``."""
    args = importer.retrieve_args(node)
    (
        features,
        rois,
        output_size,
        scales,
        sampling_ratio,
        aligned,
        canonical_scale,
        level,
    ) = args
    return importer.block_builder.emit(
        make_multiscale_roi_align(
            list(features),
            rois,
            [int(s) for s in output_size],
            [float(s) for s in scales],
            sampling_ratio=int(sampling_ratio),
            aligned=bool(aligned),
            layout="NCHW",
            canonical_scale=int(canonical_scale),
            canonical_level=int(level),
        )
    )


def _size_value(importer, value):
    """One entry of an upsampling ``size``: an int, a symbolic size (a ``PrimExpr``), or a
    Relax constant bound by the importer (a ``sym_size`` of a static dimension)."""
    import tvm

    if isinstance(value, int):
        return value
    if getattr(value, "struct_info_", None) is not None:  # a Relax value, not a PrimExpr
        value = importer.block_builder.lookup_binding(value) or value
    if isinstance(value, tvm.ir.expr.Constant):
        return int(value.data.numpy())
    return value


def _convert_upsample_nearest2d(node, importer):
    """``aten.upsample_nearest2d.vec(input, output_size, scale_factors)`` with the sizes looked up.

    TVM's converter passes ``output_size`` on as fx nodes, which fails when the sizes are symbolic
    (the FPN's top-down ``F.interpolate(size=lateral.shape[-2:])`` in a program exported with
    symbolic image sizes); with static sizes it is the stock conversion.
    """
    x = importer.env[node.args[0]]
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    if not size:
        return importer._upsample_nearest2d(node)
    size = tuple(_size_value(importer, s) for s in importer._retrieve_args(list(size)))
    return importer._upsample_impl(
        x, size=size, scale_factor=None, method="nearest_neighbor", align_corners=None
    )


def convert_map() -> dict:
    """Our converters, keyed as ``from_exported_program``'s ``custom_convert_map`` expects."""
    return {
        **stock_gap_converters(),
        "upsample_nearest2d.vec": _convert_upsample_nearest2d,
        "roi_align.default": _convert_roi_align,
        "multiscale_roi_align.default": _convert_multiscale_roi_align,
        "ps_roi_align.default": convert_ps_roi_align,
    }


def from_exported_program(exported_program, *, custom_convert_map=None, **kwargs):
    """TVM's ``from_exported_program`` with correct RoIAlign and the fused MultiScaleRoIAlign.

    Parameters
    ----------
    exported_program : torch.export.ExportedProgram
        A model exported with :func:`export` or plainly with ``torch.export.export``: a
        multi-level ``MultiScaleRoIAlign`` exported plainly (per-level ``nonzero`` / ``index`` /
        ``roi_align`` / ``index_put``) is recognised and imported as the fused op
        (:mod:`._torch_levels`); the given program is not modified.
    custom_convert_map : dict, optional
        More converters (name -> ``(node, importer) -> relax.Var``); they take precedence.
    **kwargs
        Passed to ``tvm.relax.frontend.torch.from_exported_program`` (``keep_params_as_input``,
        ``unwrap_unit_return_tuple``, ``no_bind_return_tuple``, ``run_ep_decomposition``).

    Returns
    -------
    tvm.IRModule
        ``main``: torchvision ``roi_align`` as ``relax.vision.roi_align`` (with ``aligned``,
        ``aligned=half_pixel=True``: shift after scaling), ``multiscale_roi_align`` as
        ``relax.vision.multiscale_roi_align`` (NCHW).

    Raises
    ------
    NotImplementedError
        (``UnsupportedPooling``) A ``roi_align`` of rois selected data-dependently that is not
        torchvision's MultiScaleRoIAlign: one line naming :func:`export`.
        (:class:`UnsupportedOperators`) ops the importer has no converter for, listed by name.
    """
    table = convert_map()
    table.update(custom_convert_map or {})
    # decomposed here, keeping the ops that converters of ours take whole (their decompositions
    # import wrongly); without decompositions, still a new program where the per-level pooling is
    # fused below, so that the caller's is not modified
    decompose = kwargs.pop("run_ep_decomposition", True)
    if decompose or has_per_level_pooling(exported_program.graph):
        exported_program = exported_program.run_decompositions(
            decomposition_table() if decompose else {}
        )
    kwargs["run_ep_decomposition"] = False
    if has_per_level_pooling(exported_program.graph):
        # a plain torch.export of MultiScaleRoIAlign: fuse the per-level pooling before TVM's
        # importer sees it
        fuse_per_level_pooling(exported_program)
    try:
        return _stock_from_exported_program(
            exported_program, custom_convert_map=table, **kwargs
        )
    except AssertionError as err:  # TVM's importer asserts on ops it has no converter for
        ops = _unsupported_ops(err)
        if ops is None:
            raise
        raise UnsupportedOperators(ops) from None


class UnsupportedOperators(NotImplementedError):
    """The exported program calls ops that the torch.export importer has no converter for
    (``ops``: their names as the importer lists them, e.g. ``_fft_r2c.default``)."""

    def __init__(self, ops):
        self.ops = list(ops)
        super().__init__(
            f"{len(self.ops)} op{'s' if len(self.ops) != 1 else ''} not supported by the "
            f"torch.export importer: {', '.join(self.ops)} (give converters in custom_convert_map)"
        )


_UNSUPPORTED = re.compile(r"Unsupported function types (\[.*\])", re.S)


def _unsupported_ops(err: AssertionError) -> list[str] | None:
    match = _UNSUPPORTED.search(str(err))
    if match is None:
        return None
    try:
        names = [str(op) for op in ast.literal_eval(match.group(1))]
    except (ValueError, SyntaxError):
        return None
    # the importer lists overloads without their namespace; aten's are named as such
    return [f"aten.{n}" if hasattr(torch.ops.aten, n.split(".")[0]) else n for n in names]
