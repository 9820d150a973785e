"""The output check's stand-in (fast/splice.py) gives the whole model's verdict.

A model written in one piece is checked on a stand-in: the same encoding with each held
converted weight made a graph input of its type and shape. The argument that its verdict is the
whole model's: the values the checker's shape inference reads are integer tensors, never
converted and so never held, and a held float weight (1k+ elements) is only ever typed and
shaped. tests/conftest.py holds that on every conversion the suite makes in process; this file
holds it on every model the repository ships, both targets and both check levels, and checks
that the comparison itself can fail."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest
import stand_in_helpers
from onnx import TensorProto, helper, numpy_helper

from autocast_onnx.fast.splice import HOLD_MIN_BYTES, HeldPayloads
from autocast_onnx.pipeline import convert_file
from autocast_onnx.rewrite.checks import check_result

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(
    p.relative_to(ROOT)
    for folder in ("examples/models", "tests/data/evidence", "tests/data/decoders")
    for p in (ROOT / folder).glob("*.onnx")
) + sorted(p.relative_to(ROOT) for p in (ROOT / "tests/data/training").glob("*/*.onnx"))


# training graphs are converted to fp16 only (their loss ops have no bf16 kernel)
CASES = [(m, p) for m in SHIPPED for p in ("fp16", "bf16") if p == "fp16" or "training" not in m.parts]


@pytest.mark.slow
@pytest.mark.parametrize("check", ["full", "basic"])
@pytest.mark.parametrize(("model", "precision"), CASES, ids=str)
def test_the_stand_in_and_the_whole_model_get_the_same_verdict(tmp_path, model, check, precision):
    before = len(stand_in_helpers.COMPARED)
    convert_file(ROOT / model, tmp_path / "out.onnx", check=check, precision=precision)
    written = (tmp_path / "out.onnx").read_bytes()
    compared = stand_in_helpers.COMPARED[before:]
    if compared:  # weights were held and spliced: the conftest fixture compared both verdicts
        [(stand_in, whole, verdict)] = compared
        assert whole == len(written) and stand_in < whole and verdict is None
    else:  # nothing held: the whole bytes were checked; only where no weight of 2 KiB was converted
        low = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
        converted = [t.name for t in onnx.load_from_string(written).graph.initializer
                     if t.data_type in low and len(t.raw_data) >= HOLD_MIN_BYTES]  # fmt: skip
        assert not converted, f"{model}: converted weights {converted[:3]} were not held for the splice"


@pytest.mark.slow
def test_every_shipped_inference_model_is_checked_through_a_stand_in(tmp_path):
    """Their weights are converted and held at fp16, so the comparison above is never vacuous
    for them (the training folders' models hold their weights in checkpoints, apart)."""
    for model in (m for m in SHIPPED if "training" not in m.parts):
        before = len(stand_in_helpers.COMPARED)
        convert_file(ROOT / model, tmp_path / f"{model.stem}.onnx", check="basic")
        assert len(stand_in_helpers.COMPARED) == before + 1, f"{model} was not checked through a stand-in"


def test_a_disagreement_is_caught():
    """The comparison fails when the stand-in passes a model whose whole bytes fail."""
    weight = numpy_helper.from_array(np.zeros((2, 1024), np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 1024])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    held = HeldPayloads()
    tensor = model.graph.initializer[0]
    assert held.put(tensor, tensor.raw_data)
    pieces, stand_in = held.serialize_with_stand_in(model)
    assert stand_in is not None
    broken = onnx.ModelProto.FromString(bytes(pieces))
    broken.graph.node[0].op_type = "NoSuchOp"
    check = functools.partial(check_result, full=False)
    with pytest.raises(AssertionError, match="differs"):
        stand_in_helpers.checked_both_ways(check, broken.SerializeToString(), stand_in)
    stand_in_helpers.checked_both_ways(check, pieces, stand_in)
