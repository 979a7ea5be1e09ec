"""Outside implementations the RoI family is compared with (imported where they are installed)."""

import numpy as np
import pytest


def openvino_roi_align_rotated(data, rois, pooled, scale, sampling_ratio, clockwise):
    """OpenVINO's ``ROIAlignRotated`` (opset 15, CPU, f32 inference) of NCHW ``data`` and ``rois
    [K, 6]`` of ``(batch, cx, cy, w, h, angle in radians)``; the test is skipped without OpenVINO."""
    ov = pytest.importorskip("openvino")
    opset = pytest.importorskip("openvino.opset15")
    count = rois.shape[0]
    feats = opset.parameter(list(data.shape), ov.Type.f32)
    boxes = opset.parameter([count, 5], ov.Type.f32)
    batch = opset.parameter([count], ov.Type.i32)
    node = opset.roi_align_rotated(feats, boxes, batch, *pooled, sampling_ratio, scale, clockwise)
    model = ov.Core().compile_model(ov.Model([node], [feats, boxes, batch]), "CPU",
                                    {"INFERENCE_PRECISION_HINT": "f32"})
    return model([data, np.ascontiguousarray(rois[:, 1:]), rois[:, 0].astype("int32")])[0]
