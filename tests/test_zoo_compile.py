"""Models that ``tvm-roialign compile m.pt2 -o m.so`` builds with no flag and that equal eager torch,
each standing for one graph the layout conversion used to fail on:

* a classifier head ``x.squeeze()`` after a pooled convolution (the importer squeezes every axis,
  and TVM's layout rule then ends ConvertLayout in "undefined bijective layout");
* ``torch.roll`` (swin_t's shifted windows): its gathers' indices are folded to constants, so TVM
  prints no out-of-bounds warning;
* a 3-D convolution on an unsqueezed 2-D one: the converted graph does not legalize, so the 2-D
  convolution feeding it keeps its layout, with one note, and the rest is converted;
* a graph TVM's conversion fails on with nothing converted (an output of unknown rank): the whole
  module keeps its layout, with one note.

The torchvision zoo itself (resnet18 ... resnext50_32x4d, batch norms calibrated on photos;
minutes each) runs with ``TVM_ROIALIGN_ZOO=1``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from _cli import run_cli

from tvm_roialign.models.classifier_zoo import CLASSIFIERS
from tvm_roialign.passes import ConvertLayoutWherePossible, desired_layouts

OUT_OF_BOUNDS_WARNING = "Fast mode segfaults"
NOTE = "note: layout conversion to NHWC failed"
ZOO = bool(os.environ.get("TVM_ROIALIGN_ZOO"))


class _SqueezedHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(self.conv(x), 1).squeeze())


class _Rolled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.second = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.second(torch.roll(self.first(x), shifts=(3, -2), dims=(2, 3)))


class _Lifted3D(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.second = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.third = torch.nn.Conv3d(8, 4, (1, 3, 3))

    def forward(self, x):
        return self.third(self.second(torch.relu(self.first(x))).unsqueeze(2))


def _compile_and_run(model, x, tmp_path, capfd):
    """``(stderr of compile, output of run)`` for ``model`` exported at ``x``, compiled with no flag."""
    program, lib = tmp_path / "m.pt2", tmp_path / "m.so"
    torch.export.save(torch.export.export(model, (x,)), str(program))
    np.savez(tmp_path / "in.npz", x=x.numpy())
    capfd.readouterr()
    code, _out, err = run_cli(["compile", str(program), "-o", str(lib)], capfd, quiet=False)
    assert code == 0, err
    assert "Traceback" not in err
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    argv = ["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)]
    code, _out, err_run = run_cli(argv, capfd)
    assert code == 0, err_run
    return err, np.load(outputs)["output_0"]


def _assert_equals_eager(model, x, got):
    with torch.no_grad():
        expected = model(x).numpy()
    scale = np.abs(expected).max()
    assert scale > 1e-3
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-4 * scale


@pytest.mark.parametrize("model_cls", [_SqueezedHead, _Rolled], ids=["squeeze-head", "roll"])
def test_converts_whole_and_equals_eager(model_cls, tmp_path, capfd):
    torch.manual_seed(0)
    model = model_cls().eval()
    x = torch.randn(1, 3, 16, 16)
    err, got = _compile_and_run(model, x, tmp_path, capfd)
    assert NOTE not in err
    assert OUT_OF_BOUNDS_WARNING not in err
    _assert_equals_eager(model, x, got)


def test_the_region_that_does_not_legalize_keeps_its_layout(tmp_path, capfd):
    torch.manual_seed(0)
    model = _Lifted3D().eval()
    x = torch.randn(1, 3, 16, 16)
    err, got = _compile_and_run(model, x, tmp_path, capfd)
    notes = [line for line in err.splitlines() if line.startswith(NOTE)]
    assert len(notes) == 1, err
    assert "1 conv2d kept in the model's own layout, 1 converted to NHWC" in notes[0]
    assert "BlockBuilder" not in err
    _assert_equals_eager(model, x, got)


def _unknown_rank_output_model():
    """ONNX: conv, global pool, then ``Squeeze`` without axes of a symbolic batch (rank unknown)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tvm_roialign.frontend import from_onnx

    weight = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype("float32")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Squeeze", ["p"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "unknown_rank",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return from_onnx(onnx.load_from_string(model.SerializeToString()))


def test_a_conversion_failing_with_nothing_converted_keeps_the_whole_module():
    import tvm
    from tvm import relax

    mod = _unknown_rank_output_model()
    with pytest.raises(tvm.error.InternalError, match="unknown"):
        relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)
    notes = []
    kept = ConvertLayoutWherePossible(desired_layouts("NHWC"), report=notes.append)(mod)
    assert len(notes) == 1 and notes[0].startswith(NOTE)
    assert notes[0].endswith("the model is built in its own layout")
    tvm.ir.assert_structural_equal(kept, mod)


@pytest.mark.skipif(not ZOO, reason="a torchvision classifier compile each: TVM_ROIALIGN_ZOO=1")
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_the_torchvision_zoo_compiles_with_the_defaults(name, tmp_path, capfd):
    from tvm_roialign.models.classifier_zoo import build_classifier, example_input

    model = build_classifier(name)
    x = example_input()
    err, got = _compile_and_run(model, x, tmp_path, capfd)
    assert NOTE not in err
    assert OUT_OF_BOUNDS_WARNING not in err
    _assert_equals_eager(model, x, got)
