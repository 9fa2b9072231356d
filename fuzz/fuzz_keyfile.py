"""Coverage-guided fuzzing of the key file reader (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_keyfile.py /tmp/keyfile-new fuzz/corpus/keyfile -max_total_time=60

The input is the content of a ``--key-file`` (``engramdb.header.read_key_file``: 32 raw
bytes, or a recovery key ``ERK1-...`` as text, which ``parse_raw_key`` decodes).

Oracle: only ValidationError escapes; an accepted file gives 32 bytes or a text that
``parse_raw_key`` turns into 32 bytes, and that key written as a recovery key
(``format_recovery_key``) reads back as the same 32 bytes.

``python fuzz/fuzz_keyfile.py --seeds DIR`` writes the seed corpus (deterministic; the
committed one is ``fuzz/corpus/keyfile``, replayed by tests/test_fuzz_regressions.py).
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__" and "--seeds" not in sys.argv:
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb import header
        from engramdb.errors import ValidationError
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb import header
    from engramdb.errors import ValidationError

_DIR = tempfile.mkdtemp(prefix="fuzz-keyfile-")
PATH = os.path.join(_DIR, "key")
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)


def TestOneInput(data: bytes) -> None:
    with open(PATH, "wb") as fh:
        fh.write(data)
    try:
        key = header.read_key_file(PATH)
    except ValidationError:
        return
    raw = header.parse_raw_key(key)
    assert isinstance(raw, bytes) and len(raw) == 32, f"read_key_file gave a key of {len(raw)} bytes"
    assert key == data if isinstance(key, bytes) else key == data.decode("utf-8-sig").strip(), "the key is not the file's"
    text = header.format_recovery_key(raw)
    assert header.parse_raw_key(text) == raw, "a recovery key does not read back"
    assert header.parse_raw_key(text.lower().replace("-", " ")) == raw, "a retyped recovery key does not read back"


def seeds() -> list[bytes]:
    raw = bytes(range(32))
    text = header.format_recovery_key(raw)
    out = [raw, raw[:31], raw + b"\n", text.encode(), (text + "\n").encode(), text.lower().encode(),
           text.replace("-", " ").encode(), text[:-4].encode(), (text + "AAAA").encode(), text[5:].encode(),
           ("ERK1 " + text[5:]).encode(), b"", b"\n", b"ERK1-", "\u00e9RK1-\u00df".encode(), b"\xff" * 52,
           (text[:-1] + "1").encode(), (text[:-1] + "=").encode(), b"\xef\xbb\xbf" + text.encode(),
           text.encode("utf-16")]
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
