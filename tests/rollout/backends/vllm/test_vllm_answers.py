"""A vLLM server's answers are checked before anything uses them
(relax/rollout/backends/vllm/vllm_answers.py): the pure checkers on each malformed shape, then the
client and the sampler against a fake server on 127.0.0.1 answering them, which must end in
one line naming the URL, the sample and what came back, before a Rollout is made."""

from __future__ import annotations

import json
import math

import pytest
import torch

from relax.rollout.backends.vllm.vllm_answers import (
    BadAnswer,
    completion,
    prompt_log_probs,
    weight_version,
)
from relax.rollout.backends.vllm.vllm_client import ServerError, VllmClient
from relax.rollout.backends.vllm.vllm_sampler import VllmSampler
from relax.rollout.generation.generate import left_pad
from relax.rollout.generation.sampler import SamplingParams
from tests.rollout.backends.vllm.fake_vllm import fake_vllm, sampled

EOS, PAD, VOCAB = 1, 0, 50


_answer = sampled


def test_a_good_answer_passes_as_it_came():
    got = completion(_answer([5, 6, EOS], [-0.5, 0.0, -3], "stop"), max_tokens=4,
                     vocab_size=VOCAB)
    assert got == {"token_ids": [5, 6, EOS], "log_probs": [-0.5, 0.0, -3.0],
                   "finish_reason": "stop"}


def test_a_weight_version_is_the_decimal_string_vllm_keeps():
    assert weight_version({"weight_version": "12"}) == 12
    assert weight_version({"weight_version": 0}) == 0  # a JSON integer is taken too


@pytest.mark.parametrize("answer,says", [
    ({"weight_version": "default"}, "'default', vLLM's value before any version is set"),
    ({"weight_version": "v3"}, "weight_version str 'v3', not a version"),
    ({"weight_version": "-1"}, "not a version"),
    ({"weight_version": "٣"}, "not a version"),  # an Arabic-Indic 3: isdigit, not ASCII
    ({"weight_version": True}, "weight_version bool True, not a version"),
    ({"weight_version": 1.0}, "not a version"),
    ({"version": "3"}, "weight_version NoneType"),
    ("3", "not a version"),
])
def test_an_answer_that_is_no_weight_version_is_refused(answer, says):
    with pytest.raises(BadAnswer) as e:
        weight_version(answer)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


NAN, INF = float("nan"), float("inf")
BAD_COMPLETIONS = {
    "not-json": ("<html>502 Bad Gateway</html>", "not a JSON object: str '<html>502"),
    "a-list": ([1, 2], "not a JSON object"),
    "no-choices": ({"object": "error"}, "1 choice(s) expected, got choices NoneType"),
    "two-choices": ({"choices": [_answer([5], [-1.0])["choices"][0]] * 2}, "1 choice(s)"),
    "choice-not-object": ({"choices": ["x"]}, "a choice is str 'x'"),
    "no-token-ids": ({"choices": [{"logprobs": {"token_logprobs": [-1.0]}}]},
                     "no token_ids list: NoneType"),
    "no-logprobs": ({"choices": [{"token_ids": [5]}]}, "no logprobs.token_logprobs list"),
    "id-past-vocab": (_answer([5, VOCAB], [-1.0, -1.0]), "token id 1 is int 50, not an "
                      "integer in [0, 50)"),
    "id-negative": (_answer([-3], [-1.0]), "token id 0 is int -3"),
    "id-string": (_answer(["5"], [-1.0]), "token id 0 is str '5'"),
    "id-float": (_answer([5.0], [-1.0]), "token id 0 is float 5.0"),
    "id-bool": (_answer([True], [-1.0]), "token id 0 is bool True"),
    "null-log-prob": (_answer([5, 6], [-1.0, None]), "log-prob 1 is NoneType None, not a number"),
    "string-log-prob": (_answer([5], ["-1.0"]), "log-prob 0 is str '-1.0', not a number"),
    "nan-log-prob": (_answer([5], [NAN]), "log-prob 0 is nan; a log-prob is finite and <= 0"),
    "inf-log-prob": (_answer([5], [INF]), "log-prob 0 is inf"),
    "minus-inf-log-prob": (_answer([5], [-INF]), "log-prob 0 is -inf"),
    "positive-log-prob": (_answer([5, 6], [-1.0, 5.0]), "log-prob 1 is 5.0"),
    "tiny-positive-log-prob": (_answer([5], [1e-12]), "log-prob 0 is 1e-12"),
    "more-tokens-than-asked": (_answer(list(range(2, 14)), [-1.0] * 12),
                               "12 token ids for max_tokens 4"),
    "no-tokens": (_answer([], []), "0 token ids for max_tokens 4"),
    "one-log-prob-for-four": (_answer([5, 6, 7, 8], [-1.0]), "1 log-probs for 4 tokens"),
    "finish-not-text": (_answer([5], [-1.0], finish=3), "finish_reason int 3"),
}


