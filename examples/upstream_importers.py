"""TVM's own importers with tvm-roialign's RoIAlign converters, against torchvision.

    python examples/upstream_importers.py

A tiny model calls ``torchvision.ops.roi_align``; it is exported with ``torch.export`` and to ONNX,
imported both ways, compiled for ``llvm`` and compared with torchvision:

* torch.export: TVM's ``from_exported_program`` with ``custom_convert_map=convert_map()``;
* ONNX: ``tvm_roialign.frontend.from_onnx`` (TVM's ``from_onnx`` takes no converter table).

Each is printed next to the plain TVM importer, whose RoIAlign is off (it shifts the box by 0.5
before ``spatial_scale``).
"""

import io
import warnings

import numpy as np
import onnx
import torch
import torchvision
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx
from tvm.relax.frontend.torch import from_exported_program

import tvm_roialign  # noqa: F401  (registers the op's compute and schedules on import)
from tvm_roialign.frontend import convert_map, from_onnx


class Pool(torch.nn.Module):
    def forward(self, x, rois):
        return torchvision.ops.roi_align(x, rois, (3, 3), spatial_scale=0.25, sampling_ratio=2, aligned=True)


x = torch.rand(1, 4, 16, 16)
rois = torch.tensor([[0, 4.0, 6.0, 40.0, 50.0], [0, 20.5, 12.25, 44.0, 33.0]])  # (batch, x1, y1, x2, y2)
expected = Pool()(x, rois).numpy()


def run(mod):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(rois.numpy()))
    return (out if hasattr(out, "numpy") else out[0]).numpy()  # torch.export returns a tuple


program = torch.export.export(Pool(), (x, rois))
buffer = io.BytesIO()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(Pool(), (x, rois), buffer, input_names=["x", "rois"], opset_version=16, dynamo=False)
model = onnx.load_from_string(buffer.getvalue())

imports = {
    "torch.export, TVM importer + convert_map()": from_exported_program(
        program, custom_convert_map=convert_map()
    ),
    "torch.export, TVM importer alone": from_exported_program(program),
    "ONNX, tvm_roialign.frontend.from_onnx": from_onnx(model),
    "ONNX, TVM importer alone": tvm_from_onnx(model),
}
for name, mod in imports.items():
    print(f"{name:45s} max |TVM - torchvision| = {np.abs(run(mod) - expected).max():.2e}")
