"""Kernels with AMX instructions ask Linux for the AMX tile state themselves.

Linux grants a process the AMX tile state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``); without it the first tile instruction kills the process with SIGILL. The
package's runtime asks before it runs a library (:func:`tvm_roialign.host.request_amx`, which turns a
refusal into a one-line error), but a library is also loaded by TVM's own API, from C++ or another
language. So every scheduled PrimFunc whose kernels configure AMX tiles (root block annotated
:data:`~tvm_roialign.schedules.intrin.amx.AMX_TILES`) starts with
the request, once per call (the kernel's blocks call the micro-kernel many times): one system call,
which returns at once when the state is already granted.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir.stmt import SBlock, SBlockRealize

from ..schedules.intrin.amx import AMX_TILES

#: ``syscall`` numbers and arguments (x86-64 Linux)
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18




def _configures_tiles(func: tirx.PrimFunc) -> bool:
    body = func.body
    return isinstance(body, SBlockRealize) and AMX_TILES in body.block.annotations


def _request() -> tirx.Stmt:
    args = [tirx.IntImm("int64", v) for v in (_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)]
    return tirx.Evaluate(tirx.call_extern("int64", "syscall", *args))


def _with_request(func: tirx.PrimFunc) -> tirx.PrimFunc:
    body = func.body
    if isinstance(body, SBlockRealize):  # a scheduled function's root block
        block = body.block
        new_block = SBlock(
            block.iter_vars,
            block.reads,
            block.writes,
            block.name_hint,
            tirx.SeqStmt([_request(), block.body]),
            block.init,
            block.alloc_buffers,
            block.match_buffers,
            block.annotations,
        )
        return func.with_body(SBlockRealize(body.iter_values, body.predicate, new_block))
    return func.with_body(tirx.SeqStmt([_request(), body]))


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvm_roialign.RequestAMXState")
class RequestAMXState:  # pylint: disable=too-few-public-methods
    """Prepend the AMX tile-state request to each PrimFunc whose kernels configure AMX tiles."""

    def transform_function(self, func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
        return _with_request(func) if _configures_tiles(func) else func


__all__ = ["AMX_TILES", "RequestAMXState"]
