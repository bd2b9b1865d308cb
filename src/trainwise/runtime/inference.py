"""Evaluation inside training (loss and headline metrics on a split) and plain prediction."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import Dataset

from trainwise.data.loader import LoaderSettings, build_loader
from trainwise.runtime.precision import Precision, autocast


@torch.no_grad()
def predict(model: torch.nn.Module, dataset: Dataset, *, device: torch.device | str, batch_size: int = 256,
            precision: Precision = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """Model outputs (float32, on the CPU) and targets for every sample of `dataset`, in order.

    On an out-of-memory error the batch is halved and the pass goes on from where it was."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    n = len(dataset)  # type: ignore[arg-type]
    outputs: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    done = 0
    try:
        while done < n:
            try:
                for inputs, target in _batches_from(dataset, done, batch_size):
                    with autocast(precision, device):
                        out = model(inputs.to(device, non_blocking=True))
                    outputs.append(out.float().cpu())
                    targets.append(torch.as_tensor(target).cpu())
                    done += len(outputs[-1])
            except torch.OutOfMemoryError:
                if batch_size == 1:
                    raise
                batch_size //= 2
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        model.train(was_training)
    return torch.cat(outputs), torch.cat(targets)


def _batches_from(dataset: Dataset, start: int, batch_size: int):
    n = len(dataset)  # type: ignore[arg-type]
    batches = [list(range(i, min(i + batch_size, n))) for i in range(start, n, batch_size)]
    return build_loader(dataset, batches, LoaderSettings(0, False, False, None))


def headline_metrics(outputs: torch.Tensor, targets: torch.Tensor, task: str,
                     loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """What the loop logs and early stopping can monitor; `trainwise eval` computes the full set."""
    metrics = {"loss": float(loss_fn(outputs, targets))}
    if task == "classification":
        predicted = outputs.argmax(1)
        correct = predicted == targets
        metrics["accuracy"] = float(correct.float().mean())
        recalls = [float(correct[targets == c].float().mean()) for c in targets.unique()]
        metrics["balanced_accuracy"] = sum(recalls) / len(recalls)
    else:
        error = outputs.squeeze(-1) - targets.float()
        metrics["mae"] = float(error.abs().mean())
        metrics["rmse"] = float(error.pow(2).mean().sqrt())
    return metrics
