"""A synthetic shop log with a known answer: who looked at what, when, and *why* they did.

The mechanism, per event of one user:
- sessions: a gap of minutes inside a session, of days between sessions (so a 30-minute inactivity cut
  recovers them); at each session start one of the user's few interest categories may drift to another;
- category: inside a session the user mostly stays in the category they are browsing, else picks one of
  their interests;
- item: with probability `follow`, a neighbour (in the category's popularity order) of the *last item this
  user touched in that same category*, however long ago; otherwise a draw from the category's power-law
  popularity. The item at step t therefore depends on the part of the history in t's category, not on the
  most recent event: a model must attend to the relevant past behaviour to predict it (DIN's premise).
- behaviour: view, cart or buy.

`ShopLog.anchor` is that ground truth: for each event, the index of the earlier event it followed (or -1
for a popularity draw), so a test can check the property rather than trust it.

Everything is vectorised across users (one numpy pass per event position), so the default size — 20k
users, 5k items, 1M events — takes seconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainwise.errors import DataError

BEHAVIOURS = ("view", "cart", "buy")
BEHAVIOUR_SHARES = (0.80, 0.15, 0.05)
START_WINDOW_S = 30 * 86_400  # users start their first session somewhere in the first 30 days


@dataclass(frozen=True)
class ShopLog:
    """One row per event, sorted by user then time; the item catalogue; and the generator's ground truth."""

    user: np.ndarray        # int64, 0..users-1
    item: np.ndarray        # int64, 0..items-1
    behaviour: np.ndarray   # int8, index into BEHAVIOURS
    timestamp: np.ndarray   # int64 seconds
    session: np.ndarray     # int64, global session number (ground truth; a 30-minute gap recovers it)
    anchor: np.ndarray      # int64, row of the same user's earlier event this item followed, or -1
    item_category: np.ndarray  # int64 per item
    item_rank: np.ndarray      # int64 per item: popularity rank inside its category ("neighbours" are close)
    num_users: int
    num_items: int

    def __len__(self) -> int:
        return len(self.user)

    def write_csv(self, path: str | Path) -> Path:
        """`visitorid,itemid,event,timestamp`: the shape of a real shop export, for `trainwise prepare`."""
        path = Path(path)
        names = np.array(BEHAVIOURS)[self.behaviour]
        with path.open("w", encoding="utf-8") as out:
            out.write("visitorid,itemid,event,timestamp\n")
            for u, i, b, t in zip(self.user.tolist(), self.item.tolist(), names.tolist(), self.timestamp.tolist()):
                out.write(f"{u},{i},{b},{t}\n")
        return path


def generate_shop_log(*, users: int = 20_000, items: int = 5_000, events: int = 1_000_000,
                      categories: int = 50, interests_per_user: int = 3, follow: float = 0.8,
                      neighbourhood: int = 3, stay_in_category: float = 0.5, new_session: float = 0.15,
                      drift: float = 0.1, popularity_exponent: float = 1.0, seed: int = 0) -> ShopLog:
    """A seeded, deterministic shop log of about `events` events (see the module docstring)."""
    _check_sizes(users, items, events, categories, interests_per_user)
    rng = np.random.default_rng(seed)
    catalogue = _Catalogue.build(items, categories, popularity_exponent, rng)

    # events per user: heavy-tailed (most users browse a little, a few a lot), at least 3 so every user
    # has something to train on, to validate and to test
    weights = rng.lognormal(0.0, 1.0, users)
    lengths = np.maximum(3, np.round(weights / weights.sum() * events)).astype(np.int64)
    interests = rng.integers(0, categories, (users, interests_per_user))
    category_share = catalogue.sizes / catalogue.sizes.sum()  # drift lands on big categories more often
    last_in_category = np.full((users, categories), -1, dtype=np.int64)  # row of the last such event

    total = int(lengths.sum())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    item = np.zeros(total, np.int64)
    category_of_row = np.empty(total, np.int64)
    timestamp = np.empty(total, np.int64)
    session_start = np.zeros(total, bool)
    anchor = np.full(total, -1, np.int64)
    clock = rng.integers(0, START_WINDOW_S, users)
    current = np.zeros(users, np.int64)
    for t in range(int(lengths.max())):
        active = np.flatnonzero(lengths > t)
        row = starts[active] + t
        n = len(active)
        new = (rng.random(n) < new_session) | (t == 0)
        gap = np.where(new, rng.exponential(2 * 86_400, n) + 1_800, rng.exponential(90, n) + 5)
        clock[active] += gap.astype(np.int64)
        timestamp[row], session_start[row] = clock[active], new

        drifting = active[new & (rng.random(n) < drift)]  # interests move, one at a time, between sessions
        slot = rng.integers(0, interests_per_user, len(drifting))
        interests[drifting, slot] = rng.choice(categories, len(drifting), p=category_share)
        picked = interests[active, rng.integers(0, interests_per_user, n)]
        stay = ~new & (rng.random(n) < stay_in_category)
        category = np.where(stay, current[active], picked)
        current[active] = category

        anchor_row = last_in_category[active, category]
        follows = (anchor_row >= 0) & (rng.random(n) < follow)
        drawn = catalogue.draw_popular(category, rng)
        previous = np.where(anchor_row >= 0, item[np.maximum(anchor_row, 0)], drawn)  # row 0 may be unwritten
        near = catalogue.neighbour(previous, neighbourhood, rng)
        item[row] = np.where(follows, near, drawn)
        anchor[row] = np.where(follows, anchor_row, -1)
        category_of_row[row] = category
        last_in_category[active, category] = row

    user = np.repeat(np.arange(users, dtype=np.int64), lengths)
    behaviour = rng.choice(len(BEHAVIOURS), total, p=BEHAVIOUR_SHARES).astype(np.int8)
    return ShopLog(user=user, item=item, behaviour=behaviour, timestamp=timestamp,
                   session=np.cumsum(session_start) - 1, anchor=anchor, item_category=catalogue.category_of,
                   item_rank=catalogue.rank_of,
                   num_users=users, num_items=items)


