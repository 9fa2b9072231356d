"""Coverage-guided fuzzing of the record decoder and the envelope opener (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_records.py /tmp/records-new fuzz/corpus/records -max_total_time=60

The first byte of an input picks the target (reliability test T7.5: the decrypted-record
decoder gets fuzzer bytes as its plaintext):

    0  codec.decode_node(body)                     only CorruptFileError may escape; a node
                                                   it accepts re-encodes to an equal node
    1  Sealer(DEK).open(table, key, envelope)      encrypted store: only DecryptionError
    2  Sealer(None, ...).open(table, key, value)   plaintext store: only DecryptionError
    3  Sealer(DEK).open, then decode_node          the path of a record read from a file

For 1-3 the body is ``len(table) | table | len(key) | key | envelope`` (one length byte
each, clipped to what is there), so the fuzzer also moves envelopes between records.
An envelope that opens must be the one ``_seal_with_nonce`` makes of its plaintext.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb import codec, crypto
        from engramdb.errors import CorruptFileError, DecryptionError
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb import codec, crypto
    from engramdb.errors import CorruptFileError, DecryptionError

# Fixed test keys: fuzz/make_corpus.py seals the seed envelopes with the same ones.
DEK = bytes(range(32))
PLAIN_BLIND_KEY = bytes(range(32, 64))
SEALER = crypto.Sealer(DEK)
PLAIN_SEALER = crypto.Sealer(None, plain_blind_key=PLAIN_BLIND_KEY)


def split_envelope(body: bytes) -> tuple[bytes, bytes, bytes]:
    """``len | table | len | key | envelope`` -> (table, key, envelope)."""
    n = body[0] if body else 0
    table, rest = body[1:1 + n], body[1 + n:]
    m = rest[0] if rest else 0
    return table, rest[1:1 + m], rest[1 + m:]


def join_envelope(table: bytes, key: bytes, envelope: bytes) -> bytes:
    """Inverse of :func:`split_envelope` (used by make_corpus.py)."""
    return bytes((len(table),)) + table + bytes((len(key),)) + key + envelope


def check_node(body: bytes) -> None:
    try:
        node = codec.decode_node(body)
    except CorruptFileError:
        return
    # a record with vectors names its spaces; the vectors come from the vector blocks
    again = codec.decode_node(codec.encode_node(node), fetch=lambda names: {n: node.embeddings[n] for n in names})
    assert again == node, "decode_node(encode_node(node)) != node"


def check_open(body: bytes, encrypted: bool, then_decode: bool = False) -> None:
    table, key, envelope = split_envelope(body)
    sealer = SEALER if encrypted else PLAIN_SEALER
    try:
        plaintext = sealer.open(table, key, envelope)
    except DecryptionError:
        return
    assert isinstance(plaintext, bytes), "open() returned something other than bytes"
    if encrypted:
        head = crypto._ENV_HEADER.size
        _, epoch = crypto._ENV_HEADER.unpack_from(envelope)
        nonce = envelope[head:head + crypto.NONCE_BYTES]
        assert sealer._seal_with_nonce(table, key, plaintext, epoch, nonce) == envelope, "re-seal differs"
    else:
        assert sealer.seal(table, key, plaintext, 0) == envelope, "re-seal differs"
    if then_decode:
        check_node(plaintext)


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 4, data[1:]
    if mode == 0:
        check_node(body)
    else:
        check_open(body, encrypted=mode != 2, then_decode=mode == 3)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
