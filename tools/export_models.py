"""Build the small example/test ONNX models shipped in ``examples/models/``.

Every model is created from scratch with fixed seeds (no pretrained weights
are downloaded), exported with ``torch.onnx.export`` (opset 17, standard
``ai.onnx`` operators only), validated with ``onnx.checker`` (full check) and
compared against PyTorch with onnxruntime on CPU.

Run from the repository root with the export environment::

    /work/export-venv/bin/python tools/export_models.py

Models written:

* ``bert_tiny.onnx``   - tiny BERT encoder with padding attention mask
* ``gpt2_tiny.onnx``   - tiny GPT-2 LM head model with causal + padding mask
* ``resnet_tiny.onnx`` - small ResNet-style CNN that keeps BatchNormalization
* ``vit_tiny.onnx``    - tiny Vision Transformer classifier
* ``digits_cnn.onnx``  - small CNN trained on scikit-learn's digits data set,
  plus ``digits_cnn.json`` and ``examples/data/digits_test.npz``
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import json
import logging
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import onnx.numpy_helper
import onnx.shape_inference
import onnxruntime as ort
import torch
from torch import nn
from torch.export import Dim

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO_ROOT / "examples" / "models"
DATA_DIR = REPO_ROOT / "examples" / "data"

TARGET_OPSET = 17
# The dynamo exporter emits opset 18 natively; we convert down to 17 ourselves
# (after copying the module hierarchy into node names).
EXPORT_OPSET = 18
ATOL = 1e-4
MAX_BYTES = 2 * 1024 * 1024
SEED = 1234


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def seed_everything(seed: int = SEED) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def perturb_trivial_params(model: nn.Module, seed: int = SEED) -> None:
    """Give biases / norm parameters non-trivial values.

    Freshly initialised transformers have all-zero biases and all-one
    LayerNorm weights; that makes a poor test model (and lets the exporter
    deduplicate identical initializers).  Add small deterministic noise.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and name.endswith("weight"):  # LayerNorm gamma
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.add_(0.02 * torch.randn(p.shape, generator=gen))


