"""Build the small decoder-only language models in ``tests/data/decoders/``.

Every model is a randomly initialised Hugging Face ``*ForCausalLM`` built from a config (no hub
download), with fixed seeds. Export goes through the same path as ``tools/export_models.py``, whose
helpers this script imports: the dynamo exporter (``torch.onnx.export(..., dynamo=True)``, opset 18,
``optimize=False``), then the onnxscript optimizer without its BatchNorm fusions, readable node names
from the module hierarchy, and the explicit opset 18 -> 17 rewrite, so that every file is opset 17
with standard ``ai.onnx`` operators only. The TorchScript exporter (``dynamo=False``) is not used:
transformers 5 builds its masks and caches for ``torch.export``. Attention is
``attn_implementation="eager"``, so the causal + padding mask transformers builds stays in the
graph as plain ops (the boolean mask turned into an additive float mask by a ``Where``).

Each file is checked with ``onnx.checker.check_model(full_check=True)`` and compared with PyTorch in
ONNX Runtime on CPU (max abs diff <= 1e-4 on every output, several batch / sequence shapes).

Run from the repository root with the export environment (torch CPU build, transformers, onnx,
onnxruntime, onnxscript, numpy)::

    /work/export-venv/bin/python tools/export_decoders.py            # all models + README.md
    /work/export-venv/bin/python tools/export_decoders.py llama_kv   # a subset (README is not rewritten)

Models written (all: 2 layers, hidden 64, 4 heads, 2 key/value heads, head_dim 16, ffn 128, vocab 256,
max positions 128, RMSNorm, rotary embeddings, float32):

* ``llama.onnx``, ``qwen2.onnx``, ``mistral.onnx``, ``gemma.onnx`` - no cache.
  Inputs ``input_ids`` / ``attention_mask`` int64 [batch, sequence], output ``logits`` float32
  [batch, sequence, 256]. Qwen2 has q/k/v biases; Mistral a sliding window of 64; Gemma a GELU-tanh
  gate, tied embeddings and the sqrt(hidden) embedding scale; the others a SiLU gate.
* ``llama_kv.onnx``, ``qwen2_kv.onnx`` - with a KV cache, as used for generation. Inputs ``input_ids``
  and ``position_ids`` int64 [batch, sequence], ``attention_mask`` int64 [batch, total_sequence]
  (past + new tokens), ``past_key_values.{i}.key`` / ``.value`` float32 [batch, 2, past_sequence, 16];
  outputs ``logits`` and ``present.{i}.key`` / ``.value`` float32 [batch, 2, past_sequence + sequence,
  16]. ``past_sequence`` may be 0 (first step). Besides the single-call comparison, a 4-step greedy
  generation driven through ONNX Runtime with the cache must give the tokens of torch's
  ``generate(do_sample=False)``.

``README.md`` in the same folder (file table, configs, mask constants, op histograms, verification
figures) is generated too when all models are built.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import inspect
import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import torch
from torch import nn
from torch.export import Dim

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_models import (  # sibling script in tools/
    check_file,
    ort_session,
    seed_everything,
)
from export_models import export as export_module

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "tests" / "data" / "decoders"

SEED = 1234
ATOL = 1e-4
MAX_FILE_BYTES = 1_000_000
MAX_DIR_BYTES = 6_000_000
GREEDY_STEPS = 4

COMMON = {
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "attention_dropout": 0.0,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": None,  # generation must run its GREEDY_STEPS steps, no early stop
}

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"hidden_act": "silu"}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"hidden_act": "silu", "use_sliding_window": False}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"hidden_act": "silu", "sliding_window": 64}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"hidden_act": "gelu_pytorch_tanh"}),
}


# --------------------------------------------------------------------------
# model construction
# --------------------------------------------------------------------------
def build_hf_model(arch: str) -> nn.Module:
    import transformers

    cfg_name, model_name, extra = ARCHS[arch]
    seed_everything(SEED)
    cfg = getattr(transformers, cfg_name)(**COMMON, **extra)
    cfg._attn_implementation = "eager"
    model = getattr(transformers, model_name)(cfg)
    init_realistic(model, SEED)
    return model.eval()


def init_realistic(model: nn.Module, seed: int) -> None:
    """Weights on a scale that keeps activations, attention scores and logits of order one.

    The transformers default (normal, std 0.02) leaves a hidden-64 model with near-uniform attention
    and logits of a few hundredths. Here: Linear weights std 1/sqrt(fan_in) (variance preserving),
    biases std 0.02, embeddings std 1 (std 1/sqrt(hidden) where they are tied to the LM head and
    scaled by sqrt(hidden) on input, as in Gemma). RMSNorm weights get noise of std 0.1 around their
    neutral value, as ``perturb_trivial_params`` in ``tools/export_models.py`` does, so they are not
    all 1 (or all 0 for Gemma's ``1 + weight`` form).
    """
    gen = torch.Generator().manual_seed(seed)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    hidden = model.config.hidden_size
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                if tied and module is model.get_output_embeddings():
                    continue
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) / module.in_features**0.5)
                if module.bias is not None:
                    module.bias.copy_(0.02 * torch.randn(module.bias.shape, generator=gen))
            elif isinstance(module, nn.Embedding):
                std = hidden**-0.5 if tied else 1.0
                module.weight.copy_(std * torch.randn(module.weight.shape, generator=gen))
        for name, p in model.named_parameters():
            if p.ndim == 1 and name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


def _cache_kwarg(model: nn.Module) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class LogitsWrapper(nn.Module):
    """input_ids, attention_mask -> logits, without cache."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)
        return out.logits


class KVCacheWrapper(nn.Module):
    """Flat past tensors in, flat present tensors out.

    forward(input_ids, attention_mask, position_ids, *past) with past = (key_0, value_0, key_1,
    value_1, ...), each [batch, kv_heads, past_sequence, head_dim]; returns (logits, present key_0,
    present value_0, ...). The past goes into a ``DynamicCache``; its layers concatenate the new
    keys / values to it, which gives the presents.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_hidden_layers
        self.cache_kwarg = _cache_kwarg(model)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        assert len(past) == 2 * self.num_layers
        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)])
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            return_dict=True,
            **{self.cache_kwarg: cache},
        )
        cache = out["cache"] if "cache" in out else out["past_key_values"]
        flat = []
        for layer in cache.layers:
            flat += [layer.keys, layer.values]
        return (out.logits, *flat)


def kv_names(num_layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def positions_from_mask(mask: np.ndarray) -> np.ndarray:
    """Position ids as transformers' generate() makes them for a (left-)padded attention mask."""
    pos = np.cumsum(mask, axis=-1) - 1
    pos[mask == 0] = 1
    return pos.astype(np.int64)


# --------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------
def export(module, args, path, input_names, output_names, dynamic_shapes, doc) -> onnx.ModelProto:
    """export_models.export, with the first module scope stripped from node names."""
    return export_module(module, args, path, input_names, output_names, dynamic_shapes, True, doc)


def describe_config(model: nn.Module) -> str:
    c = model.config
    parts = [
        f"{type(model).__name__}",
        f"layers={c.num_hidden_layers}",
        f"hidden={c.hidden_size}",
        f"heads={c.num_attention_heads}",
        f"kv_heads={c.num_key_value_heads}",
        f"head_dim={c.head_dim}",
        f"ffn={c.intermediate_size}",
        f"vocab={c.vocab_size}",
        f"max_pos={c.max_position_embeddings}",
        f"act={c.hidden_act}",
        f"rms_eps={c.rms_norm_eps}",
        f"rope_theta={c.rope_parameters['rope_theta']}",
        f"tied_embeddings={c.tie_word_embeddings}",
    ]
    if getattr(model.model.layers[0].self_attn.q_proj, "bias", None) is not None:
        parts.append("qkv_bias=True")
    if getattr(c, "sliding_window", None):
        parts.append(f"sliding_window={c.sliding_window}")
    parts.append(f"attn_implementation={c._attn_implementation}")
    return ", ".join(parts)


# --------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------
def compare(sess: ort.InferenceSession, torch_fn, feeds: dict[str, np.ndarray], label: str) -> float:
    got = sess.run(None, feeds)
    with torch.no_grad():
        ref = torch_fn(*[torch.from_numpy(feeds[i.name]) for i in sess.get_inputs()])
    if isinstance(ref, torch.Tensor):
        ref = (ref,)
    assert len(ref) == len(got)
    worst = 0.0
    for out, g, r in zip(sess.get_outputs(), got, ref):
        r = r.detach().numpy()
        assert g.shape == r.shape, (out.name, g.shape, r.shape)
        assert np.isfinite(g).all() and np.isfinite(r).all(), f"{label}: non-finite values in {out.name}"
        worst = max(worst, float(np.max(np.abs(g - r))) if g.size else 0.0)
    print(f"    {label}: max |ort - torch| over {len(got)} outputs = {worst:.3e}")
    return worst


def check_masks(sess: ort.InferenceSession, sliding_window: int | None) -> dict:
    """Causal: later tokens leave earlier logits alone. Padding: left-padded tokens leave the real
    positions alone. Sliding window: with 2 layers the last position of 128 cannot see token 0."""
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 256, (2, 12)).astype(np.int64)
    mask = np.ones((2, 12), np.int64)
    ids2 = ids.copy()
    ids2[:, 9:] = rng.integers(0, 256, (2, 3))
    a = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    b = sess.run(["logits"], {"input_ids": ids2, "attention_mask": mask})[0]
    res = {"causal_leak": float(np.abs(a[:, :9] - b[:, :9]).max()), "changed": float(np.abs(a[:, 9:] - b[:, 9:]).max())}
    mask[:, :3] = 0
    ids3 = ids.copy()
    ids3[:, :3] = rng.integers(0, 256, (2, 3))
    c = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    d = sess.run(["logits"], {"input_ids": ids3, "attention_mask": mask})[0]
    res["padding_leak"] = float(np.abs(c[:, 3:] - d[:, 3:]).max())
    assert res["causal_leak"] < 1e-5 < res["changed"] and res["padding_leak"] < 1e-5, res
    msg = f"causal leak {res['causal_leak']:.1e} (changed positions move {res['changed']:.1e}), "
    msg += f"left-padding leak {res['padding_leak']:.1e}"
    if sliding_window:
        n = 128
        ids = rng.integers(0, 256, (1, n)).astype(np.int64)
        ids4 = ids.copy()
        ids4[0, 0] = (ids[0, 0] + 1) % 256
        full = np.ones((1, n), np.int64)
        e = sess.run(["logits"], {"input_ids": ids, "attention_mask": full})[0]
        f = sess.run(["logits"], {"input_ids": ids4, "attention_mask": full})[0]
        reach = 2 * (sliding_window - 1)  # two layers, each attends sliding_window - 1 tokens back
        res["window_leak"] = float(np.abs(e[0, reach + 1 :] - f[0, reach + 1 :]).max())
        res["window_inside"] = float(np.abs(e[0, reach] - f[0, reach]).max())
        assert res["window_leak"] < 1e-5 < res["window_inside"], res
        msg += f", sliding window: token 0 moves position {reach} by {res['window_inside']:.1e}"
        msg += f" and positions > {reach} by {res['window_leak']:.1e}"
    print(f"    mask check: {msg}")
    return res


