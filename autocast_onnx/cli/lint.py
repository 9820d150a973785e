"""`autocast-onnx lint` (models, or folders of them; -j at once) and `autocast-onnx rules` (the
lint checks)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..errors import AutocastError
from .app import GroupedCommand
from .groups import (
    PATH,
    TEXT,
    _echo,
    _jobs_without_effect,
    _plan_from,
    _setup,
    _write_or_echo,
    config_option,
    jobs_option,
    lint_options_group,
    plan_options_group,
    verbose_option,
)
from .guard import EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, _say, run_guarded


def _expand_models(models) -> tuple[list[Path], list[str]]:
    """The model files to lint: files as given, folders searched for *.onnx (sorted); and one
    error line per argument that gives none."""
    paths: list[Path] = []
    errors: list[str] = []
    for m in models:
        p = Path(m)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*.onnx") if f.is_file())
            if not found:
                errors.append(
                    AutocastError("folder holds no .onnx file", str(p), "pass model files or a folder of them").line()
                )
            paths.extend(found)
        else:
            paths.append(p)
    return paths, errors


def selected_any(checks, selector: str) -> bool:
    from ..lint.engine import selected

    try:
        return bool(selected(checks, [selector], ()))
    except AutocastError:
        return False


def _colour() -> bool:
    """Colour on a terminal, unless NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


@click.command(cls=GroupedCommand)
@click.argument("models", nargs=-1, required=True, type=PATH)
@click.option(
    "--format",
    "--output-format",
    "fmt",
    type=click.Choice(["text", "json", "sarif"]),
    default="text",
    show_default=True,
    help="Report format (--output-format is the same option).",
)
@click.option("-o", "--output", type=PATH, help="Write the report here instead of stdout ('-': stdout).")
@click.option("--statistics", is_flag=True, help="Count the findings per check instead of listing them.")
@click.option(
    "--exit-zero", is_flag=True, help="Exit 0 even with findings at or above --fail-on (input errors exit 2)."
)
@click.option(
    "--show-protected",
    is_flag=True,
    help="fp32 models: list the findings the conversion rules protect (info) instead of counting them in one line.",
)
@jobs_option
@lint_options_group
@plan_options_group(keep_io=False)
@config_option
@verbose_option
def lint(
    models, fmt, output, statistics, exit_zero, show_protected, jobs, select, ignore, fail_on, config, verbose, **kw
):
    """Find numerically unsafe low-precision ops in MODELS: files, or folders searched for .onnx
    files (converted models, or fp32 models as if converted).

    For fp32 models, --precision is the type to check against and the plan options decide which
    findings the conversion protects (reported as info, counted in one line unless --show-protected).
    A model that cannot be read is reported on stderr and the others are linted; so is one whose
    linting fails unexpectedly. With several models, -j of them are linted at once.

    Exit codes: 0 no finding at or above --fail-on, 1 findings, 2 usage or input error (also when
    any model could not be read), 3 internal error (also when linting any model failed unexpectedly)."""
    from dataclasses import replace

    from ..lint.report import lint_json, lint_statistics, lint_text, sarif_json

    bad_inputs: list[str] = []
    internal: list[str] = []

    def body(written):
        from ..io import check_outputs
        from ..lint.engine import lint_options

        settings, config_file = _setup(config, verbose)
        plan = _plan_from(settings, kw)
        options = lint_options(
            settings,
            select=select,
            ignore=ignore,
            fail_on=fail_on,
            plan=plan,
            precision_given=bool(kw.get("precision") or settings.get("precision")),
        )
        paths, errors = _expand_models(models)
        bad_inputs.extend(errors)
        existing = [p for p in paths if p.exists()]
        check_outputs([("-o", output)], [*existing, config_file, *options.rules], model_inputs=existing)
        written.track(output)
        many = len(paths) > 1
        if many:
            # configuration suppressions are judged over all the models together
            options = replace(options, report_unused_config=False)
        if not many:
            _jobs_without_effect(jobs)
        results = _lint_each(paths, options, jobs, bad_inputs, internal)
        if many and results:
            from ..lint.engine import unused_config_suppressions

            results[-1].diagnostics.extend(unused_config_suppressions(results, options))
        if statistics:
            text = lint_statistics(results, fmt)
        elif fmt == "json":
            text = lint_json(results)
        elif fmt == "sarif":
            text = sarif_json([d for r in results for d in r.diagnostics])
        else:
            text = lint_text(
                results,
                show_protected=show_protected,
                colour=output is None and _colour(),
                verbose=verbose,
                rules=options.rules,
            )
        if results or fmt != "text":
            _write_or_echo(text, output)
        return any(r.failed(options.fail_on) for r in results)

    failed = run_guarded(
        body,
        doing="linting",
        subject=", ".join(str(m) for m in models[:3]) + (f" and {len(models) - 3} more" if len(models) > 3 else ""),
    )
    for line in bad_inputs + internal:
        _say("error", line)
    if internal:
        sys.exit(EXIT_INTERNAL)
    if bad_inputs:
        sys.exit(EXIT_INPUT)
    sys.exit(EXIT_FAIL if failed and not exit_zero else EXIT_OK)


