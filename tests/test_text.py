"""cut_middle: what an agent and the coach see of a long tool output."""

from __future__ import annotations

from mappa.text import cut_middle


def test_short_text_is_kept_whole() -> None:
    assert cut_middle("short", 10) == "short" and cut_middle("0123456789", 10) == "0123456789"


def test_long_text_keeps_head_and_tail_and_says_how_much_went() -> None:
    text = "A" * 50 + "B" * 100 + "Z" * 50
    out = cut_middle(text, 20)
    assert out == "A" * 10 + "\n...[180 chars cut]...\n" + "Z" * 10
    assert cut_middle(text, 21).endswith("Z" * 11)  # an odd limit: the tail takes the extra


def test_a_custom_marker() -> None:
    assert cut_middle("abcdef", 2, marker="<{n}>") == "a<4>f"
