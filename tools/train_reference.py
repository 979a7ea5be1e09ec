"""Train the reference detectors on the synthetic dataset (tvm_roialign.datasets): torchvision's
maskrcnn_resnet50_fpn, every weight from scratch, then keypointrcnn_resnet50_fpn's keypoint head on
that Mask R-CNN's backbone, RPN and box head (TrainConfig.defaults / .base), and the reference
classifier (resnet18 on the dataset's one-object 64 px images, synthetic.CLASSIFIER_DATA); a fixed number of
iterations (not wall time), seeds fixed, 2 threads. The weights go to
~/.cache/tvm-roialign/reference/ named by a hash of the data and the schedule
(tvm_roialign.datasets.reference.weights_path); an existing file is kept, a .partial state beside it
(every 100 steps) is resumed. Never run by CI.

    python tools/train_reference.py --model maskrcnn        # about 70 min on 2 cores
    python tools/train_reference.py --model keypointrcnn    # after it, about 7 min
    python tools/train_reference.py --model resnet18        # about 10 min
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
import torch

from tvm_roialign.datasets import reference, synthetic


def classifier_batch(config: reference.TrainConfig, step: int):
    """``(images [B, 3, S, S] in [0, 1], classes [B])`` of train step ``step``."""
    first = step * config.batch
    indices = [(first + j) % config.train_images for j in range(config.batch)]
    images, classes = synthetic.classification_batch(config.data, "train", indices)
    return torch.from_numpy(images), torch.from_numpy(classes)


def batch(config: reference.TrainConfig, step: int):
    images, targets = [], []
    for j in range(config.batch):
        index = (step * config.batch + j) % config.train_images
        rgb, target = synthetic.sample(config.data, "train", index)
        images.append(torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0)
        t = {k: torch.from_numpy(v) for k, v in target.items()}
        if config.model != "keypointrcnn":
            t.pop("keypoints")
        targets.append(t)
    return images, targets


def lr_at(config: reference.TrainConfig, step: int) -> float:
    """Linear warmup, constant, then a tenth of the rate after ``decay_at`` of the iterations."""
    rate = config.lr * min(1.0, (step + 1) / config.warmup)
    return rate * (0.1 if step >= config.decay_at * config.iterations else 1.0)


def recalibrate_batchnorm(model, config: reference.TrainConfig) -> None:
    """BatchNorm's running statistics re-estimated as plain averages over ``bn_batches`` train
    batches of the trained weights (the momentum averages of training mix in older weights' and
    4-image batches' statistics; eval mode reads these)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    if not norms or not config.bn_batches:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average
    model.train()
    with torch.no_grad():
        for step in range(config.bn_batches):
            if config.model in reference.CLASSIFIERS:
                model(classifier_batch(config, step)[0])
                continue
            images, _ = batch(config, step)
            tensors, _ = model.transform(images)
            model.backbone(tensors.tensors)
    model.eval()


def train(config: reference.TrainConfig, path, log_every: int = 10):
    """The model of ``config`` trained. Every 100 steps the model, the optimizer and the step are
    saved beside ``path`` (``.partial``); a run finding that file goes on from it."""
    torch.manual_seed(config.seed)
    model = reference.build_model(config.model, config.data.size, seed=config.seed).train()
    base = config.base()
    if base is not None:  # the heads on a trained detector: its weights, BatchNorm in eval mode
        state = torch.load(reference.load_path(base), map_location="cpu")
        state = {k: v for k, v in state.items() if not k.startswith("roi_heads.mask_")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        untrained = [k for k in missing if not k.startswith(reference.KEYPOINT_TRAINED)]
        if untrained or unexpected:
            raise SystemExit(f"{base.model} does not fit {config.model}: {untrained or unexpected}")
        model.backbone.eval()
        trains = lambda name: name.startswith(reference.KEYPOINT_TRAINED)
    else:
        trains = lambda name: not name.startswith(reference.FROZEN)
    for name, param in model.named_parameters():
        param.requires_grad_(trains(name))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    partial = path.with_suffix(".partial")
    first = 0
    if partial.exists():
        state = torch.load(partial)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        first = state["step"]
        torch.set_rng_state(state["rng"])
        print(f"resuming at step {first} from {partial}", flush=True)
    start = time.time()
    for step in range(first, config.iterations):
        for group in opt.param_groups:
            group["lr"] = lr_at(config, step)
        if config.model in reference.CLASSIFIERS:
            images, classes = classifier_batch(config, step)
            losses = {"loss_classifier": torch.nn.functional.cross_entropy(model(images), classes)}
        else:
            images, targets = batch(config, step)
            losses = model(images, targets)
        loss = sum(losses.values())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()
        if step % 100 == 99 and step + 1 < config.iterations:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                        "rng": torch.get_rng_state()}, partial)
        if step % log_every == 0 or step == config.iterations - 1:
            parts = " ".join(f"{k[5:]}={v.item():.3f}" for k, v in losses.items())
            print(f"step {step} {time.time() - start:.0f}s loss={loss.item():.3f} {parts}", flush=True)
    recalibrate_batchnorm(model, config)
    partial.unlink(missing_ok=True)
    return model.eval()


def evaluate(model, config: reference.TrainConfig, count: int) -> dict:
    from tvm_roialign.datasets.evaluation import coco_scores, torch_predict

    if config.model in reference.CLASSIFIERS:
        images, classes = synthetic.classification_batch(config.data, "val", range(count))
        predicted = model(torch.from_numpy(images)).argmax(1).numpy()
        return {"top1": float(np.mean(predicted == classes))}

    dets = [torch_predict(model, synthetic.sample(config.data, "val", i)[0]) for i in range(count)]
    return coco_scores(dets, config.data, "val", keypoints=config.model == "keypointrcnn")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=(*reference.MODELS, *reference.CLASSIFIERS), default="maskrcnn")
    known, _ = p.parse_known_args(argv)
    defaults = reference.TrainConfig.defaults(known.model)
    p.add_argument("--iterations", type=int, default=defaults.iterations)
    p.add_argument("--batch", type=int, default=defaults.batch)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--size", type=int, default=defaults.data.size)
    p.add_argument("--eval", type=int, default=50, help="held-out images evaluated at the end (0: none)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--force", action="store_true", help="train even when the weights are cached")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = dataclasses.replace(
        defaults, model=args.model, iterations=args.iterations, batch=args.batch, lr=args.lr,
        data=dataclasses.replace(defaults.data, size=args.size),
    )
    path = reference.weights_path(config)
    print(f"training {config} -> {path}", flush=True)
    if path.exists() and not args.force:
        print(f"{path} exists (--force to train again)")
        model = reference.load_reference(config)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        model = train(config, path)
        torch.save(model.state_dict(), path)
        print(f"wrote {path}", flush=True)
    if args.eval:
        with torch.no_grad():
            print(evaluate(model, config, args.eval), flush=True)
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
