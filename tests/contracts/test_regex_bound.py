"""User regexes are matched within a time bound (autocast_onnx/patterns.py). Python's `re`
backtracks without limit, so '^(a|a)+$' against a node named 'a' * 40 + 'b' ran for days from
every entry point that matches a user's regex: --exclude-node, --include-node,
--low-precision-io, `[[nodes]] match` in a rule file, a configuration's exclude-node and lint
suppressions, and explain's NODE pattern. Now each answers correctly, or refuses the pattern in
one line (exit 2) naming the pattern and where it came from, within the bound.

No test reads a clock (a loaded machine must not fail them): the regex package stops a match at
the timeout it is given, so what a command may spend matching is the sum of the timeouts it gives
the engine. The in-process tests record those (`engine`), with the per-name bound lowered to
SHORT seconds, and check that every match had one, within the bound, and that they add up to
little; the budget is checked against a scripted engine and clock. One test runs the real CLI
with the default bound."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
import regex
from bad_input_helpers import assert_ok, assert_one_error, invoke, run_process
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
FAST = 5.0  # seconds of matching a refusal or an answer may be allowed in all, far below a backtracking run
MATCHING = ("search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split")


class _Bounded:
    """A compiled regex whose matches the engine fixture records."""

    def __init__(self, compiled, engine: Engine):
        self._compiled, self._engine = compiled, engine

    def __getattr__(self, name):
        method = getattr(self._compiled, name)
        if name not in MATCHING:
            return method

        def matching(*args, timeout=None, **kwargs):
            return method(*args, timeout=self._engine.granted(self._compiled.pattern, timeout), **kwargs)

        return matching


class _Unbounded:
    """`re` as patterns.py sees it: it may check a pattern's syntax, never match with it (the
    match would have no bound); one that does is recorded in `record` and fails at once."""

    def __init__(self, record: list[str]):
        self._record = record

    def compile(self, *args, **kwargs):
        re.compile(*args, **kwargs)
        return self

    def __getattr__(self, name):
        if name not in MATCHING:
            return getattr(re, name)

        def matching(*args, **kwargs):
            self._record.append(f"re.{name}: Python's re has no time bound")
            raise AssertionError("matched with Python's re, which has no time bound")

        return matching


class Engine:
    """What patterns.py asks of the regex engine, recorded: the timeout of every match
    (`timeouts`; their sum `allowed` is the most time matching may take) and every match made
    without one, with one above the per-name bound, or with `re` (`unbounded`). Such a match is
    run with the bound in its place, so a broken bound fails the test instead of hanging it."""

    def __init__(self, monkeypatch):
        self.timeouts: list[float] = []
        self.unbounded: list[str] = []
        real = regex.compile
        monkeypatch.setattr(regex, "compile", lambda *args, **kwargs: _Bounded(real(*args, **kwargs), self))
        monkeypatch.setattr(patterns, "re", _Unbounded(self.unbounded))

    def granted(self, pattern: str, timeout) -> float:
        bound = patterns.MATCH_TIMEOUT_S
        if timeout is None or timeout > bound:
            self.unbounded.append(f"{pattern!r} matched with timeout={timeout}, over the bound of {bound} s")
            timeout = bound
        self.timeouts.append(timeout)
        return timeout

    @property
    def allowed(self) -> float:
        return sum(self.timeouts)

    def check(self, most: float = FAST) -> None:
        """Every match was bounded, and all of them together were allowed at most `most` s."""
        assert self.unbounded == [], self.unbounded
        assert self.timeouts, "no name was matched by the bounded engine"
        assert self.allowed <= most, self.timeouts


@pytest.fixture(autouse=True)
def short_bound(monkeypatch):
    monkeypatch.setattr(patterns, "MATCH_TIMEOUT_S", SHORT)


@pytest.fixture
def engine(monkeypatch) -> Engine:
    return Engine(monkeypatch)


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


def refused(outcome, engine: Engine, *fragments):
    """Exit 2 in one line naming the pattern (and `fragments`), after bounded matches that were
    allowed FAST seconds at most in all."""
    line = assert_one_error(outcome, repr(EVIL), "takes more than", *fragments)
    engine.check()
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
def test_a_backtracking_pattern_is_refused_fast_naming_its_origin(case, evil_model, tmp_path, engine):
    args, origin = cli_cases(evil_model, tmp_path)[case]
    refused(invoke(args), engine, origin)
    assert not (tmp_path / "o.onnx").exists()


def test_configuration_patterns_are_bounded(evil_model, tmp_path, monkeypatch, engine):
    """exclude-node of the configuration and a lint suppression's node regex."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "autocast-onnx.toml"
    config.write_text(f'exclude-node = ["{EVIL}"]\n')
    refused(invoke(["convert", evil_model, "-o", tmp_path / "o.onnx"]), engine, "--exclude-node")
    config.write_text(f'suppress = [{{ code = "AC", node = "{EVIL}" }}]\n')
    engine.timeouts.clear()
    refused(invoke(["lint", evil_model]), engine, str(config), "suppression")


