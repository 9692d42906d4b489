"""Chat formatting in token space.

An agent's first prompt is rendered with the tokenizer's chat template. Every later prompt
of a tool loop is built by *appending ids*: the previous prompt ids, the completion ids
exactly as sampled, then the ids of the tool turn. The sampled completion is never decoded
and re-encoded, so the trainer sees exactly the tokens the policy produced (the reference
code's fault (1) in docs/design.md §1).
"""

from __future__ import annotations

from typing import Any

_SENTINEL = "\u2063MAPPA_SENTINEL\u2063"


class ChatFormat:
    """Renders prompts and tool turns for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_text = tokenizer.eos_token or ""

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def first_prompt(self, system: str, user: str) -> list[int]:
        """Ids of ``system`` + ``user`` messages followed by the assistant header."""
        text = self._render(
            [{"role": "system", "content": system}, {"role": "user", "content": user}], True
        )
        return self.encode(text)

    def tool_turn(self, content: str, completion_ended_with_stop: bool) -> list[int]:
        """Ids to append after a sampled completion to add a user turn and a new assistant header.

        Found by rendering a conversation whose assistant message is a sentinel and keeping
        what the template writes after it. If the completion already ended with the stop
        token (the usual case), the template's copy of it is dropped; a truncated completion
        gets it, so the context stays well-formed.
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
        if completion_ended_with_stop and self.eos_text and delta.startswith(self.eos_text):
            delta = delta[len(self.eos_text) :]
        return self.encode(delta)
