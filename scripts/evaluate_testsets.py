"""Evaluate every finished run of some sweeps (or single run dirs) on named test sets, resumably.

    python scripts/evaluate_testsets.py runs/sweeps/shift_mini --testsets relational_right relational_everywhere
    python scripts/evaluate_testsets.py runs/sweeps/canvas_mini --testsets relational_canvas48 --ape extend

The test sets' own data is generated first where it is missing (``scripts/generate_testsets.py``).
Each (run, test set) is then what ``python eval.py ckpt_path=<run>/checkpoints/best.ckpt testset=<name>
[ape=<rule>]`` does, in this one process (a process per evaluation would spend most of its time starting):
the result goes to ``<run>/testsets/<name>[@<rule>].json``. A result already there for the same run
(identity and length), test set definition (``testset_sha256``) and rule, of the whole set, is kept (one of
an earlier length of the run, which was extended since, or a partial one, is replaced), so running the
command again evaluates only what is missing. One there for another definition of the test set (its yaml
was edited) is never overwritten: that evaluation stops with one line saying to remove the file. One that
make_tables would not count for what it measured (at another precision than 32-true, or of a test set that
reads the run's own data on other data) is evaluated again. ``--set`` never names the test set
(``testset.name=``), tests a part of it (``trainer.limit_test_batches``) nor sets another precision than
32-true (``trainer.precision``): each is refused in one line before anything runs. ``--set data_root=`` for a
test set that reads the run's own data must be a copy of each run's generated data, else that run's
evaluation is one line (eval.py's rule). Runs that have not finished are listed and left
out. Every problem is one line per (run, test set); the others still run; the exit code is 1 when any
evaluation was not done, 0 when every finished run has every result.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # generate_testsets, its sibling

import starting  # noqa: E402

starting.guard_imports(__name__)  # a temp dir among results, Ctrl-C during the imports: one line

from omegaconf import DictConfig, OmegaConf  # noqa: E402

from lifecycle.cli import compose_checked, literal  # noqa: E402
from lifecycle.console import one_line, say, user_error_types  # noqa: E402
from lifecycle.identity import run_length  # noqa: E402
from lifecycle.records import BEST, CHECKPOINTS, CONFIG, run_status  # noqa: E402
from lifecycle.run_config import load_run_config  # noqa: E402
from reports.collect import check_record, read_config  # noqa: E402
from storage.files import (  # noqa: E402
    CHECKSUM,
    RunFileError,
    checksum_problem,
    entry_exists,
    own_folder_problem,
    plain_file_exists,
    read_json,
    symlink_loop,
    unreadable_folder,
)


def _is_run_dir(path: Path) -> bool:
    """A folder with a ``checkpoints`` folder but no config (neither ``config.yaml`` nor ``.hydra/config.yaml``,
    which make_tables' discovery, `run_dirs`, goes by) is still a run whose config was lost: to be reported,
    never skipped without a word; so is a folder that cannot be looked into (`unreadable_folder`, one line)."""
    try:
        return entry_exists(path / CONFIG) or (path / CHECKPOINTS).is_dir()
    except OSError as err:
        raise unreadable_folder(path, err) from err


def _listed(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError as err:
        raise unreadable_folder(path, err) from err


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """The run dirs under each path, found as make_tables finds them (`tables.collect.run_dirs`: at any
    depth, hidden ones included, so that both commands count the same runs), plus the path itself or a
    sub-folder of it that holds a ``checkpoints`` folder but lost its config (`_is_run_dir`); each run once
    (by its resolved path). A path that holds no run is a mistake (a typo, an empty sweep), refused."""
    from reports.collect import run_dirs

    runs: list[Path] = []
    seen: set[Path] = set()
    from storage.destinations import refuse_dot_dot_after_link_read

    for path in paths:
        # a run is named and its checkpoints found by the path's text: `lnk/..` would name `..` and read elsewhere
        refuse_dot_dot_after_link_read(path, "the run or sweep dir")
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is not a run or sweep dir")
        found = set(run_dirs(path))
        if _is_run_dir(path):
            found.add(path)
        else:
            listed = _listed(path)
            found.update(p for p in listed if p.is_dir() and not p.is_symlink() and _is_run_dir(p))
            for loop in sorted(p for p in listed if symlink_loop(p) == p):  # a job dir lost to a link loop
                say(f"note: {loop} is a symlink loop (its links lead back to themselves): no run there is evaluated")
            inside = os.path.realpath(path)
            for link in sorted(p for p in listed if p.is_symlink() and p.is_dir() and _is_run_dir(p)):
                # as make_tables, which never follows it: its result would be written into the run it leads to
                if os.path.commonpath([inside, os.path.realpath(link)]) == inside:
                    continue  # a link to a run of this folder: that run is evaluated under its own name
                say(f"note: {link} is a symlink (to {os.readlink(link)}): the run it leads to is not one of"
                    f" {path}'s and is not evaluated; give its own dir to evaluate it")
        if not found:
            raise FileNotFoundError(f"{path} holds no run (no config.yaml or checkpoints/ in it or in its"
                                    " sub-folders); valid: a train.py run dir or a sweep dir of them")
        for run in sorted(found):  # the same run named twice (or by a link) is evaluated and counted once
            if run.resolve() not in seen:
                seen.add(run.resolve())
                runs.append(run)
    return runs


def existing_result(run_dir: Path, name: str, ape_rule: str | None) -> tuple[Path, dict[str, Any]] | None:
    """The result already written for test set ``name`` with ``ape_rule`` (None: the model's default rule,
    i.e. no rule or interpolate), as ``(path, record)``; None when there is none. A damaged file raises."""
    from lifecycle.testsets import RESULT_FOLDER, result_name

    rules = [ape_rule] if ape_rule is not None else [None, "interpolate"]
    for rule in rules:
        path = run_dir / RESULT_FOLDER / f"{result_name(name, rule)}.json"
        record = read_json(path)
        if record is not None:
            return path, record
    return None


def run_identity(run_dir: Path) -> str:
    """The identity of the run's config (for a result file of a run whose metrics.json predates it)."""
    from lifecycle.identity import identity_config, identity_hash

    return identity_hash(identity_config(load_run_config(run_dir / CONFIG)))


def testset_config(testset: str, ape_rule: str | None, extra: list[str]) -> DictConfig:
    """eval.py's config for ``testset`` (and ``ape_rule``, ``--set``), composed and checked once for every run
    it evaluates; ``ckpt_path`` is left null for `evaluate_run` to fill in."""
    overrides = [f"testset={testset}", *extra]
    if ape_rule is not None:
        overrides.append(f"ape={ape_rule}")
    return compose_checked("eval", overrides)


def evaluate_run(run_dir: Path, testset: str, composed: DictConfig, ape_rule: str | None, identity: str,
                 length: dict[str, Any], run_data: dict[str, Any] | None = None,
                 run_metrics: dict[str, Any] | None = None) -> str:
    """Evaluate one run on ``testset``, whose config ``composed`` is (`testset_config`), unless its result is
    there; returns what was done, in one line. ``run_data`` (the run's resolved data config) judges whether
    a result there of a test set that reads the run's data measured the run's data (`measured_problem`), and
    ``run_metrics`` (its metrics.json) whether it measured the weights the run's result is of
    (`training_problem`)."""
    import eval as eval_script
    from lifecycle.testset_definition import (
        CHECKPOINT_SHA256_KEY,
        READ_KEY,
        TOTAL_KEY,
        checkpoint_sha256,
        configured_generator,
        measured_problem,
        result_sha256,
        testset_sha256,
        training_problem,
    )
    from lifecycle.testsets import RESULT_FOLDER, check_result_folder, load_testset

    cfg = copy.deepcopy(composed)
    # set on the composed config, never as override text: Hydra would read `${...}` or quotes in a run's path
    cfg.ckpt_path = literal(str(run_dir / CHECKPOINTS / BEST))
    definition = load_testset(cfg.testset)
    folder = run_dir / RESULT_FOLDER
    problem = own_folder_problem(folder, "test-set results")
    if problem:  # a link there leads to another folder's results: never read as this run's, nor to be removed
        raise RunFileError(f"{folder}: {problem} (nothing was evaluated)")
    # one line naming the folder, not a result file in it; eval.py checks it can write there before the test (a
    # sound result there is kept without a write)
    check_result_folder(folder, write=False)
    found = existing_result(run_dir, testset, ape_rule)
    stale = ""
    if found is not None:
        path, record = found
        ours = record.get("identity") == identity
        # eval.py checks the data's marker against the definition, so the definition's generator stands for it
        same_definition = result_sha256(record) == testset_sha256(definition, configured_generator(definition))
        whole = record.get(READ_KEY) == record.get(TOTAL_KEY)  # neither recorded (an older result): taken as whole
        # changed after eval.py wrote it (make_tables does not count it): no result to keep, evaluated again
        damage = checksum_problem(record) if CHECKSUM in record else ""
        other, _ = measured_problem(record, definition, run_data)  # make_tables would not count it: evaluated again
        other = other or (training_problem(record, run_metrics, run_dir) if run_metrics is not None else "")
        # a result is of the file it measured: a best.ckpt replaced since is evaluated (eval.py judges the file)
        measured_file = record.get(CHECKPOINT_SHA256_KEY)
        replaced = measured_file is not None and measured_file != checkpoint_sha256(run_dir / CHECKPOINTS / BEST)
        if ours and same_definition and record.get("length") in (None, length) and whole and not damage \
                and not other and not replaced:
            return f"kept {path}"
        if not (ours and same_definition):
            why = ("another run's result" if record.get("identity") not in (None, identity)
                   else "a result of another definition of the test set")
            raise RunFileError(f"{path} holds {why}; remove it to evaluate {run_dir.name} on {testset} again")
        if record.get("length") not in (None, length):
            stale = f" (replacing the result of its earlier length {record.get('length')})"  # the run was extended
        elif not whole:
            read, total = record.get(READ_KEY), record.get(TOTAL_KEY)
            over = isinstance(read, int) and isinstance(total, int) and read > total  # duplicates, not a part
            stale = f" (replacing a {'result that counted images twice' if over else 'partial result'}: {read} of" \
                    f" {total} images)"
        elif other:
            stale = f" (replacing a result that is not counted: {other})"
        elif replaced:
            stale = f" (replacing the result of another file: {BEST} changed since it was measured)"
        else:
            stale = f" (replacing a damaged result: {damage})"
    written: list[Path] = []
    metrics = eval_script.evaluate(cfg, written)
    headline = next((k for k in ("val/top1", "val/AP") if k in metrics), None)
    shown = f", {headline} {metrics[headline]:.2f}" if headline else ""
    return f"wrote {written[0]}{shown}{stale}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="sweep dirs or run dirs")
    parser.add_argument("--testsets", nargs="+", required=True, help="names of configs/testset/*.yaml")
    parser.add_argument("--ape", default=None, help="interpolate | extend (DeiT runs with a table)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more eval.py overrides (paths.data_dir=..., batch_size=...)")
    args = parser.parse_args(argv)
    from lifecycle.signals import exit_when_interrupted

    # from the checks on: a signal before any evaluation is the same one line and exit code as one during it
    with exit_when_interrupted("evaluate_testsets.py", "the results written so far are whole, the one in progress"
                               " was not written: run the same command again to finish"):
        return _checked_and_evaluated(args)


def _checked_and_evaluated(args: argparse.Namespace) -> int:
    """`main`'s work: every check, in one line (exit 2) before any data is made, then every evaluation."""
    try:
        from lifecycle.testsets import check_ape_rule, testset_names

        check_ape_rule(args.ape)
        unknown = [t for t in args.testsets if t not in testset_names()]
        if unknown:
            raise ValueError(f"--testsets {unknown[0]} is not a test set; valid: {', '.join(testset_names())}")
        args.testsets = list(dict.fromkeys(args.testsets))  # a test set named twice is evaluated once
        check_extra_overrides(args.set)
        check_whole_test_settings(args.set)
        from generate_testsets import own_root, refuse_shared_roots

        # an unknown --set key, a bad value or one data folder for two test sets: one line before any data is made
        refuse_shared_roots({t: own_root(testset_config(t, args.ape, args.set)) for t in args.testsets})
        runs = find_runs(args.paths)
    except user_error_types() as err:
        say(f"error: {one_line(err)}", stream=sys.stderr)
        return 2
    problems, done = _evaluate_all(runs, args)
    say(f"{len(runs)} runs x {len(args.testsets)} test sets; {done} evaluated or kept, {problems} not")
    return 1 if problems else 0


def check_extra_overrides(extra: list[str]) -> None:
    """``--set`` takes settings of the evaluation (``paths.data_dir=``, ``batch_size=``, a test set's own
    keys): never the run, the test set or the rule, which the arguments name, nor the test set's definition."""
    from lifecycle.testsets import fits_override_problem

    for override in extra:
        if "=" not in override:
            raise ValueError(f"--set {override!r} is not key=value")
        key = override.lstrip("+~").split("=", 1)[0]
        if key == "testset.name":  # a result is filed, and counted by make_tables, under its test set's name
            raise ValueError(f"--set {override} would file one test set's result under another's name; valid: name"
                             " the test set in --testsets (configs/testset/<name>.yaml)")
        problem = fits_override_problem(key)
        if problem:
            raise ValueError(f"--set {override} {problem}; valid: leave testset.fits out, and name test sets that fit"
                             " the runs in --testsets")
        if key.split(".", 1)[0].split("/", 1)[0] == "hydra":  # composed with Hydra's API: no Hydra job runs
            raise ValueError(f"--set {override} is not a setting of the evaluations: they run inside this command"
                             " and make no folder (each result goes into its run's testsets/); valid in --set: eval.py"
                             " settings (paths.data_dir=, batch_size=, testset.data.<key>=, ...)")
        if key in ("ckpt_path", "testset", "ape"):
            raise ValueError(f"--set {override} would replace what the arguments name (the run dirs, --testsets,"
                             " --ape); valid in --set: other eval.py settings (paths.data_dir=, batch_size=,"
                             " testset.data.<key>=, ...)")


def check_whole_test_settings(extra: list[str]) -> None:
    """Refuse, in one line before any data or evaluation, ``--set`` trainer settings that test a part of each
    test set (`lifecycle.testsets.partial_test_setting`): such a result would stand for the whole set; and a
    precision other than the one every test-set column is measured at (`lifecycle.testsets.check_test_precision`)."""
    from lifecycle.testset_definition import TESTSET_PRECISION, precision_problem
    from lifecycle.testsets import not_a_test_set_setting, partial_test_setting

    trainer = [o for o in extra if o.lstrip("+~").split("=", 1)[0].split(".")[0].split("/")[0] == "trainer"]
    if not trainer:
        return
    # the machine's devices are checked with each test set's config (`testset_config`), after these rules, which
    # hold on every machine
    composed = compose_checked("eval", trainer, devices=False).trainer
    setting = partial_test_setting(composed)
    if setting is not None:
        raise ValueError(f"--set {not_a_test_set_setting(setting, 'each test set')}")
    precision = composed.get("precision")
    if precision_problem(precision):
        given = " ".join(trainer)
        named = given if given == f"trainer.precision={precision}" else f"{given} (trainer.precision={precision})"
        raise ValueError(f"--set {named}: every test-set column is measured at {TESTSET_PRECISION}, whatever"
                         " precision each run trained at (nothing was evaluated); valid: no trainer.precision"
                         f" (or {TESTSET_PRECISION}; with trainer=gpu too)")


def generate_missing(testsets: list[str], extra: list[str]) -> list[str]:
    """Generate the data of the test sets that have their own (`scripts/generate_testsets.py`; kept when
    already complete); returns the test sets whose data could not be made, each reported in one line."""
    from generate_testsets import generate, generated_testsets

    own = set(generated_testsets())
    data_settings = [o for o in extra if o.lstrip("+~").startswith(("paths.", "testset."))]
    failed = []
    for testset in testsets:
        if testset not in own:
            continue
        try:
            generate(testset, data_settings)
        except user_error_types() as err:
            say(f"error: {testset}: its data could not be made: {one_line(err)}", stream=sys.stderr)
            failed.append(testset)
    return failed


def _evaluate_all(runs: list[Path], args: argparse.Namespace) -> tuple[int, int]:
    """Every run x test set; returns (not evaluated, evaluated or kept)."""
    from lifecycle.records import partial_run

    failed = generate_missing(args.testsets, args.set)
    problems = len(failed) * max(len(runs), 1)  # each error line printed makes the exit code non-zero
    testsets = []
    for testset in args.testsets:
        if testset in failed:
            continue
        try:
            testsets.append((testset, testset_config(testset, args.ape, args.set)))
        except user_error_types() as err:
            say(f"error: {testset}: {one_line(err)}", stream=sys.stderr)
            problems += max(len(runs), 1)
    done = 0
    for run_dir in runs:
        status = run_status(run_dir)
        if status.state != "finished":
            why = status.error or status.problem  # a failed run's error; the damaged record of an unreadable one
            say(f"left out {run_dir}: {status.state}{': ' + why if why else ''}")
            problems += 1
            continue
        partial = partial_run(status.metrics)
        if partial:  # a smoke run has no result, so neither has it one on another test set
            say(f"left out {run_dir}: a smoke run ({partial})")
            problems += 1
            continue
        try:  # a damaged config.yaml is this run's problem, in one line naming it: the other runs go on
            if not plain_file_exists(run_dir / CONFIG):
                raise RunFileError(f"{run_dir / CONFIG} is missing")
            run_cfg = load_run_config(run_dir / CONFIG)
            # a config edited after training is no run of its record: make_tables would not count its results
            check_record(run_dir, read_config(run_dir / CONFIG), status.state)
            length = run_length(run_cfg)
            run_data = OmegaConf.to_container(run_cfg.data, resolve=True)
            identity = status.metrics.get("identity") or run_identity(run_dir)
        except user_error_types() as err:
            say(f"left out {run_dir}: unreadable: {one_line(err)}")
            problems += 1
            continue
        for testset, composed in testsets:
            try:
                outcome = evaluate_run(run_dir, testset, composed, args.ape, identity, length, run_data,
                                       status.metrics)
                say(f"{run_dir.name} / {testset}: {outcome}")
                done += 1
            except user_error_types() as err:
                say(f"error: {run_dir.name} / {testset}: {one_line(err)}", stream=sys.stderr)
                problems += 1
    return problems, done


if __name__ == "__main__":
    starting.imported()
    sys.exit(main())
