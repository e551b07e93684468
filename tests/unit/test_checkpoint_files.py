"""The pure choices behind ``elastic.checkpoint``'s files (``launcher.workers.checkpoints``): which
names are complete copies, which copy is newest (by step as a number, per rank or of any rank),
which are superseded, and the newest save on disk -- on real directories."""

from __future__ import annotations

import os

from launcher.workers.checkpoints import (
    Copy,
    copies_in,
    drop_superseded,
    file_name,
    newest,
    newest_save,
    superseded,
)


def test_only_complete_copies_count():
    names = [file_name(0, 9), ".rank-0-step-10.pt.tmp", "due-rank-0", "rank-x-step-1.pt", file_name(1, 3)]
    assert sorted(copies_in(names)) == [Copy(3, 1, "rank-1-step-3.pt"), Copy(9, 0, "rank-0-step-9.pt")]


def test_newest_compares_steps_as_numbers_per_rank_or_of_any_rank():
    copies = copies_in([file_name(0, 9), file_name(0, 10), file_name(1, 12), file_name(1, 2)])
    assert newest(copies, 0).step == 10  # not "9" > "10"
    assert newest(copies, 1).step == 12
    assert newest(copies).name == "rank-1-step-12.pt"
    assert newest(copies, 2) is None
    assert newest([]) is None


def test_superseded_are_a_ranks_older_copies_only():
    copies = copies_in([file_name(0, 1), file_name(0, 3), file_name(0, 2), file_name(1, 1)])
    assert [c.step for c in superseded(copies, 0)] == [1, 2]
    assert superseded(copies, 1) == []
    assert superseded(copies, 5) == []


def test_drop_superseded_keeps_each_ranks_newest(tmp_path):
    for rank, step in [(0, 1), (0, 2), (0, 3), (1, 1)]:
        (tmp_path / file_name(rank, step)).write_bytes(b"x")
    drop_superseded(str(tmp_path), 0)
    assert sorted(os.listdir(tmp_path)) == ["rank-0-step-3.pt", "rank-1-step-1.pt"]
    drop_superseded(str(tmp_path), 0)  # nothing left to drop: no error
    drop_superseded(str(tmp_path / "gone"), 0)  # nor for a directory that is not there


def test_newest_save_is_the_newest_step_and_its_files_time(tmp_path):
    assert newest_save(None) is None
    assert newest_save(str(tmp_path / "missing")) is None
    assert newest_save(str(tmp_path)) is None
    (tmp_path / file_name(0, 4)).write_bytes(b"x")
    (tmp_path / file_name(1, 7)).write_bytes(b"x")
    os.utime(tmp_path / file_name(1, 7), (1_700_000_000, 1_700_000_000))
    (tmp_path / ".rank-0-step-9.pt.partial").write_bytes(b"a save under way")
    assert newest_save(str(tmp_path)) == (7, 1_700_000_000)
