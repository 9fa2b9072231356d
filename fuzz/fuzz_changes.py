"""Coverage-guided fuzzing of the change-log entry decoder (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_changes.py /tmp/changes-new fuzz/corpus/changes -max_total_time=60

The input is the decrypted value of ``meta/changes.<seq>`` (spec/file-format.md, "Change
log"): ``store.decode_changes`` may raise only CorruptFileError, and an entry it accepts
re-encodes to one that decodes to the same docnos.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb import store
        from engramdb.errors import CorruptFileError
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb import store
    from engramdb.errors import CorruptFileError


def TestOneInput(data: bytes) -> None:
    try:
        changes = store.decode_changes(data)
    except CorruptFileError:
        return
    again = store.decode_changes(store.encode_changes(changes))
    assert again == changes, f"{again!r} != {changes!r}"


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
