"""A ModelProto over 2 GiB in memory (its weights loaded, not external), past what protobuf
encodes: upb's ByteSize itself raises EncodeError there, so each size guard that compared
ByteSize() with the limit raised instead of guarding (issue 36, defect 5, beyond the drop-ins:
autocast_onnx.compat converts such a model, tests/compat/test_compat_hostile.py). The guards read the size
through io.encoded_size, and the Python API says in one line what to do with such a model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import F32, model, tensor
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.io import PROTOBUF_LIMIT, encoded_size
from autocast_onnx.rewrite.opset import upgrade_opset


@pytest.fixture(scope="module")
def big() -> onnx.ModelProto:
    """A MatMul model with an unused 2 GiB uint8 initializer beside its weight."""
    w = onnx.numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    m = model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], [w], opset=13)
    table = m.graph.initializer.add(name="table", data_type=TensorProto.UINT8, dims=[PROTOBUF_LIMIT + 16])
    table.raw_data = bytes(PROTOBUF_LIMIT + 16)
    return m


def test_encoded_size_is_past_the_limit_where_bytesize_cannot_say(big):
    try:
        size = big.ByteSize()
    except Exception:  # upb (protobuf 4 and later): no size above 2 GiB
        size = None
    assert encoded_size(big) > PROTOBUF_LIMIT
    assert size is None or encoded_size(big) == size
    assert encoded_size(big.graph.initializer[0]) == big.graph.initializer[0].ByteSize()


@pytest.mark.parametrize("copy", [True, False])
def test_convert_says_in_one_line_what_to_do(big, copy):
    with pytest.raises(AutocastError) as caught:
        autocast_onnx.convert(big, copy=copy)
    line = caught.value.line()
    assert line.startswith("<model>: the model is over 2 GiB in memory") and "save_as_external_data=True" in line
    assert "\n" not in line


def test_the_opset_upgrade_guard_refuses_instead_of_raising(big):
    with pytest.raises(AutocastError, match="over 2 GiB in memory"):
        upgrade_opset(big, 17, "<model>")
    assert next(o.version for o in big.opset_import if o.domain == "") == 13
