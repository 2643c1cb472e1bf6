"""``--rm-type remote_rm``: the client (relax/rollout/reward/remote_reward.py) against real server
processes on 127.0.0.1 -- the example math server, a slow one, one that fails every other
request, one that answers garbage -- and the start-up check of the URL."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from relax.config.sections import DataSection, RewardsSection, RolloutSection
from relax.errors import InputError, RewardError
from relax.rollout.reward.remote_reward import RemoteRewardModel
from relax.rollout.reward.scoring import Scorer

SERVERS = Path(__file__).with_name("reward_servers.py")
START_S = 60  # bounded wait for a server to print its URL (a loaded 2-core machine)

PROMPTS = [f"What is {i} + {i}?" for i in range(6)]
# even samples answer right, odd ones wrong: rewards 1, 0, 1, 0, 1, 0
RESPONSES = [f"\\boxed{{{2 * i if i % 2 == 0 else 2 * i + 1}}}" for i in range(6)]
LABELS = [str(2 * i) for i in range(6)]
TRUTH = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]


@contextmanager
def server(mode: str, tmp_path, *flags: str):
    """A reward server process in ``mode`` (tests/rollout/reward/reward_servers.py) with the example
    server's ``flags``; yields its URL."""
    log = open(tmp_path / f"{mode}-server.log", "w")
    proc = subprocess.Popen([sys.executable, str(SERVERS), mode, "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(START_S)
        assert line and line[0].startswith("listening on "), (
            f"the {mode} server did not start: {(tmp_path / f'{mode}-server.log').read_text()}")
        yield line[0].split()[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def stats(url: str) -> dict:
    with urllib.request.urlopen(url.replace("/reward", "/stats"), timeout=30) as answer:
        return json.loads(answer.read())


def model(url, **kw) -> RemoteRewardModel:
    kw = {"retries": 0, "backoff": 0.01, "timeout": 30.0, **kw}
    return RemoteRewardModel(url, **kw)


class Tracker:
    def __init__(self):
        self.sums = {}

    def add_sum(self, name, value):
        self.sums[name] = self.sums.get(name, 0) + value


def scorer(url: str, policy: str, timeout: float = 30.0) -> Scorer:
    rollout = RolloutSection(
        data=DataSection(prompt_data="data.jsonl"),
        rewards=RewardsSection(rm_type="remote_rm", rm_url=url, reward_timeout=timeout,
                               reward_error_policy=policy, reward_max_concurrency=4,
                               rm_batch_size=1, rm_retries=0, rm_retry_backoff=0.01))
    ctx = SimpleNamespace(rank=0, world_size=1, group=None, device=torch.device("cpu"))
    return Scorer(rollout, ctx, builtin_task=None, post_process_path=None)


GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])


@pytest.mark.subprocess
def test_the_example_server_scores_with_the_math_verifier_one_or_many_per_request(tmp_path):
    with server("math", tmp_path) as url:
        assert model(url)(PROMPTS, RESPONSES, LABELS) == TRUTH
        assert model(url, batch_size=4)(PROMPTS, RESPONSES, LABELS) == TRUTH
        got = scorer(url, "raise").score(PROMPTS, RESPONSES, LABELS, GROUPS, tracker=Tracker())
        assert got.tolist() == TRUTH
        bodies = stats(url)["bodies"]
    # the scorer's requests: slime's fields plus the metadata naming sample and group
    sent = sorted((b[0] for b in bodies[-6:]), key=lambda b: b["metadata"]["index"])
    assert [(b["metadata"]["index"], b["metadata"]["group_index"]) for b in sent] == [
        (0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]
    assert set(sent[0]) == {"prompt", "response", "label", "metadata"}
    assert sent[0]["prompt"] == PROMPTS[0] and sent[0]["label"] == LABELS[0]
    # batches of 4: two requests, an array of 4 samples and one of 2
    assert sorted(len(b) for b in bodies[6:8]) == [2, 4]


@pytest.mark.subprocess
def test_a_slow_server_gets_at_most_the_concurrency_in_flight_and_times_out(tmp_path):
    with server("slow", tmp_path) as url:
        assert model(url, concurrency=2)(PROMPTS, RESPONSES, LABELS) == TRUTH
        seen = stats(url)
        assert seen["posts"] == 6 and 1 <= seen["max_in_flight"] <= 2
        # a limit under the server's delay: every request times out, is retried once, fails
        values, errors = model(url, timeout=0.05, retries=1).score(
            PROMPTS[:2], RESPONSES[:2], LABELS[:2])
        assert all(v != v for v in values)  # NaN: no reward
        assert all("no complete answer within 0.05 s (--reward-timeout), after 2 attempts" in e
                   and f"--rm-url {url}" in e for e in errors), errors
        # --reward-error-policy zero: scored 0, counted
        tracker = Tracker()
        got = scorer(url, "zero", timeout=0.05).score(
            PROMPTS, RESPONSES, LABELS, GROUPS, tracker=tracker)
        assert got.tolist() == [0.0] * 6 and tracker.sums["rollout/reward_errors"] == 6
        with pytest.raises(RewardError, match=r"no complete answer within 0.05 s .*and 5 more samples"):
            scorer(url, "raise", timeout=0.05).score(
                PROMPTS, RESPONSES, LABELS, GROUPS, tracker=Tracker())


@pytest.mark.subprocess
def test_a_server_failing_every_other_request_is_retried(tmp_path):
    waits = []
    with server("flaky", tmp_path) as url:
        # one request at a time: requests 1, 3, 5, ... fail with 503, every retry succeeds
        flaky = model(url, concurrency=1, retries=1, backoff=0.5, sleep=waits.append)
        assert flaky(PROMPTS, RESPONSES, LABELS) == TRUTH
        assert stats(url)["posts"] == 12
        # each wait before the first retry: min(B * 2**0, 30) plus jitter in [0, B)
        assert len(waits) == 6 and all(0.5 <= w < 1.0 for w in waits)
        # without retries every other sample fails, naming the status and what came back
        values, errors = model(url, concurrency=1).score(PROMPTS, RESPONSES, LABELS)
    failed = [i for i, e in enumerate(errors) if e is not None]
    assert failed == [0, 2, 4] and [values[i] for i in (1, 3, 5)] == [0.0, 0.0, 0.0]
    assert "HTTP 503 'overloaded, try again', no retries (--rm-retries 0)" in errors[0]


@pytest.mark.subprocess
def test_a_server_answering_garbage_is_one_line_naming_the_url_and_what_came_back(tmp_path):
    with server("garbage", tmp_path) as url:
        with pytest.raises(RewardError) as caught:
            model(url, retries=3)(PROMPTS, RESPONSES, LABELS)
        posts = stats(url)["posts"]
    message = str(caught.value)
    assert "\n" not in message and f"--rm-url {url}" in message
    assert "answered something that is not JSON: '<html><body>Service temporarily" in message
    assert "...'" in message and len(message) < 400  # what came back, truncated
    assert posts == 6  # a malformed answer is not retried: it would come back the same


def test_an_unreachable_url_is_bad_input_naming_the_flag():
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(InputError, match=rf"^--rm-url http://127.0.0.1:{port}/reward: "
                           rf"nothing accepts connections at 127.0.0.1:{port}"):
            model(f"http://127.0.0.1:{port}/reward").check_reachable()


def test_relax_train_exits_2_before_loading_a_model_when_the_url_is_unreachable(
        tmp_path, capsys):
    from relax.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text('{"input": "1+1=", "label": "2"}\n' * 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/reward"
        code = main(["train", "--prompt-data", str(data), "--rm-type", "remote_rm",
                     "--rm-url", url, "--num-rollout", "1", "--rollout-batch-size", "4",
                     "--device", "cpu", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"relax train: error: --rm-url {url}: nothing accepts connections")
