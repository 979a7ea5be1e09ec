"""Layout inference for roi_align and the Relay-style ConvertLayout (issue 3).

In the spirit of Relay's ``test_conv_roi_align_convert_layout``: every graph is checked for its
structure (where the ``permute_dims`` are) and its numbers (built on llvm before and after the
pass, through tvm-roialign's legalization, outputs equal).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import tvm
from _targets import GENERIC
from tvm import relax

import tvm_roialign
from tvm_roialign import _registry
from tvm_roialign.passes import ConvertLayout, FoldPermuteDims
from tvm_roialign.passes import layout as layout_pass
from tvm_roialign.testing import roi_align_ref, run_first, single_op_module

TARGET = GENERIC
ROIS = np.array(
    [[0, 1.0, 2.0, 20.0, 25.0], [0, 0.0, 0.0, 31.0, 31.0], [0, 5.5, 3.2, 12.1, 9.9]], "float32"
)
NCHW_TO_NHWC = [0, 2, 3, 1]
NHWC_TO_NCHW = [0, 3, 1, 2]


def _tensor(name, shape):
    return relax.Var(name, relax.TensorType(list(shape), "float32"))


def _function(params, body_fn):
    """A module whose ``main(*params)`` is one dataflow block built by ``body_fn(bb, *params)``."""
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body_fn(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _roi_align(bb, data, rois, layout="NCHW", pooled=(4, 4)):
    return bb.emit(relax.op.vision.roi_align(data, rois, pooled, 0.5, 2, False, layout, "avg"))


def _conv(bb, data, weight, layout="NCHW", kernel_layout="OIHW"):
    call = relax.op.nn.conv2d(
        data, weight, padding=1, data_layout=layout, kernel_layout=kernel_layout
    )
    return bb.emit(relax.op.nn.relu(call))


@functools.cache
def _inputs(shapes: tuple) -> tuple:
    """Deterministic inputs: rois for the [K, 5] parameter, small values for the others."""
    rng = np.random.default_rng(0)
    arrays = []
    for shape in shapes:
        if shape == (3, 5):
            arrays.append(ROIS)
        else:
            arrays.append((rng.standard_normal(shape) * 0.25).astype("float32"))
    return tuple(arrays)


def _run(mod):
    """Build ``mod`` on llvm and run ``main`` on the deterministic inputs of its parameters."""
    shapes = tuple(tuple(int(v) for v in p.ty.shape.values) for p in mod["main"].params)
    return run_first(tvm.compile(mod, target=TARGET), *_inputs(shapes))


def _bindings(mod):
    body = mod["main"].body
    return [b for block in body.blocks for b in block.bindings], body.body


def _op_name(value):
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return str(value.op.name)
    return None


def _calls(mod, op_name):
    bindings, _ = _bindings(mod)
    return [b.value for b in bindings if _op_name(b.value) == op_name]


def _permute_sites(mod):
    """``(axes, from_param, to_output)`` for each permute_dims of ``main``."""
    bindings, ret = _bindings(mod)
    params = {p.name for p in mod["main"].params}
    # the returned var and the vars it aliases are "the output"
    values = {b.var.name: b.value for b in bindings}
    outputs, pending = set(), [ret.name]
    while pending:  # the returned var, the vars it aliases and the fields of a returned tuple
        name = pending.pop()
        outputs.add(name)
        value = values.get(name)
        if isinstance(value, relax.Var):
            pending.append(value.name)
        elif isinstance(value, relax.Tuple):
            pending.extend(f.name for f in value.fields if isinstance(f, relax.Var))
    sites = []
    for b in bindings:
        if _op_name(b.value) == "relax.permute_dims":
            arg = b.value.args[0]
            axes = [int(a) for a in b.value.attrs.axes]
            from_param = isinstance(arg, relax.Var) and arg.name in params
            sites.append((axes, from_param, b.var.name in outputs))
    return sites


def _interior_permutes(mod):
    """permute_dims that neither read a parameter nor produce the output."""
    return [s for s in _permute_sites(mod) if not s[1] and not s[2]]


def _producer(mod, var):
    bindings, _ = _bindings(mod)
    for b in bindings:
        if b.var.same_as(var):
            return b.value
    return None


def _check_numbers(before, after, tol):
    expected, actual = _run(before), _run(after)
    assert expected.shape == actual.shape
    np.testing.assert_allclose(actual, expected, rtol=tol["float32"], atol=tol["float32"])
    return expected


# --- graphs ------------------------------------------------------------------------------------


def conv_roi_align():
    x, w, r = _tensor("x", (1, 4, 16, 16)), _tensor("w", (8, 4, 3, 3)), _tensor("rois", (3, 5))
    return _function([x, w, r], lambda bb, x, w, r: _roi_align(bb, _conv(bb, x, w), r))


def mask_head():
    """conv2d -> roi_align -> conv2d -> conv2d (the mask head's shape)."""
    x, w, r = _tensor("x", (1, 4, 16, 16)), _tensor("w", (8, 4, 3, 3)), _tensor("rois", (3, 5))
    w2, w3 = _tensor("w2", (8, 8, 3, 3)), _tensor("w3", (6, 8, 3, 3))

    def body(bb, x, w, r, w2, w3):
        pooled = _roi_align(bb, _conv(bb, x, w), r)
        return _conv(bb, _conv(bb, pooled, w2), w3)

    return _function([x, w, r, w2, w3], body)


def mask_head_with_deconv():
    """conv2d -> roi_align -> conv2d -> conv2d_transpose -> conv2d (1x1), as in Mask R-CNN."""
    x, w, r = _tensor("x", (1, 4, 16, 16)), _tensor("w", (8, 4, 3, 3)), _tensor("rois", (3, 5))
    w2, wt, w3 = (
        _tensor("w2", (8, 8, 3, 3)),
        _tensor("wt", (8, 6, 2, 2)),
        _tensor("w3", (5, 6, 1, 1)),
    )

    def body(bb, x, w, r, w2, wt, w3):
        pooled = _roi_align(bb, _conv(bb, x, w), r)
        up = bb.emit(relax.op.nn.conv2d_transpose(_conv(bb, pooled, w2), wt, strides=2))
        return bb.emit(relax.op.nn.conv2d(relax.op.nn.relu(up), w3))

    return _function([x, w, r, w2, wt, w3], body)


def roi_align_alone(layout="NCHW"):
    shape = (1, 4, 16, 16) if layout == "NCHW" else (1, 16, 16, 4)
    return single_op_module(
        lambda x, r: relax.op.vision.roi_align(x, r, (4, 4), 0.5, 2, False, layout, "avg"),
        x=(shape, "float32"), rois=((3, 5), "float32"))


NHWC_RELAY = {"vision.roi_align": ["NHWC", "default"], "nn.conv2d": ["NHWC", "default"]}
#: one xdist worker runs this module (`--dist loadgroup`): each graph's reference output below is
#: built once per process for the two tests that compare with it, which two workers built twice
pytestmark = pytest.mark.xdist_group("layout")


@functools.cache
def _reference(graph_name):
    """Output of the unconverted graph (built once per graph)."""
    return _run(globals()[graph_name]())


def _check_against_reference(graph_name, after, tol):
    actual = _run(after)
    np.testing.assert_allclose(actual, _reference(graph_name), rtol=tol["float32"],
                               atol=tol["float32"])


# --- the rule through stock ConvertLayout -------------------------------------------------------


def test_rule_is_registered_once_and_reversible():
    ops = (layout_pass.ROI_ALIGN_OP, layout_pass.MULTISCALE_ROI_ALIGN_OP)
    rules = [_registry.get_op_attr(op, "FRelaxInferLayout") for op in ops]
    assert rules[0] is not None and rules[1] is not None
    tvm_roialign.register()  # idempotent: the same rules
    assert all(_registry.get_op_attr(op, "FRelaxInferLayout").same_as(rule)
               for op, rule in zip(ops, rules))
    with tvm_roialign.stock_tvm():
        assert _registry.get_op_attr(layout_pass.ROI_ALIGN_OP, "FRelaxInferLayout") is None
    assert _registry.get_op_attr(layout_pass.ROI_ALIGN_OP, "FRelaxInferLayout") is not None


def test_stock_convert_layout_roi_align_alone_nhwc(tol):
    """Desired NHWC for roi_align alone: one transpose in (from x), one out; numbers equal."""
    before = roi_align_alone()
    after = relax.transform.ConvertLayout({"relax.vision.roi_align": ["NHWC", "default"]})(before)
    (call,) = _calls(after, "relax.vision.roi_align")
    assert call.attrs.layout == "NHWC"
    assert [int(v) for v in call.ty.shape.values] == [3, 4, 4, 4]  # [K, PH, PW, C]
    assert call.args[1].name == "rois"  # rois untouched
    assert sorted(_permute_sites(after)) == sorted(
        [(NCHW_TO_NHWC, True, False), (NHWC_TO_NCHW, False, True)]
    )
    # the attributes other than layout are kept
    old = _calls(before, "relax.vision.roi_align")[0].attrs
    for field in ("pooled_size", "spatial_scale", "sample_ratio", "aligned", "mode"):
        assert str(getattr(call.attrs, field)) == str(getattr(old, field))
    _check_against_reference("roi_align_alone", after, tol)


def test_roi_align_alone_matches_float64_reference(tol):
    """The NHWC conversion of roi_align alone agrees with the independent float64 reference."""
    after = ConvertLayout({"vision.roi_align": ["NHWC", "default"]})(roi_align_alone())
    data = _inputs(((1, 4, 16, 16), (3, 5)))[0]
    expected = roi_align_ref(data, ROIS, (4, 4), 0.5, 2, False, "NCHW", "avg")
    np.testing.assert_allclose(_run(after), expected, rtol=tol["float32"], atol=tol["float32"])


def test_nchw_desired_converts_nhwc_back(tol):
    """An NHWC roi_align (its own letters: ABCD = NHWC) with desired NCHW goes to NCHW."""
    before = roi_align_alone("NHWC")
    after = relax.transform.ConvertLayout({"relax.vision.roi_align": ["NCHW", "default"]})(before)
    (call,) = _calls(after, "relax.vision.roi_align")
    assert call.attrs.layout == "NCHW"
    assert [int(v) for v in call.ty.shape.values] == [3, 4, 4, 4]
    assert sorted(_permute_sites(after)) == sorted(
        [(NHWC_TO_NCHW, True, False), (NCHW_TO_NHWC, False, True)]
    )
    _check_numbers(before, after, tol)


def test_desired_layout_already_current_changes_nothing():
    before = roi_align_alone("NHWC")
    after = relax.transform.ConvertLayout({"relax.vision.roi_align": ["NHWC", "default"]})(before)
    assert not _permute_sites(after)
    assert _calls(after, "relax.vision.roi_align")[0].attrs.layout == "NHWC"


def test_round_trip_folds_to_no_transpose(tol):
    """NCHW -> NHWC -> NCHW: FoldPermuteDims removes every transpose pair that cancels."""
    once = relax.transform.ConvertLayout({"relax.vision.roi_align": ["NHWC", "default"]})(
        roi_align_alone()
    )
    twice = relax.transform.ConvertLayout({"relax.vision.roi_align": ["NCHW", "default"]})(once)
    assert len(_permute_sites(twice)) >= 2
    folded = FoldPermuteDims()(twice)
    assert not _permute_sites(folded)
    assert _calls(folded, "relax.vision.roi_align")[0].attrs.layout == "NCHW"
    _check_against_reference("roi_align_alone", folded, tol)


def test_fold_permute_dims_merges_non_cancelling_pairs_and_keeps_others():
    x = _tensor("x", (2, 3, 4, 5))

    def body(bb, x):
        a = bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
        b = bb.emit(relax.op.permute_dims(a, [1, 0, 2, 3]))
        return bb.emit(relax.op.add(b, b))

    before = _function([x], body)
    after = FoldPermuteDims()(before)
    sites = _permute_sites(after)
    assert sites == [([2, 0, 3, 1], True, False)]
    data = np.arange(120, dtype="float32").reshape(2, 3, 4, 5)
    expected = 2 * data.transpose(0, 2, 3, 1).transpose(1, 0, 2, 3)
    ex = tvm.compile(after, target=TARGET)
    got = run_first(ex, data)
    np.testing.assert_array_equal(got, expected)
    untouched = single_op_module(lambda x: relax.op.permute_dims(x, [0, 2, 3, 1]),
                                 x=((2, 3, 4, 5), "float32"))
    assert FoldPermuteDims()(untouched).same_as(untouched)


# --- conv2d + roi_align -------------------------------------------------------------------------


def test_conv_roi_align_nhwc(tol):
    """conv2d -> roi_align: roi_align reads the NHWC conv output directly."""
    after = ConvertLayout(NHWC_RELAY)(conv_roi_align())
    (call,) = _calls(after, "relax.vision.roi_align")
    assert call.attrs.layout == "NHWC"
    assert _op_name(_producer(after, call.args[0])) == "relax.nn.relu"
    (conv,) = _calls(after, "relax.nn.conv2d")
    assert (conv.attrs.data_layout, conv.attrs.kernel_layout) == ("NHWC", "HWIO")
    assert not _interior_permutes(after)
    _check_against_reference("conv_roi_align", after, tol)


def test_conv_roi_align_conv_no_transpose_between(tol):
    """Mask-head style: 0 permute_dims between the ops after the pass."""
    after = ConvertLayout(NHWC_RELAY)(mask_head())
    assert _calls(after, "relax.vision.roi_align")[0].attrs.layout == "NHWC"
    assert {c.attrs.data_layout for c in _calls(after, "relax.nn.conv2d")} == {"NHWC"}
    assert _interior_permutes(after) == []
    sites = _permute_sites(after)
    assert sum(1 for s in sites if s[2]) == 1  # one transpose back at the output
    assert all(s[1] or s[2] for s in sites)  # the others read parameters (data, weights)
    _check_against_reference("mask_head", after, tol)


def test_roi_align_follows_nhwc_producer_without_desired_layout(tol):
    """Only conv2d is asked for NHWC: roi_align follows its NHWC input, no transpose."""
    after = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mask_head())
    (call,) = _calls(after, "relax.vision.roi_align")
    assert call.attrs.layout == "NHWC"
    assert _interior_permutes(after) == []
    _check_against_reference("mask_head", after, tol)


