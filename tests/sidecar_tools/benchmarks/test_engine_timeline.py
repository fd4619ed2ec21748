"""The engine timeline reads SGLang's batch log lines as SGLang 0.5.23 writes them."""

from click.testing import CliRunner

from sidecar_tools.benchmarks.engine_timeline import binned, kv_bound_share, main, read_batch_lines

LOG = """\
[2026-12-01 12:39:19] Prefill batch, #new-seq: 1, #new-token: 3, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: True, input throughput (token/s): 2.66
[2026-12-01 12:39:21] some other line
[2026-12-01 12:39:38] Prefill batch, #new-seq: 1, #new-token: 3759, #cached-token: 0, token usage: 0.07, #running-req: 0, #queue-req: 20, #pending-token: 0, cuda graph: True, input throughput (token/s): 9.1
[2026-12-01 12:39:40] Decode batch, #running-req: 24, #token: 16356, token usage: 0.40, cuda graph: True, gen throughput (token/s): 40.74, #queue-req: 0
[2026-12-01 12:39:46] Prefill batch, #new-seq: 1, #new-token: 94, #cached-token: 16407, token usage: 0.91, #running-req: 13, #queue-req: 8, #pending-token: 121249, cuda graph: True, input throughput (token/s): 221.42
[2026-12-01 12:39:47] Decode batch, #running-req: 12, #token: 161182, token usage: 0.93, cuda graph: True, gen throughput (token/s): 665.37, #queue-req: 4
"""


def test_run_starts_at_first_real_prompt_and_fields_are_read(tmp_path):
    path = tmp_path / "sglang-x.log"
    path.write_text(LOG)
    lines = read_batch_lines(path)
    assert [l.at_s for l in lines] == [0.0, 2.0, 8.0, 9.0]  # the 3-token warm-up is not the run
    assert (lines[0].kind, lines[0].queued, lines[0].new_tokens) == ("prefill", 20, 3759)
    assert (lines[1].kind, lines[1].running, lines[1].token_usage) == ("decode", 24, 0.40)
    assert lines[2].cached_tokens == 16407
    assert kv_bound_share(lines) == 0.5  # the last two: queued requests with KV >= 0.85

    bins = binned(lines, 5.0)
    assert [b["from_s"] for b in bins] == [0.0, 5.0]
    assert bins[1]["running"] == 12.5 and bins[1]["queued"] == 6.0 and bins[1]["prefilled_tokens"] == 94


def test_cli_refuses_a_log_without_batches(tmp_path):
    path = tmp_path / "not-sglang.log"
    path.write_text("hello\n")
    result = CliRunner().invoke(main, [str(path)])
    assert result.exit_code != 0 and "no SGLang batch lines" in result.output
