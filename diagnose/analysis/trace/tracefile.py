"""Read a Chrome trace (``.json`` or ``.json.gz``) as a stream of event pieces, in bounded memory.

Contract: ``TraceStream(path)`` opens the file (clear ``TraceError`` if it cannot be read);
``stream.decoded(decode)`` yields, a piece at a time, ``decode(piece)`` of each run of whole events
of the ``traceEvents`` array (a few MB of JSON each); after the iteration ``stream.metadata`` holds
the rest of the document (``deviceProperties``, versions ...); with ``submit`` and ``in_flight``,
several pieces are decoded at once elsewhere (worker processes), the results still in order; with
``slots`` (shared memory) a gzipped trace is inflated straight into them, where the workers read it.
``decode_events`` turns a piece into
typed ``Event``s holding only the fields the analysis reads; ``decode_objects`` into plain dicts.
Memory is the current block and piece, whatever the file's size; ``.gz`` is decompressed as read.
``check_fits`` and ``MemoryGuard`` compare what a trace needs with the memory the machine has.
``check_size`` refuses, before reading, JSON over a limit given or a gzip that would inflate over
``MAX_INFLATION_RATIO`` times its size (a gzip bomb); the inflater holds both while it inflates,
since a gzip trailer can be wrong. The time is linear in the text, however long an event.

How the array is cut without tracking JSON's grammar byte by byte in Python: a piece ends at a
candidate boundary between two events (``}`` , ``{`` with whitespace between), and the candidate
is accepted only if the piece then parses as an array (the parse that decodes it: nothing is
parsed twice). That test is exact: a cut inside a string
leaves the string open, a cut inside a nested value leaves a bracket open, and either fails to
parse. A piece that fails is joined, with its exact separator, to the next and parsed again; only
a document that is not valid JSON keeps failing, and it is reported as such (with the byte offset).
The top level around the array is checked the same way: the text before ``"traceEvents": [`` and
after its ``]`` must parse as an object with an empty array in its place.

Why one module (about 870 lines): reading a file in pieces has one contract and many cases
(plain or gzipped, read here or by a worker, from the file or from shared memory, the last piece
cut by the parent, a file too large for the memory), and each case is the same piece boundary
seen from another side: ``Piece``/``FilePiece``/``SlotPiece``, the inflater, ``TraceStream``'s cuts
and ``_settle`` must agree byte for byte. The memory guard at the end is small and is the
stream's own check.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import queue
import re
import threading
import zlib
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, TypeVar

import msgspec
import orjson

from diagnose.errors import TraceError

if TYPE_CHECKING:
    from diagnose.analysis.trace.forking import SharedSlots

#: bytes read from the file (or from the decompressor) at a time; a piece is about this long.
#: Smaller pieces keep more workers busy sooner and the last ones finish together: the 0.2 GB
#: trace read in 0.63 s with 8 MB pieces and 8 workers on a 16-core host, 0.42 s with 2 MB (4 MB:
#: 0.55); on 2 cores 1.54, 1.31 and 1.24 s with two workers, 2.17, 1.89 and 2.04 s in one process
BLOCK_BYTES = 2 * 1024 * 1024
#: a plain file read by workers: about this much of its end is left to the reading process (the
#: array's last events and the metadata after it, found and decoded there)
TAIL_BYTES = 512 * 1024
#: a piece that still does not parse after growing to this many bytes is invalid JSON
MAX_JOINED_PIECE_BYTES = 128 * 1024 * 1024
#: the text before the events array (metadata) is looked for in this many bytes at most
MAX_HEADER_BYTES = 64 * 1024 * 1024
#: a torch.profiler trace gzips 15-17 times smaller (every trace of tests/data, and the 10 GB
#: benchmark traces alike); a file that inflates over this many times its size is no trace (a
#: gzip bomb: 4 MB of whitespace inflating to 4 GiB ran past 600 s): refused as soon as the
#: inflating shows it, before the read where its gzip trailer (or its first MB) makes it a suspect
MAX_INFLATION_RATIO = 100
#: inflated bytes before the ratio is judged (a small file's gzip header and first block weigh more)
RATIO_AFTER_BYTES = 16 << 20

_TRUNCATED_HINT = "the trace may be truncated: was the profiled process killed while writing it?"
#: the end of one event and the start of the next, as a candidate cut
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
if TYPE_CHECKING:  # isal_zlib has zlib's interface: checked as zlib
    _inflating = zlib
else:
    try:  # ISA-L inflates a trace 3x faster than zlib (the 0.2 GB trace: 0.08 s against 0.25 s)
        from isal import isal_zlib as _inflating
    except ImportError:  # a platform without its wheel: zlib, the same interface
        _inflating = zlib
_READ_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, _inflating.error)

UNSET = msgspec.UNSET
Decoded = TypeVar("Decoded")


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` of an event, as far as the analysis reads them; other keys are skipped."""

    correlation: Any = UNSET
    device: Any = UNSET
    stream: Any = UNSET
    bytes: Any = UNSET
    #: a metadata event's name (``thread_name``: the thread's name)
    name: Any = UNSET


class Event(msgspec.Struct, gc=False):
    """One trace event, the fields the analysis reads (``UNSET`` where the event has none).
    ``args`` is an ``EventArgs``, ``None``/``UNSET``, or (from ``event_from_object``) whatever
    malformed value the trace held, for the reader to report where it reads it."""

    ph: Any = UNSET
    cat: Any = UNSET
    name: Any = UNSET
    tid: Any = UNSET
    ts: Any = UNSET
    dur: Any = UNSET
    args: EventArgs | msgspec.UnsetType | None = UNSET


