"""Entities: proper nouns from capitalization evidence, speaker labels, pronouns, codes.

Detection works on the whole document first (so evidence from one chunk helps the
others), then per chunk:

* A *candidate* is a capitalized token ("Alice", "Darcy's" -> "Darcy", "JWT") of two or
  more characters that is not on the stop list (sentence starters such as "Please",
  changelog verbs such as "Added", roles, months, honorifics, ...).
* A candidate used as a chat speaker label ("Alice: we should ship") is an entity.
* In chat, a candidate that only ever opens a message and is set off by punctuation
  ("Mel: Woohoo! ...", "Aww, thanks") is an interjection, not a name, unless it is a
  known given name ("Sara, look at this").
* Otherwise it is an entity when it is capitalized mid-sentence (after a lowercase
  word, a digit or a comma) at least as often as it appears in lowercase; a word that
  only ever starts sentences is an entity unless the document also uses it in
  lowercase, it is a common English word, or it is verb-shaped ("Running", "Added").
* Pronoun coreference: "she"/"he" add the most recent gender-matching entity to a chunk
  that names none of that gender; "they" adds the two most recent entities to a chunk
  that names none. Gender comes from a small given-name list and from honorifics seen
  in the document ("Mr. Darcy", "Miss Bennet").

Codes are three uppercase letters derived from the name ("Alice" -> "ALC"); on a
collision the next candidate in a fixed order is taken (other letter pairs of the name,
then the first letter with any two letters, then any three letters, then the first
letter with three, four, ... letters), and names are coded in sorted order, so codes
are stable and deterministic.
"""
from __future__ import annotations

import re
from bisect import bisect_left
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache, partial
from itertools import combinations, count
from string import ascii_uppercase
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from ..records import EntityIndex
from .normalize import tokenize
from .topics import BASE_STOP_WORDS

__all__ = [
    "UPPER_CLASS",
    "EntityEvidence",
    "assign_codes",
    "build_entity_index",
    "chunk_entities",
    "code_candidates",
    "gazetteer_gender",
    "LineLabels",
    "message_speaker",
    "resolve_coreferences",
]


def _upper_class() -> str:
    # every uppercase letter of the BMP as a regex class, built once: Python's re has
    # no \p{Lu}, and an ASCII-only class would miss "Émile" or "Øyvind"
    ranges: list[tuple[int, int]] = []
    start = prev = -2  # no run yet: cp == prev + 1 never holds for cp >= 0
    for cp in range(0x10000):
        if chr(cp).isupper():
            if cp == prev + 1:
                prev = cp
            else:
                if start >= 0:
                    ranges.append((start, prev))
                start = prev = cp
    ranges.append((start, prev))
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)


UPPER_CLASS = _upper_class()
# a capitalized word with inner hyphens/apostrophes ("Jean-Luc", "O'Brien"); a final
# possessive "'s" is matched but left out of the name ("Darcy's" -> "Darcy")
_NAME = rf"[{UPPER_CLASS}]\w*(?:(?:-|['\u2019](?!s\b))\w+)*"
_CAP = re.compile(rf"(?<![\w'\u2019\-])({_NAME})(?:['\u2019]s\b)?")
# One pass finds every capitalized word and tells whether it stands mid-sentence: group
# 1 when the previous character is a lowercase letter, a digit, "," ";" or ")" followed
# by one space or line break (that cannot be a sentence start), group 2 otherwise.
_CAP_CONTEXT = re.compile(
    rf"(?<![\w'\u2019\-])(?:(?<=[a-z0-9\u00df-\u00ff,;)][ \n])({_NAME})|({_NAME}))(?:['\u2019]s\b)?"
)
_SPEAKER = re.compile(rf"^[ \t]*(?:\[[^\]\n]*\][ \t]*)?({_NAME})[ \t]*:(?![/\d])", re.MULTILINE)
# a capitalized word that opens a chat message and is cut off by punctuation
# ("Mel: Woohoo! ...", "Caroline: Aww, thanks"): the shape of an interjection
_OPENER = re.compile(
    rf"^[ \t]*(?:\[[^\]\n]*\][ \t]*)?{_NAME}[ \t]*:[ \t]*({_NAME})(?=[ \t]*[,!.?\u2026~])", re.MULTILINE
)
_HONORIFICS = frozenset({"Mr", "Mrs", "Ms", "Miss", "Sir", "Lady", "Lord", "Madam", "Mme", "Mlle", "Mister", "Dame",
                         "King", "Queen"})
