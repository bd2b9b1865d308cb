"""Small generated sources for the data tests: image folders (with broken and odd files), tables, logs."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def make_image_folder(root: Path, classes=("cat", "dog", "fish"), per_class: int = 12, seed: int = 0) -> Path:
    """PNG/JPEG/WebP of odd sizes and modes (RGB, RGBA, grayscale, palette), one corrupt and one empty file."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = int(rng.integers(9, 70)), int(rng.integers(9, 70))
            pixels = np.clip(rng.normal(60 + 60 * c, 20, (h, w, 3)), 0, 255).astype(np.uint8)
            image = Image.fromarray(pixels)
            mode = ("RGBA", "RGB", "L", "P")[i % 4]
            suffix = (".png", ".jpg", ".webp", ".png")[i % 4]
            image = image.convert(mode) if mode != "P" else image.quantize(16)
            if suffix == ".jpg" and mode == "RGBA":
                image = image.convert("RGB")
            image.save(folder / f"{i:03d}{suffix}")
    (root / classes[0] / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / classes[1] / "empty.png").write_bytes(b"")
    (root / classes[1] / "notes.txt").write_text("not an image, ignored")
    return root


def _write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture
def write_csv():
    """`write_csv(path, header, rows) -> path`."""
    return _write_csv


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "photos")
