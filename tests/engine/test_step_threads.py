"""engine/step_threads.py: the rule (`leave_api_core`, off by default: `serve --leave-api-core`) gives each step a thread count by its rows
(every core but one below the threshold), the engine applies it to every step (prefill rows vs one
decode row) and counts it; it is off when not asked for, for an explicit --num-threads and for a single thread."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.step_threads import SMALL_STEP_ROWS, StepThreads, plan_step_threads
from tiny_engine import load_tiny, make_engine


@pytest.fixture
def tiny(tiny_model_dir):
    return load_tiny(tiny_model_dir)


def on_fresh_thread(fn):
    """Run `fn` on a new thread (as the engine thread does) and return its result; torch's thread
    count of the test's own thread is left as it was."""
    result = []
    previous = torch.get_num_threads()
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    torch.set_num_threads(previous)
    return result[0]


def test_rows_choose_the_count_and_each_step_is_counted() -> None:
    def run():
        rule = StepThreads(max_threads=2, all_from_rows=4)
        seen = [(rule.apply(rows), torch.get_num_threads()) for rows in (1, 3, 4, 40, 1)]
        return rule, seen

    rule, seen = on_fresh_thread(run)
    assert seen == [(1, 1), (1, 1), (2, 2), (2, 2), (1, 1)]
    assert rule.num_steps == {1: 3, 2: 2}
    assert "1 below 4 rows, 2 from it" in rule.describe() and "{1: 3, 2: 2}" in rule.describe()
    assert StepThreads(2, 0).threads_for(1) == 2
    assert [StepThreads(16, 8).threads_for(rows) for rows in (1, 7, 8)] == [15, 15, 16]
    with pytest.raises(ValueError):
        StepThreads(0, 1)


def test_engine_applies_the_rule_to_prefill_and_decode_steps(tiny) -> None:
    max_tokens = 5

    def run():
        engine = make_engine(tiny)
        engine.step_threads = StepThreads(max_threads=2, all_from_rows=8)
        engine.add_request(EngineRequest("r", list(range(1, 21)),
                                         SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)))
        outputs = []
        while engine.has_work():
            outputs += engine.step()
        return engine.step_threads, outputs, torch.get_num_threads()

    rule, outputs, threads_after = on_fresh_thread(run)
    # one 20-token prefill on 2 threads, then max_tokens - 1 one-row decodes on 1
    assert rule.num_steps == {2: 1, 1: max_tokens - 1}
    assert threads_after == 1
    assert sum(len(d.token_ids) for out in outputs for d in out.deltas) == max_tokens


def test_the_rule_is_off_unless_asked_and_for_an_explicit_or_single_thread_count() -> None:
    assert plan_step_threads(2, explicit=False, leave_api_core=False) is None
    assert plan_step_threads(2, explicit=True, leave_api_core=True) is None
    assert plan_step_threads(1, explicit=False, leave_api_core=True) is None
    rule = plan_step_threads(2, explicit=False, leave_api_core=True)
    assert rule is not None and (rule.max_threads, rule.all_from_rows) == (2, SMALL_STEP_ROWS)
