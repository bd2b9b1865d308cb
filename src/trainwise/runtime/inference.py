"""Evaluation inside training (loss and headline metrics on a split) and plain prediction."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import Dataset

from trainwise.data.loader import LoaderSettings, build_loader
from trainwise.data.batch import IGNORE_INDEX, is_token_batch
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


def yields_token_batches(dataset: Dataset | None) -> bool:
    """A text dataset: its samples are dicts of input_ids, labels, position_ids (data/text/packing.py)."""
    if dataset is None or len(dataset) == 0:  # type: ignore[arg-type]
        return False
    return is_token_batch(dataset[0])


def token_metrics(model: torch.nn.Module, dataset: Dataset, *, device: torch.device | str, batch_size: int = 16,
                  precision: Precision = "fp32") -> dict[str, float]:
    """Validation of a language model, streamed (runtime/token_batches.py): loss, perplexity, token accuracy."""
    from trainwise.runtime.token_batches import token_metrics as measure

    device = torch.device(device)
    return measure(model, _batches_from(dataset, 0, batch_size), device=device,
                   autocast=lambda: autocast(precision, device))


def split_metrics(model: torch.nn.Module, dataset: Dataset, *, task: str,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device | str,
                  batch_size: int, precision: Precision = "fp32") -> dict[str, float]:
    """Validation during training: a language model's token metrics, streamed (never all logits at once);
    any other model's outputs gathered and its headline metrics."""
    if yields_token_batches(dataset):
        return token_metrics(model, dataset, device=device, batch_size=batch_size, precision=precision)
    outputs, targets = predict(model, dataset, device=device, batch_size=batch_size, precision=precision)
    return headline_metrics(outputs, targets, task, loss_fn)


def headline_metrics(outputs: torch.Tensor, targets: torch.Tensor, task: str,
                     loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """What the loop logs and early stopping can monitor; `trainwise eval` computes the full set. Class
    targets of -100 (no loss, e.g. masked tokens) count in no metric."""
    metrics = {"loss": float(loss_fn(outputs, targets))}
    if task == "next_item":  # a recommender is judged by ranking: the target's rank among every item
        metrics.update(next_item_metrics(outputs, targets))
    elif task == "click":  # a click model is judged by how it orders clicks above non-clicks
        metrics["auc"] = click_auc(outputs, targets)
    if task in ("classification", "click"):
        metrics.update(_class_metrics(outputs, targets))
    if task == "regression":
        error = outputs.reshape(len(outputs), -1).squeeze(-1) - targets.reshape(len(targets), -1).squeeze(-1).float()
        metrics["mae"] = float(error.abs().mean())
        metrics["rmse"] = float(error.pow(2).mean().sqrt())
    return metrics


def _class_metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Accuracy and balanced accuracy; targets of -100 count in neither, soft labels by their likeliest class."""
    if outputs.ndim > 2:  # per-position outputs [N, classes, positions...] (cross-entropy's layout)
        outputs, targets = outputs.movedim(1, -1).reshape(-1, outputs.shape[1]), targets.reshape(-1)
    targets = targets.argmax(1) if targets.dim() > 1 else targets
    counted = targets != IGNORE_INDEX
    outputs, targets = outputs[counted], targets[counted].long()
    correct = outputs.argmax(1) == targets
    # per-class recall by counting, not a loop over classes (a vocabulary has tens of thousands)
    seen = torch.bincount(targets, minlength=outputs.shape[1])
    hits = torch.bincount(targets[correct], minlength=outputs.shape[1])
    present = seen > 0
    return {"accuracy": float(correct.float().mean()), "balanced_accuracy": float((hits[present] / seen[present]).mean())}


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
