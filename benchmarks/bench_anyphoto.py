"""One detector artifact for photos of every size, against torchvision eager and static builds.

For one model: the exact any-size artifact (``compile --exact``: :func:`tvm_roialign.models.detection.
compile_detector` with no sizes and ``fast=False``: one function, its padded height and width
symbolic; ``--fast`` times the default fast build beside it, judged by the fast criterion), run
through :class:`tvm_roialign.runtime.Detector` on each photo at its own size and on a batch of
three photos in one call; compared with torchvision eager (``model([image])``, and ``model([a, b,
c])`` for the batch). For the ``--static`` photos (default: all), an artifact compiled for that
photo's padded size only (one per padded size) is timed too. Each photo's runners take turns,
round after round (median of ``--repeat``), so that a drift of this shared machine reaches them
alike; the ratios any-size / static and any-size / eager come from the same rounds. Compile time
and library size are reported for each artifact.

    python benchmarks/bench_anyphoto.py [--model maskrcnn_resnet50_fpn] [--repeat 5]
        [--static all|coffee,grace_hopper] [--out benchmarks/results/bench_anyphoto.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import interleaved_seconds, write_report

from tvm_roialign.host import use_usable_cores
from tvm_roialign.models import detection as det
from tvm_roialign.models.compare import compare_fast, model_limits
from tvm_roialign.models.detector_reference import detections_as_numpy
from tvm_roialign.runtime import Detector


def photos() -> dict:
    """The photos at their own sizes: the packages' five, a portrait and a very wide one."""
    out = {name: det.sample_photo(name) for name in det.SAMPLE_PHOTOS}
    out["portrait"] = np.ascontiguousarray(np.rot90(det.sample_photo("coffee")))  # 600x400
    out["wide"] = np.ascontiguousarray(det.sample_photo("rocket")[130:290])  # 160x640, 1:4
    return out


def compiled(model, sizes, target, path, log, what, fast=False):
    log(f"compile {what}")
    artifact = det.compile_detector(model, sizes, target=target, fast=fast)
    library = artifact.export(path)
    return Detector(library), {
        "import_s": artifact.import_s,
        "build_s": artifact.compile_s,
        "library_mb": library.stat().st_size / 2**20,
        "padded_sizes": [b["padded"] for b in artifact.meta["buckets"]] or "any",
    }


def eager_batch(model, rgbs):
    images = [torch.from_numpy(r).permute(2, 0, 1).float() / 255.0 for r in rgbs]
    with torch.no_grad():
        results = model(images)
    return [detections_as_numpy(result) for result in results]


def batch_comparisons(model, detector, names) -> dict:
    """The photos ``names`` in one call of ``detector``, against eager's batched call."""
    every = photos()
    batch = [every[n] for n in names]
    ours = detector(batch)
    return {
        "photos": names,
        "padded": list(ours[0]["padded"]),
        "comparisons": [det.compare(o, r) for o, r in zip(ours, eager_batch(model, batch))],
    }


def print_report(report) -> None:
    a = report["artifact"]
    print(
        f"{report['model']}: one artifact, padded sizes {a['padded_sizes']}: import {a['import_s']:.0f} s, "
        f"build {a['build_s']:.0f} s, {a['library_mb']:.0f} MiB"
    )
    for name, s in report.get("static_artifacts", {}).items():
        print(
            f"  static artifact {name}: import {s['import_s']:.0f} s, build {s['build_s']:.0f} s, "
            f"{s['library_mb']:.0f} MiB"
        )
    print(f"{'photo':13s} {'size':>9s} {'padded':>9s} {'any s':>7s} {'static s':>9s} {'eager s':>8s} "
          f"{'any/static':>10s} {'any/eager':>9s} {'max box px':>10s} {'max score':>9s} {'masks':>7s} equal")
    for name, r in report["photos"].items():
        c = r["comparison_with_eager"]
        static = f"{r['static_s']:9.3f}" if "static_s" in r else f"{'-':>9s}"
        ratio = f"{r['any_over_static']:10.2f}" if "any_over_static" in r else f"{'-':>10s}"
        print(
            f"{name:13s} {'x'.join(map(str, r['size'])):>9s} {'x'.join(map(str, r['padded'])):>9s} "
            f"{r['any_s']:7.3f} {static} {r['eager_s']:8.3f} {ratio} {r['any_over_eager']:9.2f} "
            f"{c['max_box_diff']:10.2e} {c.get('max_score_diff', 0):9.1e} "
            f"{c['mask_pixel_agreement']:7.5f} {c['passed']}"
        )
    for name, r in report["photos"].items():
        if "fast_s" in r:
            c = r["comparison_fast"]
            print(
                f"{name:13s} fast {r['fast_s']:.3f} s: {r['any_s'] / r['fast_s']:.2f}x the exact "
                f"artifact, {r['eager_s'] / r['fast_s']:.2f}x eager; fast criterion {c['passed']} "
                f"({c['checked_torch']} eager detections checked, least box IoU {c['min_box_iou']:.4f})"
            )
    b = report.get("batch")
    if b is None:
        return
    print(f"batch {b['photos']} (padded {b['padded']}): equal to eager's batched call: "
          f"{[c['passed'] for c in b['comparisons']]}")


