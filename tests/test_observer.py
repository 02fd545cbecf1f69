"""Without ncu (or without counter permission) a sweep observes with CUPTI and says so in one
line, instead of stopping; `--observer ncu` still stops with exit 3, `--observer events` turns
CUPTI off in the probe. The probe is the fake interpreter replaying the H100's recorded run."""

from __future__ import annotations

from pathlib import Path

import pytest

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.observe.observer import MAP_OBSERVERS, Observer
from cublas_audit.run import probe_process, sweep_setup
from cublas_audit.run.sweep import Progress
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.table import rundir
from tests.fakeprobe import fake_probe, seen
from tests.test_resume import CASES, DEADLINE_S, H100_RUN, deadline, stand_in_machine


def options(tmp_path: Path, **given: object) -> SweepOptions:
    probe, _calls = fake_probe(tmp_path, replay=H100_RUN)
    return SweepOptions(
        cases=CASES,
        gpu_label="h100",
        out=tmp_path / "run",
        probe_python=probe.python,
        reference=False,
        command=["cublas-audit", "sweep"],
        **given,  # type: ignore[arg-type]
    )


def test_no_ncu_means_cupti_with_a_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_machine(monkeypatch, ncu=None)  # this machine has no ncu
    notes: list[str] = []
    with deadline(DEADLINE_S):
        result = sweep_setup.sweep(options(tmp_path), Progress(note=notes.append))
    assert any("observing with CUPTI instead" in note for note in notes), notes
    env = rundir.read_env(result.run_dir)
    assert (env["observer"], env["profiled"]) == ("cupti", False)
    phases = [
        s["argv"][s["argv"].index("--phase") + 1] for s in seen(tmp_path) if "--phase" in s["argv"]
    ]
    assert "profile" not in phases and "time" in phases
    # counter columns empty, not zero
    assert result.frame["fma_pct"].isna().all()


def test_asking_for_ncu_without_it_is_exit_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_machine(monkeypatch, ncu=None)
    with pytest.raises(ToolMissingError, match="ncu"):
        sweep_setup.sweep(options(tmp_path, observer=Observer.ncu))


def test_events_observer_turns_cupti_off_in_the_probe(tmp_path: Path) -> None:
    decided = sweep_setup.checked(options(tmp_path, observer=Observer.events))
    assert decided.probe_env[probe_process.NO_CUPTI_ENV] == "1"


def test_an_unknown_observer_is_refused_in_one_line() -> None:
    with pytest.raises(AuditError, match="--observer: 'nvprof' is not one of ncu, cupti, events"):
        Observer.parse("nvprof")
    with pytest.raises(AuditError, match="--observer: 'ncu' is not one of cupti, events"):
        Observer.parse("ncu", MAP_OBSERVERS)  # a map never runs ncu
    assert Observer.parse(None) is None and Observer.parse("cupti") is Observer.cupti
