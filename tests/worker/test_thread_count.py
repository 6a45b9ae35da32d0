"""The model's thread count, from the cores a worker has and the workers that share them."""

from __future__ import annotations

import os

import pytest

from shared.settings import WorkerSettings
from worker.cli import worker_threads
from worker.thread_count import available_cores, intra_op_threads


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(1, 1, 1), (2, 1, 2), (2, 2, 1), (3, 2, 1), (4, 1, 4), (4, 3, 1), (16, 4, 4), (64, 6, 10)],
)
def test_each_worker_gets_its_share_of_the_cores_and_no_more(cores: int, workers: int, threads: int):
    assert intra_op_threads(cores, workers) == threads


def test_more_workers_than_cores_still_get_one_thread_each():
    assert intra_op_threads(2, 8) == 1


def test_the_cores_are_the_ones_this_process_may_run_on():
    assert available_cores() == len(os.sched_getaffinity(0))


def test_arbor_threads_overrides_the_rule_and_workers_per_host_feeds_it():
    assert worker_threads(WorkerSettings(threads=5)) == 5
    cores = available_cores()
    assert worker_threads(WorkerSettings(workers_per_host=2)) == intra_op_threads(cores, 2)


def test_omp_num_threads_is_honoured_as_arbor_threads(monkeypatch):
    monkeypatch.delenv("ARBOR_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert WorkerSettings().threads == 3
    monkeypatch.setenv("ARBOR_THREADS", "2")
    assert WorkerSettings().threads == 2
