"""Regenerate the MXNet fixture: ``mxnet_roialign.onnx`` and ``mxnet_roialign.npz``.

The model is conv -> ``_contrib_ROIAlign`` -> conv, exported by MXNet's own ONNX exporter
(``mx.onnx.export_model``); the npz holds fixed inputs and MXNet's own outputs for them. The test
``tests/test_frontend_onnx.py``/``tests/test_mxnet_fixture.py`` imports the ONNX file with
:func:`tvm_roialign.frontend.from_onnx` and compares with these outputs, without MXNet installed.

MXNet 1.9.1 needs its own environment (never install it into the project's)::

    python3 -m venv /tmp/mxenv
    /tmp/mxenv/bin/pip install mxnet==1.9.1 "numpy<1.24" onnx==1.13.1
    /tmp/mxenv/bin/python tests/data/make_mxnet_fixture.py

Facts this script checks and records in the npz (``notes``):

* MXNet's exporter writes the model at the newest opset of the installed onnx (18 with onnx 1.13.1)
  but its RoiAlign nodes carry no ``coordinate_transformation_mode``: by the ONNX specification
  (opset 16+) that means ``half_pixel``, whereas MXNet's ROIAlign (``aligned=False``, the only one
  it exports) has no half-pixel shift, i.e. ``output_half_pixel``. Importers must be told
  (``roi_align_coordinate_transformation_mode="output_half_pixel"``).
* The exporter refuses ``position_sensitive=True`` and ``aligned=True`` (NotImplementedError), so
  no ONNX file of a position-sensitive ROIAlign comes out of MXNet.
"""

from __future__ import annotations

import os

import mxnet as mx
import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ONNX_PATH = os.path.join(HERE, "mxnet_roialign.onnx")
NPZ_PATH = os.path.join(HERE, "mxnet_roialign.npz")

DATA_SHAPE = (2, 3, 32, 32)  # image batch, NCHW
POOLED = (4, 4)
SPATIAL_SCALE = 0.5  # conv1 has stride 2
SAMPLE_RATIO = 2


def build_symbol():
    data = mx.sym.var("data")
    rois = mx.sym.var("rois")
    conv1 = mx.sym.Convolution(
        data, num_filter=8, kernel=(3, 3), stride=(2, 2), pad=(1, 1), name="conv1"
    )
    pooled = mx.sym.contrib.ROIAlign(
        conv1,
        rois,
        pooled_size=POOLED,
        spatial_scale=SPATIAL_SCALE,
        sample_ratio=SAMPLE_RATIO,
        name="roialign",
    )
    return mx.sym.Convolution(
        pooled, num_filter=4, kernel=(3, 3), pad=(1, 1), name="conv2"
    )


def make_inputs(rng):
    data = rng.standard_normal(DATA_SHAPE).astype(np.float32)
    # (batch_index, x1, y1, x2, y2) in input-image pixels: fractional corners, boxes smaller than
    # a feature pixel, boxes past the border, both images. No negative batch index: MXNet's own
    # ROIAlign reads outside the feature map for it (its output is garbage; only the exported
    # ONNX graph masks such rows with Less/Where).
    rois = np.array(
        [
            [0, 0.0, 0.0, 31.0, 31.0],
            [0, 3.3, 5.7, 17.9, 12.1],
            [1, 10.0, 2.0, 11.0, 2.5],
            [1, -6.0, 20.0, 40.0, 44.0],
            [0, 25.5, 25.5, 31.9, 31.9],
            [1, 7.25, 0.5, 9.75, 30.0],
        ],
        dtype=np.float32,
    )
    return data, rois


def make_params(rng):
    return {
        "conv1_weight": mx.nd.array(
            rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
        ),
        "conv1_bias": mx.nd.array(rng.standard_normal(8).astype(np.float32) * 0.1),
        "conv2_weight": mx.nd.array(
            rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2
        ),
        "conv2_bias": mx.nd.array(rng.standard_normal(4).astype(np.float32) * 0.1),
    }


def check_refusals():
    """What MXNet's exporter does with a position-sensitive (or aligned) ROIAlign."""
    notes = []
    data = mx.sym.var("data")
    rois = mx.sym.var("rois")
    for kwargs in ({"position_sensitive": True}, {"aligned": True}):
        sym = mx.sym.contrib.ROIAlign(
            data, rois, pooled_size=(2, 2), spatial_scale=1.0, sample_ratio=2, **kwargs
        )
        try:
            mx.onnx.export_model(
                sym,
                {},
                in_shapes=[(1, 4, 8, 8), (1, 5)],
                in_types=[np.float32, np.float32],
                onnx_file_path=os.devnull,
            )
            notes.append(f"{kwargs}: exported")
        except NotImplementedError as err:
            notes.append(f"{kwargs}: NotImplementedError: {' '.join(str(err).split())}")
    return notes


def main():
    rng = np.random.default_rng(20240501)
    data, rois = make_inputs(rng)
    params = make_params(rng)
    sym = build_symbol()

    args = {"data": mx.nd.array(data), "rois": mx.nd.array(rois), **params}
    executor = sym.bind(mx.cpu(), args=args, grad_req="null")
    output = executor.forward(is_train=False)[0].asnumpy()

    mx.onnx.export_model(
        sym,
        dict(params),
        in_shapes=[DATA_SHAPE, rois.shape],
        in_types=[np.float32, np.float32],
        onnx_file_path=ONNX_PATH,
    )
    model = onnx.load(ONNX_PATH)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    roi_nodes = [n for n in model.graph.node if n.op_type == "RoiAlign"]
    attrs = sorted(a.name for a in roi_nodes[0].attribute)
    notes = [
        f"mxnet {mx.__version__}, onnx {onnx.__version__}, model opset {opset}",
        f"RoiAlign attributes: {attrs}",
        *check_refusals(),
    ]
    np.savez(
        NPZ_PATH,
        data=data,
        rois=rois,
        output=output,
        notes=np.array(notes),
    )
    print("wrote", ONNX_PATH, "and", NPZ_PATH)
    for note in notes:
        print(" ", note)


if __name__ == "__main__":
    main()
