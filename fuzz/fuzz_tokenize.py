"""Coverage-guided fuzzing of the bulk tokenizer (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_tokenize.py /tmp/tokenize-new fuzz/corpus/tokenize -max_total_time=60

``Tokenizer.encode_many`` parses a batch's UTF-8 bytes with numpy (word runs, words read
as packed integers, a hash grouping with an exact fallback), a second implementation of
what ``Tokenizer.__call__`` does with a regex one text at a time. The first byte picks the
tokenizer (``byte % 4``: stemmed or not, Lucene stopwords or none); the rest, decoded as
UTF-8 (lone surrogates kept through ``surrogatepass`` when possible), is split on ``\\x1e``
into the batch's texts.

Oracle: ``encode_many`` equals tokenizing each text on its own, term for term, and the
only exception either may raise is an ``EngramError``.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb.errors import EngramError
        from engramdb.index.tokenize import Tokenizer
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb.errors import EngramError
    from engramdb.index.tokenize import Tokenizer

TOKENIZERS = [Tokenizer(stemmer=stemmer, stopwords=stopwords)
              for stemmer in ("english", None) for stopwords in ("lucene_en", "none")]
SEPARATOR = "\x1e"


def texts_of(body: bytes) -> list[str]:
    try:
        text = body.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        text = body.decode("utf-8", "replace")
    return text.split(SEPARATOR)


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    tokenizer = TOKENIZERS[data[0] % len(TOKENIZERS)]
    texts = texts_of(data[1:])
    try:
        expected = [tokenizer(text) for text in texts]
    except EngramError:
        expected = None
    try:
        terms, term_ids, lengths = tokenizer.encode_many(texts)
    except EngramError:
        assert expected is None, "encode_many refused texts that tokenize one by one"
        return
    assert expected is not None, "encode_many accepted texts that do not tokenize one by one"
    assert len(lengths) == len(texts)
    got, start = [], 0
    for length in lengths.tolist():
        got.append([terms[i] for i in term_ids[start:start + length].tolist()])
        start += length
    assert start == len(term_ids)
    assert got == expected, (texts, got, expected)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
