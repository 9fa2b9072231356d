"""Coverage-guided fuzzing of the filter parser, engramdb.filters (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_filters.py /tmp/filters-new fuzz/corpus/filters -max_total_time=60

The input is UTF-8 text (undecodable bytes replaced), split at the first newline into a
date bound and a ``resolved_date``. The oracle:

* ``parse_time(bound)`` returns a finite float or raises ValidationError, nothing else;
* an accepted bound read back from its own ISO rendering gives the same instant;
* a memory without a resolved date created at the bound is kept by ``after=`` and dropped by
  ``before=``, one created just before it the other way round, whether the bound is given as
  it is or as its timestamp;
* ``Filter(after=bound)`` and ``Filter(before=bound)`` build or raise ValidationError, and
  judge a node carrying the ``resolved_date`` without raising.

``python fuzz/fuzz_filters.py --write-corpus`` (re)writes the seed corpus.
"""
from __future__ import annotations

import datetime
import hashlib
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__" and "--write-corpus" not in sys.argv:
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb.errors import ValidationError
        from engramdb.filters import Filter, parse_time
        from engramdb.records import Node
else:  # imported by tests/test_filters.py to replay the corpus without atheris
    from engramdb.errors import ValidationError
    from engramdb.filters import Filter, parse_time
    from engramdb.records import Node

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "filters")
SEEDS = [
    "2023", "2023-05", "2023-05-01", "2023-05-01T12:00:00", "2023-05-01T12:00:00+02:00", "2023-05-01 12:00",
    "2023-05-01T12:00:00.123456Z", " 2023-05 ", "0001-01-01", "9999-12-31T23:59:59", "1970-01-01",
    "2023-13-01", "2023-02-30", "20230501", "yesterday", "", " ", "-1", "1e309", "nan", "2023-05\n2023-05-01",
    "2023\n2022-12", "2023-05-01\n2023", "2023-05-01\nnot a date", "\n2023-05-01", "2023-05-01T25:00",
    "\u0662\u0660\u0662\u0663", "２０２３-05-01", "2023-W05", "2023-05-01T12:00:00+25:00",
]


def check(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    bound, _, resolved = text.partition("\n")
    try:
        ts = parse_time(bound, "after")
    except ValidationError:
        ts = None
    if ts is not None:
        assert isinstance(ts, float) and math.isfinite(ts), f"parse_time({bound!r}) = {ts!r}"
        try:
            moment = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
        except (OverflowError, OSError, ValueError):
            moment = None
        if moment is not None:
            again = parse_time(moment.isoformat(), "after")
            assert again is not None and abs(again - ts) < 1e-6, f"{bound!r}: {ts} -> {moment} -> {again}"
        # a memory without a resolved date is judged by its creation time: kept from the bound on by
        # after=, before it by before=, as the bound's own timestamp would be
        for created, inside in ((ts, True), (math.nextafter(ts, -math.inf), False)):
            undated = Node(id="n", content="c", created_at=created)
            for given in (bound, ts):
                assert Filter(after=given)(undated) is inside, f"after={given!r} on created_at={created!r}"
                assert Filter(before=given)(undated) is not inside, f"before={given!r} on created_at={created!r}"
    node = Node(id="n", content="c", created_at=0.0, resolved_date=resolved or None)
    for kwargs in ({"after": bound}, {"before": bound}):
        try:
            keep = Filter(**kwargs)
        except ValidationError:
            continue
        assert isinstance(keep(node), bool)


def TestOneInput(data: bytes) -> None:
    try:
        check(data)
    except ValidationError:  # Node refusing a resolved_date the fuzzer made up
        pass


def write_corpus() -> int:
    os.makedirs(CORPUS, exist_ok=True)
    for seed in SEEDS:
        raw = seed.encode("utf-8")
        with open(os.path.join(CORPUS, hashlib.sha1(raw).hexdigest()[:16]), "wb") as fh:
            fh.write(raw)
    return len(SEEDS)


if __name__ == "__main__":
    if "--write-corpus" in sys.argv:
        print(f"wrote {write_corpus()} seeds to {CORPUS}")
    else:
        atheris.Setup(sys.argv, TestOneInput)
        atheris.Fuzz()
