"""A generative judge as the reward: ``--rm-type genrm --genrm-model-path DIR``.

A second causal LM (any Hugging Face model directory) reads each sample through a judging
prompt (``--genrm-prompt-template FILE``, else ``DEFAULT_TEMPLATE`` of relax/config/judge_template.py) and writes a verdict;
:func:`parse_verdict` turns it into the reward. It runs colocated, in the trainer's process on
the policy's device, through the same :class:`~relax.rollout.generation.sampler.Sampler` as the rollout
(so the lean engine of relax/rollout/generation/engine.py for Llama-family judges), under the run's
precision (weights stored in bf16 with ``--bf16``, like the reference), greedy, with all of the
rank's samples of a step in one batched decode. The judging prompts of one prompt's samples
share their beginning (the template's head and the question): with ``share_prefixes`` (``--pass-layout
shared-prefix``, the default) it is prefilled once per group and each prompt's own tokens on top
of it (relax/rollout/generation/shared_prefix.py), the verdicts those of a whole prefill.

How it differs from Relax's ``dapo-genrm``: that judge is an SGLang server reached over HTTP;
here it shares the trainer's device and decode, which costs step time instead of a GPU, and a
served judge is ``--rm-type remote_rm`` (relax/rollout/reward/remote_reward.py).
Torch is used only through the sampler; the template rules are torch-free
(relax/config/judge_template.py checks a template file with :func:`template_problem`).
"""

from __future__ import annotations

import re
import sys

import torch

from relax.config.judge_template import fill_template
from relax.errors import InputError
from relax.rollout.generation.generate import left_pad
from relax.rollout.generation.sampler import Sampler, SamplingParams
from relax.rollout.generation.shared_prefix import shared_prefixes

# the first verdict word; "incorrect" is listed before "correct" so it is not read as it
_VERDICT = re.compile(r"\b(yes|no|incorrect|correct|wrong|right|true|false)\b", re.IGNORECASE)
_POSITIVE = {"yes", "correct", "right", "true"}


def parse_verdict(text: str) -> float | None:
    """1.0 or 0.0 from the first verdict word of the judge's output (yes/correct/right/true
    against no/incorrect/wrong/false, any case), None when it holds none."""
    m = _VERDICT.search(text)
    if m is None:
        return None
    return 1.0 if m.group(1).lower() in _POSITIVE else 0.0


class GenerativeJudge:
    """``judge(prompts, responses, labels) -> rewards`` (rewards.py's signature); an output
    without a verdict scores 0.0 and is counted in :attr:`unparsed` (the last call's).

    The context is checked when the judge is built: the template's own tokens and
    ``--genrm-max-response-len`` must leave room for a sample (:class:`InputError` naming the
    flag, exit 2); relax/rollout/reward/judge.py checks the data's prompts the same way.
    ``share_prefixes``: the judging prompts of samples of the same prompt are prefilled with
    their common beginning once (equal logits up to float rounding).
    """

    def __init__(self, model, tokenizer, *, eos_token_ids: list[int], template: str,
                 max_new_tokens: int, bf16: bool, device: torch.device,
                 share_prefixes: bool = True):
        self.tokenizer, self.template, self.max_new_tokens = tokenizer, template, max_new_tokens
        self.share_prefixes = share_prefixes
        self.sampler = Sampler(model, eos_token_ids=eos_token_ids,
                               pad_token_id=tokenizer.pad_token_id,
                               params=SamplingParams(temperature=0.0), bf16=bf16, device=device)
        self.context = getattr(model.config, "max_position_embeddings", None)
        self.max_prompt_tokens = None if self.context is None else self.context - max_new_tokens
        self.overhead = self.count_tokens("", "", "")  # the template around an empty sample
        if self.max_prompt_tokens is not None and self.overhead >= self.max_prompt_tokens:
            raise InputError(
                f"--genrm-max-response-len {max_new_tokens}: with the judging prompt's own "
                f"{self.overhead} tokens (the template, empty fields) it leaves no room for a "
                f"sample in the judge's context of {self.context} tokens; lower it or shorten "
                "--genrm-prompt-template")
        self.unparsed = 0
        self.last_verdicts: list[str] = []

    def judging_prompt(self, prompt: str, response: str, label) -> str:
        """The template filled in, in the judge's chat template when its tokenizer has one."""
        text = fill_template(self.template, prompt=prompt, response=response, label=label)
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        return text

    def count_tokens(self, prompt: str, response: str, label) -> int:
        """Tokens of the judging prompt of one sample."""
        text = self.judging_prompt(prompt, response, label)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, prompts: list[str], responses: list[str], labels: list) -> list[float]:
        texts = [self.judging_prompt(p, r, y) for p, r, y in
                 zip(prompts, responses, labels, strict=True)]
        rows = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        self._fit(rows)
        ids, mask = left_pad(rows, self.tokenizer.pad_token_id, self.sampler.device)
        # the samples of a prompt: their judging prompts' common tokens, found on the tokens
        shared = shared_prefixes(rows, prompts) if self.share_prefixes else None
        rollout = self.sampler(ids, mask, self.max_new_tokens, shared=shared)
        self.last_verdicts = self.tokenizer.batch_decode(rollout.response_ids,
                                                         skip_special_tokens=True)
        verdicts = [parse_verdict(v) for v in self.last_verdicts]
        self.unparsed = sum(v is None for v in verdicts)
        return [0.0 if v is None else v for v in verdicts]

    def _fit(self, rows: list[list[int]]) -> None:
        """Cut judging prompts to the context, keeping the end (the response and the question
        to answer), and say so: start-up checked the prompts with a full response in the
        policy's tokens, so only a judge whose tokenizer counts a response longer gets here."""
        if self.max_prompt_tokens is None:
            return
        long = sum(len(r) > self.max_prompt_tokens for r in rows)
        if long:
            print(f"relax train: warning: {long} of {len(rows)} judging prompts exceed the "
                  f"judge's context of {self.context} tokens with --genrm-max-response-len "
                  f"{self.max_new_tokens} (the judge's tokenizer counts their responses longer "
                  f"than the policy's); each keeps its last {self.max_prompt_tokens} tokens",
                  file=sys.stderr)
            rows[:] = [r[-self.max_prompt_tokens:] for r in rows]