def save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Like ``np.savez_compressed`` (loadable with ``np.load``) but with fixed
    zip timestamps so that regenerating gives byte-identical files."""
    import io
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def _node_name_from_scopes(node: onnx.NodeProto, strip_first: bool) -> str | None:
    scopes = None
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = ast.literal_eval(prop.value)  # a list of str
    if not scopes:
        return None
    # scopes = ['', 'model', 'model.encoder', ..., '<fx node name>']
    modules = [s for s in scopes[:-1] if s]
    parts: list[str] = []
    prev = ""
    for s in modules:
        if prev and s.startswith(prev + "."):
            parts.append(s[len(prev) + 1 :])
        else:
            parts.append(s)
        prev = s
    if strip_first and parts:
        parts = parts[1:]
    return "/" + "/".join(parts + [node.op_type]) if parts else "/" + node.op_type


def optimize_graph(model_ir) -> onnx.ModelProto:
    """Same clean-up as the exporter's ``optimize=True`` (constant folding,
    pattern rewrites, constant lifting, CSE) except for the rules that fold
    BatchNormalization into Conv/Gemm: the example CNNs must keep their
    BatchNormalization nodes."""
    import onnx_ir as ir
    import onnxscript.optimizer as optimizer
    import onnxscript.rewriter as rewriter
    from onnx_ir.passes import common as common_passes
    from onnxscript.rewriter.rules import common as common_rules

    bn_rules = (
        common_rules.fuse_batchnorm_into_conv_rule,
        common_rules.fuse_batchnorm_into_conv_transpose_rule,
        common_rules.fuse_batchnorm_into_gemm_rule,
    )
    rules = [r for r in rewriter._DEFAULT_REWRITE_RULES if not any(r is b for b in bn_rules)]
    for _ in range(2):
        optimizer.fold_constants(model_ir)
        rewriter.rewrite(model_ir, pattern_rewrite_rules=rules)
    ir.passes.Sequential(
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    )(model_ir)
    return ir.serde.serialize_model(model_ir)


_REDUCE_OPS = {
    "ReduceMax",
    "ReduceMin",
    "ReduceMean",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
}


def _const_value(model: onnx.ModelProto, name: str) -> np.ndarray:
    for init in model.graph.initializer:
        if init.name == name:
            return onnx.numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return onnx.numpy_helper.to_array(node.attribute[0].t)
    raise ValueError(f"{name} is not a constant")


def downgrade_18_to_17(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite the few operators whose opset-18 form differs from opset 17.

    The exporter works in opset 18.  onnx's C++ version converter has no
    18->17 adapter for Split and leaves ``noop_with_empty_axes`` on Reduce*
    nodes, so the handful of relevant changes are done here explicitly and
    anything else that changed in opset 18 is refused.
    """
    model = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)

    new_inits = []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise ValueError(f"non-standard op {node.domain}::{node.op_type}")
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Split":
            if "num_outputs" in attrs:
                axis = attrs["axis"].i if "axis" in attrs else 0
                shape = shapes.get(node.input[0])
                if shape is None or shape[axis] is None:
                    raise ValueError(f"{node.name}: Split on a dynamic axis cannot go to opset 17")
                total, n = shape[axis], attrs["num_outputs"].i
                chunk = -(-total // n)
                sizes = [chunk] * (n - 1) + [total - chunk * (n - 1)]
                split_name = f"{node.output[0]}__split_sizes"
                new_inits.append(onnx.numpy_helper.from_array(np.array(sizes, np.int64), split_name))
                node.attribute.remove(attrs["num_outputs"])
                while len(node.input) < 2:
                    node.input.append("")
                node.input[1] = split_name
        elif node.op_type in _REDUCE_OPS:
            noop = attrs.get("noop_with_empty_axes")
            axes = None
            if len(node.input) > 1 and node.input[1]:
                axes = _const_value(model, node.input[1]).astype(np.int64).ravel().tolist()
                del node.input[1:]
            if noop is not None:
                if noop.i != 0 and not axes:
                    raise ValueError(f"{node.name}: noop_with_empty_axes=1 has no opset-17 form")
                node.attribute.remove(noop)
            if axes:
                node.attribute.append(onnx.helper.make_attribute("axes", axes))
        elif node.op_type == "Pad":
            if len(node.input) > 3 and node.input[3]:
                raise ValueError(f"{node.name}: Pad with axes has no opset-17 form")
        elif node.op_type == "Resize":
            for name in ("antialias", "keep_aspect_ratio_policy", "axes"):
                if name in attrs:
                    raise ValueError(f"{node.name}: Resize attribute {name} has no opset-17 form")
        elif node.op_type in ("ScatterElements", "ScatterND"):
            if "reduction" in attrs and attrs["reduction"].s in (b"max", b"min"):
                raise ValueError(f"{node.name}: reduction max/min has no opset-17 form")
        else:
            s17 = onnx.defs.get_schema(node.op_type, 17).since_version
            s18 = onnx.defs.get_schema(node.op_type, 18).since_version
            if s17 != s18:
                raise ValueError(f"{node.name}: {node.op_type} changed in opset 18; no downgrade rule")
    model.graph.initializer.extend(new_inits)

    # drop initializers nobody reads any more (e.g. Reduce axes)
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    del model.opset_import[:]
    model.opset_import.append(onnx.helper.make_opsetid("", TARGET_OPSET))
    return model


def finalize_model(model: onnx.ModelProto, strip_first_scope: bool, doc: str) -> onnx.ModelProto:
    """Readable node names, no bulky metadata, opset 17."""
    used: collections.Counter[str] = collections.Counter()
    for node in model.graph.node:
        base = _node_name_from_scopes(node, strip_first_scope) or "/" + node.op_type
        idx = used[base]
        used[base] += 1
        node.name = base if idx == 0 else f"{base}_{idx}"
        del node.metadata_props[:]
        node.doc_string = ""
    del model.metadata_props[:]
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        vi.doc_string = ""
    for init in model.graph.initializer:
        init.doc_string = ""
    model = downgrade_18_to_17(model)
    model.doc_string = doc
    return model


def export(
    module: nn.Module,
    args: tuple,
    path: Path,
    input_names: list[str],
    output_names: list[str],
    dynamic_shapes: tuple,
    strip_first_scope: bool,
    doc: str,
) -> onnx.ModelProto:
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            module,
            args,
            None,
            dynamo=True,
            opset_version=EXPORT_OPSET,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
            optimize=False,
            verbose=False,
        )
    model = finalize_model(optimize_graph(prog.model), strip_first_scope, doc)
    model.graph.name = path.stem
    onnx.save_model(model, str(path))
    return model


