"""Entity detection: precision/recall on a labeled fixture, coreference, stable codes."""
from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path

from engramdb.compress import CompressStream, compress
from engramdb.compress.entities import assign_codes, build_entity_index, code_candidates
from engramdb.records import EntityIndex

# engramdb's own pipeline (compress(method="refined"), spec/compress.md sections 2-8):
# the tests that use it check behaviours zettel-compress 1.0.0 (the default) does not have
compress_refined = partial(compress, method="refined")

FIXTURES = Path(__file__).parent / "fixtures" / "compress"


def _fixture():
    text = (FIXTURES / "entities.txt").read_text(encoding="utf-8")
    labels = json.loads((FIXTURES / "entities.json").read_text(encoding="utf-8"))
    return text, labels


def test_precision_and_recall_on_labeled_fixture():
    text, labels = _fixture()
    r = compress_refined(text, chunk_size=200, chunk_overlap=0)
    found = set(r.entity_index.name_to_code)
    gold = set(labels["entities"])
    tp = len(found & gold)
    precision = tp / len(found)
    recall = tp / len(gold)
    assert precision >= 0.9, sorted(found - gold)
    assert recall >= 0.9, sorted(gold - found)
    assert not found & set(labels["noise"]), sorted(found & set(labels["noise"]))


def test_pronoun_coreference_links_earlier_entity():
    text, labels = _fixture()
    r = compress_refined(text, chunk_size=200, chunk_overlap=0)
    for quote_part, names in labels["coreference"].items():
        [z] = [z for z in r.zettels if quote_part in r.meta["source"][z.source_start:z.source_end]]
        assert set(names) <= set(z.entities)
        # "Marie" is not written in that chunk: only "her" refers to her
        assert "Marie" not in r.meta["source"][z.source_start:z.source_end]


def test_speaker_labels_are_entities_even_when_common_words():
    chat = "Hope: are we shipping today?\nMax: yes, the build is green.\nHope: great, I hope so."
    names = set(compress(chat).entity_index.name_to_code)
    assert {"Hope", "Max"} <= names


def test_changelog_noise_is_not_an_entity():
    log = (
        "## 2.0.0\nAdded support for Kafka.\nFixed a leak in the Redis pool.\nRemoved the old flag.\n"
        "Updated the README.\nDeprecated the v1 endpoint.\nImproved logging around retries.\n"
    )
    names = set(compress(log).entity_index.name_to_code)
    assert {"Kafka", "Redis"} <= names
    assert not names & {"Added", "Fixed", "Removed", "Updated", "Deprecated", "Improved"}


def test_sentence_start_words_used_lowercase_elsewhere_are_dropped():
    text = "Running is fun. We were running late. Apple pie is great. Tim Cook runs Apple."
    names = set(compress(text).entity_index.name_to_code)
    assert "Running" not in names
    assert {"Apple", "Tim", "Cook"} <= names


def test_possessives_and_unicode_names():
    text = "Yesterday Zoë's team met Émile and Øyvind. Later, Zoë thanked Émile's manager."
    names = set(compress_refined(text).entity_index.name_to_code)
    assert {"Zoë", "Émile", "Øyvind"} <= names
    assert not any("'" in n or "\u2019" in n for n in names)


def test_codes_are_three_uppercase_letters_and_unique():
    names = [f"Name{i}" for i in range(300)] + ["Alice", "Alicia", "Alison", "Al", "Émile", "李雷", "X"]
    index = build_entity_index(names)
    codes = list(index.code_to_name)
    assert len(codes) == len(set(codes)) == len(names)
    assert all(re.fullmatch(r"[A-Z]{3}", c) for c in codes)
    assert index.name_to_code["Alice"] == "ALC"
    # deterministic: the same names in any order give the same codes
    assert build_entity_index(reversed(names)).name_to_code == index.name_to_code


def test_code_candidates_cover_the_code_space():
    seen = set()
    for code in code_candidates("Bob"):
        seen.add(code)
        if len(seen) > 17576 + 100:
            break
    assert len({c for c in seen if len(c) == 3}) == 26 ** 3


def test_stream_codes_never_change():
    s = CompressStream()
    s.push("Alice met Alicia at the Kafka summit.")
    first = dict(s.snapshot().entity_index.name_to_code)
    s.push("Alison and Albert joined Alice later.")
    s.push("Alicia wrote to Alfred.")
    later = s.snapshot().entity_index.name_to_code
    for name, code in first.items():
        assert later[name] == code
    assert isinstance(s.snapshot().entity_index, EntityIndex)


def test_headings_in_capitals_and_chapter_numbers():
    text = (
        "CHAPTER XIV\n\nMR. DARCY ARRIVES\n\n"
        "Mr. Darcy rode to Netherfield with Mr. Bingley. Later, Elizabeth met Darcy in the lane."
    )
    names = set(compress_refined(text).entity_index.name_to_code)
    assert {"Darcy", "Bingley", "Elizabeth", "Netherfield"} <= names
    assert not names & {"XIV", "DARCY", "CHAPTER", "MR"}


def _naive_index(names):
    index = EntityIndex()
    for name in sorted(set(names)):
        code = next(c for c in code_candidates(name) if c not in index.code_to_name)
        index.name_to_code[name] = code
        index.code_to_name[code] = name
    return index


def test_code_assignment_is_first_free_candidate():
    # a tiny alphabet forces deep collisions; the fast path must equal the definition
    import random

    rng = random.Random(5)
    names = {"".join(rng.choice("abc") for _ in range(rng.randint(1, 6))).capitalize() for _ in range(900)}
    assert build_entity_index(names).name_to_code == _naive_index(names).name_to_code


class _CountingCodes(dict):
    """A code table that counts how often a code is probed (the work of assigning codes)."""

    probes = 0

    def __contains__(self, code: object) -> bool:
        self.probes += 1
        return super().__contains__(code)


def test_many_names_stay_linear_and_unique():
    import random

    rng = random.Random(9)
    names = set()
    while len(names) < 20_000:  # more than the 17,576 three-letter codes
        names.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9))).capitalize())
    index = EntityIndex()
    index.code_to_name = codes = _CountingCodes()
    assign_codes(index, names)
    # it was quadratic once the 3-letter space filled (every new name rescanned the taken
    # codes: hundreds of millions of probes); the cursors keep it to a few per name
    assert codes.probes < 50 * len(names), codes.probes
    assert len(index.code_to_name) == len(names)
    assert all(re.fullmatch(r"[A-Z]{3,5}", c) for c in index.code_to_name)
