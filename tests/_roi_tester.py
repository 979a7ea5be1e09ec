"""The RoI family's tester, in the manner of torchvision's op tests: one abstract base
(:class:`RoIOpTester`) whose tests every op's subclass runs (tests/test_roi_family.py), and the one
registry of the code paths a PrimFunc of the family is built and run on (:data:`PRIM_PATHS`) and of
the targets a Relax module is compiled for (:data:`RELAX_TARGETS`).

A case (:class:`RoICase`) names the path, the layout, the sampling ratio, the op's other attributes
(a tuple of ``(name, value)`` pairs) and the dtype. A subclass gives the op: how a case is built and
run (:meth:`RoIOpTester.build`), its naive float64 NumPy reference (:meth:`RoIOpTester.expected_fn`),
its peer (torchvision, OpenVINO: :meth:`RoIOpTester.peer_fn`), its inputs, its degenerate boxes, a
hypothesis strategy of fuzz cases, and its case tables; tolerances come from ``conftest.TOLERANCE``
unless the subclass says otherwise.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import pytest
import tvm
from _targets import AARCH64, CUDA, NATIVE
from _targets import GENERIC as HOST
from hypothesis import example, given, settings
from tvm import relax, te

from tvm_roialign.schedules.roi_align.gpu import RoIAlignCUDA
from tvm_roialign.strategies import STRATEGIES
from tvm_roialign.strategies.base import LAYOUT_ATTR, mark_scheduled
from tvm_roialign.testing import single_op_module

LAYOUTS = ("NCHW", "NHWC")
DTYPES = ("float32", "float16", "float64")
#: where a Relax module of one op is compiled and run (on this machine's CPU)
RELAX_TARGETS = {"relax": HOST, "llvm": HOST, "native": NATIVE}


class RoICase(NamedTuple):
    path: str
    layout: str
    sampling_ratio: int
    attrs: tuple = ()
    dtype: str = "float32"

    def get(self, name, default=None):
        return dict(self.attrs).get(name, default)

    def id(self) -> str:
        parts = [self.path, self.layout, f"sr{self.sampling_ratio}"]
        for key, value in self.attrs:
            if isinstance(value, float):
                value = f"{value:g}"
            elif isinstance(value, tuple):
                value = "x".join(map(str, value))
            parts.append(f"{key}={value}")
        return "-".join([*parts, self.dtype])


# --- the paths of a PrimFunc: (compute, te inputs, layout, attrs) -> (PrimFunc, run target) ------


def _strategy(name, build_target, kernel):
    def build(compute, inputs, layout, attrs):
        func = STRATEGIES[name].build(compute, inputs, build_target, layout,
                                      attrs if kernel else None)
        return func, HOST

    return build


def _gpu_unbound(compute, inputs, layout, attrs):
    func = te.create_prim_func([*inputs, compute(*inputs)]).with_attr(LAYOUT_ATTR, layout)
    sch = RoIAlignCUDA(bind_threads=False).apply(func, CUDA)
    return mark_scheduled(sch.mod["main"]), HOST


def _cuda(compute, inputs, layout, attrs):
    return STRATEGIES["cuda"].build(compute, inputs, CUDA, layout), CUDA


#: Every code path that computes the TE compute of an op: the x86 schedule (``x86-te``), the
#: hand-scheduled CPU kernel for adaptive grids (``x86-kernel``: built from the op's attributes),
#: the plain schedule of other llvm targets (``generic-llvm``), the ARM strategy built for aarch64
#: and run here (``arm-on-host``: its logic does not depend on the ISA), the GPU schedule's loop
#: nest left unbound (``gpu-unbound``), CUDA (``cuda``, run on a machine with a CUDA GPU).
PRIM_PATHS = {
    "x86-te": _strategy("x86", HOST, kernel=False),
    "x86-kernel": _strategy("x86", HOST, kernel=True),
    "generic-llvm": _strategy("llvm", HOST, kernel=False),
    "arm-on-host": _strategy("arm", AARCH64, kernel=True),
    "gpu-unbound": _gpu_unbound,
    "cuda": _cuda,
}


def prim_runner(func, target):
    """``run(*inputs, out_shape)`` of a PrimFunc ``(*inputs, out)``; the output starts as NaN, so an
    element the function does not write shows."""
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=target)
    device = tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu()

    def run(*arrays_and_shape):
        *arrays, out_shape = arrays_and_shape
        out = tvm.runtime.tensor(np.full(out_shape, np.nan, arrays[0].dtype), device)
        lib["main"](*[tvm.runtime.tensor(a, device) for a in arrays], out)
        return out.numpy()

    return run


def relax_runner(make_op, target, **inputs):
    """``run(*arrays)`` of the Relax module of ``make_op(*vars)`` over ``inputs`` (name: (shape,
    dtype)), compiled for :data:`RELAX_TARGETS`\\ ``[target]``."""
    mod = single_op_module(make_op, **inputs)
    vm = relax.VirtualMachine(tvm.compile(mod, target=RELAX_TARGETS[target]), tvm.cpu())
    return lambda *arrays: vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def to_layout(x, layout):
    return np.ascontiguousarray(x) if layout == "NCHW" else nhwc(x)


def from_layout(x, layout):
    return x if layout == "NCHW" else x.transpose(0, 3, 1, 2)


@functools.cache
def _built(tester, case, data_shape, num_rois):
    return tester().build(case, data_shape, num_rois)


def _shape_of(data):
    """The NCHW shape of ``data`` (a tuple of shapes for a list of feature maps)."""
    if isinstance(data, (list, tuple)):
        return tuple(tuple(d.shape) for d in data)
    return tuple(data.shape)


class RoIOpTester:
    """One op of the RoI family. The tests here run the subclass's case tables:

    * ``REFERENCE_CASES``: the op against :meth:`expected_fn` (float64, NumPy) on
      :meth:`reference_inputs`;
    * ``PEER_CASES``: against :meth:`peer_fn` on :meth:`peer_inputs`;
    * ``DEGENERATE_CASES``: boxes of zero size, inverted, non-finite, with a bad batch index
      (:meth:`degenerate`): finite, deterministic, 0 where no sample is valid, the reference
      everywhere and the peer where it is defined;
    * a bounded derandomized fuzz (:meth:`fuzz_cases`, ``FUZZ_EXAMPLES`` examples): the reference,
      zeros where a roi is not finite, the peer where it is defined (:meth:`peer_defines`).
    """

    REFERENCE_CASES: tuple = ()
    PEER_CASES: tuple = ()
    DEGENERATE_CASES: tuple = ()
    FUZZ_EXAMPLES = 30

    # --- what a subclass gives ------------------------------------------------------------------
    def build(self, case: RoICase, data_shape, num_rois: int):
        """``run(data, rois)`` of the case for NCHW data of ``data_shape`` (data and output in the
        case's layout)."""
        raise NotImplementedError

    def expected_fn(self, case, data, rois):
        """The naive float64 NumPy reference (NCHW)."""
        raise NotImplementedError

    def peer_fn(self, case, data, rois):
        """The outside implementation's output (NCHW)."""
        raise NotImplementedError

    def reference_inputs(self, case, rng):
        raise NotImplementedError

    def peer_inputs(self, case, rng):
        return self.reference_inputs(case, rng)

    def degenerate(self, case, rng):
        """``(data, rois, rows that must be 0, rows the peer defines, rows that must not be 0)``."""
        raise NotImplementedError

    def fuzz_cases(self):
        """A hypothesis strategy of ``(case, data, rois)``."""
        raise NotImplementedError

    def peer_defines(self, case, roi) -> bool:
        """Whether the peer's result is defined for ``roi``."""
        raise NotImplementedError

    def tolerance(self, case, check, tol):
        """``(rtol, atol)`` of ``check`` (reference / peer) for ``case``."""
        return tol[case.dtype], tol[case.dtype]

    def fuzz_examples(self):
        """Draws the fuzz always tries (``(case, data, rois)``)."""
        return []

    def transform_data(self, data, layout):
        return to_layout(data, layout)

    def other_data(self, data):
        return data * 100

    # --- the scaffold ---------------------------------------------------------------------------
    def run(self, case, data, rois):
        """The op's output of ``case`` on NCHW ``data``, as NCHW."""
        run = _built(type(self), case, _shape_of(data), len(rois))
        out = run(self.transform_data(data, case.layout), rois)
        assert out.dtype == np.dtype(case.dtype), out.dtype
        return from_layout(out, case.layout)

    def check_reference(self, case, out, data, rois, tol):
        rtol, atol = self.tolerance(case, "reference", tol)
        with np.errstate(invalid="ignore", over="ignore"):
            expected = self.expected_fn(case, data, rois)
        np.testing.assert_allclose(out.astype(np.float64), expected, rtol=rtol, atol=atol)

    def check_peer(self, case, out, data, rois, tol, rows=None):
        rows = list(range(len(rois))) if rows is None else list(rows)
        if rows:
            rtol, atol = self.tolerance(case, "peer", tol)
            np.testing.assert_allclose(out[rows], self.peer_fn(case, data, rois[rows]),
                                       rtol=rtol, atol=atol)

    def pytest_generate_tests(self, metafunc):
        """The case arguments of the tests from the subclass's tables."""
        for argument, table in (("reference_case", "REFERENCE_CASES"), ("peer_case", "PEER_CASES"),
                                ("degenerate_case", "DEGENERATE_CASES")):
            if argument in metafunc.fixturenames:
                cases = getattr(self, table)
                metafunc.parametrize(argument, [self.param(c) for c in cases])

    def param(self, case):
        marks = [pytest.mark.cuda] if case.path == "cuda" else []
        return pytest.param(case, id=case.id(), marks=marks)

    # --- the tests ------------------------------------------------------------------------------
    def test_matches_reference(self, reference_case, rng, tol):
        data, rois = self.reference_inputs(reference_case, rng)
        out = self.run(reference_case, data, rois)
        self.check_reference(reference_case, out, data, rois, tol)

    def test_matches_peer(self, peer_case, rng, tol):
        data, rois = self.peer_inputs(peer_case, rng)
        out = self.run(peer_case, data, rois)
        self.check_peer(peer_case, out, data, rois, tol)

    def test_degenerate_boxes(self, degenerate_case, rng, tol):
        case = degenerate_case
        data, rois, zero_rows, peer_rows, sampled_rows = self.degenerate(case, rng)
        first = self.run(case, data, rois)
        self.run(case, self.other_data(data), rois)  # a call with other data in between changes nothing
        np.testing.assert_array_equal(self.run(case, data, rois), first)
        assert np.isfinite(first).all()
        assert not first[zero_rows].any()
        assert all(first[row].any() for row in sampled_rows)
        self.check_reference(case, first, data, rois, tol)
        self.check_peer(case, first, data, rois, tol, peer_rows)

    def test_fuzz(self, tol):
        @settings(max_examples=self.FUZZ_EXAMPLES, deadline=None, derandomize=True)
        @given(drawn=self.fuzz_cases())
        def check(drawn):
            case, data, rois = drawn
            out = self.run(case, data, rois)
            assert np.isfinite(out).all()
            assert not out[~np.isfinite(rois).all(axis=1)].any()
            self.check_reference(case, out, data, rois, tol)
            defined = [k for k, roi in enumerate(rois) if self.peer_defines(case, roi)]
            self.check_peer(case, out, data, rois, tol, defined)

        for drawn in self.fuzz_examples():
            check = example(drawn=drawn)(check)
        check()
