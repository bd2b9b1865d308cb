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
    if task == "next_item":  # a recommender is judged by ranking: the target's rank among every item
        metrics.update(next_item_metrics(outputs, targets))
    elif task == "click":  # a click model is judged by how it orders clicks above non-clicks
        metrics["auc"] = click_auc(outputs, targets)
    if task in ("classification", "click"):
        targets = targets.argmax(1) if targets.dim() > 1 else targets  # soft labels: their most likely class
        predicted = outputs.argmax(1)
        correct = predicted == targets
        metrics["accuracy"] = float(correct.float().mean())
        recalls = [float(correct[targets == c].float().mean()) for c in targets.unique()]
        metrics["balanced_accuracy"] = sum(recalls) / len(recalls)
    if task == "regression":
        error = outputs.reshape(len(outputs), -1).squeeze(-1) - targets.reshape(len(targets), -1).squeeze(-1).float()
        metrics["mae"] = float(error.abs().mean())
        metrics["rmse"] = float(error.pow(2).mean().sqrt())
    return metrics


def next_item_metrics(scores: torch.Tensor, targets: torch.Tensor, cutoff: int = 10) -> dict[str, float]:
    """NDCG@10 and HR@10 of a full ranking of the catalogue (ties split evenly), over the validation queries
    (a seeded sample of validation users, recsys/sequences.py HeldOutQueries). Seen items are not removed here:
    `trainwise eval` does that on the test split; the ordering of runs and checkpoints is what matters."""
    target = targets.long().reshape(-1)
    ranks = tie_split_rank(scores, scores.gather(1, target[:, None]).squeeze(1)).double()
    hit = ranks <= cutoff
    return {f"ndcg@{cutoff}": float(torch.where(hit, 1 / torch.log2(ranks + 1), 0.0).mean()),
            f"hr@{cutoff}": float(hit.double().mean())}


def click_auc(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """ROC-AUC of the click logit (outputs [N, 2]: no-click, click) over the validation pairs: the chance that a
    click scores above a non-click (0.5: no better than a coin)."""
    score = (outputs[:, 1] - outputs[:, 0]).double()
    clicked = targets.reshape(-1) == 1
    positives, negatives = int(clicked.sum()), int((~clicked).sum())
    if not positives or not negatives:
        return float("nan")
    ranks = torch.empty_like(score)
    ranks[score.argsort()] = torch.arange(1, len(score) + 1, dtype=score.dtype)
    return float((ranks[clicked].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def tie_split_rank(scores: torch.Tensor, target_score: torch.Tensor) -> torch.Tensor:
    """1 + (items scored higher) + half of (other items scored the same), per row."""
    higher = (scores > target_score[:, None]).sum(1)
    equal = (scores == target_score[:, None]).sum(1) - 1
    return 1 + higher + torch.div(equal, 2, rounding_mode="floor")
