"""One row axis for the output pixels of an NHWC conv: ``(h, w)`` -> ``h * W + w``.

The register tile of :mod:`~tvm_roialign.schedules.contraction.schedule` takes ``rows`` consecutive points of
the innermost row axis. With the image's width as that axis, a narrow feature map wastes the tile: 14 or 7
pixels (the last stages of an image model at 224) fit no tile of the 6 rows a 16-register target wants, so
the tile computes padding rows or the model falls back to a tall, thin tile (14 x 1 vectors: a
load per multiply-add). As one axis of ``H * W`` pixels, the tile's rows run on into the next image
row and only the last tile of the image is partial (196 pixels: 32 tiles of 6 and one of 4). The
input read of a tile row is ``x[n, (m // W) * stride + kh, (m % W) * stride + kw, i]``: its address
is computed once per tap, outside the channel loop the multiply-adds run in.

:func:`flatten_rows` rewrites the conv block's iteration (``transform_block_layout``) and the
layout of the buffer it writes (``transform_layout``: ``[N, H, W, C]`` -> ``[N, H * W, C]``, which
every consumer then reads as ``[n, h * W + w, c]``), so that the block is again a
:class:`~tvm_roialign.schedules.contraction.analysis.Contraction`, with two row axes. Only where the conv
writes an intermediate buffer of the function (a parameter keeps its shape) and its channel and kernel
extents are static. The batch may be symbolic (Mask R-CNN's mask head runs its 14x14 convs on one map
per detection: its 3x3 256 -> 256 conv measured in docs/benchmarks.md, "Schedules and host
settings"), and so may the height and width: a symbolic row axis of ``H * W`` pixels, whose last tile
is clamped once per image instead of once per image row (a symbolic resnet50 at 1x3x320x480: 1.09x
its static build tiled per image row, 0.98x merged; its layer3 1x1 convs 12.8 -> ~10 ms); the
input row's ``m // W`` then divides by a variable, once per tile row and tap, outside the channel
loop.
"""

from __future__ import annotations

import tvm_ffi
from tvm.s_tir import Schedule

from ..base import inline_one_intermediate, static_int, try_step


def flatten_rows(sch: Schedule, block) -> bool:
    """Merge the height and width axes of NHWC conv ``block`` (see module); False when it cannot
    (a symbolic channel or kernel extent, the output a parameter, a step refused), the schedule
    then unchanged. The batch, height and width may be symbolic."""
    stmt = sch.get(block)
    out = stmt.writes[0].source
    func = sch.mod["main"]
    if any(out.same_as(buf) for buf in func.params):
        return False
    iters = list(stmt.iter_vars)
    shape = list(out.ty.shape) if hasattr(out.ty, "shape") else []
    if len(shape) != 4 or len(iters) != 7 or static_int(shape[3]) is None:
        return False
    if any(static_int(it.dom.extent) is None for it in iters[3:]):
        return False
    width = shape[2]
    if not _same_extent(iters[2].dom.extent, width) or not _same_extent(iters[1].dom.extent, shape[1]):
        return False
    if static_int(shape[1]) == 1:
        # one row of pixels already (a squeeze-excitation's FC on the pooled 1 x 1 map): nothing
        # to merge, and merging unit axes leaves a block the contraction analysis cannot read
        return False
    try:
        sch.transform_layout(block, ("write", 0), lambda n, h, w, c: (n, h * width + w, c))
        sch.transform_block_layout(
            block,
            lambda n, h, w, o, kh, kw, i: (n, h * width + w, o, kh, kw, i),
        )
    except Exception:  # noqa: BLE001 - a refused step: leave the conv as it was
        return False
    _flatten_consumer(sch, block, [it.dom.extent for it in iters[:3]], shape[3])
    return True


def _flatten_consumer(sch: Schedule, block, rows: list[int], columns: int) -> None:
    """Give the epilogue after ``block`` the same row axis: its intermediate blocks inlined into
    the last one (as :func:`~tvm_roialign.schedules.base.inline_epilogue` would), whose ``(n, h, w, c)``
    iteration becomes ``(n, h * W + w, c)``, so that it reads the conv's output at ``[n, m, c]`` and can be
    inlined into the tile's write-back. Left as it is (correct, not fused) where it cannot."""
    while inline_one_intermediate(sch, block):
        pass
    consumers = sch.get_consumers(block)
    if len(consumers) != 1:
        return
    extents = list(sch.get(consumers[0]).iter_vars)
    if len(extents) != 4 or not all(
        _same_extent(it.dom.extent, e) for it, e in zip(extents, [*rows, columns])
    ):
        return
    width = rows[2]
    try_step(
        sch.transform_block_layout, consumers[0], lambda n, h, w, c: (n, h * width + w, c)
    )


def _same_extent(a, b) -> bool:
    """Whether two loop extents are the same: equal constants, or the same symbolic expression."""
    if static_int(a) is not None or static_int(b) is not None:
        return static_int(a) == static_int(b)
    return bool(tvm_ffi.structural_equal(a, b))


__all__ = ["flatten_rows"]