def check_greedy(sess: ort.InferenceSession, hf_model: nn.Module, num_layers: int, kv_heads: int, head_dim: int):
    """GREEDY_STEPS greedy tokens through ONNX Runtime with the KV cache == torch generate()."""
    rng = np.random.default_rng(SEED + 5)
    prompt = rng.integers(3, 256, (2, 6)).astype(np.int64)
    mask = np.ones((2, 6), np.int64)
    mask[1, :2] = 0  # left padding on the second row
    prompt[1, :2] = 0
    with torch.no_grad():
        ref = hf_model.generate(
            input_ids=torch.from_numpy(prompt),
            attention_mask=torch.from_numpy(mask),
            max_new_tokens=GREEDY_STEPS,
            do_sample=False,
            num_beams=1,
            pad_token_id=0,
        )
    ref_tokens = ref[:, prompt.shape[1] :].numpy()
    assert ref_tokens.shape == (2, GREEDY_STEPS), ref_tokens.shape

    past = {}
    for i in range(num_layers):
        for kv in ("key", "value"):
            past[f"past_key_values.{i}.{kv}"] = np.zeros((2, kv_heads, 0, head_dim), np.float32)
    ids, full_mask, tokens = prompt, mask, []
    out_names = [o.name for o in sess.get_outputs()]
    for _ in range(GREEDY_STEPS):
        pos = positions_from_mask(full_mask)[:, full_mask.shape[1] - ids.shape[1] :]
        feeds = {"input_ids": ids, "attention_mask": full_mask, "position_ids": pos, **past}
        outs = dict(zip(out_names, sess.run(None, feeds)))
        nxt = outs["logits"][:, -1].argmax(-1).astype(np.int64)
        tokens.append(nxt)
        past = {name.replace("present", "past_key_values"): v for name, v in outs.items() if name.startswith("present")}
        ids = nxt[:, None]
        full_mask = np.concatenate([full_mask, np.ones((2, 1), np.int64)], axis=1)
    ort_tokens = np.stack(tokens, axis=1)
    agree = bool(np.array_equal(ort_tokens, ref_tokens))
    print(f"    greedy {GREEDY_STEPS} steps: torch {ref_tokens.tolist()} ort {ort_tokens.tolist()} -> agree={agree}")
    assert agree
    return {"torch": ref_tokens.tolist(), "ort": ort_tokens.tolist(), "agree": agree}


