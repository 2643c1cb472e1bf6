"""The built-in tiny model and tokenizer, created in code (nothing is downloaded, ever).

Used when ``--hf-checkpoint`` is absent. The tokenizer is character level over printable
ASCII plus ``<pad>``, ``<eos>`` and ``<unk>``; the model is a small Qwen3 (transformers'
``Qwen3Config``) whose initial weights depend only on the seed. Both are ordinary Hugging Face
objects, so ``save_pretrained`` output loads back with ``AutoModelForCausalLM`` /
``AutoTokenizer`` (and therefore with ``--hf-checkpoint``).
"""

from __future__ import annotations

import string

import torch

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# Tabs and the rarer whitespace characters are left out: prompts of the built-in tasks and
# typical math data do not need them, and a smaller vocabulary learns faster.
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]

# Small enough that `relax train` learns the built-in task in a few CPU minutes.
TINY_MODEL = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)


def build_tokenizer(vocab_size: int | None = None):
    """A character-level ``PreTrainedTokenizerFast`` with eos and pad tokens (pad id 0, eos 1).

    ``vocab_size`` pads the vocabulary with placeholder tokens ``<extra_i>`` up to that size,
    for a model shaped like a real one (a 151,936-entry output layer costs what it costs in
    Qwen3); text still encodes character by character, and sampled placeholders decode to
    their names."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for c in CHARS:
        vocab[c] = len(vocab)
    if vocab_size is not None and vocab_size < len(vocab):
        raise ValueError(f"vocab_size {vocab_size}: the characters alone need {len(vocab)}")
    for i in range((vocab_size or 0) - len(vocab)):
        vocab[f"<extra_{i}>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # every character is its own piece; `[\s\S]` because `.` would skip newlines
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, unk_token=UNK, padding_side="left"
    )


def build_tiny_model(tokenizer, seed: int, **overrides):
    """A randomly initialized Qwen3 causal LM; the same seed gives the same weights."""
    from transformers import Qwen3Config

    return _build(Qwen3Config, TINY_MODEL, tokenizer, seed, overrides)


def _build(config_cls, shapes: dict, tokenizer, seed: int, overrides: dict):
    """A randomly initialized causal LM of ``config_cls`` with ``shapes`` (and ``overrides``)
    around ``tokenizer``, seeded by ``seed`` without moving the caller's RNG."""
    from transformers import AutoModelForCausalLM

    cfg = config_cls(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**shapes, **overrides},
    )
    # Fork the RNG so building the model does not move the caller's global stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# The tiny model's shapes as a mixture of experts (Qwen3-MoE): 4 experts of a third of the
# dense width each, 2 per token (2 active ~ the dense MLP's 2/3), probabilities renormalized
# over the chosen two as Qwen3-30B-A3B does (``norm_topk_prob``).
TINY_MOE = dict(TINY_MODEL, intermediate_size=192, moe_intermediate_size=64, num_experts=4,
                num_experts_per_tok=2, norm_topk_prob=True)


def build_tiny_moe(tokenizer, seed: int, **overrides):
    """A randomly initialized tiny ``Qwen3MoeForCausalLM`` (:data:`TINY_MOE`); the same seed
    gives the same weights. ``save_pretrained`` makes a directory for ``--hf-checkpoint``."""
    from transformers import Qwen3MoeConfig

    return _build(Qwen3MoeConfig, TINY_MOE, tokenizer, seed, overrides)