@pytest.mark.parametrize("name", BAD_COMPLETIONS)
def test_a_bad_completion_answer_is_refused_saying_what_came_back(name):
    answer, needle = BAD_COMPLETIONS[name]
    with pytest.raises(BadAnswer) as e:
        completion(answer, max_tokens=4, vocab_size=VOCAB)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert len(str(e.value)) < 300  # what came back is cut, not copied whole


def test_a_long_answer_is_cut_in_the_message():
    huge = "x" * 100_000
    with pytest.raises(BadAnswer) as e:
        completion(huge, max_tokens=4)
    assert len(str(e.value)) < 200


def _scores(*entries_per_prompt, order=None):
    choices = [{"index": k, "prompt_logprobs": list(e)} for k, e in enumerate(entries_per_prompt)]
    return {"choices": [choices[k] for k in (order or range(len(choices)))]}


PROMPTS, STARTS = [[3, 4, 5], [7, 8]], [1, 1]
GOOD = _scores([None, {"4": {"logprob": -0.25, "rank": 1}}, {"5": -2.0}],
               [None, {"8": {"logprob": 0.0}}], order=[1, 0])


def test_prompt_log_probs_in_any_order_of_index():
    assert prompt_log_probs(GOOD, PROMPTS, STARTS) == [[-0.25, -2.0], [0.0]]
    assert prompt_log_probs(GOOD, PROMPTS, [2, 1]) == [[-2.0], [0.0]]


BAD_SCORES = {
    "no-choices": ({"error": "x"}, None, "2 choice(s) expected"),
    "one-choice": (_scores([None, {"4": -1.0}, {"5": -1.0}]), None, "2 choice(s) expected"),
    "no-index": ({"choices": [{"prompt_logprobs": []}] * 2}, None, "choice index NoneType"),
    "twice-index-0": (_scores([], [], order=[0, 0]), None, "choice index int 0"),
    "short-entries": (_scores([None, {"4": -1.0}], [None, {"8": -1.0}]), 0,
                      "prompt 0: prompt_logprobs for 3 tokens expected"),
    "token-missing": (_scores([None, {"9": -1.0}, {"5": -1.0}], [None, {"8": -1.0}]), 0,
                      "prompt 0: prompt log-prob entry 1 lacks token 4"),
    "positive": (_scores([None, {"4": -1.0}, {"5": -1.0}], [None, {"8": {"logprob": 3.0}}]),
                 1, "prompt 1: the log-prob of token 1 is 3.0; a log-prob is finite and <= 0"),
    "nan": (_scores([None, {"4": NAN}, {"5": -1.0}], [None, {"8": -1.0}]), 0, "is nan"),
    "minus-inf": (_scores([None, {"4": -1.0}, {"5": -INF}], [None, {"8": -1.0}]), 0, "is -inf"),
    "string": (_scores([None, {"4": "-1"}, {"5": -1.0}], [None, {"8": -1.0}]), 0,
               "is str '-1', not a number"),
}


@pytest.mark.parametrize("name", BAD_SCORES)
def test_a_bad_scoring_answer_names_the_prompt(name):
    answer, index, needle = BAD_SCORES[name]
    with pytest.raises(BadAnswer) as e:
        prompt_log_probs(answer, PROMPTS, STARTS)
    assert needle in str(e.value) and e.value.index == index


def _sample(url: str, max_new_tokens: int = 4):
    client = VllmClient(url, timeout=10)
    sampler = VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD, params=SamplingParams(),
                          device=torch.device("cpu"), vocab_size=VOCAB)
    ids, mask = left_pad([[5, 2], [6], [4, 3]], PAD, "cpu")
    return sampler(ids, mask, max_new_tokens=max_new_tokens,
                   generator=torch.Generator().manual_seed(0))


