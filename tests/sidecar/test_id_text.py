"""Token ids kept as JSON text: the same ids, the same JSON the engine would get from the list."""

import json

from sidecar.engine.client import _json_body
from sidecar.id_text import IdText


def test_concatenation_keeps_every_id_in_order():
    a = IdText([151644, 8948, 198])
    b = a + [0, 7, 151645] + IdText([42])
    assert b.tolist() == [151644, 8948, 198, 0, 7, 151645, 42] and len(b) == 7
    assert a.tolist() == [151644, 8948, 198]  # immutable: a is unchanged
    assert list(b) == b.tolist() and b == [151644, 8948, 198, 0, 7, 151645, 42]
    assert json.loads(b.json()) == b.tolist()


def test_empty_parts():
    empty = IdText()
    assert len(empty) == 0 and empty.tolist() == [] and empty.json() == b"[]"
    assert (empty + [1, 2]).tolist() == [1, 2]
    assert (IdText([1, 2]) + []).tolist() == [1, 2]
    assert (empty + empty).json() == b"[]"


def test_engine_body_is_the_payload_as_json():
    ids = IdText([1, 2, 3]) + [4]
    payload = {"rid": "r", "input_ids": ids, "session_id": "s", "sampling_params": {"max_new_tokens": 3}, "stream": True}
    assert json.loads(_json_body(payload)) == {**payload, "input_ids": [1, 2, 3, 4]}
    assert json.loads(_json_body({"input_ids": ids})) == {"input_ids": [1, 2, 3, 4]}
    assert json.loads(_json_body({"input_ids": [5], "rid": "x"})) == {"input_ids": [5], "rid": "x"}
