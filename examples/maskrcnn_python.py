"""Mask R-CNN through TVM from Python, with the torchvision model's call signature.

    python examples/maskrcnn_python.py            # astronaut photo, this machine's CPU, NHWC

Builds torchvision's maskrcnn_resnet50_fpn (random weights, seed 3: no download), compiles its
three graphs with tvm-roialign (backbone + FPN + RPN head, box branch, mask branch; one build for
every photo size, the branches for the model's roi bounds, 1000 proposals and 100 detections, the
rois padded in the glue), runs it next to PyTorch eager and compares.
"""

import torch

from tvm_roialign.models import maskrcnn as mr

model = mr.build_torch_model(mr.MaskRCNNConfig())  # or MaskRCNNConfig(weights="maskrcnn.pth")
image = mr.load_image()  # [3, 512, 512] in [0, 1]; load_image("photo.jpg") for your own

# target=None is "native" (this machine's CPU); "llvm-generic" for a portable build
detector = mr.TVMMaskRCNN(model, target=None, layout="NHWC", progress=print)
run = detector.run(image)  # compiles on first call, then runs; detector([image]) gives the dicts only
with torch.no_grad():
    (reference,) = model([image])

print({key: tuple(value.shape) for key, value in run.detections.items()})
print(mr.compare_detections(run.detections, reference))
print(detector.permute_counts())
print({name: f"{seconds * 1e3:.1f} ms" for name, seconds in run.piece_s.items()})
mr.draw_detections(image, run.detections, "maskrcnn_python.png", caption="TVM on this machine's CPU")
