"""Small text helpers shared by the agent layer: content words and environment-noise scrubbing."""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from ..index.tokenize import negations  # shared with forget(query=)

__all__ = ["content_words", "figures", "negations", "overlap", "scrub", "has_noise", "storable"]

# A word: letters and digits of any script (not only ASCII: a Cyrillic or CJK fact has words
# too), with inner _ + # . - and a final + or # (c++, c#, node.js).
_WORD = re.compile(r"[^\W_][\w+#.-]*(?:[^\W_]|[+#])|[^\W_]")
STOPWORDS = frozenset("""
a an the and or but if then else of to in on at by for with from into onto over under as is are was were be been
being this that these those it its it's i me my we our you your he she they them their there here what which who
whom whose when where why how all any both each few more most other some such no nor not only own same so than too
very can will just should would could may might must shall do does did done doing have has had having am let lets
please use using make build write create new also get set add via per about up out one two
""".split())
# Environment noise (spec/agent.md 2.3): absolute paths, temporary directories, home
# directories, hostnames, IP addresses, user@host prompts. None of it carries across sessions.
#
# Written so each run of name characters is read once. The plain forms (kept as the reference in
# tests/test_agent_text.py) started again at every word boundary of a run and read the run to
# its end each time: quadratic on a long run with no "@", ".local" or digit ("1.1.1.1...",
# "ip-1ip-1...", "tmp-tmp-..."; 20,000 chars took a second, 200,000 minutes). A match of those
# starts at the run's first word boundary where it can start at all (or fails in the whole
# run), so these start at the run's start and keep (a group) what comes before that boundary.
# (?=(X))\1 is X matched once, never retried (an atomic group, which Python 3.10 lacks).
_USER_AT_HOST = re.compile(r"(?<![\w.+-])([.+-]*)\w[\w.+-]*@[\w-]+(?:\.[\w-]+)*:[~/][^\s]*")  # user@host:~/dir
_MACHINE = re.compile(r"(?<![\w-])(?=(([\w-]*?)\b(?:ip|host|node|worker|runner|pod)-))\1[\w-]*\d[\w-]*\b",
                      re.IGNORECASE)                                                  # machine names
_TEMP_DIR = re.compile(r"(?<![\w.-])(?=(([\w.-]*?)\b(?:tmp|temp)))\1[\w.-]*\d[\w.-]*\b",
                       re.IGNORECASE)                                                 # tmpab12cd, tmp_x9 dirs
_PLAIN = [
    re.compile(r"(?<![\w.])(?:[A-Za-z]:\\|\\\\)[^\s\"'`,;)]+"),                     # C:\... and \\host\share
    re.compile(r"(?<![\w.~])/(?:tmp|var|private|home|Users|root|opt|usr|etc|mnt|srv|proc|dev|run)"
               r"(?:/[^\s\"'`,;)]*)?"),                                              # absolute POSIX paths
    re.compile(r"(?<![\w/])~/[^\s\"'`,;)]*"),                                        # ~/...
    re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"),                             # IPv4 (and port)
]
# Host names: \b(?:localhost|[\w-]+\.(?:local|lan|internal|localdomain))(?::\d+)?\b, read by
# _host_names (a "localhost" inside a run can end a match mid-run, so no start-of-run form).
_HOST = re.compile(r"\b(?:localhost|[\w-]+\.(?:local|lan|internal|localdomain))(?::\d+)?\b", re.IGNORECASE)
_LOCALHOST = re.compile(r"\blocalhost(?::\d+)?\b", re.IGNORECASE)
_HOST_END = re.compile(r"(?<=[\w-])\.(?:local|lan|internal|localdomain)(?::\d+)?\b", re.IGNORECASE)
_NAME_RUN = re.compile(r"[\w-]+")
_BOUNDARY = re.compile(r"\b")


