"""One image's work in `prepare`: decode, resize, re-encode, measure; and its cache.

`hash_and_store` runs in every worker of prepare's process pool (or in the main
process): it reads one file, hashes it (the cache's key) and, unless the cache
holds that content, decodes it with `data.decode.load_image` (JPEG
draft, EXIF orientation, 16-bit scaling, transparency onto white), keeps its
short side at `StoreSpec.short_side`, encodes it as JPEG or PNG and measures
the per-channel sums the train split's statistics need, at the model's input
size as the tf.data pipeline resizes it. The result depends only on the file's
bytes and the spec, never on the worker: any worker count gives the same output.

`ImageCache` keeps each result under the file's content hash, in a folder per
spec fingerprint, so an incremental `prepare` decodes only new or changed files.
Entries are written to a temporary name and renamed: a kill leaves none half-written.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import struct
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from tfmlops.data.decode import bilinear_taps

# Bump when the stored bytes of an unchanged file and spec would differ (decoder change).
STORE_VERSION = 2  # 2: PNG compress level 1
# PNG's compress level: 1 instead of Pillow's 6 encodes a stored PNG photo in 1.3 ms
# instead of 4.9 ms for 15% more bytes (100 of the benchmark's PNG photos at 96 px);
# the stored size is far below the source's either way.
PNG_COMPRESS_LEVEL = 1
JPEG_SOURCES = {"JPEG", "MPO"}
MATRICES_KEPT = 32


@dataclass(frozen=True)
class StoreSpec:
    """Everything that decides the stored bytes and statistics of one image."""

    channels: int
    short_side: int  # the stored image's short side (never enlarged)
    encoding: str  # auto | jpeg | png
    jpeg_quality: int
    image_size: int  # the model's input size, for the statistics

    def fingerprint(self) -> str:
        import PIL

        blob = json.dumps({**asdict(self), "version": STORE_VERSION, "pillow": PIL.__version__},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Stored:
    """The outcome for one file: `data` and its facts, or the reason it was refused."""

    reason: str | None = None
    data: bytes = b""
    encoding: str = ""
    source_size: tuple[int, int] = (0, 0)  # width, height as decoded (upright)
    stored_size: tuple[int, int] = (0, 0)
    sums: tuple[float, ...] = ()  # per channel, of pixels in [0, 1] at image_size
    squares: tuple[float, ...] = ()
    pixels: int = 0  # per channel

    @property
    def ok(self) -> bool:
        return self.reason is None


def store_image(path: str, spec: StoreSpec) -> Stored:
    """Read, decode, resize, encode and measure one file."""
    data = _read(path)
    return data if isinstance(data, Stored) else store_bytes(data, spec)


def _read(path: str) -> bytes | Stored:
    """The file's bytes, or the reason it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        return Stored(reason=f"unreadable: {exc.strerror or exc}")


def _prefix(sha256: str) -> np.uint64:
    """The first 8 bytes of a hash: what the workers hold of each cached one."""
    return np.uint64(int(sha256[:16], 16))


def hash_and_store(path: str, spec: StoreSpec, cached: np.ndarray) -> tuple[str | None, Stored | None]:
    """A pool worker's job: read the file once, hash it, and store it unless the cache
    holds that content (`cached`: the sorted first 8 bytes of the cached hashes; None
    then, and the caller checks the whole hash). An unreadable file: (None, reason)."""
    data = _read(path)
    if isinstance(data, Stored):
        return None, data
    sha = hashlib.sha256(data).hexdigest()
    prefix = _prefix(sha)
    i = int(np.searchsorted(cached, prefix))
    if i < len(cached) and cached[i] == prefix:
        return sha, None
    return sha, store_bytes(data, spec)


def cached_prefixes(shas) -> np.ndarray:
    """What `hash_and_store` checks: 8 bytes per cached hash (0.8 MB per 100,000 images,
    copied to each worker), sorted."""
    return np.sort(np.array([_prefix(sha) for sha in shas], dtype=np.uint64))


def store_bytes(data: bytes, spec: StoreSpec) -> Stored:
    """Decode, resize, encode and measure one file's bytes."""
    from tfmlops.data.decode import ImageRejected, load_image_info

    try:
        img, fmt, source = load_image_info(data, spec.channels, spec.short_side)
    except ImageRejected as exc:
        return Stored(reason=str(exc))
    encoding = spec.encoding
    if encoding == "auto":
        encoding = "jpeg" if fmt in JPEG_SOURCES else "png"
    buf = io.BytesIO()
    if encoding == "jpeg":
        img.save(buf, format="JPEG", quality=spec.jpeg_quality)
    else:
        img.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    stored = buf.getvalue()
    # PNG is lossless: its pixels are the image's; a JPEG is measured as decoded (its
    # chroma subsampling smooths colour noise: the standard deviation of a noisy photo's
    # blue channel fell by a third).
    pixels = np.asarray(img) if encoding == "png" else _decoded(stored)
    sums, squares, count = channel_sums(pixels, spec.image_size, spec.channels)
    return Stored(None, stored, encoding, tuple(source), img.size, sums, squares, count)


