"""Mask R-CNN through TVM from Python, with the torchvision model's call signature.

    python examples/maskrcnn_python.py            # astronaut photo, llvm, NHWC

Builds torchvision's maskrcnn_resnet50_fpn (random weights, seed 3: no download), compiles its
three static graphs with tvm-roialign (backbone + FPN + RPN head, box branch, mask branch; the
last two with a symbolic number of rois), runs it next to PyTorch eager and compares.
"""

import torch

from tvm_roialign.models import maskrcnn as mr

model = mr.build_torch_model(
    mr.MaskRCNNConfig()
)  # or MaskRCNNConfig(weights="maskrcnn.pth")
image = mr.load_image()  # [3, 512, 512] in [0, 1]; load_image("photo.jpg") for your own

detector = mr.TVMMaskRCNN(model, target="llvm", layout="NHWC", progress=print)
(ours,) = detector([image])  # compiles on first call, then runs
with torch.no_grad():
    (reference,) = model([image])

print({key: tuple(value.shape) for key, value in ours.items()})
print(mr.compare_detections(ours, reference))
print(detector.permute_counts())
mr.draw_detections(image, ours, "maskrcnn_python.png")
