"""What Claude Code's requests carry, accepted as Anthropic documents it: ``system`` turns inside
``messages`` (its beta ``mid-conversation-system``), rendered where they stand as the chat template
renders a system message that is not the first; adaptive thinking, context management, effort,
metadata, ``cache_control`` and betas ignored; a role Anthropic does not know refused in the words
Claude Code looks for before it falls back."""

from __future__ import annotations

import anthropic
import pytest
from tool_agent import says, serve_sidecar

MODEL = "Qwen/Qwen3-8B"  # the stand-in's served model


@pytest.fixture
def agent(sglang_double_thread, qwen3_tokenizer_dir):
    with serve_sidecar(sglang_double_thread, qwen3_tokenizer_dir) as url:
        yield anthropic.Anthropic(base_url=url, api_key="none", max_retries=0), sglang_double_thread


def test_a_system_turn_inside_messages_is_rendered_where_it_stands(agent, qwen3_tokenizer):
    client, double = agent
    double.responder = says(qwen3_tokenizer, "first", "second")
    cached = {"type": "ephemeral"}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "list the files", "cache_control": cached}]},
        {"role": "system", "content": [{"type": "text", "text": "Agents: explore, plan."}]},
    ]
    extras = dict(
        thinking={"type": "adaptive", "display": "omitted"}, context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "high"}, metadata={"user_id": '{"device_id": "d", "session_id": "s"}'},
    )
    first = client.messages.create(
        model=MODEL, max_tokens=20, system=[{"type": "text", "text": "You are Claude Code.", "cache_control": cached}],
        messages=messages, extra_body=extras, extra_headers={"anthropic-beta": "mid-conversation-system-2026-04-07"},
    )
    assert first.content[0].text == "first"
    prompt = qwen3_tokenizer.decode(double.requests[0]["input_ids"])
    expected = qwen3_tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are Claude Code."}, {"role": "user", "content": "list the files"},
         {"role": "system", "content": "Agents: explore, plan."}], tokenize=False, add_generation_prompt=True)
    assert prompt == expected  # as the template renders it
    # the next turn continues the same session token-exactly, the system turn included
    messages += [{"role": "assistant", "content": "first"}, {"role": "user", "content": "go on"}]
    second = client.messages.create(model=MODEL, max_tokens=20, messages=messages, system="You are Claude Code.")
    assert second.content[0].text == "second"
    held = double.requests[0]["input_ids"] + double.results[0]["output_ids"]
    assert double.requests[1]["input_ids"][: len(held)] == held
    assert second.usage.cache_read_input_tokens >= len(held) - 1


def test_an_unknown_role_is_refused_in_the_words_claude_code_falls_back_on(agent):
    client, double = agent
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "developer", "content": "x"}])
    message = info.value.body["error"]["message"]
    assert "Unexpected role" in message and "input message role" in message
    assert double.requests == []
