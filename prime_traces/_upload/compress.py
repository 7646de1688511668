"""Request-body coding of the ``traces`` part: gzip, zstd or none (contract §2, §9).

:func:`compress` encodes one batch body; :class:`CodingSelector` decides,
per request, which coding to use. The idempotency key is always over the
uncompressed bytes, so the coding changes time and wire bytes, nothing else.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable, Mapping
from types import ModuleType

import zstandard

_isal_zlib: ModuleType | None
try:  # ISA-L: optional (the "gzip" extra); see compress()
    from isal import isal_zlib as _isal_zlib
except ImportError:  # pragma: no cover  (exercised by the tests through monkeypatch)
    _isal_zlib = None

#: gzip level with zlib: the fastest. The 0.0.10 client used level 9, which costs
#: several times the CPU for ~20% fewer bytes; the producer's CPU is the scarce thing.
GZIP_LEVEL = 1
#: gzip level with ISA-L (its levels are 0-3): the lowest at least as small as zlib's level 1.
ISAL_GZIP_LEVEL = 1
#: zstd level: the lowest at least as small as zlib's gzip-1, at under half zlib's CPU
#: (``tools/bench_compress.py``, ``docs/benchmarks.md``; ISA-L's gzip-1 costs about as much as zstd-1).
DEFAULT_ZSTD_LEVEL = 1

IDENTITY = "identity"
GZIP = "gzip"
ZSTD = "zstd"
CODINGS = (GZIP, ZSTD, IDENTITY)

COMPRESSION_AUTO = "auto"
COMPRESSION_CHOICES = (COMPRESSION_AUTO, GZIP, ZSTD, "none")

_compressors = threading.local()


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    # A ZstdCompressor must not be used by two threads at once; one per
    # thread and level keeps its context (and its allocations) reused.
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_compressors, "by_level", None)
    if cache is None:
        cache = _compressors.by_level = {}
    compressor = cache.get(level)
    if compressor is None:
        compressor = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return compressor


def compress(
    body: bytes | memoryview, coding: str | None, *, zstd_level: int = DEFAULT_ZSTD_LEVEL
) -> bytes | memoryview:
    """Encode ``body`` for a ``Content-Encoding`` of ``coding``.

    - ``"gzip"``: one gzip member, mtime 0, so the same body always gives
      the same bytes. With the ``isal`` package installed (the ``gzip``
      extra) it is ISA-L's at :data:`ISAL_GZIP_LEVEL`: 3 to 5 times less
      CPU than zlib's :data:`GZIP_LEVEL` for slightly fewer bytes, and the
      GIL is released throughout (zlib holds it for 2-4 ms per 30 MiB batch,
      copying its output).
    - ``"zstd"``: one zstd frame at ``zstd_level`` with the content size in
      its header, so the service can bound decompression up front.
    - ``"identity"`` or ``None``: ``body`` unchanged (a view stays a view).

    Safe to call from several threads at once.
    """
    if coding == GZIP:
        if _isal_zlib is not None:
            return _isal_zlib.compress(body, ISAL_GZIP_LEVEL, wbits=31)  # 31: a gzip member, mtime 0
        return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
    if coding == ZSTD:
        return _zstd_compressor(zstd_level).compress(body)
    if coding is None or coding == IDENTITY:
        return body
    raise ValueError(f"unknown coding {coding!r}; expected one of {', '.join(CODINGS)}")


def content_encoding_header(coding: str) -> str | None:
    """The per-part ``Content-Encoding`` value for ``coding``; ``None`` means omit it."""
    return None if coding == IDENTITY else coding


def _header_values(headers: Mapping[str, str] | Iterable[tuple[str, str]], name: str) -> list[str]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    lowered = name.lower()
    return [value for key, value in items if key.lower() == lowered]


def advertises_zstd(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> bool:
    """Whether a response's ``Accept-Encoding`` lists ``zstd`` (RFC 7694), not at ``q=0``."""
    for value in _header_values(headers, "Accept-Encoding"):
        for member in value.split(","):
            token, _, params = member.partition(";")
            if token.strip().lower() != ZSTD:
                continue
            weight = params.strip().lower().replace(" ", "")
            if weight.startswith("q=") and _q_is_zero(weight[2:]):
                continue
            return True
    return False


def _q_is_zero(text: str) -> bool:
    try:
        return float(text) == 0.0
    except ValueError:
        return False


class CodingSelector:
    """Choose the coding of each upload from the ``compression`` setting.

    ``"gzip"``, ``"zstd"`` and ``"none"`` fix the coding (``"none"`` sends
    ``identity``). ``"auto"`` sends gzip until a response advertises zstd in
    its ``Accept-Encoding`` header (contract §9), then zstd; it never sends
    zstd to a server that has not said it accepts it. :meth:`observe` and
    :meth:`current` are thread-safe and never block::

        selector = CodingSelector("auto")
        selector.observe(response.headers)   # from any upload thread
        coding = selector.current()          # "gzip" until zstd is advertised
    """

    def __init__(self, compression: str = COMPRESSION_AUTO) -> None:
        if compression not in COMPRESSION_CHOICES:
            raise ValueError(
                f"compression must be one of {', '.join(map(repr, COMPRESSION_CHOICES))}, got {compression!r}"
            )
        self.compression = compression
        # Events are thread-safe flags: pool threads set them, any thread reads them.
        self._zstd_accepted = threading.Event()
        self._answered = threading.Event()

    def observe(self, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
        """Note a response's headers; in ``"auto"`` mode, switch to zstd once it is advertised."""
        self._answered.set()
        if self.compression == COMPRESSION_AUTO and not self._zstd_accepted.is_set():
            if advertises_zstd(headers):
                self._zstd_accepted.set()

    def refused(self, coding: str) -> None:
        """Note a 415 for ``coding``; in ``"auto"`` mode a refused zstd falls back to gzip.

        A fixed ``compression`` is the caller's explicit choice, so it is not
        overridden: the 415 surfaces as an error instead.
        """
        if self.compression == COMPRESSION_AUTO and coding == ZSTD:
            self._zstd_accepted.clear()

    @property
    def probing(self) -> bool:
        """``"auto"`` before any upload was answered: the coding to use is not known yet."""
        return self.compression == COMPRESSION_AUTO and not self._answered.is_set()

    def current(self) -> str:
        """The coding for the next upload: ``"gzip"``, ``"zstd"`` or ``"identity"``."""
        if self.compression == COMPRESSION_AUTO:
            return ZSTD if self._zstd_accepted.is_set() else GZIP
        if self.compression == "none":
            return IDENTITY
        return self.compression

    def __repr__(self) -> str:
        return f"CodingSelector(compression={self.compression!r}, current={self.current()!r})"
