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
        "MaintenanceConfig", "MaintenanceReport", "FusionWeights",
    }
    # exactly these names: adding one is a deliberate API change, made here too
    assert set(engramdb.__all__) == core | set(engramdb.errors.__all__)
    assert len(engramdb.__all__) == len(set(engramdb.__all__))
    for name in engramdb.__all__:
        assert hasattr(engramdb, name), name


def test_every_error_is_an_engram_error_with_a_hint():
    for name in engramdb.errors.__all__:
        cls = getattr(engramdb.errors, name)
        assert issubclass(cls, engramdb.EngramError)
        if cls is not engramdb.EngramError:
            assert cls.default_hint, f"{name} has no hint"
            assert cls.__doc__, f"{name} has no docstring"


def test_the_package_ships_its_types_and_mypy_checks_all_of_it_strictly():
    """PEP 561: py.typed is in the package and in its package data; `.ci/lint` runs
    `mypy --strict` over every module, with no module exempted or relaxed."""
    import sys
    from pathlib import Path

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pytest itself depends on tomli before 3.11
        import tomli as tomllib

    assert (Path(engramdb.__file__).resolve().parent / "py.typed").is_file()
    repo = Path(__file__).resolve().parent.parent
    project = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["engramdb"]
    mypy = project["tool"]["mypy"]
    assert mypy["strict"] is True and mypy["files"] == ["engramdb"]
    relaxed = {"ignore_errors", "disallow_untyped_defs", "disallow_any_generics", "check_untyped_defs",
               "disallow_untyped_calls", "disallow_incomplete_defs", "warn_return_any", "strict"}
    for override in mypy.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        assert not any(m == "engramdb" or m.startswith("engramdb.") for m in modules), override
        assert not relaxed & set(override), override
    assert "python -m mypy" in (repo / ".ci" / "lint").read_text(encoding="utf-8")


def test_the_header_constants_are_still_importable_from_the_facade():
    """They moved to engramdb.header; `engramdb.engram.X` keeps working for callers that read them."""
    import engramdb.engram
    from engramdb import header

    for name in ("FORMAT_NAME", "FORMAT_VERSION", "RECOVERY_PREFIX", "KEYFILE_MAGIC", "read_key_file"):
        assert getattr(engramdb.engram, name) is getattr(header, name)


def test_validation_errors_default_hint_does_not_send_every_error_to_node(tmp_path):
    """ValidationError's default hint said "help(engramdb.Node) for fields" for every error
    without a hint of its own, most of them not about a memory's fields (a timeout, a
    threshold, a count). It points to the docstring of the call that raised it."""
    import pytest
    hint = engramdb.ValidationError.default_hint
    assert "Node" not in hint and "docstring" in hint
    with pytest.raises(engramdb.ValidationError) as info:
        engramdb.open(tmp_path / "x.engram", passphrase="pw", timeout="soon")  # type: ignore[arg-type]
    assert "timeout" in info.value.message and "Node" not in str(info.value)
