"""`autocast-onnx explain`: which precision a node gets and why, and the plan's fp32 islands."""

from __future__ import annotations

from typing import Any

import click

from ..errors import AutocastError, printable_lines
from .app import GroupedCommand
from .groups import PATH, TEXT, _echo, _plan_from, _setup, config_option, plan_options_group, verbose_option
from .guard import run_guarded


def _island_costs(model, plan, measured, kw, settings) -> dict:
    """The conversion `explain --islands` prices its islands on ({"plan": ..., island number: cost, "gpu": ...})."""
    from ..pipeline import convert
    from ..report.speed import island_costs
    from ..roofline import gpu

    flag = kw.get("gpu")
    chosen = gpu(
        flag if flag is not None else settings.get("gpu"), "--gpu" if flag is not None else "gpu (configuration)"
    )
    result = convert(model, calibration=measured.calibration, options=plan, check="none")
    return {"plan": result.plan, "gpu": chosen.key, "result": result, **island_costs(result, chosen.key)}


def _islands_text(plan, replayed: bool, costs: dict | None = None) -> str:
    """`explain --islands`: each fp32 island of the plan with its causes, one per line, and with
    `costs` (report/speed.island_costs) what each island's kernels and Casts are estimated to take."""
    if replayed:
        return "a plan read from a file lists no islands: explain the model without --plan"
    if not plan.islands:
        return f"no fp32 islands: every node that computes in floating point runs {plan.target} or keeps its type"
    costs = costs or {}
    priced = f", estimated on {costs['gpu']} (an estimate: docs/summary.md)" if "gpu" in costs else ""
    lines = [f"{len(plan.islands)} fp32 island(s){priced}"]
    for island in plan.islands:
        ops = ", ".join(f"{o} {n}" for o, n in island.ops.items())
        cost = costs.get(island.number)
        said = (
            f"; its kernels and Casts take {cost['us']:.1f} us ({cost['share']:.0%} of the model), "
            f"the Casts {cost['cast_us']:.1f} us"
            if cost
            else ""
        )
        lines.append(f"island {island.number}: {len(island.nodes)} nodes ({ops}){said}")
        for cause in island.causes or []:
            lines.append(f"  - [{cause.kind}] {cause.node}: {cause.text}")
        if not island.causes:
            lines.append("  - no cause of its own found (report it: every island should name one)")
    return printable_lines(lines)


