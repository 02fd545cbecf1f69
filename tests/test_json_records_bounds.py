"""table/json_records.py's `record` at each branch: a field left to its default or its factory, a
value of the wrong type (a bool is no int), an enum field's member, None where `Kind | None`
allows it, and the words of a fault (issue 39 item 6). The record types are FixKind and a
dataclass shaped like fix.json's own (table.fix_file)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cublas_audit.table.json_records import as_list, as_text, record, require
from cublas_audit.vocabulary import FixKind


@dataclass(frozen=True)
class Entry:
    kind: FixKind
    count: int
    ms: float | None = None
    optional: FixKind | None = None
    flag: bool = False
    source: dict[str, str] = field(default_factory=dict)


def test_defaults_and_factories_fill_what_is_absent() -> None:
    got = record(Entry, {"kind": "pad", "count": 3}, "e")
    assert got == Entry(FixKind.pad, 3)
    assert got.kind is FixKind.pad and got.source == {}


def test_a_field_without_a_default_is_missing() -> None:
    with pytest.raises(ValueError, match=r"^e: missing field 'count'$"):
        record(Entry, {"kind": "pin"}, "e")
    with pytest.raises(ValueError, match=r"^e: unknown field 'zzz'$"):
        record(Entry, {"kind": "pin", "count": 1, "zzz": 0}, "e")
    with pytest.raises(ValueError, match=r"^e is not an object$"):
        record(Entry, [1], "e")


def test_types_are_checked_and_a_bool_is_no_number() -> None:
    with pytest.raises(ValueError, match=r"^e\.count: 'x' is not a int$"):
        record(Entry, {"kind": "pin", "count": "x"}, "e")
    with pytest.raises(ValueError, match=r"^e\.count: True is not a int$"):
        record(Entry, {"kind": "pin", "count": True}, "e")
    with pytest.raises(ValueError, match=r"^e\.flag: 1 is not a bool$"):
        record(Entry, {"kind": "pin", "count": 1, "flag": 1}, "e")
    given = {"kind": "pin", "count": 1, "ms": 2, "flag": True, "source": {"run": "r"}}
    got = record(Entry, given, "e")
    # an int is a float's value too, kept as it is (only an enum's field is converted)
    assert type(got.ms) is int and got.flag is True and got.source == {"run": "r"}


def test_an_optional_enum_takes_none_or_a_member() -> None:
    assert record(Entry, {"kind": "pin", "count": 1, "optional": None}, "e").optional is None
    got = record(Entry, {"kind": "pin", "count": 1, "optional": "layout"}, "e")
    assert got.optional is FixKind.layout
    with pytest.raises(ValueError, match=r"^e\.kind: None is not one of pin, pad, layout$"):
        record(Entry, {"kind": None, "count": 1}, "e")
    with pytest.raises(ValueError, match=r"^e\.optional: 'x' is not one of pin, pad, layout$"):
        record(Entry, {"kind": "pin", "count": 1, "optional": "x"}, "e")


def test_the_small_checks() -> None:
    require({"a": 1, "b": 2}, ("a", "b"), "w")
    with pytest.raises(ValueError, match=r"^w: missing field 'c'$"):
        require({"a": 1}, ("a", "c", "d"), "w")
    assert as_list([1], "w") == [1]
    with pytest.raises(ValueError, match=r"^w is not a list$"):
        as_list((1,), "w")
    assert as_text("t", "w") == "t"
    with pytest.raises(ValueError, match=r"^w: 1 is not text$"):
        as_text(1, "w")
