"""Whole-store dump and restore: lossless, canonical, deterministic, and safe on bad input."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engramdb
from engramdb import AAAKParseError, EngramError, ValidationError
from engramdb.backup import TEMP_SUFFIX
from engramdb.engram import Transaction
from engramdb.index.graph import MAX_WEIGHT

from conftest import PASSPHRASE, TEST_KDF

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60) | st.sampled_from(
    ["", "|", '"', "\\", "\n", "a|b\\c\"d\r\ne", "ünïcödé ✓ 記憶", "x" * 5000])
finite = st.floats(allow_nan=False, allow_infinity=False)
metadata = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | finite | text | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8)


@st.composite
def stores(draw):
    ids = draw(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
                        unique=True, max_size=6))
    nodes = []
    for id_ in ids:
        nodes.append(dict(
            id=id_, content=draw(text), tags=draw(st.lists(text.filter(str.strip), max_size=3)), quote=draw(text),
            weight=draw(finite), importance=draw(st.floats(0, 1)), created_at=draw(finite), last_accessed=draw(finite),
            access_count=draw(st.integers(0, 2**40)), pinned=draw(st.booleans()),
            tier=draw(st.sampled_from(engramdb.TIERS)), source=draw(text),
            flags=draw(st.lists(st.sampled_from(engramdb.ALL_FLAGS), unique=True, max_size=2)),
            emotions=draw(st.lists(st.sampled_from(engramdb.ALL_EMOTIONS), unique=True, max_size=2)),
            entities=draw(st.lists(text, max_size=2)), topics=draw(st.lists(text, max_size=2)),
            metadata=draw(st.dictionaries(text, metadata, max_size=3)),
            embeddings=draw(st.one_of(st.just({}), st.builds(lambda v: {"vec": v},
                                                             st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                                                                      min_size=3, max_size=3)))),
        ))
    archive = {id_: draw(text) for id_ in ids if draw(st.booleans())}
    procedures = draw(st.lists(st.dictionaries(st.sampled_from(["step", "after", "tool"]), text, min_size=1,
                                               max_size=3), max_size=3))
    edges = []
    if len(ids) >= 2:
        for _ in range(draw(st.integers(0, 3))):
            a, b = draw(st.sampled_from(ids)), draw(st.sampled_from(ids))
            if a != b:
                # link() refuses |weight| > MAX_WEIGHT (d5259fd): the hop could not sum them
                edges.append((a, b, draw(st.sampled_from(["related", "supersedes", "derived_from"])),
                              draw(st.floats(-MAX_WEIGHT, MAX_WEIGHT)), draw(text)))
    return nodes, edges, archive, procedures


def _build(path, nodes, edges, archive=None, procedures=()):
    db = engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF)
    db.add_space("vec", dims=3, model="test-model", normalize=False)
    db.add_many(nodes)
    for a, b, kind, weight, label in edges:
        db.link(a, b, kind, weight=weight, label=label, now=1.0)

    def put_rows(txn):
        tx = Transaction(db, txn)
        for id_, original in (archive or {}).items():
            tx.set_archived(id_, original)
        for data in procedures:
            tx.put_procedure_row(data)

    db._store.write(put_rows)
    return db


def _dump(db) -> str:
    buf = io.StringIO()
    db.dump(buf)
    return buf.getvalue()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stores())
def test_dump_restore_dump_is_identical(tmp_path_factory, store):
    nodes, edges, archive, procedures = store
    d = tmp_path_factory.mktemp("rt")
    with _build(d / "a.engram", nodes, edges, archive, procedures) as db:
        first = _dump(db)
        originals = {n.id: n for n in db}
        assert {i: db.archived(i) for i in originals if db.archived(i) is not None} == archive
        original_edges = {n: sorted(map(repr, db.edges(n))) for n in originals}
    engramdb.restore(io.StringIO(first), d / "b.engram", passphrase="other", kdf=TEST_KDF)
    with engramdb.open(d / "b.engram", passphrase="other") as db:
        assert {n.id: n for n in db} == originals  # field for field
        assert {n: sorted(map(repr, db.edges(n))) for n in originals} == original_edges
        assert {i: db.archived(i) for i in originals if db.archived(i) is not None} == archive
        assert _dump(db) == first  # byte for byte
        assert db.verify() == []


def _example_dump(tmp_path) -> str:
    nodes = [{"id": f"m{i}", "content": f"memory {i} about Berlin | \"quoted\"", "created_at": float(i),
              "tags": ["t"]} for i in range(8)]
    with _build(tmp_path / "ex.engram", nodes, [("m1", "m2", "related", 0.5, "x")]) as db:
        return _dump(db)


def test_every_corruption_is_refused_and_nothing_is_written(tmp_path):
    good = _example_dump(tmp_path)
    lines = good.splitlines(keepends=True)
    bad = [good[:i] for i in range(0, len(good), max(1, len(good) // 60))]
    bad += [good[:i] + chr(ord(good[i]) ^ 1) + good[i + 1:] for i in range(0, len(good), max(1, len(good) // 60))]
    for i in range(1, len(lines) - 1):
        bad.append("".join(lines[:i] + lines[i + 1:]))  # deleted line
        bad.append("".join(lines[:i] + [lines[i]] + lines[i:]))  # duplicated line
        bad.append("".join(lines[:i] + [lines[i + 1], lines[i]] + lines[i + 2:]))  # swapped pair
    target = tmp_path / "target.engram"
    for n, text in enumerate(bad):
        if text == good:
            continue
        with pytest.raises(EngramError):
            engramdb.restore(io.StringIO(text), target, passphrase=PASSPHRASE, kdf=TEST_KDF)
        assert not target.exists(), f"case {n} left a file"
        assert not os.path.exists(str(target) + TEMP_SUFFIX)


def test_restore_never_overwrites_without_force(tmp_path):
    good = _example_dump(tmp_path)
    target = tmp_path / "existing.engram"
    with engramdb.open(target, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("precious", id="p")
    before = target.read_bytes()
    with pytest.raises(ValidationError):
        engramdb.restore(io.StringIO(good), target, passphrase=PASSPHRASE, kdf=TEST_KDF)
    assert target.read_bytes() == before
    with pytest.raises(AAAKParseError):  # a bad dump with force still leaves the old file
        engramdb.restore(io.StringIO(good[:-5]), target, force=True, passphrase=PASSPHRASE, kdf=TEST_KDF)
    assert target.read_bytes() == before
    engramdb.restore(io.StringIO(good), target, force=True, passphrase=PASSPHRASE, kdf=TEST_KDF)
    with engramdb.open(target, passphrase=PASSPHRASE) as db:
        assert "p" not in db and len(db) == 8


def test_restore_refuses_to_replace_a_file_open_elsewhere(tmp_path):
    good = _example_dump(tmp_path)
    target = tmp_path / "busy.engram"
    engramdb.open(target, passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"
        import engramdb
        db = engramdb.open({str(target)!r}, passphrase={PASSPHRASE!r})
        print("open", flush=True)
        sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(engramdb.AlreadyOpenError):
            engramdb.restore(io.StringIO(good), target, force=True, passphrase=PASSPHRASE, kdf=TEST_KDF)
    finally:
        holder.communicate("\n", timeout=30)
    with engramdb.open(target, passphrase=PASSPHRASE) as db:
        assert len(db) == 0


def test_leftover_temp_file_is_cleaned_on_next_run(tmp_path):
    good = _example_dump(tmp_path)
    target = tmp_path / "t.engram"
    leftover = str(target) + TEMP_SUFFIX
    with open(leftover, "wb") as fh:
        fh.write(b"half-written restore from a crash")
    engramdb.restore(io.StringIO(good), target, passphrase=PASSPHRASE, kdf=TEST_KDF)
    assert not os.path.exists(leftover) and target.exists()


DETERMINISM_SCRIPT = textwrap.dedent("""
    import io, os, sys
    os.environ["ENGRAM_TEST_WEAK_KDF"] = "1"
    import engramdb
    db = engramdb.open(sys.argv[1], passphrase="p", kdf=engramdb.KDFParams.for_tests())
    db.add_space("vec", dims=2, model="m", normalize=False)
    db.add_many([{"id": f"n{i}", "content": f"memory {i}", "tags": ["b", "a"], "metadata": {"z": 1, "a": [i, 0.1]},
                  "embeddings": {"vec": [i, 0.5]}} for i in range(30)], now=123.0)
    db.link("n1", "n2", "related", now=5.0)
    out = io.StringIO(); db.dump(out); sys.stdout.write(out.getvalue())
