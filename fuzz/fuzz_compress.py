"""Coverage-guided fuzzing of compress's default method (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_compress.py /tmp/compress-new fuzz/corpus/compress -max_total_time=60

``engramdb.compress.zc`` parses free text with many regular expressions (JavaScript
whitespace, dates and relative expressions, sentences, speaker labels, topics) and counts
chunk lengths in UTF-16 units. The first byte picks the options (``byte % 8``: chunk size
800, 120 or 40 with their overlaps; fixes on or off; a ``date`` option or none); the rest,
decoded as UTF-8 (``replace`` for invalid bytes), is the text.

Oracle: the only exception is an ``EngramError``; every zettel's offsets index its chunk
in ``meta["source"]`` (non-empty, trimmed of JavaScript whitespace, in document order: starts
never go back, ends always move on);
every resolved date is ``YYYY``, ``YYYY-MM`` or ``YYYY-MM-DD``; flags and emotions are
known values in canonical order; weights are in [0, 1]; tunnels join existing zettels,
earlier first; a second run gives the same ``result_to_json``.
"""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb.compress import ALL_EMOTIONS, ALL_FLAGS, compress, result_to_json, zc
        from engramdb.errors import EngramError
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb.compress import ALL_EMOTIONS, ALL_FLAGS, compress, result_to_json, zc
    from engramdb.errors import EngramError

SIZES = ((800, 100), (120, 30), (40, 0), (800, 100))
_DATE = re.compile(r"\d{4}(-\d{2}(-\d{2})?)?")


def options_of(mode: int) -> dict:
    size, overlap = SIZES[mode % 4]
    options: dict = {"chunk_size": size, "chunk_overlap": overlap}
    if mode & 4:
        options["fixes"] = ()
    if mode % 4 == 3:
        options["date"] = "1:56 pm on 8 May, 2023"
    return options


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    options = options_of(data[0])
    text = data[1:].decode("utf-8", "replace")
    try:
        result = compress(text, **options)
    except EngramError:
        return
    source = result.meta["source"]
    assert source == zc.normalize_text(text)
    ids = [z.id for z in result.zettels]
    last_start = last_end = -1
    for z in result.zettels:
        assert 0 <= z.source_start < z.source_end <= len(source), (z.id, z.source_start, z.source_end)
        chunk = source[z.source_start:z.source_end]
        assert chunk and chunk == zc.js_trim(chunk), (z.id, chunk)
        # a chunk no longer than the overlap is repeated whole by the next one (zettel-compress's
        # overlap clamps at the previous start), so starts may repeat; ends always move on
        assert z.source_start >= last_start and z.source_end > last_end, "chunks out of order"
        last_start, last_end = z.source_start, z.source_end
        assert z.resolved_date is None or _DATE.fullmatch(z.resolved_date), z.resolved_date
        assert z.flags == [f for f in ALL_FLAGS if f in z.flags]
        assert z.emotions == [e for e in ALL_EMOTIONS if e in z.emotions]
        assert 0.0 <= z.weight <= 1.0
        assert all(e in result.entity_index.name_to_code for e in z.entities)
    for t in result.tunnels:
        assert t.from_id in ids and t.to_id in ids and ids.index(t.from_id) < ids.index(t.to_id)
    assert result_to_json(compress(text, **options)) == result_to_json(result), "not deterministic"


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
