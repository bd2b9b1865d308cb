"""Before training: what the labels and inputs of each split say, as findings.

Pure over tensors (`SplitData` per split: inputs and targets as the dataset holds them). Labels: the
distribution per split, classes missing from val/test, one class only, extreme imbalance. Inputs: NaN/Inf,
constant features, an unnormalised scale, rows of the test (or val) split duplicated in train (leakage).
Targets at torch's ignore_index (-100, the padded positions of a sequence) are no label and are not counted.

Integer id sequences (a recommender's padded item histories, token ids: `id_sequences`) are not tables: a
position that holds padding in every row is no constant feature, ids are no scale to normalise, two users
with the same history are no leak, and held-out events are not a stratified sample of the classes. On them
only the label distribution, a single class and (for a few-class label such as a click) the imbalance apply.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trainwise.config.labels import IGNORE_INDEX
from trainwise.findings import Finding

# Majority/minority class count in train at or above this is extreme: a model can ignore the minority
# class and still score high accuracy (1:20 is where resampling or class weights become necessary).
IMBALANCE_RATIO = 20.0
# Feature magnitudes a network takes as they are: standardised features are within a few units; raw
# measurements in the hundreds or thousands saturate activations and make one LR wrong for every feature.
MAX_FEATURE_SCALE = 100.0
# Duplicated rows between train and test: a few are coincidence in discretised data; past this share the
# test score measures memory, not generalisation.
LEAKAGE_ERROR_SHARE = 0.05
SHOWN = 5  # indices quoted in evidence
SHOWN_CLASSES = 10  # classes per split quoted in the label distribution's text (the evidence has them all)
# In id-sequence data, more classes than this means the label is itself an id (the next item): its
# distribution is the items' popularity, a long tail by nature, not an imbalance to correct.
ID_LABELS_ABOVE = 100


@dataclass(frozen=True)
class SplitData:
    name: str  # train, val or test
    inputs: torch.Tensor  # (rows, ...) as the model receives them
    targets: torch.Tensor | None


def data_findings(splits: list[SplitData], *, task: str = "classification", num_classes: int | None = None,
                  class_names: tuple[str, ...] | None = None) -> list[Finding]:
    found: list[Finding | None] = []
    sequences = id_sequences(splits)
    if task == "classification":
        found += label_findings(splits, num_classes, class_names, id_sequences=sequences)
    if task == "causal_lm":
        found += token_label_findings(splits, num_classes)
    found += [nonfinite_inputs(splits), nonfinite_targets(splits)]
    if not sequences:  # table rules: see the module docstring
        found += [constant_features(splits), unnormalised_scale(splits), leakage(splits)]
    return [f for f in found if f is not None]


def id_sequences(splits: list[SplitData]) -> bool:
    """Whether the inputs are rows of integer ids (item histories, tokens) rather than features or pixels:
    2-D, of a signed integer dtype (uint8 rows are flattened images)."""
    train = _train(splits)
    return train is not None and train.inputs.ndim == 2 and train.inputs.dtype in (
        torch.int16, torch.int32, torch.int64)


def label_findings(splits: list[SplitData], num_classes: int | None,
                   class_names: tuple[str, ...] | None = None, *, id_sequences: bool = False) -> list[Finding | None]:
    counts = {s.name: _counts(s.targets, num_classes) for s in splits if s.targets is not None}
    if "train" not in counts:
        return []
    classes = len(counts["train"])
    name = (lambda c: class_names[c]) if class_names and len(class_names) >= classes else str
    distribution = {split: {name(c): n for c, n in enumerate(row)} for split, row in counts.items()}
    found: list[Finding | None] = [Finding(
        "label_distribution", "info", "labels per split: " + "; ".join(
            f"{split} {sum(row)} rows, {sum(1 for n in row if n)} classes" for split, row in counts.items()),
        "; ".join(f"{split}: " + _most_frequent(row) for split, row in distribution.items()),
        {"counts": distribution})]
    train = counts["train"]
    present = [c for c, n in enumerate(train) if n]
    if len(present) == 1:
        found.append(Finding(
            "single_class_labels", "error", f"every train label is class {name(present[0])}",
            f"All {train[present[0]]} train rows carry the same label: the model can reach zero loss by always "
            "answering it, and learns nothing about the inputs.", {"class": name(present[0]), "rows": train[present[0]],
                                                                  "num_classes": classes},
            ("Check how labels are read: a column mix-up or a label that was overwritten gives one class.",
             "Check the split: a split by a sorted column can put one class in train.")))
        return found
    if id_sequences and classes > ID_LABELS_ABOVE:
        return found  # the label is an id: popularity, not imbalance; held-out events miss most ids
    rare, common = min(present, key=lambda c: train[c]), max(present, key=lambda c: train[c])
    ratio = train[common] / train[rare]
    if ratio >= IMBALANCE_RATIO:
        found.append(Finding(
            "class_imbalance", "warn", f"extreme class imbalance: {ratio:.0f}:1 in train",
            f"Class {name(common)} has {train[common]} train rows, class {name(rare)} only {train[rare]}: accuracy "
            f"can be {train[common] / sum(train):.0%} by never predicting the rare class.",
            {"majority_class": name(common), "majority_rows": train[common], "minority_class": name(rare),
             "minority_rows": train[rare], "ratio": ratio, "threshold": IMBALANCE_RATIO},
            ("Judge the model by balanced accuracy and per-class recall (`trainwise eval` shows both).",
             "Weight the loss by class, or oversample the rare class.", "Collect more rows of the rare class.")))
    missing = {split: [name(c) for c in present if c >= len(row) or row[c] == 0]
               for split, row in counts.items() if split != "train"}
    missing = {split: names for split, names in missing.items() if names}
    if missing and not id_sequences:  # held-out events (a test of positives only) are not stratified
        found.append(Finding(
            "classes_missing_from_split", "warn", "classes missing from " + ", ".join(missing),
            "; ".join(f"{split} has no rows of class(es) {', '.join(names)}" for split, names in missing.items())
            + ": their recall there cannot be measured.",
            {"missing": missing, "counts": distribution},
            ("Split stratified by label (the built-in data sets do), or enlarge the small split.",)))
    return found


def token_label_findings(splits: list[SplitData], vocab_size: int | None) -> list[Finding | None]:
    """Language-model labels: ids the model can output, or -100 (no loss); and some tokens that carry loss."""
    found: list[Finding | None] = []
    for split in splits:
        if split.targets is None:
            continue
        counted = split.targets != IGNORE_INDEX
        outside = counted & ((split.targets < 0) | (split.targets >= (vocab_size or 2**62)))
        if outside.any():
            bad = split.targets[outside]
            found.append(Finding(
                "token_labels_out_of_range", "error", f"{split.name} split: token labels outside the vocabulary",
                f"{int(outside.sum())} labels of the {split.name} split are not ids of the {vocab_size}-id "
                f"vocabulary (e.g. {int(bad[0])}); only ids and -100 (no loss) can be labels.",
                {"split": split.name, "examples": bad[:SHOWN].tolist(), "vocab_size": vocab_size},
                ("Prepare the data with the tokenizer the model was built for (`trainwise prepare --tokenizer`).",)))
        elif split.name == "train" and not counted.any():
            found.append(Finding(
                "no_loss_tokens", "error", "no token of the training sample carries loss",
                "Every label of the first training sequences is -100: nothing would be learned from them.",
                {"split": split.name, "rows": len(split.targets)},
                ("Check the loss masks of the prepared data (prompts masked, answers kept).",)))
    return found


def nonfinite_inputs(splits: list[SplitData]) -> Finding | None:
    bad = _nonfinite_rows({s.name: s.inputs for s in splits})
    if not bad:
        return None
    return Finding(
        "nonfinite_inputs", "error", "NaN or Inf in the inputs: " + ", ".join(f"{n} rows of {s}" for s, n in
                                                                             ((s, v["rows"]) for s, v in bad.items())),
        "A single NaN input makes its batch's loss NaN, and one NaN update ruins every weight.", bad,
        ("Fill or drop missing values before training (median per feature for tables).",
         "Look for a division by zero in the preprocessing (a std of 0 for a constant feature)."))


def nonfinite_targets(splits: list[SplitData]) -> Finding | None:
    """NaN or Inf targets (a regression column with missing values): every batch holding one has a NaN loss,
    which otherwise shows up later as 'gradients overflowed'."""
    bad = _nonfinite_rows({s.name: s.targets for s in splits if s.targets is not None})
    if not bad:
        return None
    return Finding(
        "nonfinite_targets", "error", "targets contain NaN or Inf: " + ", ".join(
            f"{v['rows']} rows of {split}" for split, v in bad.items()),
        "The loss of any batch holding such a target is NaN: the run cannot learn from it, and its gradients "
        "turn every weight into NaN.", bad,
        ("Drop the rows whose target is missing, or fill it, before training.",
         "Look for a division by zero or a failed join in how the target is computed."))


def constant_features(splits: list[SplitData]) -> Finding | None:
    train = _train(splits)
    if train is None or train.inputs.ndim != 2 or len(train.inputs) < 2:  # image pixels may be constant
        return None
    x = train.inputs.float()
    constant = (x == x[0]).all(dim=0).nonzero()[:, 0].tolist()
    if not constant:
        return None
    return Finding(
        "constant_features", "info", f"{len(constant)} of {x.shape[1]} features are constant in train",
        "A feature with one value carries no information; after standardisation it can become NaN (std 0).",
        {"features": constant[:20], "count": len(constant), "of": x.shape[1]},
        ("Drop the constant features, or check why they do not vary (a join that failed, a fill value).",))


def unnormalised_scale(splits: list[SplitData]) -> Finding | None:
    train = _train(splits)
    if train is None or not train.inputs.is_floating_point() or len(train.inputs) < 2:
        return None
    x = train.inputs.reshape(len(train.inputs), -1).float()
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    scale = x.abs().amax(dim=0)
    worst = int(scale.argmax())
    largest = float(scale[worst])
    if largest <= MAX_FEATURE_SCALE:
        return None
    return Finding(
        "unnormalised_inputs", "warn", f"inputs are not normalised: values up to {largest:.3g}",
        f"Feature {worst} reaches {largest:.3g} (mean {float(x[:, worst].mean()):.3g}, std "
        f"{float(x[:, worst].std()):.3g}); {int((scale > MAX_FEATURE_SCALE).sum())} of {x.shape[1]} features exceed "
        f"{MAX_FEATURE_SCALE:g}. Large inputs saturate activations and make one learning rate wrong for all.",
        {"feature": worst, "max_abs": largest, "features_over": int((scale > MAX_FEATURE_SCALE).sum()),
         "threshold": MAX_FEATURE_SCALE},
        ("Standardise tables with train's mean and std; scale image pixels to [0, 1].",))


# A split's rows found in train beyond twice train's own repeat rate, plus this margin, are copies.
LEAKAGE_ABOVE_SELF_REPEATS = 0.01


def leakage(splits: list[SplitData]) -> Finding | None:
    train = _train(splits)
    if train is None:
        return None
    keys = [_row_key(row) for row in train.inputs.reshape(len(train.inputs), -1)]
    seen = set(keys)
    # in a table of few distinct values (a tenure and a plan, say) identical rows are the data, not copies:
    # a split shares rows with train about as often as train repeats itself, and that is no leak
    expected = 1 - len(seen) / max(len(keys), 1)
    leaks = {}
    for s in splits:
        if s.name == "train" or len(s.inputs) == 0:
            continue
        dup = [i for i, row in enumerate(s.inputs.reshape(len(s.inputs), -1)) if _row_key(row) in seen]
        if dup and len(dup) / len(s.inputs) > 2 * expected + LEAKAGE_ABOVE_SELF_REPEATS:
            leaks[s.name] = {"rows": len(dup), "of": len(s.inputs), "share": len(dup) / len(s.inputs),
                             "first_rows": dup[:SHOWN], "train_repeats_itself": expected}
    if not leaks:
        return None
    worst = max(v["share"] for v in leaks.values())
    return Finding(
        "train_test_leakage", "error" if worst >= LEAKAGE_ERROR_SHARE else "warn",
        "rows duplicated between train and " + ", ".join(leaks),
        "; ".join(f"{v['rows']} of {v['of']} {split} rows ({v['share']:.1%}) also appear in train"
                  for split, v in leaks.items()) + ": the score on them measures memory, not generalisation.",
        leaks, ("Deduplicate before splitting, or split by group (patient, user, source file) so copies stay "
                "on one side.",))


def _counts(targets: torch.Tensor | None, num_classes: int | None) -> list[int]:
    labels = targets.reshape(-1).long()
    labels = labels[labels != IGNORE_INDEX]  # padding, no label
    size = max(num_classes or 0, int(labels.max()) + 1 if len(labels) else 0)
    return torch.bincount(labels.clamp_min(0), minlength=size).tolist()


def _nonfinite_rows(tensors: dict[str, torch.Tensor]) -> dict[str, dict]:
    """{split: rows holding NaN/Inf, and the first few} for the floating-point tensors that have any."""
    bad = {}
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and len(tensor):
            rows = (~torch.isfinite(tensor.reshape(len(tensor), -1))).any(dim=1)
            if rows.any():
                bad[name] = {"rows": int(rows.sum()), "first_rows": rows.nonzero()[:SHOWN, 0].tolist()}
    return bad


def _most_frequent(row: dict[str, int]) -> str:
    """`class count, ...`: every class when there are few, else the most frequent and how many more occur."""
    if len(row) <= SHOWN_CLASSES:
        return ", ".join(f"{c} {n}" for c, n in row.items())
    present = sorted(((c, n) for c, n in row.items() if n), key=lambda item: -item[1])
    more = f" and {len(present) - SHOWN_CLASSES} more classes" if len(present) > SHOWN_CLASSES else ""
    return ", ".join(f"{c} {n}" for c, n in present[:SHOWN_CLASSES]) + more


def _train(splits: list[SplitData]) -> SplitData | None:
    return next((s for s in splits if s.name == "train"), None)


def _row_key(row: torch.Tensor) -> int:
    """A 64-bit hash of the row's bytes: 50,000 image rows kept as bytes would hold hundreds of MB; a chance
    collision among them (about 1 in 10^10) is far below any real leak."""
    return hash(row.contiguous().numpy().tobytes())
