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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.lifecycle.cli import compose_checked, one_line, say, user_error_types  # noqa: E402


def generated_testsets() -> list[str]:
    """The test sets with a generator of their own (those this script makes)."""
    from omegaconf import OmegaConf

    from models.lifecycle.cli import CONFIG_DIR
    from models.testsets import testset_names

    return [name for name in testset_names()
            if OmegaConf.load(CONFIG_DIR / "testset" / f"{name}.yaml").get("data", {}).get("generator") is not None]


def check_extra(extra: list[str]) -> None:
    """``--set`` takes ``paths.*`` and ``testset.*`` settings: nothing else shapes a test set's data."""
    for override in extra:
        key = override.lstrip("+~").split("=", 1)[0]
        if "=" not in override or not key.startswith(("paths.", "testset.")):
            raise ValueError(f"--set {override!r} is not a paths.<key>=value or testset.<key>=value setting; those"
                             " are what decide a test set's data")


def generate(name: str, extra: list[str]) -> Path:
    from models.testsets import generate_testset_data

    return generate_testset_data(compose_checked("eval", [f"testset={name}", *extra]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="names of configs/testset/*.yaml")
    parser.add_argument("--all", action="store_true", help="every test set with a generator of its own")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="paths.data_dir=... or testset.data.<key>=... overrides")
    args = parser.parse_args(argv)
    try:
        from models.testsets import testset_names

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
        for name in names:  # an unknown --set key or a bad value: one line (rc 2) before any data is written
            compose_checked("eval", [f"testset={name}", *args.set])
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
    sys.exit(main())
