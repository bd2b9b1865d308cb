"""Embedding tables with sparse gradients go to SparseAdam, the rest to the configured (fused) optimizer, as
one optimizer the Trainer's schedule, checkpoint and step drive like any other."""
import pytest
import torch
from torch import nn

from trainwise.config import OptimConfig
from trainwise.train.step.optim import SplitOptimizer, build_optimizer
from trainwise.train.step.train_step import dense_gradient_parameters, supports_device_skip


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(50, 8, sparse=True), nn.Linear(8, 3))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, steps: range) -> None:
    for step in steps:
        ids = torch.tensor([step % 50, (7 * step) % 50, 3])
        model(ids).square().sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def test_sparse_tables_get_sparse_adam_and_the_rest_the_configured_optimizer():
    model = _model()
    optimizer = build_optimizer(model, OptimConfig(name="adamw", lr=0.01, weight_decay=0.1))
    assert isinstance(optimizer, SplitOptimizer) and isinstance(optimizer.sparse, torch.optim.SparseAdam)
    assert isinstance(optimizer.dense, torch.optim.AdamW)
    assert [p for g in optimizer.sparse.param_groups for p in g["params"]] == [model[0].weight]
    dense = {id(p) for g in optimizer.dense.param_groups for p in g["params"]}
    assert dense == {id(model[1].weight), id(model[1].bias)}
    assert not supports_device_skip(optimizer)  # SparseAdam has no found_inf: the step asks the host
    assert dense_gradient_parameters(list(model.parameters()), model) == [model[1].weight, model[1].bias]
    before = model[0].weight.detach().clone()
    model(torch.tensor([4])).sum().backward()
    assert model[0].weight.grad.is_sparse
    optimizer.step()
    changed = (model[0].weight != before).any(1).nonzero().flatten().tolist()
    assert changed == [4]  # only the looked-up row moved (no decay touching every row)
    # the planner's count: SparseAdam's dense moments, like Adam's
    moments = sum(v.numel() for s in optimizer.state.values() for k, v in s.items() if k.startswith("exp_avg"))
    assert moments == 2 * sum(p.numel() for p in model.parameters())


def test_a_dense_model_keeps_its_single_optimizer():
    model = nn.Linear(4, 2)
    assert isinstance(build_optimizer(model, OptimConfig(name="adamw", lr=0.01)), torch.optim.AdamW)


def test_state_dict_round_trip_continues_exactly_and_the_schedule_reaches_both_parts():
    config = OptimConfig(name="adamw", lr=0.05)
    straight = _model()
    optimizer = build_optimizer(straight, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    _train(straight, optimizer, scheduler, range(10))

    resumed = _model()
    first = build_optimizer(resumed, config)
    first_scheduler = torch.optim.lr_scheduler.LambdaLR(first, lambda s: 1.0 / (1 + s))
    _train(resumed, first, first_scheduler, range(4))
    saved = (first.state_dict(), first_scheduler.state_dict(), {k: v.clone() for k, v in resumed.state_dict().items()})
    resumed = _model()
    resumed.load_state_dict(saved[2])
    second = build_optimizer(resumed, config)
    second_scheduler = torch.optim.lr_scheduler.LambdaLR(second, lambda s: 1.0 / (1 + s))
    second.load_state_dict(saved[0])
    second_scheduler.load_state_dict(saved[1])
    _train(resumed, second, second_scheduler, range(4, 10))
    assert second.sparse.param_groups[0]["lr"] == second.dense.param_groups[0]["lr"] == 0.05 / 11
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sparse_embeddings_are_refused_across_ranks_before_any_collective(strategy):
    from trainwise.errors import ConfigError
    from trainwise.train.parallel.distributed import wrap_model

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))
    with pytest.raises(ConfigError, match="sparse_embeddings=false"):
        wrap_model(model, strategy, device=torch.device("cpu"), precision="fp32", cpu_offload=False)
