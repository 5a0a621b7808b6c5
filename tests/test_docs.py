"""The docs say what the tree holds: docs/design.md's file lists, and the paths, config choices, make targets,
scripts and links the README and docs/ name. Static reads only, so these run in well under a second."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.helpers import CONFIG_DIR, ROOT

README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
MAX_README_LINES = 300  # a README that guides: the rest lives in docs/
# every module of these packages is listed in docs/design.md (`__init__.py` aside)
PACKAGES = ("rpe", "rpe/encodings", "models", "models/detr", "storage", "lifecycle", "reports", "data")
TOP_FOLDERS = ("configs", "data", "docs", "findings", "lifecycle", "models", "rpe", "scripts", "storage", "reports",
               "tests")
GROUPS = ("experiment", "sweep", "rpe", "model", "data", "trainer", "testset", "logger", "callbacks", "debug",
          "paths", "hydra/launcher", "hydra/sweeper")

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
LISTED_LINE = re.compile(r"^([\w/*.-]+\.py)\s")  # a file list's line: the path, then what it holds
HEADING = re.compile(r"^#+ .*$", re.M)
HEADING_FOLDER = re.compile(r"`([\w/]+/)`")  # "## 6. The run lifecycle (`lifecycle/`)"
TABLE_FILE = re.compile(r"^\| `([\w.-]+\.py)` \|", re.M)  # a table row naming a file of that folder
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP_FOLDERS) + r")/[\w./<>{},*-]*[\w>}*/])")
MAKE = re.compile(r"(?<![\w.])make ([a-z][\w-]*)")
PYTHON = re.compile(r"(?<![\w.])python ([\w/.-]+\.py)\b")
CHOICE = re.compile(r"(?<![\w./+-])(" + "|".join(map(re.escape, GROUPS)) + r")=([\w|,-]+)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


# ----------------------------------------------------------------------------- design.md's file lists
def design_listed_files(text: str) -> list[str]:
    """The files design.md lists, as paths (globs allowed) from the root: each line of a plain code block that
    starts with a ``.py`` path, and each table row naming a ``.py`` file under a heading that names its folder."""
    listed = [m.group(1) for lang, body in FENCE.findall(text) if not lang
              for m in map(LISTED_LINE.match, body.splitlines()) if m]
    headings = list(HEADING.finditer(text))
    for i, heading in enumerate(headings):
        folder = HEADING_FOLDER.search(heading.group(0))
        if folder:
            end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
            listed += [folder.group(1) + name for name in TABLE_FILE.findall(text, heading.end(), end)]
    return listed


def design_list_problems(text: str, root: Path) -> list[str]:
    """What is wrong with design.md's file lists against the tree at ``root``: a listed path that matches no
    file, and a module of `PACKAGES` that no listed path covers."""
    listed = design_listed_files(text)
    problems = [f"listed but missing: {p}" for p in listed if not list(root.glob(p))]
    for package in PACKAGES:
        for module in sorted((root / package).glob("*.py")):
            name = module.relative_to(root).as_posix()
            if module.name != "__init__.py" and not any(fnmatch(name, p) for p in listed):
                problems.append(f"not listed: {name}")
    return problems


def test_design_lists_every_module_and_only_files_that_exist() -> None:
    listed = design_listed_files(DESIGN.read_text())
    assert "rpe/registry.py" in listed and "lifecycle/job.py" in listed  # both lists are read
    assert design_list_problems(DESIGN.read_text(), ROOT) == []


def test_a_missing_or_unlisted_file_is_reported(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
    (tmp_path / "rpe" / "index.py").write_text("")
    (tmp_path / "rpe" / "stray.py").write_text("")
    (tmp_path / "lifecycle" / "job.py").write_text("")
    text = ("```\nrpe/index.py   ids\nrpe/gone.py    removed since\n```\n\n## 6. Lifecycle (`lifecycle/`)\n\n"
            "| module | owns |\n|---|---|\n| `job.py` | one job |\n| `cli.py` | the command line |\n")
    assert design_list_problems(text, tmp_path) == [
        "listed but missing: rpe/gone.py", "listed but missing: lifecycle/cli.py", "not listed: rpe/stray.py"]


# ----------------------------------------------------------------------------- the README
def test_the_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move the details to docs/"


def code_spans(text: str) -> list[str]:
    """The text of every shell or plain fenced block and inline code span: where commands are written (Python
    blocks call functions, whose ``rpe=cfg`` is an argument, not a choice)."""
    blocks = [body for lang, body in FENCE.findall(text) if lang != "python"]
    rest = FENCE.sub("", text)
    return blocks + re.findall(r"`([^`\n]+)`", rest)


def expanded(path: str) -> list[str]:
    """``path`` as globs: ``{a,b}`` spelled out, a ``<placeholder>`` any name."""
    brace = re.search(r"\{([^{}]*)\}", path)
    if brace:
        return [g for alt in brace.group(1).split(",")
                for g in expanded(path[:brace.start()] + alt + path[brace.end():])]
    return [re.sub(r"<[^<>]*>", "*", path)]


def readme_problems(text: str, root: Path) -> list[str]:
    """What the README names that the tree at ``root`` lacks: a path of the project's folders, a make target, a
    Python script, or a config group's option."""
    problems = []
    for path in dict.fromkeys(PATH.findall(text)):
        if not all(list(root.glob(g.rstrip("/"))) for g in expanded(path)):
            problems.append(f"no such path: {path}")
    targets = set(re.findall(r"^([\w-]+):", (root / "Makefile").read_text(), re.M))
    spans = code_spans(text)
    for span in spans:
        problems += [f"no make target: {t}" for t in MAKE.findall(span) if t not in targets]
        problems += [f"no script: {s}" for s in PYTHON.findall(span) if not (root / s).is_file()]
        for group, options in CHOICE.findall(span):
            problems += [f"no option: {group}={o}" for o in re.split(r"[|,]", options)
                         if o and not (root / CONFIG_DIR.name / group / f"{o}.yaml").is_file()]
    return list(dict.fromkeys(problems))


