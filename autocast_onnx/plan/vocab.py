"""The planner's vocabulary: the named values that classification, painting, the plan and the
rewrite speak in. Each is a str-valued Enum whose values are the one- or few-character codes
stored in the compact per-node arrays and in the plan's JSON, so a member compares equal to
its code (`PortRole.FOLLOW == "p"`), hashes like it (a member finds its code's dict entry),
and membership tests on code strings stay fast (`role in "pa"`).
"""

from __future__ import annotations

from enum import Enum

from ..dtypes import BFLOAT16, FLOAT, FLOAT16


class _Code(str, Enum):
    """A named code: equal to, hashed like and printed as its value. Each member is declared as
    `NAME = "code", "what it means"`: `description` is that sentence, which the legend of a plan
    file (plan.model.vocabulary) gives for the code."""

    description: str

    def __new__(cls, value: str, description: str = ""):
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    # str's own C hash, not a Python method: plans look members up in dicts 10^5 times
    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value


class Precision(_Code):
    """The precision a node computes in, as written in a plan. It is the one type a precision
    travels as from the command line to the rewrite; `elem_type` gives the ONNX element type."""

    FP16 = "fp16", "IEEE half precision: max 65504, smallest subnormal 2**-24."
    BF16 = "bf16", "bfloat16: the fp32 range with an 8-bit mantissa."
    FP32 = "fp32", "Single precision: what the model computed in before conversion."
    UNCHANGED = (
        "unchanged",
        "Keeps the types it had: not a float op, a control-flow node whose bodies are planned node by node, or a "
        "float op that nothing moved.",
    )

    @property
    def elem_type(self) -> int | None:
        """The ONNX TensorProto element type, or None for UNCHANGED."""
        return _ELEM_TYPE.get(self.value)

    @property
    def is_low(self) -> bool:
        return self.value in ("fp16", "bf16")

    @classmethod
    def target(cls, value: str | Precision) -> Precision:
        """A conversion target (fp16 or bf16) from its name; ValueError for anything else."""
        precision = cls(value)
        if not precision.is_low:
            raise ValueError(f"{value!r} is not a low-precision target (use fp16 or bf16)")
        return precision


_ELEM_TYPE: dict[str, int] = {"fp16": FLOAT16, "bf16": BFLOAT16, "fp32": FLOAT}
PRECISION_OF_TYPE: dict[int, Precision] = {FLOAT16: Precision.FP16, BFLOAT16: Precision.BF16, FLOAT: Precision.FP32}


class Category(_Code):
    """An op's category, from the rule files. The code is one character; `rule_name` is the
    name used in rule files, plans and reports."""

    LOW_PRECISION = "L", "Computes in low precision whenever it can (MatMul, Conv, Gemm, attention)."
    FOLLOW = "F", "Takes the precision of its inputs: low after low nodes, fp32 after fp32 ones (Add, Mul, Relu)."
    KEEP_FP32 = "K", "Always fp32: softmax, normalizations, reductions, exp/log/pow, losses."
    CLEAR = (
        "C",
        "Moves or selects values without arithmetic (Reshape, Transpose, Gather, Cast): any precision is exact, so it "
        "goes where its neighbours are.",
    )
    NON_FLOAT = "N", "Has no float tensor whose type the converter may change (shape, integer and bool ops)."
    CONTROL_FLOW = (
        "X",
        "If, Loop, Scan and other nodes with subgraphs: their bodies are planned node by node and their own inputs "
        "and outputs keep their types.",
    )

    @property
    def rule_name(self) -> str:
        return _CATEGORY_NAME[self.value]

    @classmethod
    def from_rule_name(cls, name: str) -> Category:
        return cls(_CATEGORY_CODE[name])


_CATEGORY_NAME = {
    "L": "low_precision",
    "F": "follow",
    "K": "keep_fp32",
    "C": "clear",
    "N": "non_float",
    "X": "control_flow",
}
_CATEGORY_CODE = {v: k for k, v in _CATEGORY_NAME.items()}
CATEGORY_NAME = dict(_CATEGORY_NAME)
"""code -> rule-file name, for the compact per-node arrays."""