# --------------------------------------------------------------------------
# graph inspection (for the README)
# --------------------------------------------------------------------------
def op_histogram(model: onnx.ModelProto) -> list[tuple[str, int]]:
    hist = collections.Counter(n.op_type for n in model.graph.node)
    return sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))


def io_desc(values) -> list[str]:
    out = []
    for v in values:
        tt = v.type.tensor_type
        dims = ", ".join(str(d.dim_param or d.dim_value) for d in tt.shape.dim)
        out.append(f"`{v.name}` {onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)} [{dims}]")
    return out


def mask_constants(model: onnx.ModelProto) -> list[dict]:
    """Float constants beyond the float16 range (or infinite), with the ops they feed, followed
    through the graph down to the Softmax they end in."""
    consumers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            consumers[i].append(n)
    tensors = [(t.name, t, "initializer") for t in model.graph.initializer]
    for n in model.graph.node:
        if n.op_type == "Constant":
            tensors += [(n.output[0], a.t, f"Constant node {n.name}") for a in n.attribute if a.name == "value"]
    found = []
    for name, t, where in tensors:
        if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            continue
        arr = onnx.numpy_helper.to_array(t)
        big = ~np.isfinite(arr) | (np.abs(arr) > 65504.0)
        if not arr.size or not big.any():
            continue
        info = {
            "name": name,
            "where": where,
            "dtype": str(arr.dtype),
            "shape": list(arr.shape),
            "values": sorted({float(x) for x in arr[big].ravel()}),
            "is_finfo_min": bool(np.all(arr[big] == np.finfo(np.float32).min)),
            "chain": [],
        }
        frontier, seen = [name], set()
        for _ in range(4):
            nxt = []
            for value in frontier:
                for n in consumers[value]:
                    if n.name in seen:
                        continue
                    seen.add(n.name)
                    slot = list(n.input).index(value)
                    others = [x for j, x in enumerate(n.input) if j != slot]
                    info["chain"].append({"op": n.op_type, "node": n.name, "input_slot": slot, "other_inputs": others})
                    if n.op_type != "Softmax":
                        nxt += list(n.output)
            frontier = nxt
        found.append(info)
    return found


