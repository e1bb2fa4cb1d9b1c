"""The one rule for showing a path (render/paths.py): relative under the working directory, ``~``
under the home directory, absolute elsewhere; nothing resolved on disk."""

from __future__ import annotations

import os

import pytest

from torchrepro.render.paths import display_path


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home directory of the test's own, and a working directory outside it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path


def test_under_the_working_directory_is_relative(home):
    assert display_path(home / "work" / "runs" / "a" / "report.json") == "runs/a/report.json"
    assert display_path("runs/a") == "runs/a"
    assert display_path(home / "work") == "."
    assert display_path("./x/../y.py") == "y.py"


def test_under_home_is_tilde_and_elsewhere_absolute(home):
    assert display_path(home / "home" / "proj" / "train.py") == "~/proj/train.py"
    assert display_path(home / "home") == "~"
    assert display_path(home / "homework" / "x") == str(home / "homework" / "x")  # a prefix is not a parent
    assert display_path("/etc/passwd") == "/etc/passwd"


def test_an_explicit_base_wins_over_the_working_directory(home):
    base = home / "home" / "proj"
    assert display_path(base / "runs" / "r1", base=base) == "runs/r1"
    assert display_path(home / "work" / "x", base=base) == str(home / "work" / "x")
    assert display_path(home / "home" / "elsewhere", base=str(base)) == "~/elsewhere"


def test_the_root_is_no_base_and_no_home(home, monkeypatch):
    monkeypatch.setenv("HOME", "/")
    assert display_path("/srv/x", base="/") == "/srv/x"
    assert display_path("/srv/x", base="/srv/") == "x"
    assert os.path.isabs(display_path(home / "home" / "x", base="/elsewhere"))


def test_paths_inside_text_follow_the_same_rule(home):
    from torchrepro.render.paths import display_paths

    work, me = home / "work", home / "home"
    text = f"graph break at {work}/train.py:72 ({me}/lib/util.py); out: {work}; '{me}'"
    assert display_paths(text) == "graph break at train.py:72 (~/lib/util.py); out: .; '~'"
    untouched = f"{work}x/a.py x{work}/b.py {home}/elsewhere/c.py"  # a longer name, inside a word, outside both
    assert display_paths(untouched) == untouched
    assert display_paths(f"{work}/a {me}/b", base=me) == f"{work}/a b"
