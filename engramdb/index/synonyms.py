"""Query expansion: synonym clusters and dates mentioned in a query.

Pure functions over the file's tokenizer; nothing is stored. Matching is on index terms
(after stemming), so "relocated" finds the cluster of "relocate", and multi-word members
("new york") match consecutive query words.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Sequence

from .tokenize import Tokenizer

__all__ = [
    "DATE_WEIGHT",
    "EXPANSION_WEIGHT",
    "QUESTION_WORDS",
    "SYNONYM_CLUSTERS",
    "QueryDate",
    "Expander",
    "parse_date",
    "query_dates",
]

# A synonym counts this much of an original query term: it widens recall without
# letting a common synonym outrank a document that matches the user's own words.
EXPANSION_WEIGHT = 0.4
# A memory's score is multiplied by 1 + DATE_WEIGHT * proximity (QueryDate.proximity) when the
# query names a year or month near its resolved date; shared by a store's recall and recall_result.
DATE_WEIGHT = 0.25

# Each cluster is a set of interchangeable words or phrases. Kept small and precise:
# a cluster is worth adding only when its members are used for the same fact.
SYNONYM_CLUSTERS: tuple[tuple[str, ...], ...] = (
    ("move", "moved", "relocate", "relocation", "transfer", "moving house", "new place"),
    ("job", "career", "work", "employment", "occupation", "profession", "employer"),
    ("marry", "married", "marriage", "wedding", "spouse", "husband", "wife", "engaged", "engagement"),
    ("child", "children", "kid", "kids", "son", "daughter", "baby"),
    ("parent", "parents", "mother", "father", "mom", "dad", "mum"),
    ("sibling", "brother", "sister"),
    ("friend", "friends", "buddy", "pal"),
    ("partner", "boyfriend", "girlfriend", "dating"),
    ("pet", "dog", "cat", "puppy", "kitten"),
    ("house", "home", "apartment", "flat"),
    ("car", "vehicle", "automobile"),
    ("doctor", "physician", "hospital", "clinic"),
    ("sick", "ill", "illness", "disease", "unwell"),
    ("hurt", "injury", "injured", "accident"),
    ("die", "died", "death", "passed away", "funeral"),
    ("school", "college", "university", "class", "course", "degree", "study", "studies"),
    ("teacher", "professor", "instructor", "mentor"),
    ("student", "pupil"),
    ("travel", "trip", "journey", "vacation", "holiday", "visit", "tour"),
    ("buy", "bought", "purchase", "purchased"),
    ("sell", "sold"),
    ("money", "salary", "income", "pay", "wage"),
    ("hobby", "hobbies", "pastime"),
    ("paint", "painting", "art", "artwork", "drawing"),
    ("music", "song", "songs", "band", "concert", "guitar", "piano", "violin"),
    ("book", "books", "novel", "read", "reading"),
    ("movie", "movies", "film", "cinema"),
    ("sport", "sports", "game", "match", "team"),
    ("run", "running", "marathon", "jog", "jogging"),
    ("exercise", "workout", "gym", "fitness", "yoga"),
    ("food", "meal", "dinner", "lunch", "breakfast", "cook", "cooking", "recipe"),
    ("start", "begin", "began", "started", "launch"),
    ("quit", "resign", "leave job", "fired", "laid off"),
    ("happy", "glad", "joy", "excited"),
    ("sad", "upset", "unhappy", "depressed"),
    ("angry", "mad", "furious", "annoyed"),
    ("afraid", "scared", "fear", "anxious", "worried"),
    ("help", "support", "assist", "volunteer", "volunteering"),
    ("charity", "fundraiser", "donation", "nonprofit"),
    ("church", "faith", "religion", "religious"),
    ("birthday", "anniversary", "celebration", "party"),
    ("gift", "gifts"),
    ("photo", "picture", "photograph", "photography"),
    ("phone", "call", "called"),
    ("computer", "laptop", "pc"),
    ("business", "company", "startup", "store", "shop"),
    ("plan", "planning", "goal", "intend"),
    ("new york", "nyc", "new york city"),
    ("san francisco", "sf", "bay area"),
    ("united states", "usa", "america"),
    ("united kingdom", "uk", "britain", "england"),
    ("washington dc", "dc"),
    ("transgender", "trans"),
    ("lgbtq", "lgbt", "pride", "queer", "gay", "lesbian"),
    ("adopt", "adoption", "adopted", "foster"),
    ("camp", "camping", "hike", "hiking", "outdoors", "nature"),
    ("beach", "ocean", "sea", "swim", "swimming"),
    ("garden", "gardening", "plants", "flowers"),
    ("january", "jan"), ("february", "feb"), ("april", "apr"),
    ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sept", "sep"),
    ("october", "oct"), ("november", "nov"), ("december", "dec"),
)

# Words that make a query a question but say nothing about the answer. Recall drops them
# when the query has other words ("When did Caroline move?" -> "Caroline move"): on LoCoMo
# this alone lifts turn R@10 from 0.567 to 0.619. "may" is not here (the month).
QUESTION_WORDS = (
    "what", "when", "where", "who", "whom", "whose", "which", "why", "how", "did", "does", "do", "doing",
    "done", "would", "could", "should", "is", "was", "were", "are", "has", "have", "had", "likely", "might",
    "can", "kind", "type", "sort", "any", "ever",
)

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december")
_MONTH_ABBR = {m[:3]: i + 1 for i, m in enumerate(MONTHS)} | {"sept": 9}
_YEAR = re.compile(r"\b(1[89]\d\d|2[01]\d\d)\b")
_MONTH_WORD = re.compile(r"\b(" + "|".join(MONTHS) + r"|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\b", re.I)
_ISO = re.compile(r"^(\d{4})(?:-(\d{1,2}))?(?:-(\d{1,2}))?")
# an ISO year-month or date in a query ("2023-05", "2023-05-08"), with a real month
_ISO_IN_QUERY = re.compile(r"\b(1[89]\d\d|2[01]\d\d)-(0?[1-9]|1[0-2])(?:-\d{1,2})?\b")
# "may" next to a year, or a day and a year ("May 2023", "May 3, 2023"). One reading of each
# blank run (``\s*(?:,\s*)?``, not ``\s*,?\s*``), so a long run is not rescanned from each blank.
_MAY_DATE = re.compile(r"\bmay\s*(?:,\s*)?(?:\d{1,2}(?:st|nd|rd|th)?\s*(?:,\s*)?)?(1[89]|2[01])\d\d\b", re.I)


@dataclass(frozen=True, order=True)
class QueryDate:
    """A year, optionally with a month (1-12), named in a query or held by a node."""

    year: int
    month: int | None = None

    def proximity(self, other: QueryDate) -> float:
        """1.0 for the same period, falling linearly to 0 at a year's distance."""
        if self.month is not None and other.month is not None:
            months = abs((self.year * 12 + self.month) - (other.year * 12 + other.month))
            return max(0.0, 1.0 - months / 12.0)
        return {0: 1.0, 1: 0.5}.get(abs(self.year - other.year), 0.0)


