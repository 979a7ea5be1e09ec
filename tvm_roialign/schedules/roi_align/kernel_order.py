"""The order in which the CPU RoIAlign kernel (:mod:`~tvm_roialign.schedules.roi_align.kernel`) visits its
work, so that work reading the same rows of the feature map runs together and finds them in the core's cache.

The kernel's work items are *bin rows* ``(roi, ph)`` or, with a static sampling grid, *sample rows*
``(roi, ph, iy)`` (item ``row * row_samples + iy``). Each item has a key, ``batch * H + y``, ``y``
the feature row its samples read first (:func:`item_key`); a counting sort by key
(:func:`order_items`, stable) lists the items top to bottom. A worker then sweeps a band of the
map: the rows its items read stay in its cache while the sweep passes them, and each feature row
is fetched from memory about once instead of once per roi that reads it.

Sample rows of one bin accumulate into the same output in turn, so one worker owns each bin row:
:func:`assign_chunks` cuts the bin rows, in the order of their first sample row, into ``chunks``
equal runs, and records each run's first position in the sorted list. A sample row's key is never
below that of the bin row's first sample row, so a chunk finds all the sample rows it owns from
that position on, in the order of the sampling grid.
"""

from __future__ import annotations

from tvm.script import tirx as T

from .kernel_constants import KernelConstants
from .kernel_samples import to_acc

__all__ = ["assign_chunks", "item_key", "order_items"]


def _row_y(c: KernelConstants, start_h, bin_h, grid_h, ph, iy):
    """Feature-map y of sample row ``iy`` of bin row ``ph`` (for ordering only: not the sample's
    exact rounding)."""
    grid_h_f = to_acc(c, T.max(grid_h, c.i_one))
    return start_h + to_acc(c, ph) * bin_h + (to_acc(c, iy) + c.half) * bin_h / grid_h_f


def item_key(c: KernelConstants, reader, rois_buf, item):
    """Sort key of ``item``: ``batch * H + y``, ``y`` the feature row of its first sample, clamped
    into the map, and never below the key of its bin row's first sample row (a negative roi size
    gives rows going up); 0 for an invalid roi or an empty grid."""
    row = item // c.row_samples
    k = row // c.pooled_h
    ph = row % c.pooled_h
    start_h, _, bin_h, _, grid_h, _, roi_ok, batch = reader.fields(rois_buf, k)
    y_first = _row_y(c, start_h, bin_h, grid_h, ph, c.i_zero)
    y = T.max(_row_y(c, start_h, bin_h, grid_h, ph, item % c.row_samples), y_first)
    last = to_acc(c, c.height - c.i_one)
    # compare-and-select: a NaN or infinite y becomes 0
    clamped = T.Select(y > c.zero, T.Select(y < last, y, last), c.zero)
    return T.Select(T.And(roi_ok, grid_h > c.i_zero),
                    batch * c.height + T.Cast(c.idx, clamped), c.i_zero)


@T.macro
def order_items(c, reader, rois_buf, keys, counts, order):
    # counting sort of the items by key (stable: items of one key keep their order)
    for i in range(c.num_keys + c.i_one):
        counts[i] = c.i_zero
    for item in range(c.items):
        keys[item] = item_key(c, reader, rois_buf, item)
        counts[keys[item] + c.i_one] = counts[keys[item] + c.i_one] + c.i_one
    for i in range(c.num_keys):
        counts[i + c.i_one] = counts[i + c.i_one] + counts[i]
    for item in range(c.items):
        order[counts[keys[item]]] = item
        counts[keys[item]] = counts[keys[item]] + c.i_one


@T.macro
def assign_chunks(c, order, owner, chunk_start):
    # the bin rows in the order of their first sample row, cut into equal runs
    seen = T.alloc_buffer((1,), c.idx, scope="local")
    seen[0] = c.i_zero
    for chunk in range(c.chunks):
        chunk_start[chunk] = c.items
    for i in range(c.items):
        if order[i] % c.row_samples == c.i_zero:
            owner[order[i] // c.row_samples] = seen[0] * c.chunks // c.rows
            if chunk_start[seen[0] * c.chunks // c.rows] == c.items:
                chunk_start[seen[0] * c.chunks // c.rows] = i
            seen[0] = seen[0] + c.i_one
