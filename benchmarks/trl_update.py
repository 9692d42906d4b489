"""TRL's GRPOTrainer update throughput on the demo's model, LoRA and batch (P3's baseline).

Runs inside a throwaway venv that has TRL (``benchmarks/run.py`` makes it; TRL is never a
dependency of mappa) and imports nothing of mappa. Settings are those of mappa's side: the
weights in the spec's dtype, and with bfloat16 weights the forward autocast to bfloat16
(as mappa's ``model.dtype: bfloat16`` computes; PEFT keeps the LoRA weights in float32 on
both sides), no gradient checkpointing (TRL's default is on), LoRA on the attention
projections, one update per batch (``num_iterations=1``), a KL penalty
against the adapter-less reference (``beta``). The update time of a step is its wall time
minus generation; its tokens are the completion tokens trained. Prints one JSON line.

    <venv>/bin/python benchmarks/trl_update.py SPEC.json
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from typing import Any


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[import-not-found]  # its own venv

    gen_s: list[float] = []
    gen_tokens: list[int] = []
    step_s: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            step_s.append(time.perf_counter() - self.start)

    rng = random.Random(0)

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [rng.random() for _ in completions]  # any varied reward: only speed counts

    batch = spec["prompts_per_step"] * spec["samples_per_prompt"]
    data = Dataset.from_list([{"prompt": spec["conversation"]}] * (batch * (spec["steps"] + 1)))
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=batch,
            num_generations=spec["samples_per_prompt"],
            max_completion_length=spec["max_new_tokens"],
            temperature=spec["temperature"],
            learning_rate=spec["lr"],
            beta=spec["kl_beta"],
            num_iterations=1,
            max_steps=spec["steps"],
            bf16=spec["dtype"] == "bfloat16",  # autocast, as mappa's half-precision forward
            model_init_kwargs={"dtype": spec["dtype"]},
            gradient_checkpointing=False,
            use_cpu=True,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            seed=0,
        )
        lora = LoraConfig(
            r=spec["lora_r"],
            lora_alpha=spec["lora_alpha"],
            target_modules=spec["target_modules"],
            task_type="CAUSAL_LM",
        )
        trainer = GRPOTrainer(
            model=spec["model_dir"],
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            peft_config=lora,
            callbacks=[StepTimer()],
        )
        generate = trainer._generate

        def timed_generate(prompts: list[Any]) -> Any:
            start = time.perf_counter()
            out_ = generate(prompts)
            gen_s.append(time.perf_counter() - start)
            gen_tokens.append(sum(len(c) for c in out_[1]))
            return out_

        trainer._generate = timed_generate
        trainer.train()
    update_s = [s - g for s, g in zip(step_s, gen_s, strict=True)][1:]  # the first warms up
    tokens = gen_tokens[1:]
    print(
        json.dumps(
            {
                "steps": len(update_s),
                "update_s": sum(update_s) / len(update_s),
                "tokens": sum(tokens) / len(tokens),
                "tok_s": sum(tokens) / sum(update_s),
            }
        )
    )


if __name__ == "__main__":
    main()