def tiny_constants(model: onnx.ModelProto) -> list[str]:
    """Scalar float initializers with 0 < |x| < 2**-14 (below the float16 normal range), and their consumers."""
    consumers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            consumers[i].append(f"`{n.name}`")
    lines = []
    for t in model.graph.initializer:
        if t.data_type != onnx.TensorProto.FLOAT or list(t.dims):
            continue
        x = float(onnx.numpy_helper.to_array(t))
        if 0.0 < abs(x) < 2.0**-14:
            users = ", ".join(consumers[t.name])
            lines.append(f"- `{t.name}` = {np.float32(x)!s} (float16 subnormal range), read by {users}")
    return lines


def ancestors_histogram(model: onnx.ModelProto, node_name: str) -> list[tuple[str, int]]:
    """Op types of every node the named node depends on (itself included): the mask-building subgraph."""
    producers = {o: n for n in model.graph.node for o in n.output}
    by_name = {n.name: n for n in model.graph.node}
    todo, seen = [by_name[node_name]], {}
    while todo:
        n = todo.pop()
        if n.name in seen:
            continue
        seen[n.name] = n
        todo += [producers[i] for i in n.input if i in producers]
    hist = collections.Counter(n.op_type for n in seen.values())
    return sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))


def constant_desc(model: onnx.ModelProto, name: str) -> str | None:
    for t in model.graph.initializer:
        if t.name == name:
            arr = onnx.numpy_helper.to_array(t)
            return f"constant {arr.dtype} {arr.tolist()}" if arr.size <= 4 else None
    return None