def test_everything_the_readme_names_exists() -> None:
    text = README.read_text()
    spans = "\n".join(code_spans(text))
    assert "make train" in spans and "experiment=" in spans and "scripts/" in text  # the checks have matter
    assert readme_problems(text, ROOT) == []


def test_a_readme_naming_what_is_not_there_is_reported() -> None:
    text = ("Run `make train`, `make tset` and `python scripts/nope.py`, see `configs/sweep/where_mini.yaml`,\n"
            "`scripts/gone.sh` and `docs/benchmark_<task>.md`:\n\n```bash\n"
            "python train.py experiment=quickstart rpe=irpe_k,irpe_kk sweep=nope_mini\n```\n")
    assert sorted(readme_problems(text, ROOT)) == [
        "no make target: tset", "no option: rpe=irpe_kk", "no option: sweep=nope_mini", "no script: scripts/nope.py",
        "no such path: scripts/gone.sh", "no such path: scripts/nope.py"]


# ----------------------------------------------------------------------------- links between the docs
def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")


DOC_PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOC_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in DOC_PAGES])
def test_every_link_of_the_docs_leads_somewhere(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # a web address: not checked offline
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif fragment and file.suffix == ".md" and fragment not in {
                anchor(h) for h in HEADING.findall(FENCE.sub("", file.read_text()))}:
            broken.append(target)
    assert broken == []


# ----------------------------------------------------------------------------- tests the docs name
NAMED_TEST = re.compile(r"(test_\w+\.py)::(test_\w+)(?![\w{])")  # `..._by_{a,b}` names several: left out


def missing_named_tests(text: str, tests_dir: Path) -> list[str]:
    """Each ``test_file.py::test_name`` of ``text`` whose file lacks a ``def test_name``."""
    missing = []
    for file, name in sorted(set(NAMED_TEST.findall(text))):
        path = tests_dir / file
        if not path.is_file() or not re.search(rf"^\s*def {name}\(", path.read_text(), re.M):
            missing.append(f"{file}::{name}")
    return missing


@pytest.mark.parametrize("doc", ["README.md", "docs/reliability.md", "docs/usage.md", "docs/design.md",
                                 "docs/benchmarks.md", "docs/results.md"])
def test_every_test_the_docs_name_exists(doc: str) -> None:
    """A case the docs say a test covers names a test that exists (a renamed or removed test leaves a stale row)."""
    assert missing_named_tests((ROOT / doc).read_text(), ROOT / "tests") == []


def test_a_stale_test_name_is_reported(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("def test_kept():\n    pass\n")
    text = "| x | y | `test_a.py::test_kept` |\n| x | y | `test_a.py::test_gone` | `test_b.py::test_c` |"
    assert missing_named_tests(text, tmp_path) == ["test_a.py::test_gone", "test_b.py::test_c"]
