"""engramdb: an embedded, encrypted, single-file storage engine for LLM memory.

    import engramdb
    with engramdb.open("notes.engram", passphrase="correct horse") as db:
        db.remember("Alice moved to Berlin in 2023", tags=["people"])

The public surface is exactly ``__all__`` (pinned by tests/test_public_api.py).
Note that ``engramdb.compress`` is the function; its implementation lives in the
``engramdb.compress`` subpackage, reachable with ``from engramdb.compress import ...``.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .crypto import KDFParams
from . import aaak
from .aaak import decode, encode, encode_tunnel_line, encode_zettel_line
from .backup import restore
from .compress import (
    CompressStream, compress, compress_many, estimate_tokens, inject_context, merge_results, normalize_weights,
    recall_result,
    result_to_dict, result_to_json, top_zettels, wake_up,
)
from .engram import Engram, Problem, Transaction, import_key, open
from .index.tokenize import Tokenizer
from .index.vectors import HASHED_MODEL, Embedder, EmbeddingSpace, HashedTfidfEmbedder, LocalModelEmbedder
from .fusion import FusionWeights
from .recall import Context, Hit, Passage
from .maintenance.forget import ForgetReceipt
from .maintenance.lifecycle import MaintenanceConfig, MaintenanceReport
from .errors import *  # noqa: F403  (the hierarchy is public; errors.__all__ lists it)
from .errors import __all__ as _error_names
from .records import (
    ALL_EMOTIONS, ALL_FLAGS, EDGE_KINDS, TIERS, CompressResult, Edge, EntityIndex, Node, Tunnel, Zettel,
)

__all__ = [
    "__version__",
    "open",
    "import_key",
    "restore",
    "aaak",
    "encode",
    "decode",
    "encode_zettel_line",
    "encode_tunnel_line",
    "compress",
    "compress_many",
    "recall_result",
    "merge_results",
    "top_zettels",
    "normalize_weights",
    "inject_context",
    "wake_up",
    "estimate_tokens",
    "CompressStream",
    "result_to_dict",
    "result_to_json",
    "Hit",
    "Context",
    "Passage",
    "FusionWeights",
    "Tokenizer",
    "EmbeddingSpace",
    "Embedder",
    "HashedTfidfEmbedder",
    "LocalModelEmbedder",
    "HASHED_MODEL",
    "Engram",
    "Transaction",
    "MaintenanceConfig",
    "MaintenanceReport",
    "Problem",
    "ForgetReceipt",
    "KDFParams",
    "Node",
    "Edge",
    "Zettel",
    "Tunnel",
    "EntityIndex",
    "CompressResult",
    "TIERS",
    "ALL_FLAGS",
    "ALL_EMOTIONS",
    "EDGE_KINDS",
    *_error_names,
]
