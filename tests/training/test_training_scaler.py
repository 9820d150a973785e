"""Dynamic loss scaling (autocast_onnx.training.DynamicLossScaler): growth after a run of finite
steps, backoff and skip on a non-finite step, the bounds, and checkpointing of its state."""

from __future__ import annotations

import math

import pytest

from autocast_onnx import AutocastError
from autocast_onnx.training import DynamicLossScaler


def test_defaults_follow_the_mixed_precision_guides():
    s = DynamicLossScaler()
    assert (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval) == (2.0**16, 2.0, 0.5, 2000)
    assert (s.min_scale, s.max_scale) == (1.0, 2.0**24)
    assert s.inverse == 2.0**-16


def test_scale_doubles_after_growth_interval_finite_steps():
    s = DynamicLossScaler(init_scale=8.0, growth_interval=3)
    assert [s.update(True) for _ in range(2)] == [True, True] and s.scale == 8.0
    assert s.update(True) and s.scale == 16.0 and s.good_steps == 0
    for _ in range(3):
        s.update(True)
    assert s.scale == 32.0


def test_non_finite_step_is_skipped_halves_the_scale_and_restarts_the_count():
    s = DynamicLossScaler(init_scale=64.0, growth_interval=3)
    s.update(True)
    s.update(True)
    assert s.update(False) is False
    assert s.scale == 32.0 and s.good_steps == 0 and s.skipped_steps == 1 and s.steps == 3
    s.update(True)
    s.update(True)
    assert s.scale == 32.0  # the two finite steps before the overflow do not count
    s.update(True)
    assert s.scale == 64.0


def test_bounds_hold_and_the_scale_stays_a_power_of_two():
    s = DynamicLossScaler(init_scale=4.0, growth_interval=1, max_scale=16.0)
    for _ in range(10):
        s.update(True)
    assert s.scale == 16.0
    for _ in range(10):
        assert s.update(False) is False
    assert s.scale == 1.0 and s.skipped_steps == 10
    assert math.log2(s.scale).is_integer()


def test_state_round_trip_resumes_where_it_stopped():
    a = DynamicLossScaler(growth_interval=5)
    for finite in (True, True, False, True):
        a.update(finite)
    b = DynamicLossScaler(growth_interval=5)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    for finite in (True, True, True, True):
        assert a.update(finite) == b.update(finite)
    assert a.scale == b.scale == 2.0**16


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"init_scale": 0}, "init_scale must be a finite number > 0"),
        ({"init_scale": float("nan")}, "init_scale must be a finite number > 0"),
        ({"init_scale": 2.0**30}, "init_scale must lie in"),
        ({"growth_factor": 1.0}, "growth_factor must be > 1"),
        ({"backoff_factor": 1.5}, "backoff_factor must be in"),
        ({"growth_interval": 0}, "growth_interval must be a whole number"),
        ({"growth_interval": 2.5}, "growth_interval must be a whole number"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(AutocastError, match=message):
        DynamicLossScaler(**kwargs)


def test_bad_state_is_refused():
    s = DynamicLossScaler()
    with pytest.raises(AutocastError, match="not a loss-scaler state"):
        s.load_state_dict({"scale": 2.0})
    with pytest.raises(AutocastError, match="out of range"):
        s.load_state_dict({"scale": 2.0**40, "good_steps": 0, "steps": 0, "skipped_steps": 0})