def static_artifacts(model, rgbs, args, workdir: Path, log, report) -> dict:
    """One static artifact per padded size of the ``--static`` photos, by padded size (and
    ``"photos"``: the names)."""
    if args.static == "none":
        return {"photos": []}
    names = list(rgbs) if args.static == "all" else [n for n in args.static.split(",") if n]
    statics = {"photos": names}
    for name in names:
        (padded,) = det.bucket_sizes(model.transform, rgbs[name].shape[:2])
        if padded in statics:
            continue
        key = f"{padded[0]}x{padded[1]}"
        statics[padded], report.setdefault("static_artifacts", {})[key] = compiled(
            model, [rgbs[name].shape[:2]], args.target, workdir / f"{key}.so", log,
            f"the static artifact of {key}",
        )
    return statics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="maskrcnn_resnet50_fpn")
    parser.add_argument("--target", default="native")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--static", default="all", help="photos timed against a static build, all or none")
    parser.add_argument("--batch", default="coffee,chelsea,grace_hopper", help="photos, or none")
    parser.add_argument("--fast", action="store_true", help="time the fast (default) artifact too")
    parser.add_argument("--photos", default="all", help="photos timed (comma-separated), or all")
    parser.add_argument("--out", default="benchmarks/results/bench_anyphoto.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(use_usable_cores())

    def log(message):
        print(message, file=sys.stderr, flush=True)

    model = det.build_torch_detector(args.model)
    rgbs = photos()
    if args.photos != "all":
        rgbs = {name: rgbs[name] for name in args.photos.split(",")}
    report = {"model": args.model, "target": args.target, "repeat": args.repeat, "photos": {}}
    with tempfile.TemporaryDirectory() as workdir:
        anysize, report["artifact"] = compiled(
            model, None, args.target, Path(workdir) / "any.so", log, "the any-size artifact"
        )
        fast = None
        if args.fast:
            fast, report["fast_artifact"] = compiled(
                model, None, args.target, Path(workdir) / "fast.so", log, "the fast artifact", True
            )
        statics = static_artifacts(model, rgbs, args, Path(workdir), log, report)
        for name, rgb in rgbs.items():
            log(f"{name} {rgb.shape[0]}x{rgb.shape[1]}")
            image = torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0
            ours = anysize(rgb)
            row = {
                "size": list(rgb.shape[:2]),
                "padded": list(ours["padded"]),
                "comparison_with_eager": det.compare(ours, det.torch_detections(model, rgb)),
            }

            def eager(image=image):
                with torch.no_grad():
                    return model([image])

            runners = {"any_s": lambda rgb=rgb: anysize(rgb), "eager_s": eager}
            if fast is not None:
                runners["fast_s"] = lambda rgb=rgb: fast(rgb)
                row["comparison_fast"] = compare_fast(
                    fast(rgb), det.torch_detections(model, rgb), **model_limits(model)
                )
            static = statics.get(tuple(ours["padded"])) if name in statics.get("photos", ()) else None
            if static is not None:
                runners["static_s"] = lambda d=static, rgb=rgb: d(rgb)
            row.update(interleaved_seconds(runners, args.repeat))
            if static is not None:
                row["any_over_static"] = row["any_s"] / row["static_s"]
            row["any_over_eager"] = row["any_s"] / row["eager_s"]
            report["photos"][name] = row
        names = [] if args.batch == "none" else args.batch.split(",")
        if names:
            report["batch"] = batch_comparisons(model, anysize, names)
    write_report(report, args.out, print_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