SERVED = {  # what a server sends, as bytes: Python's json writes NaN and Infinity as vLLM may
    "not-json": (b"<html>Bad Gateway</html>", "not a JSON object: str '<html>Bad Gateway"),
    "no-choices": (b'{"object": "list"}', "1 choice(s) expected"),
    "id-past-vocab": (json.dumps(_answer([5, 999], [-1.0, -1.0])).encode(), "token id 1 is int 999"),
    "id-string": (json.dumps(_answer(["5"], [-1.0])).encode(), "token id 0 is str '5'"),
    "null-log-probs": (json.dumps(_answer([5, 6], [None, None])).encode(), "is NoneType None"),
    "nan": (json.dumps(_answer([5], [NAN])).encode(), "log-prob 0 is nan"),
    "plus-inf": (json.dumps(_answer([5], [INF])).encode(), "log-prob 0 is inf"),
    "plus-five": (json.dumps(_answer([5], [5.0])).encode(), "log-prob 0 is 5.0"),
    "twelve-for-four": (json.dumps(_answer(list(range(2, 14)), [-1.0] * 12)).encode(),
                        "12 token ids for max_tokens 4"),
    "one-log-prob-for-four": (json.dumps(_answer([5, 6, 7, 8], [-1.0])).encode(),
                              "1 log-probs for 4 tokens"),
}


@pytest.mark.parametrize("name", SERVED)
def test_the_sampler_stops_on_a_bad_answer_in_one_line(name):
    body, needle = SERVED[name]
    with fake_vllm(lambda _: body) as url, pytest.raises(ServerError) as e:
        _sample(url)
    line = str(e.value)
    assert line.startswith(f"vLLM server {url} answered /v1/completions for sample ")
    assert "of the batch (max_tokens 4) with " in line and needle in line, line
    assert "\n" not in line


def test_a_good_served_answer_becomes_the_rollout():
    body = json.dumps(_answer([7, 8, EOS], [-0.5, -1.5, 0.0], "stop")).encode()
    with fake_vllm(lambda _: body) as url:
        r = _sample(url)
    assert r.response_ids.tolist() == [[7, 8, EOS]] * 3
    assert r.log_probs.tolist() == [[-0.5, -1.5, 0.0]] * 3
    assert all(math.isfinite(x) for x in r.log_probs.flatten().tolist())


@pytest.mark.parametrize("models", [b"<html>Bad Gateway</html>", {"data": []},
                                    {"data": [{"root": "/m"}]}, {"data": ["m"]}])
def test_a_models_answer_without_a_model_is_one_line(models):
    client = VllmClient("http://127.0.0.1:1", timeout=1)
    client.request = lambda path, body=None, method="POST": models
    with pytest.raises(ServerError, match=r"^vLLM server http://127.0.0.1:1 serves no model: "
                                          r"/v1/models answered "):
        client.served_model()


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory):
    """The tiny model with an output layer of its own (a --vllm-url server cannot reload a
    tied one), saved as a Hugging Face directory."""
    from relax.tiny_model import build_tiny_model, build_tokenizer

    path = tmp_path_factory.mktemp("untied")
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0, tie_word_embeddings=False).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _probe_then(bad):
    """The start-up probe (prompt [0], 1 token) is answered well, every rollout request with
    ``bad``."""
    def answer(body):
        return sampled([EOS], [-0.5], "stop") if body["prompt"] == [[0]] else bad
    return answer


@pytest.mark.parametrize("flags, bad, needle", [
    # NaN under TIS was blamed on --lr; +5.0 with --use-rollout-logprobs became pi_old
    (["--use-tis"], sampled([5, 6], [-1.0, NAN]), "log-prob 1 is nan"),
    (["--use-rollout-logprobs"], sampled([5], [5.0]), "log-prob 0 is 5.0"),
    ([], sampled([5, 10**6], [-1.0, -1.0]), "token id 1 is int 1000000"),
])
def test_a_run_ends_in_one_line_naming_the_server_and_writes_no_step(
        untied_model_dir, tmp_path, capsys, flags, bad, needle):
    from relax.config import parse_train_config
    from relax.trainer.launch import train

    with fake_vllm(_probe_then(bad), model_dir=untied_model_dir) as url:
        cfg = parse_train_config([
            "--rollout-backend", "vllm", "--vllm-url", url, "--hf-checkpoint",
            str(untied_model_dir), "--num-rollout", "1", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4", "--device", "cpu",
            "--output-dir", str(tmp_path / "run"), "--save", str(tmp_path / "ckpt"),
            "--log-samples", "0", *flags])
        status = train(cfg)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("relax train: error: ")]
    assert status == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert f"vLLM server {url} answered /v1/completions for sample " in lines[0]
    assert needle in lines[0], lines[0]
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
