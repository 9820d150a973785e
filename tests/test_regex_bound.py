"""User regexes are matched within a time bound (autocast_onnx/patterns.py). Python's `re`
backtracks without limit, so '^(a|a)+$' against a node named 'a' * 40 + 'b' ran for days from
every entry point that matches a user's regex: --exclude-node, --include-node,
--low-precision-io, `[[nodes]] match` in a rule file, a configuration's exclude-node and lint
suppressions, and explain's NODE pattern. Now each answers correctly at once, or refuses the
pattern in one line (exit 2) naming the pattern and where it came from, within the bound.

The in-process tests lower the per-name bound to SHORT seconds; one test runs the real CLI with
the default bound."""

from __future__ import annotations

import json
import time

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, invoke, run_process
from helpers import F32, init, model, tensor
from onnx import helper

import autocast_onnx
from autocast_onnx import patterns
from autocast_onnx.errors import AutocastError

NAME = "a" * 40 + "b"  # node, input and weight-consumer name
EVIL = "^(a|a)+$"  # exponential for a backtracking matcher on NAME, also for the bounded one
NESTED = "^(a+)+$"  # exponential for `re` on NAME; the bounded matcher answers "no match" at once
DEFAULT_BOUND = patterns.MATCH_TIMEOUT_S
SHORT = 0.2  # seconds per name in the in-process tests
FAST = 5.0  # seconds an in-process refusal or answer may take, far below a backtracking run


@pytest.fixture(autouse=True)
def short_bound(monkeypatch):
    monkeypatch.setattr(patterns, "MATCH_TIMEOUT_S", SHORT)


def write_model(path, weight: float):
    """x (named NAME) -> MatMul (named NAME, every weight `weight`) -> y."""
    nodes = [helper.make_node("MatMul", [NAME, "w"], ["y"], name=NAME)]
    w = np.full((8, 8), weight, np.float32)
    onnx.save(model(nodes, [tensor(NAME, F32, [2, 8])], [tensor("y", F32, [2, 8])], [init("w", w)]), path)
    return path


@pytest.fixture
def evil_model(tmp_path):
    """The model with weights of 1e6: a lint finding on the node, which a suppression may hide."""
    return write_model(tmp_path / "evil.onnx", 1e6)


@pytest.fixture
def plain_model(tmp_path):
    """The model with weights of 0.5: the MatMul runs in fp16 unless a selection says otherwise."""
    return write_model(tmp_path / "plain.onnx", 0.5)


def timed(args, monkeypatch=None, cwd=None):
    """(outcome, seconds) of the CLI in process, from `cwd`."""
    if cwd is not None:
        monkeypatch.chdir(cwd)
    start = time.perf_counter()
    outcome = invoke(args)
    return outcome, time.perf_counter() - start


def refused(outcome, seconds, *fragments):
    """Exit 2 in one line naming the pattern (and `fragments`), within FAST seconds."""
    from bad_input_helpers import assert_one_error

    line = assert_one_error(outcome, repr(EVIL), "takes more than", *fragments)
    assert seconds < FAST, seconds
    return line


def cli_cases(path, tmp_path):
    out = str(tmp_path / "o.onnx")
    rules = tmp_path / "rules.toml"
    rules.write_text(f'[[nodes]]\nmatch = "{EVIL}"\nprecision = "fp32"\n')
    return {
        "exclude-node": (["convert", path, "-o", out, "--exclude-node", EVIL], "--exclude-node"),
        "include-node": (["convert", path, "-o", out, "--include-node", EVIL], "--include-node"),
        "low-precision-io": (["convert", path, "-o", out, "--low-precision-io", EVIL], "--low-precision-io"),
        "rules-match": (["convert", path, "-o", out, "--rules", rules], f"{rules}:1"),
        "explain": (["explain", path, EVIL], "explain NODE"),
    }


@pytest.mark.parametrize("case", ["exclude-node", "include-node", "low-precision-io", "rules-match", "explain"])
def test_a_backtracking_pattern_is_refused_fast_naming_its_origin(case, evil_model, tmp_path):
    args, origin = cli_cases(evil_model, tmp_path)[case]
    refused(*timed(args), origin)
    assert not (tmp_path / "o.onnx").exists()