def _lint_each(paths, options, jobs, bad_inputs: list, internal: list) -> list:
    """Lint each model (-j at once, cli/batch.py): the results of those linted, in order; a
    model that cannot be read adds its line to `bad_inputs`, one whose linting failed
    unexpectedly to `internal`. One model is linted here, its unexpected error the command's."""
    from functools import partial

    from ..lint import lint as run_lint
    from . import batch

    if len(paths) == 1:
        try:
            return [run_lint(paths[0], options)]
        except AutocastError as exc:
            bad_inputs.append(exc.line())
            return []
    # on stderr, at a terminal only: lint's stderr otherwise holds its error lines alone
    progress = batch.Progress(len(paths), enabled=batch.interactive())
    outcomes = batch.run_all(
        partial(_lint_one, options=options),
        paths,
        jobs=jobs or batch.default_jobs(),
        doing="linting",
        subjects=paths,
        done=lambda k, outcome: progress(paths[k], outcome),
    )
    progress.finish()
    for outcome in outcomes:
        if outcome.code == batch.EXIT_INPUT:
            bad_inputs.append(outcome.error)
        elif outcome.code == batch.EXIT_INTERNAL:
            internal.append(outcome.error)
    return [o.value for o in outcomes if o.value is not None]


def _lint_one(path, options):
    """One model of lint's batch: its LintResult as a batch.Outcome."""
    from ..lint import lint as run_lint
    from . import batch

    return batch.Outcome(batch.EXIT_OK, run_lint(path, options))


@click.command("rules", cls=GroupedCommand)
@click.argument("codes", nargs=-1, type=TEXT)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "json"]),
    default="text",
    show_default=True,
    help="text: one line per check (in full with CODES); markdown: the docs/rules.md page; json: every field.",
)
def rules_cmd(codes, fmt) -> None:
    """List the lint checks: code, name, severity, summary (markdown: the docs/rules.md page).

    With CODES (codes, code prefixes or names, e.g. `rules AC101` or `rules masking-constant`):
    each matching check in full - why it matters, how to fix it, an example."""
    import json as _json

    from ..lint.catalog import load_checks
    from ..lint.engine import selected
    from ..lint.report import rule_text, rules_markdown, rules_text

    def body(written):
        checks = list(load_checks())
        if codes:
            unknown = [c for c in codes if not selected_any(checks, c)]
            if unknown:
                raise AutocastError(
                    f"no check has the code or name {', '.join(repr(c) for c in unknown)}",
                    "rules",
                    "`autocast-onnx rules` lists them all",
                )
            checks = selected(checks, codes, ())
        if fmt == "markdown":
            _echo(rules_markdown(checks if codes else None), nl=False)
        elif fmt == "json":
            _echo(
                _json.dumps(
                    [
                        {
                            "code": c.code,
                            "name": c.name,
                            "severity": c.severity,
                            "summary": c.summary,
                            "why": " ".join(c.why.split()),
                            "fix": c.fix,
                            "kind": c.kind,
                        }
                        for c in checks
                    ],
                    indent=1,
                )
            )
        elif codes:
            _echo("\n\n".join(rule_text(c) for c in checks))
        else:
            _echo(rules_text())

    run_guarded(body, doing="listing the lint checks")
