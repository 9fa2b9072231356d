"""AAAK v3: engramdb's lossless, canonical text format (spec/aaak.md).

Three layers, all pure (no LMDB, no files of their own):

* :func:`encode` / :func:`decode` — one in-memory :class:`~engramdb.records.CompressResult`
  as an AAAK document; ``decode`` also reads zettel-compress AAAK v1 and v2.
* :func:`write_dump` / :func:`read_dump` / :func:`verify_dump` — a whole store as a
  streamed dump: settings, embedding spaces, nodes, edges, archive and procedure rows,
  closed by a trailer with the record count and a SHA-256 of every preceding byte.
* :func:`encrypt_dump` / :func:`open_encrypted_writer` / :func:`decrypt_dump` — the
  passphrase container (argon2id + AES-256-GCM STREAM, 64 KiB chunks).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, NamedTuple, TextIO, Union

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from . import crypto as _crypto
from .errors import (
    AAAKParseError,
    DecryptionError,
    DumpIntegrityError,
    EmbeddingError,
    EngramError,
    ForeignFileError,
    FormatVersionError,
    ValidationError,
    WrongPassphraseError,
)
from .records import (
    ALL_EMOTIONS,
    ALL_FLAGS,
    TIERS,
    CompressResult,
    Edge,
    EntityIndex,
    Node,
    Tunnel,
    Zettel,
)

__all__ = [
    "FORMAT_VERSION",
    "DUMP_HEADER",
    "ENCRYPTED_MAGIC",
    "MAX_LINE_CHARS",
    "MAX_RECORDS",
    "DumpHeader",
    "ArchiveRow",
    "ProcedureRow",
    "DumpSummary",
    "encode",
    "decode",
    "write_dump",
    "read_dump",
    "verify_dump",
    "edge_sort_key",
    "encrypt_dump",
    "open_encrypted_writer",
    "decrypt_dump",
    "is_encrypted_dump",
]

FORMAT_VERSION = 3
DUMP_HEADER = "FILE:||||v3|dump"
# 16 MiB of content fully \uXXXX-escaped is 96 MiB of characters; leave headroom.
MAX_LINE_CHARS = 100 * 1024 * 1024
MAX_RECORDS = 10**9
_MAX_PRELUDE = 4096
_MAX_TJSON_DEPTH = 64

_TRAILER_RE = re.compile(r"@end (0|[1-9][0-9]{0,17}) ([0-9a-f]{64})")
_FLOAT_RE = re.compile(r"-?(?:[0-9]+\.[0-9]+(?:e[+-][0-9]+)?|[0-9]+e[+-][0-9]+|inf)|nan")
_LEGACY_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INT_RE = re.compile(r"-?(?:0|[1-9][0-9]{0,19})")
_UINT_RE = re.compile(r"0|[1-9][0-9]{0,19}")
_HEADER_COUNT_RE = re.compile(r"[0-9]{1,9}")
_OFFSETS_RE = re.compile(r"(-?[0-9]*)-(-?[0-9]*)")


class _Err(Exception):
    """A grammar error inside one line; ``col`` is a 0-based offset into the line."""

    def __init__(self, msg: str, col: int = 0) -> None:
        super().__init__(msg)
        self.msg = msg
        self.col = col


def _parse_error(msg: str, lineno: int, col: int = 0, cls: type[AAAKParseError] = AAAKParseError) -> AAAKParseError:
    return cls(msg, line=lineno, column=col + 1)


# --- escaping (spec section 2) ---------------------------------------------------

# Characters written as \uXXXX: controls other than LF/CR/TAB, DEL, C1, the Unicode line
# separators, BOM and lone surrogates. They never appear raw in a v3 line.
_U_SET = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff"
_RAW_FORBIDDEN_RE = re.compile("[" + _U_SET + "\r\t]")
_SIMPLE_ESC = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNESC = {
    "\\": "\\", "|": "|", '"': '"', ";": ";", "=": "=", ",": ",", "+": "+", ":": ":",
    "<": "<", ">": ">", "@": "@", "n": "\n", "r": "\r", "t": "\t", "_": " ",
}
_ESC_CACHE: dict[str, tuple[re.Pattern[str], dict[str, str]]] = {}


def _escaper(delims: str) -> tuple[re.Pattern[str], dict[str, str]]:
    cached = _ESC_CACHE.get(delims)
    if cached is None:
        table = dict(_SIMPLE_ESC)
        for ch in delims:
            table[ch] = "\\_" if ch == " " else "\\" + ch
        pattern = re.compile("[" + re.escape("\\\n\r\t" + delims) + _U_SET + "]")
        cached = _ESC_CACHE[delims] = (pattern, table)
    return cached


def _esc(value: str, delims: str = "|") -> str:
    """Escape ``value`` for a field whose delimiters are ``delims`` (see spec section 2)."""
    pattern, table = _escaper(delims)
    if not pattern.search(value):
        return value
    return pattern.sub(lambda m: table.get(m.group()) or "\\u%04X" % ord(m.group()), value)


def _unesc(raw: str, col: int = 0, *, v3: bool = True) -> str:
    """Undo :func:`_esc`. ``col`` is the field's offset in the line, for error positions."""
    if v3:
        bad = _RAW_FORBIDDEN_RE.search(raw)
        if bad:
            raise _Err(f"raw control character U+{ord(bad.group()):04X} must be escaped", col + bad.start())
    if "\\" not in raw:
        return raw
    out: list[str] = []
    i = 0
    n = len(raw)
    while True:
        j = raw.find("\\", i)
        if j < 0:
            out.append(raw[i:])
            break
        out.append(raw[i:j])
        if j + 1 >= n:
            raise _Err("a lone backslash ends the field", col + j)
        c = raw[j + 1]
        simple = _UNESC.get(c)
        if simple is not None:
            out.append(simple)
            i = j + 2
        elif c == "u":
            hexdigits = raw[j + 2:j + 6]
            if len(hexdigits) != 4 or any(h not in "0123456789ABCDEF" for h in hexdigits):
                raise _Err("\\u must be followed by 4 uppercase hex digits", col + j)
            out.append(chr(int(hexdigits, 16)))
            i = j + 6
        elif c == "~":
            raise _Err("\\~ (the empty item) must be a whole list item", col + j)
        else:
            raise _Err(f"unknown escape \\{c}", col + j)
    return "".join(out)


