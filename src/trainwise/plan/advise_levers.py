"""Advice for a language-model job that does not fit: the levers that make it fit a card, ranked. Every lever
not in use, for every method (a bf16 base for LoRA included), is re-planned — the changed job traced again at
one sequence per micro-batch, the least any job runs with — so "LoRA + checkpointing fits a 24 GB card" is a
traced statement.

Order: single levers that fit a card asked about (least slowdown first); then two levers together that fit
one (so "one card holds it with two levers" comes before renting more); then more cards (FSDP) or a bigger
card; then the rest by peak, and a shorter context (a different job) last. A lever's slowdown is the ratio
of step times as llm_time.py computes them for the layouts (advise_layouts.py; the smallest card asked about,
micro-batch 1): the same numbers the plan prints per layout.

Pure: the estimate, the catalogue, and `replan` (the planner's llm_estimate.peak_at_micro_one: a changed job's
trace at one sequence per micro-batch) in, ranked levers out; tests hand it made-up traces.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from trainwise.plan import advise as rules
from trainwise.plan.catalog import Gpu
from trainwise.plan.advise_layouts import card_budget, card_precision, layouts, work_at, work_of
from trainwise.plan.llm_estimate import LmEstimate, advice_estimates
from trainwise.plan.llm_job import LmJob, base_dtype
from trainwise.plan.llm_time import step_seconds
from trainwise.plan.traced_step import StepTrace

Replan = Callable[..., StepTrace]  # (job, count_flops=...) -> its trace at one sequence per micro-batch

LOSS_CHUNK = 1024
FSDP_CARDS = (2, 4, 8, 16, 32, 64)  # FSDP layouts offered as a lever: the fewest that fit
NODE_GPUS = 8  # GPUs in one server: more cards than this are several machines
PAIRED = 4  # the single levers (smallest peaks first) whose pairs are traced when none fits alone


@dataclass(frozen=True)
class Lever:
    name: str  # in the user's words: "gradient checkpointing", "LoRA (rank 16)", ...
    how: str  # the flag or config field that applies it
    peak_bytes: int  # the changed job's peak at one sequence per micro-batch (per card for FSDP)
    slowdown: float  # step time relative to the job as given on one card (1.0 = none)
    fits: tuple[str, ...] = ()  # cards it fits on alone
    changes_job: bool = False  # shorter context: a different job, offered last
    hardware: bool = False  # more cards or a bigger one: the job itself unchanged
    levers: int = 1  # how many levers together


def gpu_flag(name: str) -> str:
    """`--gpu NAME` as it pastes into a shell: quoted when the name has a space."""
    return f'--gpu "{name}"' if " " in name else f"--gpu {name}"


def candidate_levers(job: LmJob) -> list[tuple[str, str, LmJob, bool]]:
    """(name, how, changed job, changes the job) for each lever not in use."""
    out = []
    if not job.gradient_checkpointing:
        out.append(("gradient checkpointing", "--checkpointing / model.gradient_checkpointing=true",
                    job.with_changes(gradient_checkpointing=True), False))
    if not job.loss_chunk_size:
        out.append((f"chunked loss ({LOSS_CHUNK} tokens at a time)", f"--loss-chunk {LOSS_CHUNK} / "
                    f"model.loss_chunk_size={LOSS_CHUNK}", job.with_changes(loss_chunk_size=LOSS_CHUNK), False))
    if job.optimizer == "adamw" and job.method in ("full", "freeze"):  # adapters' state is <1% of the weights
        out.append(("8-bit AdamW (bitsandbytes)", "--optimizer adamw8bit", job.with_changes(optimizer="adamw8bit"),
                    False))
    if job.dtype == "fp32" and job.method != "qlora":
        name = ("pure bf16 weights (no fp32 master copy: small updates are lost)" if job.method == "full"
                else "a bf16 base (the frozen weights in bf16)")
        pure = " model.master_weights=none" if job.method == "full" else ""  # full: bf16 keeps fp32 masters
        out.append((name, f"--dtype bf16{pure} / model.dtype=bf16{pure}", job.with_changes(dtype="bf16"), False))
    if job.method in ("full", "freeze"):  # a method lever brings the method's usual base: bf16
        out.append((f"LoRA (rank {job.lora.rank}) on a bf16 base", "--method lora / model.method=lora",
                    job.with_changes(method="lora", dtype=base_dtype("lora")), False))
    if job.method == "full":
        out.append(("train only the last 2 blocks and the head, bf16 base", "--method freeze / "
                    "model.method=freeze", job.with_changes(method="freeze", trainable_blocks=min(2, job.depth()),
                                                            dtype=base_dtype("freeze")), False))
    if job.method != "qlora":
        out.append(("QLoRA (4-bit base, CUDA + bitsandbytes)", "--method qlora / model.method=qlora",
                    job.with_changes(method="qlora", dtype="bf16"), False))
    if job.seq_len >= 512:
        out.append((f"shorter context ({job.seq_len // 2} tokens)", f"--seq-len {job.seq_len // 2}",
                    job.with_changes(seq_len=job.seq_len // 2), True))
    return out


def lever_seconds(est: LmEstimate, job: LmJob, gpu: Gpu, replan: Replan) -> float:
    """One step of `job` on one `gpu` at micro-batch 1 (memory aside): what lever slowdowns divide."""
    base = est.traces[0]
    if job == est.job:
        work = work_at(est, 1)
    else:
        same_work = job.with_changes(optimizer=est.job.optimizer, dtype=est.job.dtype) == est.job
        trace = replan(job, count_flops=not same_work)
        # the trace's parameter_bytes is every weight as stored; the optimizer's share: the trainable elements in
        # their dtype (bf16 weights train in bf16; adapters and fp32 master weights in fp32)
        element = 2 if job.dtype == "bf16" and job.method in ("full", "freeze") else 4
        work = work_of(trace, job, trace.parameter_bytes, trace.parameter_count * element, trace.parameter_count,
                       flops=base.micro_batch_flops if same_work else None)
    return step_seconds(work, gpu, card_precision(job, gpu), job.batch_size, 1).seconds


def rank_levers(est: LmEstimate, gpus: tuple[Gpu, ...], catalogue: tuple[Gpu, ...],
                replan: Replan) -> tuple[list[Lever], Lever | None]:
    """Every lever not in use, re-planned (`replan`) and ranked (see the module doc). When neither one lever nor
    two fit the smallest card asked about, levers are added, least slowdown first, until the job fits it."""
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    base_s = lever_seconds(est, est.job, smallest, replan)
    candidates = candidate_levers(est.job)
    singles = [_traced(est, [c], gpus, smallest, base_s, replan) for c in candidates]
    asked = {g.name for g in gpus}
    pairs: list[Lever] = []
    if not any(smallest.name in l.fits for l in singles if not l.changes_job):
        pairs = _pairs(est, candidates, singles, gpus, smallest, base_s, replan)
    hardware = hardware_levers(est, smallest, catalogue)
    fitting = sorted((l for l in singles if asked & set(l.fits) and not l.changes_job), key=lambda l: l.slowdown)
    fitting_pairs = sorted((l for l in pairs if asked & set(l.fits)), key=lambda l: l.slowdown)[:2]
    rest = sorted((l for l in singles if l not in fitting and not l.changes_job), key=lambda l: l.peak_bytes)
    levers = fitting + fitting_pairs + hardware + rest + [l for l in singles if l.changes_job]
    combined = None
    if not fitting and not fitting_pairs:
        combined = combine(est, candidates, singles, smallest, base_s, replan)
    return levers, combined


def _traced(est: LmEstimate, chosen: list, gpus: tuple[Gpu, ...], gpu: Gpu, base_s: float,
            replan: Replan) -> Lever:
    """The job with the `chosen` candidate levers applied, re-planned, as one Lever."""
    job = est.job
    for _name, _how, changed, _ in chosen:
        job = _apply(job, changed, est.job)
    slowdown = lever_seconds(est, job, gpu, replan) / max(base_s, 1e-12)  # with FLOPs where they change
    trace = replan(job, count_flops=False)
    fits = tuple(g.name for g in gpus if trace.peak_bytes <= card_budget(g))
    return Lever(" + ".join(c[0] for c in chosen), " ".join(c[1].split(" / ")[0] for c in chosen),
                 trace.peak_bytes, round(slowdown, 3), fits, any(c[3] for c in chosen), levers=len(chosen))


def _pairs(est, candidates, singles, gpus, gpu, base_s, replan: Replan) -> list[Lever]:
    """Two levers together (not two methods), of the PAIRED single levers with the smallest peaks."""
    usable = [c for c, l in sorted(zip(candidates, singles), key=lambda cl: cl[1].peak_bytes) if not c[3]][:PAIRED]
    return [_traced(est, [a, b], gpus, gpu, base_s, replan) for a, b in itertools.combinations(usable, 2)
            if not (a[1].startswith("--method") and b[1].startswith("--method"))]


def combine(est: LmEstimate, candidates, singles, gpu: Gpu, base_s: float, replan: Replan) -> Lever | None:
    """Add levers, least slowdown first (one method), until the job fits `gpu`."""
    chosen = []
    for candidate, single in sorted(zip(candidates, singles), key=lambda cl: (cl[1].slowdown, cl[1].peak_bytes)):
        if candidate[3] or (candidate[1].startswith("--method") and any(c[1].startswith("--method")
                                                                          for c in chosen)):
            continue
        chosen.append(candidate)
        lever = _traced(est, chosen, (gpu,), gpu, base_s, replan)
        if lever.fits:
            return lever
    return None


def hardware_levers(est: LmEstimate, gpu: Gpu, catalogue: tuple[Gpu, ...]) -> list[Lever]:
    """The job unchanged on more hardware, when it does not fit `gpu` alone: FSDP over the fewest of these
    cards that hold it (per-rank memory), and the smallest card of `catalogue` that holds it alone and runs
    its precision (a bf16 job never goes to a card without bf16). Slowdowns: that layout's step time over the
    job's on one `gpu` (as if it fitted), the numbers the layouts print."""
    inputs, options = advice_estimates(est), rules.Options(max_gpus=FSDP_CARDS[-1])
    if rules.plan_card(inputs, gpu, options, 1, "single").fits:
        return []
    alone = layouts(est, (gpu,), 1)[0].step_time_s
    out = []
    for row in layouts(est, (gpu,), FSDP_CARDS[-1]):
        if row.fits and row.strategy == "fsdp":
            out.append(Lever(f"FSDP over {row.cards} x {gpu.name}", fsdp_command(row.cards), row.needed_bytes,
                             round(row.step_time_s / alone, 3), (gpu.name,), hardware=True))
    job = est.job  # bf16 weights, or bf16 asked: never a V100 or a T4
    needs_bf16 = job.dtype == "bf16" or job.method == "qlora" or job.precision_without_bf16 is None
    for card in sorted(catalogue, key=lambda g: (g.memory_bytes, g.name)):
        if card.memory_bytes <= gpu.memory_bytes or (needs_bf16 and not card.bf16):
            continue
        row = layouts(est, (card,), 1)[0]
        if row.fits:
            out.append(Lever(f"a bigger card ({card.name}, {card.memory_gib:g} GiB)", gpu_flag(card.name),
                             row.needed_bytes, round(row.step_time_s / alone, 3), (card.name,), hardware=True))
            break
    return out


def fsdp_command(cards: int) -> str:
    """How to start FSDP over `cards` GPUs: one machine up to NODE_GPUS, else machines of NODE_GPUS each
    (the same command on every machine, rendezvous at the first)."""
    if cards <= NODE_GPUS:
        return f"trainwise train --nproc {cards} ... train.strategy=fsdp"
    return (f"{cards // NODE_GPUS} machines of {NODE_GPUS}: trainwise train --nproc {NODE_GPUS} --nnodes "
            f"{cards // NODE_GPUS} --node-rank I --rdzv-endpoint HOST:PORT ... train.strategy=fsdp")


def _apply(current: LmJob, changed: LmJob, original: LmJob) -> LmJob:
    """`current` with what `changed` changed relative to `original`."""
    delta = {name: getattr(changed, name) for name in ("gradient_checkpointing", "loss_chunk_size", "optimizer",
                                                      "dtype", "method", "seq_len", "trainable_blocks")
             if getattr(changed, name) != getattr(original, name)}
    return current.with_changes(**delta)
