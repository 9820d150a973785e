"""Train and export a small text detector: MobileNetV3-large (width 0.5) backbone, FPN neck, a ConvTranspose
head and a sigmoid probability map (the DB text-detection layout), for the accuracy search.

The data are generated: light, noisy backgrounds with dark lines of glyph-like strokes; the target
is the text-line mask. The model trains for a few minutes on CPU and reaches a high pixel F1 on
held-out images. A trained detector is confident: its logits span hundreds where a shipped one
reaches about 175. ``--head-scale`` multiplies the last ConvTranspose (weights and bias) so the
largest logit matches that, which leaves the probability map's threshold unchanged and makes the
rounding of the deep layers show near it, as it does in a shipped model.

Needs torch (CPU build), run from the training environment:

    python tools/export_text_detector.py --out tests/data/evidence/text_detector.onnx --steps 2000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

# (kernel, expansion, out, squeeze-excite, hardswish, stride): MobileNetV3-large (Howard et al.
# 2019) at width 0.5, the backbone of the DB text detectors shipped for OCR
LARGE = [
    (3, 16, 16, False, False, 1),
    (3, 64, 24, False, False, 2),
    (3, 72, 24, False, False, 1),
    (5, 72, 40, True, False, 2),
    (5, 120, 40, True, False, 1),
    (5, 120, 40, True, False, 1),
    (3, 240, 80, False, True, 2),
    (3, 200, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 480, 112, True, True, 1),
    (3, 672, 112, True, True, 1),
    (5, 672, 160, True, True, 2),
    (5, 960, 160, True, True, 1),
    (5, 960, 160, True, True, 1),
]
WIDTH = 0.5
FEATURES = (2, 5, 11, 14)  # blocks whose outputs feed the FPN: strides 4, 8, 16, 32


def divisible(c: float, by: int = 8) -> int:
    return max(by, int(c + by / 2) // by * by)


CONFIG = [(k, divisible(e * WIDTH), divisible(o * WIDTH), se, hs, s) for k, e, o, se, hs, s in LARGE]


def conv_bn(cin, cout, k, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        mid = max(8, (c // 4 + 7) // 8 * 8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, mid, 1)
        self.fc2 = nn.Conv2d(mid, c, 1)

    def forward(self, x):
        s = torch.relu(self.fc1(self.pool(x)))
        return x * nn.functional.hardsigmoid(self.fc2(s))


class InvertedResidual(nn.Module):
    def __init__(self, cin, k, exp, cout, se, hs, stride):
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        layers = []
        if exp != cin:
            layers.append(conv_bn(cin, exp, 1, act=act))
        layers.append(conv_bn(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp))
        layers.append(conv_bn(exp, cout, 1))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class TextDetector(nn.Module):
    def __init__(self, neck=96):
        super().__init__()
        self.stem = conv_bn(3, 8, 3, 2, act=nn.Hardswish)
        blocks, cin, chans = [], 8, []
        for k, exp, cout, se, hs, stride in CONFIG:
            blocks.append(InvertedResidual(cin, k, exp, cout, se, hs, stride))
            cin = cout
            chans.append(cout)
        self.blocks = nn.ModuleList(blocks)
        self.lateral = nn.ModuleList(nn.Conv2d(chans[i], neck, 1, bias=False) for i in FEATURES)
        self.smooth = nn.ModuleList(nn.Conv2d(neck, neck // 4, 3, padding=1, bias=False) for _ in FEATURES)
        self.head = nn.Sequential(
            conv_bn(neck, neck // 4, 3, act=nn.ReLU),
            nn.ConvTranspose2d(neck // 4, neck // 4, 2, 2),
            nn.BatchNorm2d(neck // 4),
            nn.ReLU(),
            nn.ConvTranspose2d(neck // 4, 1, 2, 2),
        )

    def logits(self, x):
        x = self.stem(x)
        feats = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in FEATURES:
                feats.append(x)
        lat = [conv(f) for conv, f in zip(self.lateral, feats)]
        for i in range(len(lat) - 2, -1, -1):  # top-down
            up = nn.functional.interpolate(lat[i + 1], size=lat[i].shape[-2:], mode="nearest")
            lat[i] = lat[i] + up
        size = lat[0].shape[-2:]
        outs = [nn.functional.interpolate(s(f), size=size, mode="nearest") for s, f in zip(self.smooth, lat)]
        return self.head(torch.cat(outs, dim=1))

    def forward(self, x):
        return torch.sigmoid(self.logits(x))


def synth(n: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Images of dark glyph strokes in lines on light noisy backgrounds, and their line masks."""
    images = np.empty((n, 3, size, size), np.float32)
    masks = np.zeros((n, 1, size, size), np.float32)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for i in range(n):
        gx, gy = rng.uniform(-0.3, 0.3, 2)
        bg = 0.75 + gx * (xx - 0.5) + gy * (yy - 0.5) + rng.normal(0, 0.04, (size, size))
        img = np.repeat(bg[None], 3, 0) * rng.uniform(0.85, 1.0, (3, 1, 1))
        for _ in range(rng.integers(1, 5)):
            h = int(rng.integers(6, 15))
            w = int(rng.integers(size // 5, size * 3 // 4))
            y0 = int(rng.integers(0, size - h))
            x0 = int(rng.integers(0, size - w))
            ink = rng.uniform(0.0, 0.35, 3)[:, None, None]
            x = x0
            while x < x0 + w - 2:
                gw = int(rng.integers(3, 8))
                glyph = rng.random((h, gw)) < 0.55
                glyph[:, 0] |= rng.random(h) < 0.8
                region = img[:, y0 : y0 + h, x : x + gw]
                sel = glyph[None, :, : region.shape[2]]
                region[:] = np.where(sel, ink, region)
                x += gw + int(rng.integers(1, 3))
            masks[i, 0, y0 + 1 : y0 + h - 1, x0 + 1 : x - 1] = 1.0
        images[i] = np.clip(img, 0, 1)
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    return (images - mean) / std, masks


def f1(pred: np.ndarray, target: np.ndarray) -> float:
    p, t = pred > 0.5, target > 0.5
    tp = float((p & t).sum())
    return 2 * tp / max(1.0, float(p.sum() + t.sum()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--inputs", type=int, default=4, help="held-out images written beside the model")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-logit", type=float, default=175.0, help="largest logit after --head-scale")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model = TextDetector()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps)
    bce = nn.BCEWithLogitsLoss()
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        x, y = synth(args.batch, args.size, rng)
        logits = model.logits(torch.from_numpy(x))
        prob = torch.sigmoid(logits)
        target = torch.from_numpy(y)
        dice = 1 - (2 * (prob * target).sum() + 1) / (prob.sum() + target.sum() + 1)
        loss = bce(logits, target) + dice
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  {time.time() - t0:.0f} s", flush=True)

    model.eval()
    xt, yt = synth(32, args.size, np.random.default_rng(args.seed + 1))
    with torch.no_grad():
        logits = model.logits(torch.from_numpy(xt))
        top = float(logits.abs().max())
        scale = args.max_logit / top
        last = model.head[-1]
        last.weight.mul_(scale)
        last.bias.mul_(scale)
        prob = model(torch.from_numpy(xt)).numpy()
    print(f"held-out pixel F1 {f1(prob, yt):.4f}; largest logit {top:.1f}, head scaled by {scale:.3f}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model,
        (torch.from_numpy(xt[:1]),),
        str(args.out),
        input_names=["image"],
        output_names=["prob_map"],
        opset_version=17,
        dynamo=False,
    )
    np.savez_compressed(args.out.with_suffix(".npz"), image=xt[: args.inputs])
    meta = {
        "model": args.out.stem,
        "description": "DB-style text detector: MobileNetV3-large x0.5, FPN neck, ConvTranspose head, sigmoid "
        f"probability map; trained {args.steps} steps on generated text lines ({args.size}x{args.size})",
        "held_out_pixel_f1": round(f1(prob, yt), 4),
        "head_scale": round(scale, 4),
        "largest_logit": args.max_logit,
        "inputs": f"{args.out.with_suffix('.npz').name}: {args.inputs} held-out images (key 'image', one per batch)",
    }
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
