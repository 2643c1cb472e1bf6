"""``relax eval CHECKPOINT``: load a saved policy, evaluate it on the evaluation sets (or
``--env`` episodes) exactly as ``relax train --eval-interval`` does (relax/eval/sets.py), and
print the metrics as JSON.

    relax eval CHECKPOINT_DIR --eval-prompt-data gsm8k data/gsm8k/test.jsonl --rm-type math

The rollout backend samples (relax/rollout/backends/): Relax's engine on the loaded
checkpoint, or with ``--rollout-backend vllm`` a vLLM server (started on the checkpoint's
weights and stopped at the end, or named by ``--vllm-url``).
"""

from __future__ import annotations

import json
import os
import sys

import torch

from relax import models
from relax.cpu_threads import cpu_threads
from relax.errors import InputError, RelaxError
from relax.eval.evaluate import EvalSampling
from relax.eval.sets import EvalSet, evaluate_env, evaluate_sets, load_eval_sets
from relax.host_memory import set_mmap_threshold
from relax.precision import use_bf16
from relax.rollout.backends.open import open_eval_backend
from relax.rollout.backends.protocol import RolloutBackend
from relax.rollout.prompts.data import check_formatted_lengths


def run_eval_command(cfg) -> int:
    """``relax eval CHECKPOINT``: print the metrics as JSON; exit 0, or 2/1 on error."""
    set_mmap_threshold(cfg.system.host_mmap_threshold_kb)  # 0: glibc's own behaviour
    try:
        device = models.pick_device(cfg.system.device, 0)
        # before the model loads: a --vllm-url must answer, vLLM must be installed
        backend = open_eval_backend(cfg.rollout, device, checkpoint=cfg.checkpoint,
                                    run=cfg.run)
        try:
            models.quiet_transformers()
            tokenizer = models.load_tokenizer(cfg.checkpoint, "CHECKPOINT")
            if cfg.rollout.data.apply_chat_template and not getattr(tokenizer, "chat_template",
                                                                    None):
                raise InputError(f"--apply-chat-template: the tokenizer in {cfg.checkpoint} "
                                 "has no chat template; remove the flag or evaluate a chat model")
            model = models.load_policy(cfg.checkpoint, tokenizer, device, seed=cfg.run.seed).eval()
            if device.type == "cpu":  # OMP_NUM_THREADS when set, as relax train does
                torch.set_num_threads(cpu_threads())
            if cfg.rollout.episodes.env:
                metrics = evaluate_env(cfg.rollout, EvalSampling(cfg.evaluation, cfg.run.seed,
                                                                 cfg.system.bf16),
                                       model, tokenizer, device,
                                       make_sampler=_sampling(backend, model, cfg.system, tokenizer))
            else:  # the sets are checked before the backend starts (a vLLM server: minutes)
                sets = load_eval_sets(cfg.evaluation, cfg.rollout)
                check_set_lengths(sets, tokenizer, cfg.rollout.data, cfg.evaluation,
                                  context=getattr(model.config, "max_position_embeddings", None))
                metrics = evaluate_sets(cfg.evaluation, cfg.rollout, cfg.system, sets, model,
                                        tokenizer, device, seed=cfg.run.seed,
                                        make_sampler=_sampling(backend, model, cfg.system, tokenizer))
        finally:
            backend.close()
    except RelaxError as e:
        print(f"relax eval: error: {e}", file=sys.stderr)
        return e.exit_code
    text = json.dumps(metrics, indent=2, sort_keys=True)
    print(text)
    if cfg.run.output_dir:
        os.makedirs(cfg.run.output_dir, exist_ok=True)
        with open(os.path.join(cfg.run.output_dir, "eval_metrics.json"), "w",
                  encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


def _sampling(backend: RolloutBackend, model, system, tokenizer):
    """The backend started on the checkpoint's weights (``system``: ``cfg.system``, its
    --bf16), as the sampler factory of relax/eval/evaluate.py."""
    backend.start(model, bf16=use_bf16(system.bf16, next(model.parameters()).device))
    return lambda params, eos: backend.sampler(params, eos_token_ids=eos,
                                               pad_token_id=tokenizer.pad_token_id)


def check_set_lengths(sets: list[EvalSet], tokenizer, data, evaluation, *,
                      context: int | None) -> None:
    """Every prompt of the evaluation ``sets``, formatted as ``data`` (``cfg.rollout.data``)
    says, fits the model's ``context`` with ``evaluation``'s response length (InputError
    names the prompt)."""
    for eval_set in sets:
        check_formatted_lengths(
            tokenizer, eval_set.as_samples(), apply_chat_template=data.apply_chat_template,
            system_prompt=data.system_prompt, max_response=evaluation.eval_max_response_len,
            context=context, length_flag="--eval-max-response-len")
