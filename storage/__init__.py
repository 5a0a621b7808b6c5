"""The guarded file layer below the models and the run package: ``files`` (atomic writes, bounded reads,
checksums, one-line file errors) and ``destinations`` (where a command may write, ``save_export``). It
reads the data layer's layouts and imports nothing from ``models``, ``lifecycle`` or ``tables``. Import
from the submodules."""
