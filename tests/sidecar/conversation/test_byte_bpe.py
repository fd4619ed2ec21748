"""The tiktoken fast path gives exactly the backend's ids, and is refused where that is not proven."""

import json
import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from sidecar.conversation.byte_bpe import TOTAL_PATTERNS, ByteLevelBPE, portable_pattern
from sidecar.conversation.chat_template import ChatRenderer
from sidecar.conversation.tokens import TokenCodec

QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# ASCII text the way tool results look, with the characters the pattern treats specially overweighted
ascii_text = st.lists(
    st.sampled_from(list(string.printable) + ["'s", "'T", "'ll", "  ", "\n\n", " \n", "\r\n", "<|im_end|>", "<tool_call>", "<|im_"]),
    max_size=200,
).map("".join)


@pytest.fixture(scope="module")
def codec(qwen3_tokenizer):
    return TokenCodec(qwen3_tokenizer)


def _reference(tokenizer, text):
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_the_qwen3_tokenizer_gets_the_fast_path(codec):
    assert codec._fast is not None


@settings(max_examples=300, deadline=None)
@given(text=ascii_text)
def test_ascii_text_gets_the_backends_ids(codec, qwen3_tokenizer, text):
    assert codec.encode(text) == _reference(qwen3_tokenizer, text)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_gets_the_backends_ids(codec, qwen3_tokenizer, text):
    """Pieces with non-ASCII characters go to the backend alone; the ids are still the whole text's."""
    assert codec.encode(text) == _reference(qwen3_tokenizer, text)


@pytest.mark.parametrize("text", [
    "a" * 20_000,  # one long piece of ties
    "ab" * 5_000 + " " * 3_000 + "\n" * 500 + "1234567890" * 300,
    "x" * 300 + "é" + "y" * 300 + "<|im_end|>" + "z" * 300,  # one piece to the backend, the others fast
    "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    "<|im_end|><|im_end|>", "<|im_", "",
])
def test_long_pieces_and_added_tokens(codec, qwen3_tokenizer, text):
    assert codec.encode(text) == _reference(qwen3_tokenizer, text)


def test_whole_renders_and_continuing_suffixes_keep_their_ids(qwen3_tokenizer):
    """What the engine gets, for a new session (whole render) and for each continuing turn (the
    suffix after the previous reply), is the same with the fast path as through the backend."""
    fast, slow = ChatRenderer(qwen3_tokenizer), ChatRenderer(qwen3_tokenizer)
    slow.codec._fast = None
    assert fast.codec._fast is not None
    rng = random.Random(7)
    words = ["def", "test_api", "assert", "==", "None", "  ", "\n", "FAILED", "tests/test_x.py::t", "(1, 2)", "'quoted'", "naïve"]
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."}]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
    for turn in range(4):
        reply = {"role": "assistant", "content": f"Step {turn}.", "tool_calls": [
            {"id": f"c{turn}", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "pytest -x"}'}}]}
        tool = {"role": "tool", "tool_call_id": f"c{turn}", "content": " ".join(rng.choice(words) for _ in range(300))}
        messages += [reply, tool]
        assert fast.render_suffix([tool], 151645, tools) == slow.render_suffix([tool], 151645, tools)
        assert fast.render_full(messages, tools) == slow.render_full(messages, tools)
        whole = qwen3_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        assert fast.render_full(messages, tools) == _reference(qwen3_tokenizer, whole)


def test_tokens_added_later_send_the_codec_back_to_the_backend(qwen3_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))  # a private copy: tokens are added to it
    codec = TokenCodec(tok)
    assert codec._fast is not None
    tok.add_tokens(["zzword"])
    assert codec.encode("a zzword b") == _reference(tok, "a zzword b")


# --------------------------------------------------------------------------- a toy byte-level BPE

CORPUS = ["def test_api(self):\n    assert resp.status == 200\n", "it's the user's file; they'll see\n",
          "FAILED tests/test_x.py::test_y - AssertionError\n", "    return x ** 2  # square\n"] * 50


def _toy(pattern=QWEN_PATTERN, normalizer=None):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        special_tokens=["<|im_end|>"], show_progress=False))
    return tok


def _edited(tok, edit):
    config = json.loads(tok.to_str())
    edit(config)
    return Tokenizer.from_str(json.dumps(config))


@pytest.mark.parametrize("pattern", [QWEN_PATTERN, LLAMA3_PATTERN])
def test_a_toy_tokenizer_gets_the_fast_path_and_its_ids(pattern):
    tok = _toy(pattern, normalizers.NFC())
    fast = ByteLevelBPE.build(tok)
    assert fast is not None
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice(CORPUS[rng.randrange(4)]) for _ in range(rng.randrange(200)))
        text += rng.choice(["", "<|im_end|>", " 12345 ", "  \n\n", "ü"]) + rng.choice(CORPUS)
        assert fast.encode(text) == tok.encode(text, add_special_tokens=False).ids


def _swap_two_merges(config):
    merges = config["model"]["merges"]
    merges[10], merges[11] = merges[11], merges[10]


def _lstrip_added(config):
    config["added_tokens"][0]["lstrip"] = True


@pytest.mark.parametrize("edit", [
    _swap_two_merges,  # merges out of the order of the ids they make
    _lstrip_added,  # an added token that eats the spaces before it
    lambda c: c.update(normalizer={"type": "Lowercase"}),  # a normalizer that changes ASCII
    lambda c: c["pre_tokenizer"]["pretokenizers"][0].update(pattern={"Regex": "^" + QWEN_PATTERN}),  # Ruby's ^ is a line start
    lambda c: c["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True),
    lambda c: c["model"].update(dropout=0.1),
    lambda c: c["model"]["merges"].pop(),  # a token no merge makes
])
def test_a_tokenizer_that_may_differ_gets_no_fast_path(edit):
    assert ByteLevelBPE.build(_toy()) is not None  # the unedited toy does
    assert ByteLevelBPE.build(_edited(_toy(), edit)) is None


@pytest.mark.parametrize("pattern, portable", [
    (QWEN_PATTERN, True),
    (LLAMA3_PATTERN, True),
    (r"\p{L}+|\s+(?=\S)|[a-z\-]+", True),
    (r"^\w+", False),  # anchors mean lines in Oniguruma's Ruby syntax
    (r"\w+$", False),
    (r"a.b", False),
    (r"\bword", False),
    (r"a++", False),  # possessive
    (r"[[a-z]&&[^q]]", False),  # nested classes / set operations
    (r"(?<name>a)", False),
    (r"(?m)a", False),
    (r"\x41", False),
])
def test_portable_patterns(pattern, portable):
    assert portable_pattern(pattern) is portable


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(max_codepoint=127), max_size=120))
def test_the_patterns_trusted_to_cover_ascii_text_do(text):
    """TOTAL_PATTERNS skip the check that tiktoken's ids cover the text: their matches, found
    one after another as tiktoken finds them, leave no character out and are never empty."""
    import regex

    for pattern in TOTAL_PATTERNS:
        matches = [m.group() for m in regex.finditer(pattern, text)]
        assert all(matches) and "".join(matches) == text


def test_the_qwen3_fast_path_trusts_its_pattern(codec):
    assert QWEN_PATTERN in TOTAL_PATTERNS and LLAMA3_PATTERN in TOTAL_PATTERNS
    assert codec._fast._total