class PortRole(_Code):
    """What a node's input or output port does with the precision plan. Classification gives each
    port one role; a node's roles are stored as a string, one character per port ("pfx")."""

    FOLLOW = "p", "A float tensor that takes the node's planned precision."
    FP32 = (
        "f",
        "Pinned fp32 whatever the node's precision: a rule file pin (Resize `scales`) or a schema that allows only "
        "fp32 at this port.",
    )
    NONE = (
        "x",
        "Not a float tensor, an absent optional port, or a port whose schema allows neither the target type nor fp32: "
        "never cast.",
    )
    UNKNOWN = "u", "A float-capable port whose tensor has no known type: the node is frozen, left as it is."
    ANY = (
        "a",
        "The op reads only the shape or passes the value to a cast (Shape, Cast input): any float type will do, so no "
        "cast is added in front of it.",
    )
    OWN = (
        "o",
        "Keeps the type it has: a control-flow node's inputs and outputs, the tensors a sequence or optional op puts "
        "in or takes out, an author's explicit cast to fp16/bf16.",
    )


class Paint(_Code):
    """The painter's state of a node while the passes run (TensorFlow's allow/deny/infer)."""

    LOW = "A", "Allow: computes in the target type."
    FP32 = "D", "Deny: computes in fp32."
    UNDECIDED = "U", "Follows its neighbours; still open while the passes run."
    NONE = "-", "Not painted: no float port follows its precision (non-float, control flow)."


class Seed(_Code):
    """Why classification fixed a node's paint before painting starts."""

    DENY = "deny", "A rule, a command-line flag, a data rule or calibration keeps it fp32."
    ALLOW = "allow", "A rule or a command-line flag forces it to low precision."
    SCHEMA = "schema", "Its schema has no low-precision type for its tensors: fp32, but it starts no fp32 taint."


def required_type(role: str, node_type: int | None, value_dtype: int | None) -> int | None:
    """The element type a consumer needs at an input port: the one rule painting and the rewrite
    share. `node_type` is the type the consumer computes in (None when it keeps its own types).
    None means any type will do (no cast is ever added for that port)."""
    if role == "p":
        return node_type if node_type is not None else value_dtype
    if role == "f":
        return FLOAT
    if role == "o":
        return value_dtype
    return None


ROLE_WORDS: dict[str, str] = {
    "p": "follows the node",
    "f": "fp32",
    "x": "never cast",
    "u": "unknown type",
    "a": "any type",
    "o": "keeps its type",
}
"""A few words per PortRole code, for messages that name a role."""

FITTING_ROLES: dict[str, str] = {
    # an optional port left empty, or a tensor that is not float (int64, bool, string)
    "absent": "x",
    "not-float": "x",
    # a tensor whose type is unknown: frozen (u), or never cast where a rule file pins the port or
    # the node is not planned (non_float, control_flow)
    "unknown": "ux",
    # a float input or output of a control-flow node or of a node that reads or writes a sequence or
    # optional (plan.classify.holds_container), or an author's Cast to fp16/bf16
    "own": "o",
    # a float Cast output to fp32: the author's way back, which follows the node
    "cast-back": "p",
    # an input whose type the op does not care about (Shape, Size, a Cast's input): any type
    # will do, or fp32 where its schema admits fp32 but not the target
    "any": "a",
    "any-fp32": "f",
    # a float port whose schema admits the target: it follows the node, or a rule file pins it
    # fp32 (rule-file pins are not in the plan file, so replay accepts f at any such port)
    "follow": "pf",
    # the same where the schema admits the target but not fp32: a pin cannot hold
    "follow-low-only": "p",
    # a float port whose schema admits fp32 but not the target: fp32; p is accepted for a node
    # that computes in fp32 (replay refuses it for a low one, naming the schema)
    "fp32-only": "fp",
    # a float port whose schema admits neither the target nor fp32
    "no-type": "x",
}
"""Which PortRole codes a plan may give a port, by what the port is: exactly the roles
classification can write there (with or without a rule-file pin). Any other role gives a model
ONNX Runtime refuses: `x` or `a` at a float port of an fp16 node leaves that tensor in whatever
type its producer gives, `o` keeps fp32 where the node's type parameter is fp16, and so on.

Beyond one port: a port with role `f` and one with role `p` that share a schema type parameter
(MatMul's A and B, Add's inputs and output) bind it to two types unless the node computes in fp32,
so replay refuses that mix for a node in fp16, bf16 or unchanged (classification pins the whole
group, as BatchNormalization's parameters before opset 15 show)."""