def test_configuration_patterns_are_bounded(evil_model, tmp_path, monkeypatch):
    """exclude-node of the configuration and a lint suppression's node regex."""
    config = tmp_path / "autocast-onnx.toml"
    config.write_text(f'exclude-node = ["{EVIL}"]\n')
    refused(*timed(["convert", evil_model, "-o", tmp_path / "o.onnx"], monkeypatch, tmp_path), "--exclude-node")
    config.write_text(f'suppress = [{{ code = "AC", node = "{EVIL}" }}]\n')
    refused(*timed(["lint", evil_model], monkeypatch, tmp_path), str(config), "suppression")


def test_the_python_api_is_bounded(evil_model):
    start = time.perf_counter()
    with pytest.raises(AutocastError, match="takes more than"):
        autocast_onnx.convert(str(evil_model), exclude_nodes=[EVIL])
    with pytest.raises(AutocastError, match="takes more than"):
        autocast_onnx.explain(str(evil_model), EVIL)
    assert time.perf_counter() - start < 2 * FAST


def test_nested_repeat_gets_the_right_answer_at_once(plain_model, tmp_path):
    """'^(a+)+$' matches no node: the answer (an unmatched-selector warning, explain's "no node
    matches"), not a hang; with '|b$' it matches and keeps the node fp32."""
    plan = tmp_path / "plan.json"
    for pattern, precision in ((NESTED, "fp16"), (NESTED + "|b$", "fp32")):
        args = ["convert", plain_model, "-o", tmp_path / "o.onnx", "--plan-out", plan, "--exclude-node", pattern]
        outcome, seconds = timed(args)
        assert_ok(outcome)
        node = json.loads(plan.read_text())["nodes"][0]
        assert node["precision"] == precision and seconds < FAST, (node, seconds)
        assert ("matches no node" in outcome.stdout) == (precision == "fp16")
    outcome, seconds = timed(["explain", plain_model, NESTED])
    assert outcome.code == 2 and "no node matches" in outcome.stderr and seconds < FAST


def test_the_default_bound_holds_in_a_real_process(evil_model, tmp_path):
    start = time.perf_counter()
    outcome = run_process(["convert", evil_model, "-o", tmp_path / "o.onnx", "--exclude-node", EVIL], timeout=60)
    refused(outcome, 0.0, "--exclude-node", f"more than {DEFAULT_BOUND:g} s")
    assert time.perf_counter() - start < 30


def test_the_budget_bounds_many_slow_names(monkeypatch):
    """Names that each stay under the per-name bound still exhaust the pattern's budget."""
    monkeypatch.setattr(patterns, "MATCH_TIMEOUT_S", 10.0)
    monkeypatch.setattr(patterns, "PATTERN_BUDGET_S", 0.3)
    pattern = patterns.compile_pattern(EVIL, "--exclude-node")
    start = time.perf_counter()
    with pytest.raises(AutocastError, match="in all") as info:
        for _ in range(1000):
            pattern.search("a" * 22 + "b")
    assert time.perf_counter() - start < 3 and info.value.where == "--exclude-node"


def test_a_bound_pattern_matches_as_re_does():
    for text, name in [("^enc/", "enc/fc"), (r"layer\.\d+/", "model/layer.12/q"), ("(?i)SOFTMAX$", "attn/softmax")]:
        pattern = patterns.compile_pattern(text, "--exclude-node")
        assert pattern.search(name) and not pattern.search("other")
    assert patterns.compile_pattern("b.", "x").fullmatch("bc")
    assert not patterns.compile_pattern("b", "x").fullmatch("bc")


@pytest.mark.parametrize("text", ["([", "(" * 5000 + ")" * 5000, "a{99999999999}"])
def test_a_pattern_that_does_not_compile_is_one_error(text):
    with pytest.raises(AutocastError, match="bad regex") as info:
        patterns.compile_pattern(text, "--exclude-node")
    assert info.value.where == "--exclude-node" and len(info.value.line()) < 500
