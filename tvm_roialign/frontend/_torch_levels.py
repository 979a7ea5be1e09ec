"""Recognise torchvision's per-level ``MultiScaleRoIAlign`` in a plainly exported FX graph.

``torch.export.export`` of a model with a (multi-level) ``torchvision.ops.MultiScaleRoIAlign``
records the pooler's Python loop as it ran: the FPN level of every roi (torchvision's
``LevelMapper``: ``clamp(floor(k0 + log2(sqrt(area) / s0) + eps), k_min, k_max) - k_min``), then
per level ``l`` the rois of that level (``nonzero(levels == l)``, ``index``), one ``roi_align`` and
an ``index_put`` into a zero tensor. ``nonzero`` has a data-dependent size, which TVM's importer
cannot express. :func:`fuse_per_level_pooling` finds that shape in the graph, checks that it is
torchvision's (the level formula from the same boxes as the rois, the level bounds those of the
scales, consistent per-level attributes, intermediates used by nothing else) and replaces it by one
``tvm_roialign::multiscale_roi_align`` node, which the importer maps to the fused
``relax.vision.multiscale_roi_align`` (its kernel computes the same levels). A per-level shape that
does not check out raises one line naming :func:`tvm_roialign.frontend.export`.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from ..topi.multiscale_roi_align import LEVEL_EPS, level_range

__all__ = ["UnsupportedPooling", "fuse_per_level_pooling", "has_per_level_pooling"]

aten = torch.ops.aten
#: Nodes that only change dtype / aliasing: looked through when matching.
_TRANSPARENT = {
    aten._to_copy.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten.clone.default,
    aten.alias.default,
    aten.detach.default,
    aten.detach_.default,
    aten.lift_fresh_copy.default,
}
_ZEROS = {aten.zeros.default, aten.full.default, aten.new_zeros.default, aten.zeros_like.default}
_INDEX_PUT = {aten.index_put.default, aten.index_put_.default}
#: Shape checks that reference the data-dependent sizes; removed with the per-level nodes.
_CHECKS = {
    aten._assert_scalar.default,
    aten._assert_tensor_metadata.default,
    aten.sym_size.int,
    aten.sym_constrain_range_for_size.default,
    operator.ge,
    operator.le,
    operator.gt,
    operator.lt,
    operator.eq,
}
_HINT = (
    "export the model with tvm_roialign.frontend.export(model, args) so that the pooler becomes "
    "one multiscale_roi_align"
)


class UnsupportedPooling(NotImplementedError):
    """A per-level RoIAlign shape that is not torchvision's MultiScaleRoIAlign (one-line message)."""


def _roi_align_op():
    return torch.ops.torchvision.roi_align.default


def _strip(node):
    while isinstance(node, torch.fx.Node) and node.target in _TRANSPARENT:
        node = node.args[0]
    return node


