"""The Python API of validation (`autocast_onnx.validate(...)`): `autocast-onnx validate` as a
function with its options as keywords, returning a ValidationReport with a readable repr.
`autocast_onnx.api` re-exports it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import AutocastError
from .reports import JsonReport


@dataclass(frozen=True)
class OutputComparison:
    """One output of a validation: the statistics of the JSON report, as attributes."""

    name: str
    passed: bool
    max_abs_error: float
    relative_error: float
    mean_abs_error: float
    cosine: float
    top1: float | None
    class_scores: str | None
    new_nan: int
    new_inf: int
    failures: tuple[str, ...]
    iou: float | None = None  # a probability map's IoU of the masks at its threshold
    padded_positions: int = 0  # positions an attention mask marks as padding, not compared

    def __repr__(self) -> str:
        top1 = "" if self.top1 is None else f", top1 {self.top1:.4f}"
        iou = "" if self.iou is None else f", IoU {self.iou:.4f}"
        return (
            f"<{self.name}: {'pass' if self.passed else 'FAIL'}, max abs {self.max_abs_error:.3g}, "
            f"rel {self.relative_error:.3g}, cosine {self.cosine:.6f}{top1}{iou}>"
        )


@dataclass(frozen=True)
class ValidationReport(JsonReport):
    """What `validate` measured: `passed`, `outputs` (OutputComparison each), `warnings`, `speed`;
    also a read-only mapping over the JSON report (docs/validate-report.schema.json)."""

    @property
    def passed(self) -> bool:
        return bool(self.data["passed"])

    @property
    def outputs(self) -> list[OutputComparison]:
        return [
            OutputComparison(
                o["name"],
                o["passed"],
                o["max_abs_error"],
                o["relative_error"],
                o["mean_abs_error"],
                o["cosine"],
                o["top1"],
                o.get("class_scores"),
                o["new_nan"],
                o["new_inf"],
                tuple(o["failures"]),
                iou=o["map"]["iou"] if o.get("map") else None,
                padded_positions=o["padding"]["positions"] if o.get("padding") else 0,
            )
            for o in self.data["outputs"]
        ]

    @property
    def warnings(self) -> list[str]:
        return list(self.data.get("warnings", []))

    @property
    def speed(self) -> dict | None:
        return self.data.get("speed")

    @property
    def generation(self) -> dict | None:
        """Causal LMs: greedy-continuation agreement (see docs/validate-report.schema.json), else None."""
        return self.data.get("generation")

    def text(self) -> str:
        """The report as the CLI prints it."""
        from ..report.validation import validation_text

        return validation_text(self.data)

    def __repr__(self) -> str:
        outs = "; ".join(repr(o).strip("<>") for o in self.outputs)
        speed = self.speed
        tail = f"; speed-up {speed['speedup_p50']:.2f}x on {speed['device']}" if speed else ""
        warn = f"; {len(self.warnings)} warning(s)" if self.warnings else ""
        return f"ValidationReport({'PASS' if self.passed else 'FAIL'}: {outs}{tail}{warn})"


def validate(
    reference,
    converted,
    *,
    inputs=None,
    dims: Mapping[str, int] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    batches: int = 1,
    seed: int = 0,
    device: str = "auto",
    numerics: str = "auto",
    atol: float | Mapping[str, float] | None = None,
    rtol: float | Mapping[str, float] | None = None,
    min_cosine: float | Mapping[str, float] | None = None,
    min_top1: float | Mapping[str, float] | None = None,
    min_iou: float | Mapping[str, float] | None = None,
    map_threshold: float | Mapping[str, float] | None = None,
    compare_padded: bool = False,
    class_outputs=(),
    speed: bool | None = None,
    iterations: int = 20,
    warmup: int = 3,
    strict: bool = False,
    generate: int = 16,
    save_inputs=None,
) -> ValidationReport:
    """Compare `converted` against `reference` (paths or ModelProtos, never edited; `converted` may
    also be the ConversionResult convert gave), as `autocast-onnx validate`:
    per-output accuracy on `inputs` (an .npz or Polygraphy .json file, or a folder of either) or
    generated batches, and speed (None: timed on CUDA only; True or False forces it). For a causal
    LM, `generate` tokens of greedy continuation are compared too (0: none). `save_inputs` writes
    the generated batch to an .npz (every batch, as Polygraphy's input file, to a path ending in
    .json) first. Thresholds left None take the CLI's defaults (rtol 0.01, min_cosine 0.999,
    min_top1 0.99, min_iou 0.99, map_threshold 0.5); each takes a number for every output, a mapping {output: X}
    for some, or a list mixing numbers and "NAME=X" strings as the command line does. Positions an
    attention mask marks as padding are left out unless `compare_padded`."""
    given = dict(locals())  # the keywords as given, read by name below
    from ..io import model_argument
    from .core import validate as _validate
    from .options import GENERATING, ValidateOptions, refuse_generating_with_inputs, save_inputs_path, thresholds_from
    from .thresholds import THRESHOLDS

    reference = model_argument(reference, "reference")
    converted = model_argument(converted, "converted", result=True)
    if inputs is not None:
        import inspect

        defaults = {name: p.default for name, p in inspect.signature(validate).parameters.items()}
        refuse_generating_with_inputs([f"{n}=" for n in GENERATING if given[n] not in (defaults[n], {}, ())], "inputs=")
    if isinstance(generate, bool) or not isinstance(generate, int) or not 0 <= generate <= 1024:
        raise AutocastError(
            f"generate= must be a whole number from 0 to 1024, not {generate!r}", None, "e.g. generate=16"
        )
    limits = {name: given[name] for name in THRESHOLDS}  # the keywords named as Thresholds' fields
    thresholds = thresholds_from({}, limits, keywords=True)
    if not isinstance(compare_padded, bool):
        raise AutocastError(f"compare_padded= must be True or False, not {compare_padded!r}", None, "fix it")
    if speed is not None and not isinstance(speed, bool):
        raise AutocastError(f"speed= must be True, False or None, not {speed!r}", None, "e.g. speed=True")
    options = ValidateOptions(
        inputs=os.fspath(inputs) if inputs is not None else None,
        save_inputs=save_inputs_path(save_inputs),
        dims=dict(dims or {}),
        ranges=dict(ranges or {}),
        batches=batches,
        seed=seed,
        device=device,
        numerics=numerics,
        thresholds=thresholds,
        speed=speed,
        iterations=iterations,
        warmup=warmup,
        class_outputs=list(class_outputs),
        strict=strict,
        generate=generate,
        compare_padded=compare_padded,
    )
    return ValidationReport(_validate(reference, converted, options))
