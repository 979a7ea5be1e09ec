"""torchvision's Mask R-CNN through TVM: three static graphs in TVM, the data-dependent glue in PyTorch.

A whole-model ``torch.export`` of ``maskrcnn_resnet50_fpn`` fails on data-dependent guards in
``batched_nms`` and the ONNX route fails in TVM's importer (Loop, dynamic Resize/Reshape), so the
detector is split:

========================  ===========================================================  ========
piece                     content                                                       where
========================  ===========================================================  ========
``backbone``              ResNet-50 + FPN + RPN head; ``[1, 3, H, W]`` -> 5 feature     TVM
                          maps (NHWC), objectness and box deltas per level (NHWC)
``box_branch``            ``MultiScaleRoIAlign`` (7x7) + box head + box predictor;       TVM
                          4 feature maps + proposals ``[1000, 4]`` (padded) ->
                          class logits ``[1000, 91]``, box regression ``[1000, 364]``
``mask_branch``           ``MultiScaleRoIAlign`` (14x14) + mask head + mask predictor;   TVM
                          4 feature maps + boxes ``[100, 4]`` (padded) -> mask
                          logits ``[100, 91, 28, 28]``
glue                      transform (resize, normalize, pad), anchors, proposal          PyTorch
                          decoding + NMS, box decoding + per-class NMS, mask paste
========================  ===========================================================  ========

The glue calls torchvision's own module methods (``model.transform``, ``model.rpn.anchor_generator``,
``model.rpn.filter_proposals``, ``model.roi_heads.postprocess_detections``, ``maskrcnn_inference``,
``model.transform.postprocess``). The feature maps cross between graphs in the layout the graphs
compute in (NHWC after :class:`~tvm_roialign.passes.ConvertLayout`), so that no transpose is left
next to the RoIAlign op.

Weights: ``weights=None, weights_backbone=None`` and a fixed seed (no download), or a state_dict
file. A random model still makes confident detections on the astronaut photo (scores up to ~0.87
with torchvision's own ``box_score_thresh=0.05``, 100 detections); the default seed 3 was picked
among seeds 1-6 because its best boxes are box-shaped rather than slivers, which only makes the
picture easier to look at. The detections mean nothing, but TVM and PyTorch eager are compared on
the same 100 boxes, labels and masks.

Modules: :mod:`.torch_model` (model, weights, photo), :mod:`.pieces` (the exportable pieces),
:mod:`.detector` (build and run, :class:`TVMMaskRCNN`), :mod:`.draw` (the picture);
:func:`compare_detections` (TVM vs PyTorch detections) is :mod:`tvm_roialign.models.compare`'s.
The ``maskrcnn`` command's measuring harness (the report, eager timing, the ONNX Runtime peer) is
:mod:`tvm_roialign.bench`, not part of this API.
"""

from __future__ import annotations

from ..compare import compare_detections
from .detector import (
    DEFAULT_LAYOUTS,
    SHAPES,
    SYMBOLIC_SIDES,
    DetectionRun,
    Piece,
    TVMMaskRCNN,
    convert_layout,
)
from .draw import draw_detections
from .pieces import (
    conv_transpose_as_conv,
    count_permutes,
    export_piece,
    permutes_adjacent_to_roi_align,
    piece_modules,
    static_rois,
)
from .torch_model import MaskRCNNConfig, build_torch_model, category_names, load_image

__all__ = [
    "DEFAULT_LAYOUTS",
    "SHAPES",
    "SYMBOLIC_SIDES",
    "DetectionRun",
    "MaskRCNNConfig",
    "Piece",
    "TVMMaskRCNN",
    "build_torch_model",
    "category_names",
    "compare_detections",
    "conv_transpose_as_conv",
    "convert_layout",
    "count_permutes",
    "draw_detections",
    "export_piece",
    "load_image",
    "permutes_adjacent_to_roi_align",
    "piece_modules",
    "static_rois",
]
