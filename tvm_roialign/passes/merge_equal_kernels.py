"""One PrimFunc for each set of structurally equal ones, so that a kernel is lowered and compiled once
however many call sites share it.

Legalization and ``FuseTIR`` make a PrimFunc per op or fused group whose signature differs in
anything. At symbolic sizes the same reshape, concatenation or anchor arithmetic on each level of a
detector's pyramid differs per level only in its extents (``(h - 1) // 8 + 1`` on one level,
``// 16`` on the next); once the schedule rules have given each such extent a variable of its own,
bound from the arguments at run time (:mod:`tvm_roialign.schedules.symbolic_extents`), the copies
are equal. In the default Mask R-CNN build 53 of 233 scheduled kernels were such copies. This pass
keeps the first of each set (equal under ``structural_equal`` with free variables mapped, attributes
included) and points every call at it; the others are dropped.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx


def _canonical(mod: tvm.IRModule) -> dict:
    """``{GlobalVar: GlobalVar of its first equal PrimFunc}`` for the PrimFuncs that have one."""
    first: dict[int, list] = {}
    mapping = {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        key = tvm_ffi.structural_hash(func, map_free_vars=True)
        for kept, kept_func in first.setdefault(key, []):
            if tvm_ffi.structural_equal(func, kept_func, map_free_vars=True):
                mapping[gvar] = kept
                break
        else:
            first[key].append((gvar, func))
    return mapping


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.MergeEqualKernels")
class MergeEqualKernels:  # pylint: disable=too-few-public-methods
    """Merge structurally equal PrimFuncs (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        mapping = _canonical(mod)
        if not mapping:
            return mod
        by_name = {gvar.name_hint: kept for gvar, kept in mapping.items()}

        def redirect(gvar):
            return by_name.get(gvar.name_hint, gvar)

        functions = {}
        for gvar, func in mod.functions_items():
            if gvar in mapping:
                continue
            if isinstance(func, relax.Function):
                func = tvm_ffi.structural_map(func, (tvm.ir.GlobalVar, redirect))
            functions[gvar] = func
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


__all__ = ["MergeEqualKernels"]
