"""Hostile plans for `convert --plan` (issue 26): a plan file is user input. An edited port role
that would give a model ONNX Runtime refuses, a field of the wrong type, a missing entry, absurd
nesting or a key with a newline in it is refused with one line naming the plan's key path, exit 2;
never a traceback, never exit 3, never a converted model that does not load.

The CLI runs in process (bad_input_helpers.invoke); one small model is written once per test."""

from __future__ import annotations

import copy
import json

import numpy as np
import onnxruntime as ort
import pytest
from bad_input_helpers import assert_ok, assert_one_error, invoke, small_model, write_model
from helpers import parse, randn
from work_helpers import call_count, profiled

ROLES = "pfxuao"
# every JSON type, to put in place of a value
OTHER_VALUES = (None, 5, "s", [], {}, True)


def write_plan(model, folder, name="m.onnx"):
    """Write `model`, convert it with --plan-out; returns (model path, the plan as JSON data)."""
    path = write_model(model, folder / name)
    out = invoke(["convert", path, "-o", folder / "first.onnx", "--plan-out", folder / "plan.json", "-q"])
    assert_ok(out)
    return path, json.loads((folder / "plan.json").read_text())


def replay(model_path, data, folder, raw: str | None = None):
    """convert MODEL --plan (the data, or the raw text) -> Outcome; the output is folder/o.onnx."""
    plan = folder / "edited.json"
    plan.write_text(raw if raw is not None else json.dumps(data))
    return invoke(["convert", model_path, "-o", folder / "o.onnx", "--plan", plan, "-q"])


def counted_replay(model_path, data, folder):
    """(replay's Outcome, the Python function calls it made): a measure of its work that does not
    move with the machine's speed, as a time would (no test here reads a clock)."""
    done = []
    stats = profiled(lambda: done.append(replay(model_path, data, folder)), builtins=False)
    return done[0], call_count(stats)


def node(data, name):
    return next(n for n in data["nodes"] if n["name"] == name)


def set_role(entry, side, port, role):
    roles = list(entry[side])
    roles[port] = role
    entry[side] = "".join(roles)


def loads_in_onnx_runtime(path) -> bool:
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:  # ORT raises its own Fail/InvalidGraph types
        return False
    return True


# --------------------------------------------------------------------- port roles (defect 8)

MATMUL_ADD = """
g (float[2,8] x) => (float[2,8] y) {
    [mm] h = MatMul(x, w)
    [add] y = Add(h, b)
}"""


def matmul_add():
    return parse(MATMUL_ADD, w=randn([8, 8]), b=randn([8], 1))


def test_float_port_edited_to_never_cast_is_refused(tmp_path):
    """The issue's case: Add's bias edited to role x (never cast) while Add computes in fp16 bound
    Add's T to fp16 and fp32; ONNX Runtime refused the written model, and convert said exit 0."""
    path, data = write_plan(matmul_add(), tmp_path)
    assert node(data, "add")["roles_in"] == "pp"
    set_role(node(data, "add"), "roles_in", 1, "x")
    line = assert_one_error(replay(path, data, tmp_path), "edited.json", "'add'", "input 1", "'x'")
    assert "float" in line
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize(
    "name,side,port,role,fragment",
    [
        ("add", "roles_in", 1, "a", "'a'"),
        ("add", "roles_in", 0, "o", "'o'"),
        ("mm", "roles_out", 0, "x", "output 0"),
        # fp32 at one input of T while the other follows the fp16 node: T bound to two types
        ("add", "roles_in", 1, "f", "type parameter T"),
        ("mm", "roles_out", 0, "f", "type parameter T"),
    ],
)
def test_role_that_does_not_fit_the_port_is_refused(tmp_path, name, side, port, role, fragment):
    path, data = write_plan(matmul_add(), tmp_path)
    set_role(node(data, name), side, port, role)
    assert_one_error(replay(path, data, tmp_path), f"'{name}'", fragment)


def test_pinned_ports_of_an_fp32_node_are_accepted(tmp_path):
    """Pinning every port of T fp32 (what a [pins] rule does) with the node in fp32 is a plan
    classification could have written: it is replayed and the model loads."""
    path, data = write_plan(matmul_add(), tmp_path)
    add = node(data, "add")
    add["roles_in"], add["roles_out"], add["precision"] = "ff", "f", "fp32"
    assert_ok(replay(path, data, tmp_path))
    assert loads_in_onnx_runtime(tmp_path / "o.onnx")