def _is(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


class _Mismatch(Exception):
    pass


def _expect(condition, reason):
    if not condition:
        raise _Mismatch(reason)


def has_per_level_pooling(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` has a ``roi_align`` whose rois are selected by a data-dependent index."""
    return any(_is(n, _roi_align_op()) and _is(_strip(n.args[1]), aten.index.Tensor)
               for n in graph.nodes)


def _level_index(idx):
    """``(levels, l)`` of ``idx = nonzero(levels == l)`` in its exported forms."""
    node = _strip(idx)
    if _is(node, aten.squeeze.dims, aten.squeeze.dim):  # nonzero -> slice(.., 1, 0, 1) -> squeeze
        node = node.args[0]
        _expect(_is(node, aten.slice.Tensor) and tuple(node.args[1:4]) == (1, 0, 1),
                "unexpected index shape")
        node = node.args[0]
        _expect(_is(node, aten.nonzero.default), "index is not nonzero(levels == l)")
    elif _is(node, aten.select.int):  # nonzero -> select(.., 1, 0)
        _expect(tuple(node.args[1:3]) == (1, 0), "unexpected index shape")
        node = node.args[0]
        _expect(_is(node, aten.nonzero.default), "index is not nonzero(levels == l)")
    else:  # torch.where(cond)[0]
        _expect(_is(node, operator.getitem) and node.args[1] == 0, "index is not where(...)[0]")
        node = node.args[0]
        _expect(_is(node, aten.where.default) and len(node.args) == 1,
                "index is not torch.where(levels == l)")
    eq = node.args[0]
    _expect(_is(eq, aten.eq.Scalar), "index is not selected by levels == l")
    return eq, _strip(eq.args[0]), eq.args[1]


class _Match:
    """One recognised pooler: the nodes to replace and the fused op's arguments."""

    def __init__(self, final):
        self.final = final
        self.nodes: set[torch.fx.Node] = set()  # the index_put chain, roi_aligns, indexes, zeros
        self.selections: list[torch.fx.Node] = []  # the ``levels == l`` nodes
        self.features = []
        self.scales = []
        self.rois = None
        self.levels = None
        self.attrs = None  # (PH, PW, sampling_ratio, aligned)


def _match_chain(final) -> _Match:
    """Walk ``index_put`` back to the zero tensor: level ``L-1`` first."""
    match = _Match(final)
    steps = []
    node = final
    while _is(node, *_INDEX_PUT):
        base, indices, values = node.args[:3]
        _expect(len(indices) == 1, "index_put with more than one index")
        pooled = _strip(values)
        _expect(_is(pooled, _roi_align_op()), "index_put of something other than roi_align")
        selected = _strip(pooled.args[1])
        _expect(_is(selected, aten.index.Tensor) and len(selected.args[1]) == 1,
                "roi_align of rois not selected by an index")
        _expect(_strip(selected.args[1][0]) is _strip(indices[0]),
                "roi_align rois and index_put positions differ")
        eq, levels, level = _level_index(indices[0])
        steps.append((level, pooled, selected, levels))
        match.nodes.update({node, pooled, selected})
        match.selections.append(eq)
        node = base
    _expect(_is(node, *_ZEROS), "per-level results not written into a zero tensor")
    if node.target is aten.full.default:
        _expect(node.args[1] == 0, "per-level results not written into a zero tensor")
    match.nodes.add(node)
    steps.reverse()
    _expect([s[0] for s in steps] == list(range(len(steps))) and len(steps) > 1,
            "levels not written in order 0, 1, ...")
    rois = {_strip(s[2].args[0]) for s in steps}
    levels = {s[3] for s in steps}
    _expect(len(rois) == 1 and len(levels) == 1, "levels read different rois")
    match.rois, match.levels = rois.pop(), levels.pop()
    attrs = set()
    for _, pooled, _, _ in steps:
        args = list(pooled.args) + [None] * (7 - len(pooled.args))
        feature, _, scale, ph, pw, sampling_ratio, aligned = args
        match.features.append(feature)
        match.scales.append(float(scale if scale is not None else 1.0))
        attrs.add((int(ph), int(pw if pw is not None else ph), int(sampling_ratio),
                   bool(aligned)))
    _expect(len(attrs) == 1, "levels pooled with different output sizes or sampling ratios")
    match.attrs = attrs.pop()
    return match


def _scalar(node, ep):
    """A number from a Python scalar, or from a constant tensor placeholder of ``ep``."""
    node = _strip(node)
    if isinstance(node, (int, float)):
        return float(node)
    _expect(isinstance(node, torch.fx.Node) and node.op == "placeholder", "non-constant operand")
    for spec in ep.graph_signature.input_specs:
        if spec.arg.name == node.name and spec.target is not None:
            value = ep.constants.get(spec.target, ep.state_dict.get(spec.target))
            _expect(isinstance(value, torch.Tensor) and value.numel() == 1, "non-scalar constant")
            return float(value.item())
    raise _Mismatch("operand is not a constant")


def _add_terms(node, *targets):
    """``(operand, other)`` of ``a + b`` (either order), ``operand`` the one computed by
    ``targets``."""
    _expect(_is(node, aten.add.Tensor, aten.add.Scalar), "level formula: expected an addition")
    a, b = node.args[:2]
    if _is(_strip(a), *targets):
        return _strip(a), b
    _expect(_is(_strip(b), *targets), "level formula: unexpected addition")
    return _strip(b), a


def _box_list(node):
    """The box tensors concatenated (dim 0) by ``node``, or ``[node]``."""
    node = _strip(node)
    if _is(node, aten.cat.default) and (len(node.args) < 2 or node.args[1] == 0):
        return [_strip(n) for n in node.args[0]]
    return [node]


def _area_box(node):
    """``B`` of ``(B[:, 2] - B[:, 0]) * (B[:, 3] - B[:, 1])`` (torchvision's ``box_area``)."""
    node = _strip(node)
    _expect(_is(node, aten.mul.Tensor), "level formula: box area expected")
    boxes = set()
    for side, (hi, lo) in zip(node.args[:2], ((2, 0), (3, 1))):
        side = _strip(side)
        _expect(_is(side, aten.sub.Tensor), "level formula: box side expected")
        for operand, column in zip(side.args[:2], (hi, lo)):
            operand = _strip(operand)
            _expect(_is(operand, aten.select.int) and tuple(operand.args[1:3]) == (1, column),
                    "level formula: box columns expected")
            boxes.add(_strip(operand.args[0]))
    _expect(len(boxes) == 1, "level formula: area of two different boxes")
    return boxes.pop()


def _check_levels(match: _Match, ep):
    """The levels are torchvision's LevelMapper of the rois' boxes; returns ``(s0, k0)``."""
    node = match.levels
    _expect(_is(node, aten.sub.Tensor), "levels: expected (k - k_min)")
    k_min = _scalar(node.args[1], ep)
    node = _strip(node.args[0])
    _expect(_is(node, aten.clamp.default), "levels: expected clamp(k, k_min, k_max)")
    lo, hi = (float(v) for v in node.args[1:3])
    _expect(lo == k_min, "levels: clamp and offset disagree")
    floor = _strip(node.args[0])
    _expect(_is(floor, aten.floor.default), "levels: expected floor")
    total, eps = _add_terms(_strip(floor.args[0]), aten.add.Tensor, aten.add.Scalar)
    log2, k0 = _add_terms(total, aten.log2.default)
    div = _strip(log2.args[0])
    _expect(_is(div, aten.div.Tensor, aten.div.Scalar), "levels: expected sqrt(area) / s0")
    s0 = _scalar(div.args[1], ep)
    sqrt = _strip(div.args[0])
    _expect(_is(sqrt, aten.sqrt.default), "levels: expected sqrt(area)")
    areas = _strip(sqrt.args[0])
    area_nodes = areas.args[0] if _is(areas, aten.cat.default) else [areas]
    area_boxes = [_area_box(a) for a in area_nodes]
    rois = match.rois
    _expect(_is(rois, aten.cat.default) and len(rois.args) > 1 and rois.args[1] == 1
            and len(rois.args[0]) == 2, "rois are not cat([batch index, boxes], 1)")
    _expect(_box_list(rois.args[0][1]) == area_boxes, "levels computed from other boxes")
    k0 = _scalar(k0, ep)
    _expect(np.float32(_scalar(eps, ep)) == np.float32(LEVEL_EPS), "levels: eps is not 1e-6")
    _expect(float(k0).is_integer() and float(s0) > 0, "levels: unusual canonical level / scale")
    _expect((lo, hi) == tuple(float(k) for k in level_range(match.scales)),
            "level bounds differ from those of the scales")
    return s0, int(k0)


def _per_level_nodes(match: _Match) -> set:
    """Every node that exists for the per-level pooling: downstream of the ``levels == l``
    selections and the zero tensor, up to the final result (whose users are kept)."""
    seen, stack = set(), [*match.selections, *(n for n in match.nodes if _is(n, *_ZEROS))]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node is not match.final:
            stack.extend(node.users)
    allowed = {aten.eq.Scalar, aten.nonzero.default, aten.where.default, operator.getitem,
               aten.slice.Tensor, aten.squeeze.dims, aten.squeeze.dim, aten.select.int,
               *_TRANSPARENT, *_CHECKS}
    for node in seen:
        _expect(node in match.nodes or node.target in allowed,
                f"a per-level intermediate is also used by {node.target}")
    return seen


def _replace(graph: torch.fx.Graph, match: _Match, s0, k0) -> None:
    dead = _per_level_nodes(match)
    ph, pw, sampling_ratio, aligned = match.attrs
    with graph.inserting_before(match.final):
        fused = graph.call_function(
            torch.ops.tvm_roialign.multiscale_roi_align.default,
            (list(match.features), match.rois, [ph, pw], list(match.scales), sampling_ratio,
             aligned, int(s0) if float(s0).is_integer() else s0, k0),
        )
    fused.meta.update(match.final.meta)
    match.final.replace_all_uses_with(fused)
    for node in reversed(list(graph.nodes)):
        if node in dead:
            graph.erase_node(node)


def _drop_dead(graph: torch.fx.Graph) -> None:
    """Remove pure nodes without users, and metadata checks on values nothing else uses."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if node.op != "call_function" or node.users:
                continue
            if node.target is aten._assert_tensor_metadata.default:
                source = node.args[0]
                if isinstance(source, torch.fx.Node) and len(source.users) == 1:
                    graph.erase_node(node)
                    changed = True
            elif not node.is_impure():
                graph.erase_node(node)
                changed = True


def fuse_per_level_pooling(ep: torch.export.ExportedProgram) -> int:
    """Replace every torchvision per-level pooling of ``ep``'s graph (in place) by one
    ``tvm_roialign::multiscale_roi_align`` node; returns how many were replaced.

    Raises
    ------
    UnsupportedPooling
        A ``roi_align`` of data-dependently selected rois that is not torchvision's pooler.
    """
    graph = ep.graph_module.graph
    finals = [n for n in graph.nodes if _is(n, *_INDEX_PUT)
              and not any(_is(u, *_INDEX_PUT) for u in n.users)]
    count = 0
    for final in finals:
        if not _is(_strip(final.args[2]), _roi_align_op()):
            continue  # an index_put of something else: not ours to judge
        try:
            match = _match_chain(final)
            s0, k0 = _check_levels(match, ep)
            _replace(graph, match, s0, k0)
        except _Mismatch as err:
            raise UnsupportedPooling(
                f"cannot import a per-level RoIAlign of the exported graph ({err}); {_HINT}"
            ) from None
        count += 1
    if has_per_level_pooling(graph):
        raise UnsupportedPooling(
            "cannot import a roi_align whose rois are selected by a data-dependent index "
            f"(nonzero) outside torchvision's MultiScaleRoIAlign pattern; {_HINT}"
        )
    _drop_dead(graph)
    graph.lint()
    ep.graph_module.recompile()
    return count
