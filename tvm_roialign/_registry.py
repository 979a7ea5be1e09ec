"""Reversible registration of Relax op attributes.

Every attribute that tvm-roialign sets on a Relax op goes through :func:`set_op_attr`, which remembers
what was there before, so that :func:`restore_all` can put stock TVM back exactly; named Relax
pipelines go through :func:`register_pipeline`. Registration is idempotent: setting the same (op,
attribute) twice keeps the first saved original.
"""

from __future__ import annotations

import tvm

#: Level of our attributes: TVM's built-in FLegalize / FInferType sit at level 10.
LEVEL = 11
_STOCK_LEVEL = 10

# (op_name, attr_key) -> the value that was registered before us (None if there was none)
_saved: dict[tuple[str, str], object] = {}
# (op_name, attr_key) -> the value we registered
_ours: dict[tuple[str, str], object] = {}


def get_op_attr(op_name: str, attr_key: str):
    """The attribute's current value, or None where it is not registered."""
    op = tvm.ir.Op.get(op_name)
    try:
        return op.get_attr(attr_key)
    except tvm.error.InternalError:  # the attribute map does not exist at all yet
        return None


def set_op_attr(op_name: str, attr_key: str, value) -> None:
    """Register ``value`` for ``(op_name, attr_key)`` above TVM's level, remembering the original."""
    key = (op_name, attr_key)
    if key in _saved and _ours.get(key) is value:
        return  # already registered: nothing to do
    if key not in _saved:
        _saved[key] = get_op_attr(op_name, attr_key)
    tvm.ir.Op.get(op_name).reset_attr(attr_key)
    tvm.ir.register_op_attr(op_name, attr_key, value, level=LEVEL)
    _ours[key] = value


# names of the Relax pipelines we registered in tvm.relax.pipeline.PIPELINE_MAP
_pipelines: set[str] = set()


def register_pipeline(name: str, factory) -> None:
    """Register a named Relax pipeline (``tvm.compile(..., relax_pipeline=name)``), idempotently;
    :func:`restore_all` removes it. A name TVM or someone else already registered is left alone."""
    from tvm.relax import pipeline as relax_pipeline

    if name not in relax_pipeline.PIPELINE_MAP:
        relax_pipeline.register_pipeline(name)(factory)
        _pipelines.add(name)


def is_set(op_name: str, attr_key: str) -> bool:
    return (op_name, attr_key) in _saved


def restore_all() -> None:
    """Put back every attribute saved by :func:`set_op_attr` (or remove it where there was none)."""
    for (op_name, attr_key), original in list(_saved.items()):
        op = tvm.ir.Op.get(op_name)
        op.reset_attr(attr_key)
        if original is not None:
            tvm.ir.register_op_attr(op_name, attr_key, original, level=_STOCK_LEVEL)
        del _saved[(op_name, attr_key)]
        _ours.pop((op_name, attr_key), None)
    if _pipelines:
        from tvm.relax import pipeline as relax_pipeline

        for name in list(_pipelines):
            relax_pipeline.PIPELINE_MAP.pop(name, None)
            _pipelines.discard(name)


def op_exists(op_name: str) -> bool:
    """Whether a Relax op of that name is registered (TVM 0.27 raises AttributeError otherwise)."""
    try:
        tvm.ir.Op.get(op_name)
    except AttributeError:
        return False
    return True


def get_or_register_op(op_name: str) -> tvm.ir.Op:
    """The Relax op ``op_name``, registering it (global ``ir.RegisterOp``) if it does not exist."""
    try:
        return tvm.ir.Op.get(op_name)
    except AttributeError:  # TVM 0.27 raises AttributeError for an unknown op
        tvm.get_global_func("ir.RegisterOp")(op_name, "")
        return tvm.ir.Op.get(op_name)
