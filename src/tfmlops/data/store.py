"""One image's work in `prepare`: decode, resize, re-encode, measure; and its cache.

`hash_and_store` runs in every worker of prepare's process pool (or in the main
process): it reads one file, hashes it (the cache's key) and, unless the cache
holds that content, decodes it (`data.decode.load_pixels`), keeps its short side
at `StoreSpec.short_side`, encodes it as JPEG or PNG and measures the per-channel
sums the train split's statistics need. The result depends only on the file's
bytes and the spec, never on the worker: any worker count gives the same output.
Encoding, the stored JPEG's decoding and the statistics use OpenCV's SIMD kernels.

`ImageCache` keeps each result under the file's content hash, in a folder per
spec fingerprint, so an incremental `prepare` decodes only new or changed files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import struct
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import msgspec
import numpy as np

from tfmlops import faults
from tfmlops.errors import DataError
from tfmlops.files import claim_folder, owned_children

log = logging.getLogger(__name__)

# Bump when the stored bytes of an unchanged file and spec would differ (decoder change).
STORE_VERSION = 5
# PNG's compress level: 1 instead of 6 encodes a stored PNG photo several times faster
# for a few more bytes (BENCHMARKS.md, figures behind the code); the stored size is far
# below the source's either way.
PNG_COMPRESS_LEVEL = 1


@dataclass(frozen=True)
class StoreSpec:
    """Everything that decides the stored bytes and statistics of one image."""

    channels: int
    short_side: int  # the stored image's short side (never enlarged)
    encoding: str  # auto | jpeg | png
    jpeg_quality: int
    image_size: int  # the model's input size, for the statistics

    def fingerprint(self) -> str:
        import cv2
        import PIL

        blob = json.dumps({**asdict(self), "version": STORE_VERSION, "pillow": PIL.__version__,
                           "opencv": cv2.__version__}, sort_keys=True)
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
    # The data profile's facts (data.features): of the source file, then of the stored image.
    source_format: str = ""  # PIL's: JPEG, MPO, PNG, GIF, BMP
    source_channels: int = 0  # of the source's mode (data.features.mode_channels)
    source_bytes: int = 0
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    sharpness: float = 0.0
    phash: int = 0  # 64-bit DCT perceptual hash (data.features.phash)

    @property
    def ok(self) -> bool:
        return self.reason is None


def store_known(path: str, spec: StoreSpec, sha256: str) -> Stored:
    """Read, decode, resize, encode and measure a file whose content hash is known:
    bytes that no longer have that hash (the file changed while prepare ran) stop the
    run, never go under it."""
    _, sha, stored = hash_and_store(path, spec, _NONE_CACHED)
    if sha not in (None, sha256):
        raise DataError(f"{path} changed while prepare was reading it; run prepare again "
                        "once nothing writes to data.image_dir")
    return stored


def read_file(path: str) -> bytes | Stored:
    """The file's bytes, or the reason it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        return Stored(reason=f"unreadable: {exc.strerror or exc}")


Result = tuple[str, str | None, Stored | None]  # (path, sha256, Stored) of one file


def hash_and_store(path: str, spec: StoreSpec, cached: np.ndarray) -> Result:
    """A pool worker's job: read the file once, hash it, and store it unless the cache
    holds that content (`cached`: the sorted first 8 bytes of the cached hashes; None
    then, and the caller checks the whole hash). An unreadable file: (path, None,
    reason). The path comes back for the caller to check the result is its file's."""
    data = read_file(path)
    if isinstance(data, Stored):
        return path, None, data
    sha = hashlib.sha256(data).hexdigest()
    prefix = np.uint64(int(sha[:16], 16))
    i = int(np.searchsorted(cached, prefix))
    if i < len(cached) and cached[i] == prefix:
        return path, sha, None
    return path, sha, store_bytes(data, spec)


def cached_prefixes(shas) -> np.ndarray:
    """What `hash_and_store` checks: 8 bytes per cached hash (0.8 MB per 100,000 images,
    copied to each worker), sorted."""
    return np.sort(np.array([int(sha[:16], 16) for sha in shas], dtype=np.uint64))