_EVENTS_DECODER = msgspec.json.Decoder(list[Event])
#: what a decoder raises on text that is not JSON (msgspec's ValidationError is handled inside)
_SYNTAX_ERRORS = (msgspec.DecodeError, orjson.JSONDecodeError)


@dataclass
class Piece:
    """Whole events of the array, as JSON text without the brackets; ``separator`` is the exact
    text between this piece and the next (kept so that a wrong cut can be undone byte for byte)."""

    text: bytes | bytearray  # a bytearray where pieces were joined (``_settle``)
    separator: bytes
    offset: int  # of ``text`` in the (decompressed) document
    #: bytes of ``text`` that were found not to parse (a piece joined from pieces that did not)
    tried: int = 0

    @property
    def length(self) -> int:
        return len(self.text)

    def as_array(self) -> bytes:
        return b"[" + self.text + b"]"


class FilePiece(Piece):
    """A piece of a plain file that its reader (a worker process) reads itself: this process
    found its ends by seeking and reads its text only if it needs it (a piece to join to the
    next, or to decode here)."""

    def __init__(self, path: Path, offset: int, length: int, separator: bytes) -> None:
        self.path, self.offset, self._length, self.separator = path, offset, length, separator
        self._text: bytes | None = None

    @property
    def text(self) -> bytes:  # type: ignore[override]  # read lazily; nothing assigns a piece's text once made
        if self._text is None:
            self._text = read_span(self.path, self.offset, self._length)
        return self._text

    @property
    def length(self) -> int:
        return self._length


class SlotPiece(Piece):
    """A piece inflated into a slot of shared memory (a gzipped trace's), which its reader, a
    worker process, reads there. ``done`` frees the slot once the worker answered; ``keep``
    copies the text out first, where this process needs it (a piece to join to the next, or to
    fold here)."""

    def __init__(self, slots: SharedSlots, slot: int, length: int, separator: bytes, offset: int) -> None:
        self.slots, self._length, self.separator, self.offset = slots, length, separator, offset
        self.slot: int | None = slot  # None once freed
        self._text: bytes | None = None

    @property
    def text(self) -> bytes:  # type: ignore[override]  # read lazily; nothing assigns a piece's text once made
        if self._text is None:
            if self.slot is None:
                raise RuntimeError("the text of a piece whose slot was freed")
            return self.slots.read(self.slot, self._length)
        return self._text

    @property
    def length(self) -> int:
        return self._length

    def done(self, keep: bool) -> None:
        if self.slot is None:
            return
        if keep:
            self._text = self.slots.read(self.slot, self._length)
        self.slots.release(self.slot)
        self.slot = None