def test_roi_align_keeps_nchw_when_producer_is_nchw():
    """No desired layout anywhere near roi_align: it stays NCHW, no transpose added."""
    before = conv_roi_align()
    after = relax.transform.ConvertLayout({"relax.nn.conv1d": ["NWC", "WIO"]})(before)
    assert _calls(after, "relax.vision.roi_align")[0].attrs.layout == "NCHW"
    assert not _permute_sites(after)


def test_relay_era_dict_works_as_written():
    """``ConvertLayout({"vision.roi_align": ["NHWC", "default"], "nn.conv2d": [...]})``."""
    with pytest.raises(Exception, match="default"):  # what stock Relax does with it
        relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "default"]})(conv_roi_align())
    after = ConvertLayout(NHWC_RELAY)(mask_head())
    assert {c.attrs.kernel_layout for c in _calls(after, "relax.nn.conv2d")} == {"HWIO"}
    assert _calls(after, "relax.vision.roi_align")[0].attrs.layout == "NHWC"
    relax_names = ConvertLayout(
        {"relax.vision.roi_align": ["NHWC", "default"], "relax.nn.conv2d": ["NHWC", "default"]}
    )(mask_head())
    tvm.ir.assert_structural_equal(after, relax_names)


def test_conv2d_transpose_stays_nchw_and_builds(tol):
    """NHWC must not spread into conv2d_transpose (no NHWC legalization): transposes at its edges."""
    before = mask_head_with_deconv()
    after = ConvertLayout(NHWC_RELAY)(before)
    (deconv,) = _calls(after, "relax.nn.conv2d_transpose")
    assert (deconv.attrs.data_layout, deconv.attrs.kernel_layout) == ("NCHW", "IOHW")
    producer = _producer(after, deconv.args[0])
    assert _op_name(producer) == "relax.permute_dims"
    assert [int(a) for a in producer.attrs.axes] == NHWC_TO_NCHW
    assert _calls(after, "relax.vision.roi_align")[0].attrs.layout == "NHWC"
    # interior transposes: only into the deconv and out of it (into the NHWC 1x1 conv)
    assert sorted(s[0] for s in _interior_permutes(after)) == [NCHW_TO_NHWC, NHWC_TO_NCHW]
    _check_numbers(before, after, tol)


