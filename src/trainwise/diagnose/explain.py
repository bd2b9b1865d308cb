"""explain: a crash log in, one Finding out (category, cause in plain words, fixes, the lines that show it).

It reads the whole log and picks the root cause, not the last line:
- every rule is tried on every line holding one of its keywords (source lines quoted inside tracebacks
  excepted);
- the rule whose first line comes earliest wins, because the first failure causes the ones after it
  (an OOM on rank 3 before the other ranks' timeouts; the first exception of a chained traceback);
- symptoms other failures cause (collective timeouts, "remote process exited") win only when nothing else
  matched;
- a rule's variant refines the reading with lines anywhere in the log (an index Assertion printed after
  "device-side assert triggered" still makes it a label out of range).
Nothing matched means "not recognised", quoting the last exception: never a guess.

Pure and cheap: no I/O, patterns compiled once, so the Trainer can call it on any exception.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from trainwise.findings import Finding
from trainwise.diagnose.rules import ENVIRONMENT_RULES, Rule, Variant
from trainwise.diagnose.rules_compute import COMPUTE_RULES

# Order breaks ties between rules matching the same line: shared memory before a full disk, GPU OOM
# before the NCCL error it raises.
RULES: tuple[Rule, ...] = ENVIRONMENT_RULES + COMPUTE_RULES
CATEGORIES: tuple[str, ...] = tuple(dict.fromkeys(rule.code for rule in RULES)) + ("unknown",)

MAX_LINES_PER_RULE = 3      # repeated lines (one per rank, one per thread) add nothing after the first few
MAX_LINE_CHARS = 400
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_FRAME = re.compile(r'\bFile "[^"\n]*", line \d+')   # anywhere: logs prefix it with times, ranks, levels
# IPython marks the failing source line with an arrow (`---> 55 net = ...`); Rich draws the code in a box
_QUOTED_SOURCE = re.compile(r"^[ \t]*-+>[ \t]*\d+[ \t]|^[ \t]*[│┃]", re.MULTILINE)
_EXCEPTION = re.compile(r"(?:^|[\s\]:>|])((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault))"
                        r"(?::\s|:?\s*$)")
_EXCEPTION_WORDS = ("Error", "Exception", "Exit", "Interrupt", "Fault")
_DIGITS = re.compile(r"\d+")
_RANK = re.compile(r"\[[Rr]ank ?(\d+)\]|\brank(\d+)\]")


@dataclass(frozen=True)
class _Line:
    number: int
    """1-based, as an editor shows it."""
    text: str


class _Log:
    """A log split into lines, with the lines not worth matching set aside: a traceback's `File "..."`
    lines and the source lines quoted under them (they hold the message of the `raise` that follows and
    would be quoted instead of it). Keywords are found by scanning the whole text in C, and patterns run
    only on the lines holding one, so a log of 200,000 progress lines costs seconds, not minutes."""

    def __init__(self, text: str):
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        self.lines = [line.rstrip() for line in text.splitlines()]
        self.text = "\n".join(self.lines)
        # lower() lengthens a few characters ("İ"); such a line keeps its case so the offsets of both agree
        self.lower = "\n".join(low if len(low := line.lower()) == len(line) else line for line in self.lines)
        self.starts = list(accumulate((len(line) + 1 for line in self.lines), initial=0))
        self.skipped = self._quoted_source()
        self._keyword_lines: dict[str, set[int]] = {}

    def _quoted_source(self) -> set[int]:
        skipped = {self.index(m.start()) for m in _QUOTED_SOURCE.finditer(self.text)}
        for match in _FRAME.finditer(self.text):
            frame = self.index(match.start())
            skipped.add(frame)
            below = frame + 1
            if below < len(self.lines) and not _EXCEPTION.search(self.lines[below]):
                skipped.add(below)
        return skipped

    def index(self, offset: int) -> int:
        return bisect_right(self.starts, offset) - 1

    def line(self, index: int) -> _Line:
        return _Line(index + 1, self.lines[index])

    def lines_with(self, word: str) -> set[int]:
        """Indices of the lines whose lower-cased text contains `word` (str.find: a fast C scan)."""
        if word not in self._keyword_lines:
            found, at = set(), self.lower.find(word)
            while at != -1:
                index = self.index(at)
                found.add(index)
                at = self.lower.find(word, self.starts[index + 1])
            self._keyword_lines[word] = found - self.skipped
        return self._keyword_lines[word]

    def matching(self, rule: Rule) -> list[_Line]:
        candidates = sorted(set().union(*(self.lines_with(word) for word in rule.keywords)))
        return [self.line(i) for i in candidates if any(p.search(self.lines[i]) for p in rule.patterns)]

    def search_all(self, pattern: re.Pattern[str]) -> list[_Line]:
        """Every line `pattern` matches, in order (for variants: rare patterns, any line)."""
        indices = dict.fromkeys(self.index(m.start()) for m in pattern.finditer(self.text))
        return [self.line(i) for i in indices if i not in self.skipped]

    def last_exception(self) -> _Line | None:
        for index in range(len(self.lines) - 1, -1, -1):
            text = self.lines[index]
            # the substring test first: the pattern is slow, and most lines name no exception
            if any(word in text for word in _EXCEPTION_WORDS) and index not in self.skipped \
                    and _EXCEPTION.search(text):
                return self.line(index)
        return None

    def last_line(self) -> _Line | None:
        for index in range(len(self.lines) - 1, -1, -1):
            if self.lines[index].strip():
                return self.line(index)
        return None


def explain(text: str) -> Finding:
    """The root cause of the failure `text` shows, as a Finding whose `code` is one of CATEGORIES."""
    log = _Log(text)
    found = {rule: lines for rule in RULES if (lines := log.matching(rule))}
    symptoms = {rule: lines for rule, lines in found.items() if rule.fallout}
    # a line that reports a consequence ("NCCL error ...: remote process exited") is no cause, whatever
    # else it also matches
    consequence = {line.number for lines in symptoms.values() for line in lines}
    causes = {rule: kept for rule, lines in found.items()
              if not rule.fallout and (kept := [line for line in lines if line.number not in consequence])}
    if not causes and not symptoms:
        return _not_recognised(log)
    pool = causes or symptoms
    root = min(pool, key=lambda rule: pool[rule][0].number)   # min keeps table order on equal lines
    return _finding(root, pool[root], symptoms if causes else {}, log)


def _finding(root: Rule, lines: list[_Line], symptoms: dict[Rule, list[_Line]], log: _Log) -> Finding:
    chosen, shown = _variant(root, log)
    title, cause, fixes = (chosen.title, chosen.cause, chosen.fixes) if chosen else (root.title, root.cause,
                                                                                      root.fixes)
    quoted = _first_distinct(lines) + _first_distinct(shown)
    rank = _rank(lines[0].text)
    if rank is not None:
        cause += f" It shows first on rank {rank}."
    if symptoms:
        symptom = min(symptoms, key=lambda rule: symptoms[rule][0].number)
        cause += f" The \"{symptom.title.lower()}\" on line {symptoms[symptom][0].number} is a consequence."
        quoted.append(symptoms[symptom][0])
    evidence = sorted({line.number: line for line in quoted}.values(), key=lambda line: line.number)
    return Finding(code=root.code, severity="error", title=title, detail=cause, fixes=fixes,
                   evidence={"lines": [_quote(line) for line in evidence]})


def _variant(rule: Rule, log: _Log) -> tuple[Variant | None, list[_Line]]:
    """The first variant whose patterns show in the log, with the lines they match."""
    for variant in rule.variants:
        found = [lines for p in variant.patterns if (lines := log.search_all(p))]
        if len(found) == 1 or (found and not variant.exclusive):
            return variant, sorted((line for lines in found for line in lines), key=lambda line: line.number)
    return None, []


def _first_distinct(lines: list[_Line]) -> list[_Line]:
    seen: dict[str, _Line] = {}
    for line in lines:
        key = _DIGITS.sub("#", line.text).strip()   # the same message from another rank, pid or time
        if key not in seen:
            seen[key] = line
            if len(seen) == MAX_LINES_PER_RULE:
                break
    return list(seen.values())


def _rank(text: str) -> int | None:
    match = _RANK.search(text)
    return int(match.group(1) or match.group(2)) if match else None


def _not_recognised(log: _Log) -> Finding:
    exception = log.last_exception()
    last = exception or log.last_line()
    what = "the last exception" if exception else "the last line"
    return Finding(
        code="unknown", severity="error", title="Error not recognised",
        detail=f"None of the known failure patterns is in this log, so no cause is claimed; {what} is quoted.",
        fixes=("Read the whole traceback: in a chain of exceptions the first one is usually the cause.",
               "Search the quoted message in the PyTorch forums (discuss.pytorch.org) and the issue tracker "
               "of the library that raised it."),
        evidence={"lines": [_quote(last)] if last else []})


def _quote(line: _Line) -> dict:
    text = line.text.strip()
    return {"line": line.number, "text": text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…"}
