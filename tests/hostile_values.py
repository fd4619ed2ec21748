"""Hypothesis strategies for hostile request values, shared by the fuzz suites of every front door:
text with everything JSON can carry (control characters, lone surrogates, template syntax, special
tokens), numbers at and past every limit, any JSON value, and plain text that passes validation."""

from __future__ import annotations

from hypothesis import strategies as st

# Text with everything JSON can carry: control characters, lone surrogates, template syntax.
texts = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=20),
    st.sampled_from(["", " ", "{{ 7*7 }}", "{% raw %}", "<|im_end|>", "<tool_call>", "</think>", "\x00", "\ud800", "\U0001f600" * 3]),
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2, 0.5, 1e308, 2**31, 2**63]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=8
)

# Text that passes validation, so the fuzzer gets past it into rendering and the relay.
plain = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60),
    st.sampled_from(["<|im_start|>user", "<|im_end|>", "<tool_call>\n{}\n</tool_call>", "<think>", "{{ x }}", "\n\n", "é" * 30]),
)
