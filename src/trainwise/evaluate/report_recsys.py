"""The report's section for a recommender run: is it better than recommending the best-sellers, for which
users, and what did it look at?

- the test split's full-ranking metrics next to the popularity baseline (the training interaction counts as
  scores: no training needed) on the same queries;
- the same metrics by user activity: cold / warm / heavy users by how many events they had before the
  held-out one (a model that only helps heavy users is a different product from one that helps newcomers);
- one user's history with the weights the model gave each event: DIN's attention for the item the user
  actually took next, SASRec's last-layer attention of the position that scores it.

Computed from the run directory (its config rebuilds the data; its best weights) when the report is written.
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import numpy as np

from trainwise.rundir.layout import RunDir

if TYPE_CHECKING:  # torch is imported where a recommender's section is built: other reports never need it
    import torch

BUCKETS = (("cold", 0, 10), ("warm", 10, 50), ("heavy", 50, None))  # events before the held-out one
METRICS = ("ndcg@10", "hr@10", "mrr")
EXAMPLE_EVENTS = 15  # most recent events of the example user shown


class RecommenderSection(dict):
    """The section's facts; renders itself in a Jinja template (`{{ recommender }}`) and as Markdown."""

    def __html__(self) -> str:
        return section_html(self)

    def markdown(self) -> list[str]:
        return section_markdown(self)


