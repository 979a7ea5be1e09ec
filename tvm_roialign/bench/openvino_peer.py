"""OpenVINO as a peer: a model (an ONNX file, or a torch module through ``openvino.convert_model``)
compiled for the CPU plugin with as many threads as PyTorch uses, one stream, latency hint.

``precision="f32"`` sets ``INFERENCE_PRECISION_HINT=f32`` (every op in fp32, what the other
runtimes compute); ``precision=None`` leaves the plugin's default, which on a CPU with AMX or
AVX512-BF16 is bf16: :attr:`OpenVINOModel.precision` says which it chose. ``openvino`` is an
optional dependency; :func:`available` says whether it is installed. :func:`nncf_int8` is OpenVINO's
own int8: NNCF's post-training quantization of the converted model (``nncf``, the bench extra).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch


def available() -> bool:
    """Whether ``openvino`` is importable."""
    return importlib.util.find_spec("openvino") is not None


def nncf_available() -> bool:
    """Whether ``nncf`` (OpenVINO's quantizer) is importable."""
    return importlib.util.find_spec("nncf") is not None


def nncf_int8(model, calibration: list, **options):
    """OpenVINO's int8 model of ``model`` (an ONNX path or an ``openvino.Model``): ``nncf.quantize``
    (post-training, its default preset: symmetric int8 weights per output channel, activations
    per tensor) calibrated on ``calibration``, one item per call (an array, or a tuple of a call's
    inputs); ``options`` go to ``nncf.quantize`` (``ignored_scope``, ``model_type`` ...)."""
    import nncf
    import openvino as ov

    if not isinstance(model, ov.Model):
        model = ov.Core().read_model(str(model))
    items = [item if isinstance(item, tuple) else (item,) for item in calibration]
    dataset = nncf.Dataset(items, lambda item: list(item))
    return nncf.quantize(model, dataset, subset_size=len(items), **options)


def cpu_config(threads: int, precision: str | None) -> dict:
    """The CPU plugin's properties: ``threads`` inference threads, one stream, latency hint, and
    ``INFERENCE_PRECISION_HINT=precision`` unless None."""
    config = {
        "INFERENCE_NUM_THREADS": int(threads),
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
    }
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    return config


class OpenVINOModel:
    """``model`` (an ONNX path, or an ``openvino.Model`` from ``convert_model``) compiled for the
    CPU; calling it with NumPy inputs returns its outputs as NumPy arrays."""

    def __init__(self, model, threads: int, precision: str | None = "f32"):
        import openvino as ov

        core = ov.Core()
        if not isinstance(model, ov.Model):
            model = core.read_model(str(model))
        self.compiled = core.compile_model(model, "CPU", cpu_config(threads, precision))
        self.request = self.compiled.create_infer_request()
        precision = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        self.precision = str(getattr(precision, "get_type_name", lambda: precision)())
        self.threads = threads

    def __call__(self, *inputs) -> list[np.ndarray]:
        results = self.request.infer(list(inputs))
        return [np.asarray(results[out]) for out in self.compiled.outputs]


#: a detector's outputs in the order the converted model returns them (those it has)
DETECTION_OUTPUTS = ("boxes", "labels", "scores", "masks", "keypoints", "keypoints_scores")


class _DetectionsAsTensors(torch.nn.Module):
    """A torchvision detector as a module of one image returning every output it has (boxes,
    labels, scores, and masks or keypoints): what ``openvino.convert_model`` traces. A head whose
    output were not returned would be pruned from the converted model and never run."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, image):
        out = self.model([image])[0]
        return tuple(out[key] for key in DETECTION_OUTPUTS if key in out)


class _NetworkDetections(torch.nn.Module):
    """A torchvision detector without its last step, the pasting of each mask into the photo: the
    boxes scaled back to the photo, labels, scores, and the heads' raw outputs (a Mask R-CNN's
    ``[N, 1, 28, 28]`` mask probabilities; a Keypoint R-CNN's keypoints, scaled back). What a
    runtime's own network costs, without torchvision's pasting as the runtime would trace it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, image):
        from torchvision.models.detection.transform import resize_boxes, resize_keypoints

        model, size = self.model, image.shape[-2:]
        images, _ = model.transform([image])
        features = model.backbone(images.tensors)
        proposals, _ = model.rpn(images, features)
        out = model.roi_heads(features, proposals, images.image_sizes)[0][0]
        resized = images.image_sizes[0]
        out["boxes"] = resize_boxes(out["boxes"], resized, size)
        if "keypoints" in out:
            out["keypoints"] = resize_keypoints(out["keypoints"], resized, size)
        return tuple(out[key] for key in DETECTION_OUTPUTS if key in out)


