"""The no-harm table's rounds: which cells run with which flags, and the ratios the table prints."""

import json

from sidecar_tools.benchmarks.records import TurnRecord, write_turns_csv
from sidecar_tools.simulator.no_harm import KV, UNCONSTRAINED_KV, Round, product, run, stock, table, unconstrained


def _round(tmp_path, **kw):
    rows = {"hicache": stock, "product": lambda r: product({"max_leased_fraction": 0.8}, r),
            "unconstrained": unconstrained, "product-wb": lambda r: product({}, r, "--hicache-write-policy", "write_back")}
    return Round(out=tmp_path, rows=rows, unconstrained_on=("0.5s",), ratio_1_only=("product-wb",), **kw)


def test_cells_follow_the_rounds_rules(tmp_path):
    cells = _round(tmp_path).cells(only=["0.5s", "overload"], rows=None)
    assert cells == [("hicache", "0.5s"), ("product", "0.5s"), ("unconstrained", "0.5s"),
                     ("hicache", "overload"), ("product", "overload"), ("product-wb", "overload")]


def test_commands_carry_the_workloads_ratio_and_budget(tmp_path):
    r = _round(tmp_path)
    cmd = r.command("product", "overload", tmp_path)
    assert cmd[cmd.index("--hicache-ratio") + 1] == "1" and cmd[cmd.index("--kv-tokens") + 1] == str(KV)
    assert json.loads(cmd[cmd.index("--policy-config") + 1]) == {"max_leased_fraction": 0.8}
    assert cmd[cmd.index("--name") + 1] == "product-overload"
    free = r.command("unconstrained", "0.5s", tmp_path)
    assert free[free.index("--kv-tokens") + 1] == str(UNCONSTRAINED_KV) and "--hicache-ratio" not in free


def _cell(out, name, makespan, p99, first_ttfts):
    turns = [TurnRecord(session=f"s{i}", turn=0, ttft_s=x, ok=True) for i, x in enumerate(first_ttfts)]
    turns += [TurnRecord(session="s0", turn=1, ttft_s=p99, ok=True)]
    write_turns_csv(turns, out / f"{name}-turns.csv")
    summary = {"makespan_s": makespan, "recomputed_share": 0.0, "ttft_p50_s": 0.1, "ttft_p90_s": 0.5,
               "ttft_p99_s": p99, "turns_failed": 0}
    (out / f"{name}.json").write_text(json.dumps({"summary": summary}))


def test_table_puts_each_row_against_stock_and_counts_long_door_waits(tmp_path):
    _cell(tmp_path, "hicache-overload", 200.0, 4.0, [1.0])
    _cell(tmp_path, "product-overload", 150.0, 2.0, [61.0, 0.5])
    md = table(tmp_path, ["hicache", "product"], ["overload"])
    product_line = next(line for line in md.splitlines() if "| product |" in line)
    cols = [c.strip() for c in product_line.split("|")[1:-1]]
    assert cols[2:4] == ["150.0 s", "0.75x"] and cols[10] == "0.50x"
    assert cols[12:14] == ["61.0 s", "1"]


def test_copy_stock_takes_the_baseline_from_another_round(tmp_path):
    earlier, now = tmp_path / "b", tmp_path / "c"
    earlier.mkdir()
    _cell(earlier, "hicache-overload", 200.0, 4.0, [1.0])
    r = Round(out=now, rows={"hicache": stock}, stock_from=earlier)
    run(r, ["--copy-stock", "--only", "overload"])  # nothing left to simulate: stock is copied
    assert json.loads((now / "hicache-overload.json").read_text())["summary"]["makespan_s"] == 200.0
    assert "| overload | hicache | 200.0 s | 1.00x |" in (now / "table.md").read_text()


def test_copy_stock_runs_the_baselines_no_earlier_round_has(tmp_path):
    older, earlier, now = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    older.mkdir()
    earlier.mkdir()
    _cell(older, "hicache-overload", 100.0, 4.0, [1.0])
    _cell(earlier, "hicache-overload", 200.0, 4.0, [1.0])
    _cell(older, "hicache-5s-n26", 110.0, 0.5, [0.5])
    r = Round(out=now, rows={"hicache": stock}, stock_from=(earlier, older), workloads=("overload", "5s-n26", "5s-openai"))
    assert r.stock_file("overload", ".json") == earlier / "hicache-overload.json"
    assert r.stock_file("5s-n26", ".json") == older / "hicache-5s-n26.json"
    assert r.stock_file("5s-openai", ".json") is None
    cmd = r.command("hicache", "5s-openai", now)
    assert cmd[cmd.index("--template-tokens") + 1] == "qwen3-openai"
