"""One options object for every command: the configuration file reaches convert, explain, lint
and check alike (regression: `rules = [...]` reached lint and check but not convert or
explain, so the commands disagreed on a node's precision); `convert --plan` replays an edited
plan; options that would do nothing in a run are refused; -v shows each stage's passes."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner
from helpers import parse, randn

from autocast_onnx.cli.main import main

MODEL = """
net (float[2,8] x) => (float[2,8] y) {
    [fc1] h = MatMul(x, w1)
    [act] a = Relu(h)
    [fc2] z = MatMul(a, w2)
    [softmax] y = Softmax<axis = -1>(z)
}"""


def run(*args, cwd=None):
    """(exit code, stdout, stderr) of the CLI in process, from `cwd`."""
    import os

    runner = CliRunner()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        with runner.isolation() as (out, err, _):
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            return code, out.getvalue().decode(), err.getvalue().decode()
    finally:
        os.chdir(old)


@pytest.fixture
def project(tmp_path):
    """A folder with the model and a configuration whose rule file keeps fc2 fp32."""
    model = parse(MODEL, w1=randn([8, 8], 1), w2=randn([8, 8], 2))
    onnx.save(model, tmp_path / "net.onnx")
    (tmp_path / "keep_fc2.toml").write_text('[[nodes]]\nname = "fc2"\nprecision = "fp32"\nwhy = "test"\n')
    (tmp_path / "autocast-onnx.toml").write_text('rules = ["keep_fc2.toml"]\nexclude-op = ["Relu"]\n')
    return tmp_path


def plan_of(path):
    return {n["name"]: n["precision"] for n in json.loads(path.read_text())["nodes"]}


def test_configuration_reaches_convert_explain_and_check_alike(project):
    code, out, err = run("convert", "net.onnx", "-o", "out.onnx", "--plan-out", "plan.json", cwd=project)
    assert code == 0, err
    planned = plan_of(project / "plan.json")
    assert planned["fc2"] == "fp32" and planned["act"] == "fp32" and planned["fc1"] == "fp16"

    code, out, err = run("explain", "net.onnx", "fc2", cwd=project)
    assert code == 0, err
    assert "precision: fp32" in out and "node rule forces fp32" in out
    code, out, _ = run("explain", "net.onnx", "act", cwd=project)
    assert "precision: fp32" in out and "--exclude-op Relu" in out

    code, out, err = run("check", "net.onnx", "--no-validate", "--report-json", "check.json", cwd=project)
    assert code == 0, err
    counts = json.loads((project / "check.json").read_text())["conversion"]["counts"]
    assert counts["fp16"] == sum(p == "fp16" for p in planned.values())
    assert counts["fp32"] == sum(p == "fp32" for p in planned.values())


def test_flags_override_the_configuration(project):
    code, _, err = run(
        "convert",
        "net.onnx",
        "-o",
        "out.onnx",
        "--plan-out",
        "plan.json",
        "--rules",
        project / "keep_fc2.toml",
        "--exclude-op",
        "Softmax",
        cwd=project,
    )
    assert code == 0, err
    planned = plan_of(project / "plan.json")
    assert planned["fc2"] == "fp32" and planned["act"] == "fp16"  # --exclude-op replaced the config's list


def test_config_precision_and_bad_values(project):
    (project / "autocast-onnx.toml").write_text('precision = "bf16"\n')
    code, _, err = run("convert", "net.onnx", "--plan-out", "plan.json", cwd=project)
    assert code == 0, err
    assert (project / "net.bf16.onnx").is_file()
    (project / "autocast-onnx.toml").write_text('precision = "fp8"\n')
    code, _, err = run("convert", "net.onnx", cwd=project)
    assert code == 2 and "precision must be fp16 or bf16" in err and len(err.strip().splitlines()) == 1


def test_convert_replays_an_edited_plan(project):
    (project / "autocast-onnx.toml").unlink()
    assert run("convert", "net.onnx", "-o", "a.onnx", "--plan-out", "plan.json", cwd=project)[0] == 0
    data = json.loads((project / "plan.json").read_text())
    for node in data["nodes"]:
        if node["name"] == "fc1":
            assert node["precision"] == "fp16"
            node["precision"] = "fp32"
    (project / "edited.json").write_text(json.dumps(data, indent=1))
    code, _out, err = run(
        "convert", "net.onnx", "-o", "b.onnx", "--plan", "edited.json", "--plan-out", "b.json", cwd=project
    )
    assert code == 0, err
    assert plan_of(project / "b.json")["fc1"] == "fp32"
    converted = onnx.load(project / "b.onnx")
    fc1 = next(n for n in converted.graph.node if n.name == "fc1")
    assert all(i in ("x", "w1") for i in fc1.input)  # fp32 weight and input: nothing cast in front


def test_convert_refuses_a_stale_plan_and_planning_flags_with_a_plan(project):
    (project / "autocast-onnx.toml").unlink()
    assert run("convert", "net.onnx", "-o", "a.onnx", "--plan-out", "plan.json", cwd=project)[0] == 0
    other = parse(MODEL.replace("[act] a = Relu(h)", "[act] a = Sigmoid(h)"), w1=randn([8, 8]), w2=randn([8, 8]))
    onnx.save(other, project / "other.onnx")
    code, _, err = run("convert", "other.onnx", "-o", "c.onnx", "--plan", "plan.json", cwd=project)
    assert code == 2 and "'act' (Relu) in the plan" in err and len(err.strip().splitlines()) == 1
    assert not (project / "c.onnx").exists()
    code, _, err = run(
        "convert", "net.onnx", "-o", "c.onnx", "--plan", "plan.json", "--exclude-op", "Softmax", cwd=project
    )
    assert code == 2 and "--exclude-op has no effect with --plan" in err
    assert not (project / "c.onnx").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--atol", "0.1"], "--atol has no effect without --validate"),
        (["--report-html", "r.html"], "--report-html has no effect without --validate"),
        (["--seed", "3"], "--seed has no effect without --validate or --target"),
        (["--device", "cpu"], "--device has no effect without --validate, --target or --calibration-data"),
    ],
)
def test_convert_refuses_validation_options_that_would_do_nothing(project, args, message):
    code, _, err = run("convert", "net.onnx", "-o", "out.onnx", *args, cwd=project)
    assert code == 2 and message in err
    assert not (project / "out.onnx").exists() and not (project / "r.html").exists()


def test_check_refuses_validation_options_with_no_validate(project):
    code, _, err = run("check", "net.onnx", "--no-validate", "--min-cosine", "0.9", cwd=project)
    assert code == 2 and "--min-cosine has no effect with --no-validate" in err


def test_verbose_logs_each_pass(project):
    code, _out, err = run("convert", "net.onnx", "-o", "out.onnx", "-v", cwd=project)
    assert code == 0
    for line in (
        "classify pass 1 (categories)",
        "paint pass 2 (fp32 taint)",
        "paint pass 4 (backward settle)",
        "apply: ",
    ):
        assert line in err
    code, _, err = run("convert", "net.onnx", "-o", "out2.onnx", cwd=project)
    assert "paint pass" not in err


def test_lint_protection_follows_the_selections(project):
    """lint judges what the conversion protects with the same selections convert uses: with
    MatMul excluded, the unaligned MatMul is reported as protected."""
    (project / "autocast-onnx.toml").unlink()
    model = parse(
        """
        n (float[2,8] x) => (float[2,7] y) {
            [fc] h = MatMul(x, w)
            [act] y = Relu(h)
        }""",
        w=randn([8, 7]),
    )
    onnx.save(model, project / "tiny.onnx")
    _, plain, _ = run("lint", "tiny.onnx", "--show-protected", cwd=project)
    _, excluded, _ = run("lint", "tiny.onnx", "--exclude-op", "MatMul", "--show-protected", cwd=project)
    assert "MatMul N=7 not a multiple of 8; the default conversion rules would NOT protect this" in plain
    assert "MatMul N=7 not a multiple of 8; the default conversion rules keep this fp32" in excluded
