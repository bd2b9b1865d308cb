"""The `shop` data builder: behaviour histories from the synthetic shop log or from a prepared interaction
log (`trainwise prepare LOG --to DIR`, then `data.path=DIR`), as the train/val/test splits a recommender
recipe trains on.

Splits are by time and never leak the future (data/interactions.py): `last-k` holds out each user's last
event for test and the one before for validation; `time` cuts all users at one instant. A prepared
directory keeps the split it was prepared with.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from trainwise.data.bundle import DataBundle, DataSpec
from trainwise.data.interactions import split_by_time
from trainwise.data.shards import read_manifest
from trainwise.errors import DataError
from trainwise.recsys.generator import BEHAVIOURS, generate_shop_log
from trainwise.recsys.sequences import ClickPairs, HeldOutClicks, HeldOutQueries, Histories, NextItemWindows

Objective = Literal["next_item", "ctr"]


@dataclass(frozen=True)
class SequenceSpec(DataSpec):
    """A DataSpec that also tells a recommender the catalogue size and the history length."""

    num_items: int = 0
    max_len: int = 50
    objective: Objective = "next_item"
    num_behaviours: int = 0  # behaviour types (view, cart, buy) in the inputs; 0: items only
    item_counts: tuple[int, ...] = field(default=(), repr=False)  # training interactions per item
    negatives: int = 0  # click objective: sampled non-clicks per click (its chance loss depends on them)


def shop(*, seed: int, val_fraction: float, test_fraction: float, augment: bool = False, path: str | None = None,
         objective: Objective = "next_item", max_len: int = 50, negatives: int = 1, max_eval_queries: int = 5000,
         split: str = "last-k", users: int = 20_000, items: int = 5_000, events: int = 1_000_000,
         categories: int = 50, behaviours: bool | None = None, data_seed: int | None = 0) -> DataBundle:
    """Behaviour sequences as a DataBundle; see the module docstring. `users`, `items`, `events` and
    `categories` size the synthetic log and are ignored when `path` names a prepared directory.
    `behaviours`: feed the behaviour types (view, cart, buy) to the model beside the items; default: when a
    prepared log has them (`trainwise prepare` keeps an `event` column), not on the synthetic log.
    `data_seed` seeds the synthetic log and the held-out samples (evaluation queries, validation negatives). It
    is fixed by default, apart from the run's `seed` (initialisation, training order and negatives): runs of
    several seeds (`trainwise ablate --seeds 3`) then train on the same log and are judged on the same queries,
    and their spread is the training's alone. `data_seed: null` follows `seed`, for a spread over logs too."""
    seed = seed if data_seed is None else data_seed
    if augment:
        raise ValueError("data.augment: behaviour sequences have no augmentation; set data.augment=false")
    if path:
        histories, source = prepared_histories(Path(path), use_behaviours=behaviours is not False), \
            {"prepared": str(path)}
        if behaviours and histories.behaviour is None:
            raise DataError(f"data.args.behaviours=true, but {path} has no behaviour types: prepare a log with an "
                            "event column (view/cart/buy; --event-col NAME), or set data.args.behaviours=false.")
    else:
        log = generate_shop_log(users=users, items=items, events=events, categories=categories, seed=seed)
        codes = split_by_time(log.user, log.timestamp, how=split, val_fraction=val_fraction,
                              test_fraction=test_fraction, last_k=1)
        split_code = np.empty(len(log), np.int8)
        split_code[codes.order] = codes.split
        kinds = dict(behaviour=log.behaviour, num_behaviours=len(BEHAVIOURS)) if behaviours else {}
        histories = Histories.from_events(log.user, log.item, log.timestamp, split_code, log.num_users,
                                          log.num_items, **kinds)
        source = {"generated": {"users": users, "items": items, "events": len(log), "seed": seed,
                                "split": split}}
    return sequence_bundle(histories, objective=objective, max_len=max_len, negatives=negatives,
                           max_eval_queries=max_eval_queries, seed=seed, notes=source)


def sequence_bundle(histories: Histories, *, objective: Objective, max_len: int, negatives: int,
                    max_eval_queries: int | None, seed: int, notes: dict | None = None) -> DataBundle:
    channels = (2,) if histories.behaviour is not None else ()  # items, behaviour types
    if objective == "next_item":
        train = NextItemWindows(histories, max_len)
        held_out = [HeldOutQueries(histories, code, max_len, max_eval_queries, seed) for code in (1, 2)]
        input_shape, classes = (*channels, max_len), histories.num_items
    elif objective == "ctr":
        train = ClickPairs.for_training(histories, max_len, negatives, seed)
        val_rows = HeldOutQueries(histories, 1, max_len, max_eval_queries, seed).rows
        # validation during training: the same click objective on held-out events, with fixed negatives;
        # `trainwise eval` ranks the full catalogue with the test queries instead
        held_out = [ClickPairs(histories, val_rows, max_len, negatives, seed) if len(val_rows) else None,
                    HeldOutClicks(histories, 2, max_len, max_eval_queries, seed, negatives)]
        input_shape, classes = (*channels, max_len + 1), 2
    else:
        raise ValueError(f"objective {objective!r}: use next_item (SASRec, GRU4Rec, popularity) or ctr (DIN)")
    val, test = (d if d is not None and len(d) else None for d in held_out)
    spec = SequenceSpec(input_shape=input_shape, num_classes=classes, task="classification",
                        input_dtype=torch.long, num_train=len(train),
                        num_items=histories.num_items, max_len=max_len, objective=objective,
                        num_behaviours=histories.num_behaviours,
                        item_counts=tuple(histories.train_item_counts().tolist()),
                        negatives=negatives if objective == "ctr" else 0)
    return DataBundle(train, val, test, spec=spec, notes={**(notes or {}), "objective": objective,
                                                          "users": histories.num_users,
                                                          "items": histories.num_items})


def prepared_histories(directory: Path, use_behaviours: bool = True) -> Histories:
    """(user, item, timestamp, split[, behaviour]) of every event of a prepared interactions directory."""
    from trainwise.data.prepared import PreparedDataset

    manifest = read_manifest(directory)
    if manifest.get("kind") != "interactions":
        raise DataError(f"{directory}: a {manifest.get('kind')} dataset, not an interaction log. Prepare the "
                        "log with `trainwise prepare LOG --to DIR --split last-k`.")
    behaviour_names = manifest.get("behaviours") if use_behaviours else None
    parts = []
    for code, name in enumerate(("train", "val", "test")):
        if not manifest["splits"].get(name, {}).get("count"):
            continue
        split = PreparedDataset(directory, name, manifest=manifest)
        pairs = split.column("inputs").astype(np.int64)
        parts.append((pairs[:, 0], pairs[:, 1], split.column("timestamp").astype(np.int64),
                      np.full(len(pairs), code, np.int8),
                      split.column("behaviour").astype(np.int64) if behaviour_names else np.zeros(0, np.int64)))
    if not parts:
        raise DataError(f"{directory}: the prepared log has no events.")
    user, item, time, code, behaviour = (np.concatenate(column) for column in zip(*parts))
    kinds = dict(behaviour=behaviour, num_behaviours=len(behaviour_names)) if behaviour_names else {}
    return Histories.from_events(user, item, time, code, int(manifest["num_users"]), int(manifest["num_items"]),
                                 **kinds)