class _Inflater:
    """A gzip file's JSON, inflated by ISA-L (else zlib), which also checks each member's CRC and
    length (``gzip.GzipFile`` inflates with zlib, computes the CRC again and copies each block
    twice more on the way: 0.2 s of the 0.2 GB trace's read on 2 cores, besides zlib's 0.25 s). Members one after the other (and zeros between them,
    as gzip allows) are read as one stream; a stream cut short raises ``EOFError``."""

    #: compressed bytes read at a time
    INPUT_BYTES = 256 * 1024

    def __init__(self, fh: BinaryIO, path: Path | None = None, max_bytes: int | None = None) -> None:
        self._fh = fh
        self._path = Path(path or "the trace")
        #: inflated bytes past which the read stops (``--max-trace-gb``: a gzip trailer can lie)
        self._max_bytes = max_bytes
        self._zlib = _inflating.decompressobj(31)
        self._input = b""
        self._read_in = 0
        self._given_out = 0

    def close(self) -> None:
        self._fh.close()

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes (fewer only at the end; b"" after it)."""
        parts = []
        n = 0
        while n < size:
            out = self._inflate(size - n)
            if not out:
                break
            parts.append(out)
            n += len(out)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, view: memoryview) -> int:
        n = 0
        while n < len(view):
            out = self._inflate(len(view) - n)
            if not out:
                break
            view[n : n + len(out)] = out
            n += len(out)
        return n

    def _inflate(self, most: int) -> bytes:
        """At most ``most`` bytes, b"" only at the end of the last member."""
        while True:
            if self._zlib.eof and not self._next_member():
                return b""
            if not self._input:
                self._input = self._fh.read(self.INPUT_BYTES)
                self._read_in += len(self._input)
                if not self._input:
                    out = self._zlib.decompress(b"", most)  # what zlib holds back still
                    if out:
                        return out
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
            out = self._zlib.decompress(self._input, most)
            self._input = self._zlib.unused_data if self._zlib.eof else self._zlib.unconsumed_tail
            if out:
                self._given_out += len(out)
                if self._given_out > RATIO_AFTER_BYTES and self._given_out > MAX_INFLATION_RATIO * self._read_in:
                    raise _inflation_error(self._path, self._read_in, self._given_out)
                if self._max_bytes is not None and self._given_out > self._max_bytes:
                    raise _over_limit(self._path, self._given_out, self._max_bytes, "inflates to more than")
                return out

    def _next_member(self) -> bool:
        while True:
            self._input = self._input.lstrip(b"\0")
            if self._input:
                self._zlib = _inflating.decompressobj(31)
                return True
            self._input = self._fh.read(self.INPUT_BYTES)
            if not self._input:
                return False


def read_span(path: str | Path, offset: int, length: int) -> bytes:
    """``length`` bytes of a plain file from ``offset`` (fewer where the file is shorter now)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def is_gzip(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


#: how much of a trace's JSON ``trace_rank`` reads: torch.profiler writes ``distributedInfo``
#: among the few metadata keys before ``traceEvents``
_HEAD_BYTES = 256 * 1024


#: ``"distributedInfo": {...}``, its object holding objects one level deep (``pg_config``)
_DISTRIBUTED_INFO = re.compile(rb'"distributedInfo"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')


def trace_rank(path: Path) -> int | None:
    """The rank the trace's ``distributedInfo`` names, read from its first bytes alone (a folder
    of the user's own traces is grouped by rank before any is analysed); None where it names
    none there, or the head cannot be read."""
    try:
        if is_gzip(path):
            head = _inflating.decompressobj(31).decompress(read_span(path, 0, _HEAD_BYTES), _HEAD_BYTES)
        else:
            head = read_span(path, 0, _HEAD_BYTES)
    except _READ_ERRORS:
        return None
    events = head.find(b'"traceEvents"')
    at = head.find(b'"distributedInfo"', 0, events if events >= 0 else len(head))
    found = _DISTRIBUTED_INFO.match(head, at) if at >= 0 else None
    try:
        info = orjson.loads(found.group(1)) if found else None
    except orjson.JSONDecodeError:
        return None
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if type(rank) is int and rank >= 0 else None


#: deflate packs at most this many bytes into one
_MAX_DEFLATE_RATIO = 1032
#: compressed bytes inflated to learn a gzipped trace's ratio
_RATIO_HEAD_BYTES = 1024 * 1024
#: a gzip trailer records the length modulo this
_ISIZE_MODULUS = 1 << 32


def json_size_estimate(path: Path) -> int:
    """Bytes of JSON the file holds: its size; for gzip, the length the trailer records, which
    is modulo 4 GiB: where the file could hold more, plus the multiple of 4 GiB that brings it
    nearest the file's size times the ratio its first MB inflates at (a 5 GB trace's trailer
    says 0.7 GB; a ratio of 5 assumed, as before, made it 2 GB, and the detail window read 2.5
    times the JSON it budgets). Members one after another record only the last one's length:
    ``step_marks`` counts a trace over the detail budget exactly."""
    size = path.stat().st_size
    if not is_gzip(path):
        return size
    with path.open("rb") as fh:
        fh.seek(-4, io.SEEK_END)
        recorded = int.from_bytes(fh.read(4), "little")
        if size * _MAX_DEFLATE_RATIO < _ISIZE_MODULUS:
            return recorded % _ISIZE_MODULUS
        fh.seek(0)
        head = fh.read(_RATIO_HEAD_BYTES)
    inflater = _inflating.decompressobj(31)
    try:
        out = len(inflater.decompress(head, _RATIO_HEAD_BYTES * 64))
    except _READ_ERRORS:
        return max(recorded, 5 * size)  # the read will say what is wrong with the file
    used = len(head) - len(inflater.unconsumed_tail) - len(inflater.unused_data)
    guess = size * out / max(used, 1)
    recorded %= _ISIZE_MODULUS  # (a no-op but where a test makes the modulus smaller)
    return recorded + max(0, round((guess - recorded) / _ISIZE_MODULUS)) * _ISIZE_MODULUS


def _inflation_error(path: Path, compressed: int, inflated: int) -> TraceError:
    return TraceError(
        f"{path} inflates over {MAX_INFLATION_RATIO} times its compressed size "
        f"({compressed / 1e6:.1f} MB to {inflated / 1e6:,.0f} MB so far): not a trace torch.profiler wrote",
        hint="a torch.profiler trace gzips 15-17 times smaller; was this file made some other way?",
    )


def _over_limit(path: Path, json_bytes: int, max_bytes: int, how: str = "is") -> TraceError:
    def gb(n: int) -> str:  # three digits, never an exponent (a limit of 0.00001 GB reads as given)
        x = n / 1e9
        text = f"{x:.{max(0, 2 - math.floor(math.log10(x)))}f}" if x > 0 else "0"
        return text.rstrip("0").rstrip(".") if "." in text else text

    return TraceError(
        f"{path} {how} {gb(json_bytes)} GB, over the {gb(max_bytes)} GB limit given",
        hint="profile fewer steps (diagnose run --steps 3) or raise the limit with --max-trace-gb",
    )


def check_size(path: Path, json_bytes: int, max_bytes: int | None = None) -> None:
    """Refuse, before reading, a trace over ``max_bytes`` of JSON (None: no limit), or a gzip
    that inflates over ``MAX_INFLATION_RATIO`` times its size. ``json_bytes`` (the estimate) only
    raises the suspicion: a damaged trailer says anything, and a damaged file is reported as
    such by the read. The suspect's head is inflated until the ratio shows (a gzip of
    whitespace: its first 16 MB) or does not (as many bytes as the ratio allows)."""
    if max_bytes is not None and json_bytes > max_bytes:
        raise _over_limit(path, json_bytes, max_bytes)
    size = path.stat().st_size
    if json_bytes > RATIO_AFTER_BYTES and json_bytes > MAX_INFLATION_RATIO * size and is_gzip(path):
        inflater = _Inflater(path.open("rb"), path)
        try:
            inflated, most = 0, MAX_INFLATION_RATIO * size + RATIO_AFTER_BYTES
            while inflated <= most and (got := len(inflater.read(BLOCK_BYTES))):
                inflated += got
        except _READ_ERRORS:
            pass
        finally:
            inflater.close()


class TraceStream:
    """The events array of one trace file, read a block at a time; a gzipped one is refused once
    it inflates past ``max_bytes`` (None: no limit) or ``MAX_INFLATION_RATIO`` times its size."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        p = self.path
        if not p.exists():
            raise TraceError(
                f"no such trace file: {p}", hint="give the path of a .pt.trace.json(.gz) or a run directory"
            )
        if not p.is_file():
            raise TraceError(f"not a file: {p}")
        if p.stat().st_size == 0:
            raise TraceError(f"empty trace file: {p}", hint="the profiler wrote nothing; re-run the capture")
        self.gzipped = is_gzip(p)
        self.metadata: dict[str, Any] = {}
        #: bytes of JSON read so far (after decompression)
        self.bytes_read = 0

    # --- reading ---------------------------------------------------------------------------------

    def _open(self) -> io.BufferedReader | _Inflater:
        try:
            fh = self.path.open("rb")
        except _READ_ERRORS as exc:
            raise self._unreadable(exc) from exc
        return _Inflater(fh, self.path, self.max_bytes) if self.gzipped else fh

    def _unreadable(self, exc: BaseException) -> TraceError:
        kind = "gzip " if self.gzipped else ""
        return TraceError(f"cannot read {self.path}: {exc}", hint=f"the file may be truncated or not valid {kind}data")

    def _blocks(self, reader: io.BufferedReader | _Inflater) -> Generator[bytes, None, None]:
        """The JSON, a block at a time, from ``reader`` (which the caller closes)."""
        while block := self._read(reader.read, BLOCK_BYTES):
            yield block

    def decoded(
        self,
        decode: Callable[[Piece], Decoded],
        submit: Callable[[Piece], Callable[[], Any]] | None = None,
        in_flight: int = 1,
        idle: Callable[[], object] | None = None,
        idle_in_flight: int = 0,
        slots: SharedSlots | None = None,
    ) -> Generator[Any, None, None]:
        """``decode`` of each piece of the events array, in order; sets ``metadata`` at the end.
        ``decode`` raises msgspec's or orjson's decode error on text that does not parse.

        ``submit(piece)``, when given, starts the decoding of a piece elsewhere (a worker process)
        and returns what to call for its result (which raises the same errors): up to
        ``in_flight`` pieces are under way at once, and the results still come in order. Joined
        pieces (a cut that was not between events) and the array's last piece are decoded here
        with ``decode``. ``idle``, when given, is called once, when the first pieces are under way
        and their results not yet in: work this process can do while it would wait; up to
        ``idle_in_flight`` pieces (at least ``in_flight``) are started before it, so that the
        workers have enough to do while it runs. With ``slots``, a gzipped trace's pieces are
        ``SlotPiece``s, inflated into them (one free for each piece that may be under way)."""
        reader = self._open()
        try:
            yield from self._decoded(reader, decode, submit, in_flight, idle, idle_in_flight, slots)
        finally:
            reader.close()

    def _decoded(
        self,
        reader: io.BufferedReader | _Inflater,
        decode: Callable[[Piece], Decoded],
        submit: Callable[[Piece], Callable[[], Any]] | None,
        in_flight: int,
        idle: Callable[[], object] | None,
        idle_in_flight: int,
        slots: SharedSlots | None,
    ) -> Iterator[Any]:
        blocks = self._blocks(reader)
        buf = b""
        prefix: bytes | None = None  # the document up to the array's "[" (b"" for a bare array)
        for block in blocks:
            buf += block
            prefix, start = self._find_array(buf)
            if prefix is not None:
                buf = buf[start:]
                offset = start
                break
            if len(buf) > MAX_HEADER_BYTES:
                raise TraceError(
                    f"{self.path} is not a Chrome trace (no traceEvents list in its first {MAX_HEADER_BYTES >> 20} MB)"
                )
        else:
            self._not_a_trace(buf)
        pending: Piece | None = None  # a piece that did not parse yet, waiting for the next
        under_way: deque[tuple[Piece, Callable[[], Any] | None]] = deque()
        tail: list[tuple[bytes, int]] = []  # what follows the last piece, and its offset
        if submit is not None and not self.gzipped:  # the workers read the pieces: find their ends only
            blocks.close()
            pieces: Generator[Piece, None, None] = self._sought(offset, tail)
        elif submit is not None and slots is not None:
            pieces = self._slotted(reader, slots, buf, offset, tail)
        else:
            pieces = self._cut(blocks, buf, offset, tail)
        window = max(in_flight, idle_in_flight if idle is not None else 0, 1)
        try:
            for piece in pieces:
                under_way.append((piece, None if submit is None else submit(piece)))
                if idle is not None and len(under_way) >= window:
                    idle()
                    idle, window = None, max(in_flight, 1)
                while len(under_way) >= window:
                    pending, result = _settle(pending, *under_way.popleft(), decode, self.path)
                    if pending is None and result is not None:
                        yield result
        finally:
            pieces.close()  # its thread (``_slotted``'s) ends here
        if idle is not None and under_way:  # fewer pieces than the window: all of them under way
            idle()
        while under_way:
            pending, result = _settle(pending, *under_way.popleft(), decode, self.path)
            if pending is None and result is not None:
                yield result
        ((buf, offset),) = tail
        if pending is not None:  # a cut inside the metadata after the array
            buf, offset, pending = b"".join((pending.text, pending.separator, buf)), pending.offset, None
        # The array's "]" is the last one after which the rest of the document parses and before
        # which the events do: the metadata after the array may hold "]" too.
        for text, metadata in self._array_ends(prefix, buf):
            try:
                result = _settle(pending, Piece(text, b"", offset), None, decode, self.path)[1]
            except TraceError:
                continue
            if result is None and text.strip():
                continue
            self.metadata = metadata
            if result is not None:
                yield result
            return
        if _BOUNDARY.search(buf):  # whole events, then something that is not JSON
            raise _invalid(self.path, Piece(buf, b"", offset))
        raise TraceError(
            f"{self.path} is not valid JSON (the traceEvents array does not end, after {offset + len(buf):,} bytes)",
            hint=_TRUNCATED_HINT,
        )

    def _cut(
        self, blocks: Iterator[bytes], buf: bytes, offset: int, tail: list[tuple[bytes, int]]
    ) -> Generator[Piece, None, None]:
        """The pieces of the events array read block by block (from ``offset``, ``buf`` read
        already), each cut at the last place two events meet; ``tail`` receives the rest."""
        carry, clean = bytearray(buf), 0  # (``clean``: bytes of ``carry`` that hold no boundary)
        for block in blocks:
            piece, offset = _cut_last(carry, block, offset, clean)
            clean = len(carry)
            if piece is not None:
                yield piece
        tail.append((bytes(carry), offset))

    def _slotted(
        self,
        reader: io.BufferedReader | _Inflater,
        slots: SharedSlots,
        buf: bytes,
        offset: int,
        tail: list[tuple[bytes, int]],
    ) -> Generator[Piece, None, None]:
        """``_cut``, each block inflated straight into a slot of shared memory, by a thread of its
        own: the inflater lets go of the GIL while it inflates, so that this thread merges the workers'
        columns meanwhile (with the inflating done here, the 1 GB trace's read waited on it:
        7.2 s on a 16-core host, its workers idle most of the time). The text is copied once on
        its way to the worker that reads it in the slot (four times through ``_cut`` and a pipe).
        The thread ends before this generator does, however it ends."""
        ready: queue.SimpleQueue[Any] = queue.SimpleQueue()
        stop = threading.Event()

        def inflate() -> None:
            try:
                for piece in self._inflated(reader, slots, buf, offset, tail, stop):
                    ready.put(piece)
                ready.put(None)
            except BaseException as exc:  # noqa: BLE001 - raised again in the reading thread
                ready.put(exc)

        thread = threading.Thread(target=inflate, name="diagnose-inflate", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            slots.wake()
            thread.join()

    def _inflated(
        self,
        reader: io.BufferedReader | _Inflater,
        slots: SharedSlots,
        carried: bytes,
        offset: int,
        tail: list[tuple[bytes, int]],
        stop: threading.Event,
    ) -> Generator[Piece, None, None]:
        """The pieces, each inflated into a slot after the end of an event the piece before cut
        off (waiting for a free slot); a piece is bytes where that end leaves no room for a
        block (an event of megabytes). Stops early, with no tail, once ``stop`` is set."""
        carry, clean = bytearray(carried), 0  # (``clean``: bytes of ``carry`` that hold no boundary)
        while not stop.is_set():
            if len(carry) + BLOCK_BYTES > slots.size:
                block = self._read(reader.read, BLOCK_BYTES)
                if not block:
                    break
                piece, offset = _cut_last(carry, block, offset, clean)
                clean = len(carry)
                if piece is not None:
                    yield piece
                continue
            slot = slots.take(wait=stop)
            if slot is None:
                return
            with slots.view(slot) as view:
                view[: len(carry)] = carry
                filled = len(carry) + self._read(reader.readinto, view[len(carry) : len(carry) + BLOCK_BYTES])
                if filled == len(carry):
                    slots.release(slot)
                    break
                cut = _last_boundary(view[:filled], clean)
                if cut is None:
                    carry = bytearray(view[:filled])
                    clean = len(carry)
                    slots.release(slot)
                    continue
                piece = SlotPiece(slots, slot, cut[0], bytes(view[cut[0] : cut[1]]), offset)
                offset += cut[1]
                carry = bytearray(view[cut[1] : filled])
                clean = len(carry)
            yield piece
        else:
            return
        tail.append((bytes(carry), offset))

    def _read(self, read: Callable[[Any], Any], into: Any) -> Any:
        """``read(into)`` (a size or a buffer), counted in ``bytes_read``, read errors as ``TraceError``."""
        try:
            got = read(into)
        except _READ_ERRORS as exc:
            raise self._unreadable(exc) from exc
        self.bytes_read += got if type(got) is int else len(got)
        return got

    def _sought(self, offset: int, tail: list[tuple[bytes, int]]) -> Generator[FilePiece, None, None]:
        """The pieces of a plain file's events array from ``offset``, each cut at the first place
        two events meet after ``BLOCK_BYTES``, found by seeking there and reading a little: this
        process never reads the pieces (their readers do; on a 0.2 GB trace reading and cutting
        every block took this process 0.19 s, a fifth of its share of the read). The last
        ``TAIL_BYTES`` or so, with whatever follows the array, go to ``tail`` (this process
        decodes them: the less, the sooner the read ends)."""
        size = self.path.stat().st_size
        keep = min(TAIL_BYTES, BLOCK_BYTES)
        try:
            with self.path.open("rb") as fh:
                while size - offset > keep:
                    found = self._next_boundary(fh, offset + min(BLOCK_BYTES, size - offset - keep), size)
                    if found is None:
                        break
                    end, next_start, separator = found
                    yield FilePiece(self.path, offset, end - offset, separator)
                    offset = self.bytes_read = next_start
                fh.seek(offset)
                rest = fh.read()
        except _READ_ERRORS as exc:
            raise TraceError(f"cannot read {self.path}: {exc}", hint="the file may be truncated") from exc
        self.bytes_read = offset + len(rest)
        tail.append((rest, offset))

    @staticmethod
    def _next_boundary(fh: BinaryIO, at: int, size: int) -> tuple[int, int, bytes] | None:
        """(end of an event, start of the next, the text between) at the first candidate cut
        from ``at`` on; None when the file holds none after it."""
        span = 1 << 16
        while True:
            fh.seek(at)
            window = fh.read(span)
            match = _BOUNDARY.search(window)
            if match is not None:
                return at + match.start() + 1, at + match.end() - 1, window[match.start() + 1 : match.end() - 1]
            if at + len(window) >= size:
                return None
            span *= 4  # a long event, or a run of white space across the window's end: read on

    def _find_array(self, buf: bytes) -> tuple[bytes | None, int]:
        stripped = buf.lstrip()
        if stripped.startswith(b"["):
            return b"", len(buf) - len(stripped) + 1
        for match in _EVENTS_KEY.finditer(buf):
            prefix = buf[: match.end() - 1]
            try:
                orjson.loads(prefix + b"[]}")
            except orjson.JSONDecodeError:
                continue  # the key inside a string or a nested object
            return prefix, match.end()
        return None, 0

    def _not_a_trace(self, buf: bytes) -> NoReturn:
        try:
            data = orjson.loads(buf)
        except orjson.JSONDecodeError as exc:
            raise TraceError(
                f"{self.path} is not valid JSON ({str(exc).splitlines()[0]})", hint=_TRUNCATED_HINT
            ) from exc
        if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):  # pragma: no cover - found above
            raise AssertionError("traceEvents missed")
        raise TraceError(f"{self.path} is JSON but not a Chrome trace (no traceEvents list)")

    def _array_ends(self, prefix: bytes, buf: bytes) -> Iterator[tuple[bytes, dict[str, Any]]]:
        """(last events, metadata) for each "]" of the document's tail after which the rest of
        the document parses with an empty array in the events' place, the last first."""
        end = len(buf)
        for _ in range(10_000):
            q = buf.rfind(b"]", 0, end)
            if q < 0:
                return
            end = q
            tail = buf[q + 1 :]
            if prefix == b"":
                if not tail.strip():
                    yield buf[:q], {}
                continue
            try:
                metadata = orjson.loads(prefix + b"[]" + tail)
            except orjson.JSONDecodeError:
                continue
            if isinstance(metadata, dict):
                metadata.pop("traceEvents", None)
                yield buf[:q], metadata


_STEP_MARK = b'"ProfilerStep#'
#: what ``step_marks`` maps of a plain file at a time (a multiple of any page size)
MARKS_WINDOW_BYTES = 16 * 1024 * 1024
_TS = re.compile(rb'"ts"\s*:\s*"?(-?[0-9][0-9.eE+-]*)')
_DUR = re.compile(rb'"dur"\s*:\s*"?(-?[0-9][0-9.eE+-]*)')


def step_marks(path: str | os.PathLike[str]) -> tuple[list[tuple[float, float]], int]:
    """The host's ``ProfilerStep#N`` spans (start, end) of a trace, sorted, found by a scan of
    its text (no parse): the object around each mark, its ``ts`` and ``dur``. The GPU's copies
    of the marks (``gpu_user_annotation``) are left out. A plain file is searched where it lies
    (mapped ``MARKS_WINDOW_BYTES`` at a time, never copied: about 0.3 s a GB, where reading it
    block by block and searching each with a regular expression took 1.2-1.5 s a GB, all before
    the read could start; one window at a time, because a mapped page counts in the resident
    set as long as it is mapped: the whole 5 GB trace mapped at once showed a 4.7 GiB peak); a
    gzipped one a block at a time, inflated into one buffer (joining each block to the end of
    the one before took a third of the scan's 1.2 s a GB on 2 cores). With them, the bytes of
    JSON scanned: the exact length, where ``json_size_estimate`` guesses a gzipped one's."""
    stream = TraceStream(path)
    marks: set[tuple[float, float]] = set()
    if not stream.gzipped:
        try:
            size = stream.path.stat().st_size
            with stream.path.open("rb") as fh:
                for at in range(0, size, MARKS_WINDOW_BYTES):
                    # each window reaches 4 KB into the next: a mark's object cut by its end is whole there
                    with mmap.mmap(
                        fh.fileno(), min(MARKS_WINDOW_BYTES + 4096, size - at), access=mmap.ACCESS_READ, offset=at
                    ) as window:
                        _find_marks(window, marks)
            return sorted(marks), size
        except (OSError, ValueError):  # a file that cannot be mapped: read it
            marks.clear()
    keep = 4096  # a mark cut by a block's end is whole in the next buffer, which starts with these
    buf = bytearray(keep + BLOCK_BYTES)
    reader = stream._open()
    try:
        with memoryview(buf) as view:
            filled = 0
            while True:
                carried = min(filled, keep)
                view[:carried] = view[filled - carried : filled]
                read = stream._read(reader.readinto, view[carried:])
                if not read:
                    break
                filled = carried + read
                _find_marks(buf, marks, filled)
    finally:
        reader.close()
    return sorted(marks), stream.bytes_read


def _find_marks(buf: bytes | bytearray | mmap.mmap, marks: set[tuple[float, float]], size: int | None = None) -> None:
    """The marks in ``buf``'s first ``size`` bytes (all of it by default)."""
    size = len(buf) if size is None else size
    at = buf.find(_STEP_MARK, 0, size)
    while at >= 0:
        start = buf.rfind(b"{", 0, at)
        end = buf.find(b"}", at, size)
        if start >= 0 and end >= 0:
            text = buf[start:end]
            if b"gpu_user_annotation" not in text:
                ts, dur = _TS.search(text), _DUR.search(text)
                if ts and dur:
                    try:
                        marks.add((float(ts.group(1)), float(ts.group(1)) + float(dur.group(1))))
                    except ValueError:
                        pass
        at = buf.find(_STEP_MARK, at + 1, size)


def _cut_last(carry: bytearray, block: bytes, offset: int, clean: int) -> tuple[Piece | None, int]:
    """``block`` appended to ``carry`` (the text after the last cut, at ``offset``, whose first
    ``clean`` bytes hold no boundary), which is then cut at its last candidate boundary: (the
    piece before it, taken off ``carry``, or None where there is none; the offset of what
    ``carry`` holds then). Linear in the text, however long an event: ``carry`` grows in place,
    and the search starts ``_BOUNDARY_REACH`` before the text not yet searched. Joining the carry
    to each block as new bytes, and searching all of it, took time quadratic in an event's
    length: a trace with an event of 128 MB was analysed in 8.9 s gzipped, 1.5 s plain."""
    carry += block
    cut = _last_boundary(carry, clean)
    if cut is None:
        return None, offset
    with memoryview(carry) as view:
        piece = Piece(bytes(view[: cut[0]]), bytes(view[cut[0] : cut[1]]), offset)
    del carry[: cut[1]]  # (a bytearray drops its head without moving the rest)
    return piece, offset + cut[1]


#: how far before the new text a boundary's search starts: a boundary is found across the end of
#: the text before only where the white space inside it is shorter than this (Kineto writes none
#: or a newline); a longer one is not cut, and the piece holds more events (a cut is never needed)
_BOUNDARY_REACH = 4096


def _last_boundary(buf: bytes | bytearray | memoryview, clean: int = 0) -> tuple[int, int] | None:
    """(end of the piece, start of the next) at the last candidate cut in ``buf``, whose first
    ``clean`` bytes hold none (the text after a cut, searched already: only what follows is)."""
    floor = max(0, clean - _BOUNDARY_REACH)
    window = 1 << 16
    while True:
        start = max(floor, len(buf) - window)
        last = None
        for last in _BOUNDARY.finditer(buf, start):  # noqa: B007 - runs to the last match
            pass
        if last is not None:
            return last.start() + 1, last.end() - 1
        if start == floor:
            return None
        window *= 8


def _settle(
    pending: Piece | None,
    piece: Piece,
    started: Callable[[], Any] | None,
    decode: Callable[[Piece], Decoded],
    path: Path,
) -> tuple[Piece | None, Any]:
    """Decode ``piece`` (``started``: its decoding under way elsewhere), joined to a piece that
    did not parse; (still pending, decoded). A joined piece is decoded here: what was started
    for the piece alone began inside an event and is dropped. A joined piece grows in place and
    is parsed again only once it has doubled since it last failed (or passed
    ``MAX_JOINED_PIECE_BYTES``): an event of many blocks whose text holds candidate cuts (``}, {``
    in a string) is parsed a bounded number of times per byte, where parsing it again after every
    block took time quadratic in its length (11 s for one event of 64 MB, 0.35 s for 16 MB)."""
    if pending is not None:
        if started is not None:  # collected, so that the worker is free for its next piece
            try:
                started()
            except Exception:  # noqa: BLE001 - the piece alone began inside an event: it does not parse
                pass
        started = None
        text = pending.text if type(pending.text) is bytearray else bytearray(pending.text)
        text += pending.separator
        text += piece.text
        piece = Piece(text, piece.separator, pending.offset, pending.tried)
        if len(text) < 2 * piece.tried and len(text) <= MAX_JOINED_PIECE_BYTES:
            return piece, None
    if (
        not isinstance(piece, (FilePiece, SlotPiece)) and not piece.text.strip()
    ):  # an empty array (a piece cut between events holds one)
        if started is not None:  # collected all the same: what it holds is freed with the answer
            started()
        return None, None
    try:
        return None, decode(piece) if started is None else started()
    except _SYNTAX_ERRORS:
        if len(piece.text) > MAX_JOINED_PIECE_BYTES:
            raise _invalid(path, piece) from None
        piece.tried = len(piece.text)
        return piece, None
    except UnicodeDecodeError:
        # a name cut inside a character (or bytes of another encoding): the piece is read with
        # those bytes as U+FFFD, which every output shows; the rest of the trace is unharmed
        readable = Piece(piece.text.decode("utf-8", "replace").encode("utf-8"), piece.separator, piece.offset)
        return _settle(None, readable, None, decode, path)
    except RecursionError:
        raise TraceError(
            f"{path}: an event near byte {piece.offset:,} nests JSON deeper than the reader follows",
            hint="torch.profiler writes no such event: was the trace edited or generated?",
        ) from None


def _invalid(path: Path, piece: Piece) -> TraceError:
    try:
        orjson.loads(piece.as_array())
        reason = "unparseable events"
    except orjson.JSONDecodeError as exc:
        reason = f"{exc.msg} at byte {piece.offset + exc.pos - 1:,}"
    if "depth" in reason:  # valid JSON nested deeper than a reader follows (1,024 levels)
        return TraceError(
            f"{path} nests JSON too deep ({reason})",
            hint="torch.profiler writes no event nested that deep: was the trace edited or generated?",
        )
    return TraceError(f"{path} is not valid JSON ({reason})", hint=_TRUNCATED_HINT)


def decode_events(piece: Piece) -> list[Event]:
    """The piece's events, typed; an element that is not an object (or holds a field of an
    unexpected shape, such as ``args`` a list) sends the piece through ``decode_objects``."""
    try:
        return _EVENTS_DECODER.decode(piece.as_array())
    except msgspec.ValidationError:
        return [e for e in map(event_from_object, decode_objects(piece)) if e is not None]


class _Start(msgspec.Struct, gc=False):
    ts: Any = None


_STARTS_DECODER = msgspec.json.Decoder(list[_Start])


def count_if_all_after(piece: Piece, cut: float) -> int | None:
    """The number of events in the piece when every one of them starts at or after ``cut`` (a
    number ``ts``), else None: a piece past a detail window is skipped whole, for the price of
    reading one field. Anything unusual (a missing or odd ``ts``, an element that is not an
    object, text that does not parse) says None: the full decode deals with it. A piece whose
    first event starts before ``cut`` says None at once (the usual piece inside the window:
    reading its starts first would cost a second pass over it)."""
    first = _TS.search(piece.text, 0, 4096)
    if first is not None:
        try:
            if float(first.group(1)) < cut:
                return None
        except ValueError:
            return None
    try:
        starts = _STARTS_DECODER.decode(piece.as_array())
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    for event in starts:
        ts = event.ts
        if not ((type(ts) is float or type(ts) is int) and ts >= cut):
            return None
    return len(starts)


def decode_objects(piece: Piece) -> list[Any]:
    objects: list[Any] = orjson.loads(piece.as_array())
    return objects


def event_from_object(obj: Any) -> Event | None:
    """An ``Event`` from a parsed dict (None for an element that is not an object). A malformed
    ``args`` is kept as it is, for the reader to name where it reads it."""
    if not isinstance(obj, dict):
        return None
    get = obj.get
    args = get("args", UNSET)
    if isinstance(args, dict):
        args = EventArgs(
            args.get("correlation", UNSET),
            args.get("device", UNSET),
            args.get("stream", UNSET),
            args.get("bytes", UNSET),
            args.get("name", UNSET),
        )
    return Event(
        get("ph", UNSET),
        get("cat", UNSET),
        get("name", UNSET),
        get("tid", UNSET),
        get("ts", UNSET),
        get("dur", UNSET),
        args,
    )


# --- memory ---------------------------------------------------------------------------------------

#: what the whole analysis holds per byte of trace JSON at its peak, with margin:
#: benchmarks/trace_memory.py measured 0.39 GiB for 0.2 GB, 0.71 GiB for 1 GB and 1.28 GiB for
#: 2 GB of replicated H200 steps (0.64-0.76 byte per byte) once the replay model was bounded
#: (replay.MODEL_MAX_OPS); the reader itself peaks at about 0.35 byte per byte
MEMORY_PER_JSON_BYTE = 0.8
#: stop reading when the machine has less than this left: better a clear error than the OOM killer
MEMORY_RESERVE_BYTES = 256 * 1024 * 1024


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable); None off Linux."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_CUT_HINT = (
    "cut the trace to a few steps (diagnose trim TRACE OUT --keep 3), or analyse it on a machine with more memory"
)


def check_fits(path: Path, json_bytes: int) -> None:
    """Refuse, before reading, a trace that cannot fit in the memory available now."""
    available = available_memory()
    needed = int(json_bytes * MEMORY_PER_JSON_BYTE)
    if available is not None and needed > available - MEMORY_RESERVE_BYTES:
        raise TraceError(
            f"{path} holds {json_bytes / 1e9:.1f} GB of JSON: analysing it needs about {needed / 2**30:.1f} GiB "
            f"of memory, and {max(available, 0) / 2**30:.1f} GiB is available",
            hint=_CUT_HINT,
        )


class MemoryGuard:
    """Checked after each piece: stops the read with a clear error while memory remains."""

    def __init__(self, origin: str, reserve_bytes: int = MEMORY_RESERVE_BYTES) -> None:
        self.origin = origin
        self.reserve_bytes = reserve_bytes

    def check(self, bytes_read: int) -> None:
        available = available_memory()
        if available is not None and available < self.reserve_bytes:
            raise TraceError(
                f"out of memory reading {self.origin}: {available / 2**20:.0f} MiB left after {bytes_read / 1e9:.2f} GB of JSON",
                hint=_CUT_HINT,
            )
