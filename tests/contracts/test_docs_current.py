"""The documented example outputs and option lists match the program (tools/docs_examples.py):
the ```sh examples of docs/summary.md and docs/lint.md print what their ```text blocks show
(timings masked), and the usage blocks of README.md and docs/lint.md give only options the
commands have and leave none of them unmentioned. Refresh the outputs with
`python tools/docs_examples.py --write` and review the diff."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))

import docs_examples  # noqa: E402


@pytest.mark.parametrize("page", docs_examples.USAGE_PAGES)
def test_usage_blocks_match_the_commands_options(page):
    assert docs_examples.check_usage(page) == []


@pytest.mark.slow
@pytest.mark.parametrize("page", docs_examples.PAGES)
def test_documented_example_outputs_are_what_the_commands_print(page):
    drifted = docs_examples.check_examples(page)
    assert not drifted, "\n\n".join(drifted)


def test_the_check_fails_on_a_drifted_output_and_an_unknown_option(tmp_path, monkeypatch):
    """The check can fail: a page whose shown output and usage block are wrong."""
    page = tmp_path / "page.md"
    page.write_text(
        "```\nautocast-onnx rules [--format text|json] [--no-such-option]\n```\n\n"
        "```sh\necho hello\n```\n\n```text\ngoodbye\n```\n"
    )
    monkeypatch.setattr(docs_examples, "ROOT", tmp_path)
    (tmp_path / "examples").mkdir()
    assert docs_examples.check_usage("page.md") == ["page.md:2: rules has no option --no-such-option"]
    drifted = docs_examples.check_examples("page.md")
    assert len(drifted) == 1 and "-goodbye" in drifted[0] and "+hello" in drifted[0]
    docs_examples.check_examples("page.md", write=True)
    assert "```text\nhello\n```" in page.read_text() and docs_examples.check_examples("page.md") == []