def test_conv2d_transpose_desired_nhwc_is_refused_with_warning():
    with pytest.warns(UserWarning, match="conv2d_transpose"):
        convert = ConvertLayout({"nn.conv2d_transpose": ["NHWC", "default"]})
    after = convert(mask_head_with_deconv())
    assert _calls(after, "relax.nn.conv2d_transpose")[0].attrs.data_layout == "NCHW"


def test_pools_follow_their_input(tol):
    """Relay users wrote ``nn.max_pool2d: ["NHWC"]``; stock Relax fails on it, ours follows."""
    x, w, r = _tensor("x", (1, 4, 16, 16)), _tensor("w", (8, 4, 3, 3)), _tensor("rois", (3, 5))

    def body(bb, x, w, r):
        pooled = bb.emit(relax.op.nn.max_pool2d(_conv(bb, x, w), (2, 2), strides=(2, 2)))
        return _roi_align(bb, pooled, r, pooled=(2, 2))

    before = _function([x, w, r], body)
    after = ConvertLayout({**NHWC_RELAY, "nn.max_pool2d": ["NHWC"]})(before)
    assert _calls(after, "relax.nn.max_pool2d")[0].attrs.layout == "NHWC"
    assert _calls(after, "relax.vision.roi_align")[0].attrs.layout == "NHWC"
    assert not _interior_permutes(after)
    _check_numbers(before, after, tol)


