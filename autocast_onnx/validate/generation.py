"""Stage: validate / generation. Causal language models: how to feed them (a KV cache's inputs
are realistic only when a model wrote them) and the task-level metric, greedy-continuation
agreement: from the same prompt, the reference and the converted model each generate N tokens
by argmax, feeding back their own tokens (and their own cache); the score of a prompt is the
number of tokens that agree before the first divergence.

A model is a causal LM here when it takes an integer `input_ids` [batch, sequence] and returns
float `logits` [batch, sequence, vocab]; it has a cache when its inputs `past_key_values.N.key`
/ `.value` (or `past.N.key` / `.value`) pair with outputs `present.N.key` / `.value`, each
[batch, heads, sequence, head_dim] with fixed heads and head_dim. `attention_mask` and
`position_ids` are fed when the model has them.

A model exported with fixed shapes (input_ids [2, 64]) takes prompts of exactly that batch and
length: without a cache, each prompt is right-padded to the fixed length (masked where the model
has an attention mask; a causal model's logits at a position never read later positions), the
next token is read at the prompt's last position and written into the first padded one, so at
most length - prompt tokens are generated. A model with a cache and fixed sequence axes cannot
take a growing cache: its continuation is skipped, and the report says why."""

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
    batch: int | None = None  # input_ids' fixed batch size, None when dynamic
    length: int | None = None  # input_ids' fixed sequence length, None when dynamic
    fixed_cache: str | None = None  # why the cache cannot grow (a fixed sequence axis), or None

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
    batch, length = _dims(ids)
    lm = CausalLM(logits="logits", vocab=_dims(logits)[2], batch=batch or None, length=length or None)
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
        if dims[2] is not None and lm.fixed_cache is None:
            lm.fixed_cache = f"{name} has the fixed sequence length {dims[2]}"
    if lm.cache and lm.length is not None and lm.fixed_cache is None:
        lm.fixed_cache = f"input_ids has the fixed sequence length {lm.length}"
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
    feeds = step_feeds(lm, ref_sess, ids[:, :past_length], mask[:, :past_length], None)
    first = _run(ref_sess, feeds, "pass batches of your own with --inputs")
    past = {p: first[present] for p, present, _ in lm.cache}
    return step_feeds(lm, ref_sess, ids[:, past_length:], mask, past)


def _run(sess, feeds: dict, hint: str = "compare without the continuation: --generate 0") -> dict:
    """The outputs of one call by name; a failure is runner.run's one-line AutocastError, naming
    the shapes fed."""
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, runner.run(sess, feeds, lambda: _shapes(feeds), hint)))


def _shapes(feeds: dict) -> str:
    return "; ".join(f"{k} {list(np.shape(v))}" for k, v in feeds.items())


def greedy(lm: CausalLM, sess, ids: np.ndarray, mask: np.ndarray, tokens: int) -> np.ndarray:
    """`tokens` tokens generated greedily after each prompt row: [batch, tokens]."""
    if lm.length is not None and not lm.has_cache:
        return _greedy_fixed(lm, sess, ids, mask, tokens)
    out = np.zeros((ids.shape[0], tokens), np.int64)
    past = None
    new_ids = ids
    for t in range(tokens):
        if lm.has_cache:
            result = _run(sess, step_feeds(lm, sess, new_ids, mask, past))
            past = {p: result[present] for p, present, _ in lm.cache}
        else:
            result = _run(sess, step_feeds(lm, sess, ids, mask, None))
        logits = np.asarray(result[lm.logits], dtype=np.float32)[:, -1, :]
        nxt = np.argmax(logits, axis=-1).astype(np.int64)
        out[:, t] = nxt
        new_ids = nxt[:, None]
        ids = np.concatenate([ids, new_ids], axis=1)
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
    return out


def _greedy_fixed(lm: CausalLM, sess, ids: np.ndarray, mask: np.ndarray, tokens: int) -> np.ndarray:
    """greedy() for a model of fixed sequence length without a cache: each call takes the whole
    window, the prompt and the tokens so far followed by padding (masked), and the next token is
    read at the last filled position."""
    rows, filled = ids.shape
    length = int(lm.length or 0)  # set: greedy() takes this path for a fixed length only
    window = np.zeros((rows, length), np.int64)
    visible = np.zeros((rows, length), np.int64)
    window[:, :filled], visible[:, :filled] = ids, mask
    out = np.zeros((rows, tokens), np.int64)
    for t in range(tokens):
        result = _run(sess, step_feeds(lm, sess, window, visible, None))
        nxt = np.argmax(np.asarray(result[lm.logits], dtype=np.float32)[:, filled - 1, :], axis=-1).astype(np.int64)
        out[:, t] = nxt
        window[:, filled], visible[:, filled] = nxt, 1
        filled += 1
    return out


def fit(lm: CausalLM, tokens: int) -> tuple[int, int, int] | str:
    """(prompts, prompt length, tokens) of the continuation that `lm`'s shapes take, or why it
    cannot be compared: a fixed batch sets the prompts, a fixed sequence length bounds the prompt
    and the tokens (the prompt at most half of it, PROMPT_LENGTH at most)."""
    if lm.fixed_cache:
        return (
            f"greedy continuation not compared: {lm.fixed_cache}, so the KV cache cannot grow token by token "
            "(export the model with dynamic sequence axes to compare it)"
        )
    batch = lm.batch or BATCH
    if lm.length is None:
        return batch, PROMPT_LENGTH, tokens
    if lm.length < 2:
        return (
            "greedy continuation not compared: input_ids has the fixed sequence length 1, which holds no continuation"
        )
    length = min(PROMPT_LENGTH, lm.length // 2)
    return batch, length, min(tokens, lm.length - length)


def agreement(
    lm: CausalLM, ref_sess, conv_sess, tokens: int, batch: int, seed: int, length: int = PROMPT_LENGTH
) -> dict:
    """Greedy-continuation agreement of the converted model with the reference (see the module
    docstring), as the validation report's "generation" entry: `batch` prompts of `length` tokens
    (see fit)."""
    ids, mask = prompts(lm, batch, length, seed)
    want = greedy(lm, ref_sess, ids, mask, tokens)
    got = greedy(lm, conv_sess, ids, mask, tokens)
    agree = []
    for row_want, row_got in zip(want, got):
        differ = np.flatnonzero(row_want != row_got)
        agree.append(int(differ[0]) if differ.size else tokens)
    return {
        "tokens": tokens,
        "prompts": batch,
        "prompt_length": length,
        "fixed_length": lm.length,
        "cache": lm.has_cache,
        "agreeing_tokens": agree,
        "min_agreeing_tokens": min(agree),
        "mean_agreeing_tokens": float(np.mean(agree)),
        "all_agree": all(a == tokens for a in agree),
        "reference_tokens": want.tolist(),
        "converted_tokens": got.tolist(),
    }
