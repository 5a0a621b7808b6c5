"""Fixtures and hooks only; the helpers the test modules share live in tests/helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# `make test` runs two pytest-xdist workers on a 2-core machine. With torch's default of one intra-op
# thread per core, each worker (and each train.py it starts) would spin-wait for the other's core, which
# made the training tests three times slower; one thread per process keeps both cores busy with work.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


# The files that take longest, longest first: their `make test` parts (30 s to 2 minutes each on a busy
# 2-core box), and their `make slow` parts. Both targets hand whole files to their workers in collection
# order (--no-loadscope-reorder), so these go first: a worker left alone with one of them at the end would
# add its whole time to the suite's.
LONG_FILES = ("test_fault_matrix.py", "test_reliability.py", "test_sweeps.py", "test_rpe_triton.py", "test_configs.py",
              "test_settings.py", "test_eval_faults.py", "test_cli_input.py", "test_timm_generic.py")
SLOW_LONG_FILES = ("test_timm_generic.py", "test_fault_matrix.py", "test_train.py", "test_sweeps.py",
                   "test_reliability.py", "test_configs.py", "test_plot_rpe.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = SLOW_LONG_FILES if config.getoption("markexpr") == "slow" else LONG_FILES  # `make slow`: -m slow
    rank = {name: i for i, name in enumerate(order)}
    items.sort(key=lambda item: rank.get(item.path.name, len(order)))  # stable: a file keeps its order


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated datasets shared by the whole session (generation is deterministic).

    Under pytest-xdist the workers share one dir next to their own temp dirs: generation holds a file lock
    (data.generation), so a dataset that several test files use is generated once, not once per worker.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "data"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def one_torch_thread():
    """For tests of tiny tensors: one intra-op thread avoids OpenMP spin-waits on a busy 2-core box."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
