"""Small text helpers shared by the agent layer: content words and environment-noise scrubbing."""
from __future__ import annotations

import re
import unicodedata

__all__ = ["content_words", "overlap", "scrub", "has_noise", "storable"]

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
_NOISE = [
    re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*:[~/][^\s]*"),                        # user@host:~/dir prompts
    re.compile(r"(?<![\w.])(?:[A-Za-z]:\\|\\\\)[^\s\"'`,;)]+"),                     # C:\... and \\host\share
    re.compile(r"(?<![\w.~])/(?:tmp|var|private|home|Users|root|opt|usr|etc|mnt|srv|proc|dev|run)"
               r"(?:/[^\s\"'`,;)]*)?"),                                              # absolute POSIX paths
    re.compile(r"(?<![\w/])~/[^\s\"'`,;)]*"),                                        # ~/...
    re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"),                             # IPv4 (and port)
    re.compile(r"\b(?:localhost|[\w-]+\.(?:local|lan|internal|localdomain))(?::\d+)?\b", re.IGNORECASE),
    re.compile(r"\b(?:ip|host|node|worker|runner|pod)-[\w-]*\d[\w-]*\b", re.IGNORECASE),  # machine names
    re.compile(r"\b(?:tmp|temp)[\w.-]*\d[\w.-]*\b", re.IGNORECASE),                  # tmpab12cd, tmp_x9 dirs
]


# A lone surrogate (JSON's "\ud83d" of an emoji cut in half) cannot be encoded into the file.
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, so the file can encode it."""
    return _SURROGATE.sub("\ufffd", text)


def content_words(text: str) -> set[str]:
    """Lowercased (NFKC) words of ``text`` without stopwords and one-letter words."""
    return {w for w in _WORD.findall(unicodedata.normalize("NFKC", text).lower()) if len(w) > 1 and w not in STOPWORDS}


def overlap(a: set[str], b: set[str]) -> float:
    """Overlap coefficient |a & b| / min(|a|, |b|) (0 when either is empty)."""
    if not a or not b:
        return 0.0
    return len(a & b) / min(len(a), len(b))


def scrub(text: str) -> str:
    """``text`` without environment noise (absolute paths, temp dirs, hostnames, IPs), spaces tidied,
    lone surrogates replaced (:func:`storable`)."""
    text = storable(text)
    for pattern in _NOISE:
        text = pattern.sub("", text)
    text = re.sub(r"\(\s*\)|\[\s*\]", "", text)
    # (?<!...): tried only where a run of blanks starts, else each blank of a long run rescans
    # the rest of it (quadratic: 20,000 blanks took 2 s)
    text = re.sub(r"(?<![ \t])[ \t]+([,.;:!?])(?=\s|$)", r"\1", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def has_noise(text: str) -> bool:
    """Whether ``text`` holds any environment noise :func:`scrub` would remove."""
    return any(pattern.search(text) for pattern in _NOISE)
