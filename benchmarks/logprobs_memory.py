"""Peak CPU memory of the vocabulary-sized steps at long lengths, before and after chunking.

Each variant runs in its own subprocess on a random 2-layer Llama with a 32k vocabulary
(no download) and reports the growth of its peak RSS (``ru_maxrss``) over the setup:

- ``logprobs``: log-probs and entropies of a long completion, forward and backward.
  ``full`` is the previous code (every completion position's logits, one log_softmax, the
  entropy inside the graph); ``chunked`` is ``AgentPolicies.completion_logprobs``.
- ``prefill``: the first forward of generation over a prompt of the same total length
  (prompt + completion tokens): every position's logits (``all``, as before) against
  ``logits_to_keep=1`` (``last``).

    .venv/bin/python benchmarks/logprobs_memory.py [--prompt 1024] [--completion 4096]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from types import SimpleNamespace

VOCAB = 32_000
VARIANTS = ("logprobs-full", "logprobs-chunked", "prefill-all", "prefill-last")


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(variant: str, prompt: int, completion: int) -> float:
    """Run one variant in this process; return its peak RSS growth in MiB."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from mappa.config import LoraConfig
    from mappa.models.policies import AgentPolicies
    from mappa.models.tensors import left_pad

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=prompt + completion + 1,
    )
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    pol = AgentPolicies(LlamaForCausalLM(cfg), tok, ["agent"], LoraConfig())
    p_ids = torch.randint(2, VOCAB, (prompt,)).tolist()
    c_ids = torch.randint(2, VOCAB, (completion,)).tolist()
    ids, mask, pos = left_pad([p_ids + c_ids], 0, pol.device)
    before = peak_mib()

    if variant == "logprobs-full":  # the code before chunking, verbatim
        with pol.use("agent"):
            logits = pol.model(
                input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=completion + 1
            ).logits[:, :-1]
        dist = F.log_softmax(logits.float(), dim=-1)
        logp = dist.gather(-1, ids[:, -completion:, None]).squeeze(-1)
        entropy = -(dist.exp() * dist).sum(-1)
        (logp.sum() + 0 * entropy.sum()).backward()
    elif variant == "logprobs-chunked":
        logp, entropy = pol.completion_logprobs("agent", [p_ids], [c_ids], with_entropy=True)
        logp.sum().backward()
    else:
        with torch.no_grad(), pol.use("agent"):
            keep = 1 if variant == "prefill-last" else 0
            pol.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=keep,
            )
    return peak_mib() - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--completion", type=int, default=4096)
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        print(measure(args.variant, args.prompt, args.completion))
        return
    full_mib = args.completion * VOCAB * 4 / 2**20
    print(f"prompt {args.prompt}, completion {args.completion} tokens, vocab {VOCAB}")
    print(f"(one float32 completion x vocab tensor: {full_mib:.0f} MiB)\n")
    print(f"{'variant':<18}{'peak RSS growth (MiB)':>22}")
    for variant in VARIANTS:
        cmd = [sys.executable, __file__, "--variant", variant]
        cmd += ["--prompt", str(args.prompt), "--completion", str(args.completion)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        print(f"{variant:<18}{float(out.strip().splitlines()[-1]):>22.0f}")


if __name__ == "__main__":
    main()