def test_the_python_api_is_bounded(evil_model, engine):
    with pytest.raises(AutocastError, match="takes more than"):
        autocast_onnx.convert(str(evil_model), exclude_nodes=[EVIL])
    with pytest.raises(AutocastError, match="takes more than"):
        autocast_onnx.explain(str(evil_model), EVIL)
    engine.check(most=2 * FAST)


def test_nested_repeat_gets_the_right_answer_at_once(plain_model, tmp_path, monkeypatch, engine):
    """'^(a+)+$' matches no node: the answer (an unmatched-selector warning, explain's "no node
    matches"), not a hang; with '|b$' it matches and keeps the node fp32. Each name may take FAST
    seconds here, not SHORT (the answer must not hang on how busy the machine is): a matcher that
    backtracked on it would still be refused, and the test fail."""
    monkeypatch.setattr(patterns, "MATCH_TIMEOUT_S", FAST)
    plan = tmp_path / "plan.json"
    for pattern, precision in ((NESTED, "fp16"), (NESTED + "|b$", "fp32")):
        args = ["convert", plain_model, "-o", tmp_path / "o.onnx", "--plan-out", plan, "--exclude-node", pattern]
        outcome = invoke(args)
        assert_ok(outcome)
        node = json.loads(plan.read_text())["nodes"][0]
        assert node["precision"] == precision, node
        assert ("matches no node" in outcome.stdout) == (precision == "fp16")
    outcome = invoke(["explain", plain_model, NESTED])
    assert outcome.code == 2 and "no node matches" in outcome.stderr
    assert engine.unbounded == [] and engine.timeouts, engine.unbounded


@pytest.mark.slow
def test_the_default_bound_holds_in_a_real_process(evil_model, tmp_path):
    """The refusal names the default bound. The timeout only keeps a hang from stalling the
    suite: nothing here is measured."""
    outcome = run_process(["convert", evil_model, "-o", tmp_path / "o.onnx", "--exclude-node", EVIL], timeout=120)
    assert_one_error(outcome, repr(EVIL), "takes more than", "--exclude-node", f"more than {DEFAULT_BOUND:g} s")


class Scripted:
    """A regex engine and the clock patterns.py reads: every name takes `cost` seconds of the
    clock, and a match whose timeout is shorter gives up (TimeoutError) at its timeout, as the
    regex package does."""

    def __init__(self, cost: float):
        self.cost, self.now, self.timeouts = cost, 0.0, []

    def perf_counter(self) -> float:
        return self.now

    def search(self, name, timeout=None):
        self.timeouts.append(timeout)
        if timeout is not None and timeout < self.cost:
            self.now += timeout
            raise TimeoutError
        self.now += self.cost
        return None


def test_the_budget_bounds_many_slow_names(monkeypatch):
    """Names that each stay under the per-name bound still exhaust the pattern's budget: with
    names of 1/16 s, a budget of 1/4 s and a per-name bound of 10 s, four names are matched and the
    fifth is refused ("in all"), having been allowed only what was left of the budget."""
    monkeypatch.setattr(patterns, "MATCH_TIMEOUT_S", 10.0)
    monkeypatch.setattr(patterns, "PATTERN_BUDGET_S", 0.25)
    scripted = Scripted(cost=1 / 16)
    monkeypatch.setattr(regex, "compile", lambda *args, **kwargs: scripted)
    monkeypatch.setattr(patterns, "time", scripted)
    unbounded: list[str] = []
    monkeypatch.setattr(patterns, "re", _Unbounded(unbounded))
    pattern = patterns.compile_pattern(EVIL, "--exclude-node")
    with pytest.raises(AutocastError, match="in all") as info:
        for _ in range(1000):
            pattern.search("a" * 22 + "b")
    assert info.value.where == "--exclude-node" and unbounded == []
    assert len(scripted.timeouts) == 5 and None not in scripted.timeouts, scripted.timeouts
    assert scripted.now <= patterns.PATTERN_BUDGET_S + 1e-3 + 1e-9, scripted.timeouts  # + the last match's floor


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
