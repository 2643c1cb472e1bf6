"""The built-in tokenizer padded to a real model's vocabulary size (benchmarks/gpu_check.py)."""

from __future__ import annotations

import pytest

from relax.tiny_model import build_tiny_model, build_tokenizer


def test_padded_vocabulary_encodes_text_as_the_plain_one():
    plain, padded = build_tokenizer(), build_tokenizer(vocab_size=300)
    assert len(plain) == 99 and len(padded) == 300
    text = "Copy: ab=c\n"
    ids = padded(text, add_special_tokens=False)["input_ids"]
    assert ids == plain(text, add_special_tokens=False)["input_ids"]
    assert padded.decode(ids) == text
    assert padded.decode([299]) == "<extra_200>"  # the last placeholder
    assert (padded.eos_token_id, padded.pad_token_id) == (plain.eos_token_id, plain.pad_token_id)


def test_the_model_takes_the_padded_size():
    model = build_tiny_model(build_tokenizer(vocab_size=256), seed=0)
    assert model.config.vocab_size == 256
    assert model.get_output_embeddings().weight.shape[0] == 256


def test_a_size_below_the_characters_is_refused():
    with pytest.raises(ValueError, match="the characters alone need 99"):
        build_tokenizer(vocab_size=50)
