"""turn_pairs lines two runs of one trace up turn by turn, whatever salt each run put on its session ids."""

from click.testing import CliRunner

from sidecar_tools.benchmarks.records import TurnRecord, write_turns_csv
from sidecar_tools.benchmarks.turn_pairs import compare, main, pair_turns


def _turns(run: str, ttfts: dict[tuple[str, int], float], failed: frozenset = frozenset()) -> list[TurnRecord]:
    return [TurnRecord(session=f"{s}-{run}", turn=t, send_s=10.0 * t + (0.5 if s == "b" else 0.0), ttft_s=x,
                       ok=(s, t) not in failed) for (s, t), x in ttfts.items()]


STOCK = {("a", 0): 1.0, ("a", 1): 0.1, ("b", 0): 0.3, ("b", 1): 0.2, ("a", 2): 0.1}
PRODUCT = {("a", 0): 1.05, ("a", 1): 2.1, ("b", 0): 0.3, ("b", 1): 0.2, ("a", 2): 0.1}


def test_pairs_turns_across_salts_and_reports_where_they_part():
    pairs = pair_turns(_turns("hicache-x", STOCK), "hicache-x", _turns("product-x", PRODUCT), "product-x")
    assert [(p.session, p.turn) for p in pairs] == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2)]
    result = compare(pairs, tolerance_s=0.3)
    assert result["within"] == 4 and result["turns"] == 5
    assert result["first_apart"]["session"] == "a" and result["first_apart"]["turn"] == 1
    assert (result["b_slower_turns"], result["b_slower_s"]) == (1, 2.0)
    assert (result["a_slower_turns"], result["a_slower_s"]) == (0, 0)


def test_failed_turns_are_left_out_not_compared():
    product = _turns("product-x", PRODUCT, failed=frozenset({("a", 1)}))
    result = compare(pair_turns(_turns("hicache-x", STOCK), "hicache-x", product, "product-x"), 0.3)
    assert result["turns"] == 4 and result["first_apart"] is None


def test_command_writes_the_comparison(tmp_path):
    a, b = tmp_path / "hicache-x-turns.csv", tmp_path / "product-x-turns.csv"
    write_turns_csv(_turns("hicache-x", STOCK), a)
    write_turns_csv(_turns("product-x", PRODUCT), b)
    md = tmp_path / "pair.md"
    result = CliRunner().invoke(main, [str(a), str(b), "--md", str(md)])
    assert result.exit_code == 0, result.output
    assert "4 of 5 turns within 0.3 s" in md.read_text()
    assert "First turn apart: `a` turn 1" in md.read_text()
