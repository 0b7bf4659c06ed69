"""The sampler as it was before the candidate path (full-vocabulary sort for top-k/top-p, per-row
penalty loops, an exponential race over the whole vocabulary for every
row): the reference engine/sampler.py is tested against (tests/engine/test_sampler_parity.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import TokenLogprob
from engine.sequence import Sequence
from kernels.apply_bitmask import apply_bitmask_ref

_MIN_REPETITION_PENALTY = 1e-6


@dataclass(slots=True)
class ReferenceOutput:
    """Sampled token id per row, and its logprob entry when the row asked for logprobs."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class ReferenceSampler:
    """The former engine.sampler.Sampler, unchanged (its bitmask apply is tested bit-identical).

    Order per row (vLLM / OpenAI semantics): repetition penalty (prompt + output tokens),
    presence and frequency penalties (output tokens), logit_bias, min_tokens (EOS and stop ids
    banned), grammar bitmask; logprobs are taken here (after masking, before temperature); then
    temperature, top-k, top-p, min-p, and a draw by the exponential race (argmax p / E, E ~ Exp(1)),
    E drawn from the sequence's own generator when it has a seed, so its tokens do not depend on
    the rest of the batch.
    """

    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...], seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence], bitmask: torch.Tensor | None = None) -> ReferenceOutput:
        """Sample one token for each row.

        logits: float32 [num_rows, vocab_size] (modified in place); seqs: one per row.
        bitmask: int32 [num_rows, ceil(vocab_size / 32)] or None (unconstrained).
        """
        self._apply_penalties(logits, seqs)
        self._apply_bias_and_bans(logits, seqs)
        if bitmask is not None:
            apply_bitmask_ref(logits, bitmask)
        want_logprobs = [i for i, s in enumerate(seqs) if s.sampling_params.logprobs is not None]
        logprobs_rows = torch.log_softmax(logits[want_logprobs], dim=-1) if want_logprobs else None
        token_ids = self._draw(logits, seqs)
        entries: list[TokenLogprob | None] = [None] * len(seqs)
        for j, i in enumerate(want_logprobs):
            assert logprobs_rows is not None
            row = logprobs_rows[j]
            num_top = seqs[i].sampling_params.logprobs or 0
            top: list[tuple[int, float]] = []
            if num_top:
                values, ids = torch.topk(row, num_top)
                top = list(zip(ids.tolist(), values.tolist()))
            entries[i] = TokenLogprob(token_ids[i], float(row[token_ids[i]]), top)
        return ReferenceOutput(token_ids, entries)

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        for i, seq in enumerate(seqs):
            p = seq.sampling_params
            if p.repetition_penalty != 1.0:
                seen = torch.tensor(seq.token_ids, dtype=torch.long).unique()
                seen = seen[seen < self.vocab_size]
                vals = logits[i, seen]
                # clamped: a factor that is 0 or inf in float32 would make inf / NaN logits, while
                # beyond 1e6 either way the seen tokens are already forced or banned
                penalty = min(max(p.repetition_penalty, _MIN_REPETITION_PENALTY), 1 / _MIN_REPETITION_PENALTY)
                logits[i, seen] = torch.where(vals > 0, vals / penalty, vals * penalty)
            if (p.presence_penalty or p.frequency_penalty) and seq.num_output_tokens:
                out = torch.tensor(seq.output_token_ids, dtype=torch.long)
                counts = torch.bincount(out, minlength=self.vocab_size)[: self.vocab_size].to(logits.dtype)
                logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)

    def _apply_bias_and_bans(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        for i, seq in enumerate(seqs):
            p = seq.sampling_params
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias.keys()), dtype=torch.long)
                logits[i, ids] += torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype)
            if seq.num_output_tokens < p.min_tokens:
                banned = [t for t in (*self.eos_token_ids, *p.stop_token_ids) if t < self.vocab_size]
                logits[i, banned] = float("-inf")

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        greedy = [s.sampling_params.greedy for s in seqs]
        result = logits.argmax(dim=-1)
        if all(greedy):
            return result.tolist()
        rows = [i for i, g in enumerate(greedy) if not g]
        sub = logits[rows]
        params = [seqs[i].sampling_params for i in rows]
        sub.div_(torch.tensor([p.temperature for p in params], dtype=sub.dtype).unsqueeze(1))
        top_k_top_p_ref(sub, [p.top_k for p in params], [p.top_p for p in params])
        probs = torch.softmax(sub, dim=-1)
        min_ps = [p.min_p for p in params]
        if any(min_ps):
            threshold = probs.max(dim=-1, keepdim=True).values * torch.tensor(min_ps, dtype=probs.dtype).unsqueeze(1)
            probs = probs.masked_fill(probs < threshold, 0.0)
        noise = torch.empty_like(probs)
        unseeded = [j for j, i in enumerate(rows) if seqs[i].generator is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[1]).exponential_(generator=self.generator)
        for j, i in enumerate(rows):
            gen = seqs[i].generator
            if gen is not None:
                noise[j].exponential_(generator=gen)
        drawn = (probs / noise).argmax(dim=-1)
        result[rows] = drawn
        return result.tolist()


def top_k_top_p_ref(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> None:
    """Mask (in place, -inf) tokens outside each row's top-k and nucleus top-p.

    logits: float32 [rows, vocab]; top_ks: <= 0 disables; top_ps: 1.0 disables.
    Nucleus sampling: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration".
    """
    use_k = any(k > 0 for k in top_ks)
    use_p = any(p < 1.0 for p in top_ps)
    if not (use_k or use_p):
        return
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[1]
    positions = torch.arange(vocab).unsqueeze(0)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if use_k:
        ks = torch.tensor([k if k > 0 else vocab for k in top_ks]).unsqueeze(1)
        drop |= positions >= ks
    if use_p:
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        before = probs.cumsum(dim=-1) - probs          # mass strictly above each token
        drop |= before >= torch.tensor(top_ps, dtype=probs.dtype).unsqueeze(1)
        drop[:, 0] = False      # a top_p that rounds to 0 in float32 must still keep the top token
    sorted_logits.masked_fill_(drop, float("-inf"))
    logits.scatter_(1, order, sorted_logits)
