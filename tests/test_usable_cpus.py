"""Worker and thread counts are sized by the CPUs this process may run on (its affinity under taskset or a
container's cpuset), not by the machine's count: one helper, used by every such limit."""

from __future__ import annotations

import argparse
import os

import pytest

from alfa.cli.options import thread_count, worker_count
from alfa.fileio import usable_cpus
from alfa.gaze.service import max_workers


@pytest.fixture
def two_of_sixty_four(monkeypatch):
    """A 64-CPU machine on which this process may run on 2 (``taskset -c 0,1``)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


def test_usable_cpus_is_the_affinity_not_the_machine(two_of_sixty_four):
    assert usable_cpus() == 2


def test_usable_cpus_falls_back_to_the_machine_where_the_system_has_no_affinity(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert usable_cpus() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # "cannot be determined"
    assert usable_cpus() == 1


def test_worker_count_is_bounded_by_the_cpus_this_process_may_use(two_of_sixty_four):
    assert worker_count("2") == 2
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        worker_count("3")
    assert str(refused.value) == "at most the 2 CPUs this process may use, got 3"


def test_thread_and_request_worker_limits_follow_the_same_count(two_of_sixty_four):
    assert thread_count("4") == 4
    with pytest.raises(argparse.ArgumentTypeError, match="at most twice the 2 CPUs this process may use, got 5"):
        thread_count("5")
    assert max_workers() == 16