def format_mask_constants(model: onnx.ModelProto, consts: list[dict]) -> list[str]:
    lines = []
    producers = {o: n for n in model.graph.node for o in n.output}
    if not consts:
        return ["- none beyond the float16 range"]
    for c in consts:
        vals = ", ".join(str(np.float32(v)) for v in c["values"])
        kind = " (= `torch.finfo(torch.float32).min`, the float32 lowest)" if c["is_finfo_min"] else ""
        lines.append(f"- `{c['name']}`: {c['dtype']} {c['shape'] or 'scalar'} {c['where']}, value {vals}{kind}")
        for step in c["chain"]:
            extra = []
            for other in step["other_inputs"]:
                desc = constant_desc(model, other)
                if desc is None and other in producers:
                    desc = f"from {producers[other].op_type} `{producers[other].name}`"
                extra.append(f"`{other}`" + (f" ({desc})" if desc else ""))
            text = f"  - feeds `{step['op']}` `{step['node']}` as input {step['input_slot']}"
            lines.append(text + (f"; other inputs {', '.join(extra)}" if extra else ""))
            if step["op"] == "Where":
                hist = ", ".join(f"{k} {v}" for k, v in ancestors_histogram(model, step["node"]))
                lines.append(f"    - the `{step['node']}` mask subgraph (it and all its ancestors): {hist}")
    return lines


# --------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------
def random_feeds(rng, shapes, pad_last_row=True) -> list[dict[str, np.ndarray]]:
    feeds = []
    for b, s in shapes:
        ids = rng.integers(0, 256, (b, s)).astype(np.int64)
        mask = np.ones((b, s), np.int64)
        if b > 1 and pad_last_row:
            mask[-1, : s // 3] = 0  # left padding on the last row
        feeds.append({"input_ids": ids, "attention_mask": mask})
    return feeds


def build_plain(arch: str) -> dict:
    hf = build_hf_model(arch)
    model = LogitsWrapper(hf).eval()
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, 256, (2, 16), generator=gen)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, :4] = 0
    batch, seq = Dim("batch"), Dim("sequence", max=128)
    path = OUT_DIR / f"{arch}.onnx"
    config = describe_config(hf)
    export(
        model,
        (ids, mask),
        path,
        ["input_ids", "attention_mask"],
        ["logits"],
        ({0: batch, 1: seq}, {0: batch, 1: seq}),
        doc=f"{arch}: {config}; random init (seed {SEED}); no KV cache",
    )
    onnx_model = check_file(path, MAX_FILE_BYTES)
    sess = ort_session(path)
    rng = np.random.default_rng(SEED + 1)
    worst = 0.0
    for feeds in random_feeds(rng, ((2, 16), (1, 1), (1, 7), (3, 33), (2, 128))):
        shape = "x".join(map(str, feeds["input_ids"].shape))
        worst = max(worst, compare(sess, model, feeds, f"batch x sequence {shape}"))
    assert worst <= ATOL, f"{path.name}: {worst}"
    with torch.no_grad():
        logits_std = float(model(ids, mask).std())
    masks = check_masks(sess, getattr(hf.config, "sliding_window", None))
    return summarise(path, onnx_model, config, {"max_abs_diff": worst, "masks": masks, "logits_std": logits_std})


