"""How many pytest-xdist workers `pytest -q` starts (`-n auto`, tests/conftest.py): none on two
cores or fewer, where two workers cost more CPU time than one process, else pytest-xdist's count;
PYTEST_XDIST_AUTO_NUM_WORKERS decides where set."""

from __future__ import annotations

import os

import pytest

from tests import conftest

CONFIG = pytest.Config.__new__(pytest.Config)  # (the hook reads none of its options)


@pytest.mark.parametrize(("cores", "workers"), [(1, 0), (2, 0), (3, None), (64, None)])
def test_auto_starts_no_worker_on_two_cores_or_fewer(
    monkeypatch: pytest.MonkeyPatch, cores: int, workers: int | None
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert conftest.pytest_xdist_auto_num_workers(CONFIG) == workers


def test_the_cores_this_process_may_use_decide_not_the_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert conftest.pytest_xdist_auto_num_workers(CONFIG) == 0
    monkeypatch.delattr(os, "sched_getaffinity")  # (macOS has none: the machine's count)
    assert conftest.pytest_xdist_auto_num_workers(CONFIG) is None


def test_the_environment_variable_decides_where_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert conftest.pytest_xdist_auto_num_workers(CONFIG) is None
