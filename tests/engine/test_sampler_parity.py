"""engine/sampler.py against the full-sort sampler it replaced (tests/engine/sampler_reference.py):
the same kept tokens and probabilities, the same tokens for seeded rows, the same distribution for
unseeded rows, the same logits after the batched penalties, bias and bans, the same logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from sampler_reference import ReferenceSampler, top_k_top_p_ref

from engine.inverse_cdf import inverse_cdf
from engine.logits_processors import apply_bias_and_bans, apply_penalties
from engine.sampler import Sampler, blocked_argmax
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.top_k_top_p import CANDIDATE_CAPS, blocked_topk, top_k_top_p_candidates

VOCAB = 5000          # above the largest candidate cap, so every tier runs
EOS = 2


def make_seq(params: SamplingParams, prompt=(5, 6, 7), output=(), seed_index: int = 0) -> Sequence:
    s = Sequence(seq_id=0, request_id="r", index=0, token_ids=[*prompt, *output], num_prompt_tokens=len(prompt),
                 sampling_params=params, arrival_time=0.0)
    if params.seed is not None:
        s.generator = torch.Generator().manual_seed(params.seed + seed_index)
    return s


def lm_like_logits(rows: int, seed: int, vocab: int = VOCAB, flat_rows: tuple[int, ...] = ()) -> torch.Tensor:
    """Zipf-shaped rows (logit = -1.1 log rank, shuffled, plus noise) like a language model's; rows
    in `flat_rows` nearly uniform, so no cap holds a top_p near 1."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
    out = torch.empty(rows, vocab)
    for r in range(rows):
        scale = 0.05 if r in flat_rows else 2.0 + r % 3
        row = -scale * 1.1 * ranks.log() + 0.3 * torch.randn(vocab, generator=gen)
        out[r] = row[torch.randperm(vocab, generator=gen)]
    return out


# (top_k, top_p) per row: nucleus only, top-k only, both, top-k above every cap, tiny top_p, flat
# rows with top_p near 1 (the full-sort fallback), and top-k equal to a cap.
CASES = [(-1, 0.95), (50, 1.0), (50, 0.9), (3000, 0.9), (-1, 1e-6), (-1, 0.999), (-1, 0.99), (256, 0.8),
         (1024, 1.0), (-1, 0.5)]
FLAT = (5, 6)


def kept_by_reference(row: torch.Tensor, top_k: int, top_p: float) -> tuple[set[int], dict[int, float]]:
    masked = row.clone().unsqueeze(0)
    top_k_top_p_ref(masked, [top_k], [top_p])
    probs = torch.softmax(masked[0], -1)
    kept = torch.isfinite(masked[0]).nonzero().squeeze(1).tolist()
    return set(kept), {t: float(probs[t]) for t in kept}


def test_candidates_keep_the_full_sorts_tokens_and_probabilities():
    for seed in range(3):
        logits = lm_like_logits(len(CASES), seed, flat_rows=FLAT)
        groups = top_k_top_p_candidates(logits, [k for k, _ in CASES], [p for _, p in CASES])
        seen = []
        for cand in groups:
            probs = torch.softmax(cand.logits, -1)
            for r, row in enumerate(cand.rows.tolist()):
                seen.append(row)
                kept = torch.isfinite(cand.logits[r])
                ids = cand.token_ids[r][kept].tolist()
                ref_ids, ref_probs = kept_by_reference(logits[row], *CASES[row])
                assert set(ids) == ref_ids and len(ids) == len(ref_ids), (seed, CASES[row])
                got = probs[r][kept].tolist()
                for t, p in zip(ids, got):
                    assert math.isclose(p, ref_probs[t], rel_tol=1e-5, abs_tol=1e-7), (seed, CASES[row], t)
        assert sorted(seen) == list(range(len(CASES)))


def test_only_rows_whose_caps_hold_too_little_fall_back_to_the_full_sort():
    logits = lm_like_logits(len(CASES), 0, flat_rows=FLAT)
    groups = top_k_top_p_candidates(logits, [k for k, _ in CASES], [p for _, p in CASES])
    width_of = {row: cand.logits.shape[1] for cand in groups for row in cand.rows.tolist()}
    assert width_of[5] == width_of[6] == VOCAB          # flat rows, top_p 0.999 / 0.99: sorted whole
    assert width_of[3] == VOCAB                         # top_k 3000 is above every cap
    assert width_of[0] == CANDIDATE_CAPS[0]             # a Zipf row's 0.95 nucleus fits in the first cap
    # top-k within a cap: resolved at the first cap that holds it, never sorted whole
    assert width_of[1] == width_of[7] == CANDIDATE_CAPS[1] and width_of[8] == CANDIDATE_CAPS[2]


