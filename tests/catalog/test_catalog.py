"""Rule catalog: the default profile covers every reference op exactly once, and the loader
rejects bad files with file:line."""

import csv
from pathlib import Path

import pytest

from autocast_onnx.catalog import CATEGORIES, load_rules
from autocast_onnx.catalog.loader import default_rules_path
from autocast_onnx.errors import AutocastError

REFERENCE = Path(__file__).resolve().parents[2] / "reference" / "onnx_op_categories.csv"
DEFAULT = default_rules_path()


def reference_rows():
    # The table is vendored in reference/: a missing table is a broken checkout, not a reason
    # to check against something weaker.
    assert REFERENCE.is_file(), f"{REFERENCE} is missing"
    with REFERENCE.open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_default_profile_covers_every_reference_op_once():
    rules = load_rules()
    rows = reference_rows()
    missing = [
        (r["domain"], r["onnx_op"])
        for r in rows
        if rules.op_rule("" if r["domain"] == "ai.onnx" else r["domain"], r["onnx_op"]) is None
    ]
    assert not missing
    # "exactly one category" is enforced by the loader (an op in two categories is an error), so
    # loading the default without error plus full coverage proves it.
    assert len(rules.ops) >= len(rows)


@pytest.mark.parametrize(
    "op,category",
    [
        ("MatMul", "low_precision"),
        ("Gemm", "low_precision"),
        ("Conv", "low_precision"),
        ("ConvTranspose", "low_precision"),
        ("Einsum", "low_precision"),
        ("LSTM", "low_precision"),
        ("GRU", "low_precision"),
        ("RNN", "low_precision"),
        ("Attention", "low_precision"),
        ("Add", "follow"),
        ("Mul", "follow"),
        ("Relu", "follow"),
        ("Gelu", "follow"),
        ("Softmax", "keep_fp32"),
        ("LogSoftmax", "keep_fp32"),
        ("LayerNormalization", "keep_fp32"),
        ("BatchNormalization", "follow"),
        ("InstanceNormalization", "keep_fp32"),
        ("GroupNormalization", "keep_fp32"),
        ("RMSNormalization", "keep_fp32"),
        ("SimplifiedLayerNormalization", "keep_fp32"),
        ("ReduceMean", "keep_fp32"),
        ("ReduceSum", "keep_fp32"),
        ("ReduceMax", "keep_fp32"),
        ("ReduceMin", "keep_fp32"),
        ("ReduceL2", "keep_fp32"),
        ("ReduceLogSumExp", "keep_fp32"),
        ("Exp", "keep_fp32"),
        ("Log", "keep_fp32"),
        ("Pow", "keep_fp32"),
        ("Sqrt", "keep_fp32"),
        ("Reciprocal", "keep_fp32"),
        ("CumSum", "keep_fp32"),
        ("SoftmaxCrossEntropyLoss", "keep_fp32"),
        ("NegativeLogLikelihoodLoss", "keep_fp32"),
        ("RandomNormal", "keep_fp32"),
        ("RandomUniformLike", "keep_fp32"),
        ("Multinomial", "keep_fp32"),
        ("Reshape", "clear"),
        ("Transpose", "clear"),
        ("Gather", "clear"),
        ("Slice", "clear"),
        ("Concat", "clear"),
        ("Split", "clear"),
        ("Squeeze", "clear"),
        ("Unsqueeze", "clear"),
        ("Identity", "clear"),
        ("Flatten", "clear"),
        ("Expand", "clear"),
        ("Pad", "clear"),
        ("And", "non_float"),
        ("BitShift", "non_float"),
        ("MatMulInteger", "non_float"),
        ("com.microsoft:SkipLayerNormalization", "keep_fp32"),
        ("com.microsoft:Attention", "low_precision"),
        ("com.microsoft:FusedMatMul", "low_precision"),
        ("com.microsoft:BiasGelu", "follow"),
    ],
)
def test_default_categories(op, category):
    domain, _, name = op.rpartition(":")
    assert load_rules().op_rule(domain, name).category == category


def test_default_departures_say_why():
    rules = load_rules()
    for op in ("Sqrt", "ReduceMax", "ReduceMin"):
        assert "departs from" in rules.op_rule("", op).why
    # a default changed on measured evidence says what was measured and where
    why = rules.op_rule("", "BatchNormalization").why
    assert "Measured" in why and "bench_rules.py" in why and "Was keep_fp32" in why


