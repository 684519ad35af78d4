"""Typed dataclasses from plain YAML values, fast: the ``tables`` list of a config.

OmegaConf's structured configs check every section of a config; building one node tree per
table costs about 1.6 ms, which makes a 1,000-table config take seconds to load. Table entries
are flat dataclasses of scalars, lists and one nested dataclass, so this module converts them
directly, with OmegaConf's rules for those types (an int field takes ints and integer strings,
not floats or booleans; a float field takes ints too; a str field takes any scalar; a bool
field takes booleans and true/false/yes/no/on/off/1/0) and errors that name the field path.
Numbers must also be usable downstream: an int field's value fits 64 bits, a float field's is
not NaN (infinities pass: validation decides where they make sense).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
import typing
from typing import Any, Dict, Tuple

from neo.config.embedding import ConfigError

__all__ = ["build_dataclass"]

_TRUE = {"true", "yes", "on", "1"}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FALSE = {"false", "no", "off", "0"}


@functools.lru_cache(maxsize=None)
def _fields(cls) -> Tuple[Dict[str, Any], Tuple[str, ...]]:
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in dataclasses.fields(cls))
    return {n: hints[n] for n in names}, names


_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 120, 120, 4, 4, 2


def _short(value: Any) -> str:
    """``repr(value)`` cut to about 200 characters, without building the whole of it."""
    text = _SHORT.repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _bad(value: Any, kind: str, where: str) -> ConfigError:
    # the value shortened: a YAML alias bomb of a few hundred bytes expands to gigabytes
    return ConfigError(f"{where}: Value {_short(value)} of type '{type(value).__name__}' could not be "
                       f"converted to {kind}")


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, where)
    if value is None:
        raise ConfigError(f"{where}: field is not Optional; got None")
    if origin in (list, typing.List):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        (elem,) = typing.get_args(tp)
        return [_convert(elem, v, f"{where}[{k}]") for k, v in enumerate(value)]
    if origin in (dict, typing.Dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        _, elem = typing.get_args(tp)
        return {str(k): _convert(elem, v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in _TRUE | _FALSE and not isinstance(value, float):
            return s in _TRUE
        raise _bad(value, "Boolean", where)
    if tp is int:
        out = None
        if isinstance(value, int) and not isinstance(value, bool):
            out = value
        elif isinstance(value, str):
            try:
                out = int(value.strip())
            except ValueError:
                pass
        if out is None:
            raise _bad(value, "Integer", where)
        if not _INT64_MIN <= out <= _INT64_MAX:
            raise ConfigError(f"{where}: {out} does not fit a 64-bit integer")
        return out
    if tp is float:
        out = None
        try:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out = float(value)
            elif isinstance(value, str):
                out = float(value.strip())
        except (ValueError, OverflowError):     # not a number; an int beyond float's range
            pass
        if out is None:
            raise _bad(value, "Float", where)
        if math.isnan(out):
            raise ConfigError(f"{where}: NaN is not a valid value")
        return out
    if tp is str:
        if isinstance(value, bool):       # YAML reads yes / no / on / off / true / false as booleans
            raise ConfigError(f"{where}: got the YAML boolean {value} (written yes, no, on, off, true or false); "
                              f"quote it for the text, e.g. '{'yes' if value else 'no'}'")
        if isinstance(value, (str, int, float)):
            return str(value)
        raise _bad(value, "String", where)
    return value


def build_dataclass(cls, node: Any, where: str):
    """An instance of dataclass ``cls`` from the mapping ``node``; fields it lacks keep their
    defaults. Raises :class:`ConfigError` naming ``where.field`` (unknown keys list the valid ones)."""
    if node is None:
        return cls()
    if not isinstance(node, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(node).__name__}")
    types, names = _fields(cls)
    unknown = [k for k in node if k not in types]
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key; valid keys: {list(names)}")
    return cls(**{k: _convert(types[k], v, f"{where}.{k}") for k, v in node.items()})
