"""plan.json: a plan stated, not listed. A full map's 262,144 cases listed one JSON object each
took 86 MB and seconds to write, read and fingerprint; stated they take a few hundred bytes.

    {"format": 2, "cases": N,
     "constant": {field: value},                 the fields with one value in every case
     "axes": [[field, [values]], ...]            the cases are the product of these, outermost
                                                 first (a grid: m, n, k, then batch, mode, ...)
     or "columns": {field: {"values": [...]}     else each varying field listed, or as runs
                         | {"runs": [[value, count], ...]}}}

A plan written before (a JSON list of cases, each with its case id) reads as it always did.
Reading is lazy: case ids, FLOPs and the fingerprint come from the columns, without building a
`Case` each (what a merge of a full map needs); `cases()` builds them where a run needs them.

The probe child reads plans: this module stays light (no pandas, no numpy).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, overload

from cublas_audit.errors import AuditError
from cublas_audit.files import write_text_atomic
from cublas_audit.planning.cases import FIELD_NAMES, OPTIONAL_FIELDS, Case, case_id_of, routine_of

FORMAT = 2
FIELDS = FIELD_NAMES
_KINDS: dict[str, Any] = {
    "api": str, "mode": str, "m": int, "n": int, "k": int, "batch": int,
    **OPTIONAL_FIELDS,
}  # fmt: skip
_DEFAULTS = {field.name: field.default for field in fields(Case) if field.name in _KINDS}


@dataclass(frozen=True)
class PlanFile:
    """A plan as plan.json states it: `count` cases, each field's value in every case (a
    constant, a factor of the product `axes`, or a listed column); `written_ids`: the case ids a
    listed plan (format 1) wrote, kept as written."""

    count: int
    constant: dict[str, Any]
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    listed: dict[str, tuple[Any, ...]] | None = None
    written_ids: tuple[str, ...] | None = None

    @classmethod
    def of(cls, cases: Sequence[Case]) -> PlanFile:
        """The statement of `cases`: their product where they are one, else their columns (a
        plan made as its statement, StatedCases: that one)."""
        if isinstance(cases, StatedCases):
            return cases.stated
        return stated({name: [getattr(case, name) for case in cases] for name in FIELDS})

    def column(self, name: str) -> Sequence[Any]:
        """Field `name` of every case, in plan order."""
        if name in self.constant:
            return [self.constant[name]] * self.count
        if self.listed is not None and name in self.listed:
            return self.listed[name]
        inner = 1
        for axis, values in reversed(self.axes):
            if axis == name:
                return [v for v in values for _ in range(inner)] * (
                    self.count // (inner * len(values))
                )
            inner *= len(values)
        return [_DEFAULTS[name]] * self.count

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Every case's fields (FIELDS' order), in plan order."""
        return zip(*(self.column(name) for name in FIELDS), strict=True)

    def case_ids(self) -> list[str]:
        return list(self._ids)

    @functools.cached_property
    def _ids(self) -> tuple[str, ...]:
        """(made once a plan: a merge asks a shard's part and the whole plan several times)"""
        if self.written_ids is not None:
            return self.written_ids
        if all(name in self.constant for name in FIELDS if name not in ("m", "n", "k")):
            # a map's usual plan: only the sizes vary, the rest of each id is the same text
            # (the id of sizes 0x0x0: api.mode.0x0x0.rest; no api or mode holds a dot)
            api, mode, _, rest = case_id_of(*(self.constant.get(name, 0) for name in FIELDS)).split(
                ".", 3
            )
            sizes = zip(self.column("m"), self.column("n"), self.column("k"), strict=True)
            return tuple(f"{api}.{mode}.{m}x{n}x{k}.{rest}" for m, n, k in sizes)
        return tuple(case_id_of(*row) for row in self.rows())

    def flops(self) -> list[float]:
        """Each case's FLOPs (Case.flops), what shards are balanced by."""
        dims = zip(*(self.column(n) for n in ("m", "n", "k", "batch")), strict=True)
        return [2.0 * m * n * k * batch for m, n, k, batch in dims]

    def cases(self, checked: bool = False) -> list[Case]:
        """Every case, made and checked (`checked`: checked before, Case.checked_before)."""
        if checked:
            return [Case.checked_before(row) for row in self.rows()]
        return [Case(*row) for row in self.rows()]

    def fingerprint(self) -> str:
        """sha256 of the plan's statement, canonical: one plan, one fingerprint, however its file
        was written (a listed plan is stated first)."""
        plan = self
        if self.written_ids is not None:
            plan = stated({name: list(self.column(name)) for name in FIELDS})
        canonical = json.dumps(plan.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def legacy_fingerprint(self) -> str:
        """The fingerprint run directories recorded before plans were stated: sha256 of every
        case's JSON, listed (seconds for a full map: only where the new one does not match)."""
        listed = [
            {**dict(zip(FIELDS, row, strict=True)), "case_id": case_id,
             "routine": routine_of(*row)}
            for row, case_id in zip(self.rows(), self.case_ids(), strict=True)
        ]  # fmt: skip
        canonical = json.dumps(listed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def matches(self, recorded: object) -> bool:
        """Whether `recorded` (a run's env.json) is this plan's fingerprint, either definition."""
        return recorded == self.fingerprint() or recorded == self.legacy_fingerprint()

    def to_json(self) -> dict[str, Any]:
        return self._statement

    @functools.cached_property
    def _statement(self) -> dict[str, Any]:
        """(made once a plan: its fingerprint and its file both state it, and a full map's
        listed columns took ~0.7 s each time)"""
        stated: dict[str, Any] = {"format": FORMAT, "cases": self.count, "constant": self.constant}
        if self.listed is not None:
            stated["columns"] = {n: _encoded(c) for n, c in self.listed.items()}
        else:
            stated["axes"] = [[name, list(values)] for name, values in self.axes]
        return stated

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a Ray task's plan: planning.shards.PlanPart) as its fields alone: what was
        made from them (case ids, the statement) is made again where it is needed."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class StatedCases(Sequence[Case]):
    """A plan's cases as its statement, each case made only once they are asked for, then all
    at once and kept: a full map's 262,144 cases took ~3 s of CPU here to make, which a --devices
    or --ray run's parent never needs (its shards are sent their parts of the statement, its
    merge orders by the statement's ids) and a `--shard` run needs only its part of."""

    def __init__(self, stated: PlanFile) -> None:
        self.stated = stated
        self._made: list[Case] | None = None

    def _cases(self) -> list[Case]:
        if self._made is None:
            self._made = self.stated.cases()
        return self._made

    def __len__(self) -> int:
        return self.stated.count

    @overload
    def __getitem__(self, index: int) -> Case: ...
    @overload
    def __getitem__(self, index: slice) -> list[Case]: ...
    def __getitem__(self, index: int | slice) -> Case | list[Case]:
        return self._cases()[index]

    def __iter__(self) -> Iterator[Case]:
        return iter(self._cases())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StatedCases) and self.stated == other.stated:
            return True
        return isinstance(other, Sequence) and self._cases() == list(other)

    __hash__ = None  # type: ignore[assignment]  # (a list's equality: no hash, as a list)

    def __repr__(self) -> str:
        return f"StatedCases({self.stated.count} cases)"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its statement (PlanFile's fields), not its cases."""
        return (StatedCases, (self.stated,))


def stated(columns: dict[str, list[Any]]) -> PlanFile:
    """The statement of a plan's columns (every field, plan order): constants once, the rest
    as a product where it is one, else listed."""
    count = len(columns[FIELDS[0]])
    # (list.count and groupby compare in C: a full map's 16 columns of 262,144 values took
    # ~1.5 s of CPU here one value at a time)
    constant = {n: c[0] for n, c in columns.items() if c and c.count(c[0]) == len(c)}
    varying = {n: c for n, c in columns.items() if n not in constant}
    axes = _as_product(varying, count)
    if axes is not None:
        return PlanFile(count, constant, axes)
    return PlanFile(count, constant, listed={n: tuple(c) for n, c in varying.items()})


def _as_product(
    varying: dict[str, list[Any]], count: int
) -> tuple[tuple[str, tuple[Any, ...]], ...] | None:
    """The factors whose product the columns are, outermost first (the field that changes
    least often), or None where they are no product."""
    if not varying:
        return ()
    runs = {name: sum(1 for _ in itertools.groupby(c)) for name, c in varying.items()}
    order = sorted(varying, key=lambda name: runs[name])
    axes = tuple((name, tuple(dict.fromkeys(varying[name]))) for name in order)
    size = 1
    for _, values in axes:
        size *= len(values)
    if size != count:
        return None
    product = list(itertools.product(*(values for _, values in axes)))
    given = list(zip(*(varying[name] for name in order), strict=True))
    return axes if product == given else None


def _encoded(column: Sequence[Any]) -> dict[str, Any]:
    """A listed column as its values, or as runs of one value where that is shorter."""
    runs = [[value, len(list(group))] for value, group in itertools.groupby(column)]
    return {"runs": runs} if 2 * len(runs) < len(column) else {"values": list(column)}


def _decoded(name: str, encoded: Any, count: int) -> tuple[Any, ...]:
    kind = _KINDS[name]
    if "runs" in encoded:
        values = [kind(v) for v, n in encoded["runs"] for _ in range(int(n))]
    else:
        values = [kind(v) for v in encoded["values"]]
    if len(values) != count:
        raise ValueError(f"column {name} has {len(values)} values for {count} cases")
    return tuple(values)


def from_json(data: Any) -> PlanFile:
    """A plan.json's content: stated (format 2) or listed (a list of cases)."""
    if isinstance(data, list):
        return _from_list(data)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"neither a list of cases nor a plan of format {FORMAT}")
    count = int(data["cases"])
    unknown = [
        name for name in [*data["constant"], *dict(data.get("axes") or [])] if name not in _KINDS
    ]
    if unknown:
        raise ValueError(f"unknown fields {unknown}")
    constant = {name: _KINDS[name](value) for name, value in data["constant"].items()}
    if "columns" in data:
        listed = {name: _decoded(name, c, count) for name, c in data["columns"].items()}
        return PlanFile(count, constant, listed=listed)
    axes = tuple(
        (str(name), tuple(_KINDS[name](v) for v in values)) for name, values in data["axes"]
    )
    return PlanFile(count, constant, axes)


def _from_list(items: list[Any]) -> PlanFile:
    """A listed plan (format 1): every case's fields, the defaults of fields it predates."""
    columns: dict[str, list[Any]] = {name: [] for name in FIELDS}
    for item in items:
        for name in FIELDS:
            value = (
                item[name] if name in ("api", "mode", "m", "n", "k", "batch") else item.get(name)
            )
            columns[name].append(_DEFAULTS[name] if value is None else _KINDS[name](value))
    ids = tuple(_written_id(item) for item in items)
    listed = {name: tuple(column) for name, column in columns.items()}
    return PlanFile(len(items), {}, listed=listed, written_ids=ids)


def _written_id(item: dict[str, Any]) -> str:
    written = item.get("case_id")
    return written if isinstance(written, str) else Case.from_json(item).case_id


def read(path: Path) -> PlanFile:
    """A plan.json, either format; anything else is a one-line error. Parsed once per content
    (the statement `write` wrote kept as it was): a --devices map's merge, its report's check of
    the merged table and its resume ask for one plan.json again and again, and a full map's
    262,144 case ids were made from it each time (~0.2 s of CPU here)."""
    try:
        text = Path(path).read_bytes()
        key = hashlib.blake2b(text, digest_size=16).digest()
        stated = _READ.get(key)
        if stated is None:
            stated = from_json(json.loads(text))
            _keep(key, stated)
        return stated
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AuditError(f"{path}: not a cublas-audit plan ({exc})") from exc


def write(plan: PlanFile | Sequence[Case], path: Path) -> None:
    """plan.json, stated: a grid as its axes, else its columns."""
    stated = plan if isinstance(plan, PlanFile) else PlanFile.of(plan)
    text = json.dumps(stated.to_json(), separators=(",", ":")) + "\n"
    write_text_atomic(path, text)
    _keep(hashlib.blake2b(text.encode(), digest_size=16).digest(), stated)


def read_plan(path: Path, checked: bool = False) -> list[Case]:
    """The plan's cases; `checked`: they were checked when the sweep planned or read the plan
    (the probe's read: Case.checked_before)."""
    stated = read(path)
    try:
        return stated.cases(checked)
    except (ValueError, TypeError) as exc:
        raise AuditError(f"{path}: not a cublas-audit plan ({exc})") from exc


def plan_case_ids(path: Path) -> list[str]:
    """The case ids of a plan, in its order: what a run's table is checked against. A listed
    plan's ids as written, a stated plan's from its columns; no case is built (building the
    262,144 cases of a full map's plan took 8 s of reading its run)."""
    return read(path).case_ids()


_READ: dict[bytes, PlanFile] = {}  # a plan.json's statement by its content's hash
_READ_KEPT = 8  # plans (a run's, its shards', the whole plan of a shard's)


def _keep(key: bytes, stated: PlanFile) -> None:
    _READ.pop(key, None)
    if len(_READ) >= _READ_KEPT:
        _READ.pop(next(iter(_READ)))  # the oldest
    _READ[key] = stated
