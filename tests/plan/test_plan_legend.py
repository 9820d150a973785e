"""The legend of a plan file (`"vocabulary"`, written by --plan-out): each code's own description,
never its class's docstring, and nothing replay reads."""

from __future__ import annotations

import json

import pytest
from helpers import parse, randn

import autocast_onnx
from autocast_onnx.plan.model import vocabulary
from autocast_onnx.plan.vocab import Category, PortRole, Precision

SECTIONS = {"precision": Precision, "roles": PortRole, "categories": Category}


def words(text) -> str:
    return " ".join((text or "").split())


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_code_has_its_own_description_not_the_class_docstring(section):
    legend, enum = vocabulary()[section], SECTIONS[section]
    assert len(legend) == len(enum)
    assert all(legend.values()), legend
    assert len(set(legend.values())) == len(legend), legend  # distinct: one per code
    assert words(enum.__doc__) not in legend.values()


def test_the_legend_says_what_each_code_means():
    legend = vocabulary()
    assert legend["precision"]["fp16"].startswith("IEEE half precision")
    assert legend["precision"]["unchanged"].startswith("Keeps the types it had")
    assert legend["roles"]["f"].startswith("Pinned fp32")
    assert legend["roles"]["a"].startswith("The op reads only the shape")
    assert legend["categories"]["keep_fp32"].startswith("Always fp32")
    assert legend["categories"]["control_flow"].startswith("If, Loop, Scan")
    for enum in SECTIONS.values():  # the description is the member's own, one line
        for member in enum:
            assert member.description == words(member.description) and member.description.endswith(".")


MODEL = """
g (float[2,8] x) => (float[2,8] y, int64[2] shape) {
    [fc] h = MatMul(x, w)
    [softmax] y = Softmax<axis = -1>(h)
    [shape] shape = Shape(x)
}"""


def test_a_plan_file_carries_the_legend_and_replay_does_not_read_it(tmp_path):
    model = parse(MODEL, w=randn([8, 8]))
    result = autocast_onnx.convert(model)
    path = tmp_path / "plan.json"
    result.plan.save(path)
    data = json.loads(path.read_text())
    assert data["vocabulary"] == vocabulary()
    data["vocabulary"] = {"precision": {"fp16": "edited"}, "roles": {}}  # a legend edited by hand
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    replayed = autocast_onnx.convert(parse(MODEL, w=randn([8, 8])), plan=edited)
    assert replayed.model.SerializeToString() == result.model.SerializeToString()
