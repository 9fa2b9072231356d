"""Coverage-guided fuzzing of the AAAK parsers (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_aaak.py /tmp/aaak-new fuzz/corpus/aaak -max_total_time=60

The first byte of an input picks the target, the rest is the document:

    0  decode(text)               lenient: only AAAKParseError may escape
    1  decode(text, strict=True)
    2  read_dump(bytes, allow_edited=True)   grammar only (the fuzzer cannot forge SHA-256)
    3  read_dump(bytes)                      full checks

Oracle: anything other than an EngramError is a crash; and whatever a parser accepts
must survive a second trip byte for byte (encode/decode, write_dump/read_dump), and be
written as AAAK v2 and read back (lenient) without a crash.
"""
from __future__ import annotations

import io
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb import aaak
        from engramdb.errors import EngramError
        from engramdb.records import Edge, Node
else:  # imported by tests/test_aaak_regressions.py to replay the corpus without atheris
    from engramdb import aaak
    from engramdb.errors import EngramError
    from engramdb.records import Edge, Node


def _rewrite(items: list) -> str:
    header = items[0]
    out = io.StringIO()
    aaak.write_dump(
        out, settings=header.settings, meta=header.meta, spaces=header.spaces,
        nodes=[x for x in items if isinstance(x, Node)], edges=[x for x in items if isinstance(x, Edge)],
        archive=[tuple(x) for x in items if isinstance(x, aaak.ArchiveRow)],
        procedures=[x.data for x in items if isinstance(x, aaak.ProcedureRow)],
    )
    return out.getvalue()


def check_decode(body: bytes, strict: bool) -> None:
    try:
        result = aaak.decode(body, strict=strict)
    except EngramError:
        return
    text = aaak.encode(result)
    again = aaak.decode(text, strict=True)
    assert aaak.encode(again) == text, "encode(decode(encode(r))) != encode(r)"
    # AAAK v2 (zettel-compress's format) is lossy, but writing it and reading it back must not crash
    try:
        v2 = aaak.encode(result, version=2)
    except EngramError:
        return
    aaak.decode(v2)


def check_dump(body: bytes, allow_edited: bool) -> None:
    try:
        items = list(aaak.read_dump(io.BytesIO(body), allow_edited=allow_edited, max_line_chars=1 << 20))
    except EngramError:
        return
    text = _rewrite(items)
    again = list(aaak.read_dump(text))
    assert _rewrite(again) == text, "write(read(write(x))) != write(x)"
    if not allow_edited:
        assert text.encode("utf-8") == body, "an accepted dump must be canonical"


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 4, data[1:]
    if mode < 2:
        check_decode(body, strict=mode == 1)
    else:
        check_dump(body, allow_edited=mode == 2)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
