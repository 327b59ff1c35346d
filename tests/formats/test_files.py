"""Files sf_trt writes and reads back (sf_trt.formats.files): digests and their
stamps, temporaries that a later run recognises, replacement, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sf_trt.formats import files
from sf_trt.formats.files import (
    STAMPS_NAME, DigestStamps, NotWritable, check_writable_dir, replace_dir, sha256_file, sweep_stale, temp_path,
)


@pytest.fixture
def hashes(monkeypatch):
    """The files :class:`DigestStamps` reads (a spy: it still hashes them)."""
    seen = []

    def spy(path, *a, **kw):
        seen.append(os.path.basename(path))
        return sha256_file(path, *a, **kw)

    monkeypatch.setattr(files, "sha256_file", spy)
    monkeypatch.setattr(files, "QUIET_NS", 0)  # files written just now count as settled
    return seen


def test_a_stamp_stands_for_the_digest_until_the_file_changes(tmp_path, hashes):
    (tmp_path / "w.bin").write_bytes(b"weights" * 1000)
    stamps = DigestStamps(tmp_path)
    digest = stamps.sha256("w.bin")
    stamps.save()
    assert hashes == ["w.bin"] and (tmp_path / STAMPS_NAME).is_file()
    assert DigestStamps(tmp_path).sha256("w.bin") == digest and hashes == ["w.bin"]  # only stat'ed
    time.sleep(0.05)  # a later clock tick (QUIET_NS, patched to 0 here, guards this in real use)
    with open(tmp_path / "w.bin", "r+b") as f:  # a byte flipped in place, same size
        f.seek(3)
        f.write(b"X")
    again = DigestStamps(tmp_path)
    assert again.sha256("w.bin") != digest and hashes == ["w.bin", "w.bin"]


def test_a_file_changed_just_now_is_hashed_every_time(tmp_path, monkeypatch):
    (tmp_path / "w.bin").write_bytes(b"x")
    stamps = DigestStamps(tmp_path)
    stamps.sha256("w.bin")
    stamps.save()
    assert not (tmp_path / STAMPS_NAME).exists()  # written within QUIET_NS: no stamp kept


def test_a_damaged_stamps_file_only_costs_a_hash(tmp_path, hashes):
    (tmp_path / "w.bin").write_bytes(b"abc")
    (tmp_path / STAMPS_NAME).write_bytes(b"\xff{not json")
    assert DigestStamps(tmp_path).sha256("w.bin") == sha256_file(tmp_path / "w.bin")


def test_stale_temporaries_of_dead_processes_are_swept(tmp_path):
    target = tmp_path / "model"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".model.sf_trt-tmp-{dead_pid}-00ff00ff"
    stale.mkdir()
    (stale / "decoder.onnx.data").write_bytes(b"half written")
    aside = tmp_path / f".model.sf_trt-old-{dead_pid}-0a0b0c0d"
    aside.mkdir()
    mine = temp_path(target, "tmp")
    mine.mkdir()
    other = tmp_path / f".other.sf_trt-tmp-{dead_pid}-00ff00ff"  # another target's: not ours to sweep
    other.mkdir()
    users = tmp_path / ".model.backup"  # a user's file that looks a little like one
    users.write_text("keep")
    assert sorted(p.name for p in sweep_stale(target)) == sorted([stale.name, aside.name])
    assert mine.is_dir() and other.is_dir() and users.is_file()


def test_replace_dir_swaps_and_keeps_the_old_one_when_the_rename_fails(tmp_path):
    out, new = tmp_path / "out", tmp_path / "new"
    out.mkdir()
    (out / "a").write_text("old")
    new.mkdir()
    (new / "a").write_text("new")
    replace_dir(new, out)
    assert (out / "a").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["out"]
    with pytest.raises(FileNotFoundError):
        replace_dir(tmp_path / "missing", out)
    assert (out / "a").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["out"]


def test_sigterm_during_a_write_removes_its_temporary(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        from sf_trt.formats.files import removed_on_signal, Terminated
        tmp = Path({str(tmp_path / 'partial')!r})
        try:
            with removed_on_signal(tmp):
                tmp.mkdir()
                (tmp / "x").write_text("half")
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
        except Terminated as exc:
            print(exc, exc.code)
            sys.exit(exc.code)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and proc.stdout.strip() == "terminated by SIGTERM 143", proc.stderr
    assert not (tmp_path / "partial").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # (this process never installed one)


def test_an_unwritable_directory_is_named_with_the_reason(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(NotWritable, match=r"file/cache: cannot write the model cache there \(Not a directory"):
        check_writable_dir(tmp_path / "file" / "cache", "model cache")
    assert check_writable_dir(tmp_path / "a" / "b", "x") == tmp_path / "a" / "b"
    assert os.listdir(tmp_path / "a" / "b") == []  # the probe is gone
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(NotWritable, match="Permission denied"):
            check_writable_dir(ro, "model cache")
