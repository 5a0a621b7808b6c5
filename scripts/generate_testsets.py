"""Generate the data of named test sets that have a generator of their own, once, before eval.py reads them.

    python scripts/generate_testsets.py relational_right relational_canvas48
    python scripts/generate_testsets.py --all --set paths.data_dir=/scratch/data

Each test set's data goes to its own ``data.root`` (``configs/testset/<name>.yaml``, under
``paths.data_dir``), written atomically: a root already complete with the same settings is kept, one made
with other settings stops with the differences. eval.py never generates data, so this is the one way a
test set's images are made (``scripts/evaluate_testsets.py`` calls it for the test sets it evaluates).
Test sets that read the evaluated run's own data (``val_at_*``) have nothing to generate. Each problem is
one line; the exit code is 1 when any test set was not made.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import starting  # noqa: E402

starting.guard_imports(__name__)  # a temp dir among results, Ctrl-C during the imports: one line

from lifecycle.cli import compose_checked  # noqa: E402
from lifecycle.console import one_line, say, user_error_types  # noqa: E402


def generated_testsets() -> list[str]:
    """The test sets with a generator of their own (those this script makes)."""
    from omegaconf import OmegaConf

    from lifecycle.project import CONFIG_DIR
    from lifecycle.testsets import testset_names

    return [name for name in testset_names()
            if OmegaConf.load(CONFIG_DIR / "testset" / f"{name}.yaml").get("data", {}).get("generator") is not None]


def check_extra(extra: list[str]) -> None:
    """``--set`` takes ``paths.*`` and ``testset.*`` settings: nothing else shapes a test set's data."""
    for override in extra:
        key = override.lstrip("+~").split("=", 1)[0]
        if "=" not in override or not key.startswith(("paths.", "testset.")):
            raise ValueError(f"--set {override!r} is not a paths.<key>=value or testset.<key>=value setting; those"
                             " are what decide a test set's data")


def own_root(cfg: DictConfig) -> Path | None:
    """The folder the test set of a composed eval config generates its data into (links and ``..`` resolved);
    None for a test set that reads the run's data."""
    data = cfg.testset.get("data")
    if not isinstance(data, DictConfig) or data.get("generator") is None or data.get("root") is None:
        return None
    return Path(os.path.realpath(Path(str(data.root)).expanduser()))


def refuse_shared_roots(roots: dict[str, Path | None]) -> None:
    """Refuse test sets (``{name: own_root}``) whose data would share a folder, one of them in or at another's:
    each generated set is kept only at a root of its own, so the first would be made and every other refused
    (or reported made over the first one's files). Called before anything is generated."""
    seen: dict[str, Path] = {}
    for name, root in roots.items():
        if root is None:
            continue
        for other, taken in seen.items():
            if root == taken:
                shared = f"testset.data.root of {other} and {name} is one folder, {root}"
            elif taken in root.parents or root in taken.parents:
                inner, outer = (name, other) if taken in root.parents else (other, name)
                shared = (f"testset.data.root of {inner} ({roots[inner]}) lies inside {outer}'s"
                          f" ({roots[outer]})")
            else:
                continue
            raise ValueError(f"{shared}: each test set's data needs a folder of its own (nothing was generated);"
                             " valid: testset.data.root=... for one test set per command, or paths.data_dir=<folder>"
                             " (every test set's own folder under it)")
        seen[name] = root


def refuse_destination(name: str, cfg: DictConfig) -> None:
    """The test set ``name``'s own root (composed in ``cfg``) lies in no run dir and no other data root, as its
    generation checks again: refused (naming the test set) before any test set is generated."""
    from storage.destinations import DestinationError, check_destination

    try:
        check_destination(str(cfg.testset.data.root), "testset.data.root", data_root=True)
    except DestinationError as err:
        raise DestinationError(f"{name}: {err}") from None


def generate(name: str, extra: list[str]) -> Path:
    from lifecycle.testsets import generate_testset_data

    return generate_testset_data(compose_checked("eval", [f"testset={name}", *extra]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="names of configs/testset/*.yaml")
    parser.add_argument("--all", action="store_true", help="every test set with a generator of its own")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="paths.data_dir=... or testset.data.<key>=... overrides")
    args = parser.parse_args(argv)
    try:
        from lifecycle.testsets import testset_names

        check_extra(args.set)
        names = generated_testsets() if args.all else args.names
        if not names:
            raise ValueError(f"name test sets to generate, or --all; valid: {', '.join(generated_testsets())}")
        setting = next((n for n in names if "=" in n), None)
        if setting is not None:
            raise ValueError(f"{setting} is a setting, not a test set: give settings after --set"
                             f" (--set {setting})")
        unknown = [n for n in names if n not in testset_names()]
        if unknown:
            raise ValueError(f"{unknown[0]} is not a test set; valid: {', '.join(generated_testsets())}")
        names = list(dict.fromkeys(names))  # a test set named twice is made (and reported) once
        # an unknown --set key, a bad value, a root where no data may go or one folder for two test sets: one line
        # (rc 2) before any data is written
        configs = {name: compose_checked("eval", [f"testset={name}", *args.set]) for name in names}
        roots = {name: own_root(cfg) for name, cfg in configs.items()}
        for name, root in roots.items():
            if root is not None:
                refuse_destination(name, configs[name])
        refuse_shared_roots(roots)
    except user_error_types() as err:
        say(f"error: {one_line(err)}", stream=sys.stderr)
        return 2
    problems = 0
    for name in names:
        try:
            say(f"{name}: {generate(name, args.set)}")
        except user_error_types() as err:
            say(f"error: {name}: {one_line(err)}", stream=sys.stderr)
            problems += 1
        except KeyboardInterrupt:
            say(f"error: interrupted while generating {name}; nothing half-made was left at its root (generation"
                " writes a temporary folder first): run the same command again", stream=sys.stderr)
            return 130
    return 1 if problems else 0


if __name__ == "__main__":
    starting.imported()
    sys.exit(main())