ZOO = """
zoo (float[1,1,4,4] x) => (float[1,1,8,8] y, int64[4] s) {
    [mm] h = MatMul(x, w)
    [add] hb = Add(h, b)
    [ln] n = LayerNormalization<axis = -1>(hb, g, beta)
    [to16] n16 = Cast<to = 10>(n)
    [to32] n32 = Cast<to = 1>(n16)
    [resize] y = Resize<mode = "nearest">(n32, roi, scales)
    [shape] s = Shape(x)
}"""


def zoo():
    return parse(
        ZOO,
        w=randn([4, 4]),
        b=randn([4], 1),
        g=np.ones(4, np.float32),
        beta=np.zeros(4, np.float32),
        roi=np.zeros(0, np.float32),
        scales=np.array([1, 1, 2, 2], np.float32),
    )


def test_every_single_role_edit_is_refused_or_gives_a_loadable_model(tmp_path):
    """Each port of each node of a small zoo (MatMul, Add, LayerNormalization, casts to fp16 and
    back, Resize with pinned roi/scales, Shape) edited to each role, with the node in each
    precision: replay refuses it in one line, or the model it writes loads in ONNX Runtime."""
    path, data = write_plan(zoo(), tmp_path)
    unloadable, accepted = [], 0
    for k, entry in enumerate(data["nodes"]):
        for side in ("roles_in", "roles_out"):
            for port, written in enumerate(entry[side]):
                for role in ROLES.replace(written, ""):
                    for precision in ("fp16", "fp32", "unchanged"):
                        edited = copy.deepcopy(data)
                        set_role(edited["nodes"][k], side, port, role)
                        edited["nodes"][k]["precision"] = precision
                        out = replay(path, edited, tmp_path)
                        if out.code == 2:
                            assert_one_error(out)
                            continue
                        assert_ok(out)
                        accepted += 1
                        if not loads_in_onnx_runtime(tmp_path / "o.onnx"):
                            unloadable.append((entry["name"], side, port, role, precision))
    assert not unloadable, unloadable
    assert accepted > 0  # some edits (fp32 pins, precision edits) are legitimate


def test_unedited_plans_replay_on_every_example_model(tmp_path):
    """Role validation refuses nothing that --plan-out writes."""
    from bad_input_helpers import ROOT

    for model_path in sorted((ROOT / "examples" / "models").glob("*.onnx")):
        plan = tmp_path / f"{model_path.stem}.json"
        assert_ok(invoke(["convert", model_path, "-o", tmp_path / "a.onnx", "--plan-out", plan, "-q"]))
        assert_ok(invoke(["convert", model_path, "-o", tmp_path / "b.onnx", "--plan", plan, "-q"]))
        assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_fp16_node_of_an_fp16_model_replays_in_a_bf16_plan(tmp_path):
    """Painting leaves a node that nothing moved in the type it had: fp16 in a bf16 plan. Replay
    accepts that (the node keeps its type) and still refuses fp16 for a node that was fp32."""
    model = parse(
        """
        g (float16[2,8] x, float[2,8] z) => (float[2,8] y) {
            [neg] n = Neg(x)
            [c] n32 = Cast<to = 1>(n)
            [add] y = Add(n32, z)
        }"""
    )
    path = write_model(model, tmp_path / "m.onnx")
    plan = tmp_path / "plan.json"
    assert_ok(invoke(["convert", path, "-o", tmp_path / "a.onnx", "--plan-out", plan, "--precision", "bf16", "-q"]))
    data = json.loads(plan.read_text())
    assert node(data, "neg")["precision"] == "fp16"
    assert_ok(replay(path, data, tmp_path))
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "o.onnx").read_bytes()
    node(data, "add")["precision"] = "fp16"
    assert_one_error(replay(path, data, tmp_path), "'add' (Add): precision fp16 in a plan whose target is bf16")


# ------------------------------------------------------------------ malformed plan files


@pytest.fixture
def small(tmp_path):
    """(model path, its plan as data, folder) for the three-node small_model."""
    path, data = write_plan(small_model(8), tmp_path)
    return path, data, tmp_path


