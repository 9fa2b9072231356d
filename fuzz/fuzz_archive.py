"""Coverage-guided fuzzing of the archive-group parser and the in-place record patch
(atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_archive.py /tmp/archive-new fuzz/corpus/archive -max_total_time=60

The first byte of an input picks the target:

    0  maintenance.archive.unpack_group(body)   only CorruptFileError may escape; a group it
                                                accepts packs and unpacks to the same originals
    1  codec.patch_node(body, {"tier": "warm"}) only CorruptFileError/ValidationError; when
                                                the body is a record decode_node accepts, the
                                                patched record decodes to the node with tier warm

``python fuzz/fuzz_archive.py --seeds DIR`` writes the seed corpus (deterministic; the
committed one is ``fuzz/corpus/archive``, replayed by tests/test_archive_groups.py).
"""
from __future__ import annotations

import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__" and "--seeds" not in sys.argv:
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb import codec
        from engramdb.errors import CorruptFileError, ValidationError
        from engramdb.maintenance import archive
        from engramdb.records import Node
else:  # imported by tests/test_archive_groups.py to replay the corpus without atheris
    from engramdb import codec
    from engramdb.errors import CorruptFileError, ValidationError
    from engramdb.maintenance import archive
    from engramdb.records import Node


def check_group(body: bytes) -> None:
    try:
        members = archive.unpack_group(body)
    except CorruptFileError:
        return
    assert archive.unpack_group(archive.pack_group(members)) == members, "group round trip differs"


def check_patch(body: bytes) -> None:
    try:
        patched = codec.patch_node(body, {"tier": "warm"})
    except (CorruptFileError, ValidationError):
        return
    try:
        node = codec.decode_node(body)
    except CorruptFileError:
        return  # the array had the shape but not valid fields: patch does not validate the rest
    assert codec.decode_node(patched) == node.replace(tier="warm"), "patched record differs"


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 2, data[1:]
    if mode == 0:
        check_group(body)
    else:
        check_patch(body)


def seeds() -> list[bytes]:
    """The seed inputs: real groups and records, and a few damaged ones."""
    groups = [archive.pack_group([(1, "hello")]),
              archive.pack_group([(3, "the quarterly planning meeting " * 30), (9, ""), (2**40, "\u00e9t\u00e9 \U0001f600")]),
              archive.pack_group([])]
    out = [b"\x00" + g for g in groups]
    out += [b"\x00" + groups[1][:-5], b"\x00\x02" + b"\x28\xb5\x2f\xfd" + b"\x00" * 8, b"\x00\x01junk"]
    records = [codec.encode_node(Node(id="x", content="text", tags=("a",), embeddings={"e": (1.0, 0.5)})),
               codec.encode_node(Node(id="long", content="word " * 1000, metadata={"k": [1, 2]}))]
    out += [b"\x01" + r for r in records] + [b"\x01" + records[0][:-3], b"\x01\x07junk"]
    return out


if __name__ == "__main__":
    if "--seeds" in sys.argv:
        folder = sys.argv[sys.argv.index("--seeds") + 1]
        os.makedirs(folder, exist_ok=True)
        for seed in seeds():
            with open(os.path.join(folder, hashlib.sha1(seed).hexdigest()), "wb") as fh:
                fh.write(seed)
    else:
        atheris.Setup(sys.argv, TestOneInput)
        atheris.Fuzz()