def _split(s: str, sep: str, start: int = 0, maxsplit: int = -1) -> list[tuple[str, int]]:
    """Split ``s`` on unescaped ``sep``; returns (raw field, offset) pairs."""
    out: list[tuple[str, int]] = []
    begin = pos = start
    while maxsplit != 0:
        j = s.find(sep, pos)
        if j < 0:
            break
        k = j
        while k > begin and s[k - 1] == "\\":
            k -= 1
        if (j - k) % 2:  # an odd run of backslashes escapes the separator
            pos = j + 1
            continue
        out.append((s[begin:j], begin))
        begin = pos = j + 1
        maxsplit -= 1
    out.append((s[begin:], begin))
    return out


def _find_unescaped(s: str, ch: str, start: int) -> int:
    pos = start
    while True:
        j = s.find(ch, pos)
        if j < 0:
            return -1
        k = j
        while k > start and s[k - 1] == "\\":
            k -= 1
        if (j - k) % 2 == 0:
            return j
        pos = j + 1


# --- lists, floats, ints -------------------------------------------------------------


def _enc_list(items: Iterable[str], sep: str, delims: str) -> str:
    return sep.join(_esc(item, delims) if item else "\\~" for item in items)


def _dec_list(raw: str, col: int, sep: str) -> list[str]:
    if raw == "":
        return []
    out = []
    for item, off in _split(raw, sep):
        if item == "\\~":
            out.append("")
        elif item == "":
            raise _Err("empty list item (write \\~ for the empty string)", col + off)
        else:
            out.append(_unesc(item, col + off))
    return out


def _fmt_float(value: float) -> str:
    return repr(float(value))


def _parse_float(tok: str, col: int) -> float:
    if len(tok) > 32 or not _FLOAT_RE.fullmatch(tok):
        raise _Err(f"bad number {tok[:40]!r}", col)
    value = float(tok)
    if repr(value) != tok:
        raise _Err(f"number {tok!r} is not in canonical form (expected {value!r})", col)
    return value


def _parse_opt_float(tok: str, col: int) -> float | None:
    return None if tok == "" else _parse_float(tok, col)


def _parse_int(tok: str, col: int, *, unsigned: bool = False) -> int:
    if not (_UINT_RE if unsigned else _INT_RE).fullmatch(tok) or tok == "-0":
        raise _Err(f"bad integer {tok[:40]!r}", col)
    return int(tok)


# --- tjson: typed canonical JSON (spec section 3.4) ---------------------------------

_TJSON_FIX_RE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff]")


