"""A user's torchvision-style detector, small enough to compile in seconds: its own three-conv
backbone (one feature map, stride 8), its own anchors and poolers, 5 classes. Shared by the
detector and runtime tests. :func:`wide_tiny_mask_rcnn` is one of 64 channels with stride-1 3x3
convolutions in the backbone, the RPN head and the mask head: the convolutions a fast build
(Winograd) rewrites."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torchvision.models.detection import FasterRCNN, MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.ops import MultiScaleRoIAlign


class TinyBackbone(torch.nn.Module):
    out_channels = 32

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 32, 3, stride=2, padding=1),
        )

    def forward(self, x):
        return OrderedDict([("0", self.body(x))])


def tiny_rcnn(masks: bool, seed: int, detections_per_img: int):
    """A Faster R-CNN (``masks=False``) or Mask R-CNN with random weights from ``seed``, in eval
    mode: 160-200 pixel resize, 300 / 50 proposals, score threshold 0 (every candidate counts)."""
    torch.manual_seed(seed)
    backbone = TinyBackbone()
    settings = dict(
        min_size=160,
        max_size=200,
        rpn_anchor_generator=AnchorGenerator(sizes=((16, 32, 64),), aspect_ratios=((0.5, 1.0, 2.0),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
        rpn_pre_nms_top_n_test=300,
        rpn_post_nms_top_n_test=50,
        box_detections_per_img=detections_per_img,
        box_score_thresh=0.0,
    )
    if not masks:
        return FasterRCNN(backbone, num_classes=5, **settings).eval()
    # the heads in the order the parameters are drawn from the seed
    box_predictor = FastRCNNPredictor(1024, 5)
    mask_roi_pool = MultiScaleRoIAlign(["0"], output_size=14, sampling_ratio=2)
    mask_head = MaskRCNNHeads(32, [32, 32], 1)
    mask_predictor = MaskRCNNPredictor(32, 32, 5)
    return MaskRCNN(
        backbone,
        box_predictor=box_predictor,
        mask_roi_pool=mask_roi_pool,
        mask_head=mask_head,
        mask_predictor=mask_predictor,
        **settings,
    ).eval()


def tiny_keypoint_rcnn(seed: int, detections_per_img: int, num_keypoints: int = 5):
    """A Keypoint R-CNN of the same parts (2 classes, ``num_keypoints`` keypoints, a two-conv
    keypoint head) with random weights from ``seed``, in eval mode."""
    from torchvision.models.detection import KeypointRCNN
    from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor

    torch.manual_seed(seed)
    return KeypointRCNN(
        TinyBackbone(),
        num_classes=2,
        min_size=160,
        max_size=200,
        rpn_anchor_generator=AnchorGenerator(sizes=((16, 32, 64),), aspect_ratios=((0.5, 1.0, 2.0),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
        keypoint_roi_pool=MultiScaleRoIAlign(["0"], output_size=14, sampling_ratio=2),
        keypoint_head=KeypointRCNNHeads(32, (32, 32)),
        keypoint_predictor=KeypointRCNNPredictor(32, num_keypoints),
        rpn_pre_nms_top_n_test=300,
        rpn_post_nms_top_n_test=50,
        box_detections_per_img=detections_per_img,
        box_score_thresh=0.0,
    ).eval()


class WideTinyBackbone(torch.nn.Module):
    """Three stride-2 convs to stride 8, then a 64 -> 64 stride-1 3x3 conv."""

    out_channels = 64

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, padding=1),
        )

    def forward(self, x):
        return OrderedDict([("0", self.body(x))])


def wide_tiny_mask_rcnn(seed: int, detections_per_img: int, logit_scale: float):
    """A Mask R-CNN of 64 channels (:class:`WideTinyBackbone`, a two-conv mask head) with random
    weights from ``seed``, in eval mode, 160-200 pixel resize, 300 / 50 proposals; its class
    logits scaled by ``logit_scale`` so that the scores spread over (0, 1) as a trained
    model's do, rather than all near 1 / 5."""
    torch.manual_seed(seed)
    model = MaskRCNN(
        WideTinyBackbone(),
        min_size=160,
        max_size=200,
        rpn_anchor_generator=AnchorGenerator(sizes=((16, 32, 64),), aspect_ratios=((0.5, 1.0, 2.0),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
        box_predictor=FastRCNNPredictor(1024, 5),
        mask_roi_pool=MultiScaleRoIAlign(["0"], output_size=14, sampling_ratio=2),
        mask_head=MaskRCNNHeads(64, [64, 64], 1),
        mask_predictor=MaskRCNNPredictor(64, 64, 5),
        rpn_pre_nms_top_n_test=300,
        rpn_post_nms_top_n_test=50,
        box_detections_per_img=detections_per_img,
    ).eval()
    with torch.no_grad():
        model.roi_heads.box_predictor.cls_score.weight.mul_(logit_scale)
    return model
