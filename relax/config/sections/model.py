"""The model section (``cfg.model``): the policy's and the reference's weights. Torch-free."""

from __future__ import annotations

import os
from dataclasses import dataclass

from relax.config.checks import check_dir
from relax.config.section import Needs, Section, option, reject


@dataclass(frozen=True)
class ModelSection(Section):
    """The policy's and the reference's weights."""

    hf_checkpoint: str | None = option(
        None,
        'Hugging Face model directory (with config.json).',
        default_text='built-in tiny model')
    ref_load: str | None = option(
        None,
        'Reference model directory; only with a KL (--kl-coef or --use-kl-loss).',
        default_text='the initial policy weights',
        requires=Needs(lambda cfg: cfg.algorithm.kl_coef != 0 or cfg.algorithm.use_kl_loss,
                       "no reference KL is on, so the reference model is never used; remove "
                       "--ref-load or turn on a KL (--kl-coef or --use-kl-loss)",
                       given="changed"))

    def check(self) -> None:
        check_dir(self, "hf_checkpoint", "a Hugging Face model directory")
        if self.hf_checkpoint is not None and not os.path.isfile(
                os.path.join(self.hf_checkpoint, "config.json")):
            reject(self, "hf_checkpoint", "no config.json in it; point it at a Hugging Face "
                   "model directory")
        check_dir(self, "ref_load", "a Hugging Face model directory with the reference weights")