@pytest.mark.parametrize(
    "edit,fragments",
    [
        (lambda d: d.update(rule_files=5), ['"rule_files": expected a list of strings, got 5']),
        (lambda d: d.update(rule_files=["a", 3]), ['"rule_files[1]": expected a string, got 3']),
        (lambda d: d.update(training={}), ['"training"', '"kind" is missing']),
        (
            lambda d: d.update(
                training={"kind": "loss", "graph": 7, "losses": [], "parameters": [], "loss_scaling": {"mode": "none"}}
            ),
            ['"training.graph": expected a string, got 7'],
        ),
        (
            lambda d: d.update(
                training={
                    "kind": "ort-training",
                    "graph": "g",
                    "losses": [],
                    "parameters": [],
                    "loss_scaling": {"mode": "sometimes"},
                }
            ),
            ['"training.loss_scaling.mode"', "'sometimes'"],
        ),
        (lambda d: d.update(warnings=5), ['"warnings": expected a list']),
        (lambda d: d.update(warnings=[{"code": "x"}]), ['"warnings[0]"', '"message" is missing']),
        (lambda d: d.update(clamp_initializers=[]), ['"clamp_initializers": expected an object']),
        (lambda d: d.update(keep_io_types="yes"), ['"keep_io_types"']),
        (lambda d: d.update(vocabulary=5), ['"vocabulary": expected an object']),
        (lambda d: d["nodes"][0].update(id="0"), ['"nodes[0].id"', "expected an integer", "got '0'"]),
        (lambda d: d["nodes"][0].update(reasons=[{"code": 1, "message": "m"}]), ['"nodes[0].reasons[0].code"']),
        (lambda d: d["nodes"][0]["reasons"][0].update(value="big"), ['"nodes[0].reasons[0].value"', "a number"]),
        (lambda d: d["nodes"][0].update(fp32_inputs=[True]), ['"nodes[0].fp32_inputs[0]"']),
        (lambda d: d["nodes"][0].update(fp32_inputs=[7]), ['"nodes[0].fp32_inputs[0]"', "7"]),
        (lambda d: d["nodes"][1].update(category="fast"), ['"nodes[1].category"', "'fast'"]),
        # a misspelt key would do nothing: the edit it carries would be lost without a word
        (lambda d: d["nodes"][2].update(precison="fp32"), ['"nodes[2]"', "unknown key 'precison'"]),
        (lambda d: d.update(comment="mine"), ["unknown key 'comment'"]),
        # replay checks each node's name, domain, op type and graph against the model
        (lambda d: d["nodes"][0].update(domain="com.other"), ["'fc' (com.other:MatMul) in the plan"]),
    ],
)
def test_malformed_field_is_refused_naming_its_key_path(small, edit, fragments):
    path, data, folder = small
    edit(data)
    assert_one_error(replay(path, data, folder), "edited.json", *fragments)


def test_deeply_nested_plan_is_bad_input(small):
    path, _data, folder = small
    raw = '{"nodes": ' + "[" * 3000 + "]" * 3000 + "}"
    assert_one_error(replay(path, None, folder, raw=raw), "edited.json", "nested")


@pytest.mark.parametrize(
    "edit,fragment",
    [
        (lambda d: d.update({"bad\nkey": 1}), r"'bad\nkey'"),
        (lambda d: d["nodes"][0].update(op_type="MatMul\nforged line"), r"'MatMul\nforged line'"),
        (lambda d: d["nodes"][0].update(name="fc\nforged line"), r"'fc\nforged line'"),
        (lambda d: d.update(low_precision_io=["x\nforged line"]), r"'x\nforged line'"),
        (lambda d: d.update(clamp_initializers={"w9\nforged line": "why"}), r"'w9\nforged line'"),
        (lambda d: d["nodes"][0].update(precision="fp\n16"), r"'fp\n16'"),
    ],
)
def test_user_text_in_messages_is_quoted(small, edit, fragment):
    """A newline in a key, a name or a value that the message repeats never splits the line."""
    path, data, folder = small
    edit(data)
    assert_one_error(replay(path, data, folder), fragment)


def test_clamp_entry_for_no_initializer_is_refused(small):
    """A clamp entry names a weight the rule forced low; one that names nothing would do nothing."""
    path, data, folder = small
    data["clamp_initializers"] = {"nope": "forced"}
    assert_one_error(replay(path, data, folder), "clamp_initializers", "'nope'")