def seeded_batch(step_seed: int) -> tuple[torch.Tensor, list[Sequence], list[Sequence]]:
    params = [SamplingParams(temperature=0.8, top_k=k, top_p=p, seed=100 + i) for i, (k, p) in enumerate(CASES)]
    params += [SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=0.7, min_p=0.05, seed=8),
               SamplingParams(temperature=1.2, top_p=0.9, min_p=0.1, seed=9), SamplingParams(temperature=0.0)]
    logits = lm_like_logits(len(params), step_seed, flat_rows=FLAT)
    return logits, [make_seq(p) for p in params], [make_seq(p) for p in params]


def test_seeded_rows_draw_the_same_tokens_as_the_full_sort_sampler():
    new, ref = Sampler(VOCAB, (EOS,), seed=1), ReferenceSampler(VOCAB, (EOS,), seed=2)
    logits, new_seqs, ref_seqs = seeded_batch(0)
    for step in range(12):
        logits = lm_like_logits(logits.shape[0], step, flat_rows=FLAT)
        got = new.sample(logits.clone(), new_seqs).token_ids
        want = ref.sample(logits.clone(), ref_seqs).token_ids
        assert got == want, step


def test_unseeded_rows_follow_the_reference_distribution():
    """8,000 draws of one Zipf row at top_p 0.9 (a few dozen tokens kept): every draw is a kept
    token and each token's frequency is within 4.5 standard deviations of its probability."""
    row = lm_like_logits(1, 3)[0]
    ref_ids, ref_probs = kept_by_reference(row, -1, 0.9)
    assert 3 < len(ref_ids) < CANDIDATE_CAPS[0]
    sampler = Sampler(VOCAB, (EOS,), seed=5)
    num_rows, num_steps = 400, 20
    params = SamplingParams(temperature=1.0, top_p=0.9)
    seqs = [make_seq(params) for _ in range(num_rows)]
    counts: dict[int, int] = {}
    for _ in range(num_steps):
        for t in sampler.sample(row.repeat(num_rows, 1), seqs).token_ids:
            counts[t] = counts.get(t, 0) + 1
    total = num_rows * num_steps
    assert set(counts) <= ref_ids
    for t, p in ref_probs.items():
        sd = math.sqrt(total * p * (1 - p))
        assert abs(counts.get(t, 0) - total * p) <= 4.5 * sd + 1, (t, p, counts.get(t, 0))


@pytest.mark.parametrize("width", [7, 1024, 3001])
def test_inverse_cdf_quantiles_hit_each_position_in_proportion(width):
    """Uniforms on a regular grid of N points must give each position weight/sum x N hits (within
    one), zero-weight positions none, and a uniform just below 1 the last positive position."""
    gen = torch.Generator().manual_seed(width)
    weights = torch.rand(width, generator=gen) * (torch.rand(width, generator=gen) > 0.3)
    weights[-1] = 0.0
    num = 20000
    uniforms = (torch.arange(num, dtype=torch.float64) + 0.5) / num
    positions = inverse_cdf(weights.repeat(num, 1), uniforms)
    hits = torch.bincount(positions, minlength=width)
    expected = weights.double() / weights.double().sum() * num
    assert (hits - expected).abs().max() <= 1.0 + 1e-6
    assert int(hits[weights == 0].sum()) == 0
    last = inverse_cdf(weights.unsqueeze(0), torch.tensor([1.0 - 2.0**-53], dtype=torch.float64))
    assert int(last) == int(weights.nonzero().max())


def penalty_seqs() -> list[Sequence]:
    specs = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.7, presence_penalty=-0.4),
             dict(repetition_penalty=0.8, presence_penalty=1.0), dict(logit_bias={3: 5.0, 4000: -100.0}),
             dict(min_tokens=3, max_tokens=5, stop_token_ids=(11, 12)), dict(),
             dict(repetition_penalty=2.0, frequency_penalty=2.0, logit_bias={9: 1.5}, min_tokens=1)]
    return [make_seq(SamplingParams(**spec), prompt=(9, 9, 17, 4000), output=(3, 9, 12, 3)[: i % 5])
            for i, spec in enumerate(specs)]


