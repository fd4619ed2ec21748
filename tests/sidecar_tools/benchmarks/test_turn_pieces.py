"""benchmarks/turn_pieces.py: every piece is timed, and each alternative it is compared with gives
the same result as what the sidecar does (the function asserts that on the load test's turn)."""

from sidecar_tools.benchmarks.turn_pieces import measure


def test_every_piece_is_timed_on_the_load_tests_turn(qwen3_tokenizer_dir):
    figures = measure(str(qwen3_tokenizer_dir), number=2, repeat=1)
    assert figures["messages"] == 20 and figures["suffix_tokens"] > 100
    timed = {k: v for k, v in figures.items() if k.endswith("_us")}
    assert len(timed) >= 20 and all(v > 0 for v in timed.values())
