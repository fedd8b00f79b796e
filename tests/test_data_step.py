"""Specification of the data step: copy from a source folder, verify checksums, fail clearly."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("get_data", REPO_ROOT / "data" / "get_data.py")
get_data = importlib.util.module_from_spec(spec)
spec.loader.exec_module(get_data)


@pytest.fixture
def fake_source(tmp_path: Path, monkeypatch) -> Path:
    """A source folder of small files and a SHA256SUMS that matches them."""
    src = tmp_path / "src"
    files = {
        "cs224n-a5/wiki.txt": "A. a\n",
        "cs224n-a5/birth_dev.tsv": "Where?\tX\n",
        "tinyshakespeare/input.txt": "O\n",
    }
    lines = []
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
        lines.append(f"{hashlib.sha256(text.encode()).hexdigest()}  {name}")
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(get_data, "SUMS_FILE", sums)
    return src


def test_data_step_places_verified_files(fake_source, tmp_path):
    dest = tmp_path / "data"
    assert get_data.main(["--source", str(fake_source), "--dest", str(dest)]) == 0
    assert (dest / "wiki.txt").read_text() == "A. a\n"
    assert (dest / "tinyshakespeare" / "input.txt").is_file()
    assert get_data.main(["--check", "--dest", str(dest)]) == 0


def test_data_step_refuses_an_altered_file(fake_source, tmp_path, capsys):
    (fake_source / "cs224n-a5" / "wiki.txt").write_text("tampered\n")
    dest = tmp_path / "data"
    assert get_data.main(["--source", str(fake_source), "--dest", str(dest)]) == 2
    assert "wiki.txt: SHA-256 does not match" in capsys.readouterr().err
    assert not (dest / "wiki.txt").exists()


def test_missing_course_files_are_one_line_saying_where_they_come_from(fake_source, tmp_path, capsys):
    (fake_source / "cs224n-a5" / "birth_dev.tsv").unlink()
    (fake_source / "cs224n-a5" / "wiki.txt").unlink()
    assert get_data.main(["--source", str(fake_source), "--dest", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(
        f"error: course files missing from {fake_source}: wiki.txt, birth_dev.tsv"
    )
    assert "CS224N assignment 5 public handout materials" in err and "BIRTHPLACE_DATA_DIR" in err


def test_data_step_accepts_the_course_files_directly_in_the_source_folder(fake_source, tmp_path):
    for f in (fake_source / "cs224n-a5").iterdir():
        f.rename(fake_source / f.name)
    (fake_source / "cs224n-a5").rmdir()
    dest = tmp_path / "data"
    assert get_data.main(["--source", str(fake_source), "--dest", str(dest)]) == 0
    assert (dest / "wiki.txt").read_text() == "A. a\n" and (dest / "birth_dev.tsv").is_file()


def test_data_step_without_tiny_shakespeare_says_so_in_one_line_and_succeeds(fake_source, tmp_path, capsys):
    shutil.rmtree(fake_source / "tinyshakespeare")
    dest = tmp_path / "data"
    assert get_data.main(["--source", str(fake_source), "--dest", str(dest)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [
        f"note: tinyshakespeare/input.txt not in {fake_source}: only the Shakespeare demo (mingpt-demo/) needs it"
    ]
    assert (dest / "wiki.txt").is_file()
    assert get_data.main(["--check", "--dest", str(dest)]) == 0


def test_check_notices_a_file_altered_after_placing(fake_source, tmp_path, capsys):
    dest = tmp_path / "data"
    get_data.main(["--source", str(fake_source), "--dest", str(dest)])
    shutil.copyfile(dest / "wiki.txt", dest / "wiki.bak")
    (dest / "wiki.txt").write_text("edited\n")
    assert get_data.main(["--check", "--dest", str(dest)]) == 2
    assert "altered" in capsys.readouterr().err


def test_shipped_checksums_list_the_five_course_files():
    assert set(get_data.expected_sums()) == {
        "cs224n-a5/wiki.txt",
        "cs224n-a5/birth_places_train.tsv",
        "cs224n-a5/birth_dev.tsv",
        "cs224n-a5/birth_test_inputs.tsv",
        "tinyshakespeare/input.txt",
    }


def test_a_dest_that_is_not_a_folder_is_one_line(fake_source, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine\n")
    assert get_data.main(["--source", str(fake_source), "--dest", str(tmp_path / "afile")]) == 2
    assert capsys.readouterr().err == f"error: --dest {tmp_path / 'afile'} is not a folder\n"
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_a_users_link_in_dest_is_never_replaced(fake_source, tmp_path, capsys):
    dest = tmp_path / "data"
    dest.mkdir()
    (tmp_path / "my_wiki.txt").write_text("my own corpus\n")
    (dest / "wiki.txt").symlink_to(tmp_path / "my_wiki.txt")
    assert get_data.main(["--source", str(fake_source), "--dest", str(dest)]) == 2
    assert "wiki.txt: not the course file (a link or not a regular file)" in capsys.readouterr().err
    assert (dest / "wiki.txt").is_symlink() and (tmp_path / "my_wiki.txt").read_text() == "my own corpus\n"


def test_a_copy_that_fails_is_one_line(fake_source, tmp_path, capsys, monkeypatch):
    def denied(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(shutil, "copyfile", denied)
    assert get_data.main(["--source", str(fake_source), "--dest", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Permission denied" in err
