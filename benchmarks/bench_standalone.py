"""End-to-end time of the standalone detector artifact against the split pipeline and PyTorch eager.

One process, one photo, the same target for both TVM builds:

* ``standalone``: the whole detector as one artifact (:func:`tvm_roialign.models.detection.
  compile_detector`), run through :class:`tvm_roialign.runtime.Detector` (the PyTorch-free runner,
  mask paste included);
* ``split``: :class:`tvm_roialign.models.maskrcnn.TVMMaskRCNN` (three TVM graphs, glue in PyTorch;
  Mask R-CNN only);
* ``eager``: torchvision's ``model([image])``.

Each is run ``--repeat`` times after a warm-up, interleaved round by round so that drift of this
shared machine hits all of them alike; the median and the minimum are reported, with the ratios
standalone / split and standalone / eager. Detections are compared with eager's as well.

    python benchmarks/bench_standalone.py [--models maskrcnn_resnet50_fpn,fasterrcnn_resnet50_fpn]
        [--photo astronaut] [--target host|llvm|JSON] [--repeat 5] [--out benchmarks/results/...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from tvm_roialign.host import use_usable_cores
from tvm_roialign.models import detection as det
from tvm_roialign.runtime import Detector
from tvm_roialign.target import host_config, parse_target, target_config


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_model(name, rgb, target, repeat, workdir, log):
    model = det.build_torch_detector(name)
    image = torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0
    runners = {}

    log(f"{name}: compile the standalone artifact")
    artifact = det.compile_detector(model, target=target)  # the default: one function, any size
    standalone = Detector(artifact.export(Path(workdir) / f"{name}.so"))
    runners["standalone"] = lambda: standalone(rgb)
    compile_s = {"standalone": artifact.import_s + artifact.compile_s}

    if name.startswith("maskrcnn"):
        from tvm_roialign.models.maskrcnn import TVMMaskRCNN

        log(f"{name}: compile the split pipeline")
        split = TVMMaskRCNN(model, target=target, layout="NHWC")
        with torch.no_grad():
            image_list, _ = model.transform([image])
        t0 = time.perf_counter()
        pieces = split.compile(image_list.tensors.shape)
        compile_s["split"] = time.perf_counter() - t0
        del pieces
        runners["split"] = lambda: split([image])[0]

    def eager():
        with torch.no_grad():
            return model([image])[0]

    runners["eager"] = eager
    for run in runners.values():  # warm-up (VM allocation, caches)
        run()
    times = {key: [] for key in runners}
    for round_ in range(repeat):
        log(f"{name}: round {round_ + 1}/{repeat}")
        for key, run in runners.items():
            seconds, _ = timed(run)
            times[key].append(seconds)

    ours = standalone(rgb)
    comparison = det.compare(ours, det.torch_detections(model, rgb))
    result = {
        "compile_s": compile_s,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "min_s": {k: min(v) for k, v in times.items()},
        "runs_s": times,
        "standalone_artifact_only_s": ours["run_s"],
        "num_detections": len(ours["boxes"]),
        "comparison_with_eager": comparison,
    }
    med = result["median_s"]
    result["ratios"] = {"standalone_over_eager": med["standalone"] / med["eager"]}
    if "split" in med:
        result["ratios"]["standalone_over_split"] = med["standalone"] / med["split"]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="maskrcnn_resnet50_fpn,fasterrcnn_resnet50_fpn"
    )
    parser.add_argument(
        "--photo", default="astronaut", help=", ".join(det.SAMPLE_PHOTOS)
    )
    parser.add_argument(
        "--target", default="host", help="host (llvm + this CPU), llvm, or JSON"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/bench_standalone.json")
    args = parser.parse_args(argv)

    target = parse_target(host_config() if args.target == "host" else args.target)
    rgb = det.sample_photo(args.photo)
    torch.set_num_threads(use_usable_cores())

    def log(message):
        print(message, file=sys.stderr, flush=True)

    report = {
        "photo": args.photo,
        "image_size": list(rgb.shape[:2]),
        "target": target_config(target),
        "torch_threads": torch.get_num_threads(),
        "repeat": args.repeat,
        "models": {},
    }
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.models.split(","):
            report["models"][name] = bench_model(
                name, rgb, target, args.repeat, workdir, log
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))

    print(
        f"photo {args.photo} {rgb.shape[1]}x{rgb.shape[0]}, target {target_config(target)}, "
        f"median of {args.repeat}"
    )
    print(
        f"{'model':34s} {'standalone s':>13s} {'split s':>9s} {'eager s':>9s} "
        f"{'standalone/split':>17s} {'standalone/eager':>17s}  exact"
    )
    for name, r in report["models"].items():
        med, ratios = r["median_s"], r["ratios"]
        split = f"{med['split']:9.3f}" if "split" in med else f"{'-':>9s}"
        over_split = ratios.get("standalone_over_split")
        over_split = f"{over_split:17.2f}" if over_split is not None else f"{'-':>17s}"
        print(
            f"{name:34s} {med['standalone']:13.3f} {split} {med['eager']:9.3f} {over_split} "
            f"{ratios['standalone_over_eager']:17.2f}  {r['comparison_with_eager']['passed']}"
        )
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
