"""What a language-model plan tells the user beyond the peak: where the job fits (1..N cards, FSDP, CPU
offload), host RAM including the final save, and the levers that make it fit, ranked by least slowdown.

The levers are re-planned, not guessed: each changed job is traced again (at one sequence per micro-batch, the
least any job runs with), so "LoRA + checkpointing fits a 24 GB card" is a traced statement. A lever the job
already uses is never offered. Slowdowns are the traced FLOPs ratio (checkpointing's recomputation, LoRA's
missing weight gradients), FSDP's scaling efficiency (advise.py; FSDP over N cards and a bigger card of the
catalogue are levers too, the job itself unchanged), and two stated assumptions: QLoRA's
dequantisation (x1.3, as reported by QLoRA/Unsloth users) and CPU offload (x2: every step moves the states
over PCIe).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainwise.plan import advise as rules
from trainwise.plan.catalog import Gpu
from trainwise.plan.llm_plan import LmEstimate, advice_estimates, peak_at_micro_one
from trainwise.plan.llm_step import LmJob

QLORA_SLOWDOWN = 1.3
OFFLOAD_SLOWDOWN = 2.0
LOSS_CHUNK = 1024
FSDP_CARDS = (2, 4, 8, 16, 32, 64)  # FSDP layouts offered as a lever: the fewest that fit
NODE_GPUS = 8  # GPUs in one server: more cards than this are several machines


@dataclass(frozen=True)
class Layout:
    """The job on `cards` x one card model: how it is spread and what each card needs."""

    card: str
    cards: int
    strategy: str  # single | fsdp | fsdp+offload
    needed_bytes: int
    memory_bytes: int
    fits: bool
    micro_batch_size: int
    step_time_s: float


@dataclass(frozen=True)
class Lever:
    name: str  # in the user's words: "gradient checkpointing", "LoRA (rank 16)", ...
    how: str  # the flag or config field that applies it
    peak_bytes: int  # the changed job's peak at one sequence per micro-batch
    slowdown: float  # step time relative to the job as given (1.0 = none)
    fits: tuple[str, ...] = ()  # cards it fits on alone
    changes_job: bool = False  # shorter context: a different job, offered last
    hardware: bool = False  # more cards or a bigger one: the job itself unchanged


@dataclass
class LmAdvice:
    layouts: list[Layout]
    host_ram: dict[str, int]
    levers: list[Lever] = field(default_factory=list)
    combined: Lever | None = None  # when no single lever fits the card asked about


def card_budget(gpu: Gpu) -> float:
    """What a training step may use on one card: less the CUDA context, workspaces and the safety margin."""
    return rules.usable_bytes(gpu.memory_bytes, rules.cuda_fixed_bytes(gpu, False), rules.SAFETY_MARGIN)


def layouts(est: LmEstimate, gpus: tuple[Gpu, ...], max_gpus: int) -> list[Layout]:
    """Per card model: one card, then FSDP over 2, 4, 8 ... and FSDP with CPU offload, until one fits."""
    inputs, options = advice_estimates(est), rules.Options(max_gpus=max_gpus)
    out = []
    for gpu in gpus:
        for cards in [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= max_gpus]:
            row = rules.plan_card(inputs, gpu, options, cards, "single" if cards == 1 else "fsdp")
            out.append(_layout(row, gpu))
            if row.fits:
                break
        else:
            out.append(offloaded(est, inputs, gpu, max_gpus))
    return out


def _layout(row: rules.CardPlan, gpu: Gpu) -> Layout:
    return Layout(gpu.name, row.cards, row.strategy, row.needed_bytes, gpu.memory_bytes, row.fits,
                  row.micro_batch_size, row.step_time_s)


def offloaded(est: LmEstimate, inputs: rules.Estimates, gpu: Gpu, cards: int) -> Layout:
    """FSDP with CPU offload: parameters, gradients and optimizer state live in host RAM; a card holds the
    activations and the units being gathered (two at a time)."""
    on_card = est.curve.peak(1) - inputs.sharded_state_bytes + 2 * inputs.largest_module_parameter_bytes
    needed = int(on_card + rules.cuda_fixed_bytes(gpu, False))
    single = rules.plan_card(inputs, gpu, rules.Options(), 1, "single")
    return Layout(gpu.name, cards, "fsdp+offload", needed, gpu.memory_bytes,
                  on_card <= card_budget(gpu), 1, single.step_time_s * OFFLOAD_SLOWDOWN / cards)


def host_ram(est: LmEstimate) -> dict[str, int]:
    """Host RAM of the run: the process, and the final save (adapters only for LoRA/QLoRA)."""
    job, facts = est.job, est.facts
    adapters = job.method in ("lora", "qlora")
    saved = facts.trainable_bytes if adapters else facts.weight_bytes
    parts = {"process (Python, torch, CUDA libraries)": rules.PROCESS_RAM_BYTES,
             f"final save ({'the adapters' if adapters else 'the whole model'}: state dict on the host + "
             "the safetensors file built in memory)": rules.FINAL_SAVE_COPIES * saved}
    return parts


def offload_ram(est: LmEstimate) -> int:
    """Extra host RAM when FSDP offloads the states to the CPU."""
    return int(advice_estimates(est).sharded_state_bytes)


def candidate_levers(job: LmJob) -> list[tuple[str, str, LmJob, float, bool]]:
    """(name, how, changed job, assumed extra slowdown, changes the job) for each lever not in use."""
    out = []
    if not job.gradient_checkpointing:
        out.append(("gradient checkpointing", "--checkpointing / model.gradient_checkpointing=true",
                    job.with_changes(gradient_checkpointing=True), 1.0, False))
    if not job.loss_chunk_size:
        out.append((f"chunked loss ({LOSS_CHUNK} tokens at a time)", f"--loss-chunk {LOSS_CHUNK} / "
                    f"model.loss_chunk_size={LOSS_CHUNK}", job.with_changes(loss_chunk_size=LOSS_CHUNK), 1.0, False))
    if job.optimizer == "adamw" and job.method in ("full", "freeze"):
        out.append(("8-bit AdamW (bitsandbytes)", "--optimizer adamw8bit", job.with_changes(optimizer="adamw8bit"),
                    1.0, False))
    if job.dtype == "fp32" and job.method in ("full", "freeze"):
        out.append(("pure bf16 weights", "--dtype bf16 / model.dtype=bf16", job.with_changes(dtype="bf16"), 1.0,
                    False))
    if job.method in ("full", "freeze"):
        out.append((f"LoRA (rank {job.lora.rank})", "--method lora / model.method=lora",
                    job.with_changes(method="lora"), 1.0, False))
    if job.method != "qlora":
        out.append(("QLoRA (4-bit base, CUDA + bitsandbytes)", "--method qlora / model.method=qlora",
                    job.with_changes(method="qlora", dtype="bf16"), QLORA_SLOWDOWN, False))
    if job.seq_len >= 512:
        out.append((f"shorter context ({job.seq_len // 2} tokens)", f"--seq-len {job.seq_len // 2}",
                    job.with_changes(seq_len=job.seq_len // 2), 1.0, True))
    return out


def rank_levers(est: LmEstimate, gpus: tuple[Gpu, ...],
                catalogue: tuple[Gpu, ...] = ()) -> tuple[list[Lever], Lever | None]:
    """Every lever not in use, traced, ranked: those that fit a card asked about first, by slowdown; then the
    hardware levers (a bigger card of `catalogue`); then by peak. When none fits the smallest card asked
    about alone, the cheapest levers are combined until the job fits."""
    base = est.traces[0]
    smallest = min(gpus, key=lambda g: g.memory_bytes)
    levers = hardware_levers(est, smallest, catalogue)
    for name, how, changed, extra, changes_job in candidate_levers(est.job):
        # the optimizer and the weights' dtype change no matrix product: no FLOP-counting pass for them
        same_work = changed.with_changes(optimizer=est.job.optimizer, dtype=est.job.dtype) == est.job
        trace = peak_at_micro_one(changed, count_flops=not same_work)
        slowdown = extra * (1.0 if same_work else trace.micro_batch_flops / max(base.micro_batch_flops, 1))
        fits = tuple(g.name for g in gpus if trace.peak_bytes <= card_budget(g))
        levers.append(Lever(name, how, trace.peak_bytes, round(slowdown, 3), fits, changes_job))
    asked = {g.name for g in gpus}
    levers.sort(key=lambda l: (l.changes_job, not asked & set(l.fits), not l.fits,
                               l.slowdown if l.fits else l.peak_bytes))
    combined = None
    on_one_card = [l for l in levers if not (l.changes_job or l.hardware)]
    if not any(smallest.name in l.fits for l in on_one_card):
        combined = combine(est.job, on_one_card, smallest)
    return levers, combined


def hardware_levers(est: LmEstimate, gpu: Gpu, catalogue: tuple[Gpu, ...]) -> list[Lever]:
    """The job unchanged on more hardware, when it does not fit `gpu` alone: FSDP over the fewest of these
    cards that hold it (per-rank memory; slowdown = card-time over one card's, FSDP's scaling efficiency),
    and the smallest card of `catalogue` that holds it alone (no slowdown counted: the job is the same)."""
    inputs, options = advice_estimates(est), rules.Options(max_gpus=FSDP_CARDS[-1])
    alone = rules.plan_card(inputs, gpu, options, 1, "single")
    if alone.fits:
        return []
    out = []
    for cards in FSDP_CARDS:
        row = rules.plan_card(inputs, gpu, options, cards, "fsdp")
        if row.fits:
            slowdown = cards * row.step_time_s / max(alone.step_time_s, 1e-12)
            out.append(Lever(f"FSDP over {cards} x {gpu.name}", fsdp_command(cards), row.needed_bytes,
                             round(slowdown, 3), (gpu.name,), hardware=True))
            break
    for card in sorted(catalogue, key=lambda g: (g.memory_bytes, g.name)):
        row = rules.plan_card(inputs, card, options, 1, "single")
        if card.memory_bytes > gpu.memory_bytes and row.fits:
            out.append(Lever(f"a bigger card ({card.name}, {card.memory_gib:g} GiB)", f"--gpu {card.name}",
                             row.needed_bytes, 1.0, (card.name,), hardware=True))
            break
    return out


def fsdp_command(cards: int) -> str:
    """How to start FSDP over `cards` GPUs: one machine up to NODE_GPUS, else machines of NODE_GPUS each
    (the same command on every machine, rendezvous at the first)."""
    if cards <= NODE_GPUS:
        return f"trainwise train --nproc {cards} ... train.strategy=fsdp"
    return (f"{cards // NODE_GPUS} machines of {NODE_GPUS}: trainwise train --nproc {NODE_GPUS} --nnodes "
            f"{cards // NODE_GPUS} --node-rank I --rdzv-endpoint HOST:PORT ... train.strategy=fsdp")


def combine(job: LmJob, levers: list[Lever], gpu: Gpu) -> Lever | None:
    """Add levers, least slowdown first (LoRA and QLoRA exclusive), until the job fits `gpu`."""
    changes = {name: changed for name, _how, changed, _extra, _ in candidate_levers(job)}
    current, names, hows = job, [], []
    for lever in sorted(levers, key=lambda l: (l.slowdown, l.peak_bytes)):
        if lever.name.startswith("QLoRA") and current.method == "lora":
            continue
        current = _apply(current, changes[lever.name], job)
        names.append(lever.name)
        hows.append(lever.how.split(" / ")[0])
        trace = peak_at_micro_one(current)
        if trace.peak_bytes <= card_budget(gpu):
            return Lever(" + ".join(names), " ".join(hows), trace.peak_bytes, lever.slowdown, (gpu.name,))
    return None


def _apply(current: LmJob, changed: LmJob, original: LmJob) -> LmJob:
    """`current` with what `changed` changed relative to `original`."""
    delta = {name: getattr(changed, name) for name in ("gradient_checkpointing", "loss_chunk_size", "optimizer",
                                                      "dtype", "method", "seq_len")
             if getattr(changed, name) != getattr(original, name)}
    if delta.get("method") == "lora" and current.method == "qlora":
        delta.pop("method")
    return current.with_changes(**delta)