# --- the rule itself ----------------------------------------------------------------------------


def _rule_on(layout_now: str, desired=None, op_layout="NCHW"):
    """Apply the rule to a roi_align call whose data currently has relative layout ``layout_now``."""
    x = _tensor("x", (1, 4, 16, 16) if op_layout == "NCHW" else (1, 16, 16, 4))
    r = _tensor("rois", (3, 5))
    call = relax.op.vision.roi_align(x, r, (2, 2), 0.5, 2, False, op_layout, "avg")
    var_layouts = {x: layout_pass.layout_decision(layout_now)}
    out = layout_pass.infer_layout_roi_align(call, desired or {}, var_layouts)
    return (
        [str(d.layout.name) for d in out.input_layouts],
        [str(d.layout.name) for d in out.output_layouts],
        str(out.new_attrs.layout),
    )


@pytest.mark.parametrize(
    "layout_now, op_layout, expected",
    [
        ("ABCD", "NCHW", (["ABCD", "AB"], ["ABCD"], "NCHW")),  # NCHW stays
        ("ACDB", "NCHW", (["ACDB", "AB"], ["ACDB"], "NHWC")),  # follows NHWC
        ("ADBC", "NHWC", (["ADBC", "AB"], ["ADBC"], "NCHW")),  # NHWC op, data now NCHW
        ("ADCB", "NCHW", (["ABCD", "AB"], ["ABCD"], "NCHW")),  # NWHC: falls back to NCHW
        ("ABDC", "NHWC", (["ADBC", "AB"], ["ADBC"], "NCHW")),  # NHCW: falls back to NCHW
    ],
)
def test_rule_without_desired_layout(layout_now, op_layout, expected):
    assert _rule_on(layout_now, op_layout=op_layout) == expected


