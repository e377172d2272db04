"""Images of local data sets: the central square, resized, in [0, 1]; a damaged file named."""

import numpy as np
import pytest
import torch

from actzip.errors import DataError
from actzip_bench.data.images import read_square_image

Image = pytest.importorskip("PIL.Image")


def test_the_central_square_is_kept_and_scaled_to_unit_range(tmp_path):
    a = np.zeros((4, 8, 3), dtype=np.uint8)  # 4 rows, 8 columns: the square is columns 2..5
    a[:, 2:6] = 255
    Image.fromarray(a).save(tmp_path / "wide.png")
    rgb = read_square_image(tmp_path / "wide.png", 4, True, "test")
    assert rgb.shape == (3, 4, 4) and rgb.dtype == torch.float32
    assert torch.equal(rgb, torch.ones(3, 4, 4))  # only the white middle survives the crop
    gray = read_square_image(tmp_path / "wide.png", 2, False, "test")
    assert gray.shape == (1, 2, 2) and float(gray.min()) >= 0 and float(gray.max()) <= 1


def test_a_damaged_file_is_a_data_error_naming_the_loader_and_path(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"crema_d: '.*bad\.jpg' cannot be read as an image"):
        read_square_image(bad, 4, True, "crema_d")
