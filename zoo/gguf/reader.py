"""A GGUF file read without trusting it: the header (metadata and tensor table) parsed with every
declared length checked against the bytes the file has, typed metadata getters, and tensors
dequantized to torch on request.

GGUF (llama.cpp's format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) is a little-endian
header, ``GGUF`` + version + tensor count + metadata count, then ``key: type, value`` pairs, then one
``name, dims, ggml type, offset`` record per tensor, then the aligned tensor data. Dimensions are
listed fastest first (``ne[0]`` is the row length): torch's shape is their reverse.

Every problem is one :class:`~zoo.io.CheckpointError` naming the file and the key or tensor: a
truncated or corrupt file, a metadata value of another type than the key needs, a length or size
larger than the file (refused before anything is allocated). Nothing read becomes code or a path.
The ``gguf`` package (llama.cpp's own) is needed only to dequantize block formats.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from zoo.io import CheckpointError
from zoo.ranges import FloatRange

MAGIC = b"GGUF"
VERSIONS = (2, 3)
ALIGNMENT = 32  # general.alignment's default
MAX_DIMS = 4  # GGML_MAX_DIMS
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
INTS, FLOATS, BOOL = (0, 1, 2, 3, 4, 5, 10, 11), (6, 12), 7
KINDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "str": "a string",
    "str[]": "an array of strings",
    "int[]": "an array of integers",
    "float[]": "an array of numbers",
}
PLAIN_TYPES = {0: np.float32, 1: np.float16}  # ggml F32, F16; BF16 (30) is read through torch
BF16 = 30
MISSING: Any = object()


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: ``shape`` in torch's order, ``offset`` from the data start."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)


def ggml_type_name(code: int) -> str:
    """``Q4_1``, ``F16``... for a ggml type number (``type 99`` for one gguf does not know)."""
    gguf = _gguf_or_none()
    if gguf is not None and code in set(gguf.GGMLQuantizationType):
        return gguf.GGMLQuantizationType(code).name
    return {0: "F32", 1: "F16", 30: "BF16"}.get(code, f"type {code}")


def _gguf_or_none() -> Any:
    try:
        import gguf
    except ImportError:
        return None
    return gguf


def _block(code: int, where: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of ggml type ``code``."""
    if code in (0, 1, BF16):
        return 1, {0: 4, 1: 2, BF16: 2}[code]
    gguf = _gguf_or_none()
    if gguf is None:
        raise CheckpointError(
            f"{where} is stored as ggml type {code}; reading quantized GGUF tensors needs the gguf "
            "package (pip install gguf)"
        )
    if code not in set(gguf.GGMLQuantizationType):
        raise CheckpointError(
            f"{where}: ggml type {code} is no type the installed gguf package knows; the file is "
            "damaged, or newer than that package (upgrade gguf)"
        )
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(code)]


class _Cursor:
    """Reads little-endian values off the mapped file; running past its end is a CheckpointError."""

    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self.data, self.path, self.pos, self.size = data, path, 0, len(data)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise CheckpointError(
                f"{self.path}: {what} needs {n} bytes at byte {self.pos} but the file has "
                f"{self.size}; the file is truncated or corrupt (download or convert it again)"
            )

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize("<" + fmt)
        self.need(n, what)
        value = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += n
        return value[0] if len(value) == 1 else value

    def string(self, what: str) -> str:
        n = self.unpack("Q", what)
        self.need(n, what)
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise CheckpointError(f"{self.path}: {what} is not UTF-8 text ({error}); the file is corrupt") from None

    def value(self, kind: int, what: str) -> Any:
        if kind in SCALARS:
            return self.unpack(SCALARS[kind], what)
        if kind == STRING:
            return self.string(what)
        if kind == ARRAY:
            return self.array(what)
        raise CheckpointError(
            f"{self.path}: {what} has value type {kind}, which GGUF does not define; the file is corrupt"
        )

    def array(self, what: str) -> tuple[int, Any]:
        """(element type, values): numbers as one numpy array, strings as a list."""
        kind, n = self.unpack("IQ", what)
        if kind in SCALARS:
            size = struct.calcsize(SCALARS[kind])
            self.need(n * size, what)  # refused before allocating
            values = np.frombuffer(
                self.data, dtype=np.dtype(SCALARS[kind]).newbyteorder("<"), count=n, offset=self.pos
            ).copy()
            self.pos += n * size
            return kind, values
        if kind == STRING:
            self.need(n * 8, what)  # every string has at least its length
            return kind, [self.string(f"{what}[{i}]") for i in range(n)]
        raise CheckpointError(f"{self.path}: {what} is an array of value type {kind}, which zoo does not read")


