"""Imports point downward only (STYLE.md, DESIGN layering), and only store.py touches lmdb.

Every module of engramdb/** is parsed (top-level and function-level imports alike); an
import of a module of higher rank fails. A new module must be given a rank here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "engramdb"

# Module (dotted, relative to engramdb) or package prefix ending in ".*" -> rank.
RANKS = {
    "errors": 0,
    # byte-bounded LRU for the decoded-data caches (no engramdb imports)
    "cache": 0,
    # the optional C extension (engramdb/_native.c) and its loader
    "_accel": 0, "_native": 0,
    "records": 1, "tokens": 1,
    "codec": 2, "crypto": 2,
    "store": 3,
    "index.*": 4, "index": 4,
    # bulk ingest (add_many, import_many): builds nodes, writes chunks through the facade's
    # record writer, which it is handed (records and store only)
    "bulk": 4,
    # the file header and its key slots (codec, crypto, store's header keys)
    "header": 4,
    # the format features a file was written with (a sealed list in meta; codec, store)
    "format_features": 4,
    "aaak": 5, "importers": 5,
    "compress.*": 6, "compress": 6,
    # one meaning for every filter over memories (scan, recall); dates compare as compress does
    "filters": 6,
    # recall's fusion of its retrievers: the weights (public) and the arithmetic, no I/O
    "fusion": 6,
    # query-side recall features (speaker, ...): read nodes, imported by recall
    "recall_features": 6,
    "recall": 7,
    "maintenance.*": 8, "maintenance": 8,
    # verify's whole-file checks: the records, the archive (maintenance.archive) and the indexes
    "verify": 9,
    # the agent layer works on an Engram through its public API (duck-typed, no import of it)
    "agent.*": 9, "agent": 9,
    # engram's facade and the modules that extend it with whole-store operations
    # (they build on Engram; engram.py reaches them through lazy imports)
    "engram": 10, "backup": 10, "ingest": 10,
    # whole-file services built on the facade: the MCP server and the Dask fleet
    "mcp_server": 11, "fleet": 11,
    "cli": 12, "__main__": 12, "__init__": 12,
}
LMDB_ALLOWED = {"store"}
# `from . import __version__` reads a constant that __init__ defines before it imports any
# submodule; it is the one name of the package root that lower modules may read.
ROOT_CONSTANTS = {"__version__"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()  # a package's __init__ is the package
    return ".".join(parts)


def rank(module: str) -> int | None:
    if module in RANKS:
        return RANKS[module]
    head = module.split(".")[0]
    return RANKS.get(head + ".*")


def package_of(module: str, path: Path) -> list[str]:
    parts = module.split(".") if module != "__init__" else []
    return parts if path.name == "__init__.py" else parts[:-1]


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported engramdb module or external top-level name) for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                if name == "engramdb" or name.startswith("engramdb."):
                    found.append((node.lineno, name[len("engramdb."):] if "." in name else "__init__"))
                else:
                    found.append((node.lineno, "ext:" + name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                name = node.module or ""
                if name == "engramdb" or name.startswith("engramdb."):
                    base = name[len("engramdb."):] if "." in name else ""
                else:
                    found.append((node.lineno, "ext:" + name.split(".")[0]))
                    continue
            else:
                pkg = package_of(module, path)
                pkg = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                base = ".".join(pkg + ([node.module] if node.module else []))
            for alias in node.names:
                # `from . import codec` names a module; `from . import __version__` names the package
                candidate = f"{base}.{alias.name}" if base else alias.name
                if not base and alias.name in ROOT_CONSTANTS:
                    continue
                if (rank(candidate) is not None and (PACKAGE / (candidate.replace(".", "/") + ".py")).exists()) \
                        or (PACKAGE / candidate.replace(".", "/") / "__init__.py").exists():
                    found.append((node.lineno, candidate))
                else:
                    found.append((node.lineno, base or "__init__"))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_rank():
    unranked = [module_name(p) for p in MODULES if rank(module_name(p)) is None]
    assert unranked == [], f"give these modules a rank in tests/test_layering.py: {unranked}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_downward(path):
    module = module_name(path)
    own = rank(module)
    if own is None:
        pytest.fail(f"{module} has no rank")
    upward = []
    for line, target in imports_of(path, module):
        if target.startswith("ext:"):
            if target == "ext:lmdb" and module not in LMDB_ALLOWED:
                upward.append(f"line {line}: imports lmdb (only store.py may)")
            continue
        target_rank = rank(target)
        if target_rank is None:
            upward.append(f"line {line}: imports unranked module {target}")
        elif target_rank > own:
            upward.append(f"line {line}: {module} (rank {own}) imports {target} (rank {target_rank})")
    assert upward == []


def test_the_checker_sees_violations(tmp_path, monkeypatch):
    """The parser must resolve relative imports, or the layering test could never fail."""
    fake = tmp_path / "engramdb"
    (fake / "index").mkdir(parents=True)
    (fake / "store.py").write_text("import lmdb\n")
    (fake / "engram.py").write_text("")
    (fake / "codec.py").write_text("from .store import Store\nfrom . import engram\n")
    (fake / "index" / "bm25.py").write_text("from ..engram import Engram\nfrom . import vectors\n")
    (fake / "index" / "vectors.py").write_text("import lmdb\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert imports_of(fake / "codec.py", "codec") == [(1, "store"), (2, "engram")]
    assert imports_of(fake / "index" / "bm25.py", "index.bm25") == [(1, "engram"), (2, "index.vectors")]
    assert imports_of(fake / "index" / "vectors.py", "index.vectors") == [(1, "ext:lmdb")]
    with pytest.raises(AssertionError):
        test_imports_point_downward(fake / "codec.py")
    with pytest.raises(AssertionError):
        test_imports_point_downward(fake / "index" / "vectors.py")
    test_imports_point_downward(fake / "store.py")
