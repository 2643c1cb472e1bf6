"""The generative judge of ``--rm-type genrm`` (relax/rollout/reward/genrm.py), loaded next to the
policy: its tokenizer and frozen model from ``--genrm-model-path``, the template file or the
default. Every load failure is an :class:`~relax.errors.InputError` naming the flag (exit 2),
before the policy is loaded."""

from __future__ import annotations

import torch

from relax import models
from relax.config.judge_template import DEFAULT_TEMPLATE, read_template
from relax.errors import InputError
from relax.rollout.prompts.data import format_prompt
from relax.rollout.reward.genrm import GenerativeJudge

FLAG = "--genrm-model-path"


def build_judge(rewards, device: torch.device, *, bf16: bool,
                pass_layout: str = "shared-prefix") -> GenerativeJudge | None:
    """The judge of the rewards section (``cfg.rollout.rewards``), or None without one;
    with ``pass_layout`` (``--pass-layout``) "shared-prefix" the judging prompts of a prompt's
    samples prefill their common beginning once, with the others each whole."""
    if rewards.rm_type != "genrm":
        return None
    path = rewards.genrm_model_path
    models.quiet_transformers()
    tokenizer = models.load_tokenizer(path, FLAG)
    model = models.load_judge(path, device, bf16=bf16, flag=FLAG)
    template = (read_template(rewards.genrm_prompt_template)
                if rewards.genrm_prompt_template else DEFAULT_TEMPLATE)
    return GenerativeJudge(model, tokenizer, eos_token_ids=models.eos_token_ids(tokenizer, model),
                           template=template, max_new_tokens=rewards.genrm_max_response_len,
                           bf16=bf16, device=device, share_prefixes=pass_layout == "shared-prefix")


def check_judging_lengths(judge: GenerativeJudge | None, tokenizer, samples, *,
                          apply_chat_template: bool, system_prompt: str | None,
                          max_response: int) -> None:
    """Every sample's judging prompt -- the template around the prompt as the policy sees it
    (``tokenizer`` formats it) and the label, in the judge's tokens -- must fit the judge's
    context with a full response (``max_response``, counted as the policy's tokens) and a full
    verdict; else an :class:`InputError` naming the first prompt's ``file:line`` (exit 2), as
    the policy's own check does, instead of cutting the start of each prompt at run time."""
    if judge is None or samples is None or judge.max_prompt_tokens is None:
        return
    texts = [judge.judging_prompt(format_prompt(tokenizer, s.prompt,
                                                apply_chat_template=apply_chat_template,
                                                system_prompt=system_prompt), "", s.label)
             for s in samples]
    counts = [len(ids) for ids in judge.tokenizer(texts, add_special_tokens=False)["input_ids"]]
    too_long = [(s, n) for s, n in zip(samples, counts, strict=True)
                if n + max_response > judge.max_prompt_tokens]
    if too_long:
        sample, n = too_long[0]
        raise InputError(
            f"{sample.source}: judging prompt of {n} tokens (template, prompt and label) + "
            f"--rollout-max-response-len {max_response} + --genrm-max-response-len "
            f"{judge.max_new_tokens} exceeds the judge's context of {judge.context} tokens "
            f"({len(too_long)} of {len(samples)} prompts do not fit); shorten the prompts or "
            "the template, or lower --rollout-max-response-len or --genrm-max-response-len")
