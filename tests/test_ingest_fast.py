"""The fast bulk-ingest paths give exactly what the plain paths give: vectorised token
numbering (every word length, hash collisions), per-field node checks (the same node, the
same first error), and the batch write path's records."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engramdb.errors import ValidationError
from engramdb.index import tokenize as tk
from engramdb.index.tokenize import Tokenizer
from engramdb.records import NODE_FIELDS, Node

# Words around the 8- and 16-byte key boundaries, multi-byte characters across them, and
# words longer than any key.
EDGE_WORDS = ["ab", "abcdefg", "abcdefgh", "abcdefghi", "abcdefghijklmnop", "abcdefghijklmnopq",
              "abcdefghijklmnopqrstuvwxyz0123456789", "ééééé", "aaaaaaaé", "aaaaaaaaaaaaaaaé", "東京東京東京",
              "x" * 40, "under_score_words", "HELLOWORLD", "helloworld", "a", "the", "Ⅻ", "ﬁle", "\x00", "ab\x00cd"]
words = st.sampled_from(EDGE_WORDS) | st.text(max_size=20)
texts = st.lists(words, max_size=12).map(" ".join)


def _check_equal(tok: Tokenizer, batch: list[str]) -> None:
    terms, term_ids, lengths = tok.encode_many(batch)
    want = [tok(text) for text in batch]
    assert terms == sorted({t for doc in want for t in doc})
    assert lengths.tolist() == [len(doc) for doc in want]
    assert [terms[i] for i in term_ids.tolist()] == [t for doc in want for t in doc]


@settings(max_examples=100, deadline=None)
@given(st.lists(texts, max_size=6), st.booleans())
def test_encode_many_equals_tokenizing_each_text_at_key_boundaries(batch, stem):
    _check_equal(Tokenizer(stemmer="english" if stem else None), batch)


@settings(max_examples=30, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6))
def test_a_hash_collision_falls_back_to_exact_numbering(monkeypatch_batch):
    # every pair hashes alike: the grouping must notice and number the words exactly
    saved = tk._MIX_LOW
    tk._MIX_LOW = np.uint64(0)
    try:
        _check_equal(Tokenizer(stemmer=None), monkeypatch_batch)
    finally:
        tk._MIX_LOW = saved


@pytest.mark.parametrize("mix", [None, np.uint64(0)])  # 0: every pair hashes alike, the exact fallback
def test_group_pairs_groups_exactly_equal_pairs(mix):
    rng = np.random.default_rng(5)
    low = rng.integers(0, 50, size=2000).astype(np.uint64)
    high = rng.integers(0, 3, size=2000).astype(np.uint64)
    saved = tk._MIX_LOW
    tk._MIX_LOW = saved if mix is None else mix
    try:
        keys, pos, counts = tk._group_pairs(low, high)
    finally:
        tk._MIX_LOW = saved
    pairs = [int(a) | int(b) << 64 for a, b in zip(low.tolist(), high.tolist())]
    assert sorted(keys) == sorted(set(pairs)) and len(keys) == len(set(keys))
    assert sorted(pos.tolist()) == list(range(2000)) and counts.sum() == 2000 and counts.min() >= 1
    group = np.repeat(np.arange(len(keys)), counts)
    assert all(keys[g] == pairs[p] for p, g in zip(pos.tolist(), group.tolist()))
    assert tk._group_pairs(low[:0], high[:0])[0] == []


def test_stop_table_matches_exactly_the_stopwords():
    table, mult, shift = tk._stop_table(frozenset(tk.LUCENE_EN_STOPWORDS))
    words = sorted(set(tk.LUCENE_EN_STOPWORDS) | {"th", "thee", "there_", "andx", "ab", "zz", "tho", "wit", "their"})
    keys = np.array([int.from_bytes(w.encode(), "little") for w in words], dtype=np.uint64)
    hits = (table[(keys * mult) >> shift] == keys).tolist()
    assert hits == [w in tk.LUCENE_EN_STOPWORDS and len(w) >= 2 for w in words]
    assert tk._stop_table(frozenset()) is None and tk._stop_table(frozenset({"a", "naïve"})) is None


def test_encode_many_across_chunks_and_empty_texts():
    tok = Tokenizer(stemmer=None)
    batch = ["", "alpha beta", "", "gamma " * 50, "x", "delta_epsilon_zeta_eta_theta"] * 7
    saved, tk._CHUNK_DOCS = tk._CHUNK_DOCS, 4
    try:
        _check_equal(tok, batch)
    finally:
        tk._CHUNK_DOCS = saved


# --- node checks -------------------------------------------------------------------------

GOOD = {"id": ["a", "x" * 300], "content": ["", "hello"], "entities": [(), ["e"]], "topics": [(), ("t", "u")],
        "quote": ["", "q"], "weight": [0.0, 1, 2.5], "flags": [(), ["CORE"]], "emotions": [(), ["joy"]],
        "source_start": [None, 3], "source_end": [None, 0], "resolved_date": [None, "2020-01-01"],
        "tier": ["hot", "cold"], "importance": [0.5, 1, 0.0], "created_at": [0.0, 5], "last_accessed": [0.0, 3.5],
        "access_count": [0, 7], "pinned": [False, True], "tags": [(), ["x"]], "source": ["", "s"],
        "metadata": [{}, {"a": 1}, {"b": [1, (2,)]}], "embeddings": [{}, {"s": [1.0, 2.0]}]}
BAD = {"id": ["", 3, None, "x" * 2000], "content": [3, None], "entities": ["str", [1]], "topics": ["s", [None]],
       "quote": [1], "weight": [math.inf, "1", True, 10**400, math.nan], "flags": ["CORE", ["NOPE"]],
       "emotions": [["meh"]], "source_start": [-1, 1.5, True], "source_end": ["3"], "resolved_date": [5],
       "tier": ["x", None], "importance": [2.0, -0.1, math.nan, "a"], "created_at": [math.inf, None],
       "last_accessed": ["x"], "access_count": [-1, True, 1.0], "pinned": [0, None], "tags": ["t", [3]],
       "source": [None], "metadata": [[], {1: 2}, {"a": math.inf}], "embeddings": [[], {"": [1.0]}, {"s": [math.nan]}]}


@st.composite
def field_dicts(draw) -> dict:
    """Some fields in any order, the id among them (the constructor needs it), each valid or not."""
    names = draw(st.lists(st.sampled_from(NODE_FIELDS), unique=True, max_size=8))
    if "id" not in names:
        names.insert(draw(st.integers(0, len(names))), "id")
    return {name: draw(st.sampled_from(BAD[name] if draw(st.integers(0, 2)) == 0 else GOOD[name]))
            for name in names}


def _outcome(build, data):
    try:
        return build(data)
    except ValidationError as exc:
        return (type(exc), exc.message)


@settings(max_examples=100, deadline=None)
@given(field_dicts())
def test_from_fields_gives_the_constructors_node_or_first_error(data):
    want = _outcome(lambda d: Node(**d), data)
    got = _outcome(Node.from_fields, data)
    assert got == want
    if isinstance(got, Node):
        assert list(vars(got)) == list(NODE_FIELDS)


def test_the_constructor_checks_every_given_value():
    # fields left at their default objects skip their checks; given values never do
    for bad in ({"id": None}, {"id": ""}, {"id": "a", "metadata": None}, {"id": "a", "embeddings": []},
                {"id": "a", "tier": None}, {"id": "a", "importance": 0.5 + 1}):
        with pytest.raises(ValidationError):
            Node(**bad)
    assert Node(id="a", tier="".join(["h", "ot"]), importance=float("0.5")) == Node(id="a")


def test_several_bad_fields_report_the_constructors_first():
    # checks run in the order of the data, then again in the constructor's order on a failure
    data = {"created_at": "x", "importance": 2.0, "id": "a"}
    with pytest.raises(ValidationError, match="created_at must be a number"):
        Node.from_fields(data)
    with pytest.raises(ValidationError, match="created_at must be a number"):
        Node(**data)
    with pytest.raises(ValidationError, match="quote must be a string"):
        Node.from_fields({"id": "a", "content": "x" * (16 * 1024 * 1024 + 1), "quote": 3})


# --- the batch write path ----------------------------------------------------------------

def test_add_many_names_the_first_duplicate_in_a_new_and_a_filled_file(make_db):
    from conftest import NOW

    from engramdb.errors import DuplicateIdError

    db = make_db("dups.engram")
    batch = [{"id": "a", "content": "x"}, {"id": "b", "content": "y"}, {"id": "b", "content": "z"},
             {"id": "a", "content": "w"}]
    with pytest.raises(DuplicateIdError, match="'b' repeats within one add_many") as err:  # the first repeat
        db.add_many(batch, now=NOW)
    assert "update" not in err.value.hint  # nothing is stored: updating is no way out
    db.add_many([{"id": "c", "content": "stored"}, {"id": "d", "content": "stored"}], now=NOW)
    with pytest.raises(DuplicateIdError, match="'d' exists"):  # stored before the repeat within the batch
        db.add_many([{"id": "e", "content": "x"}, {"id": "d", "content": "x"}, {"id": "e", "content": "x"}], now=NOW)
    with pytest.raises(DuplicateIdError, match="'c'"):
        db.add_many([{"id": "f", "content": "x"}, {"id": "c", "content": "x"}], now=NOW)
    assert db.ids() == ["c", "d"]
    ids = db.add_many([{"id": f"g{i}", "content": f"note {i}"} for i in range(30)], now=NOW)
    assert db.ids() == ["c", "d", *ids] and db.get("g29").content == "note 29"
    assert len(db.recall("note", top_k=40)) == 30 and db.verify() == []


def test_encode_nodes_equals_encode_node():
    from engramdb import codec

    nodes = [Node(id="a"), Node(id="b", content="x" * 5000, embeddings={"s": [1.0, 2.0]}, metadata={"k": [1, 2]})]
    assert codec.encode_nodes(nodes) == [codec.encode_node(n) for n in nodes]
    fetch = lambda names: {"s": nodes[1].embeddings["s"]}  # noqa: E731  (the vector blocks' part)
    assert [codec.decode_node(r, fetch=fetch) for r in codec.encode_nodes(nodes)] == nodes
    assert codec.encode_nodes([]) == []


COLUMN_FIELDS = ["content", "quote", "source", "weight", "importance", "created_at", "last_accessed"]


@st.composite
def batches(draw) -> list:
    """Rows that mostly share one key set (sometimes not, sometimes a non-column field),
    with mostly valid values of exact types, and now and then a subclass, int or bad value."""
    names = ["id", *draw(st.lists(st.sampled_from(COLUMN_FIELDS + ["tags"]), unique=True, max_size=5))]
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        row_names = names if draw(st.integers(0, 5)) else names[:-1] or names
        row = {}
        for name in row_names:
            kind = draw(st.integers(0, 9))
            if kind == 0:
                row[name] = draw(st.sampled_from(BAD[name]))
            elif kind == 1 and name in ("id", "content", "quote", "source"):
                row[name] = type("S", (str,), {})("sub")  # a str subclass: checked row by row
            else:
                row[name] = draw(st.sampled_from(GOOD[name]))
        rows.append(row)
    return rows


@settings(max_examples=100, deadline=None)
@given(batches())
def test_from_fields_many_equals_from_fields_row_by_row(rows):
    want = _outcome(lambda rs: [Node.from_fields(r) for r in rs], rows)
    got = _outcome(Node.from_fields_many, rows)
    assert got == want
    if isinstance(got, list):
        assert [list(vars(n)) for n in got] == [list(NODE_FIELDS)] * len(rows)
        assert [tuple(map(type, vars(n).values())) for n in got] == [tuple(map(type, vars(n).values())) for n in want]


def test_from_fields_many_column_limits():
    ok = [{"id": "a", "content": "x", "importance": 1.0, "created_at": 0.0}, {"id": "b", "content": "", "importance": 0.0,
                                                                             "created_at": -5.0}]
    assert Node.from_fields_many(ok) == [Node(**row) for row in ok]
    for bad, message in (({"importance": 1.5}, "importance must be between"), ({"created_at": math.nan}, "finite"),
                         ({"id": ""}, "id must be"), ({"id": "東" * 400}, "longer than"), ({"content": 3}, "content must")):
        with pytest.raises(ValidationError, match=message):
            Node.from_fields_many([ok[0], {**ok[1], **bad}])
    assert Node.from_fields_many([]) == []
    long_ok = {**ok[1], "id": "é" * 300}  # 600 bytes: the column check defers to the row check, which passes
    assert Node.from_fields_many([ok[0], long_ok]) == [Node(**ok[0]), Node(**long_ok)]


# --- building a batch's nodes (engramdb/bulk.py) --------------------------------------------

@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from(["given", "some", "none"]), st.integers(0, 4))
def test_build_many_equals_build_row_by_row(rows, stamps, node_at):
    """Every path of bulk.build_many (plain_many's columns, from_fields_many with the
    timestamps added, row by row) gives build's nodes and first error."""
    from engramdb import bulk

    for i, row in enumerate(rows):
        if stamps == "given" or (stamps == "some" and i % 2):
            row.setdefault("created_at", 1.0)
            row.setdefault("last_accessed", 2.0)
    if node_at < len(rows):
        rows[node_at] = Node(id="a node")
    want = _outcome(lambda rs: [bulk.build(r, {}, 9.0) for r in rs], rows)
    assert _outcome(lambda rs: bulk.build_many(rs, 9.0), rows) == want
    assert _outcome(lambda rs: bulk.build_many(iter(rs), 9.0), rows) == want