def _check_sizes(users: int, items: int, events: int, categories: int, interests: int) -> None:
    if min(users, items, events, categories, interests) < 1:
        raise DataError("the shop log needs at least one user, item, event, category and interest.")
    if categories > items:
        raise DataError(f"{categories} categories for {items} items: every category needs an item; "
                        "use fewer categories.")


@dataclass(frozen=True)
class _Catalogue:
    """Items in categories of power-law sizes; inside a category, items in popularity order (rank 0 first).
    `flat` lists the items category after category, each category's block in rank order."""

    flat: np.ndarray
    sizes: np.ndarray
    offsets: np.ndarray         # where each category's block starts in `flat`
    category_of: np.ndarray     # per item id
    rank_of: np.ndarray         # per item id: popularity rank inside its category
    keys: np.ndarray            # per `flat` position: category index + within-category Zipf CDF

    @classmethod
    def build(cls, items: int, categories: int, exponent: float, rng: np.random.Generator) -> "_Catalogue":
        shares = rng.pareto(1.5, categories) + 1
        sizes = np.maximum(1, np.floor(shares / shares.sum() * items)).astype(np.int64)
        sizes[np.argmax(sizes)] += items - sizes.sum()  # rounding: the largest category takes the rest
        flat = rng.permutation(items)  # item ids carry no information about category or popularity
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        category_of = np.empty(items, np.int64)
        category_of[flat] = np.repeat(np.arange(categories), sizes)
        rank_of = np.empty(items, np.int64)
        rank_of[flat] = np.arange(items) - np.repeat(offsets, sizes)
        zipf = 1.0 / (rank_of[flat] + 1.0) ** exponent
        cumulative = np.cumsum(zipf)
        before = np.repeat(np.concatenate([[0.0], cumulative[offsets[1:] - 1]]), sizes)
        total = np.repeat(np.add.reduceat(zipf, offsets), sizes)
        keys = np.repeat(np.arange(categories), sizes) + (cumulative - before) / total
        return cls(flat, sizes, offsets, category_of, rank_of, keys)

    def draw_popular(self, category: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A Zipf draw inside each given category: one searchsorted for all of them (key c + u)."""
        position = np.searchsorted(self.keys, category + rng.random(len(category)) * (1 - 1e-9))
        return self.flat[np.minimum(position, len(self.flat) - 1)]

    def neighbour(self, previous: np.ndarray, width: int, rng: np.random.Generator) -> np.ndarray:
        """An item within `width` popularity ranks of `previous` in its category, leaning towards the popular
        end (so the catalogue stays power-law), never `previous` itself when the category has another."""
        category = self.category_of[previous]
        size = self.sizes[category]
        step = rng.integers(1, width + 1, len(previous)) * np.where(rng.random(len(previous)) < 0.6, -1, 1)
        rank = np.abs(self.rank_of[previous] + step)  # reflect at the popular end
        rank = np.where(rank >= size, 2 * (size - 1) - rank, rank)  # and at the other
        rank = np.clip(rank, 0, size - 1)
        return self.flat[self.offsets[category] + rank]
