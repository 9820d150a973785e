"""Mixed-precision training experiment: does a training graph converted by autocast-onnx train as
well as the fp32 original?

For each onnxruntime-training artifacts folder in tests/data/training (mlp, cnn, ln_gelu) the
script trains two models on the digits data (examples/data), from the same checkpoint, with the
same seed, data order, epochs and batch size:

  fp32   the original folder, a plain loop (forward/backward, optimizer step, reset gradients);
  mixed  the folder converted to fp16 by convert_artifacts, trained through its emulation
         (emulate_file), with TrainingStep and the default DynamicLossScaler.

The emulation is needed because ONNX Runtime's CPU provider removes the fp16 casts of a training
graph: the converted model itself would train bit-identically to fp32 on CPU. The emulation is
an fp32 model that rounds every fp16 tensor (range, precision, subnormals) as a GPU would, so
the mixed runs see fp16's rounding, overflow and underflow.

It also records:
  - the loss-scale dynamics of one extra mixed mlp run with growth_interval=50, so the scale
    grows until the gradients overflow, the step is skipped and the scale backs off;
  - gradient underflow of the mlp (validate_training_step on the first 256 training samples) as a
    function of the loss scale, at the fp32 run's trained weights and at the initial weights.

Outputs (in --out, default docs/training): results.json, loss_<model>.svg, loss_scale.svg,
underflow.svg; and the region between `<!-- results:start -->` and `<!-- results:end -->` of
docs/training.md (--doc) is rewritten with the tables and plots. Exit status 1 when a model's
mixed test accuracy is more than 0.5 percentage points below its fp32 accuracy.

Run it with onnxruntime-training installed (its own virtual environment, see
examples/training/README.md):

    .venv-training/bin/python examples/training/experiment.py [--epochs 20] [--seed 0]

`train()` runs one training run and can be imported on its own (the module runs nothing on
import and imports onnxruntime only inside functions).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = ROOT / "tests" / "data" / "training"
DATA_DIR = ROOT / "examples" / "data"
MODELS = ("mlp", "cnn", "ln_gelu")
FLAT_INPUT = {"mlp": True, "cnn": False, "ln_gelu": True}  # mlp and ln_gelu take [N, 64], the cnn [N, 1, 8, 8]
UNDERFLOW_SCALES = [2.0**k for k in (-12, -8, -4, 0, 4, 8, 12, 16, 20, 24)]
UNDERFLOW_SAMPLES = 256
UNDERFLOW_PARAMETER = "fc1.weight"
GROWTH_INTERVAL = 50
MAX_ACCURACY_DROP_PP = 0.5
START, END = "<!-- results:start -->", "<!-- results:end -->"


# --------------------------------------------------------------------------------------------
# training


def _quiet_ort():
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    return onnxruntime


def _open(folder: Path):
    """A fresh CheckpointState (the initial weights), Module and Optimizer of an artifacts folder."""
    _quiet_ort()
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint(str(folder / "checkpoint"))
    module = Module(str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"))
    return state, module, Optimizer(str(folder / "optimizer_model.onnx"), module)


def train(folder, x, y, x_test, y_test, *, mixed, epochs, seed, batch=32, scaler=None) -> dict:
    """Train the artifacts folder `folder` from its checkpoint for `epochs` epochs of full batches
    of `batch` samples (a new permutation each epoch, from np.random.default_rng(seed)), then
    evaluate its eval model on the whole test set. `mixed`: the folder is an emulated conversion
    (loss_scale input, all_finite output), trained with TrainingStep and `scaler` (default: a
    DynamicLossScaler()). Returns per-step losses (and, mixed, the scale used and whether the step
    was skipped), test accuracy and loss, the final loss (mean training loss of the last epoch),
    steps, skipped steps, final loss scale, wall time, and the trained `parameters` (name -> array)."""
    from autocast_onnx.training import DynamicLossScaler, TrainingStep

    folder = Path(folder)
    state, module, optimizer = _open(folder)
    if mixed:
        scaler = scaler if scaler is not None else DynamicLossScaler()
        step = TrainingStep(module, optimizer, scaler)
    rng = np.random.default_rng(seed)
    per_epoch = len(x) // batch
    losses: list[float] = []
    scales: list[float] = []
    skipped: list[bool] = []
    start = time.perf_counter()
    module.train()
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(per_epoch):
            index = order[i * batch : (i + 1) * batch]
            xb, yb = x[index], y[index]
            if mixed:
                result = step(xb, yb)
                losses.append(result.loss)
                scales.append(float(result.scale))
                skipped.append(result.skipped)
            else:
                loss, _ = module(xb, yb)
                optimizer.step()
                module.lazy_reset_grad()
                losses.append(float(np.asarray(loss).reshape(-1)[0]))
    module.eval()
    test_loss, logits = module(x_test, y_test)
    wall = time.perf_counter() - start
    accuracy = float((np.asarray(logits).argmax(axis=1) == y_test).mean())
    last = [v for v in losses[-per_epoch:] if math.isfinite(v)]
    return {
        "folder": str(folder),
        "mixed": bool(mixed),
        "epochs": epochs,
        "seed": seed,
        "batch": batch,
        "steps": len(losses),
        "skipped_steps": int(sum(skipped)),
        "final_loss_scale": float(scaler.scale) if mixed else None,
        "test_accuracy": accuracy,
        "test_loss": float(np.asarray(test_loss).reshape(-1)[0]),
        "final_loss": float(np.mean(last)) if last else float("nan"),
        "wall_s": wall,
        "losses": losses,
        "scales": scales if mixed else None,
        "skipped": [i for i, s in enumerate(skipped) if s] if mixed else None,
        "parameters": {name: np.array(p.data) for name, p in state.parameters},
    }


def load_data(model: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    with np.load(DATA_DIR / "digits_train.npz") as train_set, np.load(DATA_DIR / "digits_test.npz") as test_set:
        x, y, x_test, y_test = train_set["x"], train_set["y"], test_set["x"], test_set["y"]
    if FLAT_INPUT[model]:
        x, x_test = x.reshape(len(x), -1), x_test.reshape(len(x_test), -1)
    return np.ascontiguousarray(x), y, np.ascontiguousarray(x_test), y_test


def underflow_sweep(reference: Path, converted: Path, x: np.ndarray, y: np.ndarray, parameters: dict) -> list[dict]:
    """Gradient underflow of one training step (emulated fp16) against fp32, per loss scale."""
    from autocast_onnx.validate.training import validate_training_step

    rows = []
    for scale in UNDERFLOW_SCALES:
        report = validate_training_step(
            reference,
            converted,
            inputs={"input": x, "labels": y},
            parameters=parameters,
            loss_scale=scale,
        )
        grads = report["gradients"]
        rows.append(
            {
                "loss_scale": scale,
                "fc1_weight_underflow": grads[UNDERFLOW_PARAMETER]["underflow"],
                "mean_underflow": float(np.mean([g["underflow"] for g in grads.values()])),
                "all_finite": report["all_finite"],
                "nonfinite": int(sum(g["nonfinite"] for g in grads.values())),
                "min_cosine": min((g["cosine"] for g in grads.values() if g["cosine"] is not None), default=None),
                "gradients": grads,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# SVG plots (hand-written: no plotting library in the training environment)

COLORS = {"fp32": "#1f77b4", "mixed": "#ff7f0e", "fp32_light": "#9ecae1", "mixed_light": "#fdd0a2", "bad": "#d62728"}


def _nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg_plot(
    series,
    *,
    title,
    xlabel,
    ylabel,
    xlog2=False,
    ylog2=False,
    markers=(),
    ylim=None,
    legend="upper right",
    width=640,
    height=360,
) -> str:
    """A line plot. `series`: dicts with label, xs, ys, color and optional dash, width, step (draw
    as a step function), legend (False: no legend entry); `markers`: dicts with label, xs, ys,
    color (drawn as crosses); `legend`: "upper right" or "lower right". Log axes are base 2,
    labelled 2^k."""
    left, right, top, bottom = 62, 16, 30, 46
    pw, ph = width - left - right, height - top - bottom

    def tx(v):
        return math.log2(v) if xlog2 else v

    def ty(v):
        return math.log2(v) if ylog2 else v

    def finite_points(xs, ys):
        for a, b in zip(xs, ys):
            if a is not None and b is not None and math.isfinite(a) and math.isfinite(b):
                if (xlog2 and a <= 0) or (ylog2 and b <= 0):
                    continue
                yield tx(a), ty(b)

    points = [p for s in list(series) + list(markers) for p in finite_points(s["xs"], s["ys"])]
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = (min(p[1] for p in points), max(p[1] for p in points)) if ylim is None else (ty(ylim[0]), ty(ylim[1]))
    if xlog2:
        x0, x1 = math.floor(x0) - 0.5, math.ceil(x1) + 0.5
    if ylog2:
        y0, y1 = math.floor(y0) - 1, math.ceil(y1) + 1
    elif ylim is None:
        pad = (y1 - y0) * 0.05 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1

    def px(v):
        return left + (v - x0) / (x1 - x0) * pw

    def py(v):
        return top + ph - (v - y0) / (y1 - y0) * ph

    def log_ticks(lo, hi):
        step = next(s for s in (1, 2, 4, 8, 16) if (hi - lo) / s <= 8)
        return [k for k in range(math.ceil(lo), math.floor(hi) + 1) if k % step == 0]

    def pow2(k):
        return f'2<tspan dy="-6" font-size="9">{k}</tspan>'

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{_esc(title)}</text>',
    ]
    xticks = log_ticks(x0, x1) if xlog2 else [t for t in _nice_ticks(x0, x1) if x0 <= t <= x1]
    yticks = log_ticks(y0, y1) if ylog2 else [t for t in _nice_ticks(y0, y1) if y0 <= t <= y1]
    for t in xticks:
        x = px(t)
        label = pow2(t) if xlog2 else _fmt(t)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#e5e5e5"/>')
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 17}" text-anchor="middle">{label}</text>')
    for t in yticks:
        y = py(t)
        label = pow2(t) if ylog2 else _fmt(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="black"/>')
        out.append(f'<text x="{left - 7}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">{_esc(xlabel)}</text>')
    out.append(
        f'<text x="14" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 14 {top + ph / 2})">'
        f"{_esc(ylabel)}</text>"
    )
    out.append(f'<clipPath id="plot"><rect x="{left}" y="{top}" width="{pw}" height="{ph}"/></clipPath>')
    out.append('<g clip-path="url(#plot)">')
    for s in series:
        pts = list(finite_points(s["xs"], s["ys"]))
        if s.get("step"):
            pts = [q for a, b in zip(pts, pts[1:] + pts[-1:]) for q in ((a[0], a[1]), (b[0], a[1]))]
        coords = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts)
        dash = f' stroke-dasharray="{s["dash"]}"' if s.get("dash") else ""
        out.append(
            f'<polyline points="{coords}" fill="none" stroke="{s["color"]}" stroke-width="{s.get("width", 1.5)}"'
            f'{dash} stroke-opacity="{s.get("opacity", 1)}" stroke-linejoin="round"/>'
        )
    out.append("</g>")
    for m in markers:
        for a, b in finite_points(m["xs"], m["ys"]):
            x, y = px(a), py(b)
            out.append(
                f'<path d="M{x - 4:.1f},{y - 4:.1f}L{x + 4:.1f},{y + 4:.1f}M{x - 4:.1f},{y + 4:.1f}L{x + 4:.1f},'
                f'{y - 4:.1f}" stroke="{m["color"]}" stroke-width="2"/>'
            )
    entries = [s for s in series if s.get("legend", True)] + [m for m in markers if m["xs"]]
    if entries:
        lw = 24 + max(len(e["label"]) for e in entries) * 6.2
        lh = len(entries) * 16 + 6
        lx, ly = left + pw - lw - 8, (top + 8 if legend == "upper right" else top + ph - lh - 8)
        out.append(
            f'<rect x="{lx:.1f}" y="{ly}" width="{lw:.1f}" height="{lh}" fill="white" '
            'fill-opacity="0.9" stroke="#999"/>'
        )
        for i, e in enumerate(entries):
            y = ly + 14 + i * 16
            if e in markers:
                out.append(
                    f'<path d="M{lx + 8},{y - 8}L{lx + 16},{y}M{lx + 8},{y}L{lx + 16},{y - 8}" stroke="{e["color"]}" '
                    'stroke-width="2"/>'
                )
            else:
                dash = f' stroke-dasharray="{e["dash"]}"' if e.get("dash") else ""
                out.append(
                    f'<line x1="{lx + 5}" y1="{y - 4}" x2="{lx + 19}" y2="{y - 4}" stroke="{e["color"]}" '
                    f'stroke-width="{max(e.get("width", 1.5), 2)}"{dash}/>'
                )
            out.append(f'<text x="{lx + 24}" y="{y}">{_esc(e["label"])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _epoch_means(losses: list[float], per_epoch: int) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for e in range(len(losses) // per_epoch):
        chunk = [v for v in losses[e * per_epoch : (e + 1) * per_epoch] if math.isfinite(v)]
        xs.append((e + 1) * per_epoch - 1)
        ys.append(float(np.mean(chunk)) if chunk else float("nan"))
    return xs, ys


def loss_plot(model: str, fp32: dict, mixed: dict) -> str:
    per_epoch = fp32["steps"] // fp32["epochs"]
    steps = list(range(fp32["steps"]))
    series = [
        {
            "label": "fp32, per step",
            "xs": steps,
            "ys": fp32["losses"],
            "color": COLORS["fp32_light"],
            "width": 1,
            "opacity": 0.8,
        },
        {
            "label": "mixed, per step",
            "xs": steps,
            "ys": mixed["losses"],
            "color": COLORS["mixed_light"],
            "width": 1,
            "opacity": 0.8,
        },
    ]
    for name, run in (("fp32", fp32), ("mixed", mixed)):
        xs, ys = _epoch_means(run["losses"], per_epoch)
        dash = "6 4" if name == "mixed" else None
        series.append(
            {"label": f"{name}, epoch mean", "xs": xs, "ys": ys, "color": COLORS[name], "width": 2.2, "dash": dash}
        )
    skipped = mixed["skipped"] or []
    markers = [
        {
            "label": "mixed: skipped step",
            "xs": skipped,
            "ys": [mixed["losses"][i] for i in skipped],
            "color": COLORS["bad"],
        }
    ]
    top = max(v for v in fp32["losses"] + mixed["losses"] if math.isfinite(v))
    return svg_plot(
        series,
        markers=markers,
        title=f"{model}: training loss, fp32 vs mixed precision (emulated fp16)",
        xlabel="step",
        ylabel="training loss (cross-entropy)",
        ylim=(0.0, top * 1.05),
    )


def loss_scale_plot(dynamics: dict, default_run: dict) -> str:
    steps = list(range(len(dynamics["scales"])))
    series = [
        {
            "label": f"growth_interval={GROWTH_INTERVAL}",
            "xs": steps,
            "ys": dynamics["scales"],
            "color": COLORS["mixed"],
            "step": True,
            "width": 2,
        },
        {
            "label": "default (growth_interval=2000)",
            "xs": list(range(len(default_run["scales"]))),
            "ys": default_run["scales"],
            "color": "#7f7f7f",
            "dash": "5 4",
            "step": True,
        },
    ]
    skipped = dynamics["skipped"]
    markers = [
        {
            "label": "skipped step (overflow)",
            "xs": skipped,
            "ys": [dynamics["scales"][i] for i in skipped],
            "color": COLORS["bad"],
        }
    ]
    return svg_plot(
        series,
        markers=markers,
        title="mlp: dynamic loss scale per step (emulated fp16)",
        xlabel="step",
        ylabel="loss scale used",
        ylog2=True,
        legend="lower right",
    )


def underflow_plot(trained: list[dict], initial: list[dict]) -> str:
    def pct(rows, key):
        return [r[key] * 100 for r in rows]

    scales = [r["loss_scale"] for r in trained]
    series = [
        {
            "label": f"{UNDERFLOW_PARAMETER}, trained weights",
            "xs": scales,
            "ys": pct(trained, "fc1_weight_underflow"),
            "color": COLORS["fp32"],
            "width": 2,
        },
        {
            "label": f"{UNDERFLOW_PARAMETER}, initial weights",
            "xs": scales,
            "ys": pct(initial, "fc1_weight_underflow"),
            "color": COLORS["mixed"],
            "width": 2,
        },
        {
            "label": "all parameters (mean), trained",
            "xs": scales,
            "ys": pct(trained, "mean_underflow"),
            "color": COLORS["fp32"],
            "dash": "5 4",
        },
        {
            "label": "all parameters (mean), initial",
            "xs": scales,
            "ys": pct(initial, "mean_underflow"),
            "color": COLORS["mixed"],
            "dash": "5 4",
        },
    ]
    bad = [
        (r["loss_scale"], r["fc1_weight_underflow"] * 100)
        for rows in (trained, initial)
        for r in rows
        if r["all_finite"] is False
    ]
    markers = [
        {
            "label": "all_finite False (overflow)",
            "xs": [b[0] for b in bad],
            "ys": [b[1] for b in bad],
            "color": COLORS["bad"],
        }
    ]
    top = max(max(s["ys"]) for s in series)
    return svg_plot(
        series,
        markers=markers,
        title=f"mlp: gradient underflow in fp16 vs loss scale ({UNDERFLOW_SAMPLES} samples)",
        xlabel="loss scale",
        ylabel="gradient entries flushed to zero (%)",
        xlog2=True,
        ylim=(0.0, max(top * 1.25, 0.1)),
    )


# --------------------------------------------------------------------------------------------
# report


def _scale_text(scale: float | None) -> str:
    if scale is None:
        return "-"
    k = math.log2(scale)
    return f"2^{int(k)}" if k.is_integer() else f"{scale:g}"


def main_table(summary: list[dict]) -> str:
    lines = [
        "| model | fp32 test acc | mixed test acc | difference (pp) | fp32 final loss | mixed final loss | steps "
        "| skipped steps | final loss scale |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in summary:
        lines.append(
            f"| {row['model']} | {row['fp32_test_accuracy'] * 100:.2f}% | {row['mixed_test_accuracy'] * 100:.2f}% "
            f"| {row['difference_pp']:+.2f} | {row['fp32_final_loss']:.4f} | {row['mixed_final_loss']:.4f} "
            f"| {row['steps']} | {row['skipped_steps']} | {_scale_text(row['final_loss_scale'])} |"
        )
    return "\n".join(lines)


def underflow_table(rows: list[dict]) -> str:
    lines = [
        f"| loss scale | {UNDERFLOW_PARAMETER} underflow | mean underflow (all parameters) | all_finite |",
        "| ---: | ---: | ---: | :---: |",
    ]
    for r in rows:
        lines.append(
            f"| {_scale_text(r['loss_scale'])} | {r['fc1_weight_underflow'] * 100:.2f}% "
            f"| {r['mean_underflow'] * 100:.2f}% | {r['all_finite']} |"
        )
    return "\n".join(lines)


def results_markdown(results: dict, out_dir: Path, doc: Path) -> str:
    rel = Path(os.path.relpath(out_dir, doc.parent)).as_posix()
    s = results["settings"]
    dyn = results["loss_scale_dynamics"]
    command = "python examples/training/experiment.py" + "".join(
        f" --{k} {v}" for k, v in (("epochs", s["epochs"]), ("seed", s["seed"]))
    )
    images = " ".join(f"![{m} training loss]({rel}/loss_{m}.svg)" for m in MODELS)
    return "\n".join(
        [
            "",
            f"Made by `{command}` (onnxruntime-training {s['onnxruntime']}, CPU; mixed precision = the "
            f"converted folder's emulation). Settings: {s['epochs']} epochs, seed {s['seed']}, batch {s['batch']}, "
            f"{s['train_samples']} training and {s['test_samples']} test samples (digits), "
            f"{s['steps_per_epoch']} steps per epoch; total run time {results['wall_s']:.0f} s. "
            f"Acceptance: mixed test accuracy at most {MAX_ACCURACY_DROP_PP} pp below fp32 "
            f"({'met' if results['passed'] else 'NOT met'}).",
            "",
            main_table(results["summary"]),
            "",
            images,
            "",
            f"Loss-scale dynamics (mlp, growth_interval={GROWTH_INTERVAL}): {dyn['skipped_steps']} skipped steps "
            f"of {dyn['steps']}, final scale {_scale_text(dyn['final_loss_scale'])}, largest scale reached "
            f"{_scale_text(max(dyn['scales']))}, test accuracy {dyn['test_accuracy'] * 100:.2f}%.",
            "",
            f"![loss scale per step]({rel}/loss_scale.svg)",
            "",
            f"Gradient underflow of one mlp training step ({UNDERFLOW_SAMPLES} training samples, trained fp32 "
            f"weights): the share of nonzero fp32 gradient entries that are zero in the emulated fp16 step.",
            "",
            underflow_table(results["underflow"]["trained"]),
            "",
            f"![gradient underflow vs loss scale]({rel}/underflow.svg)",
            "",
        ]
    )


def rewrite_region(doc: Path, body: str) -> None:
    text = doc.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc}: no {START} ... {END} region to rewrite")
    doc.write_text(pattern.sub(lambda _: START + "\n" + body.strip("\n") + "\n" + END, text, count=1))


def _json_safe(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value


def _public(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "parameters"}


# --------------------------------------------------------------------------------------------


def run_experiment(epochs: int, seed: int, batch: int, work: Path) -> dict:
    from autocast_onnx.training import DynamicLossScaler, convert_artifacts
    from autocast_onnx.validate.emulate import emulate_file

    ort = _quiet_ort()
    started = time.perf_counter()
    results: dict = {"runs": {}, "summary": []}
    for model in MODELS:
        convert_artifacts(MODELS_DIR / model, work / f"{model}.fp16")
        emulate_file(work / f"{model}.fp16", work / f"{model}.emu")

    trained_mlp = None
    for model in MODELS:
        x, y, x_test, y_test = load_data(model)
        fp32 = train(MODELS_DIR / model, x, y, x_test, y_test, mixed=False, epochs=epochs, seed=seed, batch=batch)
        mixed = train(work / f"{model}.emu", x, y, x_test, y_test, mixed=True, epochs=epochs, seed=seed, batch=batch)
        if model == "mlp":
            trained_mlp = fp32["parameters"]
        results["runs"][model] = {"fp32": _public(fp32), "mixed": _public(mixed)}
        row = {
            "model": model,
            "fp32_test_accuracy": fp32["test_accuracy"],
            "mixed_test_accuracy": mixed["test_accuracy"],
            "difference_pp": (mixed["test_accuracy"] - fp32["test_accuracy"]) * 100,
            "fp32_final_loss": fp32["final_loss"],
            "mixed_final_loss": mixed["final_loss"],
            "steps": mixed["steps"],
            "skipped_steps": mixed["skipped_steps"],
            "final_loss_scale": mixed["final_loss_scale"],
            "fp32_wall_s": fp32["wall_s"],
            "mixed_wall_s": mixed["wall_s"],
        }
        results["summary"].append(row)
        print(
            f"{model}: fp32 {fp32['test_accuracy'] * 100:.2f}% ({fp32['wall_s']:.1f} s), "
            f"mixed {mixed['test_accuracy'] * 100:.2f}% ({mixed['wall_s']:.1f} s), "
            f"{mixed['skipped_steps']} skipped",
            file=sys.stderr,
        )

    x, y, x_test, y_test = load_data("mlp")
    dynamics = train(
        work / "mlp.emu",
        x,
        y,
        x_test,
        y_test,
        mixed=True,
        epochs=epochs,
        seed=seed,
        batch=batch,
        scaler=DynamicLossScaler(growth_interval=GROWTH_INTERVAL),
    )
    results["loss_scale_dynamics"] = {"growth_interval": GROWTH_INTERVAL, **_public(dynamics)}

    from onnxruntime.training.api import CheckpointState

    state = CheckpointState.load_checkpoint(str(MODELS_DIR / "mlp" / "checkpoint"))
    initial = {name: np.array(p.data) for name, p in state.parameters}
    ref, conv = MODELS_DIR / "mlp" / "training_model.onnx", work / "mlp.fp16" / "training_model.onnx"
    xs, ys = x[:UNDERFLOW_SAMPLES], y[:UNDERFLOW_SAMPLES]
    results["underflow"] = {
        "parameter": UNDERFLOW_PARAMETER,
        "samples": UNDERFLOW_SAMPLES,
        "trained": underflow_sweep(ref, conv, xs, ys, trained_mlp),
        "initial": underflow_sweep(ref, conv, xs, ys, initial),
    }
    results["settings"] = {
        "epochs": epochs,
        "seed": seed,
        "batch": batch,
        "train_samples": len(x),
        "test_samples": len(x_test),
        "steps_per_epoch": len(x) // batch,
        "onnxruntime": ort.__version__,
        "max_accuracy_drop_pp": MAX_ACCURACY_DROP_PP,
    }
    results["passed"] = all(r["difference_pp"] >= -MAX_ACCURACY_DROP_PP for r in results["summary"])
    results["wall_s"] = time.perf_counter() - started
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "training", help="folder for results.json and plots"
    )
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "training.md", help="markdown file to update")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="autocast-training-") as tmp:
        results = run_experiment(args.epochs, args.seed, args.batch, Path(tmp))

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(_json_safe(results), indent=1) + "\n")
    for model in MODELS:
        runs = results["runs"][model]
        (out / f"loss_{model}.svg").write_text(loss_plot(model, runs["fp32"], runs["mixed"]))
    (out / "loss_scale.svg").write_text(
        loss_scale_plot(results["loss_scale_dynamics"], results["runs"]["mlp"]["mixed"])
    )
    (out / "underflow.svg").write_text(underflow_plot(results["underflow"]["trained"], results["underflow"]["initial"]))
    rewrite_region(args.doc, results_markdown(results, out, args.doc))

    print(main_table(results["summary"]))
    print(f"\ntotal {results['wall_s']:.1f} s; acceptance (mixed >= fp32 - {MAX_ACCURACY_DROP_PP} pp): "
          f"{'PASS' if results['passed'] else 'FAIL'}")  # fmt: skip
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
