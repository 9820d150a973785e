"""A replayed plan keeps each node's reason and marks the edited ones: a plan file records the
precision planning gave (`planned`), a node whose `precision` differs is edited (last reason
`plan-edit`, naming the file), and every other node keeps the reasons the file gives it. Before,
every replayed node's last reason was `plan-replay`, so the summary read 'fp32 nodes by reason:
replayed plan 21'. `explain --plan FILE` explains the plan that `convert --plan FILE` applies."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import parse, randn

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.cli.main import cli
from autocast_onnx.report import conversion_summary
from autocast_onnx.report.summary import fp32_by_reason

MLP = """
mlp (float[2,8] x) => (float[2,8] y) {
    [fc1] h = MatMul(x, w1)
    [act] a = Relu(h)
    [fc2] z = MatMul(a, w2)
    [softmax] y = Softmax<axis = -1>(z)
}"""


def mlp():
    return parse(MLP, w1=randn([8, 8]), w2=randn([8, 8], seed=2))


def plan_file(tmp_path, edit: dict | None = None, name="plan.json"):
    """A plan written by convert, with node precisions edited: {"fc2": "fp32"}."""
    data = autocast_onnx.convert(mlp()).plan.to_dict()
    for entry in data["nodes"]:
        if entry["name"] in (edit or {}):
            entry["precision"] = edit[entry["name"]]
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path, data


def entry(plan, name):
    return plan.by_name(name)[0]


def test_the_plan_file_records_the_precision_planning_gave(tmp_path):
    _, data = plan_file(tmp_path)
    for node in data["nodes"]:
        assert node["planned"] == node["precision"]
    assert list(data["nodes"][0]).index("planned") == list(data["nodes"][0]).index("precision") + 1


def test_an_unedited_replay_keeps_every_reason_and_the_summary_counts_them(tmp_path):
    fresh = autocast_onnx.convert(mlp())
    path, _ = plan_file(tmp_path)
    replayed = autocast_onnx.convert(mlp(), plan=path)
    assert fp32_by_reason(replayed.plan) == fp32_by_reason(fresh.plan) == {"op-category": 1}
    assert [n.reasons for n in replayed.plan.nodes] == [n.reasons for n in fresh.plan.nodes]
    text = conversion_summary(replayed)
    assert "fp32 nodes by reason: op category 1" in text and "replayed plan" not in text
    assert f"plan replayed from {path}: no node edited" in text


def test_an_edited_node_is_marked_and_named_in_the_summary(tmp_path):
    path, _ = plan_file(tmp_path, {"fc2": "fp32"})
    replayed = autocast_onnx.convert(mlp(), plan=path)
    fc2 = entry(replayed.plan, "fc2")
    assert fc2.edited and fc2.precision == "fp32" and fc2.planned == "fp16"
    assert fc2.reasons[0].code == "op-category"  # what planning said stays
    last = fc2.reasons[-1]
    assert last.code == "plan-edit" and last.source == str(path)
    assert last.message == "edited in the plan to fp32 (planning gave fp16)"
    assert [r.code for r in entry(replayed.plan, "fc1").reasons] == ["op-category"]  # not edited: as planned
    text = conversion_summary(replayed)
    assert "fp32 nodes by reason: edited in the plan 1, op category 1" in text
    assert f"plan replayed from {path}: 1 of 4 nodes edited (fc2 fp16 -> fp32)" in text
    assert "precision: fp32 (edited in the plan; planning gave fp16)" in fc2.explain()


def test_an_edit_stays_an_edit_when_the_replayed_plan_is_written_and_replayed_again(tmp_path):
    path, _ = plan_file(tmp_path, {"softmax": "fp16"})
    again = tmp_path / "again.json"
    autocast_onnx.convert(mlp(), plan=path).plan.save(again)
    data = json.loads(again.read_text())
    softmax = next(n for n in data["nodes"] if n["name"] == "softmax")
    assert softmax["precision"] == "fp16" and softmax["planned"] == "fp32"
    replayed = autocast_onnx.convert(mlp(), plan=again)
    codes = [r.code for r in entry(replayed.plan, "softmax").reasons]
    assert codes.count("plan-edit") == 1 and codes[-1] == "plan-edit"
    assert entry(replayed.plan, "softmax").reasons[-1].source == str(again)


def test_a_plan_written_before_planned_was_recorded_replays_and_says_edits_are_unknown(tmp_path):
    path, data = plan_file(tmp_path, {"fc2": "fp32"})
    for node in data["nodes"]:
        del node["planned"]
    path.write_text(json.dumps(data))
    replayed = autocast_onnx.convert(mlp(), plan=path)
    assert not any(n.edited for n in replayed.plan.nodes)
    assert {n.reasons[-1].code for n in replayed.plan.nodes} == {"plan-replay"}  # as such files always did
    assert "edits cannot be told apart" in conversion_summary(replayed)


def test_a_planned_precision_that_is_no_precision_is_refused(tmp_path):
    path, data = plan_file(tmp_path)
    data["nodes"][0]["planned"] = "fp8"
    path.write_text(json.dumps(data))
    with pytest.raises(AutocastError, match=r'"nodes\[0\].planned".*fp8'):
        autocast_onnx.convert(mlp(), plan=path)


def test_explain_plan_explains_the_replayed_and_the_edited_nodes(tmp_path):
    model = tmp_path / "mlp.onnx"
    model.write_bytes(mlp().SerializeToString())
    path, _ = plan_file(tmp_path, {"fc2": "fp32"})
    out = CliRunner().invoke(cli, ["explain", str(model), "fc2", "--plan", str(path)])
    assert out.exit_code == 0, out.output
    assert "precision: fp32 (edited in the plan; planning gave fp16)" in out.stdout
    assert "[plan-edit] edited in the plan to fp32 (planning gave fp16)" in out.stdout
    plain = CliRunner().invoke(cli, ["explain", str(model), "fc1", "--plan", str(path)])
    assert "precision: fp16\n" in plain.stdout and "plan-edit" not in plain.stdout


def test_explain_plan_refuses_what_convert_plan_refuses(tmp_path):
    model = tmp_path / "mlp.onnx"
    model.write_bytes(mlp().SerializeToString())
    path, _ = plan_file(tmp_path)
    out = CliRunner().invoke(cli, ["explain", str(model), "fc2", "--plan", str(path), "--exclude-op", "MatMul"])
    assert out.exit_code == 2 and "cannot be combined with --plan" in out.stderr
    other = tmp_path / "other.onnx"
    other.write_bytes(
        parse("g (float[2,8] x) => (float[2,8] y) { [fc2] y = MatMul(x, w) }", w=randn([8, 8])).SerializeToString()
    )
    out = CliRunner().invoke(cli, ["explain", str(other), "fc2", "--plan", str(path)])
    assert out.exit_code == 2 and str(path) in out.stderr
