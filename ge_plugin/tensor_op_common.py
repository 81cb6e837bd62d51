"""What the tensor ops' eager implementations share (ops.TENSOR_OPS: the ops whose kernels take their tensors
where they lie, so the registry's launcher plans nothing for them): their validation, kept per input signature,
and the host kernels' device rule."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from attnres_ge.op_kernel.launcher import PLAN_CACHE_SIZE, input_signature
from attnres_ge.op_proto.op_def import WHERE_EAGER, Checker

_validated_lock = threading.Lock()
_validated: OrderedDict[tuple, tuple] = OrderedDict()  # eager input signature -> (attributes, output metas)


def checked_call(proto, tensors: tuple, keywords: dict, where: str):
    """(bound attributes, output metas) after the prototype's validation; an eager call's result is kept per
    input signature (as the launcher keeps its plans), which at decode sizes is most of the call's time."""
    if where != WHERE_EAGER:
        return proto.check(proto.input_metas(tensors, where), keywords, where)
    try:
        key = input_signature(proto, tensors, keywords)
    except AttributeError:  # not a tensor where one belongs: the validation names it
        key = None
    with _validated_lock:
        checked = _validated.get(key) if key is not None else None
    if checked is None:
        checked = proto.check(proto.input_metas(tensors, where), keywords, where)
        with _validated_lock:
            if key is not None:
                _validated[key] = checked
                if len(_validated) > PLAN_CACHE_SIZE:
                    _validated.popitem(last=False)
    return checked


def require_cpu(op_type: str, tensor: torch.Tensor) -> None:
    if tensor.device.type != "cpu":
        Checker(op_type, WHERE_EAGER).fail(f"the host kernels run CPU tensors only, got tensors on {tensor.device}")
