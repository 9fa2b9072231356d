"""Regression tests for AAAK bugs, one per finding, plus a replay of the fuzz seed corpus.

Each test names where the bug was found and what it was. Fuzz findings go here too
(see fuzz/README.md): add the crashing input as a literal and the one-line story.
"""
from __future__ import annotations

import importlib.util
import io
import pathlib

import pytest

from engramdb.aaak import decode, encode, read_dump, write_dump
from engramdb.errors import AAAKParseError
from engramdb.importers import export_jsonl, iter_jsonl
from engramdb.records import CompressResult, Node, Zettel

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus" / "aaak"


def _fuzz_target():
    spec = importlib.util.spec_from_file_location("fuzz_aaak", ROOT / "fuzz" / "fuzz_aaak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fuzz_corpus_replays_without_crashing():
    """Every seed (valid and invalid) goes through the fuzz oracle: no non-Engram exception, stable re-encoding."""
    target = _fuzz_target()
    seeds = sorted(CORPUS.iterdir())
    assert len(seeds) >= 50
    for path in seeds:
        target.TestOneInput(path.read_bytes())


def test_header_title_with_escaped_pipe_is_still_v3():
    """Development, 2026-11-30: a title containing '|' (escaped) shifted the header fields, so the
    v3 document was mis-detected as v1 and every line failed."""
    r = CompressResult(zettels=[Zettel("001")], meta={"title": "Auth|Design", "date": "2026-06-12"})
    assert decode(encode(r), strict=True) == r


def test_export_of_a_timestamp_beyond_datetime_range():
    """Hypothesis, 2026-11-30: created_at=1.8e305 made export_jsonl write ms=inf, which JSON refuses."""
    node = Node("n", created_at=1.797693134862316e305)
    buf = io.StringIO()
    export_jsonl([node], buf)
    assert list(iter_jsonl(buf.getvalue())) == [node]


def test_zettel_id_that_looks_like_a_line_kind():
    """Design check: ids 'E', 'T', 'FILE' and '@x' must not turn a zettel line into another line kind."""
    zettels = [Zettel(i) for i in ("E", "T", "FILE", "@x", "E:", "T:1<->2")]
    r = CompressResult(zettels=zettels)
    assert decode(encode(r), strict=True).zettels == zettels
    buf = io.StringIO()
    nodes = sorted((Node(i) for i in ("E", "T", "FILE", "@n x")), key=lambda n: n.id)
    write_dump(buf, settings={}, spaces=[], nodes=nodes)
    assert [x for x in read_dump(buf.getvalue()) if isinstance(x, Node)] == nodes


@pytest.mark.parametrize("text", [
    "FILE:||||v3|dump\n@meta k|" + "[" * 50_000 + "]" * 50_000 + "\n@end 1 " + "0" * 64 + "\n",
    "FILE:||||v3|dump\n@n x|hot\n@end 1 " + "0" * 64 + "\n",
    "FILE:||||v3|dump\nx:||\"\"|0.0|||\n@n x|hot|0.5|0.0|0.0|" + "9" * 5000 + "|0||\n@c x|\n@end 3 " + "0" * 64 + "\n",
])
def test_hostile_dump_lines_fail_cleanly(text):
    """Deep JSON nesting, extension lines without a node, and 5000-digit integers raise AAAKParseError."""
    with pytest.raises(AAAKParseError):
        list(read_dump(text, allow_edited=True))