def build_kv(arch: str) -> dict:
    hf = build_hf_model(arch)
    c = hf.config
    model = KVCacheWrapper(hf).eval()
    layers, kv_heads, head_dim = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
    in_names, out_names = kv_names(layers)

    gen = torch.Generator().manual_seed(SEED)
    b0, p0, s0 = 2, 5, 3  # sizes >= 2 so that torch.export keeps the dims symbolic
    ids = torch.randint(0, 256, (b0, s0), generator=gen)
    mask = torch.ones(b0, p0 + s0, dtype=torch.int64)
    mask[1, :2] = 0
    pos = torch.from_numpy(positions_from_mask(mask.numpy())[:, p0:])
    past = tuple(torch.randn(b0, kv_heads, p0, head_dim, generator=gen) for _ in range(2 * layers))
    batch, seq = Dim("batch"), Dim("sequence", max=128)
    past_seq, total = Dim("past_sequence", max=128), Dim("total_sequence", max=256)
    path = OUT_DIR / f"{arch}_kv.onnx"
    config = describe_config(hf)
    export(
        model,
        (ids, mask, pos, *past),
        path,
        in_names,
        out_names,
        ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, tuple({0: batch, 2: past_seq} for _ in past)),
        doc=f"{arch}_kv: {config}; random init (seed {SEED}); KV cache in/out (DynamicCache)",
    )
    onnx_model = check_file(path, MAX_FILE_BYTES)
    sess = ort_session(path)

    rng = np.random.default_rng(SEED + 2)
    worst = {"past_sequence=0": 0.0, "past_sequence>0": 0.0}
    for b, p, s in ((2, 0, 7), (1, 0, 1), (3, 0, 16), (2, 5, 3), (1, 12, 1), (3, 9, 1), (2, 30, 4)):
        full = np.ones((b, p + s), np.int64)
        if b > 1:
            full[-1, : min(2, p + s - 1)] = 0  # left padding on the last row
        feeds = {
            "input_ids": rng.integers(0, 256, (b, s)).astype(np.int64),
            "attention_mask": full,
            "position_ids": positions_from_mask(full)[:, p:],
        }
        for name in in_names[3:]:
            feeds[name] = rng.standard_normal((b, kv_heads, p, head_dim)).astype(np.float32)
        key = "past_sequence=0" if p == 0 else "past_sequence>0"
        diff = compare(sess, model, feeds, f"batch {b}, past {p}, sequence {s}")
        worst[key] = max(worst[key], diff)
    assert max(worst.values()) <= ATOL, f"{path.name}: {worst}"
    greedy = check_greedy(sess, hf, layers, kv_heads, head_dim)
    return summarise(path, onnx_model, config, {"max_abs_diff": worst, "greedy": greedy})


