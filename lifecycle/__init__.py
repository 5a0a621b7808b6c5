"""The run lifecycle: run dirs and their identity, records, the lock, resume, stop signals, results.

``files`` (the guarded file layer), ``identity`` (what makes two runs the same), ``records`` (what a run
dir holds and its state), ``signals``, ``settings`` (value ranges), ``cli`` (checks before Hydra starts)
and ``job`` (one training job, used by train.py). Import from the submodules.
"""