def _to_tagged(value: Any, depth: int) -> Any:
    if depth > _MAX_TJSON_DEPTH:
        raise ValidationError(f"value nests deeper than {_MAX_TJSON_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError("NaN and infinity cannot be written to AAAK")
        return float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [_to_tagged(v, depth + 1) for v in value]
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {("$" + k if k.startswith("$") else k): _to_tagged(v, depth + 1) for k, v in value.items()}
        pairs = [[_to_tagged(k, depth + 1), _to_tagged(v, depth + 1)] for k, v in value.items()]
        pairs.sort(key=lambda p: _dumps(p[0]))
        return {"$map": pairs}
    raise ValidationError(f"cannot write a {type(value).__name__} to AAAK; use JSON-like values or bytes")


def _dumps(tagged: Any) -> str:
    text = json.dumps(tagged, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if _TJSON_FIX_RE.search(text):
        text = _TJSON_FIX_RE.sub(lambda m: "\\u%04x" % ord(m.group()), text)
    return text


def tjson_dumps(value: Any) -> str:
    """The canonical tjson text of ``value`` (spec section 3.4).

    Raises:
        ValidationError: the value holds a type tjson cannot carry, NaN, or nests too deeply.
    """
    return _dumps(_to_tagged(value, 0))


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _from_tagged(value: Any, depth: int) -> Any:
    if depth > _MAX_TJSON_DEPTH:
        raise ValueError(f"nests deeper than {_MAX_TJSON_DEPTH} levels")
    if isinstance(value, list):
        return [_from_tagged(v, depth + 1) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and "$bytes" in value:
        text = value["$bytes"]
        if not isinstance(text, str):
            raise ValueError("$bytes must hold a base64 string")
        return _b64decode(text)
    if len(value) == 1 and "$map" in value:
        pairs = value["$map"]
        if not isinstance(pairs, list) or any(not isinstance(p, list) or len(p) != 2 for p in pairs):
            raise ValueError("$map must hold [key, value] pairs")
        out: dict[Any, Any] = {}
        for k, v in pairs:
            key = _from_tagged(k, depth + 1)
            try:
                if key in out:
                    raise ValueError(f"duplicate key {key!r} in $map")
            except TypeError as exc:
                raise ValueError("a $map key must be hashable") from exc
            out[key] = _from_tagged(v, depth + 1)
        return out
    result = {}
    for k, v in value.items():
        if k.startswith("$$"):
            k = k[1:]
        elif k.startswith("$"):
            raise ValueError(f"unknown tagged key {k!r}")
        result[k] = _from_tagged(v, depth + 1)
    return result


def tjson_loads(text: str) -> Any:
    """Parse canonical tjson text.

    Raises:
        AAAKParseError: malformed, non-canonical, duplicate keys, NaN, or too deep.
    """
    try:
        return _tjson_loads(text, 0)
    except _Err as exc:
        raise AAAKParseError(exc.msg, column=exc.col + 1) from None


def _tjson_loads(text: str, col: int) -> Any:
    try:
        raw = json.loads(text, object_pairs_hook=_pairs_hook, parse_constant=_reject_constant)
        value = _from_tagged(raw, 0)
    except RecursionError:
        raise _Err("JSON nests too deeply", col) from None
    except (ValueError, TypeError) as exc:
        pos = getattr(exc, "pos", 0) or 0
        raise _Err(f"bad JSON: {exc}", col + pos) from None
    try:
        canonical = _dumps(_to_tagged(value, 0))
    except ValidationError as exc:
        raise _Err(exc.message, col) from None
    if canonical != text:
        raise _Err("JSON is not in canonical form (sorted keys, no spaces, shortest floats)", col)
    return value


def _b64decode(text: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"bad base64: {exc}") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError("base64 is not in canonical (padded, standard alphabet) form")
    return raw


# --- output sink: hashing, counting, buffered writes ---------------------------------


class _Sink:
    """Writes lines to a text or binary stream, hashing every byte and counting records."""

    _FLUSH_AT = 1 << 20

    def __init__(self, fp: Any) -> None:
        if not hasattr(fp, "write"):
            raise ValidationError("the output must be a writable file object")
        self._fp = fp
        self._binary = isinstance(fp, (io.RawIOBase, io.BufferedIOBase)) or "b" in getattr(fp, "mode", "")
        self._hash = hashlib.sha256()
        self._buf: list[str] = []
        self._size = 0
        self.records = -1  # the header line is not a record

    def line(self, text: str) -> None:
        data = text + "\n"
        self._hash.update(data.encode("utf-8"))
        self._buf.append(data)
        self._size += len(data)
        self.records += 1
        if self._size >= self._FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            chunk = "".join(self._buf)
            self._fp.write(chunk.encode("utf-8") if self._binary else chunk)
            self._buf.clear()
            self._size = 0

    def finish(self) -> int:
        count = self.records
        trailer = f"@end {count} {self._hash.hexdigest()}\n"
        self._buf.append(trailer)
        self.flush()
        return count


# --- result documents: encode ------------------------------------------------------


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {type(value).__name__}")
    return value


def _check_str_list(name: str, value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValidationError(f"{name} must be a list of strings")
    for item in value:
        _check_str(name + " item", item)
    return list(value)


def _inverse_index(code_to_name: Mapping[str, str]) -> dict[str, str]:
    inverse: dict[str, str] = {}
    for code in sorted(code_to_name):
        inverse[code_to_name[code]] = code  # a later code wins (spec 3.1)
    return inverse


def _entity_token(name: str, index: EntityIndex | None) -> str:
    delims = "|+=;"
    if index is not None:
        code = index.name_to_code.get(name)
        if code is not None and index.code_to_name.get(code) == name:
            return _esc(code, delims) if code else "\\~"
        if name in index.code_to_name:
            return "=" + (_esc(name, delims) if name else "\\~")
    return _esc(name, delims) if name else "\\~"


def _zettel_id_text(zid: str) -> str:
    text = _esc(zid, "|:")
    if zid in ("E", "T", "FILE") or zid.startswith("@"):
        text = "\\u%04X" % ord(zid[0]) + text[1:]
    return text


def _zettel_fields(
    zid: str, entities: Iterable[str], topics: Iterable[str], quote: str, weight: float,
    emotions: Iterable[str], flags: Iterable[str], start: int | None, end: int | None,
    resolved_date: str | None, index: EntityIndex | None,
) -> str:
    parts = [
        _zettel_id_text(zid) + ":" + "+".join(_entity_token(n, index) for n in entities),
        _enc_list(topics, ",", "|, "),
        '"' + _esc(quote, '"') + '"',
        _fmt_float(weight),
        _enc_list(emotions, "+", "|+"),
        _enc_list(flags, "+", "|+"),
    ]
    if start is not None or end is not None or resolved_date is not None:
        if start is None and end is None:
            parts.append("")
        else:
            parts.append(("" if start is None else str(start)) + "-" + ("" if end is None else str(end)))
    if resolved_date is not None:
        parts.append(_esc(resolved_date, "|"))
    return "|".join(parts)


def _check_zettel(z: Any) -> None:
    if not isinstance(z, Zettel):
        raise ValidationError(f"zettels must be Zettel objects, got {type(z).__name__}")
    _check_str("zettel id", z.id)
    for name in ("entities", "topics", "emotions", "flags"):
        _check_str_list(f"zettel {name}", getattr(z, name))
    _check_str("zettel quote", z.quote)
    if isinstance(z.weight, bool) or not isinstance(z.weight, (int, float)):
        raise ValidationError("zettel weight must be a number")
    for name in ("source_start", "source_end"):
        value = getattr(z, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValidationError(f"zettel {name} must be an int or None")
    if z.resolved_date is not None:
        _check_str("zettel resolved_date", z.resolved_date)


def encode(result: CompressResult) -> str:
    """Serialize a compress result as an AAAK v3 result document.

    Lossless: ``decode(encode(r))`` equals ``r`` (zettels, tunnels, entity index and
    meta, except the ``warnings`` key), and the output is canonical.

    Args:
        result: the result to write.

    Returns:
        The document text, LF-terminated, ending with the ``@end`` trailer.

    Raises:
        ValidationError: a field has the wrong type, or meta holds a value tjson cannot carry.
    """
    if not isinstance(result, CompressResult):
        raise ValidationError(f"encode() takes a CompressResult, got {type(result).__name__}")
    index = result.entity_index
    if not isinstance(index, EntityIndex):
        raise ValidationError("entity_index must be an EntityIndex")
    for name in ("code_to_name", "name_to_code"):
        mapping = getattr(index, name)
        if not isinstance(mapping, Mapping) or any(
            not isinstance(k, str) or not isinstance(v, str) for k, v in mapping.items()
        ):
            raise ValidationError(f"entity_index.{name} must map strings to strings")
    for z in result.zettels:
        _check_zettel(z)
    for t in result.tunnels:
        if not isinstance(t, Tunnel):
            raise ValidationError(f"tunnels must be Tunnel objects, got {type(t).__name__}")
        for name in ("from_id", "to_id", "label"):
            _check_str(f"tunnel {name}", getattr(t, name))
    meta = dict(result.meta or {})
    meta.pop("warnings", None)
    header_fields = []
    for key in ("date", "title"):
        value = meta.get(key)
        if isinstance(value, str) and value:
            header_fields.append(_esc(value, "|"))
            del meta[key]
        else:
            header_fields.append("")
    seen: list[str] = []
    for z in result.zettels:
        for name in z.entities:
            if name not in seen:
                seen.append(name)
            if len(seen) >= 3:
                break
        if len(seen) >= 3:
            break
    top = "+".join(_entity_token(n, index) for n in seen)
    out = io.StringIO()
    sink = _Sink(out)
    sink.line(f"FILE:{len(result.zettels):03d}|{top}|{header_fields[0]}|{header_fields[1]}|v3")
    for key in sorted(meta, key=_key_order):
        _check_str("meta key", key)
        sink.line("@meta " + _esc(key, "|") + "|" + tjson_dumps(meta[key]))
    if index.code_to_name:
        pairs = sorted(index.code_to_name.items())
        sink.line("E:" + ";".join(_esc(c, "|;=") + "=" + _esc(n, "|;=") for c, n in pairs))
    if dict(index.name_to_code) != _inverse_index(index.code_to_name):
        sink.line("@names " + tjson_dumps(dict(index.name_to_code)))
    for z in result.zettels:
        sink.line(_zettel_fields(
            z.id, z.entities, z.topics, z.quote, z.weight, z.emotions, z.flags,
            z.source_start, z.source_end, z.resolved_date, index,
        ))
    for t in result.tunnels:
        sink.line("T:" + _esc(t.from_id, "|<>") + "<->" + _esc(t.to_id, "|<>") + "|" + _esc(t.label, "|"))
    sink.finish()
    return out.getvalue()


def _key_order(key: Any) -> tuple[int, str]:
    # Non-string keys are refused later with a clear message; sorting must not fail first.
    return (0, key) if isinstance(key, str) else (1, repr(key))


# --- result documents: decode --------------------------------------------------------


@dataclass
class _ZettelParts:
    zid: str
    entities: list[tuple[str, bool]]  # (token, literal)
    topics: list[str]
    quote: str
    weight: float
    emotions: list[str]
    flags: list[str]
    start: int | None
    end: int | None
    resolved_date: str | None


def _parse_entity_items(raw: str, col: int, *, v3: bool) -> list[tuple[str, bool]]:
    if raw == "":
        return []
    out = []
    for item, off in _split(raw, "+"):
        literal = False
        if v3 and item.startswith("="):
            literal, item, off = True, item[1:], off + 1
        if item == "\\~" and v3:
            out.append(("", literal))
        elif item == "":
            if v3:
                raise _Err("empty entity item (write \\~ for the empty string)", col + off)
            continue  # v2 drops empty codes
        else:
            out.append((_unesc(item, col + off, v3=v3), literal))
    return out


def _parse_zettel_line(line: str, *, v3: bool) -> _ZettelParts:
    """Parse a v2 or v3 zettel line (v1 has its own parser)."""
    colon = _find_unescaped(line, ":", 0)
    if colon < 0:
        raise _Err("not a zettel line: no ':' after the id", 0)
    zid = _unesc(line[:colon], 0, v3=v3)
    if v3 and zid in ("E", "T", "FILE") and line[0] != "\\":
        raise _Err("this id must be written with its first character escaped", 0)
    head = _split(line, "|", colon + 1, maxsplit=2)
    if len(head) != 3:
        raise _Err("a zettel line needs entities|topics|\"quote\"|weight|emotions|flags", len(line))
    (ents_raw, ents_col), (topics_raw, topics_col), (rest, rest_col) = head
    if not rest.startswith('"'):
        raise _Err('the quote must start with "', rest_col)
    close = _find_unescaped(rest, '"', 1)
    if close < 0:
        raise _Err("the quote is not closed", rest_col + len(rest))
    quote = _unesc(rest[1:close], rest_col + 1, v3=v3)
    after = rest[close + 1:]
    after_col = rest_col + close + 1
    if not after.startswith("|"):
        raise _Err("expected | after the quote", after_col)
    tail = _split(after, "|", 1)
    max_fields = 5 if v3 else 4
    if not 3 <= len(tail) <= max_fields:
        raise _Err(f"expected 3 to {max_fields} fields after the quote, got {len(tail)}", after_col)
    (w_raw, w_col) = tail[0]
    w_col += after_col
    if v3:
        weight = _parse_float(w_raw, w_col)
    else:
        if not _LEGACY_FLOAT_RE.fullmatch(w_raw):
            raise _Err(f"bad weight {w_raw[:40]!r}", w_col)
        weight = float(w_raw)
    emotions_raw, e_col = tail[1]
    flags_raw, f_col = tail[2]
    if v3:
        emotions = _dec_list(emotions_raw, after_col + e_col, "+")
        flags = _dec_list(flags_raw, after_col + f_col, "+")
        topics = _dec_list(topics_raw, topics_col, ",")
    else:
        emotions = [_unesc(x, after_col + e_col, v3=False) for x, _ in _split(emotions_raw, "+") if x]
        flags = [_unesc(x, after_col + f_col, v3=False) for x, _ in _split(flags_raw, "+") if x]
        topics = [_unesc(x, topics_col + o, v3=False) for x, o in _split(topics_raw, ",") if x]
    start = end = None
    resolved = None
    if len(tail) >= 4:
        off_raw, off_col = tail[3]
        off_col += after_col
        if off_raw == "":
            if not v3 or len(tail) == 4:
                raise _Err("the offsets field is empty; omit it", off_col)
        else:
            m = _OFFSETS_RE.fullmatch(off_raw)
            if not m:
                raise _Err("offsets must be start-end", off_col)
            left, right = m.groups()
            start = _parse_int(left, off_col) if left else None
            end = _parse_int(right, off_col + len(left) + 1) if right else None
            if start is None and end is None:
                raise _Err("offsets '-' are empty; leave the field empty instead", off_col)
    if len(tail) == 5:
        d_raw, d_col = tail[4]
        resolved = _unesc(d_raw, after_col + d_col)
    return _ZettelParts(
        zid, _parse_entity_items(ents_raw, ents_col, v3=v3), topics, quote, weight,
        emotions, flags, start, end, resolved,
    )


def _resolve_entities(items: list[tuple[str, bool]], code_to_name: Mapping[str, str]) -> list[str]:
    return [tok if literal else code_to_name.get(tok, tok) for tok, literal in items]


def _check_tokens(tokens: list[str], allowed: tuple[str, ...], what: str, col: int, problems: list[_Err]) -> list[str]:
    kept = []
    for tok in tokens:
        if tok in allowed:
            kept.append(tok)
        else:
            problems.append(_Err(f"unknown {what} {tok!r} dropped", col))
    return kept


def _parse_entity_line(line: str, *, v3: bool) -> list[tuple[str, str]]:
    body = line[2:]
    if body == "":
        if v3:
            raise _Err("an empty E: line is not written; drop it", 2)
        return []
    pairs = []
    for item, off in _split(line, ";", 2):
        parts = _split(item, "=", 0, maxsplit=1)
        if len(parts) != 2:
            raise _Err("an entity entry must be CODE=Name", off)
        (code, c_off), (name, n_off) = parts
        pairs.append((_unesc(code, off + c_off, v3=v3), _unesc(name, off + n_off, v3=v3)))
    return pairs


def _parse_tunnel_line(line: str, *, v3: bool) -> Tunnel:
    if v3:
        arrow = line.find("<->", 2)
        while arrow >= 0:
            k = arrow
            while k > 2 and line[k - 1] == "\\":
                k -= 1
            if (arrow - k) % 2 == 0:
                break
            arrow = line.find("<->", arrow + 1)
        if arrow < 0:
            raise _Err("a tunnel line needs <->", 2)
        rest = _split(line, "|", arrow + 3, maxsplit=1)
        if len(rest) != 2:
            raise _Err("a tunnel line needs |label", len(line))
        (to_raw, to_col), (label_raw, l_col) = rest
        return Tunnel(_unesc(line[2:arrow], 2), _unesc(to_raw, to_col), _unesc(label_raw, l_col))
    # v1/v2: ids and label are raw; the label is everything after the first '|'.
    body = line[2:]
    arrow = body.find("<->")
    if arrow < 0:
        raise _Err("a tunnel line needs <->", 2)
    pipe = body.find("|", arrow + 3)
    to = body[arrow + 3:pipe] if pipe >= 0 else body[arrow + 3:]
    label = body[pipe + 1:] if pipe >= 0 else ""
    return Tunnel(body[:arrow], to, label)


def _parse_v1_zettel(line: str) -> _ZettelParts:
    colon = line.find(":")
    if colon < 0 or not line[:colon].isdigit() or not line[:colon].isascii():
        raise _Err("not a v1 zettel line (id must be digits)", 0)
    rest = line[colon + 1:]
    q1 = rest.find('"')
    q2 = rest.rfind('"')
    if q1 < 0 or q1 == q2:
        raise _Err("the quote is missing", colon + 1)
    before = rest[:q1].split("|")
    after = rest[q2 + 1:].split("|")
    codes = before[0] if before else ""
    topics = before[1] if len(before) > 1 else ""
    w_raw = after[1] if len(after) > 1 else "0"
    weight = float(w_raw) if _LEGACY_FLOAT_RE.fullmatch(w_raw) else 0.0
    return _ZettelParts(
        line[:colon], [(c, False) for c in codes.split("+") if c], [t for t in topics.split("_") if t],
        rest[q1 + 1:q2], weight,
        [e for e in (after[2] if len(after) > 2 else "").split("+") if e],
        [f for f in (after[3] if len(after) > 3 else "").split("+") if f],
        None, None, None,
    )


def decode(text: str, *, strict: bool = False) -> CompressResult:
    """Parse an AAAK result document (v3, or zettel-compress v1/v2).

    Args:
        text: the document (``bytes`` are decoded as UTF-8).
        strict: raise on the first problem instead of skipping the line with a warning.

    Returns:
        The result. In lenient mode, problems (malformed lines, header count mismatch,
        unknown emotion or flag tokens, a bad trailer) are listed in ``meta["warnings"]``;
        the key is absent when there were none.

    Raises:
        AAAKParseError: (strict mode) the first problem, with 1-based ``line`` and
            ``column``; in both modes, input that is not text or is a dump document.
        DumpIntegrityError: (strict mode) a v3 trailer whose count or SHA-256 does not match.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AAAKParseError(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    if not isinstance(text, str):
        raise AAAKParseError(f"decode() takes text, got {type(text).__name__}")
    lines = text.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        return CompressResult(meta={"input_length": 0, "chunk_count": 0})
    head = lines[first].strip()
    version = 1
    if head.startswith("FILE:"):
        fields = [f for f, _ in _split(head, "|", 5)]
        if len(fields) >= 5 and fields[4] == "v3" and first == 0 and lines[0] == head:
            if len(fields) >= 6 and fields[5] == "dump":
                raise AAAKParseError(
                    "this is an engramdb store dump, not a compress result", line=1, column=1,
                    hint="restore it with `engramdb restore` (engramdb.aaak.read_dump)",
                )
            return _decode_v3(lines, strict)
        if len(fields) >= 5 and fields[4] == "v2":
            version = 2
        elif len(fields) >= 5 and re.fullmatch(r"v[0-9]+", fields[4]):
            raise AAAKParseError(
                f"unsupported AAAK version {fields[4]}", line=first + 1, column=1,
                hint="upgrade engramdb; this version reads AAAK v1, v2 and v3",
            )
    return _decode_legacy(lines, version, strict)


class _Collector:
    """Strict mode raises; lenient mode records ``line N: message`` warnings."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.warnings: list[str] = []

    def report(self, lineno: int, err: _Err, cls: type[AAAKParseError] = AAAKParseError) -> None:
        if self.strict:
            raise _parse_error(err.msg, lineno, err.col, cls)
        self.warnings.append(f"line {lineno}: {err.msg}")


def _decode_legacy(lines: list[str], version: int, strict: bool) -> CompressResult:
    col = _Collector(strict)
    code_to_name: dict[str, str] = {}
    name_to_code: dict[str, str] = {}
    parts_list: list[tuple[int, _ZettelParts]] = []
    tunnels: list[Tunnel] = []
    date = title = None
    declared: int | None = None
    saw_header = False
    v2 = version == 2
    for i, raw in enumerate(lines):
        lineno = i + 1
        line = raw.strip()
        if not line:
            continue
        try:
            if line.startswith("FILE:"):
                if saw_header:
                    raise _Err("a second FILE: header", 0)
                saw_header = True
                fields = line[5:].split("|") if not v2 else [f for f, _ in _split(line, "|", 5)]
                if fields and _HEADER_COUNT_RE.fullmatch(fields[0]):
                    declared = int(fields[0])
                if len(fields) > 2 and fields[2]:
                    date = _unesc(fields[2], 0, v3=False) if v2 else fields[2]
                if len(fields) > 3 and fields[3]:
                    title = _unesc(fields[3], 0, v3=False) if v2 else fields[3]
                continue
            if not saw_header:
                saw_header = True
                col.report(lineno, _Err("no FILE: header; reading as AAAK v1", 0))
            if line.startswith("E:") and v2:
                for code, name in _parse_entity_line(line, v3=False):
                    code_to_name[code] = name
                continue
            if line.startswith("T:"):
                tunnels.append(_parse_tunnel_line(line, v3=False))
                continue
            parts = _parse_zettel_line(line, v3=False) if v2 else _parse_v1_zettel(line)
            parts_list.append((lineno, parts))
        except _Err as err:
            col.report(lineno, err)
    zettels = []
    for lineno, p in parts_list:
        # v2 rebuilds the index from codes it does not know (identity entries).
        for tok, _ in p.entities:
            if tok not in code_to_name:
                code_to_name[tok] = tok
        problems: list[_Err] = []
        emotions = _check_tokens(p.emotions, ALL_EMOTIONS, "emotion", 0, problems)
        flags = _check_tokens(p.flags, ALL_FLAGS, "flag", 0, problems)
        for err in problems:
            col.report(lineno, err)
        zettels.append(Zettel(
            id=p.zid, entities=_resolve_entities(p.entities, code_to_name), topics=p.topics,
            quote=p.quote, weight=p.weight, emotions=emotions, flags=flags,
            source_start=p.start, source_end=p.end, resolved_date=p.resolved_date,
        ))
    for code, name in code_to_name.items():
        name_to_code[name] = code
    if declared is not None and declared != len(zettels):
        col.report(1, _Err(f"the header declares {declared} zettels but {len(zettels)} were read", 5))
    meta: dict[str, Any] = {"input_length": sum(len(z.quote) for z in zettels), "chunk_count": len(zettels)}
    if date is not None:
        meta["date"] = date
    if title is not None:
        meta["title"] = title
    if col.warnings:
        meta["warnings"] = col.warnings
    return CompressResult(zettels, tunnels, EntityIndex(name_to_code, code_to_name), meta)


_RESULT_ORDER = {"meta": 1, "E": 2, "names": 3, "zettel": 4, "T": 5}


def _result_line_kind(line: str) -> str:
    if line.startswith("@meta "):
        return "meta"
    if line.startswith("@names "):
        return "names"
    if line.startswith("@end"):
        return "end"
    if line.startswith("@"):
        return "unknown"
    if line.startswith("E:"):
        return "E"
    if line.startswith("T:"):
        return "T"
    if line.startswith("FILE:"):
        return "FILE"
    return "zettel"


def _decode_v3(lines: list[str], strict: bool) -> CompressResult:
    col = _Collector(strict)
    hasher = hashlib.sha256()
    header = lines[0]
    hasher.update(header.encode("utf-8", "surrogatepass") + b"\n")
    hfields = _split(header, "|", 5)
    meta: dict[str, Any] = {}
    declared = None
    try:
        if len(hfields) != 5:
            raise _Err("a v3 result header has 5 fields: count|codes|date|title|v3", 0)
        count_raw = hfields[0][0]
        if count_raw:
            if not _HEADER_COUNT_RE.fullmatch(count_raw):
                raise _Err(f"bad zettel count {count_raw[:20]!r}", 5)
            declared = int(count_raw)
        for key, (raw, off) in (("date", hfields[2]), ("title", hfields[3])):
            if raw:
                meta[key] = _unesc(raw, off)
    except _Err as err:
        col.report(1, err)
    code_to_name: dict[str, str] = {}
    names: dict[str, str] | None = None
    parsed: list[tuple[int, _ZettelParts]] = []
    tunnels: list[Tunnel] = []
    stage = 0
    records = 0
    trailer_seen = False
    last_meta: str | None = None
    end = len(lines)
    if lines[-1] == "":
        end -= 1
    else:
        col.report(len(lines), _Err("the document does not end with a newline (truncated?)", len(lines[-1])))
    for i in range(1, end):
        lineno = i + 1
        line = lines[i]
        if trailer_seen:
            col.report(lineno, _Err("text after the @end trailer", 0))
            break
        kind = _result_line_kind(line)
        if kind == "end":
            trailer_seen = True
            m = _TRAILER_RE.fullmatch(line)
            if not m:
                col.report(lineno, _Err("malformed trailer; expected '@end <records> <sha256>'", 0))
                continue
            if int(m.group(1)) != records:
                col.report(lineno, _Err(
                    f"the trailer counts {m.group(1)} records but {records} precede it", 5), DumpIntegrityError)
            elif not hmac.compare_digest(m.group(2).encode("ascii"), hasher.hexdigest().encode("ascii")):
                col.report(lineno, _Err("SHA-256 mismatch: the document was edited or damaged", 6 + len(m.group(1))),
                           DumpIntegrityError)
            continue
        hasher.update(line.encode("utf-8", "surrogatepass") + b"\n")
        records += 1
        try:
            if kind in ("unknown", "FILE"):
                raise _Err(f"unexpected line {line[:20]!r} in a result document", 0)
            rank = _RESULT_ORDER[kind]
            if rank < stage or (rank == stage and kind in ("E", "names")):
                raise _Err(f"{kind} line out of order (order: @meta, E:, @names, zettels, T:)", 0)
            if kind == "meta":
                parts = _split(line, "|", 6, maxsplit=1)
                if len(parts) != 2:
                    raise _Err("@meta needs key|value", len(line))
                (key_raw, k_off), (val_raw, v_off) = parts
                key = _unesc(key_raw, k_off)
                if key in meta:
                    raise _Err(f"duplicate meta key {key!r} (or already in the header)", k_off)
                if last_meta is not None and key <= last_meta:
                    raise _Err("@meta lines must be sorted by key", k_off)
                last_meta = key
                meta[key] = _tjson_loads(val_raw, v_off)
            elif kind == "E":
                for code, name in _parse_entity_line(line, v3=True):
                    if code in code_to_name:
                        raise _Err(f"duplicate entity code {code!r}", 2)
                    code_to_name[code] = name
            elif kind == "names":
                value = _tjson_loads(line[7:], 7)
                if not isinstance(value, dict) or any(
                    not isinstance(k, str) or not isinstance(v, str) for k, v in value.items()
                ):
                    raise _Err("@names must be a JSON object of strings", 7)
                names = value
            elif kind == "zettel":
                parsed.append((lineno, _parse_zettel_line(line, v3=True)))
            else:
                tunnels.append(_parse_tunnel_line(line, v3=True))
            stage = rank
        except _Err as err:
            col.report(lineno, err)
    if not trailer_seen:
        col.report(end + 1, _Err("the @end trailer is missing (truncated?)", 0), DumpIntegrityError)
    zettels = []
    for lineno, p in parsed:
        problems: list[_Err] = []
        emotions = _check_tokens(p.emotions, ALL_EMOTIONS, "emotion", 0, problems)
        flags = _check_tokens(p.flags, ALL_FLAGS, "flag", 0, problems)
        for err in problems:
            col.report(lineno, err)
        zettels.append(Zettel(
            id=p.zid, entities=_resolve_entities(p.entities, code_to_name), topics=p.topics,
            quote=p.quote, weight=p.weight, emotions=emotions, flags=flags,
            source_start=p.start, source_end=p.end, resolved_date=p.resolved_date,
        ))
    if declared is not None and declared != len(zettels):
        col.report(1, _Err(f"the header declares {declared} zettels but {len(zettels)} were read", 5))
    name_to_code = names if names is not None else _inverse_index(code_to_name)
    if col.warnings:
        meta["warnings"] = col.warnings
    return CompressResult(zettels, tunnels, EntityIndex(name_to_code, code_to_name), meta)
