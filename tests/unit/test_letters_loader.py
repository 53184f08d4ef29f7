"""The letters reader keeps every good row and names file and line for every bad one."""

from pathlib import Path

import numpy as np
import pytest

from thrift_trainer.training.data.letters import DataFormatError, load_letters

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "letters"

ROW_A = "2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8,19"
ROW_B = "5,12,3,7,2,10,5,5,4,13,3,9,2,8,4,10,8"
ROW_C = "4,11,6,8,6,10,6,2,6,10,3,7,3,7,3,9,0"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "shard.txt"
    path.write_text(text, encoding="ascii", newline="")
    return path


def test_good_file_types_and_values(tmp_path):
    X, y = load_letters(write(tmp_path, f"{ROW_A}\n{ROW_B}\n"))
    assert X.dtype == np.float64 and X.shape == (2, 16)
    assert y.dtype == np.int64 and y.tolist() == [19, 8]
    assert X[0].tolist() == [2, 8, 3, 5, 1, 8, 13, 0, 6, 6, 10, 8, 0, 8, 0, 8]


def test_last_row_without_newline_is_kept(tmp_path):
    _, y = load_letters(write(tmp_path, f"{ROW_A}\n{ROW_B}\n{ROW_C}"))
    assert y.tolist() == [19, 8, 0]


def test_blank_lines_and_crlf_are_tolerated(tmp_path):
    _, y = load_letters(write(tmp_path, f"\r\n{ROW_A}\r\n  \n\n{ROW_B}\r\n\n"))
    assert y.tolist() == [19, 8]


def test_features_are_lenient_labels_are_not(tmp_path):
    X, _ = load_letters(write(tmp_path, "2.5,99,-3" + ",0" * 13 + ",7\n"))
    assert X[0, :3].tolist() == [2.5, 99.0, -3.0]


def test_shipped_files():
    X, y = load_letters(DATA_DIR / "validate_letters.txt")  # no newline after its last row
    assert X.shape == (3500, 16) and y.shape == (3500,)
    assert y[-1] == 25 and X.min() >= 0 and X.max() <= 15
    assert load_letters(DATA_DIR / "train_letters1.txt")[0].shape == (1500, 16)


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        (ROW_A.rsplit(",", 1)[0], "expected 17 columns, got 16"),
        (ROW_A + ",1", "expected 17 columns, got 18"),
        (ROW_A.replace("13", "x", 1), "column 7: 'x' is not a number"),
        (ROW_A.replace("13", "", 1), "column 7: '' is not a number"),
        (ROW_A.replace("13", "nan", 1), "a feature is not a finite number"),
        (ROW_A.rsplit(",", 1)[0] + ",3.5", "label '3.5' is not an integer"),
        (ROW_A.rsplit(",", 1)[0] + ",26", "label '26' is outside 0..25"),
        (ROW_A.rsplit(",", 1)[0] + ",-1", "label '-1' is outside 0..25"),
        (ROW_A.rsplit(",", 1)[0] + ",Z", "column 17: 'Z' is not a number"),
    ],
)
def test_bad_row_names_file_and_line(tmp_path, bad_row, message):
    # The bad row is on line 4: a blank line must still count.
    path = write(tmp_path, f"{ROW_A}\n\n{ROW_B}\n{bad_row}\n{ROW_C}")
    with pytest.raises(DataFormatError) as info:
        load_letters(path)
    assert str(info.value) == f"{path}:4: {message}"
    assert (info.value.path, info.value.line) == (str(path), 4)
    assert isinstance(info.value, ValueError)


def test_first_bad_line_is_reported(tmp_path):
    rows = [ROW_A, ROW_A.rsplit(",", 1)[0] + ",30", ROW_A.replace("13", "inf", 1)]
    with pytest.raises(DataFormatError, match=r":2: label '30' is outside"):
        load_letters(write(tmp_path, "\n".join(rows)))


def test_empty_and_non_ascii_files(tmp_path):
    with pytest.raises(DataFormatError, match="no data rows"):
        load_letters(write(tmp_path, "\n \n"))
    path = tmp_path / "latin1.txt"
    path.write_bytes(f"{ROW_A}\n{ROW_B}\xe9\n".encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"latin1.txt:2: non-ASCII byte"):
        load_letters(path)
