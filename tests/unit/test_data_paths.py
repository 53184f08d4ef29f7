"""Data sets stay under their data root: names that climb out and links that lead out are
refused, files and folders alike, unless the operator turned following links on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from thrift_trainer.training.data import paths
from thrift_trainer.training.data.datasets import load_data
from thrift_trainer.training.data.paths import DataPathError, data_location, resolve_under
from thrift_trainer.training.data.settings import DataSettings

ROWS = "".join(f"{i % 7},{i % 5},{i % 2}\n" for i in range(20))


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A data root with data set `tab`, and a folder `outside` beside the root."""
    (tmp_path / "root" / "tab").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "train.csv").write_text(ROWS)
    try:
        yield tmp_path / "root"
    finally:
        paths.follow_links(False)


def test_a_linked_file_leading_out_of_the_data_root_is_refused_naming_it(root: Path) -> None:
    (root / "tab" / "train.csv").symlink_to(root.parent / "outside" / "train.csv")
    with pytest.raises(DataPathError) as refused:
        data_location(root, "tab")
    message = str(refused.value)
    assert "tab/train.csv" in message and "--follow-data-links" in message, message
    assert "\n" not in message


def test_a_linked_folder_deep_in_the_data_set_is_refused_as_a_file_is(root: Path) -> None:
    (root / "tab" / "cats").mkdir()
    (root / "tab" / "cats" / "more").symlink_to(root.parent / "outside")
    with pytest.raises(DataPathError, match="tab/cats/more"):
        data_location(root, "tab")


def test_links_that_stay_under_the_data_root_are_read(root: Path) -> None:
    (root / "shared").mkdir()
    (root / "shared" / "train.csv").write_text(ROWS)
    (root / "tab" / "train.csv").symlink_to(root / "shared" / "train.csv")
    (root / "tab" / "loop").symlink_to(root / "tab" / "loop")  # dangling on itself: inside
    assert data_location(root, "tab") == (root / "tab").resolve()


def test_a_unit_file_linked_out_of_the_data_set_is_refused(root: Path) -> None:
    (root / "tab" / "unit.txt").symlink_to(root.parent / "outside" / "train.csv")
    with pytest.raises(DataPathError, match="unit.txt"):
        resolve_under(root / "tab", "unit.txt")


def test_with_following_on_links_out_are_read_and_names_still_cannot_climb_out(
        root: Path) -> None:
    (root / "tab" / "train.csv").symlink_to(root.parent / "outside" / "train.csv")
    paths.follow_links(True)
    location = data_location(root, "tab")
    data = load_data("tab", location, DataSettings.from_mapping({"format": "csv"}))
    assert len(data.train) + len(data.validation) == 20
    assert resolve_under(location, "train.csv") == root.parent / "outside" / "train.csv"
    with pytest.raises(DataPathError, match="escapes the data root"):
        resolve_under(root, "../outside/train.csv")
