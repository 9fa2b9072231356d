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
import warnings
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, BinaryIO, NamedTuple, TextIO
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from . import crypto as _crypto
from .codec import MAX_RECORD_BYTES
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
    "encode_zettel_line",
    "encode_tunnel_line",
    "write_dump",
    "read_dump",
    "verify_dump",
    "edge_sort_key",
    "tjson_dumps",
    "tjson_loads",
    "tjson_untag",
    "encrypt_dump",
    "open_encrypted_writer",
    "decrypt_dump",
    "is_encrypted_dump",
]

FORMAT_VERSION = 3
DUMP_HEADER = "FILE:||||v3|dump"
# What one node of a store can take in a dump: its record (codec.MAX_RECORD_BYTES: content,
# quote, metadata, tags, ...) at most 6 characters a byte (a control byte is \u0001), plus
# its vectors (at most MAX_DUMP_SPACES lines of 65,536 float32 in base64, 22.4 Mi characters).
# The old 100 MiB (a 16 Mi-character content, fully escaped) refused the dumps of stores
# holding a larger quote or metadata beside their content: a backup that did not restore.
MAX_LINE_CHARS = 8 * MAX_RECORD_BYTES
MAX_RECORDS = 10**9
_MAX_PRELUDE = 4096
# Limits on hostile input (spec/aaak.md): a dump's @space lines cost nothing to write but
# each automatic space gives every memory a vector, so a 10.7 KB dump declaring 20 automatic
# spaces of 65,536 dims made a 524.5 MB store (issue 16, finding 8). The reader refuses more.
MAX_DUMP_SPACES = 64
MAX_DUMP_DIMS = 65_536  # the store's own limit (index.vectors.MAX_DIMS)
MAX_AUTO_DIMS = 16_384  # all automatic spaces together
_LIMIT_HINT = ("a dump written by engramdb stays within these limits ('Limits on hostile input' in the AAAK "
               "specification); "
               "this one was made or edited elsewhere: do not restore it")
_MAX_TJSON_DEPTH = 64

_TRAILER_RE = re.compile(r"@end (0|[1-9][0-9]{0,17}) ([0-9a-f]{64})")
_FLOAT_RE = re.compile(r"-?(?:[0-9]+\.[0-9]+(?:e[+-][0-9]+)?|[0-9]+e[+-][0-9]+|inf)|nan")
_LEGACY_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# Python refuses int() of more than 4300 digits; stay well below it.
_INT_RE = re.compile(r"-?(?:0|[1-9][0-9]{0,3999})")
_UINT_RE = re.compile(r"0|[1-9][0-9]{0,3999}")
_HEADER_COUNT_RE = re.compile(r"[0-9]{1,9}")
_OFFSETS_RE = re.compile(r"(-?[0-9]*)-(-?[0-9]*)")


class _Err(Exception):
    """A grammar error inside one line; ``col`` is a 0-based offset into the line."""

    def __init__(self, msg: str, col: int = 0, hint: str | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.col = col
        self.hint = hint


def _parse_error(msg: str, lineno: int, col: int = 0, cls: type[AAAKParseError] = AAAKParseError,
                 hint: str | None = None) -> AAAKParseError:
    return cls(msg, line=lineno, column=col + 1, hint=hint)


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
    return pattern.sub(lambda m: table.get(m.group()) or f"\\u{ord(m.group()):04X}", value)


def _unesc(raw: str, col: int = 0) -> str:
    """Undo :func:`_esc`. ``col`` is the field's offset in the line, for error positions.

    Raw control characters are refused per line (:func:`_check_raw`), not per field.
    """
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
        text = _TJSON_FIX_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
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


def tjson_untag(value: Any) -> Any:
    """Turn an already-parsed JSON value with tjson tags (``$bytes``, ``$map``, ``$$``) back into Python values.

    For JSON produced by :func:`tjson_dumps` but parsed by someone else (e.g. a JSONL line).

    Raises:
        AAAKParseError: an unknown ``$`` key, bad base64, or nesting deeper than 64 levels.
    """
    try:
        return _from_tagged(value, 0)
    except (ValueError, TypeError) as exc:
        raise AAAKParseError(f"bad tagged JSON: {exc}") from None


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
        text = f"\\u{ord(zid[0]):04X}" + text[1:]
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


def encode(result: CompressResult, *, version: int = 3) -> str:
    """Serialize a compress result as an AAAK result document.

    ``version=3`` (the default) is engramdb's lossless format: ``decode(encode(r))``
    equals ``r`` (zettels, tunnels, entity index and meta, except the ``warnings`` key),
    and the output is canonical.

    ``version=2`` writes exactly what zettel-compress 1.0.0's ``encode`` writes, byte for
    byte, for tools that read only v2. It carries less (spec/aaak.md section 6.1):
    weights rounded to 2 decimals, no ``resolved_date``, offsets only when both ends are
    set, entity names without a code as their first three letters uppercased, ids,
    tunnel ends and labels unescaped, meta other than ``date``/``title`` dropped, and no
    trailer or final newline.

    Args:
        result: the result to write.
        version: 3 or 2.

    Returns:
        The document text (v3: LF-terminated, ending with the ``@end`` trailer).

    Raises:
        ValidationError: a field has the wrong type, meta holds a value tjson cannot carry,
            or ``version`` is neither 2 nor 3.
    """
    _check_result(result)
    if version == 2:
        return _encode_v2(result)
    if version != 3 or isinstance(version, bool):
        raise ValidationError(f"AAAK version must be 2 or 3, got {version!r}")
    index = result.entity_index
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
    top = "+".join(_entity_token(n, index) for n in _top_entities(result))
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
        sink.line(_tunnel_v3(t))
    sink.finish()
    return out.getvalue()


def _top_entities(result: CompressResult) -> list[str]:
    """The first three distinct entities by first appearance (the header's codes)."""
    seen: list[str] = []
    for z in result.zettels:
        for name in z.entities:
            if name not in seen:
                seen.append(name)
            if len(seen) >= 3:
                return seen
    return seen


def _tunnel_v3(t: Tunnel) -> str:
    return "T:" + _esc(t.from_id, "|<>") + "<->" + _esc(t.to_id, "|<>") + "|" + _esc(t.label, "|")


def _check_index(index: Any) -> None:
    if not isinstance(index, EntityIndex):
        raise ValidationError("entity_index must be an EntityIndex")
    for name in ("code_to_name", "name_to_code"):
        mapping = getattr(index, name)
        if not isinstance(mapping, Mapping) or any(
            not isinstance(k, str) or not isinstance(v, str) for k, v in mapping.items()
        ):
            raise ValidationError(f"entity_index.{name} must map strings to strings")


def _check_tunnel(t: Any) -> None:
    if not isinstance(t, Tunnel):
        raise ValidationError(f"tunnels must be Tunnel objects, got {type(t).__name__}")
    for name in ("from_id", "to_id", "label"):
        _check_str(f"tunnel {name}", getattr(t, name))


def _check_result(result: Any) -> None:
    if not isinstance(result, CompressResult):
        raise ValidationError(f"encode() takes a CompressResult, got {type(result).__name__}")
    _check_index(result.entity_index)
    for z in result.zettels:
        _check_zettel(z)
    for t in result.tunnels:
        _check_tunnel(t)


# --- AAAK v2, exactly as zettel-compress 1.0.0 writes it (spec section 6.1) -----------
# Its escapes are plain string replacements, backslash first; each field escapes its own set.
_V2_QUOTE = (("\\", "\\\\"), ('"', '\\"'), ("\r", "\\r"), ("\n", "\\n"))
_V2_FIELD = (("\\", "\\\\"), ("|", "\\|"), ("\r", "\\r"), ("\n", "\\n"))
_V2_TOPIC = (("\\", "\\\\"), (",", "\\,"), ("|", "\\|"), (" ", "\\_"), ("\r", "\\r"), ("\n", "\\n"))
_V2_NAME = (("\\", "\\\\"), (";", "\\;"), ("=", "\\="), ("\r", "\\r"), ("\n", "\\n"))


def _replace_all(value: str, table: tuple[tuple[str, str], ...]) -> str:
    for old, new in table:
        value = value.replace(old, new)
    return value


def _js_fixed2(value: float) -> str:
    """JavaScript's ``Number.prototype.toFixed(2)``: round half away from zero on the
    exact binary value (Python's ``%.2f`` rounds half to even), ``NaN``/``Infinity`` spelled
    as JavaScript does, and ``String(x)`` from 1e21 up."""
    x = float(value)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if abs(x) >= 1e21:
        return repr(x)  # JavaScript's exponent form for these is Python's repr
    if x == 0:
        return "0.00"  # -0 is not below zero for toFixed
    fixed = format(Decimal(x).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP), "f")
    return fixed


