"""The public surface is pinned: a change here is a deliberate API change."""
import engramdb
import engramdb.errors


def test_all_is_pinned():
    core = {
        "__version__", "open", "import_key", "Engram", "Transaction", "Problem", "KDFParams", "Node", "Edge",
        "Zettel", "Tunnel", "EntityIndex", "CompressResult", "TIERS", "ALL_FLAGS", "ALL_EMOTIONS", "EDGE_KINDS",
        "restore", "aaak", "compress", "compress_many", "merge_results", "top_zettels", "normalize_weights",
        "inject_context", "wake_up", "estimate_tokens", "CompressStream", "result_to_dict", "result_to_json",
        "Hit", "Context", "Passage", "Tokenizer", "EmbeddingSpace",
        "Embedder", "HashedTfidfEmbedder", "LocalModelEmbedder", "HASHED_MODEL", "ForgetReceipt",
        "encode", "decode", "encode_zettel_line", "encode_tunnel_line", "recall_result",
        "MaintenanceConfig", "MaintenanceReport",
    }
    assert core <= set(engramdb.__all__)
    assert set(engramdb.errors.__all__) <= set(engramdb.__all__)
    for name in engramdb.__all__:
        assert hasattr(engramdb, name), name


def test_every_error_is_an_engram_error_with_a_hint():
    for name in engramdb.errors.__all__:
        cls = getattr(engramdb.errors, name)
        assert issubclass(cls, engramdb.EngramError)
        if cls is not engramdb.EngramError:
            assert cls.default_hint, f"{name} has no hint"
            assert cls.__doc__, f"{name} has no docstring"
