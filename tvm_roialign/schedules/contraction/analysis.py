"""The analysis half of the register-tiled contraction: which reduction blocks are contractions, and
the role of each of their loops (see :mod:`~tvm_roialign.schedules.contraction.schedule` for the schedule).

A *contraction* here is a reduction block ``out[S...] += a[...] * w[...]`` whose last output axis
(the *column*: output channels of an NHWC conv, ``N`` of a matmul) indexes ``w`` alone. Its spatial
axes are classified by the operand they index:

* ``B`` (batch): both ``a`` and ``w`` (batched matmul);
* ``M`` (rows): ``a`` only (image, height, width of a conv; ``M`` of a matmul);
* ``N`` (columns): ``w`` only; the last one is vectorized, others stay outer loops.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir import Schedule

from ..base import loop_extent, static_int, walk


@dataclass
class Contraction:
    """A contraction block and the role of each of its loops (see module docstring)."""

    block: object  # SBlockRV
    roles: str  # one of B/M/N/R per loop, in loop order
    #: per loop; None for a symbolic extent (batch and row loops only)
    extents: list[int | None]
    column: int  # loop position of the vectorized column axis
    data_read: int  # read-region index of ``a``
    weight_read: int  # read-region index of ``w``
    weight_column_dim: int  # dimension of ``w`` indexed by the column axis
    weight_ndim: int
    dtype: str
    #: dimension of the output indexed by the innermost row (``M``) loop, and its block var
    row_dim: int = -1
    row_var: str = ""
    name: str = ""

    @property
    def num_columns(self) -> int:
        return self.extents[self.column]



def _vars_of(expr) -> set:
    found = set()
    walk(expr, tirx.Var, found.add)
    return found


def _loop_extents(sch: Schedule, loops, iters) -> list | None:
    """Each loop's static extent (None: symbolic), or None when a loop's extent is not its iter's."""
    extents = []
    for loop, it in zip(loops, iters):
        extent = loop_extent(sch, loop)
        if extent is not None and static_int(it.dom.extent) != extent:
            return None
        extents.append(extent)
    return extents


def _weight_operand(stmt, column_var):
    """``(weight, data, column dim of the weight, weight rank, variables each read uses)``: the
    weight is the read indexed by the output column and the other one not (point accesses only);
    None when there is no such read."""
    uses = [set().union(*(_vars_of(r.min) for r in read.region)) for read in stmt.reads]
    weight = [i for i in (0, 1) if column_var in uses[i] and column_var not in uses[1 - i]]
    if len(weight) != 1:
        return None
    weight = weight[0]
    wregion = stmt.reads[weight].region
    dims = [
        d
        for d, r in enumerate(wregion)
        if isinstance(r.min, tirx.Var) and r.min.same_as(column_var)
    ]
    if len(dims) != 1 or not all(static_int(r.extent) == 1 for r in wregion):
        return None
    return weight, 1 - weight, dims[0], len(wregion), uses


def _iter_roles(iters, data_uses: set, weight_uses: set) -> str | None:
    """One letter per iter: ``R`` reduction, ``B`` batch (both operands), ``N`` column (weight
    only), ``M`` row (data only); None for another iter kind or without a reduction and a row."""
    roles = []
    for it in iters:
        if it.iter_type == tirx.IterVar.CommReduce:
            roles.append("R")
        elif it.iter_type != tirx.IterVar.DataPar:
            return None
        elif it.var in data_uses and it.var in weight_uses:
            roles.append("B")
        elif it.var in weight_uses:
            roles.append("N")
        else:
            roles.append("M")
    if "R" not in roles or "M" not in roles:
        return None
    return "".join(roles)


def analyze_contraction(sch: Schedule, block) -> Contraction | None:
    """The :class:`Contraction` view of ``block``, or None when it is not one."""
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or len(stmt.reads) != 2 or stmt.init is None:
        return None
    loops = sch.get_loops(block)
    iters = list(stmt.iter_vars)
    if len(loops) != len(iters):
        return None
    extents = _loop_extents(sch, loops, iters)
    # every iter bound to its own loop, in order (the normal form dlight's analysis checks)
    if extents is None or not _trivially_bound(sch, block, loops):
        return None
    var_pos = {it.var: i for i, it in enumerate(iters)}
    out_idx = [r.min for r in stmt.writes[0].region]
    if not all(isinstance(e, tirx.Var) and e in var_pos for e in out_idx):
        return None
    column_var = out_idx[-1]
    operand = _weight_operand(stmt, column_var)
    if operand is None:
        return None
    weight, data, weight_dim, weight_rank, uses = operand
    roles = _iter_roles(iters, uses[data], uses[weight])
    if roles is None:
        return None
    # a symbolic image size or batch is served; symbolic channels or reductions are not
    if any(e is None and r not in "BM" for r, e in zip(roles, extents)):
        return None
    dtype = (
        str(stmt.writes[0].source.ty.dtype)
        if hasattr(stmt.writes[0].source.ty, "dtype")
        else "float32"
    )
    last_row = [it.var for it, r in zip(iters, roles) if r == "M"][-1]
    return Contraction(
        block,
        roles,
        extents,
        var_pos[column_var],
        data,
        weight,
        weight_dim,
        weight_rank,
        dtype,
        next(d for d, e in enumerate(out_idx) if e.same_as(last_row)),
        last_row.name,
        stmt.name_hint,
    )


def _trivially_bound(sch: Schedule, block, loops) -> bool:
    target = sch.get(block)
    found = []
    walk(sch.mod["main"].body, s_tir.SBlockRealize, found.append)
    realize = [r for r in found if r.block.same_as(target)]
    if len(realize) != 1 or len(realize[0].iter_values) != len(loops):
        return False
    return all(
        isinstance(value, tirx.Var) and value.same_as(sch.get(loop).loop_var)
        for value, loop in zip(realize[0].iter_values, loops)
    )


def rows_pos(c: Contraction) -> int:
    """Loop position of the innermost row axis (the one the register tile splits)."""
    return c.roles.rindex("M")


def reduction_size(c: Contraction) -> int:
    """The product of ``c``'s (static) reduction extents: one output's multiply-adds."""
    size = 1
    for role, extent in zip(c.roles, c.extents):
        size *= extent if role == "R" else 1
    return size


def weight_bytes(c: Contraction) -> int:
    """Bytes of ``w`` one batch of ``c`` reads (reduction x columns, float32)."""
    return reduction_size(c) * c.num_columns * 4


__all__ = [
    "Contraction",
    "analyze_contraction",
    "reduction_size",
    "rows_pos",
    "weight_bytes",
]
