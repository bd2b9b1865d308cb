"""A user's own data and model factories, imported by `module:attr` in the e2e tests."""
import torch
from torch import nn

from trainwise.data.bundle import ArrayDataset, DataBundle, DataSpec


def bad_labels(seed: int, num_classes: int = 3):
    x = torch.randn(64, 5)
    y = torch.randint(0, num_classes, (64,))
    y[17] = 7  # one label outside 0..2
    return DataBundle(ArrayDataset(x, y), None, None, spec=DataSpec(input_shape=(5,), num_classes=num_classes))


def good(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 5, generator=g)
    y = (x[:, 0] > 0).long()
    return DataBundle(ArrayDataset(x[:64], y[:64]), ArrayDataset(x[64:], y[64:]), None,
                      spec=DataSpec(input_shape=(5,), num_classes=2))


def tiny_model(data_spec, width: int = 8):
    return nn.Sequential(nn.Linear(data_spec.input_shape[0], width), nn.ReLU(), nn.Linear(width, data_spec.num_classes))
