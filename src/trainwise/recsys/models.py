"""Recommenders over behaviour sequences: SASRec, GRU4Rec, a popularity baseline (next-item models) and DIN
(a click model). Plain nn.Modules; inputs are item ids + 1 with 0 as padding (recsys/sequences.py).

Every model also has `score_items(history, items) -> [users, items]`, the scores evaluation ranks
(recsys/ranking.py): the whole catalogue, a chunk at a time, without building a click sample per pair.

Next-item models return, in training mode, logits for the next item at *every* position, shaped
[batch, items, positions] as cross-entropy takes them with targets [batch, positions] (-100 = padding);
in eval mode, logits after the last position only, [batch, items]. With `loss="sampled"` their training
outputs are the states [batch, positions, hidden] and `training_loss` scores them (recsys/sampled.py).
DIN returns two logits [0, s] per (history, candidate): softmax cross-entropy over them is the logistic
loss of s, so the trainer's default loss trains a click model.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from trainwise.data.bundle import DataSpec
from trainwise.recsys.sampled import NegativeSampler, Sampling, sampled_softmax_loss

def split_behaviour(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(item ids + 1, behaviour codes + 1 or None): inputs are [batch, L], or [batch, 2, L] when the log's
    behaviour types (view, cart, buy) come along (recsys/sequences.py)."""
    if inputs.dim() == 3:
        return inputs[:, 0], inputs[:, 1]
    return inputs, None


class BehaviourEmbedding(nn.Module):
    """One learned vector per behaviour type, added to the item embedding of each history event (0 is
    padding and the unknown behaviour of a candidate)."""

    def __init__(self, behaviours: int, hidden: int):
        super().__init__()
        self.table = nn.Embedding(behaviours + 1, hidden, padding_idx=0)
        nn.init.normal_(self.table.weight, std=hidden ** -0.5)
        with torch.no_grad():
            self.table.weight[0].zero_()

    def forward(self, behaviour: torch.Tensor | None) -> torch.Tensor | float:
        return 0.0 if behaviour is None else self.table(behaviour)


PAIR_BUDGET = 2**25  # DIN scoring: (users x history x hidden x items) activations per block, 128 MB
DIN_USERS_PER_BLOCK = 64


