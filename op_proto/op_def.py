"""What GE knows about an operator before any kernel runs: its prototype.

A prototype names the inputs, outputs and attributes of one GE op type, in order,
with the dtypes each tensor may take and each attribute's type and default. It
also carries the op's InferDataType and InferShape, which double as the input
validation that every entry point shares (eager call, fake tensor, graph build):
each failure names the op, where it was caught, the tensor, what was expected
and what came.

Shapes here are tuples whose entries are ints, torch SymInts (under
torch.compile) or -1 for a dimension GE does not know until run time.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
UNKNOWN_DIM = -1
UNKNOWN_RANK_DIM = -2  # GE's shape [-2]: the rank itself is unknown, so is every dim

# Where a check ran, as printed in error messages.
WHERE_EAGER = "eager call"
WHERE_FAKE = "fake/meta kernel, e.g. torch.compile tracing"
WHERE_GRAPH = "graph build, InferShape"
WHERE_PROTOTYPE = "graph build, prototype check"

ATTR_KINDS = {"Int": int, "Float": float, "Bool": bool, "Str": str}


class AttnResInputError(ValueError):
    """Bad input to a Block AttnRes op, caught before any kernel runs."""


@dataclass(frozen=True)
class TensorArg:
    """One input or output of a prototype."""

    name: str
    dtypes: tuple[torch.dtype, ...]
    layout: str  # the shape in docs/contract.md's letters, e.g. "[T, N, H]"
    presence: str = "required"  # "required" | "optional" | "dynamic"
    # What this package's CPU kernels accept where it is more than the OpDef's `dtypes` (which the C++
    # OpDef and the exported REG_OP declare, CANN's list); None: the OpDef's list. InferDataType checks it.
    cpu_dtypes: tuple[torch.dtype, ...] | None = None

    @property
    def accepted_dtypes(self) -> tuple[torch.dtype, ...]:
        """The dtypes an eager, fake or local-GE call may pass for this tensor."""
        return self.dtypes if self.cpu_dtypes is None else self.cpu_dtypes

    def letters(self) -> list[str]:
        """The dimension letters of the layout's first form in order, e.g. ["T", "N"] for "[T, N+1] or [0]"."""
        return [term for dim in _layout_dims(self.layout) for term in dim.split("+") if term.isalpha()]

    def example_shape(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        """The layout's first form with `dims` put in for its letters ("[T, N+1]" with T=4, N=2: (4, 3))."""
        return tuple(sum(dims[term] if term.isalpha() else int(term) for term in dim.split("+"))
                     for dim in _layout_dims(self.layout))


def _layout_dims(layout: str) -> list[str]:
    """The dims of a layout's first form, spaces removed: "[1, H] or [H]" -> ["1", "H"]."""
    first = layout.split(" or ")[0].strip()
    inside = first[first.index("[") + 1:first.index("]")]
    return [dim.replace(" ", "") for dim in inside.split(",") if dim.strip()]


@dataclass(frozen=True)
class AttrArg:
    """One attribute of a prototype; `default` None means the attribute is required."""

    name: str
    kind: str  # a key of ATTR_KINDS
    default: Any = None


@dataclass(frozen=True)
class TensorMeta:
    """What InferShape sees of a tensor: shape, dtype and (when known) device."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device | None = None

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorMeta:
        return cls(tuple(tensor.shape), tensor.dtype, tensor.device)


def is_unknown(dim) -> bool:
    return isinstance(dim, int) and dim < 0


def is_unknown_rank(shape: Sequence) -> bool:
    """GE's shape [-2]: neither the rank nor any dim is known yet."""
    return len(shape) == 1 and isinstance(shape[0], int) and shape[0] == UNKNOWN_RANK_DIM


def rows_of(blocks):
    """N+1 value rows for N blocks; unknown stays unknown."""
    return UNKNOWN_DIM if is_unknown(blocks) else blocks + 1


def float32(value: float) -> float:
    """`value` rounded to float32 as GE and the kernels store it (inf past float32's range, never an error)."""
    value = float(value)
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:  # struct refuses exactly where the rounding gives an infinity
        return math.copysign(math.inf, value)


def format_shape(shape: Sequence) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class Checker:
    """Raises AttnResInputError with the op, the stage and the offending tensor named."""

    def __init__(self, op_type: str, where: str):
        self.op_type = op_type
        self.where = where

    def fail(self, message: str) -> NoReturn:
        raise AttnResInputError(f"{self.op_type} ({self.where}): {message}")

    def dtype_in(self, name: str, meta: TensorMeta, allowed: Sequence[torch.dtype]) -> None:
        if meta.dtype not in allowed:
            names = ", ".join(str(d) for d in allowed)
            self.fail(f"{name} must have dtype in ({names}), got {meta.dtype}")

    def same_dtype(self, name: str, meta: TensorMeta, ref_name: str, ref: TensorMeta) -> None:
        if meta.dtype != ref.dtype:
            self.fail(f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {meta.dtype}")

    def shape(self, name: str, meta: TensorMeta, layout: Sequence[str], expected: Sequence) -> tuple:
        """Check rank and every known expected dim (None = any); return the shape.

        An unknown rank ([-2]) passes and reads as that many unknown dims, as the C++ InferShape treats it."""
        shape = meta.shape
        if is_unknown_rank(shape):
            return (UNKNOWN_DIM,) * len(layout)

        def described() -> str:
            wanted = ["*" if e is None else e for e in expected]
            return f"[{', '.join(layout)}] = {format_shape(wanted)}"

        if len(shape) != len(layout):
            self.fail(f"{name} must be {len(layout)}-D {described()}, got shape {format_shape(shape)}")
        for dim, want in zip(shape, expected, strict=True):
            if want is None or is_unknown(dim) or is_unknown(want):
                continue
            if dim != want:
                self.fail(f"{name} must have shape {described()}, got {format_shape(shape)}")
        return tuple(shape)

    def dim_in_range(self, name: str, letter: str, meaning: str, value, low: int, high: int | None) -> None:
        """`name`'s dim `letter` must lie in [low, high] (no upper bound when high is None)."""
        if is_unknown(value):
            return
        if value < low or (high is not None and value > high):
            bound = f"{low} <= {letter} <= {high}" if high is not None else f"{letter} >= {low}"
            self.fail(f"{name} must have {bound} ({meaning}), got {letter} = {value}")

    def same_device(self, inputs: Mapping[str, TensorMeta]) -> None:
        devices = {name: meta.device for name, meta in inputs.items() if meta.device is not None}
        if len(set(devices.values())) > 1:
            listed = ", ".join(f"{name} on {device}" for name, device in devices.items())
            self.fail(f"all tensors must be on one device, got {listed}")

    def positive_float32(self, name: str, value: float) -> None:
        """A Float attribute as GE stores it (float32, round to nearest) must be finite and > 0: a
        value that rounds to 0 (below about 7e-46) or overflows (about 3.4e38 and up) is rejected."""
        stored = float32(value)
        if not (math.isfinite(stored) and stored > 0):
            as_stored = "" if stored == value or math.isnan(value) else f" ({stored} as float32)"
            self.fail(f"attribute {name} must be finite and > 0 as a float32 (how GE stores it), "
                      f"got {value!r}{as_stored}")


InferFn = Callable[[Mapping[str, TensorMeta], Mapping[str, Any], str], dict]


@dataclass(frozen=True)
class OpPrototype:
    """A GE op type: ordered inputs, outputs and attributes, and its inference functions.

    `infer_data_type(inputs, attrs, where)` returns {output name: dtype};
    `infer_shape(inputs, attrs, where)` returns {output name: shape}. Both
    raise AttnResInputError for anything docs/contract.md rejects.
    """

    op_type: str
    summary: str
    inputs: tuple[TensorArg, ...]
    outputs: tuple[TensorArg, ...]
    attrs: tuple[AttrArg, ...]
    infer_data_type: InferFn
    infer_shape: InferFn

    def __post_init__(self) -> None:
        inputs = {arg.name: arg for arg in self.inputs}
        for name in self.reference_outputs():
            if inputs[name].dtypes != self.output(name).dtypes:
                raise ValueError(f"{self.op_type}: reference output {name} must declare the dtypes of input {name}")

    def input_names(self) -> list[str]:
        return [arg.name for arg in self.inputs]

    def output(self, name: str) -> TensorArg:
        (arg,) = [arg for arg in self.outputs if arg.name == name]
        return arg

    def reference_outputs(self) -> list[str]:
        """Outputs named as an input: GE reference tensors, the input's memory updated in place (REG_OP
        declares the name as INPUT and OUTPUT; torch as a `Tensor(a!)` argument). In output order."""
        inputs = set(self.input_names())
        return [arg.name for arg in self.outputs if arg.name in inputs]

    def is_reference_output(self, name: str) -> bool:
        return name in self.reference_outputs()

    def dtype_columns(self) -> dict[str, tuple[torch.dtype, ...]]:
        """Each tensor's dtype in every supported combination, the way an OpDef lists them.

        Column j across all tensors is one combination GE may select. A tensor declaring the op's
        full dtype list follows the op's dtype (every such list is in the same order); a tensor
        declaring one dtype keeps it in every column.
        """
        tensors = (*self.inputs, *self.outputs)
        width = max(len(arg.dtypes) for arg in tensors)
        full = {arg.dtypes for arg in tensors if len(arg.dtypes) == width}
        if width > 1 and len(full) != 1:  # one column (every tensor one dtype) pairs whatever each declares
            raise ValueError(f"{self.op_type}: tensors that follow the op's dtype list it in different orders: {full}")
        columns = {}
        for arg in tensors:
            if len(arg.dtypes) not in (1, width):
                raise ValueError(f"{self.op_type}: {arg.name} declares {len(arg.dtypes)} dtypes; expected 1 or {width}")
            columns[arg.name] = arg.dtypes if len(arg.dtypes) == width else arg.dtypes * width
        return columns

    def output_names(self) -> list[str]:
        return [arg.name for arg in self.outputs]

    def letters(self) -> list[str]:
        """Every dimension letter of the inputs' layouts, in order of first use (T, N, H for the forward)."""
        return list(dict.fromkeys(letter for arg in self.inputs for letter in arg.letters()))

    def example_metas(self, dims: Mapping[str, int], dtype: torch.dtype, where: str) -> dict[str, TensorMeta]:
        """Input metas of the layouts' first forms for `dims` (a letter -> size map covering letters()); each
        input takes `dtype` where it accepts it, else its first accepted dtype. For tools (the CLI's tiling)."""
        missing = [letter for letter in self.letters() if letter not in dims]
        if missing:
            Checker(self.op_type, where).fail(
                f"the input layouts use dims {', '.join(self.letters())}; missing {', '.join(missing)}")
        return {arg.name: TensorMeta(arg.example_shape(dims),
                                     dtype if dtype in arg.accepted_dtypes else arg.accepted_dtypes[0])
                for arg in self.inputs}

    def input_metas(self, tensors: Sequence, where: str = WHERE_PROTOTYPE) -> dict[str, Any]:
        """The TensorMeta of each input tensor, by prototype input name (after check_tensors): a tuple of
        them for a dynamic (list) input, None for an optional input left out."""
        self.check_tensors(tensors, where)
        return {arg.name: _meta_of(value) for arg, value in zip(self.inputs, tensors, strict=True)}

    def check_tensors(self, tensors: Sequence, where: str) -> None:
        """One value per prototype input: a tensor; a non-empty list of tensors for a dynamic input; a tensor
        or None for an optional one. Anything else is named."""
        checker = Checker(self.op_type, where)
        if len(tensors) != len(self.inputs):
            checker.fail(f"takes {len(self.inputs)} tensors ({', '.join(self.input_names())}), got {len(tensors)}")
        for arg, value in zip(self.inputs, tensors, strict=True):
            if arg.presence == "optional" and value is None:
                continue
            if arg.presence == "dynamic":
                _check_tensor_list(checker, arg, value)
            elif not isinstance(value, torch.Tensor):
                checker.fail(f"{arg.name} must be a tensor {arg.layout}, got {_described(value)}")

    def bind_attrs(self, given: Mapping[str, Any], where: str = WHERE_PROTOTYPE) -> dict[str, Any]:
        """Attributes by name with defaults filled in; unknown or mistyped ones are rejected."""
        checker = Checker(self.op_type, where)
        known = {attr.name: attr for attr in self.attrs}
        for name in given:
            if name not in known:
                checker.fail(f"unknown attribute {name!r}; the prototype has {sorted(known)}")
        bound = {}
        for attr in self.attrs:
            if attr.name not in given:
                if attr.default is None:
                    checker.fail(f"required attribute {attr.name!r} ({attr.kind}) is missing")
                bound[attr.name] = attr.default
                continue
            value = given[attr.name]
            python_type = ATTR_KINDS[attr.kind]
            # bool is an int in Python; an Int or Float attribute must not silently take one.
            accepted = isinstance(value, python_type) and (attr.kind == "Bool" or not isinstance(value, bool))
            if attr.kind == "Float" and isinstance(value, int) and not isinstance(value, bool):
                accepted, value = True, float(value)
            if not accepted:
                checker.fail(f"attribute {attr.name!r} must be {attr.kind}, got {type(value).__name__} {value!r}")
            bound[attr.name] = value
        return bound

    def check(
        self, inputs: Mapping[str, TensorMeta], attrs: Mapping[str, Any], where: str
    ) -> tuple[dict[str, Any], list[TensorMeta]]:
        """Bind the attributes, then InferDataType and InferShape: (bound attributes, outputs in order)."""
        bound = self.bind_attrs(attrs, where)
        dtypes = self.infer_data_type(inputs, bound, where)
        shapes = self.infer_shape(inputs, bound, where)
        return bound, [TensorMeta(tuple(shapes[arg.name]), dtypes[arg.name]) for arg in self.outputs]

    def infer(self, inputs: Mapping[str, TensorMeta], attrs: Mapping[str, Any], where: str) -> list[TensorMeta]:
        """InferDataType then InferShape; outputs in prototype order."""
        return self.check(inputs, attrs, where)[1]


def _described(value) -> str:
    return "None" if value is None else f"{type(value).__name__} {value!r:.60}"


def _check_tensor_list(checker: Checker, arg: TensorArg, value) -> None:
    if not isinstance(value, (list, tuple)) or len(value) == 0:
        checker.fail(f"{arg.name} must be a non-empty list of tensors {arg.layout}, got {_described(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, torch.Tensor):
            checker.fail(f"{arg.name}[{index}] must be a tensor {arg.layout}, got {_described(item)}")


def _meta_of(value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(TensorMeta.of(item) for item in value)
    return TensorMeta.of(value)