def check_file(path: Path, max_bytes: int = MAX_BYTES) -> onnx.ModelProto:
    """The written model, after the full checker: opset 17, standard ops only, under `max_bytes`."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    for imp in model.opset_import:
        assert imp.domain in ("", "ai.onnx") and imp.version == TARGET_OPSET, imp
    for node in model.graph.node:
        assert node.domain in ("", "ai.onnx"), f"non-standard op {node.domain}::{node.op_type}"
    size = path.stat().st_size
    assert size < max_bytes, f"{path.name} is {size} bytes"
    return model


def check_and_compare(
    path: Path,
    torch_fn,
    feeds_list: list[dict[str, np.ndarray]],
) -> dict:
    model = check_file(path)
    size = path.stat().st_size
    sess = ort_session(path)
    out_names = [o.name for o in sess.get_outputs()]
    worst = 0.0
    for feeds in feeds_list:
        got = sess.run(None, feeds)
        with torch.no_grad():
            ref = torch_fn(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        if isinstance(ref, torch.Tensor):
            ref = (ref,)
        assert len(ref) == len(got)
        for name, g, r in zip(out_names, got, ref):
            r = r.detach().numpy()
            assert g.shape == r.shape, (name, g.shape, r.shape)
            diff = float(np.max(np.abs(g - r)))
            shape_desc = {k: list(v.shape) for k, v in feeds.items()}
            print(f"    {name:18s} inputs {shape_desc}: max |ort - torch| = {diff:.3e}")
            worst = max(worst, diff)
    assert worst < ATOL, f"{path.name}: max abs diff {worst} >= {ATOL}"

    hist = collections.Counter(n.op_type for n in model.graph.node)
    print(
        f"    file size: {size} bytes ({size / 1024:.1f} KiB), sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    )
    print(f"    nodes: {len(model.graph.node)}, initializers: {len(model.graph.initializer)}")
    print("    op histogram: " + ", ".join(f"{k}={v}" for k, v in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))))
    for io_kind, vals in (("input", model.graph.input), ("output", model.graph.output)):
        for v in vals:
            tt = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in tt.shape.dim]
            print(f"    {io_kind}: {v.name} {onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)} {dims}")
    report_large_constants(model)
    return {"max_abs_diff": worst, "size": size, "nodes": len(model.graph.node), "ops": dict(hist)}


def report_large_constants(model: onnx.ModelProto) -> None:
    """Print float constants outside the fp16 range (e.g. attention-mask fill values)."""
    consumers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            consumers[i].append(f"{n.op_type}({n.name})")
    tensors = [(t.name, t) for t in model.graph.initializer]
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    tensors.append((n.output[0], a.t))
    for name, t in tensors:
        if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            continue
        arr = onnx.numpy_helper.to_array(t)
        if arr.size and np.max(np.abs(arr)) > 65504.0:
            vals = np.unique(arr[np.abs(arr) > 65504.0])
            print(
                f"    constant outside fp16 range: {name} shape={list(arr.shape)} values={vals.tolist()} used by {consumers[name]}"
            )


def ort_session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def check_bert_mask(path: Path) -> None:
    """The padding mask really is in the graph: tokens behind attention_mask=0
    must not influence the other positions' hidden states."""
    sess = ort_session(path)
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 1000, (2, 12)).astype(np.int64)
    mask = np.ones((2, 12), np.int64)
    mask[:, 8:] = 0
    tt = np.zeros((2, 12), np.int64)
    ids2 = ids.copy()
    ids2[:, 8:] = rng.integers(1, 1000, (2, 4))
    a = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt})[0]
    b = sess.run(["last_hidden_state"], {"input_ids": ids2, "attention_mask": mask, "token_type_ids": tt})[0]
    masked = float(np.abs(a[:, :8] - b[:, :8]).max())
    full = np.ones_like(mask)
    c = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": full, "token_type_ids": tt})[0]
    d = sess.run(["last_hidden_state"], {"input_ids": ids2, "attention_mask": full, "token_type_ids": tt})[0]
    unmasked = float(np.abs(c[:, :8] - d[:, :8]).max())
    print(
        f"    mask check: change of padded tokens moves real positions by {masked:.1e} (masked) vs {unmasked:.1e} (unmasked)"
    )
    assert masked < 1e-5 < unmasked


