"""Stage: validate / masks. Which positions of an output are padding, read from the model's
attention-mask inputs, so that validation compares what a user reads.

A BERT-style encoder takes `attention_mask [batch, seq]` (1: a real token, 0: padding) and gives
`last_hidden_state [batch, seq, hidden]`. Whatever the model computes at a padded position is
never read: pooling, the loss and every head mask it. Those positions still differ between fp32
and fp16 (a fully masked row attends uniformly over noise, and its values are a model's garbage),
and compared with the rest they can fail a conversion whose real tokens agree to 1e-4. So an
output whose leading dimensions are the mask's shape is compared where the mask says "real
token"; `--compare-padded` compares everything.

A mask input is an integer or bool input of rank 2 or more whose name contains `mask`, holding
only 0 and 1 in the batch. A name that contains `pad` (PyTorch's `key_padding_mask`,
`src_key_padding_mask`) marks padding with 1; any other (`attention_mask`, `input_mask`) marks
real tokens with 1. An output goes with the first mask input (in the model's order) whose shape is
its leading dimensions in the batch, unless the model declares that axis of the mask symbolic and
the output's a fixed size (e.g. a pooled `[batch, 64]` beside a mask `[batch, sequence]` of 64
positions: the 64 is the hidden size, not the positions)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx

MASK_NAME = re.compile(r"mask", re.I)
PAD_NAME = re.compile(r"pad", re.I)  # such a mask marks padding with 1 (PyTorch's key_padding_mask)
INTEGER_TYPES = {
    onnx.TensorProto.BOOL,
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
}


def _declared(value_info: onnx.ValueInfoProto) -> list | None:
    """The declared dims of a tensor value: int (a size), str (a symbolic name) or None (unknown);
    None when the value declares no shape."""
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def is_mask_name(name: str) -> bool:
    """Whether an input's name says it is an attention or padding mask."""
    return bool(MASK_NAME.search(name))


def marks_padding(name: str) -> bool:
    """Whether a mask of this name marks padding with 1 (else it marks real tokens with 1)."""
    return bool(PAD_NAME.search(name))


def generated_mask(name: str, pattern: np.ndarray) -> np.ndarray:
    """A generated mask in the convention its name implies: `pattern` is an attention-mask
    pattern (1 real, 0 padded; see inputs.attention_mask), inverted for a name that marks
    padding with 1."""
    return (1 - pattern) if marks_padding(name) else pattern


@dataclass(frozen=True)
class _MaskInput:
    name: str
    declared: list | None


class Padding:
    """The padded positions of each output, batch by batch (see the module docstring).
    `compare_padded` turns it off: every position is compared."""

    def __init__(self, model: onnx.ModelProto, compare_padded: bool = False):
        self.compare_padded = compare_padded
        inits = {t.name for t in model.graph.initializer}
        self.masks = [
            _MaskInput(vi.name, _declared(vi))
            for vi in model.graph.input
            if vi.name not in inits
            and is_mask_name(vi.name)
            and vi.type.HasField("tensor_type")
            and vi.type.tensor_type.elem_type in INTEGER_TYPES
        ]
        self.outputs = {vi.name: _declared(vi) for vi in model.graph.output}

    def keep(self, feeds: dict, output: str, ref: np.ndarray) -> tuple[str, np.ndarray] | None:
        """(the mask input's name, a bool array of the output's leading shape: True where the
        position is compared), or None when no mask goes with this output (or --compare-padded)."""
        if self.compare_padded:
            return None
        for mask in self.masks:
            value = feeds.get(mask.name)
            if not isinstance(value, np.ndarray) or value.ndim < 2 or value.dtype.kind not in "biu":
                continue
            if ref.ndim < value.ndim or tuple(ref.shape[: value.ndim]) != value.shape:
                continue
            if not self._axes_agree(mask, output, value.ndim):
                continue
            if value.size and not np.isin(value, (0, 1)).all():
                continue
            visible = value.astype(bool)
            return mask.name, ~visible if marks_padding(mask.name) else visible
        return None

    def _axes_agree(self, mask: _MaskInput, output: str, rank: int) -> bool:
        """False when an axis the mask declares symbolic (batch, sequence) is a fixed size in the
        output's declaration: then the sizes agree only by chance."""
        out_dims = self.outputs.get(output)
        if mask.declared is None or out_dims is None or len(out_dims) < rank:
            return True
        return not any(
            isinstance(m, str) and isinstance(o, int) and o > 0 for m, o in zip(mask.declared[:rank], out_dims[:rank])
        )