""")


def test_dumps_of_the_same_operations_are_identical_across_processes(tmp_path):
    outputs = []
    for n, seed in enumerate(("1", "2")):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT, str(tmp_path / f"d{n}.engram")],
                                env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") > 60


def test_delete_removes_the_archived_original(make_db):
    db = make_db()
    db.add("preview", id="a")
    with db._store.transaction() as txn:
        Transaction(db, txn).set_archived("a", "the full original text")
    assert db.archived("a") == "the full original text"
    db.delete("a")
    assert db.archived("a") is None
    with db._store.read() as txn:
        assert txn.count("archive") == 0


def test_salvage_dump_skips_a_damaged_record_and_restores_the_rest(tmp_path):
    """A flipped byte in one record used to make dump (and so every way out) fail for the whole store."""
    import lmdb

    path = tmp_path / "damaged.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"m{i}", "content": f"memory number {i}"} for i in range(5)])
        db.link("m1", "m2", "related", now=1.0)
        db.link("m2", "m3", "related", now=1.0)
        with db.transaction() as tx:
            tx.set_archived("m2", "the original of m2")
    env = lmdb.open(str(path), subdir=False, max_dbs=32, readonly=True)
    nodes = env.open_db(b"t1", create=False)
    with env.begin(db=nodes) as txn:
        value = txn.get((3).to_bytes(8, "big"))  # m2's docno
    env.close()
    data = bytearray(path.read_bytes())  # damaged in place, as a bad disk block would be
    at = data.index(value) + len(value) - 1
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with engramdb.open(path, passphrase=PASSPHRASE) as db:
        with pytest.raises(engramdb.DecryptionError):
            db.dump(io.StringIO())
        damaged: list[str] = []
        buf = io.StringIO()
        db.dump(buf, on_damaged=damaged.append)
    assert len(damaged) == 1 and "memory #3" in damaged[0]
    engramdb.restore(io.StringIO(buf.getvalue()), tmp_path / "salvaged.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    with engramdb.open(tmp_path / "salvaged.engram", passphrase=PASSPHRASE) as db:
        assert db.ids() == ["m0", "m1", "m3", "m4"] and db.edges("m1") == [] and db.verify() == []


def test_salvage_dump_keeps_the_memories_of_a_damaged_vector_block(tmp_path):
    """A flipped byte in a vector block failed the salvage dump as a whole (the nodes were
    read with their vectors outside the salvage), though every memory record was intact."""
    import lmdb

    path = tmp_path / "damaged.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_space("v", dims=4, model="m", normalize=False)
        db.add_many([{"id": f"m{i}", "content": f"memory number {i}", "embeddings": {"v": [1.0, 2.0, 3.0, i]}}
                     for i in range(5)])
        db.link("m1", "m2", "related", now=1.0)
    env = lmdb.open(str(path), subdir=False, max_dbs=32, readonly=True)
    with env.begin(db=env.open_db(b"t5", create=False)) as txn:  # the vectors table
        values = [value for _, value in txn.cursor()]
    env.close()
    data = bytearray(path.read_bytes())
    for value in values:  # every vector value: the directory and the blocks
        at = data.index(value) + len(value) - 1
        data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with engramdb.open(path, passphrase=PASSPHRASE, readonly=True) as db:
        with pytest.raises(engramdb.DecryptionError):
            db.dump(io.StringIO())
        damaged: list[str] = []
        buf = io.StringIO()
        db.dump(buf, on_damaged=damaged.append)
    assert damaged and all("vector" in line for line in damaged)
    engramdb.restore(io.StringIO(buf.getvalue()), tmp_path / "salvaged.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    with engramdb.open(tmp_path / "salvaged.engram", passphrase=PASSPHRASE) as db:
        assert db.ids() == [f"m{i}" for i in range(5)] and db.get("m3").content == "memory number 3"
        assert [e.dst for e in db.edges("m1")] == ["m2"] and db.verify() == []
        assert all(not db.get(f"m{i}").embeddings for i in range(5))


def test_a_damaged_record_points_to_the_salvage_path(tmp_path):
    """With a record that fails authentication, `verify --fix` (and every reading command)
    said "run `engramdb verify FILE` and restore from a backup": verify had just been run,
    and the way out without a backup (dump --skip-damaged, then restore) went unnamed."""
    from click.testing import CliRunner

    from engramdb.cli import cli

    path = tmp_path / "damaged.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"m{i}", "content": f"memory number {i}"} for i in range(5)])
    _damage_value(path, b"t1", 3)  # the nodes table
    run_env = {"ENGRAM_PASSPHRASE": PASSPHRASE, "ENGRAM_TEST_WEAK_KDF": "1", "ENGRAM_PLAINTEXT": None,
               "ENGRAM_KEY_FILE": None}
    for args in (["verify", "--fix", str(path)], ["list", str(path)]):
        result = CliRunner().invoke(cli, args, env=run_env)
        assert result.exit_code == 1 and "dump --skip-damaged" in result.output, result.output
    assert "cannot be rebuilt" in CliRunner().invoke(cli, ["verify", "--fix", str(path)], env=run_env).output


def test_restore_keeps_the_vectors_of_a_normalising_space_bit_for_bit(tmp_path):
    # A space with normalize=True stores unit vectors; restore normalised them again, and
    # float32 normalisation is not idempotent: the vectors moved by an ulp, so the restored
    # store's dump differed from the dump it came from (its trailer too).
    rng = __import__("numpy").random.default_rng(7)
    with engramdb.open(tmp_path / "a.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_space("unit", dims=4, model="m", normalize=True, auto=False)
        db.add_space("wide", dims=96, model="m", normalize=True, auto=False)
        db.add("small", id="s", embeddings={"unit": [1.0, 2.0, 3.0, 4.0]}, now=1.0)
        db.add_many([{"id": f"w{i}", "content": f"memory {i}", "embeddings": {"wide": rng.normal(size=96)}}
                     for i in range(20)], now=2.0)
        first = _dump(db)
        vectors = {n.id: {k: v.tobytes() for k, v in n.embeddings.items()} for n in db}
    engramdb.restore(io.StringIO(first), tmp_path / "b.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    with engramdb.open(tmp_path / "b.engram", passphrase=PASSPHRASE) as db:
        assert {n.id: {k: v.tobytes() for k, v in n.embeddings.items()} for n in db} == vectors
        assert _dump(db) == first
        assert db.verify() == []


def test_salvage_dump_of_a_damaged_archived_original_restores(tmp_path):
    # The damaged original was left out, but its stub still said it had one (truncated:
    # false): the restore's verify refused the salvage dump ("has lost its archive row"),
    # so the documented way out of a damaged file did not restore at all.

    path = tmp_path / "damaged.engram"
    with engramdb.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": f"m{i}", "content": f"memory number {i} " * 30} for i in range(4)], now=1.0)
        db.archive("m1", now=2.0)
        db.archive("m2", now=2.0)
        kept = db.get("m2", full=True)
    _damage_value(path, b"t7", 2)  # the archive table; m1 is docno 2
    with engramdb.open(path, passphrase=PASSPHRASE) as db:
        damaged: list[str] = []
        buf = io.StringIO()
        db.dump(buf, on_damaged=damaged.append)
    assert len(damaged) == 1 and "archived original of memory #2" in damaged[0]
    engramdb.restore(io.StringIO(buf.getvalue()), tmp_path / "salvaged.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    with engramdb.open(tmp_path / "salvaged.engram", passphrase=PASSPHRASE) as db:
        assert db.ids() == ["m0", "m1", "m2", "m3"] and db.verify() == []
        assert db.get("m1").archived and db.get("m1").metadata["engramdb.archive"]["truncated"] is True
        assert db.get("m2", full=True) == kept  # an intact original stays whole


def _damage_value(path, table: bytes, docno: int) -> None:
    """Flip the last byte of every copy of ``docno``'s value in ``table`` (a freed page
    may hold an older copy), as a bad sector would."""
    import lmdb

    env = lmdb.open(str(path), subdir=False, max_dbs=32, readonly=True)
    with env.begin(db=env.open_db(table, create=False)) as txn:
        value = bytes(txn.get(docno.to_bytes(8, "big")))
    env.close()
    data = bytearray(path.read_bytes())
    at = data.find(value)
    while at >= 0:
        data[at + len(value) - 1] ^= 0x01
        at = data.find(value, at + 1)
    path.write_bytes(bytes(data))
