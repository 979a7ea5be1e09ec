"""``ConvertLayout`` that never fails a build: where the conversion fails, the region it fails on
stays in the model's own layout.

TVM's ``relax.transform.ConvertLayout`` raises on graphs its layout rules do not cover (an output of
unknown rank after a converted convolution, for one). A layout conversion is an optimization, so
:class:`ConvertLayoutWherePossible` runs :class:`~.convert_layout.ConvertLayout`, and when it
raises, looks for the converted calls (convolutions, RoIAlign) whose new layout reaches the op that
fails: the shortest prefix of them, in program order, whose conversion fails ends with one such
call, which is then kept in its own layout (its output is in the model's layout again, so the
layout stops there); this repeats until the conversion succeeds. Where the conversion fails with no
call converted, or more than ``max_kept`` calls would be kept, the whole module keeps its layout.
Either way the pass reports one line (:class:`LayoutFallback`) through ``report``
(``warnings.warn`` unless given) and returns a module that builds.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field

import tvm
from tvm import relax

from .convert_layout import PINNED_LAYOUTS, convert_layouts, normalize_desired_layouts, resolve_layouts
from .normalize_squeeze_axes import NormalizeSqueezeAxes


@dataclass
class LayoutFallback:
    """What :class:`ConvertLayoutWherePossible` kept in the model's own layout, and why."""

    layout: str
    error: str
    kept: Counter = field(default_factory=Counter)
    converted: int = 0
    whole: bool = False

    def note(self) -> str:
        """One line for the user."""
        head = f"note: layout conversion to {self.layout} failed ({self.error})"
        if self.whole:
            return f"{head}; the model is built in its own layout"
        kept = ", ".join(f"{n} {op}" for op, n in sorted(self.kept.items()))
        return (
            f"{head}; {kept} kept in the model's own layout, {self.converted} converted "
            f"to {self.layout}"
        )


def error_line(err: BaseException) -> str:
    """The last line of a TVM error's message (its check), without the check's condition."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = lines[-1] if lines else type(err).__name__
    return text.split(" is false: ", 1)[-1].rstrip(".")


def _candidates(mod: tvm.IRModule, desired) -> list:
    """The calls of ``mod``'s dataflow blocks that the conversion moves, in program order."""
    calls = []
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                continue
            for binding in block.bindings:
                call = binding.value
                if (
                    isinstance(call, relax.Call)
                    and isinstance(call.op, tvm.ir.Op)
                    and call.op.name not in PINNED_LAYOUTS
                    and resolve_layouts(call, desired)
                ):
                    calls.append(call)
    return calls


@contextlib.contextmanager
def native_stderr_dropped_on_failure():
    """What TVM's C++ code writes to file descriptor 2 during the block reaches it only when the
    block succeeds: a failed conversion leaves "BlockBuilder destroyed with remaining blocks!"."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2: nothing to hold back
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                sink.seek(0)
                os.write(2, sink.read())


class _Search:
    """Conversions of one module with some calls kept in their layout; one succeeds when neither
    the conversion nor ``check`` of its result raises."""

    def __init__(self, mod, desired, check):
        self.mod = mod
        self.desired = desired
        self.check = check
        self.error = None

    def convert(self, keep):
        """The converted module, or None where the conversion (or the check) raises."""
        try:
            with native_stderr_dropped_on_failure():
                converted = convert_layouts(self.mod, self.desired, frozenset(keep))
                if self.check is not None:
                    self.check(converted)
            return converted
        except Exception as err:  # noqa: BLE001 - TVM raises InternalError, TVMError, bad_alloc ...
            self.error = err
            return None

    def culprit(self, keep: set, rest: list):
        """The last call of the shortest prefix of ``rest`` whose conversion fails (the others of
        ``rest`` and ``keep`` kept), or None when nothing converted fails too."""
        if self.convert(keep | set(rest)) is None:
            return None
        low, high = 1, len(rest)  # converting rest[:high] fails, rest[:low - 1] does not
        while low < high:
            mid = (low + high) // 2
            if self.convert(keep | set(rest[mid:])) is None:
                high = mid
            else:
                low = mid + 1
        return rest[low - 1]

    def around(self, max_kept: int):
        """``(converted module, calls kept)``; ``(None, ...)`` when the whole module stays."""
        candidates = _candidates(self.mod, self.desired)
        keep: set = set()
        while len(keep) < min(max_kept, len(candidates)):
            culprit = self.culprit(keep, [c for c in candidates if c not in keep])
            if culprit is None:
                return None, keep
            keep.add(culprit)
            converted = self.convert(keep)
            if converted is not None:
                return converted, keep
        return None, keep


def legalize_check(target: tvm.target.Target):
    """A ``check`` for :class:`ConvertLayoutWherePossible`: that the converted module legalizes
    for ``target`` (layout rules can give an op a layout its legalization rejects)."""

    def check(mod: tvm.IRModule) -> None:
        with target:
            relax.transform.LegalizeOps()(mod)

    return check


def _short_name(call) -> str:
    return str(call.op.name).rpartition(".")[2]


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.ConvertLayoutWherePossible")
class ConvertLayoutWherePossible:  # pylint: disable=too-few-public-methods
    """:class:`~.convert_layout.ConvertLayout` (same ``desired_layouts``), with the region its
    conversion fails on kept in its own layout (see the module); ``report(line)`` gets one line
    when anything was kept. With ``check`` (e.g. :func:`legalize_check`), a conversion whose result
    ``check`` raises on counts as failed too."""

    def __init__(self, desired_layouts, report=None, check=None, max_kept: int = 8):
        self.desired_layouts = normalize_desired_layouts(desired_layouts)
        self.report = report or (lambda line: warnings.warn(line, stacklevel=2))
        self.check = check
        self.max_kept = max_kept

    def _layout_name(self) -> str:
        return "/".join(sorted({layouts[0] for layouts in self.desired_layouts.values()}))

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        try:
            mod = NormalizeSqueezeAxes()(mod)
        except Exception:  # noqa: BLE001 - then the conversion below fails on it too
            pass
        search = _Search(mod, self.desired_layouts, self.check)
        converted = search.convert(set())
        if converted is not None:
            return converted
        fallback = LayoutFallback(self._layout_name(), error_line(search.error))
        converted, kept = search.around(self.max_kept)
        fallback.whole = converted is None
        if converted is not None:
            fallback.kept = Counter(_short_name(call) for call in kept)
            fallback.converted = len(_candidates(mod, self.desired_layouts)) - len(kept)
        self.report(fallback.note())
        return mod if converted is None else converted


__all__ = [
    "ConvertLayoutWherePossible",
    "LayoutFallback",
    "error_line",
    "legalize_check",
    "native_stderr_dropped_on_failure",
]
