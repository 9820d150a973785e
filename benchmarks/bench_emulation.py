"""Validation speed on a BERT-base-sized encoder: is fp16 emulation on CPU fast enough?

Builds, with onnx.helper only (no torch), a BERT-base-shaped encoder with random weights
(12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30522, 512 positions: ~110M parameters,
~440 MB in fp32) in a temporary folder, converts it to fp16 with autocast_onnx.convert, then
times side by side in one run, on the CPU, one batch of generated inputs (the same batch that
`validate` generates):

  (a) reference   ONNX Runtime CPU, fp32 model, default graph optimizations;
  (b) fp16 plain  ONNX Runtime CPU, the converted fp16 model as is (CPU adds its own casts);
  (c) emulated    the emulation model of the converted model (validate.emulate.emulation_model)
                  in a CPU session with graph optimizations disabled, exactly as validate() runs it;
  (d) validate()  the whole call with speed=False: load both files, build the emulation model,
                  create both sessions, generate inputs, run, compare.

It prints seconds per run (best of --repeat, after one untimed warm-up run for (a)-(c)), the
ratio of each row to the reference, the one-off costs (session creation, emulation-model
build), and the error of the emulated output against the fp32 reference.

With --profile it adds diagnostic rows to explain a slow emulated run: the emulation model
with ORT's graph optimizations enabled, the reference with them disabled, and per-op-type
time from ORT's own profiler for the reference and the emulated run.

    python benchmarks/bench_emulation.py [--batch 4] [--seq 128] [--repeat 3] [--profile]

Nothing is written outside the temporary folder; the model is never committed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx
from autocast_onnx.validate import runner
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.emulate import emulation_model
from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

FLOAT32_MIN = float(np.finfo(np.float32).min)  # -3.4028235e38, what torch exports use


def bert_encoder(
    layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, positions=512, mask_style="where", seed=0, scale=0.02
) -> onnx.ModelProto:
    """A BERT-like encoder graph in the shape a PyTorch export has: embeddings (word + position +
    token type 0) + LayerNorm, then `layers` post-LN blocks of eager attention and an Erf GELU FFN.
    Inputs input_ids, attention_mask: int64 [batch, sequence]; output last_hidden_state
    float32 [batch, sequence, hidden]. Attention mask -> additive bias [batch, 1, 1, sequence]:
    mask_style 'where' is Where(mask == 0, float32 lowest, 0.0); 'minus10000' is
    (1 - mask) * -10000.0 (older exports)."""
    assert hidden % heads == 0
    head = hidden // heads
    rng = np.random.default_rng(seed)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name, shape, kind="normal"):
        if kind == "normal":
            arr = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        elif kind == "bias":
            arr = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale / 2)
        else:  # LayerNorm scale around 1
            arr = 1.0 + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.05)
        inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
        return name

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(op, inputs, name, **attrs):
        out = name + "_output_0"
        nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    # embeddings
    word = weight("embeddings.word_embeddings.weight", (vocab, hidden))
    pos = weight("embeddings.position_embeddings.weight", (positions, hidden))
    tok = weight("embeddings.token_type_embeddings.weight", (2, hidden))
    const("one_i64", 1, np.int64)
    const("zero_i64", 0, np.int64)
    const("axes_0", [0], np.int64)
    shape = node("Shape", ["input_ids"], "/embeddings/Shape")
    seq = node("Gather", [shape, "one_i64"], "/embeddings/Gather_seq", axis=0)
    position_ids = node("Range", ["zero_i64", seq, "one_i64"], "/embeddings/Range")
    position_ids = node("Unsqueeze", [position_ids, "axes_0"], "/embeddings/Unsqueeze")
    x = node("Gather", [word, "input_ids"], "/embeddings/word_embeddings/Gather", axis=0)
    p = node("Gather", [pos, position_ids], "/embeddings/position_embeddings/Gather", axis=0)
    t = node("Gather", [tok, "zero_i64"], "/embeddings/token_type_embeddings/Gather", axis=0)
    x = node("Add", [x, t], "/embeddings/Add")
    x = node("Add", [x, p], "/embeddings/Add_1")
    x = node(
        "LayerNormalization",
        [
            x,
            weight("embeddings.LayerNorm.weight", (hidden,), "ln"),
            weight("embeddings.LayerNorm.bias", (hidden,), "bias"),
        ],
        "/embeddings/LayerNorm/LayerNormalization",
        axis=-1,
        epsilon=1e-12,
    )

    # attention mask [batch, seq] int64 -> additive bias [batch, 1, 1, seq] float32
    const("mask_axes", [1, 2], np.int64)
    m = node("Unsqueeze", ["attention_mask", "mask_axes"], "/Unsqueeze_mask")
    if mask_style == "where":
        const("mask_zero_i64", 0, np.int64)
        masked = node("Equal", [m, "mask_zero_i64"], "/Equal_mask")
        bias = node("Where", [masked, const("mask_fill", FLOAT32_MIN), const("mask_zero", 0.0)], "/Where")
    else:
        mf = node("Cast", [m], "/Cast_mask", to=TensorProto.FLOAT)
        inv = node("Sub", [const("mask_one", 1.0), mf], "/Sub_mask")
        bias = node("Mul", [inv, const("mask_fill", -10000.0)], "/Mul_mask")

    const("shape_heads", [0, 0, heads, head], np.int64)
    const("shape_hidden", [0, 0, hidden], np.int64)
    const("sqrt_head", np.sqrt(head))
    const("sqrt2", np.sqrt(2.0))
    const("half", 0.5)
    const("one_f", 1.0)
    for i in range(layers):
        pre = f"/encoder/layer.{i}"
        w = f"encoder.layer.{i}."

        def proj(inp, name, n_in, n_out, path, pre=pre, w=w):
            y = node("MatMul", [inp, weight(w + name + ".weight", (n_in, n_out))], f"{pre}/{path}/MatMul")
            return node("Add", [weight(w + name + ".bias", (n_out,), "bias"), y], f"{pre}/{path}/Add")

        def split_heads(y, path, perm, pre=pre):
            y = node("Reshape", [y, "shape_heads"], f"{pre}/attention/self/{path}/Reshape")
            return node("Transpose", [y], f"{pre}/attention/self/{path}/Transpose", perm=perm)

        q = split_heads(proj(x, "attention.self.query", hidden, hidden, "attention/self/query"), "q", [0, 2, 1, 3])
        k = split_heads(proj(x, "attention.self.key", hidden, hidden, "attention/self/key"), "k", [0, 2, 3, 1])
        v = split_heads(proj(x, "attention.self.value", hidden, hidden, "attention/self/value"), "v", [0, 2, 1, 3])
        s = node("MatMul", [q, k], f"{pre}/attention/self/MatMul")
        s = node("Div", [s, "sqrt_head"], f"{pre}/attention/self/Div")
        s = node("Add", [s, bias], f"{pre}/attention/self/Add")
        s = node("Softmax", [s], f"{pre}/attention/self/Softmax", axis=-1)
        c = node("MatMul", [s, v], f"{pre}/attention/self/MatMul_1")
        c = node("Transpose", [c], f"{pre}/attention/self/Transpose_ctx", perm=[0, 2, 1, 3])
        c = node("Reshape", [c, "shape_hidden"], f"{pre}/attention/self/Reshape_ctx")
        a = proj(c, "attention.output.dense", hidden, hidden, "attention/output/dense")
        a = node("Add", [a, x], f"{pre}/attention/output/Add")
        x = node(
            "LayerNormalization",
            [
                a,
                weight(w + "attention.output.LayerNorm.weight", (hidden,), "ln"),
                weight(w + "attention.output.LayerNorm.bias", (hidden,), "bias"),
            ],
            f"{pre}/attention/output/LayerNorm/LayerNormalization",
            axis=-1,
            epsilon=1e-12,
        )
        h = proj(x, "intermediate.dense", hidden, ffn, "intermediate/dense")
        # exact GELU: x * 0.5 * (1 + erf(x / sqrt(2)))
        e = node("Div", [h, "sqrt2"], f"{pre}/intermediate/intermediate_act_fn/Div")
        e = node("Erf", [e], f"{pre}/intermediate/intermediate_act_fn/Erf")
        e = node("Add", [e, "one_f"], f"{pre}/intermediate/intermediate_act_fn/Add")
        e = node("Mul", [h, e], f"{pre}/intermediate/intermediate_act_fn/Mul")
        h = node("Mul", [e, "half"], f"{pre}/intermediate/intermediate_act_fn/Mul_1")
        o = proj(h, "output.dense", ffn, hidden, "output/dense")
        o = node("Add", [o, x], f"{pre}/output/Add")
        x = node(
            "LayerNormalization",
            [
                o,
                weight(w + "output.LayerNorm.weight", (hidden,), "ln"),
                weight(w + "output.LayerNorm.bias", (hidden,), "bias"),
            ],
            f"{pre}/output/LayerNorm/LayerNormalization",
            axis=-1,
            epsilon=1e-12,
        )

    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="/Identity_output"))
    graph = helper.make_graph(
        nodes,
        "bert_base_like",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def best_of(repeat, fn, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def timed(fn):
    t = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t


def op_profile(model_bytes, optimize, feeds, tmp, label, runs=2):
    """Per-op-type milliseconds of one run (mean over `runs`) from ORT's profiler."""
    rt = runner.ort()
    so = rt.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tmp) / f"profile_{label}")
    sess = rt.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)  # warm-up, also profiled: dropped below by counting runs
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    events = json.loads(Path(path).read_text())
    per_op: dict = defaultdict(float)
    counts: dict = defaultdict(int)
    run_events = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    first_end = run_events[0]["ts"] + run_events[0]["dur"] if run_events else 0
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= first_end:
            op = e.get("args", {}).get("op_name", "?")
            per_op[op] += e["dur"] / 1e3 / runs
            counts[op] += 1
    return {op: (ms, counts[op] // runs) for op, ms in per_op.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per row; the best is printed")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument(
        "--mask-style",
        choices=["where", "minus10000"],
        default="where",
        help="where: Where(mask==0, float32 lowest, 0) as current torch exports; minus10000: (1 - mask) * -10000",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also time the emulation model with graph optimizations on, the reference with them off, "
        "and print ORT's per-op-type profile of the reference and the emulated run",
    )
    args = ap.parse_args()

    rt = runner.ort()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
        f"onnx {onnx.__version__}, onnxruntime {rt.__version__}, numpy {np.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="bench_emulation_") as tmp:
        tmp = Path(tmp)
        ref_path, conv_path = tmp / "bert_base_like.onnx", tmp / "bert_base_like.fp16.onnx"
        ref_model, t_build = timed(lambda: bert_encoder(layers=args.layers, mask_style=args.mask_style))
        n_params = sum(int(np.prod(t.dims)) for t in ref_model.graph.initializer)
        onnx.save(ref_model, ref_path)
        result, t_convert = timed(lambda: autocast_onnx.convert(ref_model, precision="fp16"))
        conv_model = result.model
        onnx.save(conv_model, conv_path)
        print(
            f"model: {args.layers} layers, hidden 768, 12 heads, FFN 3072, vocab 30522, 512 positions, "
            f"mask {args.mask_style}; {len(ref_model.graph.node)} nodes, {n_params / 1e6:.1f}M parameters, "
            f"{ref_path.stat().st_size / 2**20:.0f} MiB fp32 -> {conv_path.stat().st_size / 2**20:.0f} MiB fp16 "
            f"(built in {t_build:.1f} s, converted in {t_convert:.1f} s, {result.casts_added} casts added)"
        )

        dims = {"batch": args.batch, "sequence": args.seq}
        feeds = generate(plan_inputs(describe_inputs(ref_model), dims), seed=0)  # validate's first batch
        mask = feeds["attention_mask"]
        print(
            f"inputs: batch {args.batch}, sequence {args.seq}; attention_mask rows visible: "
            f"{mask.sum(axis=1).tolist()} (generated as validate generates them)"
        )

        ref_bytes = ref_model.SerializeToString()
        emu, t_emu_build = timed(lambda: emulation_model(conv_model))
        emu_bytes, t_emu_ser = timed(emu.SerializeToString)
        n_emu_nodes = len(emu.graph.node)
        del emu
        sessions = {}
        sessions["ref"], t_ref_sess = timed(lambda: runner.session(ref_bytes, "cpu"))
        sessions["plain"], t_plain_sess = timed(lambda: runner.session(conv_model.SerializeToString(), "cpu"))
        sessions["emu"], t_emu_sess = timed(lambda: runner.session(emu_bytes, "cpu", optimize=False))
        ref_out, plain_out, emu_out = (sessions[k].run(None, feeds)[0] for k in ("ref", "plain", "emu"))

        def timing(key):
            return best_of(args.repeat, lambda: sessions[key].run(None, feeds))

        rows = []  # (label, seconds, note)
        t_ref = timing("ref")
        rows.append(("(a) reference fp32, ORT CPU", t_ref, "default graph optimizations"))
        rows.append(("(b) converted fp16, ORT CPU plain", timing("plain"), "default graph optimizations"))
        rows.append(
            ("(c) emulated (as validate runs it)", timing("emu"), f"{n_emu_nodes} nodes, graph optimizations disabled")
        )
        sessions.clear()
        gc.collect()

        if args.profile:
            sessions["emu_opt"] = runner.session(emu_bytes, "cpu", optimize=True)
            emu_opt_out = sessions["emu_opt"].run(None, feeds)[0]
            rows.append(
                (
                    "    emulated, optimizations ON",
                    timing("emu_opt"),
                    "diagnostic: ORT_ENABLE_ALL on the emulation model",
                )
            )
            sessions.clear()
            sessions["ref_noopt"] = runner.session(ref_bytes, "cpu", optimize=False)
            rows.append(
                (
                    "    reference, optimizations OFF",
                    timing("ref_noopt"),
                    "diagnostic: ORT_DISABLE_ALL on the fp32 model",
                )
            )
            sessions.clear()
            gc.collect()

        options = ValidateOptions(dims=dims, speed=False, device="cpu")
        report = None

        def whole():
            nonlocal report
            report = validate(ref_path, conv_path, options)

        rows.append(
            (
                "(d) validate(), speed=False",
                best_of(args.repeat, whole, warmup=0),
                "load + emulation model + 2 sessions + run + compare",
            )
        )

    print()
    print(f"seconds per run, best of {args.repeat} (one untimed warm-up run first for (a)-(c)); ratio = row / (a)")
    print(f"  {'':<38} {'seconds':>8} {'ratio':>7}  note")
    for label, secs, note in rows:
        print(f"  {label:<38} {secs:>8.3f} {secs / t_ref:>7.2f}  {note}")
    print()
    print(
        "one-off costs (s): "
        f"session reference {t_ref_sess:.2f}, session fp16 plain {t_plain_sess:.2f}, "
        f"session emulated {t_emu_sess:.2f}, emulation_model() {t_emu_build:.2f}, serialize it {t_emu_ser:.2f}"
    )

    def errors(label, out):
        r = ref_out.astype(np.float64)
        o = out.astype(np.float64)
        nonfinite = int((~np.isfinite(o)).sum())
        both = np.isfinite(r) & np.isfinite(o)
        diff = np.abs(o[both] - r[both])
        max_abs = float(diff.max()) if diff.size else float("nan")
        rel = max_abs / float(np.abs(r[both]).max()) if diff.size else float("nan")
        nan, inf = int(np.isnan(o).sum()), int(np.isinf(o).sum())
        print(
            f"  {label:<38} max abs {max_abs:.4g}  relative {rel:.4g}  mean abs {diff.mean():.4g}  "
            f"NaN {nan}  inf {inf}" + ("" if not nonfinite else "  <- non-finite values!")
        )
        if out.shape[0] > 1:
            rows_err = [float(np.nanmax(np.abs(o[b] - r[b]))) for b in range(out.shape[0])]
            print(
                f"  {'':<38} max abs per batch row (visible tokens {mask.sum(axis=1).tolist()}): "
                + ", ".join(f"{e:.3g}" for e in rows_err)
            )

    print()
    print(
        f"error against the fp32 reference, output last_hidden_state {list(ref_out.shape)} "
        f"(reference has {int((~np.isfinite(ref_out)).sum())} non-finite values):"
    )
    errors("emulated", emu_out)
    errors("fp16 plain on CPU", plain_out)
    if args.profile:
        errors("emulated, optimizations ON", emu_opt_out)
    if report is not None:
        o = report["outputs"][0]
        print(
            f"  validate() verdict: {'PASS' if report['passed'] else 'FAIL'} (relative {o['relative_error']:.4g}, "
            f"cosine {o['cosine']:.6f}, new NaN {o['new_nan']}, new inf {o['new_inf']})"
            + ("".join(f"\n    - {f}" for f in o["failures"]))
        )

    if args.profile:
        with tempfile.TemporaryDirectory(prefix="bench_emulation_prof_") as ptmp:
            prof_ref = op_profile(ref_bytes, True, feeds, ptmp, "reference")
            prof_emu = op_profile(emu_bytes, False, feeds, ptmp, "emulated")
        print()
        print("ORT profiler, kernel time per op type in one run (ms; count of kernels):")
        print(f"  {'op':<28} {'reference':>16} {'emulated (opt off)':>20}")
        ops = sorted(set(prof_ref) | set(prof_emu), key=lambda op: -prof_emu.get(op, (0, 0))[0])
        for op in ops:
            r_ms, r_n = prof_ref.get(op, (0.0, 0))
            e_ms, e_n = prof_emu.get(op, (0.0, 0))
            print(f"  {op:<28} {r_ms:>9.1f} ({r_n:>4}) {e_ms:>12.1f} ({e_n:>4})")
        print(
            f"  {'total':<28} {sum(v[0] for v in prof_ref.values()):>16.1f} "
            f"{sum(v[0] for v in prof_emu.values()):>20.1f}"
        )


if __name__ == "__main__":
    main()