def recsys_section(run: RunDir, checkpoint: str = "best") -> RecommenderSection | None:
    """The section's facts, or None when the run is not a recommender (or has no weights yet)."""
    try:
        config = run.read_config()
    except Exception:  # the report says elsewhere what is wrong with the run directory
        return None
    if config.data.name != "shop":
        return None
    import torch  # only now: the other runs' reports need neither torch nor the data builders

    from trainwise.rundir.weights import load_weights
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.recsys.ranking import full_ranking

    try:
        state, _, _ = load_weights(run, checkpoint)  # type: ignore[arg-type]
    except Exception:
        return None
    bundle = build_data(config)
    queries = bundle.test
    if queries is None or not hasattr(queries, "fetch_for_ranking"):
        return None
    model = build_model(config, bundle.spec)
    model.load_state_dict(state)
    model.eval()
    histories = queries.histories
    counts = histories.train_item_counts()
    popularity_scores = torch.as_tensor(counts, dtype=torch.float32)

    def by_popularity(history: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return popularity_scores[items].expand(len(history), -1)

    def measure(score_items, subset: np.ndarray) -> dict[str, float]:
        metrics, _ = full_ranking(score_items, fetch=lambda i: queries.fetch_for_ranking(subset[i]),
                                  seen=lambda i: queries.seen(int(subset[i])), num_queries=len(subset),
                                  num_items=histories.num_items, item_counts=counts, device=torch.device("cpu"))
        return {m: metrics[m] for m in METRICS if m in metrics}

    everyone = np.arange(len(queries))
    overall = {"model": measure(model.score_items, everyone), "popularity": measure(by_popularity, everyone)}
    history_length = queries.rows - queries.start
    buckets = []
    for name, low, high in BUCKETS:
        members = everyone[(history_length >= low) & ((history_length < high) if high else True)]
        span = f"{low}–{high - 1} events before" if high else f"{low}+ events before"
        row = {"bucket": name, "span": span, "users": int(len(members))}
        if len(members):
            row.update(model=measure(model.score_items, members), popularity=measure(by_popularity, members))
        buckets.append(row)
    return RecommenderSection(model=config.model.name, queries=int(len(queries)), overall=overall, buckets=buckets,
                              example=example_user(model, queries, config.data.path))


def example_user(model: torch.nn.Module, queries, data_path: str | None) -> dict[str, Any] | None:
    """The first test query's user (with the longest history among the first 100): the last events and
    the weight the model gave each."""
    import torch

    from trainwise.evaluate.recommend import _id_maps, _raw

    if len(queries) == 0:
        return None
    first = np.arange(min(100, len(queries)))
    query = int(first[np.argmax((queries.rows - queries.start)[first])])
    history, target = queries.fetch_for_ranking(np.array([query]))
    history = torch.as_tensor(history)
    with torch.no_grad():
        if getattr(model, "attention", False) and hasattr(model, "attention_weights"):  # DIN
            weights, kind = model.attention_weights(history, torch.as_tensor(target) + 1), \
                "DIN attention for the item the user took next (not normalised)"
        elif hasattr(model, "blocks") and hasattr(model, "attention_weights"):  # SASRec
            weights, kind = model.attention_weights(history), \
                "SASRec last-layer attention of the position that scores the next item (sums to 1)"
        else:
            weights, kind = None, f"{type(model).__name__} has no attention: no weights to show"
    histories = queries.histories
    user_ids, item_ids = _id_maps(data_path, histories.num_users, histories.num_items)
    items = history[0, 0] if history.dim() == 3 else history[0]
    kept = (items > 0).nonzero().squeeze(1)[-EXAMPLE_EVENTS:]
    events = [{"item": _raw(item_ids, int(items[p]) - 1), "position_from_newest": int(items.shape[0] - p),
               "weight": None if weights is None else float(weights[0, p])} for p in kept.tolist()]
    user = _raw(user_ids, int(histories.user[queries.rows[query]]))
    return {"user": user, "next_item": _raw(item_ids, int(target[0])), "weights": kind, "events": events}


def section_html(section: dict[str, Any]) -> str:
    """The section as an HTML fragment (escaped), for report_template.html."""
    e = html.escape
    out = ['<section id="recommender"><h2>Recommender</h2>',
           f'<p class="muted">{e(section["model"])} on {section["queries"]} held-out test events: full ranking, '
           'seen items excluded, next to recommending the most popular items.</p>',
           "<table><tr><th>users</th><th>count</th>" + "".join(f"<th>{m}</th><th>popularity</th>" for m in METRICS)
           + "</tr>"]
    for label, count, row in _rows(section):
        cells = "".join(f"<td><b>{_number(row['model'].get(m))}</b></td><td class=\"muted\">"
                        f"{_number(row['popularity'].get(m))}</td>" if row else "<td>—</td><td>—</td>"
                        for m in METRICS)
        out.append(f"<tr><td>{e(label)}</td><td>{count}</td>{cells}</tr>")
    out.append("</table>")
    example = section.get("example")
    if example:
        out.append(f'<p>User <b>{e(str(example["user"]))}</b>, who took item <b>{e(str(example["next_item"]))}</b> '
                   f'next; {e(example["weights"])}:</p><table><tr><th>events ago</th><th>item</th><th>weight</th></tr>')
        out += [f"<tr><td>{ev['position_from_newest']}</td><td>{e(str(ev['item']))}</td>"
                f"<td>{_number(ev['weight'])}</td></tr>" for ev in reversed(example["events"])]
        out.append("</table>")
    return "\n".join(out + ["</section>"])


def section_markdown(section: dict[str, Any]) -> list[str]:
    lines = ["", "## Recommender", "", f"{section['model']} on {section['queries']} held-out test events (full "
             "ranking, seen items excluded); popularity = recommending the most popular items.", "",
             "| users | count | " + " | ".join(f"{m} | popularity" for m in METRICS) + " |",
             "|---" * (2 + 2 * len(METRICS)) + "|"]
    for label, count, row in _rows(section):
        cells = " | ".join(f"**{_number(row['model'].get(m))}** | {_number(row['popularity'].get(m))}" if row
                           else "— | —" for m in METRICS)
        lines.append(f"| {label} | {count} | {cells} |")
    example = section.get("example")
    if example:
        lines += ["", f"User **{example['user']}**, who took item **{example['next_item']}** next; "
                  f"{example['weights']}:", "", "| events ago | item | weight |", "|---|---|---|"]
        lines += [f"| {ev['position_from_newest']} | {ev['item']} | {_number(ev['weight'])} |"
                  for ev in reversed(example["events"])]
    return lines


def _rows(section: dict[str, Any]):
    yield "all", section["queries"], section["overall"]
    for bucket in section["buckets"]:
        yield (f"{bucket['bucket']} ({bucket['span']})", bucket["users"],
               {"model": bucket["model"], "popularity": bucket["popularity"]} if "model" in bucket else None)


def _number(value: Any) -> str:
    return "—" if value is None else f"{value:.4f}"
