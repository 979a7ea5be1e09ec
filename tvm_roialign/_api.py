"""The package's API and the registration :mod:`tvm_roialign` does (its docstring says what): kept
apart from the package's ``__init__`` so that the command line imports TVM only once its arguments
parse (``--help`` imports no TVM)."""

from __future__ import annotations

import contextlib

# The F401 waivers and the redundant alias below mark re-exports: the names of PUBLIC_NAMES.
from . import (
    _registry,
    frontend,  # noqa: F401
    passes,  # noqa: F401
    strategies,  # noqa: F401
    topi,  # noqa: F401
)
from . import pipeline as _pipeline
from ._names import PUBLIC_NAMES
from ._version import __version__ as __version__
from .ops import multiscale_roi_align as _multiscale_roi_align_op
from .ops import nms as _nms_op
from .ops import ps_roi_align as _ps_roi_align_op
from .ops import quantized_roi_align as _quantized_roi_align_op
from .ops import roi_align as _roi_align_op
from .ops import roi_align_rotated as _roi_align_rotated_op
from .ops.multiscale_roi_align import (
    make_multiscale_roi_align as multiscale_roi_align,  # noqa: F401
)
from .ops.ps_roi_align import make_ps_roi_align as ps_roi_align  # noqa: F401
from .ops.quantized_roi_align import make_quantized_roi_align as quantized_roi_align  # noqa: F401
from .ops.roi_align import make_roi_align as roi_align  # noqa: F401
from .ops.roi_align_rotated import make_roi_align_rotated as roi_align_rotated  # noqa: F401
from .passes import layout as _layout_pass
from .passes import layout_clip as _layout_clip
from .passes import layout_qdq as _layout_qdq

_REGISTER_HOOKS = [
    _roi_align_op.register,
    _multiscale_roi_align_op.register,
    _ps_roi_align_op.register,
    _roi_align_rotated_op.register,
    _quantized_roi_align_op.register,
    _layout_pass.register,
    _layout_clip.register,
    _layout_qdq.register,
    _nms_op.register,
    _pipeline.register,
]


def register() -> None:
    """Register every op attribute of tvm-roialign (idempotent; done on import)."""
    for hook in _REGISTER_HOOKS:
        hook()


def unregister() -> None:
    """Restore every op attribute that :func:`register` changed, leaving stock TVM exactly."""
    _registry.restore_all()


def is_registered() -> bool:
    return _registry.is_set(_roi_align_op.OP_NAME, "FLegalize")


@contextlib.contextmanager
def stock_tvm():
    """Run the block with stock TVM: every attribute tvm-roialign registered is restored for its
    duration and registered again afterwards (if it was registered before), also when it raises.

    Example::

        with tvm_roialign.stock_tvm():
            executable = tvm.compile(mod, target="llvm")  # stock TVM's roi_align
    """
    was_registered = is_registered()
    unregister()
    try:
        yield
    finally:
        if was_registered:
            register()


register()

__all__ = list(PUBLIC_NAMES)