def summarise(path: Path, model: onnx.ModelProto, config: str, checks: dict) -> dict:
    size = path.stat().st_size
    consts = mask_constants(model)
    hist = op_histogram(model)
    print(f"    file size: {size} bytes, sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}")
    print(f"    nodes: {len(model.graph.node)}, initializers: {len(model.graph.initializer)}")
    print("    op histogram: " + ", ".join(f"{k}={v}" for k, v in hist))
    for line in format_mask_constants(model, consts):
        print(f"    {line}")
    return {
        "file": path.name,
        "size": size,
        "nodes": len(model.graph.node),
        "inputs": io_desc(model.graph.input),
        "outputs": io_desc(model.graph.output),
        "config": config,
        "hist": hist,
        "mask_lines": format_mask_constants(model, consts),
        "tiny_lines": tiny_constants(model),
        "checks": checks,
    }


BUILDERS = {
    "llama": lambda: build_plain("llama"),
    "qwen2": lambda: build_plain("qwen2"),
    "mistral": lambda: build_plain("mistral"),
    "gemma": lambda: build_plain("gemma"),
    "llama_kv": lambda: build_kv("llama"),
    "qwen2_kv": lambda: build_kv("qwen2"),
}


# --------------------------------------------------------------------------
# README
# --------------------------------------------------------------------------
def write_readme(results: dict[str, dict]) -> None:
    import onnxscript
    import transformers

    total = sum(r["size"] for r in results.values())
    lines = [
        "# Tiny decoder language models",
        "",
        "Randomly initialised decoder-only LMs (no pretrained weights) exported to ONNX for the test suite.",
        "Generated by `tools/export_decoders.py` (this file too); do not edit by hand. Regenerate with",
        "",
        "    /work/export-venv/bin/python tools/export_decoders.py",
        "",
        "## How they were made",
        "",
        f"- torch {torch.__version__}, transformers {transformers.__version__}, onnx {onnx.__version__}, "
        f"onnxscript {onnxscript.__version__}, onnxruntime {ort.__version__}",
        "- exporter: dynamo (`torch.onnx.export(..., dynamo=True)`) at opset 18, onnxscript optimizer "
        "(constant folding, CSE), then rewritten to **opset 17**, standard `ai.onnx` ops only "
        "(helpers shared with `tools/export_models.py`)",
        '- attention: `attn_implementation="eager"`: transformers builds the causal + padding mask in the '
        "graph as a boolean tensor and turns it into an additive float mask with `Where(mask, 0.0, "
        "finfo(float32).min)`, added to the scaled `Q·Kᵀ` before `Softmax`",
        "- weights: Linear std 1/sqrt(fan_in), biases std 0.02, embeddings std 1 (1/sqrt(hidden) when tied and "
        "scaled by sqrt(hidden), Gemma), RMSNorm weights perturbed by std 0.1 noise; seed "
        f"{SEED}; all float32",
        "- checks: `onnx.checker.check_model(full_check=True)`; ONNX Runtime CPU vs torch on every output, "
        f"max abs diff <= {ATOL:g} over several batch / sequence (/ past) shapes; mask leak checks; "
        f"for the KV models a {GREEDY_STEPS}-step greedy generation through ONNX Runtime with the cache equals "
        "torch `generate(do_sample=False)` (batch 2, second row left-padded)",
        "- dims are symbolic: `batch`, `sequence`, and for the KV models `past_sequence` (0 allowed) and "
        "`total_sequence` (= past_sequence + sequence, the attention mask's length); position_ids for the KV "
        "models are `cumsum(attention_mask) - 1` (1 where padded), as `generate()` makes them",
        "",
        f"## Files ({total} bytes of ONNX in all)",
        "",
        "| file | nodes | size (bytes) | inputs | outputs |",
        "|---|---:|---:|---|---|",
    ]
    for r in results.values():
        ins = "<br>".join(r["inputs"])
        outs = "<br>".join(r["outputs"])
        lines.append(f"| `{r['file']}` | {r['nodes']} | {r['size']} | {ins} | {outs} |")
    lines += ["", "## Configs", ""]
    for r in results.values():
        lines.append(f"- `{r['file']}`: {r['config']}")
    lines += [
        "",
        "## Attention-mask constants",
        "",
        "Float constants outside the float16 range (|x| > 65504 or infinite) in each graph and the ops they",
        "feed, followed down to the `Softmax`. Found by scanning initializers and `Constant` nodes with onnx.",
        "",
    ]
    for r in results.values():
        lines += [f"### `{r['file']}`", "", *r["mask_lines"]]
        if r["tiny_lines"]:
            lines += ["- other float constants beyond the float16 normal range:", *["  " + x for x in r["tiny_lines"]]]
        lines.append("")
    lines += [
        "Summary: in every model the only float constant outside the float16 range is one scalar",
        "`-3.4028235e+38` (`torch.finfo(torch.float32).min`), the `Y` input of the single `Where` that turns the",
        "boolean causal (+ padding, + for Mistral sliding-window) mask into an additive float mask (`X` is a",
        "scalar `0.0`). The `Where` output, [batch, 1, sequence, kv_sequence], is shared by both layers: each adds it",
        "(`Add`, second input) to the scaled scores `Mul(MatMul(Q, Kᵀ), 0.25)` right before `Softmax(axis=-1)`.",
        "No `-inf` constant, no `Expand` between the `Where` and the `Add`s (in the KV models the boolean",
        "mask is expanded before the `Where`), no `Cast` of the float mask. The query rows of left-padding",
        "positions are masked in every column (all `finfo.min`); softmax of such a row is uniform, and all",
        "outputs were checked to be finite. The RMSNorm epsilon (1e-6) is the one scalar below the float16",
        "normal range (listed above per model).",
        "",
        "Other notes: Gemma ties its embeddings: `/model/embed_tokens/Gather` and `/lm_head/Transpose` (then",
        "`/lm_head/MatMul`) read the same initializer `model.lm_head.weight`, and the embedding output is",
        "multiplied by `embed_scale` = 8.0; its GELU-tanh gate is decomposed (`Pow`, `Tanh`, `Mul`, `Add`), and",
        "its RMSNorm multiplies by `1 + weight` computed in the graph. Qwen2's q/k/v biases are `Add`s after the",
        "`MatMul`s. Rotary embeddings are computed in the graph from `position_ids` (`Cos`/`Sin` of",
        "`position × inv_freq`), with no position table.",
        "",
        "## Verification",
        "",
    ]
    for r in results.values():
        ch = r["checks"]
        if "greedy" in ch:
            d = ch["max_abs_diff"]
            g = ch["greedy"]
            lines.append(
                f"- `{r['file']}`: max abs diff {d['past_sequence=0']:.3e} (past_sequence = 0), "
                f"{d['past_sequence>0']:.3e} (past_sequence > 0); greedy tokens torch {g['torch']} "
                f"ort {g['ort']}: {'agree' if g['agree'] else 'DIFFER'}"
            )
        else:
            m = ch["masks"]
            text = (
                f"- `{r['file']}`: max abs diff {ch['max_abs_diff']:.3e}; logits std {ch['logits_std']:.2f}; "
                f"causal leak {m['causal_leak']:.1e}, left-padding leak {m['padding_leak']:.1e}"
            )
            if "window_leak" in m:
                text += f", sliding-window leak {m['window_leak']:.1e}"
            lines.append(text)
    lines += ["", "## Op-type histograms", ""]
    for r in results.values():
        lines.append(f"- `{r['file']}`: " + ", ".join(f"{k} {v}" for k, v in r["hist"]))
    lines.append("")
    (OUT_DIR / "README.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"subset, from {list(BUILDERS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in BUILDERS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(BUILDERS)}")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    names = args.models or list(BUILDERS)
    results = {}
    for name in names:
        print(f"== {name}")
        results[name] = BUILDERS[name]()
    total = sum(p.stat().st_size for p in OUT_DIR.glob("*.onnx"))
    print(f"folder total (onnx files): {total} bytes")
    assert total < MAX_DIR_BYTES, total
    if not args.models:
        write_readme(results)
        print(f"wrote {OUT_DIR / 'README.md'}")
    print("all models exported and verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