class GGUFFile:
    """An open GGUF file: ``metadata`` (key -> (GGUF value type, value)), ``tensors`` (name ->
    :class:`TensorInfo`). Use as a context manager; :meth:`tensor` reads one tensor's values."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        _check_path(self.path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise CheckpointError(
                    f"{self.path}: {size} bytes is too short for a GGUF file; point at a .gguf model file"
                )
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):  # a caller still holding a view keeps the map alive
            self._map.close()

    def _parse(self) -> None:
        c = _Cursor(self._map, self.path)
        magic = bytes(self._map[:4])
        if magic != MAGIC:
            raise CheckpointError(
                f"{self.path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); point at a .gguf model file"
            )
        c.pos = 4
        version = c.unpack("I", "the version")
        if version not in VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            detail = " (a big-endian file, which zoo does not read)" if swapped in VERSIONS else ""
            raise CheckpointError(
                f"{self.path}: GGUF version {version}{detail} is not read; zoo reads versions 2 and 3"
            )
        n_tensors, n_keys = c.unpack("QQ", "the header")
        c.need(n_keys * 13, f"a header declaring {n_keys} metadata keys")  # key length, type, 1-byte value at least
        self.metadata: dict[str, tuple[int, Any]] = {}
        for i in range(n_keys):
            key = c.string(f"metadata key {i}")
            if key in self.metadata:
                raise CheckpointError(f"{self.path}: metadata key {key!r} appears twice; the file is corrupt")
            kind = c.unpack("I", f"the type of {key}")
            self.metadata[key] = (kind, c.value(kind, f"metadata {key}"))
        c.need(n_tensors * 28, f"a header declaring {n_tensors} tensors")  # name length, dims, type, offset at least
        infos = [self._tensor_info(c) for _ in range(n_tensors)]
        alignment = self.get("general.alignment", "int", ALIGNMENT)
        if alignment <= 0 or alignment & (alignment - 1):
            raise CheckpointError(
                f"{self.path}: general.alignment={alignment} is not a power of two; the file is corrupt"
            )
        self.data_start = -(-c.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for info in infos:
            self._check_extent(info)
            self.tensors[info.name] = info

    def _tensor_info(self, c: _Cursor) -> TensorInfo:
        name = c.string("a tensor name")
        n_dims = c.unpack("I", f"tensor {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise CheckpointError(
                f"{self.path}: tensor {name} declares {n_dims} dimensions (GGUF has 1 to "
                f"{MAX_DIMS}); the file is corrupt"
            )
        dims = c.unpack("Q" * n_dims, f"tensor {name}")
        dims = dims if isinstance(dims, tuple) else (dims,)
        code, offset = c.unpack("IQ", f"tensor {name}")
        per_block, block_bytes = _block(code, f"{self.path}: tensor {name}")
        if dims[0] % per_block:
            raise CheckpointError(
                f"{self.path}: tensor {name} has rows of {dims[0]} values, not a multiple of its "
                f"{ggml_type_name(code)} block ({per_block}); the file is corrupt"
            )
        elements = int(np.prod(dims, dtype=object))
        return TensorInfo(
            name, code, tuple(int(d) for d in reversed(dims)), int(offset), elements // per_block * block_bytes
        )

    def _check_extent(self, info: TensorInfo) -> None:
        if info.name in self.tensors:
            raise CheckpointError(f"{self.path}: tensor {info.name} appears twice; the file is corrupt")
        end = self.data_start + info.offset + info.nbytes
        if end > len(self._map):
            raise CheckpointError(
                f"{self.path}: tensor {info.name} ({info.nbytes} bytes at offset {info.offset}) "
                f"ends past the end of the file ({len(self._map)} bytes); the file is truncated "
                "(download or convert it again)"
            )

    # ---- metadata ------------------------------------------------------------------------------------
    def get(self, key: str, kind: str, default: Any = MISSING, *, within: FloatRange | None = None) -> Any:
        """The value of ``key`` as ``kind`` (see :data:`KINDS`; an int is taken for a float); a
        missing key gives ``default`` (a CheckpointError when there is none), a value of another
        type a CheckpointError naming the key. A float (and each of a float array) is finite, and in
        ``within`` where given, or a CheckpointError naming the key and the range."""
        value = self._get(key, kind, default)
        if kind.startswith("float") and key in self.metadata:
            self._check_floats(key, value, within)
        return value

    def _check_floats(self, key: str, value: Any, within: FloatRange | None) -> None:
        if isinstance(value, np.ndarray):
            bad = np.flatnonzero(~np.isfinite(value))
            if bad.size:
                raise CheckpointError(
                    f"{self.path}: metadata {key}[{bad[0]}]={value[bad[0]]} is not a finite number; the file is corrupt"
                )
            return
        if not math.isfinite(value) or (within is not None and not within.holds(value)):
            allowed = within if within is not None else "be finite"
            raise CheckpointError(
                f"{self.path}: metadata {key}={value} must {allowed}; the file is corrupt or its metadata wrong"
            )

    def _get(self, key: str, kind: str, default: Any) -> Any:
        if key not in self.metadata:
            if default is MISSING:
                raise CheckpointError(
                    f"{self.path}: the metadata has no {key}, which this model needs; the file is "
                    "incomplete (convert it again with llama.cpp)"
                )
            return default
        code, value = self.metadata[key]
        element = value[0] if code == ARRAY else code
        wanted = {"int": INTS, "float": INTS + FLOATS, "bool": (BOOL,), "str": (STRING,)}[kind.removesuffix("[]")]
        if (code == ARRAY) != kind.endswith("[]") or element not in wanted:
            raise CheckpointError(
                f"{self.path}: metadata {key} is {_describe(code, value)}, not {KINDS[kind]}; the "
                "file is damaged or was not written for this architecture"
            )
        if code == ARRAY:
            items = value[1]
            return items.astype(np.float64 if kind == "float[]" else np.int64) if kind != "str[]" else items
        if code == 6:  # float32: its shortest decimal (1e-05, not 9.999999747378752e-06)
            return float(str(np.float32(value)))
        return float(value) if kind == "float" else value

    # ---- tensors -------------------------------------------------------------------------------------
    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> Tensor:
        """Tensor ``name`` dequantized to ``dtype`` (an owned copy, in torch's dimension order)."""
        info = self.tensors[name]
        start = self.data_start + info.offset
        raw = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=start)
        if info.ggml_type in PLAIN_TYPES:
            values = torch.from_numpy(raw.view(PLAIN_TYPES[info.ggml_type]).reshape(info.shape).copy())
        elif info.ggml_type == BF16:
            values = torch.from_numpy(raw.view(np.int16).reshape(info.shape).copy()).view(torch.bfloat16)
        else:
            values = torch.from_numpy(self._dequantize(raw, info))
        del raw
        return values.to(dtype)

    def _dequantize(self, raw: np.ndarray, info: TensorInfo) -> np.ndarray:
        import gguf

        qtype = gguf.GGMLQuantizationType(info.ggml_type)
        rows = raw.reshape(*info.shape[:-1], info.nbytes // max(int(np.prod(info.shape[:-1])), 1))
        try:
            return np.ascontiguousarray(gguf.quants.dequantize(rows, qtype), dtype=np.float32)
        except NotImplementedError:
            raise CheckpointError(
                f"{self.path}: tensor {info.name} is stored as {qtype.name}, which the installed "
                "gguf package cannot dequantize; requantize the model (e.g. Q8_0, Q4_K) with "
                "llama.cpp, or upgrade gguf"
            ) from None


def _describe(code: int, value: Any) -> str:
    if code == ARRAY:
        return f"an array of {_describe(value[0], None).removeprefix('a ').removeprefix('an ')}s"
    names = {STRING: "a string", BOOL: "a boolean", 6: "a float32", 12: "a float64"}
    return names.get(code, "an integer") if value is None or code != STRING else f"the string {value[:40]!r}"


def _check_path(path: Path) -> None:
    if "://" in str(path):
        raise CheckpointError(f"{path}: URLs are not read; download the file first and pass its local path")
    if not path.exists():
        raise CheckpointError(f"{path}: no such file; check the path of the .gguf file")
    if not path.is_file():
        raise CheckpointError(f"{path} is a {'folder' if path.is_dir() else 'special file'}, not a .gguf file")