# chapter numbers ("XIV", "LIX"); C, D and M are left out so "DC" or "MD" survive
_ROMAN = re.compile(r"[IVXL]{2,}")
_CONTRACTION = re.compile(r"['\u2019](?:t|ll|re|ve|d|m)$", re.IGNORECASE)
# a word written in lowercase (a lookbehind instead of \b: twice as fast on a book)
_LOWER_WORD = re.compile(r"(?<![\w'\u2019\-])[a-z][a-z'\u2019\-]*")

STOP_LIST = frozenset("""
I The A An It He She They We You But And Or In On At To Of For With By From That This These Those When Where
Which Who What How Then So If As Up About After Before Because While Although Though Monday Tuesday Wednesday
Thursday Friday Saturday Sunday January February March April May June July August September October November
December Its My Our Their His Her Your Mr Mrs Dr Yes No Not Just Also Very All Any Some Now Here There Today
Tomorrow Yesterday CEO CTO CFO COO VP Director Manager President Founder Engineer Developer Lead Admin User
Assistant System Bot Agent Human AI Section Chapter Part Appendix Figure Table Page Step Note Example Item List
Summary Overview Introduction Conclusion Paragraph II III IV VI VII VIII IX XI XII XIII XIV XV XX Prof Sir Dame
Lord Lady Madam Miss Ms Please Thanks Thank Sorry Hello Hi Hey Okay OK Sure Done Ready Maybe Perhaps Actually
Basically Honestly Anyway Alright Welcome Finally Meanwhile Overall Instead Otherwise However Therefore Thus
Hence Moreover Furthermore Additionally First Second Third Fourth Fifth Sixth Seventh Eighth Ninth Tenth Each
Every Both Phase Last Once Again Currently Recently Previously Originally Eventually Generally Specifically
Typically Unfortunately Fortunately Let Lets Added Removed Fixed Updated Changed Created Deleted Moved Renamed
Bumped Pushed Pulled Merged Committed Deployed Released Tested Ran Used Applied Advised Asked Agreed Decided
Started Finished Completed Implemented Refactored Reviewed Wrote Built Made Did Said Got Went Saw Took Came Found
Sent Told Gave Thought Knew Check Run Use Try Make Add Fix Update Remove Install Open Close Start Stop Keep Look
See Go Think Consider Ensure Remember Oh Ah Well Wow Yeah Yep Nope Hmm Great Good Nice Cool Indeed Still Even
Never Always Sometimes Often Yet Nor Whether Why Whatever Whenever Wherever Whoever Such Many Much Most More
Few Several Other Another Same Only Do Does Is Are Was Were Be Been Have Has Had Can Could Would Should Will
Shall Might Must Deprecated Security Breaking Features Changes Bugfixes Chore Docs Refactor Note Warning
Important Tip Todo TODO FIXME Subject Title Date Time Session Re Fwd Cc Q A Changelog Unreleased Release
Readme Later Soon Afterwards Earlier Amongst Whilst Illustration Self Thanks Cheers Regards Sounds Absolutely
Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec Mon Tue Wed Thu Fri Sat Sun Esq St Ay Aye Ah Oh Etc Copyright
Preface Contents Index Epilogue Prologue Footnote Footnotes
Glad Awesome Congrats Congratulations Kudos Bye Goodbye Nah Yea Yup Yay Whoa Woah Woo Woohoo Aw Aww Awww Phew
Oops Ouch Ugh Oof Dang Gotcha Lol Haha Hah Mm Mmm Btw BTW FYI Omg OMG Thankfully Hopefully Anyways Wonderful
Amazing Fantastic Perfect Exactly Totally Definitely Really Right True Happy Excited Interesting Lovely
""".split())
# labels that look like speakers but introduce fields ("Note: ...", "Date: ...")
_NOT_SPEAKERS = STOP_LIST | frozenset(
    {"Status", "Result", "Answer", "Question", "Error", "Output", "Input", "Source", "Type", "Name", "Location"}
)
_FEMALE_HON = frozenset({"Mrs", "Ms", "Miss", "Lady", "Madam", "Mme", "Mlle", "Dame", "Queen"})

