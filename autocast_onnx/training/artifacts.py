"""Converting an onnxruntime-training artifacts folder (what
`onnxruntime.training.artifacts.generate_artifacts` writes) as one unit:

  training_model.onnx   converted: fp16 compute, fp32 master weights, loss scaling
  eval_model.onnx       converted like an inference graph (its loss stays fp32)
  optimizer_model.onnx  copied unchanged: the optimizer works on the fp32 parameters and moments
  checkpoint            copied unchanged: the parameters stay fp32, with the same names
  anything else         copied unchanged

and a manifest (autocast-manifest.json) of what changed. The output folder appears whole or not
at all: everything is written into a temporary folder beside it, then renamed into place.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AutocastError

TRAINING_MODEL = "training_model.onnx"
EVAL_MODEL = "eval_model.onnx"
MANIFEST = "autocast-manifest.json"


def is_artifacts_dir(path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / TRAINING_MODEL).is_file()


@dataclass
class ArtifactsResult:
    out_dir: Path
    results: dict = field(default_factory=dict)  # file name -> ConversionResult
    copied: list = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def default_output_dir(in_dir: Path, precision: str) -> Path:
    return in_dir.with_name(f"{in_dir.name}.{precision}")


def _check_out_dir(in_dir: Path, out_dir: Path) -> bool:
    """Refuse an output folder that would overwrite the input or someone else's files; returns
    whether it holds an earlier output of this command (then it is replaced)."""
    if out_dir.resolve() == in_dir.resolve() or in_dir.resolve() in out_dir.resolve().parents:
        raise AutocastError(
            "the output folder is the artifacts folder or inside it",
            str(out_dir),
            "choose an -o folder outside the input; autocast-onnx never modifies its input",
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise AutocastError("exists and is not a folder", str(out_dir), "choose a new -o folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if (out_dir / MANIFEST).is_file():
            return True
        raise AutocastError(
            "the output folder exists and holds files autocast-onnx did not write (no autocast-manifest.json)",
            str(out_dir),
            "choose a new or empty -o folder",
        )
    if not out_dir.parent.is_dir():
        raise AutocastError("the folder it would be created in does not exist", str(out_dir), "create it first")
    return False


def convert_artifacts(in_dir, out_dir=None, *, check: str = "basic", loss_scale=None, **options) -> ArtifactsResult:
    """Convert an artifacts folder into `out_dir` (default: IN_DIR.<precision> beside it). The
    options are those of pipeline.convert (precision, rules, exclude_ops, ...); `loss_scale`
    applies to training_model.onnx."""
    from ..pipeline import convert_file

    in_dir = Path(in_dir)
    for name in ("plan", "plan_out", "calibration", "force_fp32"):
        if options.get(name) is not None:
            raise AutocastError(
                f"{name} is not supported for an artifacts folder",
                str(in_dir),
                "convert training_model.onnx on its own to use it",
            )
    precision = options.get("precision") or "fp16"
    out_dir = Path(out_dir) if out_dir is not None else default_output_dir(in_dir, precision)

    def convert_one(source: Path, target: Path) -> dict:
        extra = {"loss_scale": loss_scale} if source.name == TRAINING_MODEL else {}
        converted = convert_file(source, target, check=check, **options, **extra)
        result.results[source.name] = converted
        return _converted_entry(converted)

    result = ArtifactsResult(out_dir=out_dir)

    def head(results) -> dict:
        scaling = results[TRAINING_MODEL].loss_scaling
        return {
            "precision": precision,
            "loss_scale": scaling.to_dict() if scaling else {"mode": "none"},
            "master_weights": "fp32 (parameters stay fp32 graph inputs; checkpoint and optimizer unchanged)",
        }

    process_folder(in_dir, out_dir, convert_one, result, head)
    return result


def process_folder(in_dir: Path, out_dir: Path, handle, result: ArtifactsResult, head) -> None:
    """Write `out_dir` from the artifacts folder `in_dir`: `handle(source, target)` writes each
    of the two models and returns its manifest entry; every other file is copied. All or
    nothing: staged in a temporary folder beside `out_dir`, renamed into place at the end."""
    from .. import __version__

    in_dir = Path(in_dir)
    if not is_artifacts_dir(in_dir):
        raise AutocastError(
            f"not an onnxruntime-training artifacts folder (no {TRAINING_MODEL})",
            str(in_dir),
            "pass the folder generate_artifacts wrote, or a model file",
        )
    replace = _check_out_dir(in_dir, out_dir)
    files: dict[str, dict] = {}
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for entry in sorted(in_dir.iterdir()):
            target = staging / entry.name
            if entry.name in (TRAINING_MODEL, EVAL_MODEL):
                files[entry.name] = handle(entry, target)
            elif entry.name == MANIFEST:
                continue
            else:
                (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, target)
                result.copied.append(entry.name)
                files[entry.name] = {"action": "copied unchanged"}
        result.manifest = {
            "tool": f"autocast-onnx {__version__}",
            "source": str(in_dir),
            **head(result.results),
            "files": files,
        }
        (staging / MANIFEST).write_text(json.dumps(result.manifest, indent=1) + "\n", encoding="utf-8")
        if replace:
            shutil.rmtree(out_dir)
        elif out_dir.is_dir():
            out_dir.rmdir()  # empty
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _converted_entry(result) -> dict:
    counts = result.plan.counts()
    entry = {
        "action": "converted",
        "nodes": len(result.plan.precisions),
        "precision": {k: v for k, v in counts.items() if v},
        "casts_added": result.stats.casts_added,
    }
    if result.plan.training is not None:
        entry["training"] = result.plan.training
    return entry
