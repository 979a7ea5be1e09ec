"""Which padded image sizes a detector artifact serves and its functions' names, and the
pipeline's Winograd options for detectors' two build modes (parts of
:mod:`tvm_roialign.models.detection`)."""

from __future__ import annotations

#: Winograd output tile of the detectors' 3x3 convolutions in the exact mode (``fast=False``,
#: ``--exact``): 0, none (direct convs, as PyTorch's). A detector's top-k, NMS and heatmap argmax turn
#: rounding into decisions, and Winograd rounds otherwise than PyTorch's direct convs, which can
#: change near-tie decisions.
WINOGRAD_TILE = 0

#: Winograd output tiles of the fast mode (the default; ``fast=True``, ``--fast``): each 3x3 conv
#: gets F(4x4, 3x3) or F(5x5, 3x3), whichever needs fewer products at its size (F(5x5) on the
#: mask head's 14x14 maps, 3 tiles a side against F(4x4)'s 4), 3-4x fewer than a direct conv;
#: their rounding error a few times the direct float32 conv's (F(2x2) has 2.25x fewer, its error
#: within the direct conv's; docs/detectors.md compares them).
FAST_WINOGRAD_TILE = (4, 5)

#: The build modes, as the artifact's metadata names them (``"mode"``): ``exact`` (direct convs:
#: detections equal to eager's, :data:`tvm_roialign.models.compare.CRITERIA`) and ``fast`` (Winograd:
#: :data:`tvm_roialign.models.compare.FAST_CRITERIA`).
MODES = ("exact", "fast")

#: The detectors' build mode when none is asked for: fast. Its 3x3 convolutions take 3-4x fewer
#: products, which is what puts a detector at twice eager's speed on a CPU whose direct convolutions
#: already run near its peak; its guarantee (FAST_CRITERIA) is eager's detections scored >= 0.1 with
#: box IoU >= 0.99, and on the test photos every detection but one NMS near tie (IoU 0.4999985 with
#: a better box, against the threshold 0.5) also meets the exact criterion (docs/detectors.md, build
#: modes). ``fast=False`` / ``--exact`` reproduces eager decision for decision.
DEFAULT_FAST = True


def build_mode(fast: bool) -> str:
    """The metadata's name of a build mode: ``"fast"`` or ``"exact"``."""
    return MODES[1] if fast else MODES[0]

#: The photo sizes whose padded sizes a default artifact serves: square, 4:3 and 3:2, landscape
#: and portrait (with the package's 512 / 512 resize: 512x512, 384x512, 512x384, 352x512,
#: 512x352; five builds in one artifact).
DEFAULT_PHOTO_SIZES = ((512, 512), (384, 512), (512, 384), (400, 600), (600, 400))

#: ``image_sizes`` of one function for every photo (symbolic height and width).
ANY = "any"

#: The artifact's function for any padded size.
ANY_FUNCTION = "detect"


def function_name(padded) -> str:
    """The artifact's function for one padded size: ``detect_<Hp>x<Wp>``."""
    return f"detect_{int(padded[0])}x{int(padded[1])}"


def bucket_sizes(transform, image_sizes=None) -> list[tuple[int, int]]:
    """The padded sizes an artifact of a model with ``transform`` (its
    ``GeneralizedRCNNTransform``) is built for: those of the photo sizes ``image_sizes`` (one
    ``(H, W)`` or a list; None: :data:`DEFAULT_PHOTO_SIZES`), or ``"all"``: every padded size a
    photo can get (:func:`~tvm_roialign.runtime.transform.all_padded_sizes`)."""
    from ..runtime.transform import all_padded_sizes, padded_size, resized_size

    low, high, divisible = int(transform.min_size[-1]), int(transform.max_size), int(
        transform.size_divisible
    )
    if isinstance(image_sizes, str):
        if image_sizes != "all":
            raise ValueError(f"image_sizes must be (H, W), a list of them or 'all', got {image_sizes!r}")
        return all_padded_sizes(low, high, divisible)
    if image_sizes is None:
        image_sizes = DEFAULT_PHOTO_SIZES
    elif len(image_sizes) == 2 and all(isinstance(v, int) for v in image_sizes):
        image_sizes = [image_sizes]
    sizes = []
    for size in image_sizes:
        height, width = (int(v) for v in size)
        if height < 1 or width < 1:
            raise ValueError(f"image sizes must be positive (H, W), got {tuple(size)}")
        padded = padded_size([resized_size((height, width), low, high)], divisible)
        if padded not in sizes:
            sizes.append(padded)
    return sizes


def graph_options(model, fast: bool = DEFAULT_FAST) -> dict:
    """The pipeline's Winograd options for a detector (``compile DETECTOR``, the ``maskrcnn``
    pieces and their tuning tasks alike): :data:`WINOGRAD_TILE` (exact), or
    :data:`FAST_WINOGRAD_TILE` when ``fast``, and the side at which a symbolic-size conv is
    judged worth it, a photo's padded longer side under ``model``'s transform (the pipeline's
    default without one)."""
    from ..runtime.transform import TransformSettings

    options = {"winograd": FAST_WINOGRAD_TILE if fast else WINOGRAD_TILE}
    transform = getattr(model, "transform", None)
    if transform is not None:
        options["reference_side"] = TransformSettings.of(transform).longest_padded_side()
    return options


__all__ = [
    "ANY",
    "ANY_FUNCTION",
    "DEFAULT_FAST",
    "DEFAULT_PHOTO_SIZES",
    "FAST_WINOGRAD_TILE",
    "MODES",
    "WINOGRAD_TILE",
    "bucket_sizes",
    "build_mode",
    "function_name",
    "graph_options",
]