def store_bytes(data: bytes, spec: StoreSpec) -> Stored:
    """Decode, resize, encode and measure one file's bytes."""
    import cv2

    from tfmlops.data.decode import ImageRejected, load_pixels
    from tfmlops.data.features import image_features, mode_channels

    try:
        pixels, fmt, source, mode = load_pixels(data, spec.channels, spec.short_side)
    except ImageRejected as exc:
        return Stored(reason=str(exc))
    encoding = spec.encoding
    if encoding == "auto":
        encoding = "jpeg" if fmt in ("JPEG", "MPO") else "png"
    # OpenCV encodes colour in BGR order; the stored file holds RGB as any decoder reads it.
    bgr = pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    if encoding == "jpeg":
        ok, encoded = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, spec.jpeg_quality])
    else:
        ok, encoded = cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, PNG_COMPRESS_LEVEL])
    if not ok:
        return Stored(reason=f"could not be encoded as {encoding}")
    stored = encoded.tobytes()
    # PNG is lossless: its pixels are the image's; a JPEG is measured as decoded (its
    # chroma subsampling smooths colour noise: the standard deviation of a noisy photo's
    # blue channel fell by a third).
    if encoding == "jpeg":
        pixels = cv2.imdecode(encoded, cv2.IMREAD_GRAYSCALE if pixels.ndim == 2 else cv2.IMREAD_COLOR_RGB)
    sums, squares, count = channel_sums(pixels, spec.image_size)
    height, width = pixels.shape[:2]
    return Stored(None, stored, encoding, tuple(source), (width, height), sums, squares, count,
                  fmt, mode_channels(mode), len(data), **image_features(pixels))


def channel_sums(pixels: np.ndarray, size: int):
    """Per-channel sum and sum of squares of a uint8 [H, W(, C)] image as training reads
    it: resized to size x size by TensorFlow's bilinear (half-pixel centres, no
    antialiasing; OpenCV's float kernel is the same filter), scaled to [0, 1]."""
    import cv2

    resized = cv2.resize(pixels.astype(np.float32), (size, size), interpolation=cv2.INTER_LINEAR)
    mean, std = cv2.meanStdDev(resized * np.float32(1 / 255.0))  # float64, per channel
    mean, std = mean.ravel(), std.ravel()
    count = size * size
    return tuple((mean * count).tolist()), tuple(((std * std + mean * mean) * count).tolist()), count


_NONE_CACHED = np.zeros(0, np.uint64)
_CACHED = _NONE_CACHED  # a pool worker's copy of cached_prefixes (setup_worker)


def setup_worker(cached: np.ndarray, parent: int | None = None) -> None:
    """A pool worker's start: die with `parent` (a killed prepare leaves no worker
    behind), the cached hashes' prefixes, and one thread for OpenCV and BLAS (the pool
    is the parallelism: a thread per core in every one of its processes ran small
    kernels many times slower: BENCHMARKS.md, figures behind the code)."""
    import ctypes
    import signal
    import sys

    import cv2
    from threadpoolctl import threadpool_limits

    global _CACHED
    if parent is not None:
        if sys.platform.startswith("linux"):  # the kernel SIGKILLs this process with its parent
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # gone already (before the line above took effect)
            os._exit(1)
    _CACHED = cached
    cv2.setNumThreads(1)
    threadpool_limits(1)


def hash_and_store_chunk(paths: list[str], spec: StoreSpec) -> list[Result]:
    """`hash_and_store` over a chunk of files: a pool worker's task."""
    faults.point("decode.worker", parent=True)
    return [hash_and_store(p, spec, _CACHED) for p in paths]


CACHE_KIND = "prepare-cache"  # the marker each spec folder carries (files.claim_folder)
_HEAD = struct.Struct("<II")  # header length, CRC-32C of header and data
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DECODE = msgspec.json.Decoder().decode


def _header(blob: bytes) -> dict:
    """An entry's header. msgspec's parser takes 2 us where json's takes 9 (once per held
    image per run, twice for a written one); json's reads what msgspec refuses (a NaN,
    which json.dumps writes), so an entry reads as it always did."""
    try:
        return _DECODE(blob)
    except msgspec.DecodeError:
        return json.loads(blob)


