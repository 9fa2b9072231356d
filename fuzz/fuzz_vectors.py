"""Coverage-guided fuzzing of the vector block and directory decoders (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_vectors.py /tmp/vectors-new fuzz/corpus/vectors -max_total_time=60

The first byte of an input picks the target, the rest is the decrypted value:

    0  decode_vector_block(body)   only CorruptFileError may escape; a block it accepts
                                   re-encodes to the same bytes (the format is canonical)
    1  the space directory decoder (both layouts): only CorruptFileError may escape; a
                                   layout-2 directory it accepts re-encodes to a directory
                                   that decodes to the same fields
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb.errors import CorruptFileError
        from engramdb.index import vectors
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb.errors import CorruptFileError
    from engramdb.index import vectors


def check_block(body: bytes) -> None:
    try:
        offsets, matrix = vectors.decode_vector_block(body)
    except CorruptFileError:
        return
    rows = int.from_bytes(body[2:4], "little")
    assert matrix.shape == (offsets.size, int.from_bytes(body[4:8], "little")), "shape differs from the header"
    again = vectors.encode_vector_block(offsets, matrix, rows)
    assert again == body, "encode_vector_block(decode_vector_block(b)) != b"


def check_dir(body: bytes) -> None:
    try:
        d = vectors._decode_dir(body)
    except CorruptFileError:
        return
    if isinstance(d, vectors._Dir):
        again = vectors._decode_dir(d.encode())
        assert isinstance(again, vectors._Dir), "a layout-2 directory re-decodes to another layout"
        assert (again.rows, again.dims, again.count, again.seq, again.log) == (d.rows, d.dims, d.count, d.seq, d.log), \
            "a directory's fields change on re-encoding"


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 2, data[1:]
    if mode == 0:
        check_block(body)
    else:
        check_dir(body)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
