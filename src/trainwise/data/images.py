"""Images: a folder of class sub-folders, decoded with Pillow, resized and center-cropped, stored as uint8.

Decoding runs in a process pool, one shard per task; each worker writes its own shard (atomically), so
only file names and hashes cross process boundaries. A file Pillow cannot read is skipped and reported
with the reason, never a crash.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainwise.data.shards import write_shard
from trainwise.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


@dataclass(frozen=True)
class ImageFolder:
    """The files of an image-folder source, in a fixed order, with their class index."""

    root: Path
    files: tuple[str, ...]     # relative to root, sorted
    labels: np.ndarray         # int64 class index per file
    class_names: tuple[str, ...]


def scan_image_folder(root: Path) -> ImageFolder:
    """Class names are the sub-folder names (sorted); every image below one belongs to that class."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files, labels = [], []
    for index, name in enumerate(classes):
        for path in sorted((root / name).rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file() and not path.name.startswith("."):
                files.append(str(path.relative_to(root)))
                labels.append(index)
    counts = np.bincount(labels, minlength=len(classes)) if labels else np.zeros(len(classes), int)
    empty = [name for name, count in zip(classes, counts) if count == 0]
    classes_with_images = len(classes) - len(empty)
    if classes_with_images < 2:
        raise DataError(f"{root}: an image folder needs a sub-folder per class with at least two classes "
                        f"holding images ({', '.join(s.upper()[1:] for s in IMAGE_SUFFIXES)}); found "
                        f"{classes_with_images} ({len(files)} images). Lay it out as {root}/cat/001.jpg, "
                        f"{root}/dog/002.jpg, ...")
    if empty:
        raise DataError(f"{root}: class folder(s) {', '.join(empty)} hold no images; remove them or add images.")
    return ImageFolder(root, tuple(files), np.asarray(labels, dtype=np.int64), tuple(classes))


def decode_image(path: Path, size: tuple[int, int], channels: int, max_pixels: int | None = None) -> np.ndarray:
    """One image as uint8 (channels, height, width): resized so it covers `size`, then center-cropped. An
    image of more than `max_pixels` (default: Pillow's decompression-bomb limit) raises."""
    from PIL import Image, ImageOps

    limit = Image.MAX_IMAGE_PIXELS
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        Image.MAX_IMAGE_PIXELS = max_pixels or limit
        try:
            image = Image.open(path)
        finally:
            Image.MAX_IMAGE_PIXELS = limit
        with image:
            mode = "RGB" if channels == 3 else "L"
            image.draft(mode, (size[1], size[0]))  # JPEG: decode at reduced scale, much faster for big photos
            image = ImageOps.exif_transpose(image).convert(mode)
            fitted = ImageOps.fit(image, (size[1], size[0]), Image.Resampling.BILINEAR)
    array = np.asarray(fitted, dtype=np.uint8)
    return array[None] if channels == 1 else array.transpose(2, 0, 1)


def image_shard_task(job: dict[str, Any]) -> dict[str, Any]:
    """Decode one shard's files and write it. Runs in a pool worker; returns the manifest entry + skips."""
    root, size, channels = Path(job["root"]), tuple(job["size"]), job["channels"]
    images, labels, skipped = [], [], []
    for name, label in zip(job["files"], job["labels"]):
        try:
            images.append(decode_image(root / name, size, channels, job.get("max_pixels")))
            labels.append(label)
        except Exception as error:  # noqa: BLE001 - any undecodable file is skipped and named, by design
            skipped.append({"file": name, "reason": f"{type(error).__name__}: {error}"[:200]})
    inputs = np.stack(images) if images else np.empty((0, channels, *size), dtype=np.uint8)
    shard = write_shard(Path(job["out"]), job["split"], job["index"],
                        {"inputs": inputs, "targets": np.asarray(labels, dtype=np.int64)})
    sums = inputs.reshape(len(inputs), channels, size[0] * size[1]).astype(np.float64)
    stats = {"n": int(inputs.shape[0] * size[0] * size[1]),
             "sum": (sums.sum(axis=(0, 2)) / 255).tolist(),
             "sum_sq": ((sums / 255) ** 2).sum(axis=(0, 2)).tolist()}
    return {"shard": shard, "skipped": skipped, "stats": stats}


def skip_advice(skipped: list[dict[str, Any]]) -> str | None:
    """What to do about skipped files that were too large (Pillow's guard against decompression bombs): the
    limit to pass so that the largest of them is read."""
    import math
    import re

    from PIL import Image

    sizes = [int(m.group(1)) for s in skipped if (m := re.search(r"Image size \((\d+) pixels\)", s.get("reason", "")))]
    if not sizes:
        return None
    above = int(math.ceil(max(sizes) * 1.01 / 1e6) * 1e6)
    return (f"{len(sizes)} skipped as larger than the limit on pixels, Pillow's guard against decompression bombs "
            f"({Image.MAX_IMAGE_PIXELS:,} by default). If they are genuine large photos, raise it: "
            f"--max-image-pixels {above}.")


def channel_stats(results: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-channel mean and std of [0, 1] pixel values, pooled over the training shards' partial sums."""
    n = sum(r["stats"]["n"] for r in results)
    if n == 0:
        return {}
    total = np.sum([r["stats"]["sum"] for r in results], axis=0)
    total_sq = np.sum([r["stats"]["sum_sq"] for r in results], axis=0)
    mean = total / n
    std = np.sqrt(np.maximum(total_sq / n - mean ** 2, 0.0))
    return {"mean": mean.tolist(), "std": std.tolist()}


def parse_size(text: str | int | tuple[int, int]) -> tuple[int, int]:
    """`64` or `64x48` (height x width) → (height, width)."""
    if isinstance(text, tuple):
        return text
    parts = str(text).lower().split("x")
    try:
        size = tuple(int(p) for p in parts)
    except ValueError:
        size = ()
    if len(size) == 1:
        size = (size[0], size[0])
    if len(size) != 2 or min(size) < 1:
        raise DataError(f"--size {text!r}: give one number (64) or height x width (64x48).")
    return size  # type: ignore[return-value]
