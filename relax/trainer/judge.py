"""The generative judge of ``--rm-type genrm`` (relax/rollout/genrm.py), loaded next to the
policy: its tokenizer and frozen model from ``--genrm-model-path``, the template file or the
default. Every load failure is an :class:`~relax.errors.InputError` naming the flag (exit 2),
before the policy is loaded."""

from __future__ import annotations

import torch

from relax import models
from relax.config.reward_services import DEFAULT_TEMPLATE, read_template
from relax.rollout.genrm import GenerativeJudge

FLAG = "--genrm-model-path"


def build_judge(rollout, device: torch.device, *, bf16: bool) -> GenerativeJudge | None:
    """The judge of the rollout section (relax/config/sections.py), or None without one."""
    if rollout.rm_type != "genrm":
        return None
    path = rollout.genrm_model_path
    models.quiet_transformers()
    tokenizer = models.load_tokenizer(path, FLAG)
    model = models.load_judge(path, device, bf16=bf16, flag=FLAG)
    template = (read_template(rollout.genrm_prompt_template)
                if rollout.genrm_prompt_template else DEFAULT_TEMPLATE)
    return GenerativeJudge(model, tokenizer, eos_token_ids=models.eos_token_ids(tokenizer, model),
                           template=template, max_new_tokens=rollout.genrm_max_response_len,
                           bf16=bf16, device=device)