@click.command(cls=GroupedCommand)
@click.argument("model", type=PATH)
@click.argument("node", type=TEXT, required=False)
@click.option("--op", "op_type", type=TEXT, help="Explain every node of this op type (OpType or domain:OpType).")
@plan_options_group()
@click.option(
    "--plan",
    "plan_file",
    type=PATH,
    help="Explain this plan (written by --plan-out, maybe edited; it must belong to MODEL) instead of planning: "
    "each node's reasons as the file gives them, an edited node marked.",
)
@click.option("--calibration-data", type=PATH, help="Measure tensor ranges on this data first.")
@click.option(
    "--islands",
    is_flag=True,
    help="List the plan's fp32 islands (connected fp32 regions), each with what keeps it fp32: a range the graph "
    "bounds or calibration measured, a model output, a rule, the search, or arithmetic no low-precision kernel gives; "
    "and what its kernels and Casts are estimated to take on the GPU.",
)
@click.option(
    "--gpu",
    type=TEXT,
    default=None,
    help="With --islands: the GPU of the estimate (H100, H200, A100, L4, L40S, RTX4090, RTX3060, Orin) "
    "[default: H100, or the configuration's gpu].",
)
@click.option(
    "--frontier",
    is_flag=True,
    help="With --islands: the islands from cheapest to dearest, each with the error it buys (the model run with "
    "fp16 numerics emulated on generated inputs, with and without the island low; needs ONNX Runtime).",
)
@config_option
@verbose_option
def explain(model, node, op_type, plan_file, calibration_data, islands, frontier, config, verbose, **kw) -> None:
    """Say which precision NODE of MODEL gets and why: the rules that fired (file:line) and
    measured values. NODE is a node name, #ID for the plan's node id, or a regex (when it has
    regex characters such as . * [ ^; re.search) explaining every node whose name matches;
    --op TYPE explains every node of that op type (with NODE: those that match both). With
    --plan FILE, the plan that `convert --plan FILE` would apply: a node the file edits says so."""
    import re

    from ..pipeline import plan_model
    from ..plan.model import looks_like_regex
    from ..validate.on_data import plan_on_data

    def select(plan) -> list:
        if op_type is not None and not plan.find(op=op_type):
            raise AutocastError(
                f"no node has op type {op_type!r}",
                str(model),
                "check the op type; --plan-out of convert lists the nodes",
            )
        try:
            found = plan.find(node, op_type)
        except re.error as exc:
            raise AutocastError(f"bad regex {node!r}: {exc}", str(model), "fix the pattern") from None
        if found:
            return found
        if node.startswith("#") and node[1:].isdigit():
            raise AutocastError(f"no node {node}", str(model), f"ids run from #0 to #{len(plan.nodes) - 1}")
        import difflib

        names = [e.name for e in plan.find(op=op_type) if e.name]
        close = difflib.get_close_matches(node, names, n=3, cutoff=0.5)
        raise AutocastError(
            ("no node matches" if looks_like_regex(node) else "no node named")
            + f" {node!r}"
            + (f" among the {op_type!r} nodes" if op_type else ""),
            str(model),
            ("did you mean " + ", ".join(repr(c) for c in close) + "?")
            if close
            else "use a node name, a regex or #ID; --plan-out of convert lists the nodes",
        )

    def body(written):
        if node is None and op_type is None and not islands:
            raise AutocastError(
                "say which node: give NODE (a name, regex or #ID), --op TYPE or --islands", None, "see --help"
            )
        settings, _ = _setup(config, verbose)
        plan = _plan_from(settings, kw)
        if plan_file is not None:
            if calibration_data is not None:
                raise AutocastError(
                    "--calibration-data cannot be combined with --plan: the plan already decides every node",
                    str(plan_file),
                    "drop --calibration-data, or plan afresh without --plan",
                )
            from ..pipeline import replay_model

            planned = replay_model(model, plan_file, options=plan)  # checked as convert --plan checks it
        else:
            measured = plan_on_data(model, plan, calibration_data=calibration_data)
            # only the plan is read: no rewrite
            planned = plan_model(model, calibration=measured.calibration, options=plan)
        if frontier and not (islands and plan_file is None):
            raise AutocastError("--frontier needs --islands (and no --plan)", "--frontier", "add --islands")
        if islands and node is None and op_type is None:
            costs = _island_costs(model, plan, measured, kw, settings) if plan_file is None else {}
            _echo(_islands_text(planned.plan if plan_file is not None else costs["plan"], plan_file is not None, costs))
            if frontier:
                from ..validate.frontier import frontier as islands_frontier
                from ..validate.frontier import frontier_text

                rows = islands_frontier(model, costs["result"], plan, costs["gpu"])
                _echo(frontier_text(rows, costs["gpu"]))
            return
        if kw.get("gpu") is not None:
            raise AutocastError("--gpu has no effect without --islands", "--gpu", "add --islands or drop --gpu")
        entries = select(planned.plan)
        from ..rewrite.provenance import describe, examine

        index: Any = planned.index  # a GraphIndex: the model as planned (its metadata as read)
        found, unreadable = examine(index.model)
        if found is not None:  # a converted model says how it was made (warning of what cannot be read)
            _echo(describe(model, found, unreadable))
        if len(entries) > 1:
            _echo(f"{len(entries)} nodes match")
        member = {i: island for island in planned.plan.islands for i in island.nodes} if entries else {}
        for entry in entries:
            _echo(entry.explain())
            if entry.id in member:
                _echo(printable_lines(["  " + member[entry.id].text()]))

    run_guarded(
        body, doing="explaining", subject=f"{'node ' + repr(node) if node else 'op ' + repr(op_type)} of {model}"
    )