def check_gpt2_mask(path: Path) -> None:
    """Causal mask: later tokens do not change earlier logits.  Padding mask:
    left-padded tokens do not change the real positions' logits."""
    sess = ort_session(path)
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 1000, (2, 12)).astype(np.int64)
    mask = np.ones((2, 12), np.int64)
    ids2 = ids.copy()
    ids2[:, 9:] = rng.integers(0, 1000, (2, 3))
    a = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    b = sess.run(["logits"], {"input_ids": ids2, "attention_mask": mask})[0]
    causal = float(np.abs(a[:, :9] - b[:, :9]).max())
    later = float(np.abs(a[:, 9:] - b[:, 9:]).max())
    mask[:, :3] = 0
    ids3 = ids.copy()
    ids3[:, :3] = rng.integers(0, 1000, (2, 3))
    c = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    d = sess.run(["logits"], {"input_ids": ids3, "attention_mask": mask})[0]
    padded = float(np.abs(c[:, 3:] - d[:, 3:]).max())
    print(
        f"    mask check: causal leak {causal:.1e} (changed positions move {later:.1e}), left-padding leak {padded:.1e}"
    )
    assert causal < 1e-5 < later and padded < 1e-5


# --------------------------------------------------------------------------
# 1. BERT
# --------------------------------------------------------------------------
class BertWrapper(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            use_cache=False,
            return_dict=True,
        )
        return out.last_hidden_state, out.pooler_output


