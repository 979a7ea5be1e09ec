"""Train the reference detector on the synthetic dataset (tvm_roialign.datasets): torchvision's
maskrcnn_resnet50_fpn (or keypointrcnn_resnet50_fpn), every weight from scratch, a fixed number
of iterations (not wall time), seeds fixed, 2 threads. The weights go to
~/.cache/tvm-roialign/reference/ named by a hash of the data and the schedule
(tvm_roialign.datasets.reference.weights_path); an existing file is kept. Never run by CI.

    nice -n 5 python tools/train_reference.py --model maskrcnn [--iterations N] [--eval 50]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
import torch

from tvm_roialign.datasets import reference, synthetic


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
    """Linear warmup, then constant: a run of N iterations is the first N of a longer one, so the
    checkpoint of step N is the weights of ``--iterations N``."""
    return config.lr * min(1.0, (step + 1) / config.warmup)


def train(config: reference.TrainConfig, log_every: int = 10, checkpoints: bool = False):
    """The model of ``config`` trained; with ``checkpoints``, its weights every 50 steps saved as
    those of a run of that many iterations (which they are: the learning rate is constant after
    the warmup), so a shorter run's weights come with a longer one."""
    torch.manual_seed(config.seed)
    model = reference.build_model(config.model, config.data.size, seed=config.seed).train()
    for name, param in model.named_parameters():
        if name.startswith(reference.FROZEN):
            param.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    start = time.time()
    for step in range(config.iterations):
        for group in opt.param_groups:
            group["lr"] = lr_at(config, step)
        images, targets = batch(config, step)
        losses = model(images, targets)
        loss = sum(losses.values())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()
        if checkpoints and step % 50 == 49 and step + 1 < config.iterations:
            # the weights of a run of step + 1 iterations (the schedule is constant after warmup)
            path = reference.weights_path(dataclasses.replace(config, iterations=step + 1))
            torch.save(model.state_dict(), path)
        if step % log_every == 0 or step == config.iterations - 1:
            parts = " ".join(f"{k[5:]}={v.item():.3f}" for k, v in losses.items())
            print(f"step {step} {time.time() - start:.0f}s loss={loss.item():.3f} {parts}", flush=True)
    return model.eval()


def evaluate(model, config: reference.TrainConfig, count: int) -> dict:
    from tvm_roialign.datasets.evaluation import coco_scores, torch_predict

    dets = [torch_predict(model, synthetic.sample(config.data, "val", i)[0]) for i in range(count)]
    return coco_scores(dets, config.data, "val", keypoints=config.model == "keypointrcnn")


def main(argv=None) -> int:
    defaults = reference.TrainConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=tuple(reference.MODELS), default="maskrcnn")
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
        model = train(config, checkpoints=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
        print(f"wrote {path}", flush=True)
    if args.eval:
        with torch.no_grad():
            print(evaluate(model, config, args.eval), flush=True)
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
