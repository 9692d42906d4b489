"""The shipped CPU coach, four ways, on the same labelled cases, one after another in one
run: what an expected score costs next to the written one, and on which engine.

- ``http-written``: llama-cpp-python's OpenAI server (`mappa coach-serve`), the score the
  coach writes (``coach.http.score_mode: sample``, 24 tokens at most);
- ``http-expected``: the same server asked for ``top_logprobs`` at every token it writes
  (``score_mode: expected``);
- ``llamacpp``: ``coach.local.engine: llamacpp``, the distribution over 0..10
  read from the logits where the score's digit goes, nothing written; prompts one after
  another, each reusing the KV cache of what it shares with the one before;
- ``hf``: ``coach.local.engine: hf``, the same distribution from transformers over
  the GGUF dequantized once, in the config's ``model.dtype`` (bfloat16 on a CPU with it),
  the shared prefix computed once and the rest batched.

Each row is one `mappa coach-check --cases` (the config's template and reference scope) with
the score cache off; the table shows seconds per action and the pairs ranked right. Run it
alone: two CPU jobs at once slow each other many times over.

    .venv/bin/python benchmarks/coach_speed.py [--cases benchmarks/data/coach_cases_dev.jsonl]
        [--way hf --way llamacpp] [config overrides for every row, e.g. coach.self_solve=false]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MODEL = "pypi:qwen2.5-coder-1.5b-instruct"
HTTP = [
    "coach.backend=http",
    "coach.http.max_tokens=24",
    "coach.http.concurrency=1",  # the Python server takes one request at a time
    "coach.http.timeout_s=300",
]
WAYS: dict[str, list[str]] = {
    "http-written": [*HTTP, "coach.http.score_mode=sample"],
    "http-expected": [*HTTP, "coach.http.score_mode=expected"],
    "llamacpp": ["coach.backend=local", "coach.local.engine=llamacpp"],
    "hf": ["coach.backend=local", "coach.local.engine=hf"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/mathchat_qwen_cpu.yaml")
    parser.add_argument("--cases", default="benchmarks/data/coach_cases_dev.jsonl")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--way", action="append", choices=list(WAYS), help="a row to run (repeat; default all)"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides for every row")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for way in args.way or list(WAYS):
            overrides = [*args.overrides, *WAYS[way]]
            out = Path(tmp) / "check.json"
            command = [
                sys.executable, "-m", "mappa.cli", "coach-check", "--config", args.config,
                "--cases", args.cases, "--json", str(out), "coach.cache.mode=off",
                f"coach.local.model_path={MODEL}", *overrides,
            ]  # fmt: skip
            if way.startswith("http"):
                command += ["--serve", f"llamacpp:{MODEL}", "--threads", str(args.threads)]
            print(f"{way}: {' '.join(command[3:])}", flush=True)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            result = json.loads(out.read_text())
            rows.append((way, result))
    print(f"\n{args.cases}, {args.config} {' '.join(args.overrides)}")
    print(f"{'way':<22}{'s/action':>10}{'pairs right':>13}{'flagged':>9}{'digit mass':>12}")
    for way, r in rows:
        mass = "-" if r.get("digit_mass") is None else f"{r['digit_mass']:.3f}"
        print(
            f"{way:<22}{r['seconds_per_action']:>10.2f}{r['overall']:>13.0%}"
            f"{r['flagged']:>9}{mass:>12}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
