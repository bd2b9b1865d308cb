"""Per-token loss: accumulated micro-batches give one big batch's gradient, whatever their token counts."""
from __future__ import annotations

import pytest
import torch

from tests.text.lm_helpers import split_rows, tiny_gpt, token_batches
from trainwise.data.batch import IGNORE_INDEX
from trainwise.train.step.train_step import TrainStep


def gradients(micro_batches, accumulation):
    model = tiny_gpt()
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=None, precision="fp32",
                     device=torch.device("cpu"))
    loss = step.accumulate(micro_batches)
    return loss, {name: p.grad.clone() for name, p in model.named_parameters()}


def test_accumulation_equals_one_batch_with_unequal_token_counts():
    batch = token_batches(rows=8)
    counts = [int((b["labels"] != IGNORE_INDEX).sum()) for b in split_rows(batch, 2)]
    assert len(set(counts)) == 4  # every micro-batch has another number of label tokens
    loss_big, big = gradients([batch], 1)
    loss_small, small = gradients(split_rows(batch, 2), 4)
    torch.testing.assert_close(loss_small, loss_big)
    for name in big:
        torch.testing.assert_close(small[name], big[name], rtol=1e-5, atol=1e-7)
    # and it is the mean over tokens, not the mean of the micro-batch means
    model = tiny_gpt()
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
    torch.testing.assert_close(loss_big, expected.detach())


def test_labels_of_minus_100_carry_no_gradient():
    batch = token_batches(rows=2)
    _, before = gradients([batch], 1)
    changed = {k: v.clone() for k, v in batch.items()}
    ignored = changed["labels"] == IGNORE_INDEX
    changed["input_ids"][:, -1] = (changed["input_ids"][:, -1] + 1) % 40  # the last position is never a label
    assert ignored[:, -1].all()
    _, after = gradients([changed], 1)
    # the last position's input only feeds its own (ignored) output: every gradient is unchanged
    for name in before:
        torch.testing.assert_close(after[name], before[name])


def _rank_worker(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainwise.train.parallel.distributed import leaving_the_job

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    with leaving_the_job():  # the product's exit: a barrier before the group goes (Gloo aborts otherwise)
        model = tiny_gpt()
        ddp = DistributedDataParallel(model)
        step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=None, precision="fp32",
                         device=torch.device("cpu"), forward=ddp, no_sync=ddp.no_sync)
        mine = split_rows(token_batches(rows=8), 2)[rank::world]  # ranks get different token counts
        outcome = step(mine)
        dist.all_reduce(loss := outcome.loss.clone())
        if rank == 0:
            torch.save({"loss": loss / world, "state": model.state_dict()}, out)


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "out.pt")), nprocs=2, join=True)
    ranks = torch.load(tmp_path / "out.pt")
    model = tiny_gpt()
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=None, precision="fp32",
                     device=torch.device("cpu"))
    outcome = step(split_rows(token_batches(rows=8), 2))
    torch.testing.assert_close(ranks["loss"], outcome.loss)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(ranks["state"][name], value, rtol=1e-5, atol=1e-6)
