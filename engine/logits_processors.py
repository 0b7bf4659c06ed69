"""Batched logits processors run before the bitmask: repetition / presence / frequency penalties,
logit_bias and min_tokens bans. Each touches only the rows that use it, in one batched op."""

from __future__ import annotations

import torch

from engine.sequence import Sequence

_MIN_REPETITION_PENALTY = 1e-6


def _flat_token_ids(seqs: list[Sequence], rows: list[int], output_only: bool,
                    vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row position in `rows`, token id) pairs of every token of those sequences, int64 [num_pairs] each.

    `output_only`: only generated tokens, else prompt + output. Ids >= vocab_size are dropped.
    """
    token_lists = [seqs[i].output_token_ids if output_only else seqs[i].token_ids for i in rows]
    lengths = torch.tensor([len(t) for t in token_lists], dtype=torch.long)
    ids = torch.tensor([t for tokens in token_lists for t in tokens], dtype=torch.long)
    positions = torch.repeat_interleave(torch.arange(len(rows)), lengths)
    in_vocab = ids < vocab_size
    return positions[in_vocab], ids[in_vocab]


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence], vocab_size: int) -> None:
    """Repetition penalty over prompt + output tokens (CTRL, Keskar et al. 2019: positive logits
    divided, negative multiplied), then presence and frequency penalties over output tokens (the
    OpenAI definition: logit -= frequency * count + presence * (count > 0)); in place.

    logits: float32 [num_rows, vocab_size]; seqs: one per row. Rows without penalties are untouched.
    """
    rep_rows = [i for i, s in enumerate(seqs) if s.sampling_params.repetition_penalty != 1.0]
    if rep_rows:
        positions, ids = _flat_token_ids(seqs, rep_rows, output_only=False, vocab_size=vocab_size)
        seen = torch.zeros(len(rep_rows), vocab_size, dtype=torch.bool)
        seen[positions, ids] = True
        # clamped: a factor that is 0 or inf in float32 would make inf / NaN logits, while beyond
        # 1e6 either way the seen tokens are already forced or banned
        penalty = torch.tensor([min(max(seqs[i].sampling_params.repetition_penalty, _MIN_REPETITION_PENALTY),
                                    1 / _MIN_REPETITION_PENALTY) for i in rep_rows], dtype=logits.dtype).unsqueeze(1)
        index = torch.tensor(rep_rows)
        vals = logits.index_select(0, index)
        penalised = torch.where(vals > 0, vals / penalty, vals * penalty)
        logits.index_copy_(0, index, torch.where(seen, penalised, vals))
    count_rows = [i for i, s in enumerate(seqs)
                  if (s.sampling_params.presence_penalty or s.sampling_params.frequency_penalty)
                  and s.num_output_tokens]
    if count_rows:
        positions, ids = _flat_token_ids(seqs, count_rows, output_only=True, vocab_size=vocab_size)
        counts = torch.bincount(positions * vocab_size + ids, minlength=len(count_rows) * vocab_size)
        counts = counts.view(len(count_rows), vocab_size).to(logits.dtype)
        params = [seqs[i].sampling_params for i in count_rows]
        frequency = torch.tensor([p.frequency_penalty for p in params], dtype=logits.dtype).unsqueeze(1)
        presence = torch.tensor([p.presence_penalty for p in params], dtype=logits.dtype).unsqueeze(1)
        index = torch.tensor(count_rows)
        logits.index_copy_(0, index, logits.index_select(0, index) - (frequency * counts + presence * (counts > 0)))


def apply_bias_and_bans(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: tuple[int, ...],
                        vocab_size: int) -> None:
    """Add each row's logit_bias, then set EOS and stop_token_ids to -inf in rows that have not
    yet produced min_tokens tokens; in place, one indexed op each.

    logits: float32 [num_rows, vocab_size]; seqs: one per row. Ids >= vocab_size are not banned
    (logit_bias ids are validated < vocab_size at admission).
    """
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    for i, seq in enumerate(seqs):
        p = seq.sampling_params
        if p.logit_bias:
            bias_rows += [i] * len(p.logit_bias)
            bias_ids += p.logit_bias.keys()
            bias_values += p.logit_bias.values()
        if seq.num_output_tokens < p.min_tokens:
            banned = [t for t in (*eos_token_ids, *p.stop_token_ids) if t < vocab_size]
            ban_rows += [i] * len(banned)
            ban_ids += banned
    if bias_rows:
        logits.index_put_((torch.tensor(bias_rows), torch.tensor(bias_ids)),
                          torch.tensor(bias_values, dtype=logits.dtype), accumulate=True)
    if ban_rows:
        logits[torch.tensor(ban_rows), torch.tensor(ban_ids)] = float("-inf")
