"""The project's optuna sweeper (``hydra/sweeper=optuna_rpe``), found by Hydra's plugin scan of ``hydra_plugins``.

Hydra makes only classes under ``hydra_plugins`` into sweepers, so the class lives here; what it changes in
hydra-optuna-sweeper's is in `lifecycle.sweeper`. Without the optional optuna plugin installed this module
defines nothing, and the command-line check names the sweeper that cannot start.
"""

from __future__ import annotations

from typing import Any

try:
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
except ImportError:  # the optuna extra is not installed: nothing to register
    pass
else:

    class RpeOptunaSweeper(OptunaSweeper):
        """hydra-optuna-sweeper's sweeper, whose study goes on past a failed trial (`TrialFailureTelling`)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # the plugin's own __init__ only builds its implementation: build ours, with the same settings
            from lifecycle.sweeper import TrialFailureTelling

            self.sweeper = TrialFailureTelling(*args, **kwargs)
