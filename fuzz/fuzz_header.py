"""Coverage-guided fuzzing of the file header and the unlock path (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_header.py /tmp/header-new fuzz/corpus/header -max_total_time=60

The body of an input is the msgpack header; a fake transaction serves it as the header
copies with a matching SHA-256, and ``header.read_header`` then ``header.unlock`` run on
it. The first byte picks the case (``byte % 8``):

    bit 0      unlock with the passphrase (0) or with the raw key (1)
    bits 1-2   0: primary and backup both hold the body; 1: only the primary;
               2: only the backup; 3: the primary is damaged, the backup holds the body

Oracle: anything other than an EngramError is a crash; ``needs_repair`` is reported exactly
when a copy is missing or damaged; an accepted header is written back with
``header.write_header`` and reads back equal; an unlock returns a 32-byte key; and the KDF never
runs with parameters above the cap, i.e. hostile parameters are refused before it runs.

KDF cost: the test switch ``ENGRAM_TEST_WEAK_KDF=1`` lets the seeds use t=1, m=8 KiB, and
:func:`cheap_kdf` lowers the cap to t<=4, m<=256 KiB, p<=4 for the run, so a mutated
header cannot make one execution allocate gigabytes (the real cap, t<=20, m<=4 GiB,
p<=16, is checked by the same code). ``argon2.low_level.hash_secret_raw`` is wrapped to
assert that it never sees parameters above the cap in force.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb import codec, crypto
        from engramdb import header as hdr
        from engramdb.errors import EngramError
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb import codec, crypto
    from engramdb import header as hdr
    from engramdb.errors import EngramError

import argon2.low_level

# fuzz/make_corpus.py writes the seed headers with these secrets.
PASSPHRASE = "fuzz-passphrase"
RAW_KEY = bytes(range(64, 96))
FUZZ_CAP = (4, 256, 4)
PATH = "fuzz.engram"


class FakeTxn:
    """The three header keys of a store's meta table, in memory."""

    def __init__(self, values: dict[bytes, bytes]) -> None:
        self.values = dict(values)

    def get_header(self, key: bytes) -> bytes | None:
        return self.values.get(key)

    def put_header(self, key: bytes, value: bytes) -> None:
        assert key in (b"header", b"header.bak", b"header.sha256"), f"not a header key: {key!r}"
        self.values[key] = value


@contextlib.contextmanager
def cheap_kdf() -> Iterator[None]:
    """The weak-KDF test switch, a low cap, and a guard that the KDF never sees more."""
    real_kdf, real_cap, real_env = argon2.low_level.hash_secret_raw, crypto.KDFParams.CAP, \
        os.environ.get(crypto.WEAK_KDF_ENV)

    def guarded(*, time_cost: int, memory_cost: int, parallelism: int, **kwargs):
        cap_t, cap_m, cap_p = crypto.KDFParams.CAP
        assert time_cost <= cap_t and memory_cost <= cap_m and parallelism <= cap_p, \
            f"the KDF ran with t={time_cost}, m={memory_cost}, p={parallelism}, above the cap"
        return real_kdf(time_cost=time_cost, memory_cost=memory_cost, parallelism=parallelism, **kwargs)

    argon2.low_level.hash_secret_raw = guarded
    crypto.KDFParams.CAP = FUZZ_CAP
    os.environ[crypto.WEAK_KDF_ENV] = "1"
    try:
        yield
    finally:
        argon2.low_level.hash_secret_raw = real_kdf
        crypto.KDFParams.CAP = real_cap
        if real_env is None:
            os.environ.pop(crypto.WEAK_KDF_ENV, None)
        else:
            os.environ[crypto.WEAK_KDF_ENV] = real_env


def header_txn(body: bytes, layout: int) -> FakeTxn:
    values = {b"header.sha256": hashlib.sha256(body).digest()}
    if layout in (0, 1):
        values[b"header"] = body
    if layout in (0, 2, 3):
        values[b"header.bak"] = body
    if layout == 3:
        values[b"header"] = body[::-1] + b"\x00"  # never equal to the body, so its digest fails
    return FakeTxn(values)


def check_header(body: bytes, mode: int) -> None:
    use_key, layout = mode & 1, (mode >> 1) & 3
    try:
        header, chosen, needs_repair = hdr.read_header(header_txn(body, layout), PATH)
    except EngramError:
        return
    assert isinstance(header, dict) and chosen == body, "read_header returned the wrong copy"
    assert needs_repair == (layout != 0), f"needs_repair={needs_repair} for layout {layout}"
    written = FakeTxn({})
    hdr.write_header(written, header)
    again, again_bytes, repair_again = hdr.read_header(written, PATH)
    # compared as bytes: a header may hold NaN, which is not equal to itself
    assert codec.pack(again) == again_bytes and not repair_again, "a rewritten header reads back differently"
    try:
        dek = hdr.unlock(header, passphrase=None if use_key else PASSPHRASE,
                          raw_key=RAW_KEY if use_key else None)
    except EngramError:
        return
    assert isinstance(dek, bytes) and len(dek) == 32, "unlock returned a malformed key"


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    check_header(data[1:], data[0] % 8)


if __name__ == "__main__":
    with cheap_kdf():
        atheris.Setup(sys.argv, TestOneInput)
        atheris.Fuzz()
