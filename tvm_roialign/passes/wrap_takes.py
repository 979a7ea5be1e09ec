"""A detector's gathers in mode ``"wrap"``: torch's indexing, computed exactly.

A detector indexes as torch does (eager torch raises on an index outside ``[-n, n)``, and a negative
one counts from the end, as the ``-1`` that pads NMS's ``keep``). The importer's ``take(..., mode="fast")``
reads outside the tensor on a negative index, and TVM warns at the legalization of every such call that
it segfaults out of bounds; ``"wrap"`` computes exactly torch's indexing. The detector importers run
this pass on what they import.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, is_op_call, rewrite_module


@mutator
class _WrapTakes(FunctionRewriter):
    """``take(x, i, mode="fast")`` -> ``take(x, i, mode="wrap")``."""

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not is_op_call(call, "relax.take") or call.attrs.mode != "fast":
            return call
        self.changed = True
        return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="wrap")


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.WrapTakes")
class WrapTakes:  # pylint: disable=too-few-public-methods
    """Put every ``take`` of mode ``"fast"`` in mode ``"wrap"`` (torch's indexing). The module is
    returned unchanged (the same object) when there is none."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_WrapTakes, mod)


__all__ = ["WrapTakes"]
