"""Text helpers every layer may use."""

from __future__ import annotations

CUT_MARKER = "\n...[{n} chars cut]...\n"


def cut_middle(text: str, limit: int, marker: str = CUT_MARKER) -> str:
    """Keep the head and tail of ``text`` within ``limit`` chars, marking what was cut.

    Both ends matter to an agent: the head shows what the code did first, the tail holds
    the traceback or the final answer.
    """
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return text[:head] + marker.format(n=len(text) - limit) + text[-tail:]


def first_line(err: BaseException) -> str:
    """The first line of an exception's message ("" for none): a client library's error
    cut to what fits a one-line refusal (the rest is often a traceback or a URL dump).

    >>> first_line(ValueError("403 Forbidden\\nrequest id: x"))
    '403 Forbidden'
    >>> first_line(ConnectionError())
    ''
    """
    text = str(err).strip()
    return text.splitlines()[0] if text else ""
