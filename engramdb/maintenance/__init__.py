"""The maintenance pass: what turns a store into a memory.

Pure lifecycle functions in Trace Lite's shape (decay, deduplicate, cluster, forget,
consolidate), the incremental pass over a file, archive compaction and a forget that leaves
no trace. This package never imports the ``Engram`` facade; ``engram.py`` calls into it.
"""
# The submodule forget.py shares its name with the pure function below: importing it binds
# the package's ``forget`` to the module, the first time only. So it is imported first, and
# ``from .lifecycle import forget`` then makes ``engramdb.maintenance.forget`` the function.
from . import forget as _forget_module  # noqa: F401
from .lifecycle import (
    Consolidated,
    Decayed,
    Deduplicated,
    Forgotten,
    MaintenanceConfig,
    MaintenanceReport,
    Memory,
    Summarizer,
    cluster,
    consolidate,
    cosine_similarity,
    decay,
    deduplicate,
    forget,
)
from .run import read_last_pass

__all__ = ["Consolidated", "Decayed", "Deduplicated", "Forgotten", "MaintenanceConfig", "MaintenanceReport", "Memory",
           "Summarizer", "cluster", "consolidate", "cosine_similarity", "decay", "deduplicate", "forget", "read_last_pass"]
