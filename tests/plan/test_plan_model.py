"""The precision plan as data (autocast_onnx/plan/model.py): PrecisionPlan, its node entries,
reasons and warnings, and its JSON form (what --plan-out writes and later commands read back).
A plan converts to JSON and back without loss, carries the format version PLAN_VERSION, and a
plan of another version is refused."""

from __future__ import annotations

import json

import case_helpers as C
import pytest
from helpers import attention_block, convert, parse, randn

from autocast_onnx import AutocastError, PrecisionPlan
from autocast_onnx.plan.model import PLAN_VERSION


def test_plan_json_round_trip(tmp_path):
    r = convert(attention_block())
    path = tmp_path / "plan.json"
    r.plan.save(path)
    data = json.loads(path.read_text())
    assert data["target"] == "fp16" and data["summary"]["fp16"] == 5 and data["kernels"] == "cuda"
    again = PrecisionPlan.from_json(path.read_text())
    assert again == r.plan
    # The Softmax between fp16 neighbours: its category from the rules, its fp16 from the CUDA
    # kernel table (pass 6), both reasons kept through the round trip.
    node = next(n for n in data["nodes"] if n["name"] == "softmax")
    assert node["precision"] == "fp16" and node["category"] == "keep_fp32"
    assert node["reasons"][0]["source"].startswith("rules/default.toml:")
    assert node["reasons"][-1]["code"] == "kernel-fp32"


def test_plan_json_carries_the_format_version():
    plan = convert(attention_block()).plan
    assert json.loads(plan.to_json())["version"] == PLAN_VERSION


def test_plan_of_another_version_is_refused():
    data = json.loads(convert(attention_block()).plan.to_json())
    data["version"] = PLAN_VERSION + 100
    with pytest.raises((ValueError, AutocastError), match="version"):
        PrecisionPlan.from_dict(data)


def test_round_trip_keeps_subgraph_entries_warnings_and_keep_io():
    """A plan with keep_io_types=False, subgraph nodes, a warning (data-range on a forced-low
    Add) and a measured value in a reason survives JSON unchanged."""
    m = parse(
        """
        branchy (float[2,4] x, bool cond) => (float[2,4] y) <float[4] mask = {0, 0, -1e9, 0}> {
            [branch] y = If (cond) <
                then_branch = then_body () => (float[2,4] t) {
                    [then_mm] t_mm = MatMul(x, W)
                    [then_mask] t = Add(t_mm, mask)
                },
                else_branch = else_body () => (float[2,4] e) {
                    [else_relu] e = Relu(x)
                }>
        }""",
        W=randn([4, 4], 130),
    )
    r = convert(m, precision="fp16", keep_io_types=False, include_nodes=["^then_mask$"])
    assert C.entry(r, "then_mm").graph != "main"
    assert "data-range" in C.warning_codes(r)
    assert [x.value for x in C.entry(r, "then_mask").reasons if x.code == "data-range"] == [pytest.approx(1e9)]
    again = PrecisionPlan.from_json(r.plan.to_json())
    assert again == r.plan
    assert again.target == "fp16" and again.keep_io_types is False
    assert [w.code for w in again.warnings] == [w.code for w in r.plan.warnings]
    assert [x.value for x in again.by_name("then_mask")[0].reasons if x.code == "data-range"] == [pytest.approx(1e9)]
    assert [(n.name, n.graph, n.precision) for n in again.nodes] == [
        (n.name, n.graph, n.precision) for n in r.plan.nodes
    ]
