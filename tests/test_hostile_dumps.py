"""Issue 16, finding 8: a dump's cost is bounded by what it could honestly need.

A 10.7 KB dump declaring 20 automatic spaces of 65,536 dims made a 524.5 MB store; one
declaring 4,096 spaces took 268 s to restore. These are the same dumps, small: they are
refused while the @space lines are read, before the new store file exists.
"""

from __future__ import annotations

import io
import os

import pytest

from engramdb import aaak
from engramdb.aaak import MAX_AUTO_DIMS, MAX_DUMP_SPACES, write_dump
from engramdb.backup import restore
from engramdb.errors import AAAKParseError, ValidationError
from engramdb import Node

HASHED = "engramdb/hashed-tfidf-v1"


def _space(name: str, dims: int, auto: bool) -> dict:
    return {"name": name, "model": HASHED if auto else "m", "dims": dims, "dtype": "float32",
            "normalized": True, "auto": auto}


def _dump_with(space_lines: list[str]) -> str:
    """A valid dump with one small space, its @space line replaced by ``space_lines``."""
    buf = io.StringIO()
    write_dump(buf, settings={}, spaces=[_space("a", 4, True)],
               nodes=[Node(id=f"n{i:03d}", content=f"memory {i}") for i in range(20)])
    lines = buf.getvalue().split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("@space "))
    return "\n".join(lines[:at] + space_lines + lines[at + 1:])


def _space_line(name: str, dims: int, auto: bool) -> str:
    return aaak._space_line(_space(name, dims, auto))


def _restore_refused(text: str, tmp_path) -> AAAKParseError:
    path = tmp_path / "r.engram"
    with pytest.raises(AAAKParseError) as info:
        restore(text, str(path), allow_edited=True, encrypted=False)
    assert not os.path.exists(path)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("r.engram")]  # nothing was allocated
    assert "Limits on hostile input" in info.value.hint
    return info.value


def test_the_unmodified_dump_restores(tmp_path):
    assert restore(_dump_with([_space_line("a", 4, True)]), str(tmp_path / "ok.engram"),
                   allow_edited=True, encrypted=False) == 20


def test_huge_automatic_spaces_are_refused_before_the_store_is_made(tmp_path):
    # the reproduction had 20 x 65,536 automatic dims; two of 9,000 already pass the cap
    text = _dump_with([_space_line(f"s{i:02d}", 9_000, True) for i in range(20)])
    assert len(text) < 10_000
    err = _restore_refused(text, tmp_path)
    assert f"more than {MAX_AUTO_DIMS} dims" in err.message
    assert err.line > 0


def test_too_many_spaces_are_refused(tmp_path):
    text = _dump_with([_space_line(f"s{i:04d}", 1, False) for i in range(MAX_DUMP_SPACES + 1)])
    err = _restore_refused(text, tmp_path)
    assert f"more than {MAX_DUMP_SPACES} embedding spaces" in err.message


def test_dims_beyond_the_store_limit_are_refused(tmp_path):
    err = _restore_refused(_dump_with([_space_line("big", 10**9, False)]), tmp_path)
    assert "dims must be in 1..65536" in err.message


def test_spaces_at_the_limits_are_accepted():
    text = _dump_with([_space_line("auto", MAX_AUTO_DIMS, True)]
                      + [_space_line(f"s{i:03d}", 8, False) for i in range(MAX_DUMP_SPACES - 1)])
    header = next(aaak.read_dump(text, allow_edited=True))
    assert len(header.spaces) == MAX_DUMP_SPACES


def test_write_dump_refuses_what_restore_would():
    with pytest.raises(ValidationError, match="could not be restored"):
        write_dump(io.StringIO(), settings={}, nodes=[],
                   spaces=[_space(f"s{i:03d}", 1, False) for i in range(MAX_DUMP_SPACES + 1)])
    with pytest.raises(ValidationError, match="could not be restored"):
        write_dump(io.StringIO(), settings={}, nodes=[],
                   spaces=[_space("a", MAX_AUTO_DIMS, True), _space("b", 1, True)])
