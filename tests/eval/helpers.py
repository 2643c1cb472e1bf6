"""Evaluation settings for tests that call the evaluator directly."""

from __future__ import annotations

from relax.config.sections import EvaluationSection
from relax.eval.evaluate import EvalSampling


def eval_sampling(n_samples=1, temperature=1.0, top_p=1.0, top_k=-1, max_response_len=1024,
                  batch_size=64, pass_threshold=1.0, seed=1234, bf16=None) -> EvalSampling:
    """A resolved evaluation section (plain sampling unless given) with a seed."""
    section = EvaluationSection(n_samples_per_eval_prompt=n_samples, eval_temperature=temperature,
                                eval_top_p=top_p, eval_top_k=top_k,
                                eval_max_response_len=max_response_len,
                                eval_batch_size=batch_size, eval_pass_threshold=pass_threshold)
    return EvalSampling(section, seed, bf16)
