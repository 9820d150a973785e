"""Shared pytest setup: tests import their helper modules (helpers, case_helpers, ...) by plain
name, and the conversion tests are parametrized over the target precision and keep_io_types
through the `precision` and `keep_io` fixtures below (a test that needs other values, e.g. a
precision paired with an opset, parametrizes `precision` directly, which overrides the fixture)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRECISIONS = ["fp16", "bf16"]
KEEP_IO = [True, False]


@pytest.fixture(params=PRECISIONS)
def precision(request):
    """The target precision of a conversion: "fp16" or "bf16"."""
    return request.param


@pytest.fixture(params=KEEP_IO, ids=["keep_io", "low_io"])
def keep_io(request):
    """keep_io_types: True keeps fp32 graph inputs/outputs (casts at the edges), False lets them
    take the low precision."""
    return request.param


def pytest_collection_modifyitems(config, items):
    """Tests marked `training` need onnxruntime-training, which cannot share an environment with
    the plain onnxruntime wheel: skipped here with that reason, run for real by .ci/run in
    .venv-training (`pytest -m training tests/training/test_training_runtime.py`)."""
    from autocast_onnx.validate.training import has_training_runtime

    if has_training_runtime():
        return
    skip = pytest.mark.skip(
        reason="needs onnxruntime-training (its own environment); .ci/run runs these in .venv-training"
    )
    for item in items:
        if item.get_closest_marker("training") is not None:  # the marker, not tests/training/ (a keyword too)
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _stand_in_agrees_with_the_whole_model(monkeypatch):
    """The output check of a model written in one piece reads a stand-in (fast/splice.py: the
    same bytes with the held weights as graph inputs) instead of the whole bytes. Every
    conversion the suite makes in this process checks both and asserts the two verdicts agree:
    the stand-in's correctness argument, held on every model the suite converts."""
    from stand_in_helpers import checked_both_ways

    from autocast_onnx import pipeline

    real = pipeline.check_with_stand_in

    def both(check, whole, stand_in):
        if stand_in is not None:
            checked_both_ways(check, whole, stand_in)
        return real(check, whole, stand_in)

    monkeypatch.setattr(pipeline, "check_with_stand_in", both)
