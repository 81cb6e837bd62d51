"""Typed attribute values for `ge.custom_op`, as torchair's `ge.attr` spells them.

    ge.custom_op(..., attrs={"norm_eps": attr.Float(1e-6), "need_backward": attr.Bool(True)})

Each wrapper knows which `AttrDef` field GE stores it in (ge_ir.proto): Int -> i, Float -> f,
Bool -> b, Str -> s, DataType -> dt, lists -> `list` with `val_type` set. `kind` is the
prototype's name for the type, so `custom_op` can check a value against the prototype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from attnres_ge.ge_plugin.ge_ir import AttrDef, ListValueType


class AttrValue:
    """Base of the typed attribute wrappers; subclasses set `kind` and `write`."""

    kind: ClassVar[str]
    value: Any

    def write(self, attr_def: AttrDef) -> None:
        raise NotImplementedError


def _checked(kind: str, value, accepted: tuple[type, ...], *, allow_bool: bool = False):
    """`value` if it is one of `accepted` (bool counts as int only when allowed), else TypeError."""
    is_bool = isinstance(value, bool)
    if not isinstance(value, accepted) or (is_bool and not allow_bool):
        raise TypeError(f"ge.attr.{kind} takes {' or '.join(t.__name__ for t in accepted)}, got "
                        f"{type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class Int(AttrValue):
    value: int
    kind: ClassVar[str] = "Int"

    def __post_init__(self):
        _checked(self.kind, self.value, (int,))

    def write(self, attr_def: AttrDef) -> None:
        attr_def.i = self.value


@dataclass(frozen=True)
class Float(AttrValue):
    value: float
    kind: ClassVar[str] = "Float"

    def __post_init__(self):
        object.__setattr__(self, "value", float(_checked(self.kind, self.value, (float, int))))

    def write(self, attr_def: AttrDef) -> None:
        attr_def.f = self.value  # stored as float32, as GE does


@dataclass(frozen=True)
class Bool(AttrValue):
    value: bool
    kind: ClassVar[str] = "Bool"

    def __post_init__(self):
        _checked(self.kind, self.value, (bool,), allow_bool=True)

    def write(self, attr_def: AttrDef) -> None:
        attr_def.b = self.value


@dataclass(frozen=True)
class Str(AttrValue):
    value: str
    kind: ClassVar[str] = "Str"

    def __post_init__(self):
        _checked(self.kind, self.value, (str,))

    def write(self, attr_def: AttrDef) -> None:
        attr_def.s = self.value.encode()


@dataclass(frozen=True)
class DataType(AttrValue):
    """A GE DataType number (e.g. ge_ir.DT_FLOAT)."""

    value: int
    kind: ClassVar[str] = "DataType"

    def __post_init__(self):
        _checked(self.kind, self.value, (int,))

    def write(self, attr_def: AttrDef) -> None:
        attr_def.dt = self.value


@dataclass(frozen=True)
class _ListAttr(AttrValue):
    value: tuple
    element: ClassVar[type]
    field: ClassVar[str]
    val_type: ClassVar[int]

    def __post_init__(self):
        if not isinstance(self.value, Sequence) or isinstance(self.value, (str, bytes)):
            raise TypeError(f"ge.attr.{self.kind} takes a list, got {type(self.value).__name__} {self.value!r}")
        allow_bool = self.element is bool
        items = tuple(_checked(self.kind, item, (self.element,) + ((int,) if self.element is float else ()),
                               allow_bool=allow_bool) for item in self.value)
        object.__setattr__(self, "value", items)

    def write(self, attr_def: AttrDef) -> None:
        values = [item.encode() for item in self.value] if self.element is str else list(self.value)
        getattr(attr_def.list, self.field).extend(values)
        attr_def.list.val_type = self.val_type


class ListInt(_ListAttr):
    kind, element, field, val_type = "ListInt", int, "i", ListValueType.Value("VT_LIST_INT")


class ListFloat(_ListAttr):
    kind, element, field, val_type = "ListFloat", float, "f", ListValueType.Value("VT_LIST_FLOAT")


class ListBool(_ListAttr):
    kind, element, field, val_type = "ListBool", bool, "b", ListValueType.Value("VT_LIST_BOOL")


class ListStr(_ListAttr):
    kind, element, field, val_type = "ListStr", str, "s", ListValueType.Value("VT_LIST_STRING")


class ListDataType(_ListAttr):
    kind, element, field, val_type = "ListDataType", int, "dt", ListValueType.Value("VT_LIST_DATA_TYPE")


_LIST_KINDS = {cls.val_type: cls for cls in (ListInt, ListFloat, ListBool, ListStr, ListDataType)}
_SCALAR_FIELDS = {"i": Int, "f": Float, "b": Bool, "s": Str, "dt": DataType}


def read(attr_def: AttrDef) -> AttrValue:
    """The typed value stored in an AttrDef (the inverse of `write`); ValueError for unsupported fields."""
    field = attr_def.WhichOneof("value")
    if field in _SCALAR_FIELDS:
        raw = getattr(attr_def, field)
        return _SCALAR_FIELDS[field](raw.decode() if field == "s" else raw)
    if field == "list" and attr_def.list.val_type in _LIST_KINDS:
        cls = _LIST_KINDS[attr_def.list.val_type]
        items = getattr(attr_def.list, cls.field)
        return cls(tuple(item.decode() for item in items) if cls.element is str else tuple(items))
    raise ValueError(f"unsupported AttrDef value {field!r}: {attr_def}")