@pytest.mark.parametrize(
    "desired, expected",
    [
        (["NHWC", "default"], (["ACDB", "AB"], ["ACDB"], "NHWC")),
        (["NHWC"], (["ACDB", "AB"], ["ACDB"], "NHWC")),
        (["NCHW", "default"], (["ABCD", "AB"], ["ABCD"], "NCHW")),
        (["default", "default"], (["ABCD", "AB"], ["ABCD"], "NCHW")),
    ],
)
def test_rule_with_desired_layout(desired, expected):
    # the desired layout wins over the incoming one (here NWHC)
    assert _rule_on("ADCB", {layout_pass.ROI_ALIGN_OP: desired}) == expected


@pytest.mark.parametrize("desired", [["NCHW4c"], ["HWNC", "default"], ["NHWC", "BA"], []])
def test_rule_rejects_bad_desired_layouts(desired):
    with pytest.raises(ValueError, match="roi_align"):
        _rule_on("ABCD", {layout_pass.ROI_ALIGN_OP: desired})


def test_roi_align_like_rule_with_dict_attrs():
    """The helper serves ops with L feature maps then rois and ``DictAttrs`` (multiscale)."""
    op = tvm.ir.Op.get("relax.vision.roi_align")  # any op: the rule reads only args and attrs
    f0, f1 = _tensor("f0", (1, 4, 16, 16)), _tensor("f1", (1, 4, 8, 8))
    r = _tensor("rois", (3, 5))
    attrs = tvm.ir.make_node("ir.DictAttrs", layout="NCHW", output_size=[7, 7])
    call = relax.Call(op, [f0, f1, r], attrs)
    nhwc = layout_pass.layout_decision("ACDB")
    out = layout_pass.infer_layout_roi_align_like(call, {}, {f0: nhwc, f1: nhwc}, None)
    assert [str(d.layout.name) for d in out.input_layouts] == ["ACDB", "ACDB", "AB"]
    assert str(out.new_attrs["layout"]) == "NHWC"
    assert [int(v) for v in out.new_attrs["output_size"]] == [7, 7]
    # features that disagree: the most common layout wins, a tie goes to the first feature map's
    # (here f0's NHWC, f1 being NCHW); the other is transposed by the pass
    out = layout_pass.infer_layout_roi_align_like(call, {}, {f0: nhwc}, 2)
    assert [str(d.layout.name) for d in out.input_layouts][:2] == ["ACDB", "ACDB"]
    out = layout_pass.infer_layout_roi_align_like(call, {}, {f1: nhwc}, 2)
    assert [str(d.layout.name) for d in out.input_layouts][:2] == ["ABCD", "ABCD"]


