"""The index of the open sessions' first prompts (``sidecar.policy.shared_prefix``): what a new
session shares with them, in whole blocks, and who else counts that prefix from then on."""

from sidecar.policy.shared_prefix import BLOCK_TOKENS, MAX_INDEXED_TOKENS, Share, SharedPrefixes, block_chain

SYSTEM = list(range(1_000_000, 1_003_254))  # 3,254 tokens every agent starts with


def prompt(task: int, own: int = 505) -> list[int]:
    return SYSTEM + [task * 10_000 + i for i in range(own)]


def test_a_new_session_shares_the_whole_blocks_its_prompt_has_in_common_with_an_open_one():
    index, adopted = SharedPrefixes(), {}
    assert index.open("a", prompt(1), adopted.__setitem__) is None  # the first of its kind: nothing shared yet
    share = index.open("b", prompt(2), adopted.__setitem__)
    assert share == Share(block_chain(SYSTEM)[-1], 3_200)  # 50 whole blocks of the 3,254 common tokens
    assert adopted == {"a": share}  # the first one holds that prefix too
    assert index.open("c", prompt(3), adopted.__setitem__) == share


def test_prompts_that_differ_in_their_first_block_share_nothing():
    index = SharedPrefixes()
    index.open("a", prompt(1), lambda *_: None)
    assert index.open("b", [7] + prompt(2)[1:], lambda *_: None) is None
    assert index.open("c", SYSTEM[: BLOCK_TOKENS - 1], lambda *_: None) is None  # no whole block


def test_a_closed_session_no_longer_holds_its_prefix():
    index = SharedPrefixes()
    index.open("a", prompt(1), lambda *_: None)
    index.close("a")
    assert index.open("b", prompt(2), lambda *_: None) is None and len(index) == 1


def test_only_the_head_of_a_long_prompt_is_indexed():
    assert len(block_chain(list(range(200_000)))) == MAX_INDEXED_TOKENS // BLOCK_TOKENS


def test_the_turn_cores_id_text_is_read_like_a_list():
    from sidecar.id_text import IdText

    assert block_chain(IdText(prompt(1))) == block_chain(prompt(1))
