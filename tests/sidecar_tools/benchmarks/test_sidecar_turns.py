"""`sidecar_turns` (README's first try-it command): what it prints is what the engine can hold."""

from __future__ import annotations

from sidecar_thread import sidecar_in_thread

from sidecar.settings import load_settings
from sidecar_tools.benchmarks import sidecar_turns


def test_every_later_turn_reads_as_reused_against_the_engines_best(sglang_double_thread, qwen3_tokenizer_dir):
    settings = load_settings(overrides={"server": {"sglang_url": sglang_double_thread.url, "tokenizer": str(qwen3_tokenizer_dir)}})
    with sidecar_in_thread(settings) as url:
        rows = sidecar_turns.run(f"{url}/v1", turns=3, max_tokens=8, session_id=None)
    for prev, row in zip(rows, rows[1:]):
        assert row["expected_cached"] == prev["prompt_tokens"] + prev["completion_tokens"] - 1
        assert row["history_reused"] is True and row["cached_tokens"] >= row["expected_cached"]
    table = sidecar_turns.format_table(rows)
    assert "False" not in table and table.count("True") == 2


def test_a_turn_that_lost_history_reads_false():
    rows = [
        {"turn": 1, "prompt_tokens": 176, "completion_tokens": 64, "cached_tokens": 0},
        {"turn": 2, "prompt_tokens": 1328, "completion_tokens": 64, "cached_tokens": 239},  # the engine's best
        {"turn": 3, "prompt_tokens": 2480, "completion_tokens": 64, "cached_tokens": 100},  # re-rendered
    ]
    sidecar_turns.mark_reuse(rows)
    assert [r.get("history_reused") for r in rows] == [None, True, False]
