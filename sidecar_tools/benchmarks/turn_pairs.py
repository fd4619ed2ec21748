"""Two replay runs of one trace, turn by turn: where they part and by how much.

A stock/product pair on the GPU replays the same sessions with the same gaps; a percentile over ~130 turns
can move by seconds when two requests that arrive at the same instant reach SGLang in the other order.
This lines the runs' turns up by (session, turn) and says how many turns agree within a tolerance, the
first turn that does not, and the TTFT each run lost to the other on the turns that differ, so a table's
p99 can be read against what the two runs actually did.

    python -m sidecar_tools.benchmarks.turn_pairs A-turns.csv B-turns.csv [--tolerance 0.3] [--md OUT.md]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from sidecar_tools.benchmarks.records import TurnRecord, read_turns_csv


def _run_name(path: Path) -> str:
    stem = path.name.removesuffix(".csv")
    return stem.removesuffix("-turns")


def _session_key(session: str, run: str) -> str:
    """The session id without the run's salt (replay appends ``-<salt>``; the matrix salts by run name)."""
    return session.removesuffix(f"-{run}")


@dataclass(frozen=True)
class TurnPair:
    session: str
    turn: int
    send_s: float
    ttft_a: float
    ttft_b: float

    @property
    def delta(self) -> float:
        return self.ttft_b - self.ttft_a


def pair_turns(a: list[TurnRecord], a_name: str, b: list[TurnRecord], b_name: str) -> list[TurnPair]:
    """Turns answered in both runs, in the order run A sent them."""
    by_key = {(_session_key(r.session, b_name), r.turn): r for r in b if r.ok and r.ttft_s is not None}
    pairs = []
    for r in a:
        other = by_key.get((_session_key(r.session, a_name), r.turn))
        if r.ok and r.ttft_s is not None and other is not None:
            pairs.append(TurnPair(_session_key(r.session, a_name), r.turn, r.send_s, r.ttft_s, other.ttft_s))
    return sorted(pairs, key=lambda p: p.send_s)


def compare(pairs: list[TurnPair], tolerance_s: float) -> dict:
    """Agreement within ``tolerance_s``, the first turn beyond it, and the TTFT lost each way beyond it."""
    apart = [p for p in pairs if abs(p.delta) > tolerance_s]
    first = apart[0] if apart else None
    return {
        "turns": len(pairs),
        "tolerance_s": tolerance_s,
        "within": len(pairs) - len(apart),
        "first_apart": None if first is None else {
            "session": first.session, "turn": first.turn, "send_s": round(first.send_s, 2),
            "ttft_a_s": round(first.ttft_a, 3), "ttft_b_s": round(first.ttft_b, 3)},
        "b_slower_turns": sum(p.delta > 0 for p in apart),
        "b_slower_s": round(sum(p.delta for p in apart if p.delta > 0), 2),
        "a_slower_turns": sum(p.delta < 0 for p in apart),
        "a_slower_s": round(-sum(p.delta for p in apart if p.delta < 0), 2),
        "largest": [{"session": p.session, "turn": p.turn, "send_s": round(p.send_s, 1),
                     "ttft_a_s": round(p.ttft_a, 2), "ttft_b_s": round(p.ttft_b, 2)}
                    for p in sorted(apart, key=lambda p: -abs(p.delta))[:8]],
    }


def markdown(result: dict, a_name: str, b_name: str) -> str:
    lines = [f"# {a_name} vs {b_name}, turn by turn", "",
             f"{result['within']} of {result['turns']} turns within {result['tolerance_s']} s of TTFT."]
    first = result["first_apart"]
    if first:
        lines.append(f"First turn apart: `{first['session']}` turn {first['turn']}, sent at {first['send_s']} s "
                     f"({first['ttft_a_s']} s vs {first['ttft_b_s']} s).")
    lines += ["", f"Beyond the tolerance: {b_name} slower on {result['b_slower_turns']} turns "
                  f"(+{result['b_slower_s']} s of TTFT), {a_name} slower on {result['a_slower_turns']} turns "
                  f"(+{result['a_slower_s']} s).", "",
              f"| session | turn | sent | TTFT {a_name} | TTFT {b_name} |", "|---|---|---|---|---|"]
    lines += [f"| {p['session']} | {p['turn']} | {p['send_s']} s | {p['ttft_a_s']} s | {p['ttft_b_s']} s |"
              for p in result["largest"]]
    return "\n".join(lines) + "\n"


@click.command()
@click.argument("a_csv", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("b_csv", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--tolerance", default=0.3, show_default=True, help="Seconds of TTFT within which two turns agree.")
@click.option("--md", "md_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the markdown here.")
def main(a_csv: Path, b_csv: Path, tolerance: float, md_path: Path | None) -> None:
    a_name, b_name = _run_name(a_csv), _run_name(b_csv)
    result = compare(pair_turns(read_turns_csv(a_csv), a_name, read_turns_csv(b_csv), b_name), tolerance)
    text = markdown(result, a_name, b_name)
    if md_path:
        md_path.write_text(text)
    click.echo(text)


if __name__ == "__main__":
    main()
