"""docs/rules.md is generated from rules/lint.toml and must stay in sync with it."""

from pathlib import Path

from click.testing import CliRunner

from autocast_onnx.cli.main import cli
from autocast_onnx.lint.catalog import load_checks

ROOT = Path(__file__).resolve().parents[2]


def test_docs_rules_md_matches_the_catalog():
    generated = CliRunner().invoke(cli, ["rules", "--format", "markdown"]).output
    assert (ROOT / "docs" / "rules.md").read_text() == generated, (
        "docs/rules.md is stale: run `autocast-onnx rules --format markdown > docs/rules.md`"
    )


def test_every_check_is_documented_with_why_and_fix():
    text = (ROOT / "docs" / "rules.md").read_text()
    checks = load_checks()
    assert len({c.code for c in checks}) == len(checks)
    for c in checks:
        assert f"## {c.code} {c.name}" in text
        assert c.why.split()[0] in text and c.fix in text


def test_rules_command_lists_every_code():
    out = CliRunner().invoke(cli, ["rules"]).output
    assert [line.split()[0] for line in out.splitlines()] == [c.code for c in load_checks()]
