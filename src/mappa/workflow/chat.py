"""Chat formatting in token space.

An agent's first prompt is rendered with the tokenizer's chat template. Every later prompt
of a tool loop is built by *appending ids*: the previous prompt ids, the completion ids
exactly as sampled, then the ids of the tool turn. The sampled completion is never decoded
and re-encoded, so the trainer sees exactly the tokens the policy produced (the reference
code's fault (1) in docs/design.md §1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_SENTINEL = "\u2063MAPPA_SENTINEL\u2063"


def plain_transcript(messages: Sequence[Mapping[str, str]]) -> str:
    """The messages an agent saw as plain text, each under a ``[role]`` header line.

    This is what the coach and the report read of an agent's input: the decoded prompt ids
    carry the policy's chat control tokens (ChatML's ``<|im_start|>system``), which the
    coach's own chat template would read as turn boundaries.

    >>> print(plain_transcript([{"role": "system", "content": "You solve."},
    ...                         {"role": "user", "content": "2+2?"}]))
    [system]
    You solve.
    <BLANKLINE>
    [user]
    2+2?
    """
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


class ChatFormat:
    """Renders prompts and tool turns for one tokenizer.

    Args:
        tokenizer: a tokenizer with a chat template.
        template_kwargs: extra variables every rendering passes to the template
            (``model.chat_template_kwargs``, e.g. Qwen3's ``enable_thinking``).
    """

    def __init__(self, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.eos_text = tokenizer.eos_token or ""
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.special_ids: set[int] = {i for i, t in added.items() if getattr(t, "special", False)}
        self.special_ids |= set(tokenizer.all_special_ids)

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def prompt(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Ids of a whole conversation followed by the assistant header (a workflow
        function's call: the messages it wrote, earlier replies among them as text)."""
        return self.encode(self._render([dict(m) for m in messages], True))

    def tool_turn(
        self,
        content: str,
        *,
        last_token: int | None = None,
    ) -> list[int]:
        """Ids to append after a sampled completion to add a user turn and a new assistant header.

        Found by rendering a conversation whose assistant message is a sentinel and keeping
        what the template writes after it. That text opens with the template's end-of-turn
        marker (ChatML's ``<|im_end|>``); it is dropped only when the completion's last token
        (``last_token``) *is* that marker, which the completion then already holds. A
        completion that stopped on another stop token (Qwen's ``<|endoftext|>``), was
        truncated, or is empty (``last_token=None``) gets the marker, so the next turn is
        well-formed either way.
        """
        messages = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _SENTINEL},
            {"role": "user", "content": content},
        ]
        text = self._render(messages, True)
        at = text.find(_SENTINEL)
        if at < 0:
            raise ValueError("chat template dropped the assistant message; cannot build tool turns")
        delta = text[at + len(_SENTINEL) :]
        marker = self._end_of_turn(delta)
        if marker is not None and last_token == marker[0]:
            delta = delta[len(marker[1]) :]
        return self.encode(delta)

    def _end_of_turn(self, delta: str) -> tuple[int, str] | None:
        """(id, text) of the special token the template writes right after an assistant
        message, or ``None`` when it writes none there."""
        ids = self.encode(delta)
        if not ids or ids[0] not in self.special_ids:
            return None
        marker = self.decode(ids[:1], skip_special=False)
        return (ids[0], marker) if delta.startswith(marker) else None