def build_bert() -> dict:
    from transformers import BertConfig, BertModel

    seed_everything()
    cfg = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    cfg._attn_implementation = "eager"
    bert = BertModel(cfg, add_pooling_layer=True)
    perturb_trivial_params(bert)
    model = BertWrapper(bert).eval()

    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(1, 1000, (2, 16), generator=gen)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 11:] = 0
    tt = torch.zeros(2, 16, dtype=torch.int64)
    tt[:, 8:] = 1
    batch, seq = Dim("batch"), Dim("sequence", max=64)
    path = MODELS_DIR / "bert_tiny.onnx"
    export(
        model,
        (ids, mask, tt),
        path,
        ["input_ids", "attention_mask", "token_type_ids"],
        ["last_hidden_state", "pooler_output"],
        ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch, 1: seq}),
        strip_first_scope=True,
        doc="bert_tiny: BertModel(hidden=64, layers=2, heads=4, ffn=128, vocab=1000, max_pos=64), eager attention, random init",
    )

    rng = np.random.default_rng(SEED)
    feeds = []
    for b, s in ((2, 16), (1, 5), (3, 64)):
        f_ids = rng.integers(1, 1000, (b, s)).astype(np.int64)
        f_mask = np.ones((b, s), np.int64)
        if b > 1:
            f_mask[-1, s // 2 :] = 0  # right padding on the last row
        f_tt = np.zeros((b, s), np.int64)
        f_tt[:, s // 2 :] = 1
        feeds.append({"input_ids": f_ids, "attention_mask": f_mask, "token_type_ids": f_tt})
    stats = check_and_compare(path, model, feeds)
    check_bert_mask(path)
    return stats


# --------------------------------------------------------------------------
# 2. GPT-2
# --------------------------------------------------------------------------
class GPT2Wrapper(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            return_dict=True,
        )
        return out.logits


def build_gpt2() -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    seed_everything()
    cfg = GPT2Config(
        vocab_size=1000,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=999,
        eos_token_id=999,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    cfg._attn_implementation = "eager"
    gpt = GPT2LMHeadModel(cfg)
    perturb_trivial_params(gpt)
    model = GPT2Wrapper(gpt).eval()

    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, 1000, (2, 16), generator=gen)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0
    batch, seq = Dim("batch"), Dim("sequence", max=64)
    path = MODELS_DIR / "gpt2_tiny.onnx"
    export(
        model,
        (ids, mask),
        path,
        ["input_ids", "attention_mask"],
        ["logits"],
        ({0: batch, 1: seq}, {0: batch, 1: seq}),
        strip_first_scope=True,
        doc="gpt2_tiny: GPT2LMHeadModel(n_embd=64, n_layer=2, n_head=4, vocab=1000, n_positions=64), eager attention, no KV cache, random init",
    )

    rng = np.random.default_rng(SEED + 1)
    feeds = []
    for b, s in ((2, 16), (1, 3), (3, 64)):
        f_ids = rng.integers(0, 1000, (b, s)).astype(np.int64)
        f_mask = np.ones((b, s), np.int64)
        if b > 1:
            f_mask[-1, (2 * s) // 3 :] = 0  # right padding on the last row
        feeds.append({"input_ids": f_ids, "attention_mask": f_mask})
    stats = check_and_compare(path, model, feeds)
    check_gpt2_mask(path)
    return stats


# --------------------------------------------------------------------------
# 3. ResNet-style CNN (plain torch)
# --------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetTiny(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, pixel_values):
        x = self.stem(pixel_values)
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x)


def build_resnet() -> dict:
    seed_everything()
    model = ResNetTiny()
    # Non-trivial BatchNorm statistics: a few train-mode passes on shifted,
    # scaled random data, plus random affine parameters.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.momentum = 0.3
        model.train()
        gen = torch.Generator().manual_seed(SEED)
        for _ in range(10):
            model(torch.randn(16, 3, 32, 32, generator=gen) * 2.0 + 0.5)
    model.eval()

    x = torch.randn(2, 3, 32, 32, generator=gen)
    path = MODELS_DIR / "resnet_tiny.onnx"
    export(
        model,
        (x,),
        path,
        ["pixel_values"],
        ["logits"],
        ({0: Dim("batch")},),
        strip_first_scope=False,
        doc="resnet_tiny: stem conv3x3(16)+BN+ReLU, 3 BasicBlocks (16, 32/s2, 64/s2), global avg pool, Linear(64->10)",
    )
    onnx_model = onnx.load(str(path))
    n_bn = sum(n.op_type == "BatchNormalization" for n in onnx_model.graph.node)
    assert n_bn > 0, "BatchNormalization nodes were folded away"

    rng = np.random.default_rng(SEED + 2)
    feeds = [{"pixel_values": (rng.standard_normal((b, 3, 32, 32)) * 2.0 + 0.5).astype(np.float32)} for b in (2, 1, 5)]
    return check_and_compare(path, model, feeds)


# --------------------------------------------------------------------------
# 4. ViT
# --------------------------------------------------------------------------
class ViTWrapper(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values, return_dict=True).logits


def build_vit() -> dict:
    from transformers import ViTConfig, ViTForImageClassification

    seed_everything()
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    cfg._attn_implementation = "eager"
    vit = ViTForImageClassification(cfg)
    perturb_trivial_params(vit)
    model = ViTWrapper(vit).eval()

    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(2, 3, 32, 32, generator=gen)
    path = MODELS_DIR / "vit_tiny.onnx"
    export(
        model,
        (x,),
        path,
        ["pixel_values"],
        ["logits"],
        ({0: Dim("batch")},),
        strip_first_scope=True,
        doc="vit_tiny: ViTForImageClassification(image=32, patch=8, hidden=64, layers=2, heads=4, ffn=128, labels=10), random init",
    )
    rng = np.random.default_rng(SEED + 3)
    feeds = [{"pixel_values": rng.standard_normal((b, 3, 32, 32)).astype(np.float32)} for b in (2, 1, 4)]
    return check_and_compare(path, model, feeds)


# --------------------------------------------------------------------------
# 5. digits CNN (trained)
# --------------------------------------------------------------------------
class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.norm = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 10)
        self.relu = nn.ReLU()

    def logits(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.pool(self.relu(self.bn2(self.conv2(x))))
        x = torch.flatten(x, 1)
        x = self.relu(self.norm(self.fc1(x)))
        return self.fc2(x)

    def forward(self, pixels):
        return torch.softmax(self.logits(pixels), dim=-1)


def build_digits() -> dict:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    seed_everything()
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]  # [N,1,8,8] in [0,1]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)

    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    gen = torch.Generator().manual_seed(SEED)
    epochs = 30
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for i in range(0, len(xt), 64):
            idx = perm[i : i + 64]
            loss = nn.functional.cross_entropy(model.logits(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        if (epoch + 1) % 10 == 0:
            model.eval()
            with torch.no_grad():
                acc = float((model(torch.from_numpy(x_te)).argmax(1).numpy() == y_te).mean())
            print(f"    epoch {epoch + 1}: train loss {total / len(xt):.4f}, torch test acc {acc:.4f}")
    model.eval()

    path = MODELS_DIR / "digits_cnn.onnx"
    export(
        model,
        (torch.from_numpy(x_te[:2]),),
        path,
        ["pixels"],
        ["probs"],
        ({0: Dim("batch")},),
        strip_first_scope=False,
        doc="digits_cnn: Conv(1->16)+BN+ReLU, Conv(16->32)+BN+ReLU, MaxPool, Linear(512->64)+LayerNorm+ReLU, Linear(64->10), Softmax; trained on sklearn digits",
    )
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    save_npz(DATA_DIR / "digits_test.npz", x=x_te.astype(np.float32), y=y_te.astype(np.int64))

    stats = check_and_compare(path, model, [{"pixels": x_te[:7]}, {"pixels": x_te[:1]}, {"pixels": x_te}])
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    probs = sess.run(["probs"], {"pixels": x_te})[0]
    acc = float((probs.argmax(1) == y_te).mean())
    print(f"    onnxruntime test accuracy: {acc:.4f} on {len(y_te)} held-out samples")
    assert acc >= 0.95, f"digits accuracy too low: {acc}"
    meta = {
        "test_accuracy": round(acc, 6),
        "n_test": len(y_te),
        "input": {
            "name": "pixels",
            "dtype": "float32",
            "shape": ["batch", 1, 8, 8],
            "description": "8x8 grey-level digit images scaled to [0, 1] (original 0..16 divided by 16)",
        },
        "output": {
            "name": "probs",
            "dtype": "float32",
            "shape": ["batch", 10],
            "description": "softmax class probabilities for digits 0-9",
        },
        "test_data": "examples/data/digits_test.npz (x: float32 [n_test,1,8,8], y: int64 [n_test])",
        "split": {"test_size": 0.25, "random_state": 0, "stratify": True},
    }
    (MODELS_DIR / "digits_cnn.json").write_text(json.dumps(meta, indent=2) + "\n")
    stats["test_accuracy"] = acc
    return stats


BUILDERS = {
    "bert_tiny": build_bert,
    "gpt2_tiny": build_gpt2,
    "resnet_tiny": build_resnet,
    "vit_tiny": build_vit,
    "digits_cnn": build_digits,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "models", nargs="*", metavar="MODEL", help=f"subset to build, from {list(BUILDERS)} (default: all)"
    )
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in BUILDERS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(BUILDERS)}")
    # the exporter warns once per export that torchvision ops are unavailable
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    names = args.models or list(BUILDERS)
    for name in names:
        print(f"== {name}")
        BUILDERS[name]()
    print("all models exported and verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
