from sidecar_tools.benchmarks.records import TurnRecord, save_run, summarize
from sidecar_tools.benchmarks.report import find_runs
from sidecar_tools.benchmarks.report import main as report_cli
from sidecar_tools.benchmarks.report import table


def _save(out, name, makespan, share):
    rec = TurnRecord(session="s", turn=1, ttft_s=0.5, end_s=1.0, prompt_tokens=100, cached_tokens=int(100 - 100 * share),
                     history_tokens=100, ok=True)
    summary = summarize([rec], makespan, 1)
    summary["timed_out"] = False
    save_run(out, name, {"name": name, "summary": summary, "config": {}, "metrics": {}}, [rec])


def test_table_and_png(tmp_path):
    _save(tmp_path, "a-lru", 130.0, 0.56)
    _save(tmp_path, "b-sidecar", 65.0, 0.05)
    (tmp_path / "trace-stats.json").write_text("{}")  # not a run: ignored
    runs = find_runs([str(tmp_path)])
    assert [r["name"] for r in runs] == ["a-lru", "b-sidecar"]
    md = table(runs, "a-lru")
    assert "| b-sidecar | 65.0 s | 2.00x | 5.0 % | 0.50 s |" in md

    from click.testing import CliRunner

    res = CliRunner().invoke(report_cli, [str(tmp_path), "--baseline", "a-lru", "--md", str(tmp_path / "t.md"),
                                          "--png", str(tmp_path / "p.png"), "--title", "x"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert "Speed-up vs `a-lru`" in (tmp_path / "t.md").read_text()


def test_one_run_with_almost_no_recompute_does_not_fill_the_axis(tmp_path):
    """A lone bar must not set its own axis: 0.01 % recompute reads as 0.0 % on a 0-5 % axis."""
    import matplotlib.pyplot as plt

    from sidecar_tools.benchmarks.report import figure

    _save(tmp_path, "only", 60.0, 0.0)
    (run,) = find_runs([str(tmp_path)])
    run["summary"]["recomputed_share"] = 0.0001
    fig = figure([run])
    makespan, share, ttft = fig.axes
    assert share.get_xlim() == (0.0, 5.0)
    assert [t.get_text() for t in share.texts] == ["0.0 %"]
    assert makespan.get_xlim()[0] == 0 and makespan.get_xlim()[1] > 60.0
    assert [t.get_text() for t in makespan.texts] == ["60.0 s"]
    assert ttft.get_xlim()[0] == 0
    plt.close(fig)
