"""``run DETECTOR.so --image PHOTO [PHOTO ...]``: the photos, their output files and the timing.

Every photo is read (:func:`tvm_roialign.runtime.read_image`) before the artifact runs, so a bad
one stops the command with one line before anything is written. Each photo gets its own picture
and JSON: with one photo ``--out`` and ``--json`` as given, with several ``--out``'s and
``--json``'s names with the photo's name added (and its position, where two photos share a name).
"""

from __future__ import annotations

import time
from pathlib import Path

from ._common import CLIError, first_line

#: ``run``'s options for a model's tensors, which a detector (fed photos) does not take.
MODEL_ONLY = (
    ("inputs", "--inputs"),
    ("inputs_by_order", "--inputs-by-order"),
    ("outputs", "--outputs"),
    ("print_top", "--print-top"),
    ("profile", "--profile"),
)


def add_image_argument(group) -> None:
    group.add_argument(
        "--image",
        nargs="+",
        action="extend",
        default=None,
        metavar="PHOTO",
        help="photos (any Pillow format) to run the detector on: --image a.jpg b.png, or "
        "--image repeated, or a sample photo's name (astronaut, coffee, chelsea, rocket, "
        "grace_hopper); each gets its own --out picture and --json (named after the photo "
        "when there are several)",
    )


def reject_model_options(args) -> None:
    """The options for a model's tensors, given with a detector: one line naming the first."""
    for attr, flag in MODEL_ONLY:
        if getattr(args, attr, None) not in (None, False):
            raise CLIError(
                f"{flag} applies to a model's tensors, not to the detector library "
                f"{args.library!r}, which runs on --image PHOTO"
            )


def output_pairs(photos: list[str], out: Path, report: Path) -> list[tuple[Path, Path]]:
    """``(picture, JSON)`` of each photo: ``out`` and ``report`` for one photo; for several,
    ``OUT_NAME.png`` with ``NAME`` the photo's name (``OUT_2_NAME.png`` where names repeat)."""
    if len(photos) == 1:
        return [(out, report)]
    stems = [Path(p).stem for p in photos]
    tags = [
        stem if stems.count(stem) == 1 else f"{i}_{stem}" for i, stem in enumerate(stems, 1)
    ]
    return [
        (
            out.with_name(f"{out.stem}_{tag}{out.suffix}"),
            report.with_name(f"{report.stem}_{tag}{report.suffix}"),
        )
        for tag in tags
    ]


def read_photos(photos: list[str]) -> list:
    """Every photo as ``[H, W, 3]`` uint8 RGB: a file, or the name of a sample photo
    (:data:`~tvm_roialign.runtime.sample_photos.SAMPLE_PHOTOS`) where no file of that name exists;
    the first unreadable one is one line naming it."""
    from ..runtime import read_image
    from ..runtime.sample_photos import SAMPLE_PHOTOS, sample_photo

    arrays = []
    for photo in photos:
        if photo in SAMPLE_PHOTOS and not Path(photo).exists():
            try:
                arrays.append(sample_photo(photo))
            except ImportError as err:
                raise CLIError(
                    f"--image {photo}: the sample photos come with scikit-image and matplotlib "
                    f"({first_line(err)}); give a photo file instead"
                ) from None
            continue
        try:
            arrays.append(read_image(photo))
        except FileNotFoundError as err:
            raise CLIError(
                f"--image: {first_line(err)} (a photo file in any format Pillow reads, or a sample "
                f"photo's name: {', '.join(SAMPLE_PHOTOS)})"
            ) from None
        except ValueError as err:
            raise CLIError(f"--image: {first_line(err)}") from None
    return arrays


def time_detector(detector, photos: list, number: int, repeat: int):
    """:class:`~tvm_roialign.profiling.TimingSummary` of one pass of ``detector`` over every
    photo (one artifact call each, with the NumPy pre- and post-processing), after a warm-up
    pass: ``repeat`` measurements, each the mean of ``number`` passes."""
    import numpy as np

    from ..profiling import TimingSummary

    for rgb in photos:
        detector(rgb)
    results = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            for rgb in photos:
                detector(rgb)
        results.append((time.perf_counter() - start) / number)
    values = np.asarray(results)
    return TimingSummary(
        mean_s=float(values.mean()),
        median_s=float(np.median(values)),
        min_s=float(values.min()),
        max_s=float(values.max()),
        std_s=float(values.std()),
        repeat=repeat,
        number=number,
        results_s=tuple(results),
    )


def print_detector_time(detector, photos: list, number: int, repeat: int) -> None:
    """``--print-time`` of a detector: what one timed call is, then tvmc's summary table."""
    from . import _report

    count = len(photos)
    what = "the photo" if count == 1 else f"all {count} photos, one artifact call each"
    print(
        f"timed: the detector artifact incl. its NumPy pre- and post-processing (resize, "
        f"normalize, box mapping, mask paste), one call = {what}"
    )
    _report.print_time(time_detector(detector, photos, number, repeat))
