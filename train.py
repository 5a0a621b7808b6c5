"""Train a model: ``python train.py [group=option ...] [key=value ...]`` (Hydra).

Composes ``configs/train.yaml``, fits, tests the best checkpoint on the validation split and writes
``metrics.json`` into the run dir. See docs/usage.md for the groups and the recipes, and ``lifecycle/``
for the run lifecycle (run dirs, resume, records, stop signals).
"""

from __future__ import annotations

import starting

starting.guard_imports(__name__)  # Ctrl-C during the imports below: one line, exit 130

from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from lifecycle.cli import cli  # noqa: E402
from lifecycle.job import after_sweep, interrupted_outside_a_job, run_job  # noqa: E402


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    return run_job(cfg, script=Path(__file__).resolve())


if __name__ == "__main__":
    starting.imported()
    cli(main, "train", after=after_sweep, interrupted=interrupted_outside_a_job)
