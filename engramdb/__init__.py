"""engramdb: an embedded, encrypted, single-file storage engine for LLM memory."""
from __future__ import annotations

__version__ = "0.1.0"
