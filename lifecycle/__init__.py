"""The run lifecycle: run dirs and their identity, records, the lock, resume, stop signals, results.

``identity`` (what makes two runs the same), ``records`` (what a run dir holds and its state), ``checkpoints``
(the resume point and what every checkpoint of a run carries), ``signals``, ``settings`` (value ranges),
``cli`` (checks before Hydra starts), ``job`` (one training job, used by train.py), ``run_config`` and
``testsets`` (reading and evaluating a run dir). The layer above the models: ``models``, ``rpe``, ``data``
and ``storage`` (the guarded file layer) never import it. Import from the submodules.
"""