def test_multiscale_roi_align_converts_with_convs(tol):
    """FPN-like: two conv levels -> multiscale_roi_align -> conv; NHWC with no transposes between."""
    make = tvm_roialign.multiscale_roi_align
    x0, x1 = _tensor("x0", (1, 4, 16, 16)), _tensor("x1", (1, 4, 8, 8))
    w0, w1, r = _tensor("w0", (4, 4, 3, 3)), _tensor("w1", (4, 4, 3, 3)), _tensor("rois", (3, 5))
    w2 = _tensor("w2", (6, 4, 3, 3))

    def body(bb, x0, x1, w0, w1, r, w2):
        feats = [_conv(bb, x0, w0), _conv(bb, x1, w1)]
        pooled = bb.emit(make(feats, r, (4, 4), (0.5, 0.25), sampling_ratio=2))
        return _conv(bb, pooled, w2)

    before = _function([x0, x1, w0, w1, r, w2], body)
    after = ConvertLayout({"nn.conv2d": ["NHWC", "default"]})(before)
    (call,) = _calls(after, layout_pass.MULTISCALE_ROI_ALIGN_OP)
    assert layout_pass.current_layout(call) == "NHWC"
    assert _interior_permutes(after) == []
    _check_numbers(before, after, tol)


# --- argument checking --------------------------------------------------------------------------


def test_convert_layout_argument_errors():
    with pytest.raises(TypeError, match="desired_layouts"):
        ConvertLayout(["nn.conv2d", "NHWC"])
    with pytest.raises(TypeError, match="list of layout strings"):
        ConvertLayout({"nn.conv2d": "NHWC"})
    with pytest.raises(ValueError, match="twice"):
        ConvertLayout({"nn.conv2d": ["NHWC", "default"], "relax.nn.conv2d": ["NCHW", "default"]})
    with pytest.raises(ValueError, match="roi_align"):
        ConvertLayout({"vision.roi_align": ["NHWC", "OIHW"]})
    with pytest.warns(UserWarning, match="no Relax op"):
        ConvertLayout({"qnn.conv2d_made_up": ["NHWC", "default"]})


def test_convert_layout_without_match_returns_module_unchanged():
    before = roi_align_alone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        after = ConvertLayout({"nn.conv2d": ["NHWC", "default"]})(before)
    tvm.ir.assert_structural_equal(after, before)