def detector_model(model, image, paste: bool = True):
    """``openvino.convert_model`` of a torchvision detector (eval mode) for ``image``'s size
    ``[3, H, W]``: an ``openvino.Model`` returning boxes, labels, scores and the masks or
    keypoints of a Mask or Keypoint R-CNN (:data:`DETECTION_OUTPUTS`); ``paste=False``: a Mask
    R-CNN's masks as the head's ``[N, 1, 28, 28]`` probabilities, not pasted into the photo
    (:class:`_NetworkDetections`)."""
    import openvino as ov

    wrapper = _DetectionsAsTensors(model) if paste else _NetworkDetections(model)
    with torch.no_grad():
        return ov.convert_model(wrapper, example_input=(image,))


#: the nodes of a converted torchvision detector that :func:`detector_int8` leaves float: the
#: operations of the modules themselves (``transform``, ``rpn``, ``roi_heads``: normalization,
#: anchors, box decoding, NMS, the per-image splits; ``prim::`` are TorchScript's list unpacks) and
#: the RoI poolers, so that NNCF quantizes the layers of backbone, FPN, RPN head and box, mask and
#: keypoint heads and predictors. Quantizing the rest, as ``nncf.quantize`` does by default, turns
#: box coordinates, areas and the level mapper's square roots into 8-bit values: on the synthetic
#: reference Mask R-CNN (docs/int8.md) box mAP 0.88 -> 0.05, none of fp32's confident detections kept.
DETECTOR_POSTPROCESSING = (
    r"__module\.model/.*",
    r"__module\.model\.(transform|rpn|roi_heads)/.*",
    r"__module\.model\.rpn\.anchor_generator.*",
    r"__module\.model\.roi_heads\.(box|mask|keypoint)_roi_pool.*",
    r"prim::.*",
)


def detector_int8(model, image, calibration: list, folder: str):
    """OpenVINO's int8 of a torchvision detector: :func:`detector_model` without the mask pasting
    (``paste=False``: boxes, labels, scores and the ``[N, 1, 28, 28]`` mask probabilities) for
    ``image``'s size, quantized by :func:`nncf_int8` on ``calibration`` (``[3, H, W]`` arrays of that
    size) with the post-processing in its ``ignored_scope`` (:data:`DETECTOR_POSTPROCESSING`), as an
    OpenVINO user quantizing a detector is told to: NNCF 3.4 quantizes the convolutions, matmuls and
    residual adds of the backbone, FPN, RPN head and the heads (FakeQuantize on their inputs and
    weights); NMS, RoIAlign and box decoding stay float.

    The converted model goes through its IR on disk (``openvino.save_model`` into ``folder``, then
    ``read_model``) first, as a user quantizing a saved model does: on the model as
    ``convert_model`` returns it, ``nncf.quantize`` fails (``InternalError: Could not find a node
    aten::unsqueeze/Unsqueeze_1 in NNCFGraph!``) because constants inside the bodies of its two
    ``If`` ops (torchvision's scripted ``batched_nms``) are the same nodes the main graph reads, so
    NNCF's graph of a body has edges to nodes outside it; the IR writes each graph's own copy."""
    import os

    import nncf
    import openvino as ov

    path = os.path.join(folder, "detector_f32.xml")
    ov.save_model(detector_model(model, image, paste=False), path, compress_to_fp16=False)
    scope = nncf.IgnoredScope(patterns=list(DETECTOR_POSTPROCESSING), validate=False)
    return nncf_int8(ov.Core().read_model(path), calibration, ignored_scope=scope)


__all__ = [
    "DETECTOR_POSTPROCESSING",
    "OpenVINOModel",
    "available",
    "cpu_config",
    "detector_int8",
    "detector_model",
    "nncf_available",
    "nncf_int8",
]