def _decoded(encoded: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(encoded)) as img:
        return np.asarray(img)


_CACHED = np.zeros(0, np.uint64)  # a pool worker's copy of cached_prefixes (setup_worker)


def setup_worker(cached: np.ndarray) -> None:
    """A pool worker's start: the cached hashes' prefixes, and BLAS on one thread (the
    statistics' small matrix products ran 14x slower with a thread per core, in every
    one of the pool's processes)."""
    from threadpoolctl import threadpool_limits

    global _CACHED
    _CACHED = cached
    threadpool_limits(1)


def hash_and_store_chunk(paths: list[str], spec: StoreSpec) -> list[tuple[str | None, Stored | None]]:
    """`hash_and_store` over a chunk of files: a pool worker's task."""
    return [hash_and_store(p, spec, _CACHED) for p in paths]


def channel_sums(pixels: np.ndarray, size: int, channels: int):
    """Per-channel sum and sum of squares of an image as training reads it: resized to
    size x size (TensorFlow's bilinear), scaled to [0, 1]."""
    planes = _resized_planes(pixels.reshape(pixels.shape[0], pixels.shape[1], channels), size)
    planes *= np.float32(1 / 255.0)
    sums = planes.sum((1, 2), dtype=np.float64)
    squares = np.einsum("cij,cij->c", planes, planes, dtype=np.float64)
    return tuple(sums.tolist()), tuple(squares.tolist()), size * size


def resize_bilinear(image: np.ndarray, size: int) -> np.ndarray:
    """[H, W, C] -> float32 [size, size, C] as `tf.image.resize` (bilinear, half-pixel
    centres, no antialiasing) computes it."""
    return _resized_planes(image, size).transpose(1, 2, 0)


def _resized_planes(image: np.ndarray, size: int) -> np.ndarray:
    # [H, W, C] -> [C, size, size]: per channel, two small matrix products (several times
    # faster than gathering rows and columns; most of a photo's statistics cost). prepare
    # stores photos with their short side at the model's size, where that side's matrix is
    # the identity: skipping it halves the work.
    h, w, _ = image.shape
    planes = np.ascontiguousarray(np.moveaxis(image, 2, 0), dtype=np.float32)
    if h != size:
        planes = _resize_matrix(h, size) @ planes
    if w != size:
        planes = planes @ _resize_matrix_t(w, size)
    return planes


# Bounded: one matrix per distinct side length met (photos have hundreds), each tens
# of KB; 1024 of them made every worker's memory grow with the number of images.
@functools.lru_cache(maxsize=MATRICES_KEPT)
def _resize_matrix(in_size: int, out_size: int) -> np.ndarray:
    lower, upper, lerp = bilinear_taps(in_size, out_size)
    m = np.zeros((out_size, in_size), np.float32)
    out = np.arange(out_size)
    np.add.at(m, (out, lower), 1 - lerp)
    np.add.at(m, (out, upper), lerp)
    return m


@functools.lru_cache(maxsize=MATRICES_KEPT)
def _resize_matrix_t(in_size: int, out_size: int) -> np.ndarray:
    # A contiguous transpose: BLAS multiplies it without a strided copy per call.
    return np.ascontiguousarray(_resize_matrix(in_size, out_size).T)


