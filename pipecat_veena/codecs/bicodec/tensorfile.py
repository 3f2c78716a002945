"""Reads single tensors of a safetensors file with plain file reads (no memory map).

safetensors' own ``safe_open`` maps the whole file: every tensor read leaves its pages resident
in the process until the handle closes, so loading a 626 MB checkpoint into a 385 MB model peaks
near two copies. Reading each tensor with ``readinto`` into its own buffer keeps the peak at the
model plus one tensor. The format: 8-byte little-endian header length, a JSON header mapping each
name to ``{dtype, shape, data_offsets}``, then the data.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import BinaryIO

import torch

from pipecat_veena.errors import CheckpointError

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER = 100 * 2**20


class TensorFile:
    """An open safetensors file; ``get(name)`` reads one tensor (CPU, its stored dtype)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file: BinaryIO = open(self.path, "rb")  # noqa: SIM115 (closed in close())
            size = self.path.stat().st_size
            (length,) = struct.unpack("<Q", self._file.read(8))
            if not 0 < length <= min(_MAX_HEADER, size - 8):
                raise ValueError(f"header length {length} does not fit a {size}-byte file")
            header = json.loads(self._file.read(length))
            header.pop("__metadata__", None)
            self._entries = {
                name: self._entry(name, e, size - 8 - length) for name, e in header.items()
            }
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
            self.close()
            raise CheckpointError(
                f"{self.path}: cannot read the safetensors file ({e}). Re-download or rebuild "
                "the BiCodec checkpoint."
            ) from e
        self._data_start = 8 + length

    @staticmethod
    def _entry(name: str, entry: dict, data_size: int) -> tuple[torch.dtype, tuple[int, ...], int]:
        dtype = _DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(o) for o in entry["data_offsets"])
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if end - begin != nbytes or not 0 <= begin <= end <= data_size:
            raise ValueError(f"tensor '{name}' has offsets {begin}..{end} outside the data")
        return dtype, shape, begin

    def keys(self) -> set[str]:
        """Names of all tensors in the file."""
        return set(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of tensor ``name`` (no data is read)."""
        return self._entries[name][1]

    def get(self, name: str) -> torch.Tensor:
        """Read tensor ``name`` into a fresh CPU tensor."""
        dtype, shape, begin = self._entries[name]
        tensor = torch.empty(shape, dtype=dtype)
        buffer = memoryview(tensor.view(-1).view(torch.uint8).numpy())
        self._file.seek(self._data_start + begin)
        if self._file.readinto(buffer) != len(buffer):
            raise CheckpointError(f"{self.path}: tensor '{name}' is truncated; rebuild the file.")
        return tensor

    def close(self) -> None:
        """Close the file (idempotent)."""
        file = getattr(self, "_file", None)
        if file is not None:
            file.close()

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