FEMALE_NAMES = frozenset("""
alice carol emma olivia sophia sofia mia amelia isabella ava charlotte emily sarah sara anna maria laura julia
lucy grace chloe hannah zoe ella lily nora ruby alicia diana elena eva irene jane karen kate katherine linda
lisa megan nancy nina rachel rebecca rita rosa susan tina wendy priya aisha fatima mei yuki ingrid astrid clara
elsa frida greta margaret beth carmen lucia paula silvia valentina bianca francesca giulia martina katya natasha
olga svetlana tatiana vera zara leila noor marie sophie camille amelie samira yasmin helen ruth claire audrey
naomi iris elizabeth mary
caroline georgiana lydia kitty catherine harriet jessica melanie jennifer jolene deborah maya gina joanna
""".split())
MALE_NAMES = frozenset("""
bob robert james john michael david william richard joseph thomas charles daniel matthew anthony mark steven
paul andrew joshua kenneth kevin brian george edward ronald timothy jason jeffrey ryan jacob gary nicholas eric
jonathan stephen larry justin scott brandon benjamin samuel frank gregory raymond alexander patrick jack dennis
jerry tyler aaron jose adam henry nathan douglas zachary peter kyle walter ethan jeremy harold keith christian
roger noah gerald carl terry sean austin arthur lawrence jesse dylan bryan joe bruce albert gabriel logan juan
carlos luis miguel pedro diego marco luca giovanni ahmed ali omar hassan ravi raj kenji sven lars erik klaus
hans ivan dmitri sergei boris liam oliver harry oscar leo arjun vikram victor hugo felix simon martin tom
evan calvin dave sam nate andy pierre jean louis andre
""".split())

_FEMALE_PRONOUNS = frozenset({"she", "her", "hers", "herself"})
_MALE_PRONOUNS = frozenset({"he", "him", "his", "himself"})
_PLURAL_PRONOUNS = frozenset({"they", "them", "their", "theirs"})
_RECENT_KEEP = 8


def _stopped(name: str) -> bool:
    if name in STOP_LIST or _CONTRACTION.search(name) or _ROMAN.fullmatch(name):
        return True
    head = name.split("-", 1)[0]
    if head != name and head in STOP_LIST:  # "To-morrow", "Self-Made"
        return True
    # ALL-CAPS headings ("CHAPTER", "THE") are the same words shouted
    return name.isupper() and len(name) > 1 and name.capitalize() in STOP_LIST


def _verb_shaped(name: str) -> bool:
    return (name.endswith("ed") or name.endswith("ing")) and name[1:] == name[1:].lower()


@lru_cache(maxsize=1 << 16)
def gazetteer_gender(name: str) -> str | None:
    """``"female"``/``"male"`` when the first part of ``name`` is a known given name."""
    first = re.split(r"[\s_\-]", name)[0].lower()
    if first in FEMALE_NAMES:
        return "female"
    if first in MALE_NAMES:
        return "male"
    return None


@dataclass
class EntityEvidence:
    """Document-wide capitalization evidence: which candidates are entities, and genders."""

    accepted: frozenset[str]
    speakers: frozenset[str]
    gender: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    _forms: dict[str, str] | None = field(default=None, repr=False, compare=False)

    def forms(self) -> dict[str, str]:
        """Token form -> entity name, possessives included (``"Darcy's" -> "Darcy"``)."""
        if self._forms is None:
            forms = {}
            for form, name in [(n, n) for n in self.accepted] + list(self.aliases.items()):
                forms[form] = name
                forms[form + "'s"] = name
                forms[form + "\u2019s"] = name
            self._forms = forms
        return self._forms

    @classmethod
    def scan(cls, text: str) -> EntityEvidence:
        """Collect evidence over the whole normalized ``text``."""
        pairs = _CAP_CONTEXT.findall(text)
        candidates = Counter(a or b for a, b in pairs)
        mid = Counter(a for a, _ in pairs if a)
        speakers = frozenset(
            s for s in _SPEAKER.findall(text)
            if len(s) >= 2 and s not in _NOT_SPEAKERS and not s.isdigit()
        )
        lower = Counter(_LOWER_WORD.findall(text))
        openers = Counter(_OPENER.findall(text)) if speakers else Counter()
        accepted = set()
        for name in candidates:
            if len(name) < 2 or _stopped(name):
                continue
            if name in speakers:
                accepted.add(name)
                continue
            # only ever a message's first word, set off by punctuation: an interjection
            # ("Woohoo!", "Aww,") unless it is a known given name ("Sara, look")
            if openers.get(name, 0) == candidates[name] and not gazetteer_gender(name):
                continue
            low = lower.get(name.lower(), 0)
            m = mid.get(name, 0)
            if m and m >= low:
                accepted.add(name)
            elif low or name.lower() in BASE_STOP_WORDS or _verb_shaped(name):
                continue
            else:
                accepted.add(name)
        # a heading or caption in capitals ("MR. DARCY") names the same entity as "Darcy"
        aliases = {}
        for name in sorted(accepted):
            if len(name) > 2 and name.isupper():
                for plain in (name.capitalize(), name.title()):
                    if plain != name and plain in accepted:
                        aliases[name] = plain
                        break
        accepted.difference_update(aliases)
        # an honorific right before a name ("Mr. Darcy", "Mrs. and Miss Bennet") votes
        # for its gender; capitalized words come in text order, so "right before" is
        # "the previous capitalized word"
        votes: dict[str, Counter[str]] = {}
        prev = ""
        for a, b in pairs:
            name = a or b
            if prev in _HONORIFICS and name in accepted:
                votes.setdefault(name, Counter())["female" if prev in _FEMALE_HON else "male"] += 1
            if name not in _HONORIFICS or prev not in _HONORIFICS:
                prev = name
        gender = {}
        for name in accepted:
            known = gazetteer_gender(name)
            if known:
                gender[name] = known
            elif name in votes:
                v = votes[name]
                if v["female"] != v["male"]:
                    gender[name] = "female" if v["female"] > v["male"] else "male"
        return cls(frozenset(accepted), speakers, gender, aliases)