def test_unknown_op_default_is_stated_and_safe():
    rules = load_rules()
    assert rules.unknown_op.category == "keep_fp32"
    assert rules.unknown_op.source.file == "rules/default.toml"
    assert rules.unknown_op.source.line > 0


def test_rule_sources_point_at_the_defining_line():
    rules = load_rules()
    source = rules.op_rule("", "Softmax").source
    line = DEFAULT.read_text().splitlines()[source.line - 1]
    assert line.startswith("Softmax =")


def test_resize_scales_and_roi_are_pinned():
    pin = load_rules().pin("", "Resize")
    assert pin.inputs == (1, 2)


def write(tmp_path, text, name="user.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_user_file_overrides_default_category(tmp_path):
    user = write(tmp_path, '[ops.follow]\nSoftmax = "we accept fp16 softmax here"\n')
    rules = load_rules([user])
    assert rules.op_rule("", "Softmax").category == "follow"
    assert rules.op_rule("", "Softmax").source.file == str(user)
    assert rules.op_rule("", "Softmax").source.line == 2


def test_later_user_file_wins(tmp_path):
    a = write(tmp_path, '[ops.follow]\nSoftmax = "a"\n', "a.toml")
    b = write(tmp_path, '[ops.keep_fp32]\nSoftmax = "b"\n', "b.toml")
    assert load_rules([a, b]).op_rule("", "Softmax").category == "keep_fp32"
    assert load_rules([b, a]).op_rule("", "Softmax").category == "follow"


def test_user_changes_unknown_default_and_thresholds(tmp_path):
    user = write(tmp_path, '[settings]\nunknown_op = "follow"\n[thresholds]\nmax_flush_fraction = 0.5\n')
    rules = load_rules([user])
    assert rules.unknown_op.category == "follow"
    assert rules.thresholds["max_flush_fraction"] == 0.5


BAD = [
    ('[opz.follow]\nAdd = "x"\n', 1, "unknown table or key 'opz'"),
    ('[ops.follow]\nAdd = "x"\n[ops.keep_fp32]\nAdd = "y"\n', 4, "op 'Add' is in two categories"),
    ('[ops.fast]\nAdd = "x"\n', 1, "unknown category"),
    ("[ops.follow]\nAdd = 3\n", 2, "must map to a string"),
    ('[ops.follow]\n"bad op!" = "x"\n', 2, "is not an op name"),
    ('[settings]\nunknown_op = "fp8"\n', 2, "settings.unknown_op must be one of"),
    ('[settings]\ncolour = "red"\n', 2, "unknown key 'settings.colour'"),
    ("[thresholds]\nmax_flush_fraction = 2.0\n", 2, "threshold 'max_flush_fraction'"),
    ('[thresholds]\nsmall_constant_elements = "many"\n', 2, "threshold 'small_constant_elements'"),
    ('\n[[nodes]]\nmatch = "([a-z"\nprecision = "fp32"\n', 2, "bad regex"),
    ('[[nodes]]\nmatch = "x"\nprecision = "fast"\n', 1, "precision must be"),
    ('[[nodes]]\nprecision = "fp32"\n', 1, "exactly one of 'match'"),
    ('[[nodes]]\nname = "a"\nprecision = "fp32"\nflavour = 1\n', 4, "unknown key 'flavour'"),
    ('[pins]\nResize = { inputs = ["scales"] }\n', 2, "must be a list of port indices"),
    ('[ops.follow\nAdd = "x"\n', 1, "invalid TOML"),
]


@pytest.mark.parametrize("text,line,message", BAD)
def test_bad_rule_files_name_file_and_line(tmp_path, text, line, message):
    user = write(tmp_path, text)
    with pytest.raises(AutocastError) as info:
        load_rules([user])
    assert info.value.where == f"{user}:{line}"
    assert message in info.value.what


def test_missing_rule_file(tmp_path):
    with pytest.raises(AutocastError, match="rule file not found"):
        load_rules([tmp_path / "nope.toml"])


def test_every_default_entry_has_a_reason():
    rules = load_rules()
    assert all(rule.why.strip() for rule in rules.ops.values())
    assert {r.category for r in rules.ops.values()} == set(CATEGORIES)
