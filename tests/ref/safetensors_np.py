"""safetensors_np - read and write the safetensors format with numpy only.

Owns: the file format (8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the data block the offsets index), BF16 <-> F32 conversion, and the
Hugging Face checkpoint directory layout (one model.safetensors, or shards named
by model.safetensors.index.json; a wrapper's text config and tensor prefix).

Written from the format description, not from the safetensors library, so the
engine's loader is checked against an independent implementation. The writer
streams: the header is laid out from (name, dtype, shape) specs first, then each
tensor's bytes are appended in order, possibly in chunks, so a checkpoint never
has to fit in memory.
"""

import json
import mmap
import os
import struct

import numpy as np

# safetensors dtype name -> (numpy storage dtype, bytes per element)
_STORAGE = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits; widened by bf16_to_f32
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("u1"),
    # 8-bit floats: raw codes, meaningful only with their scales (quant_np decodes them)
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
}
SCALED = ("F8_E4M3", "F8_E5M2")

# A header larger than this is treated as hostile (the reference library uses 100 MB).
MAX_HEADER = 100 * 1024 * 1024


def itemsize(dtype):
    return _STORAGE[dtype].itemsize


def bf16_to_f32(bits):
    """uint16 BF16 bit patterns -> float32 (exact: BF16 is the top half of F32)."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 -> uint16 BF16 bits, rounding to nearest, ties to even.
    NaN stays NaN (quiet bit set), infinities stay infinite, values past the BF16
    range round to infinity as IEEE rounding requires."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    nan = np.isnan(x)
    has_nan = bool(nan.any())
    if has_nan:
        u = np.where(nan, np.uint32(0), u)
    # u + 0x7FFF + lsb cannot wrap for non-NaN values (max 0xFF800000 + 0x8000).
    # In-place steps: this runs over every weight of multi-GB checkpoints.
    t = u >> np.uint32(16)
    t &= np.uint32(1)
    t += np.uint32(0x7FFF)
    t += u
    t >>= np.uint32(16)
    r = t.astype(np.uint16)
    if has_nan:
        q = ((x.view(np.uint32) >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
        r = np.where(nan, q, r)
    return r


def to_storage(x, dtype):
    """A float array -> the stored representation of `dtype` (a numpy array whose
    bytes are exactly the file bytes)."""
    if dtype == "BF16":
        return f32_to_bf16(np.asarray(x, dtype=np.float32))
    return np.ascontiguousarray(x, dtype=_STORAGE[dtype])


def from_storage(raw, dtype, out_dtype=np.float32):
    """Stored array -> floats widened exactly to out_dtype (float32 or float64)."""
    if dtype in SCALED:
        raise ValueError(f"{dtype} codes need their block scales: read them through quant_np")
    if dtype == "BF16":
        return bf16_to_f32(raw).astype(out_dtype, copy=False)
    return raw.astype(out_dtype, copy=False)


class FormatError(Exception):
    pass


def read_header(path):
    """(header dict without __metadata__, metadata dict or None, data start offset)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise FormatError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise FormatError(f"{path}: header length {n} exceeds the file")
        text = f.read(n)
    try:
        hdr = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(hdr, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    meta = hdr.pop("__metadata__", None)
    data_len = size - 8 - n
    spans = []
    for name, info in hdr.items():
        try:
            dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{path}: tensor {name}: malformed entry") from None
        if dt not in _STORAGE:
            raise FormatError(f"{path}: tensor {name}: unknown dtype {dt}")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise FormatError(f"{path}: tensor {name}: bad shape {shape}")
        count = 1
        for d in shape:
            count *= d
        if not (0 <= b <= e <= data_len) or e - b != count * itemsize(dt):
            raise FormatError(f"{path}: tensor {name}: data_offsets {b},{e} do not fit "
                              f"shape {shape} {dt} in {data_len} data bytes")
        spans.append((b, e, name))
    # The format has no holes and no overlaps: the tensors tile the data block.
    pos = 0
    for b, e, name in sorted(spans):
        if b != pos:
            raise FormatError(f"{path}: tensor {name}: data_offsets leave a gap or overlap at {pos}")
        pos = e
    if pos != data_len:
        raise FormatError(f"{path}: {data_len - pos} data bytes after the last tensor")
    return hdr, meta, 8 + n


class SafeTensorsFile:
    """One .safetensors file, memory-mapped; tensors are read on demand."""

    def __init__(self, path):
        self.path = path
        self.header, self.metadata, self.data_start = read_header(path)
        self._f = open(path, "rb")
        size = os.path.getsize(path)
        self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def close(self):
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def keys(self):
        return list(self.header.keys())

    def __contains__(self, name):
        return name in self.header

    def info(self, name):
        """(dtype string, shape tuple)."""
        h = self.header[name]
        return h["dtype"], tuple(h["shape"])

    def raw(self, name):
        """The stored array (BF16 as uint16 bits), a read-only view of the file."""
        h = self.header[name]
        b, e = h["data_offsets"]
        dt = _STORAGE[h["dtype"]]
        count = (e - b) // dt.itemsize
        if count == 0:
            return np.zeros(h["shape"], dtype=dt)
        arr = np.frombuffer(self._mm, dtype=dt, count=count, offset=self.data_start + b)
        return arr.reshape(h["shape"])

    def get(self, name, out_dtype=np.float32):
        """The tensor widened exactly to out_dtype (a fresh array)."""
        dtype, _ = self.info(name)
        return np.array(from_storage(self.raw(name), dtype, out_dtype), copy=True)


class Checkpoint:
    """All tensors of a Hugging Face checkpoint directory: model.safetensors, or the
    shards listed by model.safetensors.index.json."""

    def __init__(self, model_dir):
        self.dir = model_dir
        index = os.path.join(model_dir, "model.safetensors.index.json")
        single = os.path.join(model_dir, "model.safetensors")
        self.files = {}
        self.where = {}
        if os.path.exists(index):
            with open(index) as f:
                idx = json.load(f)
            self.index = idx
            for name, fn in idx["weight_map"].items():
                if fn not in self.files:
                    self.files[fn] = SafeTensorsFile(os.path.join(model_dir, fn))
                if name not in self.files[fn]:
                    raise FormatError(f"{fn}: index lists {name} but the file lacks it")
                self.where[name] = fn
        elif os.path.exists(single):
            self.index = None
            self.files["model.safetensors"] = SafeTensorsFile(single)
            for name in self.files["model.safetensors"].keys():
                self.where[name] = "model.safetensors"
        else:
            raise FileNotFoundError(f"{model_dir}: no model.safetensors or index")

    def close(self):
        for f in self.files.values():
            f.close()

    def __contains__(self, name):
        return name in self.where

    def keys(self):
        return list(self.where.keys())

    def info(self, name):
        return self.files[self.where[name]].info(name)

    def get(self, name, out_dtype=np.float32):
        if name not in self.where:
            raise KeyError(f"{self.dir}: tensor {name} not found")
        return self.files[self.where[name]].get(name, out_dtype)


class SafeTensorsWriter:
    """Streams one .safetensors file. specs: [(name, dtype, shape)] in data order.
    Call write(name, array) for each tensor in that order (or write_part repeatedly
    with consecutive row chunks), then close()."""

    def __init__(self, path, specs, metadata=None):
        self.path = path
        hdr = {}
        if metadata is not None:
            hdr["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        self.order = []
        off = 0
        for name, dtype, shape in specs:
            if dtype not in _STORAGE:
                raise ValueError(f"unknown dtype {dtype}")
            n = itemsize(dtype)
            for d in shape:
                n *= int(d)
            hdr[name] = {"dtype": dtype, "shape": [int(d) for d in shape],
                         "data_offsets": [off, off + n]}
            self.order.append((name, dtype, n))
            off += n
        self.data_len = off
        text = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
        # Pad with spaces so the data block starts 8-byte aligned, as the reference
        # library does; readers must accept the trailing whitespace.
        text += b" " * ((8 - len(text) % 8) % 8)
        self._f = open(path, "wb")
        self._f.write(struct.pack("<Q", len(text)))
        self._f.write(text)
        self._i = 0       # index of the tensor being written
        self._done = 0    # bytes of it written so far

    def _cur(self):
        if self._i >= len(self.order):
            raise ValueError(f"{self.path}: more data than the header declares")
        return self.order[self._i]

    def write_part(self, name, array, raw=False):
        """Appends a chunk: a float array converted to the tensor's dtype, or with
        raw=True an array already in stored form (BF16 as uint16 bits)."""
        want, dtype, n = self._cur()
        if name != want:
            raise ValueError(f"{self.path}: expected tensor {want}, got {name}")
        data = np.ascontiguousarray(array, dtype=_STORAGE[dtype]) if raw else to_storage(array, dtype)
        nb = data.nbytes
        if self._done + nb > n:
            raise ValueError(f"{self.path}: tensor {name}: too many bytes")
        self._f.write(data.reshape(-1).view(np.uint8))
        self._done += nb
        if self._done == n:
            self._i += 1
            self._done = 0

    def skip(self, name):
        """Leaves tensor `name` as a hole of zero bytes (a sparse file): layout
        checks of full-size shapes, never for computing."""
        want, _, n = self._cur()
        if name != want or self._done:
            raise ValueError(f"{self.path}: expected tensor {want} from its start, got {name}")
        self._f.seek(n, 1)
        self._i += 1

    def write(self, name, array):
        want, _, n = self._cur()
        self.write_part(name, array)
        if self._done != 0:
            raise ValueError(f"{self.path}: tensor {name}: short write")

    def close(self):
        if self._i != len(self.order) or self._done != 0:
            self._f.close()
            raise ValueError(f"{self.path}: closed after {self._i} of {len(self.order)} tensors")
        self._f.truncate()  # a trailing hole still counts in the file's size
        self._f.close()


def read_text_config(model_dir):
    """(text config dict, tensor prefix) of a checkpoint directory's config.json.
    A config with text_config is a multimodal wrapper (Kimi K2.5, Kimi K3) whose
    text tensors carry the language_model. prefix."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        raw = json.load(f)
    if isinstance(raw.get("text_config"), dict):
        return raw["text_config"], "language_model."
    return raw, ""


def save_file(path, tensors, dtypes=None, metadata=None):
    """Writes a dict {name: array} in one go (small files; tests). dtypes maps name
    -> safetensors dtype; default F32."""
    dtypes = dtypes or {}
    specs = [(k, dtypes.get(k, "F32"), np.shape(v)) for k, v in tensors.items()]
    w = SafeTensorsWriter(path, specs, metadata)
    for k, v in tensors.items():
        w.write(k, v)
    w.close()