def query_dates(query: str) -> list[QueryDate]:
    """Years and months named in ``query`` ("May 2023", "May 3, 2023", "in 2022", "2023-05-08");
    sorted, distinct.

    A month with no year is ignored: it is too ambiguous to rank by. An ISO date names its
    own month (its year is no target of its own).
    """
    iso = {m.start(): QueryDate(int(m.group(1)), int(m.group(2))) for m in _ISO_IN_QUERY.finditer(query)}
    years = {int(m.group(1)) for m in _YEAR.finditer(query) if m.start() not in iso}  # an ISO date starts at its year
    months: set[int] = set()
    may_is_month: bool | None = None  # searched once: per "may", a long query would be read again for each
    for m in _MONTH_WORD.findall(query):
        m = m.lower()
        if m == "may":  # mostly the verb; only counted next to a year, or a day and a year ("May 3, 2023")
            if may_is_month is None:
                may_is_month = _MAY_DATE.search(query) is not None
            if not may_is_month:
                continue
        months.add(MONTHS.index(m) + 1 if m in MONTHS else _MONTH_ABBR[m[:4] if m == "sept" else m[:3]])
    out = set(iso.values())
    for y in years:  # distinct years times distinct months: a long query's repeats cost nothing
        if months:
            out.update(QueryDate(y, m) for m in months)
        else:
            out.add(QueryDate(y))
    return sorted(out)


def parse_date(value: str | None) -> QueryDate | None:
    """A node's ``resolved_date`` (ISO ``YYYY``, ``YYYY-MM`` or ``YYYY-MM-DD...``) as a date."""
    if not value:
        return None
    m = _ISO.match(value.strip())
    if not m:
        return None
    month = int(m.group(2)) if m.group(2) else None
    if month is not None and not 1 <= month <= 12:
        month = None
    return QueryDate(int(m.group(1)), month)


class Expander:
    """Synonym expansion over one tokenizer.

    Args:
        tokenizer: the file's tokenizer (members are matched as index terms).
        clusters: the synonym clusters (default :data:`SYNONYM_CLUSTERS`).
        weight: the weight of an added synonym term.
    """

    def __init__(self, tokenizer: Tokenizer, clusters: Sequence[Sequence[str]] = SYNONYM_CLUSTERS,
                 weight: float = EXPANSION_WEIGHT) -> None:
        self.tokenizer = tokenizer
        self.weight = weight
        self._clusters: list[list[tuple[str, ...]]] = []
        self._by_first: dict[str, list[tuple[tuple[str, ...], int]]] = {}
        self._question = frozenset(t for w in QUESTION_WORDS for t in tokenizer(w))
        for members in clusters:
            terms = []
            for member in members:
                toks = tuple(tokenizer(member))
                if toks and toks not in terms:
                    terms.append(toks)
            cid = len(self._clusters)
            self._clusters.append(terms)
            for toks in terms:
                self._by_first.setdefault(toks[0], []).append((toks, cid))

    def drop_question_words(self, terms: Sequence[str]) -> list[str]:
        """``terms`` without question words, unless nothing else is left."""
        kept = [t for t in terms if t not in self._question]
        return kept or list(terms)

    def expand(self, terms: Sequence[str]) -> dict[str, float]:
        """Query term weights: each original term counts 1 per occurrence; synonyms from
        matched clusters add :attr:`weight` (split over a phrase's words), never
        overriding an original term."""
        weights: dict[str, float] = {}
        for t in terms:
            weights[t] = weights.get(t, 0.0) + 1.0
        matched: list[int] = []
        for i, t in enumerate(terms):
            for toks, cid in self._by_first.get(t, ()):
                if tuple(terms[i:i + len(toks)]) == toks and cid not in matched:
                    matched.append(cid)
        extra: dict[str, float] = {}
        for cid in matched:
            for toks in self._clusters[cid]:
                for tok in toks:
                    if tok not in weights:
                        extra[tok] = max(extra.get(tok, 0.0), self.weight / len(toks))
        weights.update(extra)
        return weights
