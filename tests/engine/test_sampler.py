"""Sampler: greedy, seeds independent of the batch, top-k/top-p/min-p, penalties, bias, logprobs."""

import torch

from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

VOCAB = 100
EOS = 2


def seq(params: SamplingParams, prompt=(5, 6, 7), output=(), seed_index=0) -> Sequence:
    s = Sequence(seq_id=0, request_id="r", index=0, token_ids=[*prompt, *output], num_prompt_tokens=len(prompt),
                 sampling_params=params, arrival_time=0.0)
    if params.seed is not None:
        s.generator = torch.Generator().manual_seed(params.seed + seed_index)
    return s


def logits_batch(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = logits_batch(4)
    out = Sampler(VOCAB, (EOS,)).sample(logits.clone(), [seq(SamplingParams(temperature=0.0))] * 4)
    assert out.token_ids == logits.argmax(-1).tolist()


def test_seeded_row_does_not_depend_on_the_batch():
    params = SamplingParams(temperature=1.0, seed=1234)
    base = logits_batch(1, seed=7)
    alone = [Sampler(VOCAB, (EOS,), seed=s).sample(base.clone(), [seq(params)]).token_ids[0] for s in range(3)]
    assert len(set(alone)) == 1
    batch = torch.cat([logits_batch(3, seed=1), base])
    others = [seq(SamplingParams(temperature=1.0))] * 3
    mixed = Sampler(VOCAB, (EOS,), seed=99).sample(batch, [*others, seq(params)]).token_ids[3]
    assert mixed == alone[0]


def test_unseeded_sampling_follows_the_distribution():
    logits = torch.full((1, VOCAB), -30.0)
    logits[0, 10] = 0.0
    logits[0, 11] = 0.0
    sampler = Sampler(VOCAB, (EOS,))
    picks = [sampler.sample(logits.clone(), [seq(SamplingParams(temperature=1.0))]).token_ids[0] for _ in range(200)]
    assert set(picks) == {10, 11}
    assert 60 < picks.count(10) < 140


def test_top_k_one_and_tiny_top_p_and_high_min_p_are_greedy():
    logits = logits_batch(3, seed=3)
    sampler = Sampler(VOCAB, (EOS,))
    rows = [seq(SamplingParams(top_k=1)), seq(SamplingParams(top_p=1e-6)), seq(SamplingParams(min_p=1.0))]
    for _ in range(5):
        assert sampler.sample(logits.clone(), rows).token_ids == logits.argmax(-1).tolist()


def test_top_k_keeps_only_k_tokens():
    logits = logits_batch(1, seed=4)
    allowed = set(logits[0].topk(3).indices.tolist())
    sampler = Sampler(VOCAB, (EOS,))
    picks = {sampler.sample(logits.clone(), [seq(SamplingParams(top_k=3, temperature=2.0))]).token_ids[0]
             for _ in range(100)}
    assert picks <= allowed and len(picks) > 1


def test_logit_bias_and_min_tokens():
    logits = torch.zeros(2, VOCAB)
    logits[:, EOS] = 50.0
    rows = [seq(SamplingParams(temperature=0.0, logit_bias={42: 100.0})),
            seq(SamplingParams(temperature=0.0, min_tokens=2, max_tokens=5))]
    out = Sampler(VOCAB, (EOS,)).sample(logits, rows).token_ids
    assert out[0] == 42
    assert out[1] != EOS


def test_penalties_push_away_repeated_tokens():
    logits = torch.zeros(3, VOCAB)
    logits[:, 9] = 1.0
    logits[:, 8] = 0.9
    rows = [seq(SamplingParams(temperature=0.0, frequency_penalty=0.5), output=(9,)),
            seq(SamplingParams(temperature=0.0, presence_penalty=0.5), output=(9, 9)),
            seq(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=(9,))]
    assert Sampler(VOCAB, (EOS,)).sample(logits, rows).token_ids == [8, 8, 8]


def test_logprobs_after_masking():
    logits = logits_batch(1, seed=5)
    bitmask = torch.zeros(1, (VOCAB + 31) // 32, dtype=torch.int32)
    bitmask[0, 0] = 0b1100       # only tokens 2 and 3 allowed
    out = Sampler(VOCAB, (EOS,)).sample(logits.clone(), [seq(SamplingParams(temperature=0.0, logprobs=2))], bitmask)
    assert out.token_ids[0] in (2, 3)
    entry = out.logprobs[0]
    assert {t for t, _ in entry.top} == {2, 3}
    probs = torch.tensor([lp for _, lp in entry.top]).exp()
    assert abs(float(probs.sum()) - 1.0) < 1e-5


def test_values_that_are_zero_or_inf_in_float32_do_not_break_the_draw():
    """Fuzzing regression: temperature / top_p / repetition_penalty that are valid but round to 0
    or overflow in float32 (5e-324, 1e300) gave inf / NaN logits and token 0 on every step."""
    logits = logits_batch(1, seed=5)
    logits[0, 0] = -50.0                                  # a NaN row degenerates to token 0
    logits[0, [5, 6, 7]] = torch.tensor([4.0, 2.0, 1.0])  # the prompt's tokens (see `seq`)
    logits[0, 50] = 10.0
    sampler = Sampler(VOCAB, (EOS,))

    def pick(**kwargs: float) -> int:
        return sampler.sample(logits.clone(), [seq(SamplingParams(**kwargs))]).token_ids[0]

    for _ in range(5):
        assert pick(temperature=5e-324) == 50
        assert pick(temperature=1e-45) == 50
        assert pick(top_p=5e-324) == 50
        assert pick(repetition_penalty=5e-324, temperature=0.5) == 5    # seen tokens forced, the best one
        assert pick(repetition_penalty=1e300, temperature=0.5) not in (0, 5, 6, 7)
