"""Built-in data sets, from scikit-learn's bundled files: no download, the same on every machine."""
from __future__ import annotations

import numpy as np
import torch

from trainwise.data.augment import feature_noise, random_shift
from trainwise.data.bundle import ArrayDataset, DataBundle, DataSpec


def digits(*, seed: int, val_fraction: float, test_fraction: float, augment: bool = False) -> DataBundle:
    """8×8 handwritten digits (1,797 images, 10 classes), pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    images = (raw.images / 16.0).astype(np.float32)[:, None, :, :]
    splits = stratified_splits(images, raw.target, seed=seed, val_fraction=val_fraction,
                               test_fraction=test_fraction)
    spec = DataSpec(input_shape=(1, 8, 8), num_classes=10, class_names=tuple(str(d) for d in range(10)),
                    num_train=len(splits[0]))
    return DataBundle(*splits, spec=spec, augment=random_shift if augment else None)


def breast_cancer(*, seed: int, val_fraction: float, test_fraction: float,
                  augment: bool = False) -> DataBundle:
    """Wisconsin diagnostic breast cancer (569 cases, 30 features; 37% malignant), standardised on train."""
    from sklearn.datasets import load_breast_cancer

    raw = load_breast_cancer()
    # scikit-learn codes malignant as 0; make the rarer, clinically important class the positive one (1)
    target = 1 - raw.target
    train, val, test = stratified_splits(raw.data.astype(np.float32), target, seed=seed,
                                         val_fraction=val_fraction, test_fraction=test_fraction)
    mean = train.inputs.mean(0, keepdim=True)
    std = train.inputs.std(0, keepdim=True).clamp_min(1e-6)
    for split in (train, val, test):
        if split is not None:
            split.inputs = (split.inputs - mean) / std
    spec = DataSpec(input_shape=(30,), num_classes=2, class_names=("benign", "malignant"),
                    num_train=len(train))
    return DataBundle(train, val, test, spec=spec, augment=feature_noise if augment else None,
                      notes={"standardised_on": "train"})


def stratified_splits(inputs: np.ndarray, targets: np.ndarray, *, seed: int, val_fraction: float,
                      test_fraction: float) -> tuple[ArrayDataset, ArrayDataset | None, ArrayDataset | None]:
    """Seeded, stratified train/val/test split. `seed` is 0..2**32-1 (scikit-learn's range); the validation
    split uses the next seed, wrapping at the top of that range."""
    from sklearn.model_selection import train_test_split  # here: scikit-learn costs every run ~1 s to import

    rest_x, rest_y = inputs, targets
    test = val = None
    if test_fraction > 0:
        rest_x, test_x, rest_y, test_y = train_test_split(rest_x, rest_y, test_size=test_fraction,
                                                          random_state=seed, stratify=rest_y)
        test = _dataset(test_x, test_y)
    if val_fraction > 0:
        share = val_fraction / (1 - test_fraction)
        rest_x, val_x, rest_y, val_y = train_test_split(rest_x, rest_y, test_size=share,
                                                        random_state=(seed + 1) % 2**32, stratify=rest_y)
        val = _dataset(val_x, val_y)
    return _dataset(rest_x, rest_y), val, test


def _dataset(x: np.ndarray, y: np.ndarray) -> ArrayDataset:
    return ArrayDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64)))


from trainwise.recsys.data import shop  # noqa: E402  behaviour sequences for the recommender recipes

from trainwise.data.text.bundle import pydoc_topics  # noqa: E402  text for the language-model recipe

BUILTIN_DATA = {"digits": digits, "breast_cancer": breast_cancer, "shop": shop, "pydoc_topics": pydoc_topics}
