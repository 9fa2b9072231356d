"""Write the seed corpus of fuzz_aaak.py into fuzz/corpus/aaak/ (deterministic).

Seeds: the golden dump and result, the zettel-compress v1/v2 fixtures, and invalid
variants of each (truncated, a flipped byte, a deleted / duplicated / swapped line,
a bad trailer), each prefixed with the target byte that fuzz_aaak.py dispatches on.

    python fuzz/make_corpus.py
"""
from __future__ import annotations

import hashlib
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
OUT = ROOT / "fuzz" / "corpus" / "aaak"


def variants(data: bytes) -> list[bytes]:
    lines = data.splitlines(keepends=True)
    out = [data, data[: len(data) // 2], data[:-1]]
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0x20
    out.append(bytes(flipped))
    if len(lines) > 3:
        out.append(b"".join(lines[:2] + lines[3:]))  # deleted line
        out.append(b"".join(lines[:3] + lines[2:]))  # duplicated line
        out.append(b"".join(lines[:1] + [lines[2], lines[1]] + lines[3:]))  # swapped lines
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    seeds: list[bytes] = []
    for name, modes in (("small.aaak", (2, 3)), ("small_result.aaak", (0, 1)), ("zettel_v2.aaak", (0, 1)),
                        ("zettel_v1.aaak", (0, 1))):
        for variant in variants((GOLDEN / name).read_bytes()):
            seeds.extend(bytes([mode]) + variant for mode in modes)
    seeds.append(b"\x03FILE:||||v3|dump\n@end 0 " + hashlib.sha256(b"FILE:||||v3|dump\n").hexdigest().encode() + b"\n")
    seeds.append(b"\x02FILE:||||v3|dump\n@set k|{\"a\":[1,2.5,{\"$bytes\":\"AA==\"}]}\n@end 1 " + b"0" * 64 + b"\n")
    seeds.append(b"\x00FILE:001||||v3\n\\u0045:\\~+=A|\\~|\"q\\\"\"|1e-300|||-5-|\n@end 1 " + b"0" * 64 + b"\n")
    for seed in seeds:
        (OUT / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    print(f"{len(seeds)} seeds in {OUT}")


if __name__ == "__main__":
    main()