def _host_names(text: str) -> list[tuple[int, int]]:
    """The spans ``_HOST.sub`` removes, found in linear time.

    ``_HOST`` at ``p`` matches "localhost" there, or else the run of name characters from ``p``
    when the run ends in a host suffix (".lan", ...): whether it does is the run's, not ``p``'s,
    so each run is judged once (``_HOST_END``) and ``_HOST`` is tried only where it matches."""
    ends = [m.start() for m in _HOST_END.finditer(text)]
    if not ends:
        return [m.span() for m in _LOCALHOST.finditer(text)]
    run_start = {m.end(): m.start() for m in _NAME_RUN.finditer(text)}
    runs = [(run_start[q], q) for q in ends]
    spans: list[tuple[int, int]] = []
    pos, i = 0, 0
    local = _LOCALHOST.search(text)
    while True:
        while local is not None and local.start() < pos:
            local = _LOCALHOST.search(text, pos)
        dotted = None
        while i < len(runs):
            start, end = runs[i]
            if end > pos:
                b = _BOUNDARY.search(text, max(start, pos), end)
                if b is not None and b.start() < end:
                    dotted = b.start()
                    break
            i += 1
        m: re.Match[str] | None
        if local is not None and (dotted is None or local.start() <= dotted):
            m = local  # where both could, _HOST tries "localhost" first
        elif dotted is not None:
            m = _HOST.match(text, dotted)
            assert m is not None  # a word boundary in a run ending in a host suffix
        else:
            return spans
        spans.append(m.span())
        pos = m.end()


def _drop_host_names(text: str) -> str:
    spans = _host_names(text)
    if not spans:
        return text
    kept, last = [], 0
    for start, end in spans:
        kept.append(text[last:start])
        last = end
    kept.append(text[last:])
    return "".join(kept)


def _remover(pattern: re.Pattern[str], keep: str = "") -> Callable[[str], str]:
    return lambda text: pattern.sub(keep, text)


# What scrub() removes, in this order (each reads what the previous one left)
_NOISE: list[Callable[[str], str]] = [
    _remover(_USER_AT_HOST, r"\1"),
    *[_remover(pattern) for pattern in _PLAIN],
    _drop_host_names,
    _remover(_MACHINE, r"\2"),
    _remover(_TEMP_DIR, r"\2"),
]


# A lone surrogate (JSON's "\ud83d" of an emoji cut in half) cannot be encoded into the file.
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, so the file can encode it."""
    return _SURROGATE.sub("\ufffd", text)


def content_words(text: str) -> set[str]:
    """Lowercased (NFKC) words of ``text`` without stopwords and one-letter words."""
    return {w for w in _WORD.findall(unicodedata.normalize("NFKC", text).lower()) if len(w) > 1 and w not in STOPWORDS}


# Words that state the fact itself, which an overlap of words cannot weigh: "listen on port 8080"
# and "... 9090", "deploy on Monday" and "... Friday" share all but one word (as maintain's dedupe
# has it, spec/maintenance.md)
_CALENDAR = frozenset((
    "january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
    "november", "december", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))
_FIGURE = re.compile(r"\w+")


def figures(text: str) -> tuple[str, ...]:
    """The words of ``text`` holding a digit or naming a month or weekday (numbers, versions,
    ports, dates, times), lowercased (NFKC), sorted, once each: texts whose figures differ say
    different things."""
    words = _FIGURE.findall(unicodedata.normalize("NFKC", text).lower())
    return tuple(sorted({w for w in words if w in _CALENDAR or any(c.isdigit() for c in w)}))


def overlap(a: set[str], b: set[str]) -> float:
    """Overlap coefficient |a & b| / min(|a|, |b|) (0 when either is empty)."""
    if not a or not b:
        return 0.0
    return len(a & b) / min(len(a), len(b))


def scrub(text: str) -> str:
    """``text`` without environment noise (absolute paths, temp dirs, hostnames, IPs), spaces tidied,
    lone surrogates replaced (:func:`storable`)."""
    text = storable(text)
    for remove in _NOISE:
        text = remove(text)
    text = re.sub(r"\(\s*\)|\[\s*\]", "", text)
    # (?<!...): tried only where a run of blanks starts, else each blank of a long run rescans
    # the rest of it (quadratic: 20,000 blanks took 2 s)
    text = re.sub(r"(?<![ \t])[ \t]+([,.;:!?])(?=\s|$)", r"\1", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def has_noise(text: str) -> bool:
    """Whether ``text`` holds any environment noise :func:`scrub` would remove."""
    return any(remove(text) != text for remove in _NOISE)  # each removes something or nothing