class ImageCache:
    """Results by content hash, appended to segment files `<root>/<fingerprint>/NNNNNN.seg`.

    One file per run, not one per image: thousands of small files cost more to
    create than the images they hold cost to decode (digits). Each entry is
    `<u32 header length><header JSON: sha256, length, crc32c, facts><data>`,
    written by one call; an entry cut short by a kill (too short, or a CRC that
    does not match) is ignored, so a half-written entry is never used. `compact`
    rewrites the live entries into one segment once a run has succeeded.
    """

    def __init__(self, root: str | Path, spec: StoreSpec):
        self.root = Path(root)
        self.folder = self.root / spec.fingerprint()
        # sha256 -> (segment number in self._segments, header offset, refusal reason):
        # a few small values per image, not the parsed header (1.6 KB per image, which
        # made the memory of `prepare` grow with the number of images).
        self.index: dict[str, tuple[int, int, str | None]] = {}
        self._segments: list[Path] = []
        self._readers: dict[Path, object] = {}
        self._out = None
        self._scan_all()

    def _scan(self, seg: Path) -> None:
        size = seg.stat().st_size
        number = len(self._segments)
        self._segments.append(seg)
        with seg.open("rb") as fh:
            pos = 0
            while pos + 4 <= size:
                (n,) = struct.unpack("<I", fh.read(4))
                try:
                    head = json.loads(fh.read(n))
                    length = int(head["length"])
                except (ValueError, KeyError, TypeError):
                    return  # a torn header: nothing after it is trusted
                start = pos + 4 + n
                if start + length > size:
                    return
                self.index[head["sha256"]] = (number, pos, head.get("reason"))
                pos = start + length
                fh.seek(pos)

    def has(self, sha256: str) -> bool:
        return sha256 in self.index

    def reason(self, sha256: str) -> str | None:
        """A held entry's refusal reason (None: a usable image), from the index alone."""
        return self.index[sha256][2]

    def get(self, sha256: str) -> Stored | None:
        entry = self._read(sha256)
        if entry is None:
            return None
        head, data = entry
        facts = {k: tuple(v) if isinstance(v, list) else v for k, v in head.items()
                 if k not in ("sha256", "length", "crc32c")}
        return Stored(data=data, **facts)

    def _read(self, sha256: str) -> tuple[dict, bytes] | None:
        """The entry's header and data, or None when it is missing, cut short or damaged."""
        import google_crc32c

        if sha256 not in self.index:
            return None
        if self._out is not None:
            self._out.flush()  # the entry may be this run's, still in the write buffer
        number, pos, _ = self.index[sha256]
        seg = self._segments[number]
        fh = self._readers.get(seg) or self._readers.setdefault(seg, seg.open("rb"))
        fh.seek(pos)
        try:
            (n,) = struct.unpack("<I", fh.read(4))
            head = json.loads(fh.read(n))
            data = fh.read(head["length"])
            if len(data) != head["length"] or google_crc32c.value(data) != head["crc32c"]:
                return None  # cut short or damaged: decode again
        except (ValueError, KeyError, TypeError, struct.error):
            return None  # damaged since it was indexed: decode again
        return head, data

    def put(self, sha256: str, stored: Stored) -> None:
        import google_crc32c

        if self._out is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            number = max((int(p.stem) for p in self.folder.glob("*.seg")), default=0) + 1
            self._segments.append(self.folder / f"{number:06d}.seg")
            self._out = self._segments[-1].open("ab")
        # Indexed as written: the entries of this run are read back without a new scan.
        self.index[sha256] = (len(self._segments) - 1, self._out.tell(), stored.reason)
        self._out.write(_entry(sha256, stored, google_crc32c.value(stored.data)))

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
        for fh in self._readers.values():
            fh.close()
        self._readers.clear()

    def compact(self, keep: set[str], max_segments: int = 4) -> None:
        """After a successful run: drop other specs' folders and, once there are dead
        entries (files gone from the dataset) or many segments, rewrite the entries of
        `keep` into one segment."""
        self.close()
        if self.root.is_dir():
            for other in self.root.iterdir():
                if other != self.folder and other.is_dir():  # files: data.hash_memo's
                    shutil.rmtree(other, ignore_errors=True)
        segments = sorted(self.folder.glob("*.seg"))
        if len(segments) <= max_segments and set(self.index) <= keep:
            return
        tmp = self.folder / ".compact.tmp"
        with tmp.open("wb") as out:
            for sha in sorted(keep & set(self.index)):
                entry = self._read(sha)
                if entry is not None:
                    blob = json.dumps(entry[0]).encode()
                    out.write(struct.pack("<I", len(blob)) + blob + entry[1])
        self.close()
        os.replace(tmp, self.folder / f"{int(segments[-1].stem) + 1:06d}.seg")
        for seg in segments:
            seg.unlink()

    def _scan_all(self) -> None:
        for seg in sorted(self.folder.glob("*.seg")) if self.folder.is_dir() else []:
            self._scan(seg)


def _entry(sha256: str, stored: Stored, crc: int) -> bytes:
    # Not dataclasses.asdict: it deep-copies every field, data included (a tenth of the
    # main process's time per photo).
    head = {f.name: getattr(stored, f.name) for f in fields(Stored) if f.name != "data"}
    head.update(sha256=sha256, length=len(stored.data), crc32c=crc)
    blob = json.dumps(head).encode()
    return struct.pack("<I", len(blob)) + blob + stored.data
