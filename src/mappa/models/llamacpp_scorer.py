"""The local coach's score distribution from a GGUF model run in process by llama.cpp.

On a CPU a quantized GGUF coach reads a prompt several times faster than the same model in
float32 transformers, and in process the distribution over 0..10 is read straight from the
logits where the score's digit goes: no text is generated, and no server computes
``top_logprobs`` over the whole vocabulary for every token it writes. Prompts are scored in
sorted order, so each reuses the KV cache of the tokens it shares with the one before (the
coach's system text, and the task and earlier agents' outputs of the same episode); P("0")
after "1", which splits off the mass of "10", costs one decode step.

Which tokens spell a score, and where it is read, come from ``mappa.models.score_tokens``
(the same rule as the transformers and vLLM scorers). Needs ``llama-cpp-python`` (the
``coach-server`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mappa.models.score_tokens import ScoreTokens, read_position_ids, score_tokens_from, split_ten


def _softmax_at(logits: Any, ids: Sequence[int]) -> list[float]:
    """P(each of ``ids``) under the softmax of ``logits`` over the whole vocabulary."""
    import numpy as np

    top = float(logits.max())
    log_z = top + math.log(float(np.exp(logits - top).sum()))
    return [math.exp(float(logits[i]) - log_z) for i in ids]


class LlamaCppScoreDistribution:
    """Implements ``mappa.coach.local.ScoreDistribution`` over a GGUF file."""

    def __init__(
        self, gguf: Path, n_ctx: int = 4096, threads: int = 2, reply_tokens: int = 0
    ) -> None:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as err:  # pragma: no cover - the extra is missing
            raise ImportError(
                "coach.local.engine: llamacpp needs llama-cpp-python: run "
                "`make install-coach-server` (pip install -e '.[coach-server]')"
            ) from err
        self.llm = Llama(
            model_path=str(gguf),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=False,
            verbose=False,
        )
        meta = self.llm.metadata
        template = meta.get("tokenizer.chat_template")
        if not template:
            raise ValueError(f"{gguf}: the GGUF has no chat template to render the coach's prompt")
        self.chat = Jinja2ChatFormatter(
            template=template,
            eos_token=self._piece(self.llm.token_eos()),
            bos_token=self._piece(self.llm.token_bos()),
        )
        self.n_ctx = n_ctx
        self.reply_tokens = reply_tokens
        self.replies: list[str] = []
        """What the coach wrote before its score in the last call (``reply_tokens`` > 0)."""
        self._tokens: dict[str, ScoreTokens] = {}

    def _piece(self, token: int) -> str:
        if token < 0:
            return ""
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    def _encode(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def tokens(self, prefix: str) -> ScoreTokens:
        """The score's tokens after ``prefix`` (the vocabulary is scanned once per prefix)."""
        if prefix not in self._tokens:
            pieces = ((i, self._piece(i)) for i in range(self.llm.n_vocab()))
            self._tokens[prefix] = score_tokens_from(pieces, self._encode, prefix)
        return self._tokens[prefix]

    def prompt_ids(self, conversation: list[dict[str, str]], prefix: str) -> tuple[list[int], str]:
        """The chat-templated conversation, opened as the assistant's turn and continued
        with ``prefix`` up to where the score's digit goes; with ``reply_tokens``, what the
        coach writes first (greedy, up to the prefix's last line: its facts or analysis)
        takes the place of the prefix's earlier lines. Also returns that reply."""
        messages: Any = conversation  # llama_cpp types messages as its own TypedDicts
        text = self.chat(messages=messages).prompt
        tag = prefix.rsplit("\n", 1)[-1]
        reply = ""
        if self.reply_tokens:
            reply = self._write(self._encode(text), tag)
            prefix = reply + tag
        ids = read_position_ids(self._encode(text + f"{prefix} 0"), self.tokens(tag))
        return ids, reply

    def _write(self, ids: list[int], tag: str) -> str:
        """Greedy text after ``ids`` until ``tag`` begins, the end of the turn, or
        ``reply_tokens`` tokens; the text before the tag."""
        text = self._generate(ids, self.reply_tokens, tag)
        cut = text.find(tag)
        return text[:cut] if cut >= 0 else text.rstrip() + "\n"

    def _generate(self, ids: list[int], max_tokens: int, stop: str | None = None) -> str:
        """Greedy text after ``ids`` until the end of the turn, ``max_tokens`` tokens, or
        (with ``stop``) the text holds ``stop``."""
        out: list[int] = []
        text = ""
        for token in self.llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            if self._end_of_turn(token) or len(out) >= max_tokens:
                break
            out.append(token)
            text = self.llm.detokenize(out).decode("utf-8", errors="replace")
            if stop is not None and stop in text:
                break
        return text

    def write(self, conversations: Sequence[list[dict[str, str]]], max_tokens: int) -> list[str]:
        """The coach's greedy reply to each conversation, ``max_tokens`` at most, one after
        the other (the ``mappa.coach.self_solve.Writer`` the self-solving coach uses)."""
        messages: list[Any] = list(conversations)
        return [
            self._generate(self._encode(self.chat(messages=m).prompt), max_tokens) for m in messages
        ]

    def _end_of_turn(self, token: int) -> bool:
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token))

    def _logits_after(self, ids: Sequence[int]) -> Any:
        """The next-token logits after ``ids``, evaluating only what the cache lacks."""
        import numpy as np

        cached = self.llm.input_ids[: self.llm.n_tokens]
        keep = 0
        for a, b in zip(cached, ids[:-1], strict=False):  # at least one token is evaluated
            if a != b:
                break
            keep += 1
        self.llm.n_tokens = keep
        self.llm.eval(list(ids[keep:]))
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))

    def __call__(
        self, conversations: Sequence[list[dict[str, str]]], prefix: str
    ) -> list[list[float]]:
        tokens = self.tokens(prefix.rsplit("\n", 1)[-1])
        prompts = [self.prompt_ids(c, prefix) for c in conversations]
        seqs = [ids for ids, _ in prompts]
        self.replies = [reply for _, reply in prompts]
        longest = max(map(len, seqs), default=0)
        if longest + 1 > self.n_ctx:
            raise ValueError(
                f"a coach prompt of {longest} tokens does not fit the llama.cpp context of "
                f"{self.n_ctx}: raise coach.local.context_tokens or lower "
                "coach.observation_chars"
            )
        result: list[list[float]] = [[] for _ in seqs]
        ones = list(tokens.scores[1])
        for i in tqdm(sorted(range(len(seqs)), key=seqs.__getitem__), desc="coach", leave=False):
            logits = self._logits_after(seqs[i])
            spelled = [sum(_softmax_at(logits, ids)) for ids in tokens.scores]
            p_ones = _softmax_at(logits, ones)
            best = ones[max(range(len(ones)), key=p_ones.__getitem__)]
            p_zero = sum(_softmax_at(self._logits_after([*seqs[i], best]), tokens.zeros))
            result[i] = split_ten(spelled, p_zero)
        return result
