"""Typed records read from JSON: a dataclass from an object whose every field is present (or
defaulted) and of its annotated type, each fault one ValueError naming where it is. What
table.fix_file reads fix.json with."""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar, get_args, get_type_hints

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def require(data: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    missing = [key for key in keys if key not in data]
    if missing:
        raise ValueError(f"{where}: missing field {missing[0]!r}")


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "float | None": (int, float, type(None)),
}


def record(cls: type[T], data: Any, where: str) -> T:
    """A dataclass from a JSON object: every field present (or defaulted) and of its type."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} is not an object")
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}")
    values = {}
    hints = _hints(cls)
    for spec in fields(cls):
        if spec.name not in data:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise ValueError(f"{where}: missing field {spec.name!r}")
            continue
        value = data[spec.name]
        allowed = _TYPES.get(str(spec.type), (object,))
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ValueError(f"{where}.{spec.name}: {value!r} is not a {spec.type}")
        values[spec.name] = _member(hints[spec.name], value, f"{where}.{spec.name}")
    return cls(**values)


@functools.cache
def _hints(cls: type[Any]) -> dict[str, Any]:
    """A dataclass's annotations resolved (once per class: a map reads 90,000 findings)."""
    return get_type_hints(cls)


def _member(hint: Any, value: Any, where: str) -> Any:
    """An enum field's member from its text (a word the enum lacks is a fault, never a default);
    any other value as it is. `Kind | None` takes None too."""
    kinds = get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    enums = [k for k in kinds if isinstance(k, type) and issubclass(k, Enum)]
    if not enums or (value is None and type(None) in kinds):
        return value
    try:
        return enums[0](value)
    except ValueError:
        words = ", ".join(str(member.value) for member in enums[0])
        raise ValueError(f"{where}: {value!r} is not one of {words}") from None


def as_list(value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{where} is not a list")
    return value


def as_text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: {value!r} is not text")
    return value
