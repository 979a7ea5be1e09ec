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

The command line (``tvm-roialign``, ``python -m tvm_roialign``) is the one exception: its process
imports TVM and registers after parsing its arguments (:func:`tvm_roialign.cli.main`), so that
``--help``, ``--version`` and syntax errors take no TVM import (seconds).

Importing changes nothing else: not the process environment, not TVM's thread pool (the CLI, the
detector runtime and the benchmarks size the pool to the usable cores where they create a runtime:
:mod:`tvm_roialign.host`).
"""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

from ._names import PUBLIC_NAMES
from ._version import __version__ as __version__

__all__ = list(PUBLIC_NAMES)


def _command_line_process() -> bool:
    """Whether this process is the command line: the ``tvm-roialign`` script or ``python -m
    tvm_roialign`` (told by the process's own arguments, read before the script runs)."""
    if not sys.argv:
        return False
    if sys.argv[0] == "-m":  # runpy finds the module of ``python -m`` (this package's import)
        args = sys.orig_argv
        return f"-m{__name__}" in args or any(
            a == "-m" and b == __name__ for a, b in itertools.pairwise(args)
        )
    return Path(sys.argv[0]).name.startswith("tvm-roialign")


def __getattr__(name: str):
    """The package's names where the command line has not loaded them yet."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}._api"), name)


if not _command_line_process():
    from ._api import *  # noqa: F403 - registers
