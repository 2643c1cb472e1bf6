"""Rollout: prompts (data files or built-in tasks), generation with the current policy, rewards.

- ``tiny_model``: the built-in tiny Qwen3 and character tokenizer (no download, ever);
- ``tasks``: built-in tasks ``copy`` and ``addition`` with partial-credit rewards;
- ``math_reward``: ``--rm-type math`` (last ``\\boxed{}`` or ``####``, math-verify equality);
- ``rewards``: reward dispatch, ``module:function`` / ``file.py:function`` loading, checks;
- ``data``: jsonl / parquet prompt files with ``file:line`` errors, per-step prompt batches;
- ``generate``: left-padded KV-cache decoding, response mask through EOS, truncation.

Submodules are imported on use so that ``import relax.rollout.tasks`` stays light.
"""
