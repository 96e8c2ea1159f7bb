"""Reading logs back in bounded chunks without breaking UTF-8 characters."""

from __future__ import annotations

from pathlib import Path

from phalanx.agent.logfiles import latest_rank_paths, rank_paths, read_chunk


def test_chunks_follow_offsets_and_eof(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"abcdef")
    c = read_chunk(f, 0, ended=False, limit=4)
    assert (c.offset, c.next_offset, c.data, c.eof) == (0, 4, "abcd", False)
    c = read_chunk(f, c.next_offset, ended=True, limit=4)
    assert (c.offset, c.next_offset, c.data, c.eof) == (4, 6, "ef", True)
    c = read_chunk(f, 99, ended=True)
    assert (c.offset, c.next_offset, c.data, c.eof) == (6, 6, "", True)
    missing = read_chunk(tmp_path / "none", 0, ended=False)
    assert (missing.data, missing.eof) == ("", False)


def test_a_cut_character_waits_for_the_next_read(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes("a€b".encode())  # € is 3 bytes
    first = read_chunk(f, 0, ended=False, limit=3)
    assert (first.data, first.next_offset) == ("a", 1)
    second = read_chunk(f, first.next_offset, ended=False, limit=3)
    assert (second.data, second.next_offset) == ("€", 4)
    f.write_bytes("a€".encode()[:-1])  # writer still mid-character: hold it back
    assert read_chunk(f, 1, ended=False).data == ""
    assert read_chunk(f, 1, ended=True).data == "\ufffd"  # writer gone: show what is there


def test_latest_epoch_on_disk(tmp_path: Path) -> None:
    for epoch in (1, 2, 10):
        out, _ = rank_paths(tmp_path, 7, epoch, 0)
        out.parent.mkdir(parents=True)
        out.write_text(str(epoch))
    assert latest_rank_paths(tmp_path, 7, 0) == rank_paths(tmp_path, 7, 10, 0)
    assert latest_rank_paths(tmp_path, 7, 1) is None
    assert latest_rank_paths(tmp_path, 8, 0) is None
