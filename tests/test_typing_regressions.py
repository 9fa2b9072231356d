"""Bugs that `mypy --strict` found (issue 12, typing): each keeps its fix."""
from __future__ import annotations


def test_bm25_ceiling_of_an_empty_index_is_the_float_zero(make_db):
    # SegmentedBM25.ceiling is declared `-> float` and documented "0.0 on an empty index", but summed an
    # empty dict and returned the int 0
    db = make_db()
    with db._store.read() as txn:
        ceiling = db.indexes.bm25.ceiling(txn, ["caroline", "guitar"])
    assert type(ceiling) is float and ceiling == 0.0


def test_maintain_works_when_the_vector_matrix_is_over_the_cache_limit(make_db):
    # VectorIndex._matrix returns None when a space's matrix is larger than the vector cache
    # (open(cache_mb=)); the maintenance pass unpacked its result as a (docnos, matrix) pair
    # and failed with a raw TypeError. mypy saw it once the pass's indexes were typed.
    import numpy as np

    from engramdb import MaintenanceConfig

    dims = 64
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((40, dims)).astype(np.float32)
    rows[1] = rows[0]  # an exact duplicate for the pass to find
    reports = []
    for name, cache_bytes in (("cached.engram", None), ("streamed.engram", 4096)):  # 40 x 256 B > 4 KiB
        db = make_db(name, encrypted=False, passphrase=None)
        if cache_bytes is not None:
            db.indexes.vectors.cache_bytes = cache_bytes
        db.add_space("s", dims=dims, model="m", normalize=True)
        db.add_many([{"id": f"n{i:02d}", "content": f"note number {i}", "embeddings": {"s": row}, "created_at": 1e9}
                     for i, row in enumerate(rows)])
        report = db.maintain(MaintenanceConfig(space="s"), now=1e9 + 86400.0)
        reports.append({k: v for k, v in report.to_dict().items() if k != "duration_s"})
    assert reports[0] == reports[1]