def test_batched_penalties_bias_and_bans_equal_the_per_row_loops():
    seqs = penalty_seqs()
    logits = lm_like_logits(len(seqs), 11)
    expected = logits.clone()
    ref = ReferenceSampler(VOCAB, (EOS,))
    ref._apply_penalties(expected, seqs)
    ref._apply_bias_and_bans(expected, seqs)
    apply_penalties(logits, seqs, VOCAB)
    apply_bias_and_bans(logits, seqs, (EOS,), VOCAB)
    assert torch.equal(logits, expected)


def test_logprobs_and_bitmask_rows_match_the_reference():
    """Constrained and all-ones bitmask rows in one batch (the all-ones rows are skipped), greedy
    and seeded rows asking for logprobs: tokens, sampled logprobs and top lists as the reference."""
    params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.9, top_p=0.9, seed=3, logprobs=5),
              SamplingParams(temperature=0.0, logprobs=0), SamplingParams(temperature=1.0, seed=4, logprobs=2),
              SamplingParams(temperature=0.7, top_k=20, seed=5)]
    gen = torch.Generator().manual_seed(0)
    bitmask = torch.full((len(params), (VOCAB + 31) // 32), -1, dtype=torch.int32)
    bitmask[1] = torch.randint(-(2**31), 2**31 - 1, (bitmask.shape[1],), generator=gen, dtype=torch.int64).to(torch.int32)
    bitmask[2, :] = 0
    bitmask[2, 3] = 0b1011
    new, ref = Sampler(VOCAB, (EOS,)), ReferenceSampler(VOCAB, (EOS,))
    new_seqs, ref_seqs = [make_seq(p) for p in params], [make_seq(p) for p in params]
    for step in range(4):
        logits = lm_like_logits(len(params), 20 + step)
        got = new.sample(logits.clone(), new_seqs, bitmask.clone())
        want = ref.sample(logits.clone(), ref_seqs, bitmask.clone())
        assert got.token_ids == want.token_ids
        assert got.token_ids[2] in (96, 97, 99)
        for a, b in zip(got.logprobs, want.logprobs):
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert a.token_id == b.token_id and math.isclose(a.logprob, b.logprob, abs_tol=1e-6)
                assert [t for t, _ in a.top] == [t for t, _ in b.top]
                assert all(math.isclose(x, y, abs_tol=1e-6) for (_, x), (_, y) in zip(a.top, b.top))


@pytest.mark.parametrize("vocab", [100, 2048, 5000, 49152, 3 * 1024 + 1])
def test_blocked_argmax_equals_torch_argmax(vocab):
    """First index of the maximum, ties across and inside blocks, all -inf rows, NaN, a maximum
    in the last partial block."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(8, vocab, generator=gen)
    logits[1] = 0.0                                   # all tied: index 0
    logits[2, [vocab // 2, vocab - 1, 7]] = 9.0        # tie across blocks: the first one
    logits[3] = float("-inf")
    logits[4, vocab // 3] = float("nan")
    logits[5, vocab - 1] = 50.0                        # in the last (partial) block
    logits[6, :] = -1e30
    logits[6, vocab - 2] = float("inf")
    logits = logits.repeat(2, 1)                       # 16 rows: the blocked path
    assert torch.equal(blocked_argmax(logits), logits.argmax(dim=-1))
    assert torch.equal(blocked_argmax(logits[:1]), logits[:1].argmax(dim=-1))


@pytest.mark.parametrize(("width", "k"), [(49152, 32), (49152, 256), (16384, 32), (5000, 32), (4096, 7)])
def test_blocked_topk_equals_topk(width: int, k: int) -> None:
    """The block-maxima top-k gives torch.topk's values and ids (no ties in these rows), also for
    rows whose largest entries crowd into one block and rows with -inf (masked) entries."""
    gen = torch.Generator().manual_seed(width + k)
    logits = torch.randn(6, width, generator=gen) * 3
    logits[1, 128:128 + 2 * k] += 40.0                       # the top k all in one or two blocks
    logits[2, : width // 2] = float("-inf")                  # half the row masked
    values, ids = blocked_topk(logits, k)
    want_values, want_ids = logits.topk(k, dim=-1)
    assert torch.equal(values, want_values) and torch.equal(ids, want_ids)
    assert ids.dtype == torch.int64
