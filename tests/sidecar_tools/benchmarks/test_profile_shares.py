"""benchmarks/profile_shares.py: the load README's "where the time goes" table from a profile."""

import json

from sidecar_tools.benchmarks.profile_shares import shares, top_self


def test_samples_go_to_the_first_matching_group_and_idle_is_dropped(tmp_path):
    frames = [
        {"name": "run_app", "file": "/x/aiohttp/web.py"},  # 0
        {"name": "chat_completions", "file": "/x/sidecar/chat.py"},  # 1
        {"name": "ChatRenderer._render", "file": "/x/sidecar/chat_template.py"},  # 2
        {"name": "TokenCodec.encode", "file": "/x/sidecar/tokens.py"},  # 3
        {"name": "EpollSelector.select", "file": "/x/selectors.py"},  # 4
        {"name": "ReturnTimePredictor.settle", "file": "/x/sidecar/policy/predictor.py"},  # 5
    ]
    samples = [
        [0, 1, 2, 3],  # tokenizer called from a render: tokenizer
        [0, 1, 2],  # render
        [0, 1, 2],
        [0, 1, 5],  # policy
        [0, 4],  # idle: not counted
        [0, 4],
        [0],  # the loop itself
    ]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"shared": {"frames": frames}, "profiles": [{"samples": samples, "weights": [1] * 7}]}))
    got = shares(str(path))
    assert got["tokenizer encode (new messages)"] == 1 / 5
    assert got["chat template render (Jinja)"] == 2 / 5
    assert got["policy (gap learning, lease, admission, session lifecycle)"] == 1 / 5
    assert got["event loop, sockets, aiohttp outside the handler"] == 1 / 5
    assert abs(sum(got.values()) - 1) < 1e-9
    # self time: the innermost frame of each busy sample, idle dropped
    assert top_self(str(path), 2) == [("ChatRenderer._render", "chat_template.py", 2 / 5), ("TokenCodec.encode", "tokens.py", 1 / 5)]
