"""Batched sampler: penalties, logit bias, grammar bitmask, temperature, top-k/top-p/min-p, seeds."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.inverse_cdf import inverse_cdf
from engine.logits_processors import apply_bias_and_bans, apply_penalties
from engine.request import TokenLogprob
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.top_k_top_p import top_k_top_p_candidates
from kernels.apply_bitmask import apply_bitmask


@dataclass(slots=True)
class SamplerOutput:
    """Sampled token id per row, and its logprob entry when the row asked for logprobs."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


@dataclass(slots=True)
class _DrawGroup:
    """Rows drawn together: positions among the non-greedy rows, their probabilities (filtered
    tokens 0) float32 [n, K], and the token id of each column (None: column = token id)."""

    rows: list[int]
    probs: torch.Tensor
    token_ids: torch.Tensor | None


class Sampler:
    """Turns the logits of one step into one token per sequence, all rows in one batch.

    Order per row (vLLM / OpenAI semantics): repetition penalty (prompt + output tokens),
    presence and frequency penalties (output tokens), logit_bias, min_tokens (EOS and stop ids
    banned), grammar bitmask; logprobs are taken here (after masking, before temperature); then
    temperature, top-k, top-p (engine/top_k_top_p.py: topk candidates, full sort only where they
    do not hold the nucleus), min-p, and the draw. Rows without a seed share one draw of uniform
    numbers from the engine's generator (inverse CDF over the kept tokens); a seeded row draws an
    exponential race (argmax p / E, E ~ Exp(1) over the whole vocabulary) from its own generator,
    exactly as before the candidate path, so its tokens depend only on its seed and logits.
    """

    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...], seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence], bitmask: torch.Tensor | None = None) -> SamplerOutput:
        """Sample one token for each row.

        logits: float32 [num_rows, vocab_size] (modified in place); seqs: one per row.
        bitmask: int32 [num_rows, ceil(vocab_size / 32)] or None (unconstrained); rows that are
        all ones are skipped.
        """
        apply_penalties(logits, seqs, self.vocab_size)
        apply_bias_and_bans(logits, seqs, self.eos_token_ids, self.vocab_size)
        if bitmask is not None:
            _apply_constrained_rows(logits, bitmask)
        want_logprobs = [i for i, s in enumerate(seqs) if s.sampling_params.logprobs is not None]
        logprobs_rows = torch.log_softmax(logits[want_logprobs], dim=-1) if want_logprobs else None
        token_ids = self._draw(logits, seqs)
        entries: list[TokenLogprob | None] = [None] * len(seqs)
        if logprobs_rows is not None:
            for i, entry in zip(want_logprobs, _logprob_entries(logprobs_rows, [token_ids[i] for i in want_logprobs],
                                                                 [seqs[i].sampling_params.logprobs or 0
                                                                  for i in want_logprobs])):
                entries[i] = entry
        return SamplerOutput(token_ids, entries)

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """One token id per row: argmax for greedy rows, a draw from the filtered distribution otherwise."""
        rows = [i for i, s in enumerate(seqs) if not s.sampling_params.greedy]
        greedy = [i for i, s in enumerate(seqs) if s.sampling_params.greedy]
        result = [0] * len(seqs)
        if greedy:
            picked = blocked_argmax(logits if len(greedy) == len(seqs) else logits[greedy])
            for i, token_id in zip(greedy, picked.tolist()):
                result[i] = token_id
        if not rows:
            return result
        params = [seqs[i].sampling_params for i in rows]
        sub = logits if len(rows) == len(seqs) else logits[rows]     # logits are ours to modify
        sub.div_(torch.tensor([p.temperature for p in params], dtype=sub.dtype).unsqueeze(1))
        generators = [seqs[i].generator for i in rows]
        uniforms = iter(torch.rand(sum(g is None for g in generators), generator=self.generator,
                                   dtype=torch.float64).tolist())
        row_uniforms = [next(uniforms) if g is None else None for g in generators]
        for group in _draw_groups(sub, params):
            drawn = _draw_group(group, sub.shape[1], [p.min_p for p in params], generators, row_uniforms)
            for j, token_id in zip(group.rows, drawn):
                result[rows[j]] = token_id
        return result


_MIN_BLOCKED_ARGMAX_ROWS = 8