def test_training_entry_on_an_inference_model_is_refused(small):
    path, data, folder = small
    data["training"] = {
        "kind": "loss",
        "graph": "loss graph",
        "losses": ["y"],
        "parameters": [],
        "loss_scaling": {"mode": "none"},
    }
    assert_one_error(replay(path, data, folder), '"training"', "not a training graph")


# ------------------------------------------------------------- every field, every JSON type


def key_paths(value, path=()):
    """Every key path of a JSON value, depth first (the root excluded)."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return
    for key, item in items:
        yield (*path, key)
        yield from key_paths(item, (*path, key))


def mutated(data, path, new=None, delete=False):
    out = copy.deepcopy(data)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return out


def test_every_field_of_a_real_plan_mutated_is_accepted_or_refused_in_one_line(small):
    """Each key path of a plan written by --plan-out, replaced by a value of each JSON type and
    deleted: exit 0 (still a valid plan) or exit 2 with one line, never exit 3 or a traceback.
    Replacing a field replay reads (version, target, keep_io_types, the fingerprint, the nodes'
    ids, names, op types, graphs, precisions and roles) by another type is always refused. And no
    mutation costs more than replaying the plan as written: each run makes at most 5% more Python
    calls than the unmutated replay (measured: 7.5k calls unmutated, at most 8 more mutated; a
    replay that also validated its result makes 1.1k more, one that planned afresh 14k more)."""
    path, data, folder = small
    # every optional entry present, so that its fields are mutated too
    data["low_precision_io"] = ["x"]
    data["warnings"] = [{"code": "note", "message": "a warning", "node": "fc"}]
    data["clamp_initializers"] = {"w1": "forced low by a rule"}
    data["search"] = {"kept": [], "passed": True}
    data["nodes"][1]["fp32_inputs"] = [0]
    assert_ok(replay(path, data, folder))  # the first replay in this process fills caches
    unmutated = []
    for _ in range(2):
        out, work = counted_replay(path, data, folder)
        assert_ok(out)
        unmutated.append(work)
    most = 1.05 * max(unmutated)
    read = {"version", "target", "keep_io_types", "model_fingerprint", "nodes"}
    read_in_node = {"id", "name", "op_type", "domain", "graph", "category", "precision", "roles_in", "roles_out"}
    runs, costly = 0, []
    for key_path in list(key_paths(data)):
        parent = data
        for key in key_path[:-1]:
            parent = parent[key]
        value = parent[key_path[-1]]
        variants = [(new, False) for new in OTHER_VALUES if type(new) is not type(value) or new != value]
        variants.append((None, True))
        for new, delete in variants:
            out, work = counted_replay(path, mutated(data, key_path, new, delete), folder)
            runs += 1
            where = (key_path, "deleted" if delete else new)
            if work > most:
                costly.append((where, work))
            assert out.code in (0, 2), (where, out.code, out.stderr)
            if out.code == 2:
                assert_one_error(out)
            else:
                assert_ok(out)
            is_read = (len(key_path) == 1 and key_path[0] in read) or (
                len(key_path) == 3 and key_path[0] == "nodes" and key_path[2] in read_in_node
            )
            if is_read and (delete or type(new) is not type(value)):
                assert out.code == 2, where
    assert runs > 300
    assert costly == [], (unmutated, costly)


def test_every_field_of_a_training_entry_mutated_is_accepted_or_refused_in_one_line(tmp_path):
    """The same for the "training" entry of an onnxruntime-training model's plan."""
    from bad_input_helpers import ROOT

    path = ROOT / "tests" / "data" / "training" / "mlp" / "training_model.onnx"
    assert_ok(invoke(["convert", path, "-o", tmp_path / "first.onnx", "--plan-out", tmp_path / "plan.json", "-q"]))
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["training"]["loss_scaling"]["mode"] == "dynamic"
    for key_path in [("training",), *key_paths(data["training"], ("training",))]:
        parent = data
        for key in key_path[:-1]:
            parent = parent[key]
        value = parent[key_path[-1]]
        variants = [(new, False) for new in OTHER_VALUES if type(new) is not type(value) or new != value]
        for new, delete in [*variants, (None, True)]:
            out = replay(path, mutated(data, key_path, new, delete), tmp_path)
            assert out.code in (0, 2), (key_path, new, delete, out.stderr)
            if out.code == 2:
                assert_one_error(out)
            else:
                assert_ok(out)
