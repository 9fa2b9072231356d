"""What an attacker with the files (and no key) can read (reliability rules 43-44, test
plan T6.10): embeddings are sealed like everything else (text can be partly rebuilt from
them), and an encrypted dump holds none of the store's words."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
from engramdb import aaak


def test_embeddings_never_reach_the_files_in_the_clear(tmp_path):
    rng = np.random.default_rng(20261201)
    vectors = rng.standard_normal((200, 16)).astype(np.float32)
    path = tmp_path / "v.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_space("v", dims=16)
        db.add_many([{"id": f"n{i}", "content": f"memory {i}", "embeddings": {"v": vectors[i]}} for i in range(200)])
        db.merge_indexes(force=True)
        # the space normalises: look for the stored bytes as well as the ones given
        stored = np.array([db.get(f"n{i}").embeddings["v"] for i in range(200)], dtype=np.float32)
    assert not np.array_equal(stored, vectors)
    vectors = np.concatenate([vectors, stored])
    data = b"".join((tmp_path / name).read_bytes() for name in ("v.engram", "v.engram-lock", "v.engram-maint"))
    # 8 bytes of a vector (two floats) are enough to find it; any run of them must be absent
    leaks = [i for i, v in enumerate(vectors) for j in range(0, 16, 2)
             if v[j:j + 2].tobytes() in data or v[j:j + 2].astype(np.float64).tobytes() in data]
    assert leaks == []


def test_an_encrypted_dump_holds_none_of_the_words(tmp_path):
    words = [f"zqv{i:03d}leak" for i in range(300)]
    with engram.open(tmp_path / "d.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add_many([{"id": words[i], "content": f"text {words[i + 1]}", "tags": [words[i + 2]]}
                     for i in range(0, 300, 3)])
        text = io.StringIO()
        db.dump(text)
    assert all(w in text.getvalue() for w in words)  # the plaintext dump holds them all
    out = io.BytesIO()
    aaak.encrypt_dump(text.getvalue(), out, "dump passphrase", kdf=TEST_KDF)
    data = out.getvalue()
    assert [w for w in words if w.encode() in data or w.encode("utf-16-le") in data] == []
    assert b"leak" not in data and b"dump passphrase" not in data


def test_the_cli_turns_core_dumps_off(tmp_path):
    """A core dump of the CLI would hold the key and plaintext (reliability rule 61)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # the child raises its soft limit as far as its hard one allows (an in-process CLI test run
    # earlier in this worker used to lower the hard limit to 0, and this setrlimit then failed)
    script = ("import resource; from click.testing import CliRunner; from engramdb.cli import cli; "
              "hard = resource.getrlimit(resource.RLIMIT_CORE)[1]; "
              "resource.setrlimit(resource.RLIMIT_CORE, (1 << 20 if hard == resource.RLIM_INFINITY else hard, hard)); "
              "before = resource.getrlimit(resource.RLIMIT_CORE); "
              f"CliRunner().invoke(cli, ['--plaintext', 'info', {str(tmp_path / 'missing.engram')!r}]); "
              "print(before[0] > 0 or before[1] == 0, resource.getrlimit(resource.RLIMIT_CORE) == (0, hard))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])})
    assert out.stdout.strip() == "True True", out.stderr[-500:]


def test_the_cli_keeps_the_hard_core_limit(tmp_path):
    """Regression: the CLI set the hard limit to 0 too, so once a test ran it in-process, a
    child of the test process could no longer raise its soft limit (the test above failed
    depending on which tests its worker ran first)."""
    import resource

    from click.testing import CliRunner

    from engramdb.cli import cli

    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    CliRunner().invoke(cli, ["--plaintext", "info", str(tmp_path / "missing.engram")])
    assert resource.getrlimit(resource.RLIMIT_CORE) == (0, hard)
