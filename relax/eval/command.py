"""``relax eval CHECKPOINT``: load a saved policy, evaluate it on the evaluation sets (or
``--env`` episodes) exactly as ``relax train --eval-interval`` does (relax/eval/sets.py), and
print the metrics as JSON.

    relax eval CHECKPOINT_DIR --eval-prompt-data gsm8k data/gsm8k/test.jsonl --rm-type math

With ``--rollout-backend vllm`` a vLLM server samples (started on the checkpoint's weights
and stopped at the end, or named by ``--vllm-url``; relax/rollout/backends/vllm/vllm_backend.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import torch

from relax import models
from relax.cpu_threads import cpu_threads
from relax.errors import InputError, RelaxError
from relax.eval.sets import EvalSet, evaluate_env, evaluate_sets, load_eval_sets
from relax.host_memory import set_mmap_threshold
from relax.precision import use_bf16
from relax.rollout.prompts.data import check_formatted_lengths
from relax.rollout.backends.vllm.vllm_backend import VllmBackend, VllmSettings


def run_eval_command(cfg) -> int:
    """``relax eval CHECKPOINT``: print the metrics as JSON; exit 0, or 2/1 on error."""
    set_mmap_threshold(cfg.system.host_mmap_threshold_kb)  # 0: glibc's own behaviour
    vllm = scratch = None
    try:
        device = models.pick_device(cfg.system.device, 0)
        if cfg.rollout.backend.name == "vllm":  # before the model loads: the URL, the install
            scratch = None if cfg.run.output_dir else tempfile.mkdtemp(prefix="relax-eval-vllm-")
            vllm = VllmBackend.open(VllmSettings.of_eval(cfg, cfg.run.output_dir or scratch), 0,
                                    device)
        models.quiet_transformers()
        tokenizer = models.load_tokenizer(cfg.checkpoint, "CHECKPOINT")
        if cfg.rollout.data.apply_chat_template and not getattr(tokenizer, "chat_template", None):
            raise InputError(f"--apply-chat-template: the tokenizer in {cfg.checkpoint} has no "
                             "chat template; remove the flag or evaluate a chat model")
        model = models.load_policy(cfg.checkpoint, tokenizer, device, seed=cfg.run.seed).eval()
        if device.type == "cpu":  # OMP_NUM_THREADS when set, as relax train does
            torch.set_num_threads(cpu_threads())
        if cfg.rollout.episodes.env:
            metrics = evaluate_env(cfg, model, tokenizer, device,
                                   make_sampler=_vllm_sampler(vllm, model, cfg, tokenizer))
        else:
            metrics = evaluate_sets(cfg, _checked_sets(cfg, model, tokenizer), model,
                                    tokenizer, device,
                                    make_sampler=_vllm_sampler(vllm, model, cfg, tokenizer))
    except RelaxError as e:
        print(f"relax eval: error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        if vllm is not None:
            vllm.close()
            shutil.rmtree(vllm.sync.folder, ignore_errors=True)  # a copy of the checkpoint
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    text = json.dumps(metrics, indent=2, sort_keys=True)
    print(text)
    if cfg.run.output_dir:
        os.makedirs(cfg.run.output_dir, exist_ok=True)
        with open(os.path.join(cfg.run.output_dir, "eval_metrics.json"), "w",
                  encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


def _vllm_sampler(vllm, model, cfg, tokenizer):
    """``--rollout-backend vllm``: the server on the checkpoint's weights, as a sampler
    factory for relax/eval/evaluate.py (None: the model's own sampler)."""
    if vllm is None:
        return None
    vllm.start(model, bf16=use_bf16(cfg.system.bf16, next(model.parameters()).device))
    return lambda params, eos: vllm.sampler(params, eos_token_ids=eos,
                                            pad_token_id=tokenizer.pad_token_id)


def _checked_sets(cfg, model, tokenizer) -> list[EvalSet]:
    """The evaluation sets, every prompt checked to fit the model's context with the
    response length (InputError names the prompt)."""
    sets = load_eval_sets(cfg)
    for eval_set in sets:
        check_formatted_lengths(
            tokenizer, eval_set.as_samples(), apply_chat_template=cfg.rollout.data.apply_chat_template,
            system_prompt=cfg.rollout.data.system_prompt, max_response=cfg.evaluation.max_response_len,
            context=getattr(model.config, "max_position_embeddings", None),
            length_flag="--eval-max-response-len")
    return sets
