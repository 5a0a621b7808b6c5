"""The project's SLURM launcher (``hydra/launcher=slurm``), found by Hydra's plugin scan of ``hydra_plugins``.

hydra-submitit-launcher's, with a submission sbatch refuses reported in one line (`lifecycle.submission`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


class RpeSlurmLauncher(SlurmLauncher):
    """submitit's SLURM launcher whose refused submission is one line and takes back the sweep dir it made."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from lifecycle.submission import launch_or_refuse

        assert self.config is not None
        return launch_or_refuse(lambda: super(RpeSlurmLauncher, self).launch(job_overrides, initial_job_idx),
                                Path(str(self.config.hydra.sweep.dir)))
