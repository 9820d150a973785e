"""Each validation option is declared once (issue 40, item 2): the fields of Thresholds
(validate/thresholds.py) and of ValidateOptions (validate/options.py) carry what every surface
reads, and the surfaces are held to them here: the command line's flags, types, choices, help
defaults and help groups, the configuration's keys, --target's names, and the Python API's
keywords. A new threshold or validation option without its metadata, or a surface that spells
one differently, fails here."""

from __future__ import annotations

import inspect
import re
from dataclasses import MISSING, fields

import click
import pytest

from autocast_onnx import config
from autocast_onnx.cli.app import OPTION_GROUPS
from autocast_onnx.cli.main import cli
from autocast_onnx.validate.options import (
    GENERATING,
    TARGET_KEYS,
    THRESHOLD_BOUNDS,
    ValidateOptions,
    option_fields,
)
from autocast_onnx.validate.thresholds import PER_OUTPUT_KEYS, THRESHOLDS, Thresholds, threshold_fields

VALIDATING = ("validate", "convert", "check")  # the commands with the validation option group


def params(command: str) -> dict[str, click.Parameter]:
    return {p.name: p for p in cli.commands[command].params if p.name}


def default_of(declared):
    return declared.default_factory() if declared.default is MISSING else declared.default


def test_every_threshold_carries_its_metadata():
    names = [f.name for f in fields(Thresholds) if f.name != "per_output"]
    assert names == list(THRESHOLDS) and len(names) >= 6
    for declared in threshold_fields():
        assert set(declared.metadata) == {"bounds", "target", "per_output", "help"}, declared.name
        low, high = declared.metadata["bounds"]
        assert low < high and declared.metadata["help"].strip()
        default = declared.default
        assert default is None or low <= default <= high, declared.name


def test_every_validation_option_carries_its_metadata():
    declared = {f.name for f in option_fields()}
    assert declared == {f.name for f in fields(ValidateOptions)} - {"thresholds"}
    for option in option_fields():
        meta = option.metadata
        assert meta["flag"].startswith("--") and not (meta["count"] and meta["choices"]), option.name
        if meta["count"]:
            low, high = meta["count"]
            assert low <= default_of(option) <= high, option.name
        if meta["choices"]:
            assert meta["choices"][0] == default_of(option), option.name
        assert (meta["key"] is None) == (meta["section"] is None), option.name


def test_the_derived_tables_follow_the_fields():
    assert THRESHOLD_BOUNDS == {f.name: f.metadata["bounds"] for f in threshold_fields()}
    assert PER_OUTPUT_KEYS == tuple(f.name for f in threshold_fields() if f.metadata["per_output"])
    for declared in threshold_fields():
        alias = declared.metadata["target"]
        if alias is not None:
            assert TARGET_KEYS[alias] == TARGET_KEYS[declared.name] == declared.name
        else:
            assert declared.name not in TARGET_KEYS
    assert set(THRESHOLDS) <= set(config.ALL_KEYS)
    assert {f.metadata["key"] for f in option_fields() if f.metadata["key"]} <= set(config.ALL_KEYS)
    assert GENERATING == ("dims", "ranges", "batches", "seed")
    unset = Thresholds.unset()
    assert all(getattr(unset, f.name) is None for f in threshold_fields() if f.metadata["target"])


@pytest.mark.parametrize("command", VALIDATING)
def test_the_command_lines_threshold_flags_and_help_defaults_are_the_fields(command):
    given = params(command)
    for declared in threshold_fields():
        option = given[declared.name]
        assert option.opts == ["--" + declared.name.replace("_", "-")]
        shown = "off" if declared.default is None else f"{declared.default:g}"
        assert option.help.startswith(f"{declared.metadata['help']} [{shown}].")


@pytest.mark.parametrize("command", VALIDATING)
def test_the_command_lines_counts_and_choices_are_the_fields(command):
    given = params(command)
    for option in option_fields():
        name = {"dims": "dims", "ranges": "ranges"}.get(option.name, option.name)
        if name not in given:
            continue
        param = given[name]
        assert option.metadata["flag"] in param.opts or any(o.startswith(option.metadata["flag"]) for o in param.opts)
        if option.metadata["count"]:
            low, high = option.metadata["count"]
            assert (param.type.min, param.type.max) == (low, high), option.name
            default = default_of(option)
            # the help's default is the field's: shown by click, or written "[default: N, ...]"
            assert param.default == default or re.search(rf"\[default: {default}\b", param.help or ""), option.name
        if option.metadata["choices"]:
            assert tuple(param.type.choices) == option.metadata["choices"] and param.default == default_of(option)


def test_every_threshold_is_in_a_help_group():
    grouped = dict(OPTION_GROUPS)["Accuracy thresholds"]
    assert set(THRESHOLDS) <= set(grouped)


def test_the_python_api_takes_every_threshold_as_a_keyword():
    from autocast_onnx.api import check
    from autocast_onnx.validate.api import validate

    for function in (validate, check):
        assert set(THRESHOLDS) <= set(inspect.signature(function).parameters), function.__name__
