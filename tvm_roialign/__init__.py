"""tvm-roialign: RoIAlign as a first-class, fast, exactly-correct operator for Apache TVM (Relax).

Importing the package registers, idempotently and above TVM's own level:

* ``FInferType`` and ``FLegalize`` for ``relax.vision.roi_align``: the output keeps the data dtype,
  and legalization picks the strategy of the current target (x86, ARM, CUDA, Metal, generic llvm),
  returning already-scheduled TIR;
* ``FRelaxInferLayout`` for ``relax.vision.roi_align`` (layout inference for ``ConvertLayout``), and
  for ``relax.clip`` and per-tensor ``relax.quantize`` / ``relax.dequantize``, which have none;
* the fused op ``relax.vision.multiscale_roi_align`` (FPN level chosen inside the kernel);
* the RoI family ``relax.vision.roi_align_rotated`` (detectron2 / mmcv / OpenVINO rotated RoIAlign)
  and ``relax.vision.ps_roi_align`` (torchvision's position-sensitive RoIAlign), with the same
  strategies and layout rule;
* ``relax.vision.quantized_roi_align`` (torchvision's ``roi_align`` on a per-tensor quantized uint8 /
  int8 map; requantized or float32 output);
* the named Relax pipeline ``"tvm_roialign_cpu"`` (``tvm.compile(mod, target,
  relax_pipeline="tvm_roialign_cpu")``), the package's CPU pipeline.

:func:`unregister` restores stock TVM exactly; :func:`register` registers again; ``with
stock_tvm():`` runs a block with stock TVM.

Importing changes nothing else: not the process environment, not TVM's thread pool (the CLI, the
detector runtime and the benchmarks size the pool to the usable cores where they create a runtime:
:mod:`tvm_roialign.host`).
"""

from __future__ import annotations

import contextlib

from . import (
    _registry,
    frontend,
    passes,
    strategies,
    topi,
)
from . import pipeline as _pipeline
from ._version import __version__
from .ops import multiscale_roi_align as _multiscale_roi_align_op
from .ops import nms as _nms_op
from .ops import ps_roi_align as _ps_roi_align_op
from .ops import quantized_roi_align as _quantized_roi_align_op
from .ops import roi_align as _roi_align_op
from .ops import roi_align_rotated as _roi_align_rotated_op
from .ops.multiscale_roi_align import (
    make_multiscale_roi_align as multiscale_roi_align,
)
from .ops.ps_roi_align import make_ps_roi_align as ps_roi_align
from .ops.quantized_roi_align import make_quantized_roi_align as quantized_roi_align
from .ops.roi_align import make_roi_align as roi_align
from .ops.roi_align_rotated import make_roi_align_rotated as roi_align_rotated
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

__all__ = [
    "__version__",
    "frontend",
    "is_registered",
    "multiscale_roi_align",
    "passes",
    "ps_roi_align",
    "quantized_roi_align",
    "register",
    "roi_align",
    "roi_align_rotated",
    "stock_tvm",
    "strategies",
    "topi",
    "unregister",
]
