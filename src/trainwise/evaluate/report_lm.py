"""The report's section for a language-model run: what the model writes for fixed prompts, how the loss
falls with context (by position in the document) and with tokens seen, its most frequent wrong guesses, and
the training throughput (tokens/s, MFU). From the run directory alone: its records and `trainwise eval`'s
metrics.json (task causal_lm)."""
from __future__ import annotations

import html
from typing import Any

from trainwise.rundir import RunDir
from trainwise.rundir.records import typical_rate


EMPTY_ANSWER = "(empty)"  # a model that answered nothing: said, never a blank cell


def shown_answer(answer: str) -> str:
    return answer if answer.strip() else EMPTY_ANSWER


def exact_match_headline(tuned: dict[str, Any]) -> str:
    """`trainwise eval`'s and the report's one line on a fine-tune: tuned vs base exact match on the split."""
    base = tuned.get("base_exact_match")
    versus = f" (base model: {base:.1%})" if base is not None else ""
    return (f"exact match {tuned['exact_match']:.1%}{versus} on {tuned['answers']} held-out prompts (greedy, chat "
            f"template {tuned['chat_template']})")


class LanguageModelSection(dict):
    """Renders itself in a Jinja template (`{{ language_model }}`) and as Markdown."""

    def __html__(self) -> str:
        parts = ["<section><h2>Language model</h2>"]
        if self.get("throughput"):
            parts.append(f"<p>{html.escape(self['throughput'])}</p>")
        for title, header, rows in self.tables():
            parts.append(f"<h3>{html.escape(title)}</h3><table><tr>" + "".join(f"<th>{html.escape(h)}</th>"
                                                                               for h in header) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows]
            parts.append("</table>")
        return "".join(parts) + "</section>"

    def markdown(self) -> list[str]:
        lines = ["", "## Language model", ""] + ([self["throughput"], ""] if self.get("throughput") else [])
        for title, header, rows in self.tables():
            lines += [f"### {title}", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
            lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", "⏎") for c in row) + " |"
                      for row in rows]
            lines.append("")
        return lines

    def tables(self) -> list[tuple[str, list[str], list[list[Any]]]]:
        found = []
        tuned = self.get("finetune")
        if tuned:
            found.append((f"Fine-tune: {exact_match_headline(tuned)}; base and tuned answers",
                          ["prompt", "reference", "base", "tuned"],
                          [[r["prompt"], r.get("reference", ""), shown_answer(r["base"]), shown_answer(r["tuned"])]
                           for r in tuned["side_by_side"]]))
        if self.get("generations"):
            found.append(("Generations (greedy, " + ("held-out prompts through the chat template)" if tuned else
                                                     "fixed prompts: the openings of the test documents)"),
                          ["prompt", "continuation"], [[g["prompt"], g["continuation"]] for g in self["generations"]]))
        if self.get("by_tokens"):
            found.append(("Validation loss against tokens seen", ["step", "tokens seen", "val loss"], self["by_tokens"]))
        if self.get("loss_by_position"):
            found.append(("Test loss by position in the document", ["positions", "tokens", "loss"],
                          [[r["positions"], r["tokens"], f"{r['loss']:.4f}"] for r in self["loss_by_position"]]))
        if self.get("top_confusions"):
            found.append(("Most frequent wrong next tokens", ["expected", "predicted", "count"],
                          [[repr(r["true"]), repr(r["predicted"]), r["count"]] for r in self["top_confusions"]]))
        return found


def language_model_section(run: RunDir, records: list[dict[str, Any]], evaluation: dict[str, Any] | None,
                           config: Any) -> LanguageModelSection | None:
    """The section's facts, or None when the run is not a language model."""
    train = [r for r in records if r.get("split") == "train" and "tokens_per_s" in r]
    if not train and (evaluation or {}).get("task") != "causal_lm":
        return None
    from trainwise.data.text.tokenizer import recorded_sequence_length

    section = LanguageModelSection()
    if train:  # the typical interval (the median), not the last one: an outlier either way says little
        rate = typical_rate([float(r["tokens_per_s"]) for r in train])
        mfus = [float(r["mfu"]) for r in train if isinstance(r.get("mfu"), (int, float))]
        mfu = f"MFU {typical_rate(mfus):.1%}" if mfus else "no MFU: no catalogue peak for this device"
        section["throughput"] = (f"Training ran at {rate:,.0f} tokens/s per rank, the median of its logged "
                                 f"intervals after start-up ({mfu}).")
    seq_len = recorded_sequence_length(run.tokenizer_dir()) or (config.data.seq_len if config else None)
    if seq_len and config:
        per_step = config.train.batch_size * seq_len
        section["by_tokens"] = [[r["step"], f"{r['step'] * per_step:,}", f"{r['loss']:.4f}"]
                                for r in records if r.get("split") == "val" and "loss" in r]
    if evaluation and evaluation.get("task") == "causal_lm":
        for key in ("generations", "loss_by_position", "top_confusions", "finetune"):
            section[key] = evaluation.get(key) or []
    return section