# --- a head exported from torch -----------------------------------------------------------------


def test_torch_exported_mask_head_like_graph(tol):
    """conv -> torchvision roi_align -> conv -> ConvTranspose2d -> conv, via torch.export."""
    import torch
    import torchvision
    from tvm.relax.frontend.torch import from_exported_program

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Conv2d(4, 8, 3, padding=1)
            self.mask = torch.nn.Sequential(
                torch.nn.Conv2d(8, 8, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.ConvTranspose2d(8, 8, 2, stride=2),
                torch.nn.ReLU(),
                torch.nn.Conv2d(8, 3, 1),
            )

        def forward(self, x, rois):
            features = torch.relu(self.backbone(x))
            return self.mask(torchvision.ops.roi_align(features, rois, (4, 4), 0.5, 2, False))

    torch.manual_seed(0)
    model = Head().eval()
    x, rois = torch.randn(1, 4, 16, 16), torch.from_numpy(ROIS)
    with torch.no_grad():
        expected = model(x, rois).numpy()
    before = from_exported_program(torch.export.export(model, (x, rois)))
    after = ConvertLayout(NHWC_RELAY)(before)
    after = relax.transform.FoldConstant()(after)  # weight and bias transposes
    assert _calls(after, "relax.vision.roi_align")[0].attrs.layout == "NHWC"
    # the only transposes between ops are the two around the (NCHW-only) transposed convolution
    (deconv,) = _calls(after, "relax.nn.conv2d_transpose")
    assert deconv.attrs.data_layout == "NCHW"
    assert sorted(s[0] for s in _interior_permutes(after)) == [NCHW_TO_NHWC, NHWC_TO_NCHW]
    assert [s[0] for s in _permute_sites(after) if s[2]] == [NHWC_TO_NCHW]  # into the output
    for mod in (before, after):
        vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(ROIS))
        np.testing.assert_allclose(out[0].numpy(), expected, rtol=tol["float32"], atol=tol["float32"])


# --- relax.clip (ReLU6, hardswish, hardsigmoid) follows its producer's layout --------------------


def test_clip_rule_is_registered_and_reversible():
    from tvm_roialign.passes import layout_clip

    rule = _registry.get_op_attr(layout_clip.CLIP_OP, "FRelaxInferLayout")
    assert rule is not None
    with tvm_roialign.stock_tvm():  # stock TVM 0.27 has no layout rule for clip
        assert _registry.get_op_attr(layout_clip.CLIP_OP, "FRelaxInferLayout") is None
    assert _registry.get_op_attr(layout_clip.CLIP_OP, "FRelaxInferLayout") is not None


def test_torch_clip_activations_stay_nhwc(tol):
    """A MobileNet v3 block from torch.export (hardswish, depthwise conv, ReLU6, squeeze-excitation
    with hardsigmoid): after ConvertLayout to NHWC, no transpose between ops, and torch's output."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.expand = torch.nn.Conv2d(4, 8, 3, padding=1)
            self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.squeeze = torch.nn.Conv2d(8, 4, 1)
            self.excite = torch.nn.Conv2d(4, 8, 1)

        def forward(self, x):
            y = torch.nn.functional.hardswish(self.expand(x))
            y = torch.nn.functional.relu6(self.depthwise(y))
            scale = y.mean((2, 3), keepdim=True)
            scale = torch.nn.functional.hardsigmoid(self.excite(torch.relu(self.squeeze(scale))))
            return y * scale

    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(1, 4, 16, 16) * 2
    with torch.no_grad():
        expected = model(x).numpy()
    before = from_exported_program(torch.export.export(model, (x,)))
    assert _calls(before, "relax.clip")
    after = relax.transform.FoldConstant()(ConvertLayout(NHWC_RELAY)(before))
    assert not _interior_permutes(after)
    for clip in _calls(after, "relax.clip"):
        assert int(clip.ty.shape[-1]) == 8  # channels last
    vm = relax.VirtualMachine(tvm.compile(after, target=TARGET), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()))
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=tol["float32"], atol=tol["float32"])
