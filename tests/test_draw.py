"""Pictures of detections (tvm_roialign/runtime/draw.py) for photos of every size: a tiny photo is
scaled up in whole pixel blocks and the caption strip is wide enough to read; a long strip of a
photo is drawn as it is. Pillow only, no model."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_roialign.runtime.draw import MIN_CAPTION_WIDTH, MIN_PICTURE_SIDE, draw_detections

CAPTION = "tvm-roialign: fasterrcnn_resnet50_fpn, random weights (seed 0), fp32, 12.3 ms"
BACKGROUND = (24, 24, 24)


def _detections(boxes):
    n = len(boxes)
    return {"boxes": np.asarray(boxes, np.float32).reshape(n, 4), "labels": np.ones(n, np.int64),
            "scores": np.full(n, 0.9, np.float32)}


def _caption_columns(picture: np.ndarray, photo_height: int) -> int:
    """How many columns of the caption strip hold text (pixels other than the background)."""
    strip = picture[photo_height:]
    return int((strip != np.asarray(BACKGROUND, np.uint8)).any(axis=(0, 2)).sum())


def test_a_one_pixel_photo_is_scaled_up_with_a_readable_caption():
    rgb = np.array([[[200, 40, 10]]], np.uint8)
    picture = np.asarray(draw_detections(rgb, _detections([]), caption=CAPTION))
    side = MIN_PICTURE_SIDE
    assert picture.shape[1] == MIN_CAPTION_WIDTH and picture.shape[0] > side, picture.shape
    assert (picture[:side, :side] == rgb[0, 0]).all()  # the pixel as one block
    assert _caption_columns(picture, side) > MIN_CAPTION_WIDTH // 2  # not a one-pixel strip of it
    tagged = np.asarray(draw_detections(rgb, _detections([[0, 0, 1, 1]]), caption=CAPTION))
    assert tagged.shape == picture.shape


@pytest.mark.parametrize(
    "height, width, scaled",
    [(1, 803, (5, 4015)), (803, 1, (4015, 5)), (10, 4000, (10, 4000)), (480, 640, (480, 640)),
     (100, 150, (200, 300)), (240, 320, (240, 320))],
)
def test_picture_sizes(height, width, scaled):
    """Scaled by the least whole factor that brings the shorter side to MIN_PICTURE_SIDE, the
    longer side kept within 4096; the caption strip at least MIN_CAPTION_WIDTH wide."""
    rgb = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    factor = scaled[0] // height
    plain = np.asarray(draw_detections(rgb, _detections([]), caption=CAPTION))
    # every photo pixel a factor x factor block
    np.testing.assert_array_equal(plain[: scaled[0], : scaled[1]],
                                  rgb.repeat(factor, axis=0).repeat(factor, axis=1))
    picture = np.asarray(draw_detections(rgb, _detections([[0, 0, width / 2, height / 2]]),
                                         caption=CAPTION))
    assert picture.shape == plain.shape
    assert picture.shape[1] == max(scaled[1], MIN_CAPTION_WIDTH) and picture.shape[0] > scaled[0]
    assert _caption_columns(picture, scaled[0]) > MIN_CAPTION_WIDTH // 2