def _js_code(name: str, index: EntityIndex) -> str:
    """zettel-compress's entity code: ``nameToCode[name] ?? name.slice(0, 3).toUpperCase()``
    (three UTF-16 code units, as JavaScript slices strings)."""
    code = index.name_to_code.get(name)
    if code is not None:
        return code
    units = name.encode("utf-16-le", "surrogatepass")[:6]
    return units.decode("utf-16-le", "surrogatepass").upper()


def _js_sorted(keys: Iterable[str]) -> list[str]:
    """JavaScript's default ``Array.prototype.sort``: by UTF-16 code units."""
    return sorted(keys, key=lambda k: k.encode("utf-16-be", "surrogatepass"))


def encode_zettel_line(zettel: Zettel, entity_index: EntityIndex | None = None, *, version: int = 3) -> str:
    """One zettel as an AAAK zettel line (no newline).

    ``version=2`` is zettel-compress's ``encodeZettelLine`` exactly; ``version=3`` is the
    line :func:`encode` writes (entities as codes of ``entity_index`` where it has them).

    Raises:
        ValidationError: a field has the wrong type, or ``version`` is neither 2 nor 3.
    """
    _check_zettel(zettel)
    index = entity_index if entity_index is not None else EntityIndex()
    _check_index(index)
    z = zettel
    if version == 2:
        codes = "+".join(_js_code(name, index) for name in z.entities)
        topics = ",".join(_replace_all(t, _V2_TOPIC) for t in z.topics)
        span = f"|{z.source_start}-{z.source_end}" if z.source_start is not None and z.source_end is not None else ""
        return (f'{z.id}:{codes}|{topics}|"{_replace_all(z.quote, _V2_QUOTE)}"|{_js_fixed2(z.weight)}'
                f'|{"+".join(z.emotions)}|{"+".join(z.flags)}{span}')
    if version != 3 or isinstance(version, bool):
        raise ValidationError(f"AAAK version must be 2 or 3, got {version!r}")
    return _zettel_fields(z.id, z.entities, z.topics, z.quote, z.weight, z.emotions, z.flags,
                          z.source_start, z.source_end, z.resolved_date, index)


def encode_tunnel_line(tunnel: Tunnel, *, version: int = 3) -> str:
    """One tunnel as an AAAK ``T:`` line (no newline); ``version=2`` is zettel-compress's
    ``encodeTunnelLine`` exactly (ends and label unescaped).

    Raises:
        ValidationError: a field has the wrong type, or ``version`` is neither 2 nor 3.
    """
    _check_tunnel(tunnel)
    if version == 2:
        return f"T:{tunnel.from_id}<->{tunnel.to_id}|{tunnel.label}"
    if version != 3 or isinstance(version, bool):
        raise ValidationError(f"AAAK version must be 2 or 3, got {version!r}")
    return _tunnel_v3(tunnel)