class CausalSelfAttentionBlock(nn.Module):
    """Pre-norm self-attention + point-wise feed-forward; position t attends to positions <= t only."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.attention_norm, self.feed_forward_norm = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.feed_forward = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(dropout),
                                          nn.Linear(hidden, hidden))
        self.residual_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                                  dropout_p=self.dropout if self.training else 0.0)
        x = x + self.residual_dropout(self.out(attended.transpose(1, 2).reshape(batch, length, hidden)))
        return x + self.residual_dropout(self.feed_forward(self.feed_forward_norm(x)))


class NextItemModel(nn.Module):
    """Shared by the next-item models: item embeddings (tied with the output layer), the output shape and
    the training loss.

    `loss="full"`: training outputs are logits over the whole catalogue and the trainer's cross-entropy is
    the loss. `loss="sampled"`: training outputs are the states [batch, positions, hidden] and
    `training_loss` (which train/step/train_step.py uses when a model has one) is a sampled softmax against
    `num_sampled` negatives per batch (recsys/sampled.py), never building [batch, positions, items].
    `sparse_embeddings`: the item table's gradient holds only the rows a batch looked up, and the optimizer
    gives it to SparseAdam (train/step/optim.py); it needs the sampled loss, since the full one touches every row.
    """

    def __init__(self, num_items: int, hidden: int, behaviours: int = 0, loss: str = "full",
                 num_sampled: int = 1000, sampling: Sampling = "uniform", item_counts: Sequence[int] = (),
                 sparse_embeddings: bool = False):
        super().__init__()
        if loss not in ("full", "sampled"):
            raise ValueError(f"model.args.loss={loss!r}: use full (softmax over every item) or sampled")
        if sparse_embeddings and loss != "sampled":
            raise ValueError("model.args.sparse_embeddings=true needs model.args.loss=sampled: the full softmax "
                             "scores every item, so every row of the item table gets a gradient each step")
        self.num_items = num_items
        self.item_embedding = nn.Embedding(num_items + 1, hidden, padding_idx=0, sparse=sparse_embeddings)
        nn.init.normal_(self.item_embedding.weight, std=hidden ** -0.5)
        self.behaviour_embedding = BehaviourEmbedding(behaviours, hidden) if behaviours else None
        self.negatives = NegativeSampler(num_items, num_sampled, sampling, item_counts) \
            if loss == "sampled" else None

    def embed(self, history: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(event embeddings [batch, L, hidden]: item (times `scale`) + behaviour type, the item ids + 1)."""
        items, behaviour = split_behaviour(history)
        x = self.item_embedding(items) * scale
        if self.behaviour_embedding is not None:
            x = x + self.behaviour_embedding(behaviour)
        return x, items

    def encode(self, history: torch.Tensor) -> torch.Tensor:
        """[batch, positions, hidden]: the state after each position, seeing that position and earlier ones."""
        raise NotImplementedError

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        states = self.encode(history)
        if self.training and self.negatives is not None:
            return states  # scored by training_loss against sampled items
        items = self.item_embedding.weight[1:]
        if self.training:
            return (states @ items.T).transpose(1, 2)
        return states[:, -1] @ items.T

    @property
    def training_loss(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """The loss of training outputs when the model brings its own (the sampled softmax), else None."""
        return self._sampled_loss if self.negatives is not None else None

    def _sampled_loss(self, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        assert self.negatives is not None
        return sampled_softmax_loss(states, targets, self.item_embedding.weight, self.negatives.draw(states.device),
                                    self.negatives.log_q, sparse=self.item_embedding.sparse)

    @torch.no_grad()
    def score_items(self, history: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.encode(history)[:, -1] @ self.item_embedding.weight[items + 1].T


class SASRec(NextItemModel):
    """Self-attentive sequential recommendation (Kang & McAuley, 2018): causal self-attention over the
    history with learned positions; the state at each position scores the next item against every item."""

    def __init__(self, num_items: int, max_len: int, hidden: int = 64, layers: int = 2, heads: int = 1,
                 dropout: float = 0.2, behaviours: int = 0, **loss):
        super().__init__(num_items, hidden, behaviours, **loss)
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.position_embedding = nn.Embedding(max_len, hidden)
        self.input_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(CausalSelfAttentionBlock(hidden, heads, dropout) for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden)

    def encode(self, history: torch.Tensor) -> torch.Tensor:
        x, items = self.embed(history, math.sqrt(self.item_embedding.embedding_dim))
        length, valid = items.shape[1], items > 0
        x = self.input_dropout(x + self.position_embedding.weight[-length:]) * valid.unsqueeze(-1)
        # causal, and padding is never a key; each position may see itself, so no row is all-masked (a
        # padded query would otherwise softmax over nothing and turn NaN, which backward spreads)
        causal = torch.ones(length, length, dtype=torch.bool, device=history.device).tril()
        allowed = (causal & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=history.device)
        allowed = allowed.unsqueeze(1)  # one mask for every head
        for block in self.blocks:
            x = block(x, allowed)
        return self.final_norm(x)


    @torch.no_grad()
    def attention_weights(self, history: torch.Tensor) -> torch.Tensor:
        """[users, positions]: how much the last position (the one that scores the next item) attends to
        each history event in the last block, averaged over heads (0 on padding)."""
        x, items = self.embed(history, math.sqrt(self.item_embedding.embedding_dim))
        length, valid = items.shape[1], items > 0
        x = (x + self.position_embedding.weight[-length:]) * valid.unsqueeze(-1)
        causal = torch.ones(length, length, dtype=torch.bool, device=history.device).tril()
        allowed = ((causal & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=history.device))
        for block in self.blocks[:-1]:
            x = block(x, allowed.unsqueeze(1))
        last = self.blocks[-1]
        batch = x.shape[0]
        q, k, _ = last.qkv(last.attention_norm(x)).view(batch, length, 3, last.heads, -1).permute(2, 0, 3, 1, 4)
        logits = (q[:, :, -1:] @ k.transpose(-1, -2)).squeeze(2) / math.sqrt(q.shape[-1])  # [B, heads, L]
        logits = logits.masked_fill(~allowed[:, -1][:, None, :], -torch.inf)
        return logits.softmax(-1).mean(1) * valid


class GRU4Rec(NextItemModel):
    """Session-based recommendation with a GRU (Hidasi et al., 2016): the recurrent state after each item
    scores the next one. Causal by construction."""

    def __init__(self, num_items: int, hidden: int = 64, layers: int = 1, dropout: float = 0.2,
                 behaviours: int = 0, **loss):
        super().__init__(num_items, hidden, behaviours, **loss)
        self.input_dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(hidden, hidden, num_layers=layers, batch_first=True,
                          dropout=dropout if layers > 1 else 0.0)

    def encode(self, history: torch.Tensor) -> torch.Tensor:
        states, _ = self.gru(self.input_dropout(self.embed(history)[0]))
        return states


class Popularity(nn.Module):
    """The baseline every recommender must beat: one score per item, whatever the history. Trained with the
    next-item softmax it would learn the log-frequency of each item, so it is counted instead: built from
    the training counts, it scores log(1 + count) and trains no step (`counted`: the Trainer runs none)."""

    def __init__(self, num_items: int, item_counts: Sequence[int] = ()):
        super().__init__()
        self.num_items = num_items
        counts = torch.as_tensor(list(item_counts), dtype=torch.float32) if len(item_counts) == num_items else None
        self.counted = counts is not None
        self.item_bias = nn.Parameter(torch.log1p(counts) if counts is not None else torch.zeros(num_items))

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.item_bias.view(1, -1, 1).expand(len(history), -1, history.shape[-1])
        return self.item_bias.expand(len(history), -1)

    @torch.no_grad()
    def score_items(self, history: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.item_bias[items].expand(len(history), -1)


class DIN(nn.Module):
    """Deep Interest Network (Zhou et al., 2018): the candidate item decides which past behaviours matter.

    Each history item h gets the weight a(h, c) of a small MLP over [h, c, h - c, h * c]; padding gets 0;
    the weights are not softmax-normalised (how much of the history is relevant is itself a signal). The
    weighted sum is the user's interest in this candidate; an MLP over [interest, c, interest * c] plus an
    item bias gives the click logit. `attention=False` averages the history instead: the baseline that
    shows what the attention is worth.
    """

    def __init__(self, num_items: int, hidden: int = 32, attention_hidden: int = 36,
                 mlp: tuple[int, ...] = (80, 40), attention: bool = True, dropout: float = 0.0,
                 behaviours: int = 0):
        super().__init__()
        self.num_items, self.attention = num_items, attention
        self.item_embedding = nn.Embedding(num_items + 1, hidden, padding_idx=0)
        self.behaviour_embedding = BehaviourEmbedding(behaviours, hidden) if behaviours else None
        self.item_bias = nn.Embedding(num_items + 1, 1, padding_idx=0)
        nn.init.normal_(self.item_embedding.weight, std=hidden ** -0.5)
        nn.init.zeros_(self.item_bias.weight)
        self.attention_in = nn.Linear(4 * hidden, attention_hidden)
        self.attention_act = nn.PReLU()
        self.attention_out = nn.Linear(attention_hidden, 1)
        layers: list[nn.Module] = []
        width = 3 * hidden
        for size in mlp:
            layers += [nn.Linear(width, size), nn.PReLU(), nn.Dropout(dropout)]
            width = size
        self.head = nn.Sequential(*layers, nn.Linear(width, 1))

    def embed_history(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(history event embeddings: item + behaviour type, the item ids + 1)."""
        items, behaviour = split_behaviour(history)
        h = self.item_embedding(items)
        if self.behaviour_embedding is not None:
            h = h + self.behaviour_embedding(behaviour)
        return h, items

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        history, candidate = inputs[..., :-1], split_behaviour(inputs)[0][:, -1]
        (h, history), c = self.embed_history(history), self.item_embedding(candidate)
        if self.attention:
            pairs = torch.cat([h, c[:, None].expand_as(h), h - c[:, None], h * c[:, None]], dim=-1)
            weights = self.attention_out(self.attention_act(self.attention_in(pairs))).squeeze(-1)
            interest = ((weights * (history > 0)).unsqueeze(-1) * h).sum(1)
        else:
            interest = self._mean(h, history)
        logit = self.head(torch.cat([interest, c, interest * c], -1)).squeeze(-1) + self.item_bias(candidate)[:, 0]
        return torch.stack([torch.zeros_like(logit), logit], dim=-1)

    def attention_weights(self, history: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        """[users, positions] weight of each history item for each user's candidate (0 on padding)."""
        (h, history), c = self.embed_history(history), self.item_embedding(candidate)
        pairs = torch.cat([h, c[:, None].expand_as(h), h - c[:, None], h * c[:, None]], dim=-1)
        return self.attention_out(self.attention_act(self.attention_in(pairs))).squeeze(-1) * (history > 0)

    @torch.no_grad()
    def score_items(self, history: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        # blocks of users x items whose (user, position, item, hidden) activations fit PAIR_BUDGET: big
        # enough for matrix multiplies to pay, small enough for any machine
        users = DIN_USERS_PER_BLOCK
        per_item = users * history.shape[-1] * self.attention_in.out_features
        chunk = max(1, PAIR_BUDGET // per_item)
        return torch.cat([torch.cat([self._score_chunk(history[u:u + users], items[i:i + chunk])
                                     for i in range(0, len(items), chunk)], 1)
                          for u in range(0, len(history), users)], 0)

    def _score_chunk(self, history: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        (h, history), c = self.embed_history(history), self.item_embedding(items + 1)  # [B, L, d], [C, d]
        if self.attention:
            # the first attention layer is linear in [h, c, h - c, h * c]: split its weight so that every
            # (user, position, item) triple costs one multiply-add per hidden unit instead of a concatenation
            w_h, w_c, w_diff, w_prod = self.attention_in.weight.chunk(4, dim=1)  # [H, d] each
            from_h = h @ (w_h + w_diff).T                                          # [B, L, H]
            from_c = c @ (w_c - w_diff).T + self.attention_in.bias                 # [C, H]
            b, length, d = h.shape
            scaled = (h[:, :, None, :] * w_prod).reshape(-1, d)                     # [B*L*H, d]
            pre = (scaled @ c.T).view(b, length, -1, len(items))                   # [B, L, H, C]
            # in place, in this layout: the [B, L, H, C] block is the whole cost, so it is written once
            pre.add_(from_h[..., None]).add_(from_c.T)
            F.leaky_relu_(pre, float(self.attention_act.weight))  # PReLU with its one learned slope
            weights = torch.einsum("blhc,h->blc", pre, self.attention_out.weight[0]) + self.attention_out.bias
            weights = weights * (history > 0)[..., None]
            interest = torch.einsum("blc,bld->bcd", weights, h)                    # [B, C, d]
        else:
            interest = self._mean(h, history)[:, None].expand(-1, len(items), -1)
        c = c[None].expand(len(history), -1, -1)
        logit = self.head(torch.cat([interest, c, interest * c], -1)).squeeze(-1)
        return logit + self.item_bias(items + 1)[:, 0]

    @staticmethod
    def _mean(h: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        valid = (history > 0).unsqueeze(-1).to(h.dtype)
        return (h * valid).sum(1) / valid.sum(1).clamp_min(1.0)


def _behaviours(data_spec: DataSpec) -> int:
    return getattr(data_spec, "num_behaviours", 0)


def _spec_items(data_spec: DataSpec, objective: str, model: str) -> tuple[int, int]:
    num_items = getattr(data_spec, "num_items", 0)
    if not num_items:
        raise ValueError(f"the {model} model needs behaviour sequences; use data.name=shop")
    if getattr(data_spec, "objective", None) != objective:
        raise ValueError(f"the {model} model trains on data.args.objective={objective}, the data gives "
                         f"{getattr(data_spec, 'objective', None)}; set data.args.objective={objective}")
    return num_items, getattr(data_spec, "max_len")


def _loss_args(data_spec: DataSpec, loss: str, num_sampled: int, sampling: str, sparse_embeddings: bool) -> dict:
    """The next-item loss options (see NextItemModel), with the training counts popularity sampling needs."""
    return {"loss": loss, "num_sampled": num_sampled, "sampling": sampling, "sparse_embeddings": sparse_embeddings,
            "item_counts": getattr(data_spec, "item_counts", ()) if sampling == "popularity" else ()}


def sasrec(data_spec: DataSpec, hidden: int = 64, layers: int = 2, heads: int = 1, dropout: float = 0.2,
           loss: str = "full", num_sampled: int = 1000, sampling: str = "uniform", sparse_embeddings: bool = False,
           gradient_checkpointing: bool = False) -> SASRec:
    num_items, max_len = _spec_items(data_spec, "next_item", "sasrec")
    return SASRec(num_items, max_len, hidden=hidden, layers=layers, heads=heads, dropout=dropout,
                  behaviours=_behaviours(data_spec),
                  **_loss_args(data_spec, loss, num_sampled, sampling, sparse_embeddings))


def gru4rec(data_spec: DataSpec, hidden: int = 64, layers: int = 1, dropout: float = 0.2, loss: str = "full",
            num_sampled: int = 1000, sampling: str = "uniform", sparse_embeddings: bool = False,
            gradient_checkpointing: bool = False) -> GRU4Rec:
    num_items, _ = _spec_items(data_spec, "next_item", "gru4rec")
    return GRU4Rec(num_items, hidden=hidden, layers=layers, dropout=dropout, behaviours=_behaviours(data_spec),
                   **_loss_args(data_spec, loss, num_sampled, sampling, sparse_embeddings))


def popularity(data_spec: DataSpec, gradient_checkpointing: bool = False) -> Popularity:
    num_items, _ = _spec_items(data_spec, "next_item", "popularity")
    return Popularity(num_items, getattr(data_spec, "item_counts", ()))


def din(data_spec: DataSpec, hidden: int = 32, attention_hidden: int = 36, mlp: tuple[int, ...] = (80, 40),
        attention: bool = True, dropout: float = 0.0, gradient_checkpointing: bool = False) -> DIN:
    num_items, _ = _spec_items(data_spec, "ctr", "din")
    return DIN(num_items, hidden=hidden, attention_hidden=attention_hidden, mlp=tuple(mlp), attention=attention,
               dropout=dropout, behaviours=_behaviours(data_spec))
