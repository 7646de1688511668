"""Segment files: whole-line zstd entries, rollover, one writer per file, torn tails found and cut."""

from __future__ import annotations

import errno
import os
import random
import shutil
import struct
import subprocess
import sys
from typing import Any

import orjson
import pytest
import zstandard

from prime_runs._local.segment_reader import iter_entry_lines, scan
from prime_runs._local.segments import Frame, SegmentName, SegmentWriter, frames_of, segment_files
from prime_traces._lines.parts import LineParts

ZSTDCAT = shutil.which("zstdcat")


def lines(prefix: str, count: int, size: int = 40) -> list[bytes]:
    """Lines of about ``size`` bytes that compress little (so sizes on disk are predictable)."""
    rng = random.Random(f"{prefix}{count}{size}")
    return [orjson.dumps({"id": f"{prefix}{i}", "pad": rng.randbytes(size // 2).hex()}) for i in range(count)]


def read_all(path) -> list[bytes]:
    with open(path, "rb") as handle:
        data = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True).read()
    return data.split(b"\n")[:-1]


def only_file(directory, kind: str = "episode") -> str:
    files = segment_files(str(directory), [kind])
    assert len(files) == 1, files
    return files[0]


def test_entries_hold_whole_lines_and_count_them_without_decoding(tmp_path):
    writer = SegmentWriter(str(tmp_path), "episode")
    first, second = lines("a", 3), lines("b", 2)
    parts = LineParts((b'{"id": "c0", ', b'"pad": "y"}'))
    writer.append([Frame(first), Frame(second, batch=True)])
    writer.append([Frame([parts])])
    writer.close()
    path = only_file(tmp_path)
    name = SegmentName.parse(os.path.basename(path))
    assert name is not None and (name.kind, name.pid, name.seq) == ("episode", os.getpid(), 1)
    result = scan(path)
    assert [(e.lines, e.batch) for e in result.entries] == [(3, False), (2, True), (1, False)]
    assert result.lines == 6 and result.torn_bytes == 0 and result.problem is None
    assert result.raw_bytes == sum(len(line) + 1 for line in first + second) + parts.size + 1
    assert read_all(path) == first + second + [b"".join(parts)]
    decoded = [body for _entry, body in iter_entry_lines(path, result.entries)]
    assert decoded == [first, second, [b"".join(parts)]]


@pytest.mark.skipif(ZSTDCAT is None, reason="zstdcat is not installed")
def test_zstdcat_reads_a_segment_as_jsonl(tmp_path):
    writer = SegmentWriter(str(tmp_path), "trace")
    written = lines("t", 50)
    writer.append(frames_of(written, max_frame_bytes=500))
    path = only_file(tmp_path, "trace")
    assert len(scan(path).entries) > 3
    out = subprocess.run([ZSTDCAT, path], capture_output=True, check=True).stdout
    assert out == b"".join(line + b"\n" for line in written)


def test_a_segment_rolls_over_at_its_size_limit(tmp_path):
    writer = SegmentWriter(str(tmp_path), "episode", max_segment_bytes=2_000)
    for i in range(20):
        writer.append([Frame(lines(f"r{i}-", 5, size=200))])
    files = segment_files(str(tmp_path), ["episode"])
    assert len(files) > 3
    assert [SegmentName.parse(os.path.basename(f)).seq for f in files] == list(range(1, len(files) + 1))
    total = [line for f in files for line in read_all(f)]
    assert total == [line for i in range(20) for line in lines(f"r{i}-", 5, size=200)]
    for path in files[:-1]:
        assert 0 < os.path.getsize(path) <= 2_000 + 1_000  # an entry never straddles two files


def test_a_writer_never_appends_to_a_file_an_earlier_process_left(tmp_path):
    # The same pid on another boot (a container's pid 1 above all) names the same file.
    host_name = SegmentName.parse(os.path.basename(_one_segment(tmp_path)))
    assert host_name is not None
    earlier = os.path.join(tmp_path, str(SegmentName("episode", host_name.host, os.getpid(), 1)))
    before = open(earlier, "rb").read()
    writer = SegmentWriter(str(tmp_path), "episode")
    writer.append([Frame(lines("new", 1))])
    assert open(earlier, "rb").read() == before
    assert writer.path is not None and writer.path.endswith("-000002.jsonl.zst")


def _one_segment(directory) -> str:
    writer = SegmentWriter(str(directory), "episode")
    writer.append([Frame(lines("old", 2))])
    writer.close()
    return only_file(directory)


def test_nothing_is_created_until_the_first_write(tmp_path):
    target = tmp_path / "not-yet"
    writer = SegmentWriter(str(target), "episode")
    writer.append([])
    writer.close()
    assert not target.exists()


def test_a_failed_write_is_cut_back_and_its_file_never_written_again(tmp_path, monkeypatch):
    writer = SegmentWriter(str(tmp_path), "episode")
    writer.append([Frame(lines("ok", 2))])
    path = writer.path
    size = os.path.getsize(path)

    def full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as raised:
        writer.append([Frame(lines("lost", 3)), Frame(lines("lost2", 3))])
    assert raised.value.durable_lines == 0
    monkeypatch.undo()
    assert os.path.getsize(path) == size
    # A live sync may have counted the lines that were cut: the next write starts a new file.
    writer.append([Frame(lines("later", 1))])
    assert writer.path != path
    assert read_all(path) == lines("ok", 2) and read_all(writer.path) == lines("later", 1)


def test_a_write_that_fails_after_a_rollover_keeps_and_says_which_lines_are_durable(tmp_path, monkeypatch):
    writer = SegmentWriter(str(tmp_path), "episode", max_segment_bytes=3_000)
    writer.append([Frame(lines("a", 5, size=200))])
    real_writev, calls = os.writev, []

    def fail_in_the_second_file(fd: int, buffers: Any) -> int:
        calls.append(fd)
        if len(calls) == 4:  # the fourth entry: the second file by then
            raise OSError(errno.EIO, "Input/output error")
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", fail_in_the_second_file)
    with pytest.raises(OSError) as raised:
        writer.append([Frame(lines(f"b{i}-", 5, size=200)) for i in range(6)])
    monkeypatch.undo()
    durable = raised.value.durable_lines // 5
    files = segment_files(str(tmp_path), ["episode"])
    on_disk = [line for f in files for line in read_all(f)]
    expected = lines("a", 5, size=200) + [x for i in range(durable) for x in lines(f"b{i}-", 5, size=200)]
    assert 0 < durable < 4 and on_disk == expected


# -- torn tails -----------------------------------------------------------------------


def _fixture(tmp_path, tail: bytes, *, cut: int | None = None) -> tuple[str, int, list[bytes]]:
    """A segment with two whole entries, then ``tail`` (or the last entry cut to ``cut`` bytes)."""
    writer = SegmentWriter(str(tmp_path), "episode")
    kept = lines("k", 4)
    writer.append([Frame(kept[:2]), Frame(kept[2:])])
    path = writer.path
    whole = os.path.getsize(path)
    if cut is not None:
        writer.append([Frame(lines("torn", 30, size=500))])
        writer.close()
        os.truncate(path, whole + cut)
    else:
        writer.close()
        with open(path, "ab") as handle:
            handle.write(tail)
    return path, whole, kept


def _zstd(data: bytes, *, with_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=with_size).compress(data)


@pytest.mark.parametrize(
    "tail",
    [
        _zstd(b'{"id": "no-newline"}'),  # a frame without the newline of its last line
        _zstd(b""),  # an empty trailing frame
        _zstd(b'{"id": "half"}\n{"id": "ha')[:-1],  # a frame cut short
        struct.pack("<II", 0x184D2A5E, 40) + b'{"lines": 1}',  # metadata cut short
        struct.pack("<II", 0x184D2A5E, 12) + b'{"lines": 1}',  # metadata without its frame
        b"\x00\x00\x00",  # stray bytes
    ],
    ids=["missing-newline", "empty-frame", "frame-cut", "metadata-cut", "metadata-alone", "stray-bytes"],
)
def test_a_torn_tail_is_found_cut_and_reported_and_the_whole_entries_stay(tmp_path, tail):
    path, whole, kept = _fixture(tmp_path, tail)
    found = scan(path)
    assert found.size == whole and found.torn_bytes == len(tail) and found.problem
    assert os.path.getsize(path) == whole + len(tail)  # a plain scan changes nothing
    repaired = scan(path, repair=True)
    assert repaired.torn_bytes == len(tail) and repaired.lines == 4
    assert os.path.getsize(path) == whole
    assert read_all(path) == kept
    assert scan(path).torn_bytes == 0


@pytest.mark.parametrize("cut", [1, 7, 20, 100, 400, 1_000])
def test_an_entry_cut_anywhere_is_cut_off_whole(tmp_path, cut):
    path, whole, kept = _fixture(tmp_path, b"", cut=cut)
    repaired = scan(path, repair=True)
    assert repaired.torn_bytes == cut and repaired.lines == 4
    assert os.path.getsize(path) == whole and read_all(path) == kept


def test_a_frame_written_by_another_tool_counts_when_whole(tmp_path):
    path, whole, kept = _fixture(tmp_path, _zstd(b'{"id": "x1"}\n{"id": "x2"}\n', with_size=False))
    result = scan(path, repair=True)
    assert result.torn_bytes == 0 and result.lines == 6
    assert read_all(path) == kept + [b'{"id": "x1"}', b'{"id": "x2"}']


def test_the_tail_of_a_file_a_live_writer_holds_is_never_cut(tmp_path):
    writer = SegmentWriter(str(tmp_path), "episode")
    writer.append([Frame(lines("a", 2))])
    path = writer.path
    with open(path, "ab") as handle:  # what a write in progress looks like from outside
        handle.write(_zstd(b'{"id": "in-progress"')[:10])
    result = scan(path, repair=True)
    assert result.live and result.torn_bytes == 0 and result.lines == 2
    assert os.path.getsize(path) > result.size  # left for the writer
    writer.close()
    assert scan(path, repair=True).torn_bytes == 10


def test_a_dead_writers_file_is_repaired_from_another_process(tmp_path):
    code = (
        "import sys, os\n"
        "from prime_runs._local.segments import SegmentWriter, Frame\n"
        "w = SegmentWriter(sys.argv[1], 'trace')\n"
        'w.append([Frame([b\'{"id": "a"}\'])])\n'
        "open(w.path, 'ab').write(b'\\x28\\xb5\\x2f\\xfd')\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=60)
    path = only_file(tmp_path, "trace")
    result = scan(path, repair=True)
    assert not result.live and result.torn_bytes == 4 and result.lines == 1


def test_a_rollover_whose_next_file_cannot_be_created_still_says_what_is_durable(tmp_path, monkeypatch):
    real_open_next, opened = SegmentWriter._open_next, []

    def open_next(self: SegmentWriter) -> None:
        opened.append(1)
        if len(opened) == 2:  # no inode left for the next file
            raise OSError(28, "No space left on device")
        real_open_next(self)

    monkeypatch.setattr(SegmentWriter, "_open_next", open_next)
    writer = SegmentWriter(str(tmp_path), "episode", max_segment_bytes=3_000)
    with pytest.raises(OSError) as raised:
        writer.append([Frame(lines(f"f{i}-", 5, size=600)) for i in range(4)])
    on_disk = [line for f in segment_files(str(tmp_path), ["episode"]) for line in read_all(f)]
    assert raised.value.durable_lines > 0 and len(on_disk) == raised.value.durable_lines