class CacheLock:
    """An flock on `<paths.prepare_cache>/.lock`: two checkouts may point at one absolute
    cache. A run holds it shared while it reads and appends (each run appends to a
    segment of its own, created exclusively). What removes files another run may be
    reading (compaction, the hash memo's rewrite) needs it exclusive, and is skipped
    while another run holds it: only an optimisation waits for a later run, never a
    run for another. The kernel releases it when the process dies, however it dies."""

    def __init__(self, root: str | Path):
        Path(root).mkdir(parents=True, exist_ok=True)
        self.root = Path(root)
        self.fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)

    def shared(self) -> CacheLock:
        fcntl.flock(self.fd, fcntl.LOCK_SH)  # waits out another's compaction or rewrite
        return self

    def exclusive(self) -> bool:
        """Exclusive now, if no other process holds the lock: True. Else False, and
        unlocked (Linux drops a shared lock before converting it): call `shared` again."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        os.close(self.fd)


class ImageCache:
    """Results by content hash, appended to segment files `<root>/<fingerprint>/NNNNNN.seg`.

    One file per run, not one per image: thousands of small files cost more to
    create than the images they hold cost to decode (digits). Each entry is
    `<u32 header length><u32 CRC-32C of header and data><header JSON: sha256,
    length, facts><data>`, written by one call. An entry cut short by a kill is
    ignored, and one whose CRC, hash or reason does not match what the index
    holds is treated as missing: its file is decoded again, never used from
    here. `compact` rewrites the live entries into one segment once a run has
    succeeded, and removes other specs' folders: only those that carry this
    cache's marker and name.
    """

    def __init__(self, root: str | Path, spec: StoreSpec):
        self.root = Path(root)
        self.folder = self.root / spec.fingerprint()
        # sha256 -> (segment number in self._segments, header offset, refusal reason): a
        # few small values per image, not the parsed header (far larger).
        self.index: dict[str, tuple[int, int, str | None]] = {}
        self._segments: list[Path] = []
        self._readers: dict[Path, object] = {}
        self._out = None
        for seg in sorted(self.folder.glob("*.seg")) if self.folder.is_dir() else []:
            self._scan(seg)

    def _scan(self, seg: Path) -> None:
        number = len(self._segments)
        self._segments.append(seg)
        try:
            size = seg.stat().st_size
            fh = seg.open("rb")
        except OSError:  # removed since it was listed (another process compacted): none
            return
        with fh:
            pos = 0
            while pos + _HEAD.size <= size:
                n, crc = _HEAD.unpack(fh.read(_HEAD.size))
                blob = fh.read(n)
                try:
                    head = _header(blob)
                    length = int(head["length"])
                    sha, reason = head["sha256"], head.get("reason")
                except (ValueError, KeyError, TypeError, AttributeError):
                    return  # a torn header: nothing after it is trusted
                start = pos + _HEAD.size + n
                if start + length > size or length < 0:
                    return
                # A refused file's entry has no data: its CRC is checked now, for the
                # reason in the index decides whether the file is used at all. An
                # entry whose hash is no hash (damaged) is skipped, never indexed.
                whole = length or _crc(blob, b"") == crc
                if whole and _SHA256.fullmatch(str(sha)) and (reason is None) == (length > 0):
                    self.index[sha] = (number, pos, reason)
                pos = start + length
                fh.seek(pos)

    def has(self, sha256: str) -> bool:
        return sha256 in self.index

    def reason(self, sha256: str) -> str | None:
        """A held entry's refusal reason (None: a usable image), from the index alone."""
        return self.index[sha256][2]

    def get(self, sha256: str) -> Stored | None:
        """The entry, or None when it is missing, cut short or damaged."""
        if sha256 not in self.index:
            return None
        if self._out is not None:
            self._out.flush()  # the entry may be this run's, still in the write buffer
        number, pos, reason = self.index[sha256]
        seg = self._segments[number]
        try:
            fh = self._readers.get(seg) or self._readers.setdefault(seg, seg.open("rb"))
            fh.seek(pos)
            n, crc = _HEAD.unpack(fh.read(_HEAD.size))
            blob = fh.read(n)
            head = _header(blob)
            data = fh.read(head["length"])
            if (len(data) != head["length"] or _crc(blob, data) != crc
                    or head["sha256"] != sha256 or head.get("reason") != reason):
                return None  # cut short or damaged: decode again
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return None  # damaged or removed since it was indexed: decode again
        facts = {k: tuple(v) if isinstance(v, list) else v for k, v in head.items()
                 if k not in ("sha256", "length")}
        return Stored(data=data, **facts)

    def put(self, sha256: str, stored: Stored) -> None:
        if self._out is None:
            claim_folder(self.folder, CACHE_KIND)
            number = max((int(p.stem) for p in self.folder.glob("*.seg")), default=0) + 1
            seg, fd = own_segment(self.folder, number)
            self._segments.append(seg)
            self._out = os.fdopen(fd, "ab")
        # Indexed as written: the entries of this run are read back without a new scan.
        self.index[sha256] = (len(self._segments) - 1, self._out.tell(), stored.reason)
        entry = _entry(sha256, stored)
        if faults.armed("cache.torn"):  # a kill within one write
            self._out.write(entry[: len(entry) // 2])
            self._out.flush()
            faults.point("cache.torn")
        self._out.write(entry)
        faults.point("cache.put")

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
        for fh in self._readers.values():
            fh.close()
        self._readers.clear()

    def compact(self, keep: set[str], max_segments: int = 4) -> None:
        """After a successful run: drop other specs' folders (this cache's own: marker
        and name) and, once there are dead entries (files gone from the dataset) or
        many segments, rewrite the entries of `keep` into one segment. Only when no
        other run uses the cache (`CacheLock`); else a later run does it."""
        self.close()
        lock = CacheLock(self.root)
        try:
            if lock.exclusive():
                self._compact(keep, max_segments)
            else:
                log.info("prepare: another prepare is using %s; its compaction is left to "
                         "a later run", self.root)
        finally:
            lock.close()

    def _compact(self, keep: set[str], max_segments: int) -> None:
        for other in owned_children(self.root, CACHE_KIND, r"[0-9a-f]{16}"):  # fingerprints
            if other != self.folder:
                shutil.rmtree(other, ignore_errors=True)
        tmp = self.folder / ".compact.tmp"
        tmp.unlink(missing_ok=True)  # left by a killed compaction
        segments = sorted(self.folder.glob("*.seg"))
        if not segments or len(segments) <= max_segments and set(self.index) <= keep:
            return
        last = int(segments[-1].stem)
        segments = [s for s in segments if s in self._segments]  # not one written since
        with tmp.open("wb") as out:
            for sha in sorted(keep & set(self.index)):
                stored = self.get(sha)
                if stored is not None:  # the same bytes as written: same fields, same order
                    out.write(_entry(sha, stored))
        self.close()
        faults.point("compact.temp")
        os.replace(tmp, self.folder / f"{last + 1:06d}.seg")
        faults.point("compact.replaced")
        for seg in segments:
            seg.unlink()


def own_segment(folder: Path, number: int) -> tuple[Path, int]:
    """A new segment file (and its fd) numbered `number`, or the first free number above
    it: created exclusively, for another run may have created that one since `number`
    was found free."""
    while True:
        seg = folder / f"{number:06d}.seg"
        try:
            return seg, os.open(seg, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            number += 1


def _crc(blob: bytes, data: bytes) -> int:
    import google_crc32c

    return google_crc32c.extend(google_crc32c.value(blob), data)


def _entry(sha256: str, stored: Stored) -> bytes:
    # Not dataclasses.asdict: it deep-copies every field, data included (a tenth of the
    # main process's time per photo).
    head = {f.name: getattr(stored, f.name) for f in fields(Stored) if f.name != "data"}
    head.update(sha256=sha256, length=len(stored.data))
    blob = json.dumps(head).encode()
    return _HEAD.pack(len(blob), _crc(blob, stored.data)) + blob + stored.data