def blocked_argmax(logits: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """`logits.argmax(dim=-1)` (int64 [num_rows], the first index of the maximum; NaN counts as the
    maximum, as in torch.argmax) for float [num_rows, vocab_size] CPU logits, in one vectorised
    `amax` over blocks of `block` columns and an argmax inside each row's first best block: torch's
    CPU argmax over a 49,152-wide row costs ~40 us a row (32 rows: 11 ms vs 0.5 ms, 1 thread).
    Below 8 rows torch.argmax itself is used: in the engine step the blocked version's eight ops
    cost ~0.3 ms against ~0.1 ms for one row's argmax."""
    num_rows, vocab_size = logits.shape
    num_full = vocab_size // block
    if num_full < 2 or num_rows < _MIN_BLOCKED_ARGMAX_ROWS:
        return logits.argmax(dim=-1)
    maxima = logits[:, :num_full * block].unflatten(1, (num_full, block)).amax(dim=-1)      # [num_rows, num_full]
    if vocab_size > num_full * block:
        maxima = torch.cat([maxima, logits[:, num_full * block:].amax(dim=-1, keepdim=True)], dim=1)
    best = maxima.argmax(dim=-1)
    starts = best * block
    window = torch.arange(block).unsqueeze(0) + starts.unsqueeze(1)
    inside = window < vocab_size
    values = logits.gather(1, window.clamp_max(vocab_size - 1)).masked_fill(~inside, float("-inf"))
    return starts + values.argmax(dim=-1)


def _apply_constrained_rows(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Apply `bitmask` to the rows it constrains; all-ones rows (requests without a grammar) are
    skipped when the bitmask covers the whole vocabulary."""
    if bitmask.shape[1] * 32 < logits.shape[1]:
        apply_bitmask(logits, bitmask)
        return
    constrained = (bitmask != -1).any(dim=1).nonzero().squeeze(1)
    if constrained.numel() == logits.shape[0]:
        apply_bitmask(logits, bitmask)
    elif constrained.numel():
        apply_bitmask(logits, bitmask, constrained)


def _draw_groups(sub: torch.Tensor, params: list[SamplingParams]) -> list[_DrawGroup]:
    """Split the temperature-scaled rows `sub` (float32 [n, vocab]) into groups of kept tokens:
    one per top-k/top-p tier, and one (whole vocabulary, vocabulary order) for rows without
    either filter."""
    vocab_size = sub.shape[1]
    truncated = [j for j, p in enumerate(params) if 0 < p.top_k < vocab_size or p.top_p < 1.0]
    plain = [j for j, p in enumerate(params) if not (0 < p.top_k < vocab_size or p.top_p < 1.0)]
    groups: list[_DrawGroup] = []
    if truncated:
        candidates = top_k_top_p_candidates(sub[truncated] if len(truncated) < len(params) else sub,
                                            [params[j].top_k for j in truncated], [params[j].top_p for j in truncated])
        for cand in candidates:
            groups.append(_DrawGroup([truncated[r] for r in cand.rows.tolist()], torch.softmax(cand.logits, dim=-1),
                                     cand.token_ids))
    if plain:
        groups.append(_DrawGroup(plain, torch.softmax(sub[plain] if len(plain) < len(params) else sub, dim=-1), None))
    return groups


def _draw_group(group: _DrawGroup, vocab_size: int, min_ps: list[float], generators: list[torch.Generator | None],
                row_uniforms: list[float | None]) -> list[int]:
    """Apply min-p (tokens below min_p x the row's top probability get 0) and draw one token per
    row of `group`: inverse CDF with the row's uniform, or the exponential race from its generator
    (noise over all `vocab_size` tokens, as the full-vocabulary race drew it, read at the kept ones)."""
    probs = group.probs
    group_min_ps = [min_ps[j] for j in group.rows]
    if any(group_min_ps):
        threshold = probs.amax(dim=-1, keepdim=True) * torch.tensor(group_min_ps, dtype=probs.dtype).unsqueeze(1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    positions = [0] * len(group.rows)
    unseeded = [r for r, j in enumerate(group.rows) if generators[j] is None]
    if unseeded:
        uniforms = torch.tensor([row_uniforms[group.rows[r]] for r in unseeded], dtype=torch.float64)
        drawn = inverse_cdf(probs[unseeded] if len(unseeded) < len(group.rows) else probs, uniforms)
        for r, pos in zip(unseeded, drawn.tolist()):
            positions[r] = pos
    for r, j in enumerate(group.rows):
        gen = generators[j]
        if gen is not None:
            noise = torch.empty(vocab_size, dtype=probs.dtype).exponential_(generator=gen)
            if group.token_ids is not None:
                noise = noise[group.token_ids[r]]
            positions[r] = int((probs[r] / noise).argmax())
    if group.token_ids is None:
        return positions
    return group.token_ids.gather(1, torch.tensor(positions).unsqueeze(1)).squeeze(1).tolist()


def _logprob_entries(logprobs: torch.Tensor, token_ids: list[int], num_tops: list[int]) -> list[TokenLogprob]:
    """TokenLogprob per row of `logprobs` (float32 [n, vocab], log-softmax after masking): the
    sampled token's logprob and the row's `num_tops` most likely tokens, in one gather and one topk."""
    chosen = logprobs.gather(1, torch.tensor(token_ids).unsqueeze(1)).squeeze(1).tolist()
    max_top = max(num_tops)
    tops: list[list[tuple[int, float]]] = [[] for _ in token_ids]
    if max_top:
        values, ids = torch.topk(logprobs, max_top)
        for r, (row_ids, row_values) in enumerate(zip(ids.tolist(), values.tolist())):
            tops[r] = list(zip(row_ids[:num_tops[r]], row_values[:num_tops[r]]))
    return [TokenLogprob(t, lp, top) for t, lp, top in zip(token_ids, chosen, tops)]
