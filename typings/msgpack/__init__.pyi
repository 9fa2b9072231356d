# Type stubs for the parts of msgpack (1.x) that engramdb uses: msgpack ships no inline types,
# and typeshed has none. A decoded value is whatever the bytes held, so unpackb returns Any: that
# is the library boundary, where each caller validates the shape it expects.
from collections.abc import Callable
from typing import Any

version: tuple[int, int, int]

class UnpackException(Exception): ...
class ExtraData(ValueError):
    unpacked: Any
    extra: bytes

class ExtType:
    code: int
    data: bytes
    def __init__(self, code: int, data: bytes) -> None: ...

class Packer:
    def __init__(
        self,
        *,
        default: Callable[[Any], Any] | None = ...,
        use_single_float: bool = ...,
        autoreset: bool = ...,
        use_bin_type: bool = ...,
        strict_types: bool = ...,
        datetime: bool = ...,
        unicode_errors: str | None = ...,
    ) -> None: ...
    def pack(self, obj: Any) -> bytes: ...

def packb(
    o: Any,
    *,
    default: Callable[[Any], Any] | None = ...,
    use_single_float: bool = ...,
    use_bin_type: bool = ...,
    strict_types: bool = ...,
    datetime: bool = ...,
    unicode_errors: str | None = ...,
) -> bytes: ...
def unpackb(
    packed: bytes,
    *,
    raw: bool = ...,
    use_list: bool = ...,
    strict_map_key: bool = ...,
    timestamp: int = ...,
    ext_hook: Callable[[int, bytes], Any] = ...,
    object_hook: Callable[[dict[Any, Any]], Any] | None = ...,
    object_pairs_hook: Callable[[list[tuple[Any, Any]]], Any] | None = ...,
    list_hook: Callable[[list[Any]], Any] | None = ...,
    unicode_errors: str | None = ...,
    max_str_len: int = ...,
    max_bin_len: int = ...,
    max_array_len: int = ...,
    max_map_len: int = ...,
    max_ext_len: int = ...,
) -> Any: ...
