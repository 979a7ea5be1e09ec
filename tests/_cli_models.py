"""The tiny models the command-line tests compile and run (tests/conftest.py makes them once per
session): a conv followed by torchvision's RoIAlign exported to ``.pt2`` and written as ``.onnx``,
and an ONNX Gather (whose build makes TVM's C++ code print a warning)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

NUM_ROIS = 6


class TinyRoi(torch.nn.Module):
    """conv 3x3 (3 -> 8) at half resolution, then torchvision roi_align 7x7 (aligned=True)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)

    def forward(self, x, rois):
        return torchvision.ops.roi_align(self.conv(x), rois, (7, 7), 0.5, 2, aligned=True)


def tiny_rois(num=NUM_ROIS, size=32, seed=0):
    """``num`` boxes of image 0 inside a ``size`` x ``size`` image: ``[num, 5]`` float32."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, size * 0.6, (num, 2))
    wh = rng.uniform(2, size * 0.4, (num, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1)
    return np.concatenate([np.zeros((num, 1)), boxes], axis=1).astype("float32")


def write_onnx_model(path, nodes, inputs, outputs, initializers=()):
    """An opset-16 ONNX model of ``nodes`` saved at ``path``."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def write_pt2_model(workdir):
    """(model.pt2, inputs.npz with the program's input names, the expected output)."""
    model = TinyRoi().eval()
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype("float32"))
    rois = torch.from_numpy(tiny_rois())
    exported = torch.export.export(model, (x, rois))
    path = workdir / "tiny.pt2"
    torch.export.save(exported, str(path))
    with torch.no_grad():
        expected = model(x, rois).numpy()
    names = [s.arg.name for s in exported.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert names == ["x", "rois"]
    inputs = workdir / "tiny_in.npz"
    np.savez(inputs, x=x.numpy(), rois=rois.numpy())
    return path, inputs, expected


def write_roi_onnx_model(workdir):
    """(model.onnx, inputs.npz, onnxruntime's output) of an ONNX conv + RoiAlign with a symbolic
    roi count ``N`` (for --input-shapes)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(2)
    weight = rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.2
    bias = rng.standard_normal(8).astype("float32") * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node(
            "RoiAlign",
            ["y", "rois", "batch_indices"],
            ["out"],
            output_height=7,
            output_width=7,
            sampling_ratio=2,
            spatial_scale=0.5,
            coordinate_transformation_mode="half_pixel",
            mode="avg",
        ),
    ]
    path = write_onnx_model(
        workdir / "tiny.onnx",
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32]),
            helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("batch_indices", TensorProto.INT64, ["N"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 8, 7, 7])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel()),
            helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias),
        ],
    )
    feeds = {
        "x": rng.standard_normal((1, 3, 32, 32)).astype("float32"),
        "rois": tiny_rois(seed=3)[:, 1:].copy(),
        "batch_indices": np.zeros(NUM_ROIS, dtype="int64"),
    }
    inputs = workdir / "tiny_onnx_in.npz"
    np.savez(inputs, **feeds)
    ort = pytest.importorskip("onnxruntime")  # the expected output only: the file needs onnx alone
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (expected,) = sess.run(None, feeds)
    return path, inputs, expected


def write_gather_model(workdir):
    """ONNX Gather + Relu: TVM's build of a Gather prints a C++ warning ("Fast mode segfaults...")."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Gather", ["x", "i"], ["y"], axis=0), helper.make_node("Relu", ["y"], ["z"])]
    return write_onnx_model(
        workdir / "gather.onnx",
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])],
    )
