"""Importers of the RoI family:

* torch.export of ``torchvision.ops.ps_roi_align`` in a conv -> ps_roi_align -> conv model, against
  PyTorch eager (the output and torchvision's channel mapping), also after ConvertLayout to NHWC;
* torch.export of rotated RoIAlign ops registered with ``torch.library`` under a user's own names,
  one with detectron2's signature (degrees) and one with mmcv's (radians, aligned, clockwise), whose
  eager kernels are the float64 reference, imported with ``roi_align_rotated_convert_map``;
* ONNX ``mmcv::MMCVRoIAlignRotated`` (as mmdeploy exports it) against OpenVINO's ROIAlignRotated
  (aligned) and the float64 reference (``aligned=0``).

MXNet's PSROIAlign is not imported: MXNet 1.9.1's ONNX exporter refuses
``_contrib_ROIAlign(position_sensitive=True)`` (recorded by ``tests/data/make_mxnet_fixture.py``), so
no ONNX file of it exists to import.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from _peers import openvino_roi_align_rotated

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

from tvm_roialign.frontend import from_exported_program, from_onnx, roi_align_rotated_convert_map
from tvm_roialign.passes import ConvertLayout
from tvm_roialign.testing import compile_and_run, op_calls, roi_align_rotated_ref, smooth_data

NHWC = {"nn.conv2d": ["NHWC", "default"], "vision.ps_roi_align": ["NHWC", "default"],
        "vision.roi_align_rotated": ["NHWC", "default"]}


class PSHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 24, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 5, 3, padding=1)

    def forward(self, x, rois):
        pooled, mapping = torch.ops.torchvision.ps_roi_align(self.conv1(x), rois, 0.5, 3, 2, 2)
        return self.conv2(pooled), mapping


def _boxes(rng, count, batch):
    corner = rng.uniform(-4, 28, (count, 2))
    boxes = np.concatenate([rng.integers(0, batch, (count, 1)), corner,
                            corner + rng.uniform(1, 20, (count, 2))], 1)
    return torch.from_numpy(boxes.astype("float32"))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_torch_ps_roi_align(rng, layout, tol):
    torch.manual_seed(0)
    model = PSHead().eval()
    x, rois = torch.rand(2, 3, 16, 16), _boxes(rng, 6, 2)
    mod = from_exported_program(torch.export.export(model, (x, rois)))
    assert len(op_calls(mod, "relax.vision.ps_roi_align")) == 1
    if layout == "NHWC":
        mod = ConvertLayout(NHWC)(mod)
        assert str(op_calls(mod, "relax.vision.ps_roi_align")[0].attrs["layout"]) == "NHWC"
    out, mapping = compile_and_run(mod, [x.numpy(), rois.numpy()])
    with torch.no_grad():
        expected, expected_mapping = model(x, rois)
    np.testing.assert_allclose(out, expected.numpy(), rtol=tol["float32"], atol=tol["float32"])
    np.testing.assert_array_equal(mapping, expected_mapping.numpy())


def test_torchvision_ps_roi_align_function_exports():
    """``torchvision.ops.ps_roi_align`` (the function users call) reaches the same converter."""
    class Pool(torch.nn.Module):
        def forward(self, x, rois):
            return torchvision.ops.ps_roi_align(x, rois, (2, 2), 1.0, -1)

    x, rois = torch.rand(1, 8, 10, 10), _boxes(np.random.default_rng(1), 4, 1)
    mod = from_exported_program(torch.export.export(Pool(), (x, rois)),
                                unwrap_unit_return_tuple=True)
    out = compile_and_run(mod, [x.numpy(), rois.numpy()])
    expected = torchvision.ops.ps_roi_align(x, rois, (2, 2), 1.0, -1).numpy()
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


# --- rotated RoIAlign as a user's torch.library op --------------------------------------------


@torch.library.custom_op("tvm_roialign_test::rotated_forward", mutates_args=())
def _detectron2_like(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float,
                     pooled_height: int, pooled_width: int, sampling_ratio: int) -> torch.Tensor:
    out = roi_align_rotated_ref(input.numpy(), rois.numpy(), (pooled_height, pooled_width),
                                spatial_scale, sampling_ratio, aligned=True, angle_unit="degrees")
    return torch.from_numpy(out.astype("float32"))


@_detectron2_like.register_fake
def _(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


@torch.library.custom_op("tvm_roialign_test::mmcv_rotated", mutates_args=())
def _mmcv_like(input: torch.Tensor, rois: torch.Tensor, output_size: list[int],
               spatial_scale: float, sampling_ratio: int, aligned: bool,
               clockwise: bool) -> torch.Tensor:
    out = roi_align_rotated_ref(input.numpy(), rois.numpy(), tuple(output_size), spatial_scale,
                                sampling_ratio, aligned, clockwise, angle_unit="radians")
    return torch.from_numpy(out.astype("float32"))


@_mmcv_like.register_fake
def _(input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise):
    return input.new_empty((rois.shape[0], input.shape[1], *output_size))


class RotatedHead(torch.nn.Module):
    def __init__(self, pool):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 4, 3, padding=1)
        self.pool = pool

    def forward(self, x, rois):
        return self.conv2(self.pool(self.conv1(x), rois))


def _rotated_rois(rng, count, degrees):
    angle = rng.uniform(-np.pi, np.pi, count)
    angle[:3] = [0, np.pi / 2, -np.pi]
    rois = np.concatenate([np.zeros((count, 1)), rng.uniform(0, 32, (count, 2)),
                           rng.uniform(0.5, 24, (count, 2)),
                           (angle * 180 / np.pi if degrees else angle)[:, None]], 1)
    return torch.from_numpy(rois.astype("float32"))


CASES = {
    "detectron2": (
        lambda f, r: torch.ops.tvm_roialign_test.rotated_forward(f, r, 0.5, 3, 4, 2),
        roi_align_rotated_convert_map("tvm_roialign_test::rotated_forward", "detectron2"),
        True,
    ),
    "mmcv": (
        lambda f, r: torch.ops.tvm_roialign_test.mmcv_rotated(f, r, [3, 4], 0.5, 0, False, True),
        roi_align_rotated_convert_map("tvm_roialign_test::mmcv_rotated", "mmcv"),
        False,
    ),
}


class _Pool(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, features, rois):
        return self.fn(features, rois)


@pytest.mark.parametrize("convention", sorted(CASES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_torch_rotated_custom_op(rng, convention, layout, tol):
    fn, convert_map, degrees = CASES[convention]
    torch.manual_seed(0)
    model = RotatedHead(_Pool(fn)).eval()
    x, rois = torch.rand(1, 3, 16, 16), _rotated_rois(rng, 7, degrees)
    mod = from_exported_program(torch.export.export(model, (x, rois)),
                                custom_convert_map=convert_map, unwrap_unit_return_tuple=True)
    assert len(op_calls(mod, "relax.vision.roi_align_rotated")) == 1
    if layout == "NHWC":
        mod = ConvertLayout(NHWC)(mod)
    out = compile_and_run(mod, [x.numpy(), rois.numpy()])
    with torch.no_grad():
        expected = model(x, rois).numpy()
    np.testing.assert_allclose(out, expected, rtol=tol["float32"], atol=tol["float32"])


def test_rotated_converter_rejects_bad_arguments():
    with pytest.raises(ValueError, match="convention must be"):
        roi_align_rotated_convert_map("a::b", "caffe2")
    with pytest.raises(ValueError, match="signature must name 'input' and 'rois'"):
        roi_align_rotated_convert_map("a::b", "mmcv", ["input", "boxes"])
    assert set(roi_align_rotated_convert_map("ns::op.out")) == {"op.out"}


# --- ONNX mmcv::MMCVRoIAlignRotated ----------------------------------------------------------


def _mmcv_onnx(num_rois, aligned, clockwise, sampling_ratio, rois_cols=6):
    node = helper.make_node(
        "MMCVRoIAlignRotated", ["features", "rois"], ["out"], domain="mmcv", name="rotated",
        output_height=3, output_width=4, spatial_scale=0.5, sampling_ratio=sampling_ratio,
        aligned=aligned, clockwise=clockwise,
    )
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [2, 8, 14, 18]),
         helper.make_tensor_value_info("rois", TensorProto.FLOAT, [num_rois, rois_cols])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [num_rois, 8, 3, 4])],
    )
    return helper.make_model(graph, producer_name="mmdeploy",
                             opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("mmcv", 1)])


def _openvino_rotated(data, rois, sampling_ratio, clockwise):
    return openvino_roi_align_rotated(data, rois, (3, 4), 0.5, sampling_ratio, clockwise)


@pytest.mark.parametrize(("aligned", "clockwise", "sampling_ratio"),
                         [(1, 0, 2), (1, 1, 0), (0, 1, 2), (0, 0, 0)])
def test_onnx_mmcv_roi_align_rotated(rng, aligned, clockwise, sampling_ratio):
    data = smooth_data((2, 8, 14, 18))
    rois = _rotated_rois(rng, 9, False).numpy()
    rois[:, 0] = rng.integers(0, 2, 9)
    mod = from_onnx(_mmcv_onnx(9, aligned, clockwise, sampling_ratio))
    (call,) = op_calls(mod, "relax.vision.roi_align_rotated")
    assert str(call.attrs["angle_unit"]) == "radians"
    out = compile_and_run(mod, [data, rois])
    expected = roi_align_rotated_ref(data, rois, (3, 4), 0.5, sampling_ratio, bool(aligned),
                                     bool(clockwise), "radians")
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    if aligned:
        np.testing.assert_allclose(out, _openvino_rotated(data, rois, sampling_ratio,
                                                          bool(clockwise)), rtol=0, atol=1e-5)


def test_onnx_mmcv_bad_rois_names_the_node():
    with pytest.raises(ValueError, match="MMCVRoIAlignRotated node 'rotated': rois must be"):
        from_onnx(_mmcv_onnx(9, 1, 0, 2, rois_cols=5))
