"""What a test set measures, as one hash (``testset_sha256``), and whether a result read all of it.

eval.py records the hash and the images it read in each test-set result (`models.testsets`); make_tables
recomputes the hash from ``configs/testset/<name>.yaml`` and counts a result under ``<name>`` only when the
two agree and the whole set was read (`scripts.tables.collect`). Plain Python on purpose: the tables read
results without building a model.

The hash covers the test set's name and data settings, resolved, and the generator its data's completion
marker records (`data.generation`), not ``data.root``: where the data lives differs between machines
(``paths.data_dir``) while the marker says what was made there. ``description`` and ``fits`` are prose and
the runs it suits, never what is measured. Which images were read, byte for byte, a result records beside
the hash (``data_sha256``, for a test set with data of its own).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HASH_KEY = "testset_sha256"
READ_KEY, TOTAL_KEY = "images_read", "images_total"
PROVENANCE_KEYS = (HASH_KEY, READ_KEY, TOTAL_KEY)
# The digest of the generated images a result measured (`data.generation.scan_content`, checked against the
# data's marker before the test), beside the hash, not in it: make_tables recomputes the hash from the yaml,
# without the data, and results written before the digest was recorded keep their hash.
DATA_DIGEST_KEY = "data_sha256"


def measured(testset: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved test set (plain values) that decides its numbers: its name and its data
    settings without ``data.root``."""
    data = testset.get("data")
    data = {k: v for k, v in data.items() if k != "root"} if isinstance(data, Mapping) else data
    return json.loads(json.dumps({"name": testset.get("name"), "data": data}, default=str))


def configured_generator(testset: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the completion marker of the test set's own generated data records of its generator
    (``{"target", "kwargs"}``, as `data.generation.describe_generator` writes it), or None: the test set
    reads the run's data, or its data (COCO shapes) carries no such marker."""
    data = testset.get("data")
    generator = data.get("generator") if isinstance(data, Mapping) else None
    if not isinstance(generator, Mapping) or "_target_" not in generator:
        return None
    kwargs = {k: v for k, v in generator.items() if k not in ("_target_", "_partial_")}
    return json.loads(json.dumps({"target": generator["_target_"], "kwargs": kwargs}, default=str))


def testset_sha256(testset: Mapping[str, Any], generated: Mapping[str, Any] | None) -> str:
    """sha256 of the canonical JSON of `measured` ``testset`` and ``generated`` (its data's marker generator)."""
    payload = {"testset": measured(testset), "generated": generated}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def result_sha256(record: Mapping[str, Any]) -> str | None:
    """The definition hash of a result: its ``testset_sha256``, or for a result written before eval.py
    recorded it, the hash of the ``testset_config`` it stored (eval.py had checked its data's marker
    against that config); None when it records neither."""
    recorded = record.get(HASH_KEY)
    if recorded is not None:
        return recorded if isinstance(recorded, str) else None
    config = record.get("testset_config")
    return testset_sha256(config, configured_generator(config)) if isinstance(config, Mapping) else None


def load_definition(path: Path) -> dict[str, Any]:
    """The test set of ``configs/testset/<name>.yaml`` at ``path``, resolved without ``data.root`` (which
    names ``paths.data_dir``, known only inside a Hydra job, and is not hashed)."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(path)
    if "data" in node and OmegaConf.is_dict(node.data) and "root" in node.data:
        del node.data["root"]
    definition = OmegaConf.to_container(node, resolve=True)
    if not isinstance(definition, dict):
        raise ValueError(f"{path} is not a test set (a mapping of name, description, fits, data)")
    return definition
