"""Reading a GGUF file's scalar key-value metadata without its tensors or its tokenizer.

gguf.GGUFReader builds a numpy view of every field and tensor: on the embedded SmolLM2 file
that took 5.0 s (`cProfile` of `GGUFReader(path)`, 2-core CPU host, 2026-12-01), nearly all of
it in the tokenizer's 49,152-entry arrays, for the few scalar keys a server reads at start-up.
This walks the header with `struct` over a memory map, steps over arrays, and keeps only the
scalars under a prefix. The value-type codes come from the gguf package.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from gguf.constants import GGUF_MAGIC, GGUFValueType

_SCALAR = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        text = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int):
        """The value of type `kind` (an array is stepped over and read as None)."""
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item == GGUFValueType.STRING:
                for _ in range(count):
                    n = self.take("<Q")
                    self.pos += n
            elif item in _SCALAR:
                self.pos += count * struct.calcsize(_SCALAR[GGUFValueType(item)])
            else:
                for _ in range(count):
                    self.value(item)
            return None
        return self.take(_SCALAR[GGUFValueType(kind)])


def read_gguf_metadata(path: str | Path, prefix: str = "") -> dict[str, object]:
    """The scalar metadata (numbers, booleans, strings) of the GGUF file `path` whose keys start
    with `prefix`. Raises ValueError when the file is not GGUF version 2 or later, or is cut
    short."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf)
        try:
            if cur.take("<I") != GGUF_MAGIC:
                raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
            version = cur.take("<I")
            if version < 2:
                raise ValueError(f"{path} is GGUF version {version}; version 2 or later is read")
            cur.take("<Q")  # tensor count
            out: dict[str, object] = {}
            for _ in range(cur.take("<Q")):
                key = cur.string()
                value = cur.value(cur.take("<I"))
                if value is not None and key.startswith(prefix):
                    out[key] = value
            return out
        except (struct.error, KeyError) as exc:
            raise ValueError(f"{path}: cannot read its GGUF metadata ({exc})") from None
