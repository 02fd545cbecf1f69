"""The rule registry (judge.rules.registry): stable ids, groups and names, the docs' rule table
checked against it, and the public names old run directories recorded still naming a rule."""

from __future__ import annotations

import json
import re

import pytest

from cublas_audit.judge import candidates, fixes, grouping, impact, map_audit, units
from cublas_audit.judge.rules import RULES, audit
from cublas_audit.judge.rules.registry import GROUPS, REGISTRY, checks, name_of, spec
from tests.conftest import REPO, REPORTS
from tests.rules.recorded import dataset

DOCS = REPO / "docs" / "report.md"


def _docs_table() -> list[tuple[str, str, str]]:
    """(id, name, group) of each row of docs/report.md's rule table, in its order."""
    lines = DOCS.read_text().splitlines()
    start = lines.index("| id | rule | group | severity | fires when |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append((cells[0], cells[1].strip("`"), cells[2]))
    return rows


def test_docs_rule_table_is_the_registry() -> None:
    assert _docs_table() == [(s.id, s.name, s.group) for s in REGISTRY]


def test_ids_are_stable_and_name_their_group() -> None:
    ids = [s.id for s in REGISTRY]
    assert len(set(ids)) == len(ids) and len({s.name for s in REGISTRY}) == len(REGISTRY)
    for entry in REGISTRY:
        assert re.fullmatch(r"CA[1-9]\d\d", entry.id), entry.id
        # the hundreds are the group: CA3xx is timing
        assert GROUPS[int(entry.id[2]) - 1] == entry.group, entry
        assert entry.summary and "\n" not in entry.summary
    # the ids this registry first gave: a rule never changes its number
    assert {s.name: s.id for s in REGISTRY} == {
        "no-escalation": "CA101",
        "legacy-kernel": "CA102",
        "better-candidate": "CA103",
        "low-utilization": "CA201",
        "underfilled-grid": "CA202",
        "reference-faster": "CA301",
        "batched-slower-than-loop": "CA302",
        "broadcast-slower-than-folded": "CA303",
        "layout-penalty": "CA401",
        "unaligned-operand": "CA501",
        "size-inversion": "CA601",
        "dispatch-cliff": "CA602",
        "unit-mismatch": "CA701",
    }


def test_a_name_is_not_its_function_name() -> None:
    """The public name comes from the registry, whatever the check's function is called."""
    for entry in checks():
        assert entry.check is not None and name_of(entry.check) == entry.name
    with pytest.raises(ValueError, match="no registered rule"):
        name_of(lambda ctx: [])


def test_audit_runs_every_registered_check_in_registry_order() -> None:
    assert [s.check for s in REGISTRY if s.check is not None] == RULES


def test_selected_by_id_or_name_and_an_unknown_one_refused() -> None:
    assert checks(["CA601", "dispatch-cliff"]) == checks(["size-inversion", "CA602"])
    assert [s.name for s in checks(map_audit.MAP_RULES)] == list(map_audit.MAP_RULES)
    assert spec("CA501") is spec("unaligned-operand")
    for unknown in ("size_inversion", "CA999", ""):
        with pytest.raises(ValueError, match="no rule"):
            checks([unknown])


def test_audit_selects_by_id_as_by_name() -> None:
    shard = dataset("h100/checks/20261125-101230-shards/shard-2").frame
    by_name = audit(shard, rules=map_audit.MAP_RULES)
    assert [f.rule for f in by_name] == ["dispatch-cliff", "size-inversion"]
    assert audit(shard, rules=["CA601", "CA602"]) == by_name
    with pytest.raises(ValueError, match="no rule 'size_inversion'"):
        audit(shard, rules=["size_inversion"])  # a misspelt name once ran no rule at all


def test_every_rule_name_the_judge_uses_is_registered() -> None:
    """Names other modules keep (map rules, gain rules, shape fixes, causes): each a rule's."""
    named = {
        *map_audit.MAP_RULES,
        *impact.GAIN_RULES,
        *fixes.FIXED_BY_SHAPE,
        *grouping.EXPLAINS,
        *(rule for explained in grouping.EXPLAINS.values() for rule in explained),
        units.RULE,
        candidates.RULE,
    }
    for name in named:
        assert spec(name).name == name


def test_old_run_directories_name_registered_rules() -> None:
    """The public name is what findings.json and fix.json recorded: every committed one reads."""
    recorded = [
        item["rule"]
        for path in REPORTS.rglob("findings.json")
        for item in json.loads(path.read_text())
    ]
    recorded += [
        fix["source"]["rule"]
        for path in REPORTS.rglob("fix.json")
        for fix in json.loads(path.read_text())["fixes"]
        if "rule" in fix.get("source", {})
    ]
    assert len(recorded) > 100
    for name in set(recorded):
        assert spec(name).name == name