def test_build_many_asks_plain_many_once(monkeypatch):
    """A bulk load's records that plain_many declines (here an int weight, which its exact
    column check leaves to the row check) are built row by row, without asking it again
    (review finding: the from_fields_many fallback re-ran plain_many on the same rows)."""
    from engramdb import bulk

    calls = []
    plain = Node.plain_many.__func__  # type: ignore[attr-defined]

    def counting(cls, rows):
        calls.append(len(rows))
        return plain(cls, rows)

    monkeypatch.setattr(Node, "plain_many", classmethod(counting))
    rows = [{"id": f"r{i}", "content": "x", "weight": 1.5 if i else 1, "created_at": 1.0, "last_accessed": 1.0}
            for i in range(3)]
    assert bulk.build_many(rows, None) == [Node(**row) for row in rows]
    assert calls == [3]
    calls.clear()
    rows[0]["weight"] = 1.0  # now every column passes: plain_many's nodes
    assert bulk.build_many(rows, None) == [Node(**row) for row in rows] and calls == [3]


def test_the_pure_column_checks_take_the_native_limits():
    """records._COLUMN_CHECKS are made from _NATIVE_COLUMNS (one table of limits for both
    paths): each kind's boundaries on the pure path."""
    from engramdb import records

    checks = records._COLUMN_CHECKS
    limit = records.MAX_ID_BYTES // 4
    assert checks.keys() == records._NATIVE_COLUMNS.keys()
    assert checks["id"](["x" * limit]) and not checks["id"](["x" * (limit + 1)]) and not checks["id"](["a", ""])
    assert checks["content"](["", "x"]) and not checks["content"](["x" * (records.MAX_CONTENT_BYTES + 1)])
    assert checks["quote"](["", "x" * 10_000]) and not checks["quote"]([1]) and not checks["quote"](["a", b"b"])
    assert checks["importance"]([0.0, 1.0]) and not checks["importance"]([1.5]) and not checks["importance"]([1])
    assert checks["weight"]([-5.0, 2.5]) and not checks["weight"]([math.inf]) and not checks["weight"]([True])


def test_ingest_chunk_is_importable_from_the_facade():
    import engramdb.engram
    from engramdb import bulk

    assert engramdb.engram.INGEST_CHUNK is bulk.INGEST_CHUNK == 32_768


def test_the_content_limit_says_what_it_counts():
    # regression: the limit counts characters (code points) but the message said bytes
    from engramdb import records

    with pytest.raises(ValidationError, match=r"longer than \d+ characters"):
        Node(id="a", content="x" * (records.MAX_CONTENT_BYTES + 1))
    Node(id="b", content="\U0001F600" * 1000)  # 4 UTF-8 bytes each: within the limit all the same
