"""Gin values checked against a Config's annotations, before the Config sees them.

    typecheck.check([1, 2], tuple[int, ...], "train.Config.x")   # (1, 2)
    typecheck.check("10", int, "train.Config.steps")             # ConfigError: ... has type str; expected int

Gin passes whatever a binding says (a string where a number belongs, a list where a tuple does); a
Config's own `__post_init__` would then fail with a TypeError naming neither the binding nor the type it
wanted. `pipeline/config.py` checks every field here first, converting only where that loses nothing
(list -> tuple, int -> float).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pipeline.gin_errors import ConfigError


def check(value: Any, hint: Any, binding: str) -> Any:
    """`value` converted to `hint` where that is lossless (list -> tuple, int -> float), else an error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return check(value, arm, binding)
            except ConfigError:
                continue
        raise _type_error(value, hint, binding)
    if hint is type(None):
        if value is None:
            return value
        raise _type_error(value, hint, binding)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _type_error(value, hint, binding)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(check(v, args[0], f"{binding}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise _type_error(value, hint, binding)
        return tuple(check(v, a, f"{binding}[{i}]") for i, (a, v) in enumerate(zip(args, value))) \
            if args else tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise _type_error(value, hint, binding)
    if isinstance(hint, type) and not isinstance(value, hint):
        raise _type_error(value, hint, binding)
    return value


def _type_error(value: Any, hint: Any, binding: str) -> ConfigError:
    expected = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
    extra = ""
    if isinstance(value, str) is False and "str" in str(hint) and not isinstance(value, (int, float)):
        extra = ' (strings need quotes in gin: name = "value")'
    return ConfigError(f"{binding} = {value!r} has type {type(value).__name__}; expected {expected}{extra}")