class LineLabels:
    """The chat label of each line of ``text``, read once per line: asked for every chunk of a
    long line, a search back to the line start and a match from there cost n^2 (one 400 KB
    line took 11 s)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self._labels: dict[int, tuple[int, str] | None] = {}

    def line_start(self, offset: int) -> int:
        k = bisect_left(self.newlines, offset)  # newlines before offset
        return self.newlines[k - 1] + 1 if k else 0

    def label(self, line_start: int) -> tuple[int, str] | None:
        """(end, name) of the label opening the line at ``line_start``, if any."""
        if line_start not in self._labels:
            m = _SPEAKER.match(self.text, line_start)
            self._labels[line_start] = None if m is None else (m.end(), m[1])
        return self._labels[line_start]


def message_speaker(text: str, offset: int, evidence: EntityEvidence, lines: LineLabels | None = None) -> str | None:
    """The speaker of the chat message that ``offset`` falls inside, past its label: a
    chunk that continues a message cut in two still names who is talking (``lines``: the
    labels of ``text``, kept across the calls for one text)."""
    lines = lines if lines is not None and lines.text is text else LineLabels(text)
    line_start = lines.line_start(offset)
    if line_start == offset:
        return None
    label = lines.label(line_start)
    if label is None or label[0] > offset:
        return None
    name = evidence.aliases.get(label[1], label[1])
    return name if name in evidence.speakers and name in evidence.accepted else None


def chunk_entities(
    text: str, evidence: EntityEvidence, min_frequency: int = 1, tokens: list[str] | None = None
) -> list[str]:
    """Entities named in one chunk, in order of first mention.

    ``tokens`` are :func:`.normalize.tokenize` tokens of ``text`` (original case) when the
    caller has them; a possessive token ("Darcy's") counts for its name.
    """
    if tokens is None:
        tokens = tokenize(text)[0]
    forms = evidence.forms()
    present = forms.keys() & set(tokens)
    if not present:
        return []
    first: dict[str, int] = {}
    counts: dict[str, int] = {}
    for form in present:
        name = forms[form]
        at = tokens.index(form)
        if name not in first or at < first[name]:
            first[name] = at
        if min_frequency > 1:
            counts[name] = counts.get(name, 0) + tokens.count(form)
    names = sorted(first, key=lambda n: (first[n], n))
    if min_frequency > 1:
        names = [n for n in names if counts[n] >= min_frequency]
    return names


def resolve_coreferences(
    words: Sequence[Iterable[str]],
    named: Sequence[Sequence[str]],
    gender: dict[str, str],
    recent: Sequence[str] = (),
) -> tuple[list[list[str]], list[str]]:
    """Add pronoun antecedents to each chunk's entities.

    Args:
        words: the lowercase words of each chunk (any iterable), in order.
        named: entities named in each chunk, in order of first mention.
        gender: ``name -> "female" | "male"`` from document evidence; names missing
            from it fall back to the given-name list.
        recent: entities mentioned before the first chunk (a stream's state), oldest first.

    Returns:
        ``(entities per chunk, sorted; the updated recent list, oldest first)``.
    """
    gender = _GenderOf(gender)
    recent_list = list(recent)
    last: dict[str, str | None] = {"female": None, "male": None}
    for name in recent_list:
        g = gender.get(name)
        if g:
            last[g] = name
    out: list[list[str]] = []
    for chunk_words, names in zip(words, named):
        vocab = chunk_words if isinstance(chunk_words, (set, frozenset)) else set(chunk_words)
        entities = list(names)
        have = {gender.get(n) for n in names}
        for g, pronouns in (("female", _FEMALE_PRONOUNS), ("male", _MALE_PRONOUNS)):
            who = last[g]
            if who is not None and g not in have and who not in entities and not pronouns.isdisjoint(vocab):
                entities.append(who)
        if not names and recent_list and not _PLURAL_PRONOUNS.isdisjoint(vocab):
            for who in recent_list[-2:]:
                if who not in entities:
                    entities.append(who)
        for name in names:
            g = gender.get(name)
            if g:
                last[g] = name
            if name in recent_list:
                recent_list.remove(name)
            recent_list.append(name)
        del recent_list[:-_RECENT_KEEP]
        out.append(sorted(entities))
    return out, recent_list


class _GenderOf(dict[str, str]):
    # dict.get's overloads do not allow a gazetteer fallback; callers only use get(name)
    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name) or gazetteer_gender(name) or default


def _letters(name: str) -> str:
    folded = unicodedata.normalize("NFKD", name)
    return "".join(c for c in folded if "A" <= c.upper() <= "Z" and c.isascii()).upper()


def _nth(k: int, length: int) -> str:
    """The ``k``-th string of ``length`` uppercase letters in lexicographic order."""
    if length == 2:
        return _PAIRS[k]
    if length == 3:
        return _TRIPLES[k]
    out = []
    for _ in range(length):
        k, r = divmod(k, 26)
        out.append(ascii_uppercase[r])
    return "".join(reversed(out))


_PAIRS = tuple(a + b for a in ascii_uppercase for b in ascii_uppercase)
_TRIPLES = tuple(a + bc for a in ascii_uppercase for bc in _PAIRS)


def _own_codes(name: str) -> tuple[str, Iterator[str]]:
    """The first letter of ``name`` and the codes made from its own letters, in order."""
    letters = _letters(name) or "X"
    return letters[0], _own_code_iter(letters)


def _own_code_iter(letters: str) -> Iterator[str]:
    first, rest = letters[0], letters[1:]
    consonants = [c for c in rest if c not in "AEIOU"]
    if len(consonants) >= 2:
        yield first + consonants[0] + consonants[1]
    elif len(consonants) == 1:
        yield first + consonants[0] + letters[-1]
    yield (first + rest[:2]).ljust(3, "X")
    for i, j in combinations(range(len(rest)), 2):
        yield first + rest[i] + rest[j]


# a fallback range's cursor key: ("first+2", first), ("any3",) or ("first+n", first, length)
_StageKey = tuple[str | int, ...]


def _first_plus(first: str, n: int, k: int) -> str:
    return first + _nth(k, n)


def _stages(first: str) -> Iterator[tuple[_StageKey, int, Callable[[int], str]]]:
    """The shared fallback ranges after a name's own codes: ``(key, size, k -> code)``."""
    yield ("first+2", first), 26 ** 2, lambda k: first + _nth(k, 2)
    yield ("any3",), 26 ** 3, lambda k: _nth(k, 3)
    for length in count(3):  # then longer codes: the space never runs out
        yield ("first+n", first, length), 26 ** length, partial(_first_plus, first, length)


def code_candidates(name: str) -> Iterator[str]:
    """Codes for ``name`` in preference order (infinite; every 3-letter code appears)."""
    first, own = _own_codes(name)
    yield from own
    for _, size, code_at in _stages(first):
        for k in range(size):
            yield code_at(k)


def _first_free(name: str, used: Mapping[str, str], cursors: dict[_StageKey, int]) -> str:
    first, own = _own_codes(name)
    for code in own:
        if code not in used:
            return code
    for key, size, code_at in _stages(first):
        # every code of a range before its cursor is taken (codes are never freed), so
        # the scan resumes there: the first free code in preference order, without
        # rescanning thousands of taken codes for every new name
        k = cursors.get(key, 0)
        while k < size:
            code = code_at(k)
            if code not in used:
                cursors[key] = k
                return code
            k += 1
        cursors[key] = size
    raise AssertionError("unreachable: the code ranges are unbounded")  # pragma: no cover


def assign_codes(index: EntityIndex, names: Iterable[str]) -> None:
    """Give each new name in ``names`` a code, in sorted order; existing codes never change.

    Each name gets the first code of :func:`code_candidates` not yet taken.
    """
    used = index.code_to_name
    cursors: dict[_StageKey, int] = {}
    for name in sorted(set(names)):
        if name in index.name_to_code:
            continue
        code = _first_free(name, used, cursors)
        index.name_to_code[name] = code
        index.code_to_name[code] = name


def build_entity_index(names: Iterable[str]) -> EntityIndex:
    """A fresh :class:`EntityIndex` for ``names``."""
    index = EntityIndex()
    assign_codes(index, names)
    return index