def _v2_text(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValidationError(f"meta[{key!r}] must be a string for AAAK v2, got {type(value).__name__}")
    return _replace_all(value, _V2_FIELD)


def _encode_v2(result: CompressResult) -> str:
    index = result.entity_index
    meta = result.meta or {}
    top = "+".join(_js_code(name, index) for name in _top_entities(result))
    lines = [f"FILE:{len(result.zettels):03d}|{top}|{_v2_text(meta, 'date')}|{_v2_text(meta, 'title')}|v2"]
    if index.code_to_name:
        lines.append("E:" + ";".join(f"{c}={_replace_all(index.code_to_name[c], _V2_NAME)}"
                                     for c in _js_sorted(index.code_to_name)))
    lines.extend(encode_zettel_line(z, index, version=2) for z in result.zettels)
    lines.extend(encode_tunnel_line(t, version=2) for t in result.tunnels)
    return "\n".join(lines)


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
            out.append((_unesc(item, col + off), literal))
    return out


def _parse_zettel_line(line: str, *, v3: bool) -> _ZettelParts:
    """Parse a v2 or v3 zettel line (v1 has its own parser)."""
    colon = _find_unescaped(line, ":", 0)
    if colon < 0:
        raise _Err("not a zettel line: no ':' after the id", 0)
    zid = _unesc(line[:colon], 0)
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
    quote = _unesc(rest[1:close], rest_col + 1)
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
        emotions = [_unesc(x, after_col + e_col) for x, _ in _split(emotions_raw, "+") if x]
        flags = [_unesc(x, after_col + f_col) for x, _ in _split(flags_raw, "+") if x]
        topics = [_unesc(x, topics_col + o) for x, o in _split(topics_raw, ",") if x]
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
        pairs.append((_unesc(code, off + c_off), _unesc(name, off + n_off)))
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


def decode(text: str | bytes, *, strict: bool = False) -> CompressResult:
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
        if len(fields) >= 5 and fields[4] == "v3" and (first != 0 or lines[0] != head):
            raise AAAKParseError(
                "an AAAK v3 document must start with its header line and use LF line endings",
                line=first + 1, column=1,
                hint="the file was re-indented or converted to CRLF; convert it back (e.g. dos2unix)",
            )
        if len(fields) >= 5 and fields[4] == "v3":
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


def _check_raw(line: str) -> None:
    """A v3 line never holds raw CR, TAB or characters of the \\u set (they are escaped)."""
    bad = _RAW_FORBIDDEN_RE.search(line)
    if bad:
        raise _Err(f"raw control character U+{ord(bad.group()):04X} must be escaped", bad.start())


class _Collector:
    """Strict mode raises; lenient mode records ``line N: message`` warnings."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.warnings: list[str] = []

    def report(self, lineno: int, err: _Err, cls: type[AAAKParseError] = AAAKParseError) -> None:
        if self.strict:
            raise _parse_error(err.msg, lineno, err.col, cls)
        self.warnings.append(f"line {lineno}: {err.msg}")


def _build_zettels(parsed: list[tuple[int, _ZettelParts]], code_to_name: Mapping[str, str],
                   col: _Collector) -> list[Zettel]:
    """Zettels from parsed lines; unknown emotion or flag tokens are reported and dropped."""
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
    return zettels


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
                    date = _unesc(fields[2], 0) if v2 else fields[2]
                if len(fields) > 3 and fields[3]:
                    title = _unesc(fields[3], 0) if v2 else fields[3]
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
    missing: dict[str, int] = {}
    for lineno, p in parts_list:
        for tok, _ in p.entities:
            if tok not in code_to_name and tok not in missing:
                missing[tok] = lineno
    for tok, lineno in missing.items():
        if v2:  # zettel-compress's v2 reader warns about it too (its strict mode throws)
            col.report(lineno, _Err(f"entity code {tok!r} is missing from the E: index", 0))
        code_to_name[tok] = tok  # the name falls back to the code, and the index keeps it (v1, v2)
    zettels = _build_zettels(parts_list, code_to_name, col)
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
        _check_raw(header)
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
            _check_raw(line)
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
    zettels = _build_zettels(parsed, code_to_name, col)
    if declared is not None and declared != len(zettels):
        col.report(1, _Err(f"the header declares {declared} zettels but {len(zettels)} were read", 5))
    name_to_code = names if names is not None else _inverse_index(code_to_name)
    if col.warnings:
        meta["warnings"] = col.warnings
    return CompressResult(zettels, tunnels, EntityIndex(name_to_code, code_to_name), meta)


# --- store dumps (spec section 4) ----------------------------------------------------

_SPACE_KEYS = ("name", "model", "dims", "dtype", "normalized")


@dataclass(frozen=True)
class DumpHeader:
    """What precedes the nodes of a dump: everything needed to create the store.

    Attributes:
        version: the AAAK version (3).
        settings: the ``@set`` lines (e.g. ``tokenizer`` -> config dict).
        meta: the ``@meta`` lines (generic key/value).
        spaces: one dict per embedding space (``name``, ``model``, ``dims``, ``dtype``,
            ``normalized`` and any extra keys), sorted by name.
    """

    version: int
    settings: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    spaces: tuple[dict[str, Any], ...] = ()


class ArchiveRow(NamedTuple):
    """An archive row: a node id and its original (pre-archive) content."""

    id: str
    content: str


@dataclass(frozen=True)
class ProcedureRow:
    """One procedure row: an opaque msgpack-able dict."""

    data: dict[Any, Any]


@dataclass(frozen=True)
class DumpSummary:
    """What :func:`verify_dump` found in a dump that passed every check."""

    header: DumpHeader
    records: int
    nodes: int
    edges: int
    archive: int
    procedures: int
    sha256: str


DumpItem = DumpHeader | Node | Edge | ArchiveRow | ProcedureRow


def _opt_sort(value: float | None) -> tuple[int, float, str]:
    return (0, 0.0, "") if value is None else (1, value, repr(value))


def edge_sort_key(edge: Edge) -> tuple[Any, ...]:
    """The canonical order of edges in a dump (spec section 4).

    ``None`` sorts before any number; ``-0.0`` before ``0.0`` (by repr) so the order is total.
    """
    return (
        edge.src, edge.dst, edge.kind, edge.weight, repr(edge.weight), edge.created_at,
        repr(edge.created_at), _opt_sort(edge.valid_from), _opt_sort(edge.valid_to), edge.label,
    )


def _check_space(space: Any) -> dict[str, Any]:
    if not isinstance(space, Mapping):
        raise ValidationError("each space must be a dict with name, model, dims, dtype, normalized")
    missing = [k for k in _SPACE_KEYS if k not in space]
    if missing:
        raise ValidationError(f"space {space.get('name')!r} lacks {', '.join(missing)}")
    name, model, dims, dtype, normalized = (space[k] for k in _SPACE_KEYS)
    if not isinstance(name, str) or not name:
        raise ValidationError("space name must be a non-empty string")
    for key, value in (("model", model), ("dtype", dtype)):
        if not isinstance(value, str):
            raise ValidationError(f"space {name!r}: {key} must be a string")
    if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
        raise ValidationError(f"space {name!r}: dims must be a positive integer")
    if not isinstance(normalized, bool):
        raise ValidationError(f"space {name!r}: normalized must be a bool")
    for key in space:
        if not isinstance(key, str):
            raise ValidationError(f"space {name!r}: keys must be strings")
    return dict(space)


def _space_line(space: dict[str, Any]) -> str:
    parts = [
        _esc(space["name"]), _esc(space["model"]), str(space["dims"]), _esc(space["dtype"]),
        "1" if space["normalized"] else "0",
    ]
    extra = {k: v for k, v in space.items() if k not in _SPACE_KEYS}
    if extra:
        parts.append(tjson_dumps(extra))
    return "@space " + "|".join(parts)


def _vector_b64(vec: Iterable[float]) -> str:
    return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")


def _node_lines(node: Node, spaces: Mapping[str, dict[str, Any]]) -> list[str]:
    nid = _esc(node.id)
    lines = [
        _zettel_fields(
            node.id, node.entities, node.topics, node.quote, node.weight, node.emotions, node.flags,
            node.source_start, node.source_end, node.resolved_date, None,
        ),
        "@n " + "|".join((
            nid, node.tier, _fmt_float(node.importance), _fmt_float(node.created_at),
            _fmt_float(node.last_accessed), str(node.access_count), "1" if node.pinned else "0",
            _enc_list(node.tags, ",", "|,"), _esc(node.source),
        )),
        "@c " + nid + "|" + _esc(node.content),
    ]
    if node.metadata:
        lines.append("@m " + nid + "|" + tjson_dumps(node.metadata))
    for space_name in sorted(node.embeddings):
        vec = node.embeddings[space_name]
        space = spaces.get(space_name)
        if space is None:
            raise EmbeddingError(f"node {node.id!r} has an embedding in undeclared space {space_name!r}")
        if len(vec) != space["dims"]:
            raise EmbeddingError(
                f"node {node.id!r}: embedding {space_name!r} has {len(vec)} dims, the space has {space['dims']}"
            )
        lines.append("@v " + nid + "|" + _esc(space_name) + "|" + _vector_b64(vec))
    return lines


def _edge_line(edge: Edge) -> str:
    return "@e " + "|".join((
        _esc(edge.src), _esc(edge.dst), edge.kind, _fmt_float(edge.weight), _fmt_float(edge.created_at),
        "" if edge.valid_from is None else _fmt_float(edge.valid_from),
        "" if edge.valid_to is None else _fmt_float(edge.valid_to),
        _esc(edge.label),
    ))


def write_dump(
    fp: TextIO | BinaryIO,
    *,
    settings: Mapping[str, Any],
    spaces: Iterable[Mapping[str, Any]],
    nodes: Iterable[Node],
    edges: Iterable[Edge] = (),
    archive: Iterable[tuple[str, str]] = (),
    procedures: Iterable[Mapping[Any, Any]] = (),
    meta: Mapping[str, Any] | None = None,
) -> int:
    """Stream a whole store to ``fp`` as a canonical AAAK v3 dump.

    Ordering contract: ``nodes`` and ``archive`` are streamed and MUST already be in
    ascending id order (LMDB key order of UTF-8 ids is exactly that); a violation raises
    before anything out of order is written. ``settings``, ``meta``, ``spaces``, ``edges``
    and ``procedures`` are sorted here (they are held in memory: O(number of edges)).

    Args:
        fp: a writable text stream (or binary stream; UTF-8 is written).
        settings: store settings (``@set`` lines), e.g. ``{"tokenizer": {...}}``.
        spaces: embedding spaces: dicts with ``name``, ``model``, ``dims``, ``dtype``,
            ``normalized`` (extra keys are kept).
        nodes: every node, in ascending id order.
        edges: every edge (any order; duplicates are refused).
        archive: ``(id, original_content)`` pairs in ascending id order.
        procedures: procedure rows (msgpack-able dicts), any order.
        meta: optional generic key/value map (``@meta`` lines).

    Returns:
        The record count written in the trailer: the number of lines between the
        header and the trailer.

    If an error is raised part-way, what was already written has no trailer, so no
    reader will ever accept it as a dump; delete it.

    Raises:
        ValidationError: a record of the wrong type, out of order or duplicated, or a
            value tjson cannot carry.
        EmbeddingError: an embedding in an undeclared space or with the wrong dims.
    """
    if not isinstance(settings, Mapping):
        raise ValidationError("settings must be a dict")
    meta = {} if meta is None else meta
    if not isinstance(meta, Mapping):
        raise ValidationError("meta must be a dict")
    space_map: dict[str, dict[str, Any]] = {}
    for space in spaces:
        checked = _check_space(space)
        if checked["name"] in space_map:
            raise ValidationError(f"space {checked['name']!r} is declared twice")
        space_map[checked["name"]] = checked
    for kind, mapping in (("settings", settings), ("meta", meta)):
        if len(mapping) > _MAX_PRELUDE:
            raise ValidationError(f"more than {_MAX_PRELUDE} {kind} keys")
        for key in mapping:
            _check_str(f"{kind} key", key)
    if len(space_map) > MAX_DUMP_SPACES:
        raise ValidationError(f"more than {MAX_DUMP_SPACES} embedding spaces: the dump could not be restored",
                              hint="remove embedding spaces you do not use before dumping")
    if sum(s["dims"] for s in space_map.values() if s.get("auto") is True) > MAX_AUTO_DIMS:
        raise ValidationError(f"the automatic embedding spaces have more than {MAX_AUTO_DIMS} dims in total: "
                              "the dump could not be restored",
                              hint="remove automatic embedding spaces you do not use before dumping")
    edge_list = list(edges)
    for edge in edge_list:
        if not isinstance(edge, Edge):
            raise ValidationError(f"edges must be Edge objects, got {type(edge).__name__}")
    edge_list.sort(key=edge_sort_key)
    proc_lines = []
    for proc in procedures:
        if not isinstance(proc, Mapping):
            raise ValidationError(f"procedure rows must be dicts, got {type(proc).__name__}")
        proc_lines.append("@p " + tjson_dumps(proc))
    proc_lines.sort()

    sink = _Sink(fp)
    sink.line(DUMP_HEADER)
    for key in sorted(settings):
        sink.line("@set " + _esc(key) + "|" + tjson_dumps(settings[key]))
    for key in sorted(meta):
        sink.line("@meta " + _esc(key) + "|" + tjson_dumps(meta[key]))
    for name in sorted(space_map):
        sink.line(_space_line(space_map[name]))
    last: str | None = None
    for node in nodes:
        if not isinstance(node, Node):
            raise ValidationError(f"nodes must be Node objects, got {type(node).__name__}")
        if last is not None and node.id <= last:
            raise ValidationError(
                f"nodes must come in ascending id order without duplicates: {node.id!r} after {last!r}"
            )
        last = node.id
        for line in _node_lines(node, space_map):
            sink.line(line)
    prev_key = None
    for edge in edge_list:
        edge_key = edge_sort_key(edge)
        if edge_key == prev_key:
            raise ValidationError(f"duplicate edge {edge.src!r} -> {edge.dst!r} ({edge.kind})")
        prev_key = edge_key
        sink.line(_edge_line(edge))
    last = None
    for row in archive:
        if not isinstance(row, tuple) or len(row) != 2:
            raise ValidationError("archive rows must be (id, content) pairs")
        aid, content = row
        _check_str("archive id", aid)
        _check_str("archive content", content)
        if not aid:
            raise ValidationError("archive ids must be non-empty")
        if last is not None and aid <= last:
            raise ValidationError(f"archive rows must come in ascending id order without duplicates: {aid!r}")
        last = aid
        sink.line("@a " + _esc(aid) + "|" + _esc(content))
    for line in proc_lines:
        sink.line(line)
    return sink.finish()


# --- reading dumps -------------------------------------------------------------------


_DECRYPT_HINT = ("pass engramdb.aaak.decrypt_dump(open(path, 'rb'), passphrase) instead, or run "
                 "`engramdb restore` (its passphrase from ENGRAM_DUMP_PASSPHRASE or --dump-passphrase-file)")


def _starts_encrypted(fp: Any) -> bool:
    """Whether a binary stream starts (at its position) with the encrypted-dump magic, read
    without consuming it: a peek, or a read and a seek back; False when neither is possible."""
    try:
        if hasattr(fp, "peek"):
            return is_encrypted_dump(fp.peek(len(ENCRYPTED_MAGIC)))
        if fp.seekable():
            at = fp.tell()
            head = fp.read(len(ENCRYPTED_MAGIC))
            fp.seek(at)
            return isinstance(head, (bytes, bytearray)) and is_encrypted_dump(bytes(head))
    except (OSError, ValueError, AttributeError):
        pass
    return False


def _as_text_stream(fp: Any) -> tuple[TextIO, bool]:
    """(text stream, whether we wrapped a caller's binary stream and must detach it)."""
    if isinstance(fp, str):
        return io.StringIO(fp, newline="\n"), False
    if isinstance(fp, (bytes, bytearray)):
        fp = io.BytesIO(bytes(fp))
    if isinstance(fp, (io.RawIOBase, io.BufferedIOBase)) or "b" in getattr(fp, "mode", ""):
        if _starts_encrypted(fp):
            raise AAAKParseError("this is an encrypted dump (it starts with AAAK-ENC): it must be decrypted first",
                                 line=1, column=1, hint=_DECRYPT_HINT)
        # newline="\n": split on LF only and translate nothing, so the hash sees the real bytes.
        return io.TextIOWrapper(fp, encoding="utf-8", errors="strict", newline="\n"), True
    if not hasattr(fp, "readline"):
        raise AAAKParseError("the dump must be a readable file object or text", hint="open the file and pass it")
    return fp, False


_SECTION = {"@set": 1, "@meta": 2, "@space": 3, "node": 4, "@e": 5, "@a": 6, "@p": 7}
_NODE_EXT = ("@n", "@c", "@m", "@v")


def _edited(message: str) -> None:
    """Report what ``allow_edited`` let through (a UserWarning; the CLI prints it)."""
    warnings.warn(f"edited dump: {message}", UserWarning, stacklevel=3)


class _DumpReader:
    """State machine over the lines of a dump; see :func:`read_dump`."""

    def __init__(self, fp: Any, allow_edited: bool, max_line_chars: int, max_records: int) -> None:
        self.fp, self._wrapped = _as_text_stream(fp)
        self.allow_edited = allow_edited
        self.max_line_chars = max_line_chars
        self.max_records = max_records
        self.hasher = hashlib.sha256()
        self.lineno = 0
        self.records = 0
        self.counts = {"nodes": 0, "edges": 0, "archive": 0, "procedures": 0}
        self.digest = ""

    def error(self, msg: str, col: int = 0, cls: type[AAAKParseError] = AAAKParseError,
              hint: str | None = None) -> AAAKParseError:
        return _parse_error(msg, self.lineno, col, cls, hint)

    def next_line(self) -> str | None:
        """The next line without its LF, or None at a clean end of input."""
        try:
            raw = self.fp.readline(self.max_line_chars + 1)
        except UnicodeDecodeError as exc:
            raise _parse_error(f"not UTF-8 text: {exc.reason}", self.lineno + 1,
                               hint=_DECRYPT_HINT.replace("pass ", "if it is an encrypted dump (it starts with "
                                                                   "AAAK-ENC), pass ", 1)
                               if self.lineno == 0 else None) from None
        except EngramError:
            raise
        except (OSError, ValueError) as exc:
            raise AAAKParseError(f"cannot read the dump: {exc}", line=self.lineno + 1) from None
        if not isinstance(raw, str):
            raise AAAKParseError("the dump stream returned bytes; open it in text mode or pass a binary file")
        if raw == "":
            return None
        self.lineno += 1
        if not raw.endswith("\n"):
            if len(raw) > self.max_line_chars:
                raise self.error(f"line longer than {self.max_line_chars} characters", self.max_line_chars)
            if not self.allow_edited:
                raise self.error("the last line has no LF: the dump is truncated", len(raw), DumpIntegrityError)
            # an editor that drops the final newline: the line is whole when the trailer follows
            # or it is the trailer; a truncated record still fails (no trailer after it)
            _edited(f"line {self.lineno} has no final LF (accepted: --allow-edited)")
            return raw
        return raw[:-1]

    def run(self) -> Iterator[DumpItem]:
        try:
            yield from self._run()
        finally:
            if self._wrapped and isinstance(self.fp, io.TextIOWrapper):  # _wrapped: always one
                # A TextIOWrapper closes its buffer when collected: hand the caller's file back
                # open (e.g. to seek(0) after verify_dump).
                try:
                    self.fp.detach()
                except (ValueError, OSError):
                    pass

    def _run(self) -> Iterator[DumpItem]:
        first = self.next_line()
        if first is None:
            raise DumpIntegrityError("the dump is empty (no header, no trailer)", line=1, column=1)
        self.hasher.update((first + "\n").encode("utf-8", "surrogatepass"))
        if first != DUMP_HEADER and first.strip() == DUMP_HEADER:
            raise AAAKParseError(
                "the dump header is indented or ends in CR: a dump uses LF line endings only", line=1,
                column=1, hint="the file was converted to CRLF or re-indented; convert it back (e.g. dos2unix)")
        if first != DUMP_HEADER:
            hint = None
            if first.startswith("FILE:"):
                hint = "this looks like a compress result or a zettel-compress file; use `engramdb import`"
            raise AAAKParseError(f"not an AAAK v3 dump: the first line must be {DUMP_HEADER!r}", line=1,
                                 column=1, hint=hint)
        settings: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        spaces: dict[str, dict[str, Any]] = {}
        header_sent = False
        stage = 0
        prelude_size = 0
        auto_dims = 0
        last_key: Any = None
        pending: dict[str, Any] | None = None
        while True:
            line = self.next_line()
            if line is None:
                raise _parse_error("the @end trailer is missing: the dump is truncated", self.lineno + 1, 0,
                                   DumpIntegrityError,
                                   hint="use a complete dump (its last line is `@end`); --allow-edited does not "
                                        "accept a cut-off one, which may have lost memories")
            if line.startswith("@end"):
                if pending is not None:
                    yield self.finish_node(pending)
                    pending = None
                if not header_sent:
                    yield DumpHeader(FORMAT_VERSION, settings, meta, tuple(spaces[k] for k in sorted(spaces)))
                self.check_trailer(line)
                return
            self.hasher.update((line + "\n").encode("utf-8", "surrogatepass"))
            self.records += 1
            if self.records > self.max_records:
                raise self.error(f"more than {self.max_records} records")
            try:
                _check_raw(line)
                tag = line.split(" ", 1)[0] if line.startswith("@") else "node"
                if tag in _NODE_EXT:
                    if pending is None:
                        raise _Err(f"{tag} line without a preceding node line", 0)
                    pending["size"] += len(line)
                    if pending["size"] > self.max_line_chars:
                        raise _Err(f"node {pending['parts'].zid!r} holds more than {self.max_line_chars} "
                                   "characters in total", 0)
                    self.node_ext(pending, tag, line)
                    continue
                if tag not in _SECTION:
                    raise _Err(f"unknown line kind {line[:12]!r}", 0)
                if pending is not None:
                    yield self.finish_node(pending)
                    pending = None
                section = _SECTION[tag]
                if section < stage:
                    raise _Err(f"{tag} line out of order (order: @set, @meta, @space, nodes, @e, @a, @p)", 0)
                if section != stage:
                    last_key = None
                    stage = section
                if section >= 4 and not header_sent:
                    header_sent = True
                    yield DumpHeader(FORMAT_VERSION, settings, meta, tuple(spaces[k] for k in sorted(spaces)))
                if section < 4:
                    prelude_size += len(line)
                    if prelude_size > self.max_line_chars:
                        raise _Err(f"the @set/@meta/@space lines hold more than {self.max_line_chars} characters", 0)
                if tag in ("@set", "@meta"):
                    target = settings if tag == "@set" else meta
                    if len(target) >= _MAX_PRELUDE:
                        raise _Err(f"more than {_MAX_PRELUDE} {tag} lines", 0)
                    parts = _split(line, "|", len(tag) + 1, maxsplit=1)
                    if len(parts) != 2:
                        raise _Err(f"{tag} needs key|value", len(line))
                    (k_raw, k_off), (v_raw, v_off) = parts
                    key = _unesc(k_raw, k_off)
                    if last_key is not None and key <= last_key:
                        raise _Err(f"{tag} keys must be sorted and unique", k_off)
                    last_key = key
                    target[key] = _tjson_loads(v_raw, v_off)
                elif tag == "@space":
                    if len(spaces) >= MAX_DUMP_SPACES:
                        raise _Err(f"more than {MAX_DUMP_SPACES} embedding spaces", 0, _LIMIT_HINT)
                    space = self.parse_space(line)
                    auto_dims += space["dims"] if space.get("auto") is True else 0
                    if auto_dims > MAX_AUTO_DIMS:
                        raise _Err(f"the automatic embedding spaces have more than {MAX_AUTO_DIMS} dims in total "
                                   "(every memory would get a vector that size in each)", 0, _LIMIT_HINT)
                    if last_key is not None and space["name"] <= last_key:
                        raise _Err("@space lines must be sorted by name and unique", 7)
                    last_key = space["name"]
                    spaces[space["name"]] = space
                elif tag == "node":
                    zparts = _parse_zettel_line(line, v3=True)
                    if zparts.zid == "":
                        raise _Err("a node id must not be empty", 0)
                    if last_key is not None and zparts.zid <= last_key:
                        raise _Err("nodes must be sorted by id and unique", 0)
                    last_key = zparts.zid
                    pending = {"parts": zparts, "line": self.lineno, "stage": 0, "spaces": spaces, "size": len(line),
                               "embeddings": {}, "last_space": None}
                elif tag == "@e":
                    edge = self.parse_edge(line)
                    edge_key = edge_sort_key(edge)
                    if last_key is not None and edge_key <= last_key:
                        raise _Err("edges must be sorted and unique", 0)
                    last_key = edge_key
                    self.counts["edges"] += 1
                    yield edge
                elif tag == "@a":
                    parts2 = _split(line, "|", 3, maxsplit=1)
                    if len(parts2) != 2:
                        raise _Err("@a needs id|content", len(line))
                    (i_raw, i_off), (c_raw, c_off) = parts2
                    aid = _unesc(i_raw, i_off)
                    if not aid:
                        raise _Err("an archive id must not be empty", i_off)
                    if last_key is not None and aid <= last_key:
                        raise _Err("archive rows must be sorted by id and unique", i_off)
                    last_key = aid
                    self.counts["archive"] += 1
                    yield ArchiveRow(aid, _unesc(c_raw, c_off))
                else:  # @p
                    if last_key is not None and line < last_key:
                        raise _Err("procedure rows must be sorted", 0)
                    last_key = line
                    value = _tjson_loads(line[3:], 3)
                    if not isinstance(value, dict):
                        raise _Err("a procedure row must be a JSON object", 3)
                    self.counts["procedures"] += 1
                    yield ProcedureRow(value)
            except _Err as err:
                raise self.error(err.msg, err.col, hint=err.hint) from None

    def parse_space(self, line: str) -> dict[str, Any]:
        parts = _split(line, "|", 7)
        if len(parts) not in (5, 6):
            raise _Err("@space needs name|model|dims|dtype|normalized[|extra]", 0)
        name = _unesc(*parts[0])
        if not name:
            raise _Err("a space name must not be empty", parts[0][1])
        space: dict[str, Any] = {
            "name": name, "model": _unesc(*parts[1]), "dims": _parse_int(*parts[2], unsigned=True),
            "dtype": _unesc(*parts[3]),
        }
        if not 0 < space["dims"] <= MAX_DUMP_DIMS:
            raise _Err(f"dims must be in 1..{MAX_DUMP_DIMS}", parts[2][1], _LIMIT_HINT)
        if parts[4][0] not in ("0", "1"):
            raise _Err("normalized must be 0 or 1", parts[4][1])
        space["normalized"] = parts[4][0] == "1"
        if len(parts) == 6:
            extra = _tjson_loads(*parts[5])
            if not isinstance(extra, dict) or not extra or any(k in _SPACE_KEYS for k in extra):
                raise _Err("the extra field must be a non-empty object of other keys", parts[5][1])
            space.update(extra)
        return space

    def parse_edge(self, line: str) -> Edge:
        parts = _split(line, "|", 3)
        if len(parts) != 8:
            raise _Err("@e needs src|dst|kind|weight|created_at|valid_from|valid_to|label", 0)
        (src, s_off), (dst, d_off), (kind, k_off) = parts[:3]
        try:
            return Edge(
                src=_unesc(src, s_off), dst=_unesc(dst, d_off), kind=kind,
                weight=_parse_float(*parts[3]), created_at=_parse_float(*parts[4]),
                valid_from=_parse_opt_float(*parts[5]), valid_to=_parse_opt_float(*parts[6]),
                label=_unesc(*parts[7]),
            )
        except ValidationError as exc:
            raise _Err(exc.message, k_off) from None

    def node_ext(self, pending: dict[str, Any], tag: str, line: str) -> None:
        order = {"@n": 1, "@c": 2, "@m": 3, "@v": 4}[tag]
        allowed = {"@n": (0,), "@c": (1,), "@m": (2,), "@v": (2, 3, 4)}[tag]
        if pending["stage"] not in allowed:
            raise _Err(f"{tag} out of place within node {pending['parts'].zid!r} (order: @n, @c, [@m], @v...)", 0)
        pending["stage"] = order
        start = len(tag) + 1
        parts = _split(line, "|", start, maxsplit={"@n": 8, "@c": 1, "@m": 1, "@v": 2}[tag])
        nid = _unesc(*parts[0])
        if nid != pending["parts"].zid:
            raise _Err(f"{tag} names node {nid!r} inside node {pending['parts'].zid!r}", start)
        if tag == "@n":
            if len(parts) != 9:
                raise _Err("@n needs id|tier|importance|created_at|last_accessed|access_count|pinned|tags|source", 0)
            tier = parts[1][0]
            if tier not in TIERS:
                raise _Err(f"unknown tier {tier[:20]!r}", parts[1][1])
            if parts[6][0] not in ("0", "1"):
                raise _Err("pinned must be 0 or 1", parts[6][1])
            pending.update(
                tier=tier, importance=_parse_float(*parts[2]), created_at=_parse_float(*parts[3]),
                last_accessed=_parse_float(*parts[4]), access_count=_parse_int(*parts[5], unsigned=True),
                pinned=parts[6][0] == "1", tags=_dec_list(parts[7][0], parts[7][1], ","),
                source=_unesc(*parts[8]),
            )
        elif tag == "@c":
            if len(parts) != 2:
                raise _Err("@c needs id|content", len(line))
            pending["content"] = _unesc(*parts[1])
        elif tag == "@m":
            if len(parts) != 2:
                raise _Err("@m needs id|json", len(line))
            value = _tjson_loads(*parts[1])
            if not isinstance(value, dict) or not value:
                raise _Err("@m must hold a non-empty JSON object (omit the line when empty)", parts[1][1])
            pending["metadata"] = value
        else:
            if len(parts) != 3:
                raise _Err("@v needs id|space|base64", len(line))
            space_name = _unesc(*parts[1])
            if pending["last_space"] is not None and space_name <= pending["last_space"]:
                raise _Err("@v lines must be sorted by space and unique", parts[1][1])
            pending["last_space"] = space_name
            space = pending["spaces"].get(space_name)
            if space is None:
                raise _Err(f"embedding space {space_name!r} is not declared by a @space line", parts[1][1])
            try:
                raw = _b64decode(parts[2][0])
            except ValueError as exc:
                raise _Err(str(exc), parts[2][1]) from None
            if len(raw) != 4 * space["dims"]:
                raise _Err(f"vector has {len(raw) / 4:g} dims, space {space_name!r} has {space['dims']}",
                           parts[2][1])
            pending["embeddings"][space_name] = np.frombuffer(raw, dtype="<f4")

    def finish_node(self, pending: dict[str, Any]) -> Node:
        p: _ZettelParts = pending["parts"]
        if pending["stage"] < 2:
            raise _parse_error(f"node {p.zid!r} lacks its {'@n' if pending['stage'] == 0 else '@c'} line",
                               self.lineno)
        if any(literal for _, literal in p.entities):
            raise _parse_error(f"node {p.zid!r}: '=' literal entities are not used in dumps", pending["line"])
        try:
            node = Node(
                id=p.zid, content=pending["content"], entities=tuple(tok for tok, _ in p.entities),
                topics=tuple(p.topics), quote=p.quote, weight=p.weight, flags=tuple(p.flags),
                emotions=tuple(p.emotions),
                source_start=p.start, source_end=p.end, resolved_date=p.resolved_date,
                tier=pending["tier"], importance=pending["importance"], created_at=pending["created_at"],
                last_accessed=pending["last_accessed"], access_count=pending["access_count"],
                pinned=pending["pinned"], tags=pending["tags"], source=pending["source"],
                metadata=pending.get("metadata", {}), embeddings=pending["embeddings"],
            )
        except ValidationError as exc:
            raise _parse_error(f"node {p.zid!r}: {exc.message}", pending["line"]) from None
        self.counts["nodes"] += 1
        return node

    def check_trailer(self, line: str) -> None:
        m = _TRAILER_RE.fullmatch(line)
        if not m:
            raise self.error("malformed trailer; expected '@end <records> <sha256>'")
        if int(m.group(1)) != self.records:
            counted = (f"the trailer counts {m.group(1)} records but {self.records} precede it "
                       "(lines were deleted, duplicated or added)")
            if not self.allow_edited:
                raise self.error(counted, 5, DumpIntegrityError)
            _edited(f"{counted}; accepted: --allow-edited")
        self.digest = self.hasher.hexdigest()
        if not hmac.compare_digest(m.group(2).encode("ascii"), self.digest.encode("ascii")):
            if not self.allow_edited:
                raise self.error("SHA-256 mismatch: the dump was edited or damaged", 6 + len(m.group(1)),
                                 DumpIntegrityError)
            _edited("the SHA-256 in the trailer does not match (accepted: --allow-edited)")
        extra = self.next_line()
        if extra is not None:
            raise self.error("text after the @end trailer")


def read_dump(
    fp: TextIO | BinaryIO | str | bytes,
    *,
    allow_edited: bool = False,
    max_line_chars: int = MAX_LINE_CHARS,
    max_records: int = MAX_RECORDS,
) -> Iterator[DumpItem]:
    """Stream the records of an AAAK v3 dump, validating as it goes.

    Yields a :class:`DumpHeader` first, then :class:`~engramdb.records.Node` (id order),
    :class:`~engramdb.records.Edge`, :class:`ArchiveRow` and :class:`ProcedureRow` items.
    The trailer is checked after the last item: **consume the iterator to the end before
    trusting anything it yielded** (write into a temporary store, or call
    :func:`verify_dump` first on a seekable input).

    Args:
        fp: a text stream, a binary stream (decoded as strict UTF-8), or the dump as str/bytes.
        allow_edited: accept a hand-edited dump: a SHA-256 or record count in the trailer
            that no longer matches, and a last line without its LF, each reported with a
            ``UserWarning``. Grammar, order, uniqueness, caps and the trailer itself are
            still enforced (a dump cut mid-record still fails: its trailer is missing).
        max_line_chars: longest accepted line, in characters.
        max_records: most accepted records (lines between header and trailer).

    Raises:
        AAAKParseError: a grammar, order or value error, with 1-based ``line`` and ``column``.
        DumpIntegrityError: truncation, a wrong record count or SHA-256, or a missing trailer.
    """
    return _DumpReader(fp, allow_edited, max_line_chars, max_records).run()


def verify_dump(
    fp: TextIO | BinaryIO | str | bytes,
    *,
    allow_edited: bool = False,
    max_line_chars: int = MAX_LINE_CHARS,
    max_records: int = MAX_RECORDS,
) -> DumpSummary:
    """Check a whole dump (grammar, order, caps, count, SHA-256) without keeping its records.

    Use it as the first pass of a two-pass restore on a seekable input: verify, seek back
    to the start, then :func:`read_dump`.

    Returns:
        A :class:`DumpSummary` with the header and per-kind counts.

    Raises:
        AAAKParseError: as :func:`read_dump`.
        DumpIntegrityError: as :func:`read_dump`.
    """
    reader = _DumpReader(fp, allow_edited, max_line_chars, max_records)
    header: DumpHeader | None = None
    for item in reader.run():
        if isinstance(item, DumpHeader):
            header = item
    if header is None:  # run() yields the header before it can return; keep the type checker honest
        raise AAAKParseError("the dump has no header")
    return DumpSummary(header, reader.records, reader.counts["nodes"], reader.counts["edges"],
                       reader.counts["archive"], reader.counts["procedures"], reader.digest)


# --- encrypted dumps (spec section 5) ------------------------------------------------

ENCRYPTED_MAGIC = b"AAAK-ENC"
_ENC_VERSION = 1
_KDF_ARGON2ID = 1
_ENC_FIXED = struct.Struct(">8sBBIIB16s7s")  # magic, version, kdf, t, m_kib, p, salt, nonce prefix
_ENC_HEADER_LEN = _ENC_FIXED.size + 32  # + HMAC-SHA256
_CHUNK = 64 * 1024
_TAG = 16
_MAX_CHUNKS = 2**32


def is_encrypted_dump(head: bytes) -> bool:
    """True when ``head`` (the first bytes of a file) starts with the encrypted-dump magic."""
    return bytes(head[: len(ENCRYPTED_MAGIC)]) == ENCRYPTED_MAGIC


def _dump_keys(passphrase: str | bytes, salt: bytes, params: _crypto.KDFParams) -> tuple[bytes, bytes]:
    kek = _crypto.derive_kek(passphrase, salt, params)
    return _crypto.hkdf(kek, b"engramdb/v1/aaak-enc/key"), _crypto.hkdf(kek, b"engramdb/v1/aaak-enc/mac")


def _nonce(prefix: bytes, counter: int, last: bool) -> bytes:
    return prefix + struct.pack(">I", counter) + (b"\x01" if last else b"\x00")


class _EncryptingRaw(io.RawIOBase):
    """A write-only raw stream: plaintext in, STREAM-sealed chunks out to ``out``."""

    def __init__(self, out: BinaryIO, passphrase: str | bytes, params: _crypto.KDFParams) -> None:
        super().__init__()
        salt = os.urandom(16)
        self._prefix = os.urandom(7)
        enc_key, mac_key = _dump_keys(passphrase, salt, params)
        fixed = _ENC_FIXED.pack(ENCRYPTED_MAGIC, _ENC_VERSION, _KDF_ARGON2ID, params.t, params.m_kib, params.p,
                                salt, self._prefix)
        self._header = fixed + hmac.new(mac_key, fixed, hashlib.sha256).digest()
        self._aead = AESGCM(enc_key)
        self._out = out
        self._buf = bytearray()
        self._counter = 0
        self.written = 0
        self._emit(self._header)

    def _emit(self, data: bytes) -> None:
        self._out.write(data)
        self.written += len(data)

    def _seal(self, chunk: bytes, last: bool) -> None:
        if self._counter >= _MAX_CHUNKS:
            raise ValidationError("the dump is too large for one encrypted stream (2**32 chunks)")
        self._emit(self._aead.encrypt(_nonce(self._prefix, self._counter, last), chunk, self._header))
        self._counter += 1

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed encrypted dump")
        view = bytes(data)
        self._buf += view
        # Keep at least one byte back: only close() knows which chunk is the last one.
        while len(self._buf) > _CHUNK:
            self._seal(bytes(self._buf[:_CHUNK]), False)
            del self._buf[:_CHUNK]
        return len(view)

    def close(self) -> None:
        if not self.closed:
            self._seal(bytes(self._buf), True)
            self._buf.clear()
            flush = getattr(self._out, "flush", None)
            if flush is not None:
                flush()
        super().close()


def _kdf_params(kdf: Any) -> _crypto.KDFParams:
    if kdf is None:
        return _crypto.KDFParams.default()
    if isinstance(kdf, _crypto.KDFParams):
        return kdf
    if isinstance(kdf, Mapping):
        # unvalidated here: KDFParams.check() refuses a missing or non-integer value (WeakKDFError)
        t: Any = kdf.get("t")
        p: Any = kdf.get("p")
        return _crypto.KDFParams(t=t, m_kib=kdf.get("m_kib", kdf.get("m")), p=p)
    raise ValidationError("kdf must be a crypto.KDFParams or a dict with t, m_kib, p")


def open_encrypted_writer(out_fp: BinaryIO, passphrase: str | bytes, *, kdf: Any = None) -> TextIO:
    """A writable text stream whose UTF-8 bytes are encrypted into ``out_fp``.

    Pass it to :func:`write_dump`, then ``close()`` it (or use ``with``): closing seals
    the final chunk; ``out_fp`` itself stays open.

    Args:
        out_fp: a binary stream to write the container to.
        passphrase: the passphrase (str is NFC-normalized, as for store files).
        kdf: argon2id parameters (:class:`engramdb.crypto.KDFParams` or a dict); default t=3, m=64 MiB, p=4.

    Raises:
        WeakKDFError: parameters below the floor or above the cap.
        ValidationError: an empty passphrase.
    """
    params = _kdf_params(kdf)
    raw = _EncryptingRaw(out_fp, passphrase, params)
    return io.TextIOWrapper(io.BufferedWriter(raw, buffer_size=_CHUNK), encoding="utf-8", newline="\n",
                            write_through=False)


def encrypt_dump(source: Any, out_fp: BinaryIO, passphrase: str | bytes, *, kdf: Any = None) -> int:
    """Encrypt a plaintext dump into the AAAK-ENC container (spec section 5).

    Args:
        source: the dump as str or bytes, an iterable of str/bytes chunks, or a readable
            text or binary file.
        out_fp: binary stream receiving the container.
        passphrase: the passphrase.
        kdf: argon2id parameters, as for :func:`open_encrypted_writer`.

    Returns:
        The number of bytes written to ``out_fp``.

    Raises:
        WeakKDFError: parameters below the floor or above the cap.
        ValidationError: an empty passphrase or a source of the wrong type.
    """
    raw = _EncryptingRaw(out_fp, passphrase, _kdf_params(kdf))
    try:
        if isinstance(source, (str, bytes, bytearray)):
            chunks: Iterable[Any] = [source]
        elif hasattr(source, "read"):
            chunks = iter(lambda: source.read(_CHUNK), source.read(0))
        else:
            chunks = source
        for chunk in chunks:
            if isinstance(chunk, str):
                chunk = chunk.encode("utf-8")
            elif not isinstance(chunk, (bytes, bytearray, memoryview)):
                raise ValidationError(f"cannot encrypt a {type(chunk).__name__}; pass str or bytes")
            raw.write(chunk)
    finally:
        raw.close()
    return raw.written


# The errors' default hints are about the store (its passphrase, `engramdb verify FILE`);
# an encrypted dump has its own passphrase and no verify command, so say so here.
_DUMP_PASSPHRASE_HINT = ("check the dump passphrase (ENGRAM_DUMP_PASSPHRASE or --dump-passphrase-file): the one "
                         "given to `engramdb dump --encrypt`, not the store's")
_DUMP_DAMAGED_HINT = "the encrypted dump is truncated or damaged; use an intact copy of the dump"


class _DecryptingRaw(io.RawIOBase):
    """A read-only raw stream over the chunks of an AAAK-ENC container."""

    def __init__(self, src: BinaryIO, enc_key: bytes, header: bytes, prefix: bytes) -> None:
        super().__init__()
        self._src = src
        self._aead = AESGCM(enc_key)
        self._header = header
        self._prefix = prefix
        self._counter = 0
        self._plain = b""
        self._pos = 0
        self._done = False
        self._ahead = b""

    def readable(self) -> bool:
        return True

    def _read_exact(self, n: int) -> bytes:
        parts = [self._ahead] if self._ahead else []
        have = len(self._ahead)
        self._ahead = b""
        while have < n:
            data = self._src.read(n - have)
            if not data:
                break
            parts.append(data)
            have += len(data)
        return b"".join(parts)

    def _next_chunk(self) -> None:
        sealed = self._read_exact(_CHUNK + _TAG)
        if len(sealed) < _TAG:
            raise DecryptionError("the encrypted dump is truncated (no final chunk)", hint=_DUMP_DAMAGED_HINT)
        self._ahead = self._read_exact(1)
        last = not self._ahead
        if self._counter >= _MAX_CHUNKS:
            raise DecryptionError("too many chunks in the encrypted dump", hint=_DUMP_DAMAGED_HINT)
        try:
            plain = self._aead.decrypt(_nonce(self._prefix, self._counter, last), sealed, self._header)
        except InvalidTag:
            what = "truncated or tampered with" if last else "tampered with"
            raise DecryptionError(f"chunk {self._counter} of the encrypted dump failed authentication: "
                                  f"the file was {what}", hint=_DUMP_DAMAGED_HINT) from None
        if last and not plain and self._counter > 0:
            raise DecryptionError("the encrypted dump ends with an empty chunk (not written by engramdb)",
                                  hint=_DUMP_DAMAGED_HINT)
        self._counter += 1
        self._plain, self._pos = plain, 0
        self._done = last

    def readinto(self, buffer: Any) -> int:
        while self._pos >= len(self._plain):
            if self._done:
                return 0
            self._next_chunk()
        n = min(len(buffer), len(self._plain) - self._pos)
        buffer[:n] = self._plain[self._pos:self._pos + n]
        self._pos += n
        return n


def decrypt_dump(in_fp: BinaryIO | bytes, passphrase: str | bytes) -> TextIO:
    """Open an AAAK-ENC container: checks the header now, decrypts chunks lazily.

    The returned text stream raises :class:`DecryptionError` from ``read``/``readline``
    as soon as a chunk fails authentication, including truncation. Feed it to
    :func:`read_dump`, which then checks the dump's own trailer.

    Args:
        in_fp: a binary stream positioned at the magic (or the container as bytes).
        passphrase: the passphrase.

    Returns:
        A UTF-8 text stream of the plaintext dump.

    Raises:
        ForeignFileError: not an encrypted AAAK dump.
        FormatVersionError: a container version or KDF this version does not know.
        WeakKDFError: KDF parameters in the header are below the floor or above the cap.
        WrongPassphraseError: the passphrase does not match (or the header was damaged).
    """
    if isinstance(in_fp, (bytes, bytearray)):
        in_fp = io.BytesIO(bytes(in_fp))
    header = in_fp.read(_ENC_HEADER_LEN)
    if not isinstance(header, bytes):
        raise ValidationError("decrypt_dump needs a binary stream (open the file with 'rb')")
    if not is_encrypted_dump(header):
        raise ForeignFileError("not an encrypted AAAK dump (bad magic)",
                               hint="a plaintext dump is read with read_dump(); check the path")
    if len(header) < _ENC_HEADER_LEN:
        raise DecryptionError("the encrypted dump header is truncated", hint=_DUMP_DAMAGED_HINT)
    _magic, version, kdf_id, t, m_kib, p, salt, prefix = _ENC_FIXED.unpack(header[: _ENC_FIXED.size])
    if version != _ENC_VERSION:
        raise FormatVersionError(f"encrypted dump container version {version} is not supported")
    if kdf_id != _KDF_ARGON2ID:
        raise FormatVersionError(f"encrypted dump KDF id {kdf_id} is not supported")
    enc_key, mac_key = _dump_keys(passphrase, salt, _crypto.KDFParams(t=t, m_kib=m_kib, p=p))
    expected = hmac.new(mac_key, header[: _ENC_FIXED.size], hashlib.sha256).digest()
    if not hmac.compare_digest(expected, header[_ENC_FIXED.size:]):
        raise WrongPassphraseError("wrong passphrase for this encrypted dump (or its header is damaged)",
                                   hint=_DUMP_PASSPHRASE_HINT)
    raw = _DecryptingRaw(in_fp, enc_key, header, prefix)
    return io.TextIOWrapper(io.BufferedReader(raw, buffer_size=_CHUNK), encoding="utf-8", errors="strict",
                            newline="\n")
