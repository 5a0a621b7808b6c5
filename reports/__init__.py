"""scripts/make_tables.py in parts: ``collect`` (runs and their status), ``layouts`` (the paper's
numbers, table layouts), ``cells`` (cells and their statistics), ``findings`` (verdicts), ``render``
(Markdown, LaTeX, CSV). Import from the submodules."""
