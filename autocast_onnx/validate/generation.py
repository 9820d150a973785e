"""Stage: validate / generation. Causal language models: how to feed them (a KV cache's inputs
are realistic only when a model wrote them) and the task-level metric, greedy-continuation
agreement: from the same prompt, the reference and the converted model each generate N tokens
by argmax, feeding back their own tokens (and their own cache); the score of a prompt is the
number of tokens that agree before the first divergence.

A model is a causal LM here when it takes an integer `input_ids` [batch, sequence] and returns
float `logits` [batch, sequence, vocab]; it has a cache when its inputs `past_key_values.N.key`
/ `.value` (or `past.N.key` / `.value`) pair with outputs `present.N.key` / `.value`, each
[batch, heads, sequence, head_dim] with fixed heads and head_dim. `attention_mask` and
`position_ids` are fed when the model has them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto

from . import runner

PAST = re.compile(r"^(past_key_values|past)\.(\d+)\.(key|value)$")
INTS = (TensorProto.INT64, TensorProto.INT32)
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
DEFAULT_TOKENS = 16
PROMPT_LENGTH = 8
BATCH = 2  # prompts: one full, one left-padded
NEW_TOKENS = 4  # tokens after a written cache, in the per-logit comparison


@dataclass
class CausalLM:
    """What the generation loop needs to know of a causal LM's signature."""

    logits: str
    vocab: int | None
    attention_mask: str | None = None
    position_ids: str | None = None
    cache: list = field(default_factory=list)  # (past input, present output, [heads, head_dim])

    @property
    def has_cache(self) -> bool:
        return bool(self.cache)


def _dims(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]


def recognise(model: onnx.ModelProto) -> CausalLM | None:
    """The causal-LM signature of `model`, or None when it has none (see the module docstring)."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    outputs = {vi.name: vi for vi in model.graph.output}
    ids, logits = inputs.get("input_ids"), outputs.get("logits")
    if ids is None or logits is None:
        return None
    if ids.type.tensor_type.elem_type not in INTS or len(_dims(ids)) != 2:
        return None
    if logits.type.tensor_type.elem_type not in FLOATS or len(_dims(logits)) != 3:
        return None
    lm = CausalLM(logits="logits", vocab=_dims(logits)[2])
    for name in ("attention_mask", "position_ids"):
        vi = inputs.get(name)
        if vi is not None and vi.type.tensor_type.elem_type in INTS and len(_dims(vi)) == 2:
            setattr(lm, name, name)
    for name, vi in inputs.items():
        m = PAST.match(name)
        if m is None:
            continue
        present = f"present.{m.group(2)}.{m.group(3)}"
        dims = _dims(vi)
        if present not in outputs or len(dims) != 4 or dims[1] is None or dims[3] is None:
            return None  # a cache the loop cannot build: not fed as a causal LM
        lm.cache.append((name, present, [dims[1], dims[3]]))
    covered = {"input_ids", lm.attention_mask, lm.position_ids, *(p for p, _, _ in lm.cache)}
    if set(inputs) - covered:
        return None  # other inputs (pixel values, encoder states): not a plain causal LM
    return lm


def prompts(lm: CausalLM, batch: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) of `batch` prompts of `length` tokens: the first row full, the
    others left-padded by a growing amount (as batched generation pads them), never fully."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, lm.vocab or 100, size=(batch, length)).astype(np.int64)
    mask = np.ones((batch, length), np.int64)
    for row in range(1, batch):
        mask[row, : min(length - 1, row * max(1, length // 4))] = 0
    return ids, mask


def _positions(mask: np.ndarray, start: int, count: int) -> np.ndarray:
    """Position ids of the last `count` columns of `mask`: the number of visible tokens before each
    (padding positions get 1, as transformers' generation does)."""
    pos = np.cumsum(mask, axis=1) - 1
    pos = np.where(mask == 0, 1, pos)
    return pos[:, start : start + count].astype(np.int64)


def step_feeds(lm: CausalLM, sess, ids: np.ndarray, mask: np.ndarray, past: dict | None) -> dict:
    """Feeds for one call: `ids` the new tokens, `mask` over past and new tokens, `past` the cache
    (None: an empty one)."""
    feeds = {"input_ids": ids.astype(np.int64)}
    done = mask.shape[1] - ids.shape[1]
    if lm.attention_mask:
        feeds[lm.attention_mask] = mask
    if lm.position_ids:
        feeds[lm.position_ids] = _positions(mask, done, ids.shape[1])
    for name, _, (heads, head_dim) in lm.cache:
        feeds[name] = past[name] if past is not None else np.zeros((ids.shape[0], heads, 0, head_dim), np.float32)
    return runner.feeds_for(sess, feeds)


def cached_batch(lm: CausalLM, ref_sess, batch: int, past_length: int, new: int, seed: int) -> dict:
    """A batch for the per-logit comparison of a model with a cache: the reference reads a prompt of
    `past_length` tokens with an empty cache, and its cache then comes with `new` more tokens. The
    converted model gets the same cache, in its own input types."""
    ids, mask = prompts(lm, batch, past_length + new, seed)
    names = [o.name for o in ref_sess.get_outputs()]
    first = dict(
        zip(names, ref_sess.run(None, step_feeds(lm, ref_sess, ids[:, :past_length], mask[:, :past_length], None)))
    )
    past = {p: first[present] for p, present, _ in lm.cache}
    return step_feeds(lm, ref_sess, ids[:, past_length:], mask, past)


def greedy(lm: CausalLM, sess, ids: np.ndarray, mask: np.ndarray, tokens: int) -> np.ndarray:
    """`tokens` tokens generated greedily after each prompt row: [batch, tokens]."""
    names = [o.name for o in sess.get_outputs()]
    out = np.zeros((ids.shape[0], tokens), np.int64)
    past = None
    new_ids = ids
    for t in range(tokens):
        if lm.has_cache:
            result = dict(zip(names, sess.run(None, step_feeds(lm, sess, new_ids, mask, past))))
            past = {p: result[present] for p, present, _ in lm.cache}
        else:
            result = dict(zip(names, sess.run(None, step_feeds(lm, sess, ids, mask, None))))
        logits = np.asarray(result[lm.logits], dtype=np.float32)[:, -1, :]
        nxt = np.argmax(logits, axis=-1).astype(np.int64)
        out[:, t] = nxt
        new_ids = nxt[:, None]
        ids = np.concatenate([ids, new_ids], axis=1)
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
    return out


def agreement(lm: CausalLM, ref_sess, conv_sess, tokens: int, batch: int, seed: int) -> dict:
    """Greedy-continuation agreement of the converted model with the reference (see the module
    docstring), as the validation report's "generation" entry."""
    ids, mask = prompts(lm, batch, PROMPT_LENGTH, seed)
    want = greedy(lm, ref_sess, ids, mask, tokens)
    got = greedy(lm, conv_sess, ids, mask, tokens)
    agree = []
    for row_want, row_got in zip(want, got):
        differ = np.flatnonzero(row_want != row_got)
        agree.append(int(differ[0]) if differ.size else tokens)
    return {
        "tokens": tokens,
        "prompts": batch,
        "prompt_length": PROMPT_LENGTH,
        "cache": lm.has_cache,
        "agreeing_tokens": agree,
        "min_agreeing_tokens": min(agree),
        "mean_agreeing_tokens": float(np.mean(agree)),
        "all_agree": all(a == tokens for a in agree),
        "reference_tokens": want.tolist(),
        "converted_tokens": got.tolist(),
    }
