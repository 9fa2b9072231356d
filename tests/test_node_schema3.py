"""Schema-3 node records in files written before them (tests/golden/store-v1.engram holds
schema-1 records): the old records read as they are, a record written again (an update) or
added is schema 3, and the file verifies clean with both kinds side by side."""
from __future__ import annotations


import msgpack

import engramdb
from conftest import golden_copy
from engramdb import codec



def _schemas(db) -> dict[str, int]:
    """Each memory's record schema as stored (before record_fields expands it)."""
    out = {}
    with db._store.read() as txn:
        for _, raw in txn.items("nodes"):
            body = raw[1:] if raw[0] == codec.CODEC_MSGPACK else codec._decompress(raw[1:], "record")
            fields = msgpack.unpackb(body, raw=False)
            out[codec.record_fields(raw)[1]] = fields[0]
    return out


def test_old_records_read_beside_new_ones_and_become_schema_3_when_written(tmp_path):
    path = golden_copy(tmp_path)
    with engramdb.open(path, passphrase="golden-passphrase", readonly=True) as db:
        before = {n.id: n for n in db}
        old = _schemas(db)
    assert set(old.values()) <= {codec.NODE_SCHEMA, codec.NODE_SCHEMA_VECTORS}
    with engramdb.open(path, passphrase="golden-passphrase") as db:  # writable: vectors move to blocks
        assert {n.id: n for n in db} == before
        untouched = sorted(before)[0]
        changed = sorted(before)[-1]
        db.update(changed, tags=["rewritten"])
        db.add("a new memory", id="new-one", now=5.0)
        schemas = _schemas(db)
        assert schemas["new-one"] == schemas[changed] == codec.NODE_SCHEMA_COMPACT
        # the conversion rewrote the records that held vectors (schema 3 now); the others stay
        assert codec.NODE_SCHEMA in set(schemas.values()) and codec.NODE_SCHEMA_COMPACT in set(schemas.values())
        assert schemas[untouched] == old[untouched] or old[untouched] == codec.NODE_SCHEMA_VECTORS
        assert db.get(untouched) == before[untouched]
        assert db.get(changed) == before[changed].replace(tags=("rewritten",))
        assert db.verify() == []
    with engramdb.open(path, passphrase="golden-passphrase", readonly=True) as db:
        assert db.get("new-one").content == "a new memory"
        assert {n.id: n for n in db if n.id not in ("new-one", changed)} == \
            {k: v for k, v in before.items() if k != changed}
