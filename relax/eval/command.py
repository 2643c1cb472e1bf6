"""``relax eval CHECKPOINT``: load a saved policy, evaluate it on the evaluation sets (or
``--env`` episodes) exactly as ``relax train --eval-interval`` does (relax/eval/hook.py), and
print the metrics as JSON.

    relax eval CHECKPOINT_DIR --eval-prompt-data gsm8k data/gsm8k/test.jsonl --rm-type math
"""

from __future__ import annotations

import json
import os
import sys

import torch

from relax import models
from relax.errors import InputError, RelaxError
from relax.eval.hook import EvalSet, evaluate_env, evaluate_sets, load_eval_sets
from relax.host_memory import set_mmap_threshold
from relax.rollout.data import check_formatted_lengths


def run_eval_command(cfg) -> int:
    """``relax eval CHECKPOINT``: print the metrics as JSON; exit 0, or 2/1 on error."""
    set_mmap_threshold(cfg.host_mmap_threshold_kb)  # 0: glibc's own behaviour
    try:
        device = models.pick_device(cfg.device, 0)
        models.quiet_transformers()
        tokenizer = models.load_tokenizer(cfg.checkpoint, "CHECKPOINT")
        if cfg.apply_chat_template and not getattr(tokenizer, "chat_template", None):
            raise InputError(f"--apply-chat-template: the tokenizer in {cfg.checkpoint} has no "
                             "chat template; remove the flag or evaluate a chat model")
        model = models.load_policy(cfg.checkpoint, tokenizer, device, seed=cfg.seed).eval()
        if device.type == "cpu":
            torch.set_num_threads(os.cpu_count() or 1)
        if cfg.env:
            metrics = evaluate_env(cfg, model, tokenizer, device)
        else:
            metrics = evaluate_sets(cfg, _checked_sets(cfg, model, tokenizer), model,
                                    tokenizer, device)
    except RelaxError as e:
        print(f"relax eval: error: {e}", file=sys.stderr)
        return e.exit_code
    text = json.dumps(metrics, indent=2, sort_keys=True)
    print(text)
    if cfg.output_dir:
        os.makedirs(cfg.output_dir, exist_ok=True)
        with open(os.path.join(cfg.output_dir, "eval_metrics.json"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


def _checked_sets(cfg, model, tokenizer) -> list[EvalSet]:
    """The evaluation sets, every prompt checked to fit the model's context with the
    response length (InputError names the prompt)."""
    sets = load_eval_sets(cfg)
    for eval_set in sets:
        check_formatted_lengths(
            tokenizer, eval_set.as_samples(), apply_chat_template=cfg.apply_chat_template,
            system_prompt=cfg.system_prompt, max_response=cfg.eval_max_response_len,
            context=getattr(model.config, "max_position_embeddings", None),
            length_flag="--eval-max-response-len")
    return sets
