"""Tool turns in token space with a real tokenizer (the tiny model's: ChatML, eos
``<|im_end|>``, pad ``<|endoftext|>``): whatever token a completion stopped on, the next
turn is exactly what the chat template writes for that conversation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from mappa.workflow.chat import ChatFormat
from mappa.workflow.team import chat_messages

TURN = "Code output:\n17"
NEXT = f"\n<|im_start|>user\n{TURN}<|im_end|>\n<|im_start|>assistant\n"


def _tokenizer(model_dir: Path, **kwargs: Any) -> Any:
    return AutoTokenizer.from_pretrained(str(model_dir), **kwargs)


def _rendered(chat: ChatFormat, assistant: str) -> list[int]:
    """The template's own rendering of the whole conversation (the well-formed reference)."""
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": assistant},
        {"role": "user", "content": TURN},
    ]
    text = chat.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return chat.encode(text)


@pytest.fixture
def chat(tiny_model_dir: Path) -> ChatFormat:
    return ChatFormat(_tokenizer(tiny_model_dir))


def ids_of(chat: ChatFormat, token: str) -> int:
    return int(chat.tokenizer.convert_tokens_to_ids(token))


def test_completion_ending_in_the_end_of_turn_token_is_not_closed_twice(chat: ChatFormat) -> None:
    im_end = ids_of(chat, "<|im_end|>")
    completion = [*chat.encode("hello"), im_end]
    turn = chat.tool_turn(TURN, last_token=im_end)
    assert chat.decode(turn, skip_special=False) == NEXT
    full = chat.prompt(chat_messages("sys", "q")) + completion + turn
    assert full == _rendered(chat, "hello")


def test_completion_ending_in_another_stop_token_still_gets_the_end_of_turn(
    chat: ChatFormat,
) -> None:
    eot = ids_of(chat, "<|endoftext|>")
    assert eot != chat.tokenizer.eos_token_id
    completion = [*chat.encode("hello"), eot]
    turn = chat.tool_turn(TURN, last_token=eot)
    assert chat.decode(turn, skip_special=False) == "<|im_end|>" + NEXT
    assert turn[0] == ids_of(chat, "<|im_end|>")
    full = chat.prompt(chat_messages("sys", "q")) + completion + turn
    assert full == _rendered(chat, "hello<|endoftext|>")


@pytest.mark.parametrize("last", ["o", None])
def test_truncated_or_empty_completion_gets_the_end_of_turn(
    chat: ChatFormat, last: str | None
) -> None:
    last_token = chat.encode(last)[-1] if last else None
    turn = chat.tool_turn(TURN, last_token=last_token)
    assert chat.decode(turn, skip_special=False) == "<|im_end|>" + NEXT
    full = chat.prompt(chat_messages("sys", "q")) + chat.encode("hello") + turn
    assert full == _rendered(chat, "hello")


def test_end_of_turn_marker_need_not_be_the_tokenizer_eos(tiny_model_dir: Path) -> None:
    """A base model's tokenizer (Qwen base: eos <|endoftext|>) with a ChatML template: the
    marker is what the template writes, <|im_end|>, not the eos."""
    chat = ChatFormat(_tokenizer(tiny_model_dir, eos_token="<|endoftext|>"))
    im_end, eot = ids_of(chat, "<|im_end|>"), ids_of(chat, "<|endoftext|>")
    assert chat.tokenizer.eos_token_id == eot
    assert chat.decode(chat.tool_turn(TURN, last_token=im_end), skip_special=False) == NEXT
    assert chat.decode(chat.tool_turn(TURN, last_token=eot), skip_special=False) == (
        "<|im_end|>" + NEXT
    )


def test_plain_text_after_the_assistant_message_is_never_dropped(tiny_model_dir: Path) -> None:
    """A template that ends a turn with plain text ("\\n") keeps it even if the completion
    happens to end with that token: only a special end-of-turn token is ever deduplicated."""
    tok = _tokenizer(tiny_model_dir)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    chat = ChatFormat(tok)
    newline = chat.encode("\n")[-1]
    assert chat.decode(chat.tool_turn(TURN, last_token=newline)) == f"\nuser: {TURN}\nassistant: "


FAKE_THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
"""A fake of Qwen3's switch (no Qwen3 tokenizer ships here): its generation prompt, which
with ``enable_thinking`` false closes an empty thinking block so the model opens none."""


def test_template_kwargs_turn_thinking_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``model.chat_template_kwargs`` reaches the template: with Qwen3's switch off the
    prompt ends in a closed, empty thinking block; without it, at the assistant header."""
    from conftest import tiny_run_config

    from mappa.run.build import make_runner

    tok = _tokenizer(tiny_model_dir)
    tok.chat_template = FAKE_THINKING_TEMPLATE
    on = ChatFormat(tok).decode(
        ChatFormat(tok).prompt(chat_messages("sys", "q")), skip_special=False
    )
    off_chat = ChatFormat(tok, {"enable_thinking": False})
    off = off_chat.decode(off_chat.prompt(chat_messages("sys", "q")), skip_special=False)
    assert on.endswith("<|im_start|>assistant\n") and "<think>" not in on
    assert off == on + "<think>\n\n</think>\n\n"
    cfg = tiny_run_config(
        tiny_model_dir, tmp_path / "run", "model.chat_template_kwargs={enable_thinking: false}"
    )
    runner = make_runner(cfg, None, tok, tmp_path)  # type: ignore[arg-type]
    try:
        rendered = runner.chat.prompt(chat_messages("sys", "q"))
    finally:
        runner.close()
    assert runner.chat.decode(rendered, skip_special=False) == off
