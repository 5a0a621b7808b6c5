"""The names of the records that make a folder a run's dir (`storage.destinations.is_run_dir`).

Named below the run package, which writes and reads them: ``lifecycle.records`` holds the rest of a run
dir's names and the rules for each file."""

RUN_RECORD = "run.json"
CONFIG = "config.yaml"
METRICS = "metrics.json"
CHECKPOINTS = "checkpoints"
