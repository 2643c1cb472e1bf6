"""A reward server as a hostile peer (docs/reward_services.md, "Failures"): one that drips its
answer, redirects, cuts its body short or answers a reward beyond float32 -- each a real server
process on 127.0.0.1 (tests/rollout/reward/reward_servers.py) against the client of
relax/rollout/reward/remote_reward.py, and the drip against a real ``relax train``; and the example
server (examples/reward_server/) against malformed requests and a slow client."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from relax.errors import RewardError
from tests.hostile.helpers import SMALL, one_error_line, relax, write
from tests.rollout.reward.test_remote_reward import (
    GROUPS,
    LABELS,
    PROMPTS,
    RESPONSES,
    TRUTH,
    Tracker,
    model,
    scorer,
    server,
    stats,
)

ENDED_S = 30  # proves a request ended; the deadlines under test are 2 s


def _score_in_time(remote, n: int = 1):
    """``remote.score`` of the first n samples, which must end within ENDED_S seconds."""
    box = {}
    worker = threading.Thread(target=lambda: box.update(
        out=remote.score(PROMPTS[:n], RESPONSES[:n], LABELS[:n])), daemon=True)
    worker.start()
    worker.join(ENDED_S)
    assert "out" in box, f"the request did not end within {ENDED_S} s"
    return box["out"]


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["drip-status", "drip-body"])
def test_a_dripping_server_is_cut_off_at_the_requests_deadline(tmp_path, mode):
    # one byte every 0.5 s for up to 120 s: a per-read timeout of 2 s never fires
    with server(mode, tmp_path) as url:
        values, errors = _score_in_time(model(url, timeout=2.0, retries=0))
        assert values[0] != values[0]  # NaN: no reward
        assert "no complete answer within 2 s (--reward-timeout), no retries" in errors[0]
        assert f"--rm-url {url}" in errors[0] and "sample 0" in errors[0]
        # a request of 2 samples has 2 x the limit, and a retry its own deadline
        values, errors = _score_in_time(model(url, timeout=1.0, retries=1, batch_size=2), n=2)
        assert "no complete answer within 2 s (--reward-timeout), after 2 attempts" in errors[0]
        assert stats(url)["posts"] == 3


@pytest.mark.subprocess
def test_relax_train_ends_in_one_line_when_the_server_drips(tmp_path):
    data = write(tmp_path / "data.jsonl", '{"input": "1+1=", "label": "2"}\n' * 4)
    with server("drip-status", tmp_path) as url:
        out = relax("train", "--prompt-data", data, "--rm-type", "remote_rm", "--rm-url", url,
                    "--reward-timeout", "2", "--rm-retries", "0", *SMALL,
                    "--output-dir", tmp_path / "run")
    line = one_error_line(out)
    assert out.returncode == 1, out.stderr[-2000:]
    assert line.startswith(f"relax train: error: reward model --rm-url {url}: no complete "
                           "answer within 2 s (--reward-timeout), no retries"), line


@pytest.mark.subprocess
@pytest.mark.parametrize("status", [302, 307])
def test_a_redirect_is_refused_in_one_line_and_never_followed(tmp_path, status):
    with server(f"redirect-{status}", tmp_path) as url:
        values, errors = _score_in_time(model(url, retries=3), n=2)
        seen = stats(url)
    assert all(v != v for v in values)
    assert (f"--rm-url {url}: answered HTTP {status} redirecting to '/elsewhere'; redirects "
            "are not followed") in errors[0] and "give the final URL as --rm-url" in errors[0]
    # nothing went to /elsewhere (urllib re-sent a 302's POST there as a GET, no body), and a
    # redirect is not retried: it would come back the same
    assert seen.get("elsewhere_gets", 0) == 0 and seen["posts"] == 2


@pytest.mark.subprocess
def test_a_body_cut_short_is_a_connection_error_and_retried(tmp_path):
    with server("cut", tmp_path) as url:
        # one request at a time: requests 1, 3, 5 are cut short, each retry is answered
        assert model(url, concurrency=1, retries=1, sleep=lambda s: None)(
            PROMPTS[:3], RESPONSES[:3], LABELS[:3]) == TRUTH[:3]
        assert stats(url)["posts"] == 6
        _, errors = model(url, concurrency=1).score(PROMPTS[:2], RESPONSES[:2], LABELS[:2])
    assert errors[1] is None and ("connection failed: CutShort: the connection closed after 2 "
                                  "of the 50 bytes the answer announced") in errors[0], errors


@pytest.mark.subprocess
def test_a_reward_beyond_float32_is_the_servers_error_under_the_policy(tmp_path):
    with server("huge", tmp_path) as url:
        _, errors = model(url).score(PROMPTS[:1], RESPONSES[:1], LABELS[:1])
        assert ("the answer is -1e+300, beyond the float32 range of rewards (+-3.4e+38), not a "
                "reward") in errors[0] and f"--rm-url {url}" in errors[0] and "sample 0" in errors[0]
        with pytest.raises(RewardError, match=r"--rm-url .*beyond the float32 range"):
            scorer(url, "raise").score(PROMPTS, RESPONSES, LABELS, GROUPS, tracker=Tracker())
        tracker = Tracker()
        got = scorer(url, "zero").score(PROMPTS, RESPONSES, LABELS, GROUPS, tracker=tracker)
    assert got.tolist() == [0.0] * 6 and tracker.sums["rollout/reward_errors"] == 6


# ---------------------------------------------------------------- the example server
def _exchange(url: str, raw: bytes, *, half_close: bool = False) -> tuple[int, str]:
    """Send ``raw`` bytes to the server of ``url``; its status and body (bounded waits)."""
    host, port = url.split("/")[2].split(":")
    with socket.create_connection((host, int(port)), timeout=ENDED_S) as conn:
        conn.sendall(raw)
        if half_close:
            conn.shutdown(socket.SHUT_WR)
        head, _, body = _read_answer(conn).partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, body.decode()


def _read_answer(conn) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def _post(body: bytes, length: str | None = None) -> bytes:
    length = str(len(body)) if length is None else length
    return (b"POST /reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + (f"Content-Length: {length}\r\n".encode() if length != "-" else b"")
            + b"Connection: close\r\n\r\n" + body)


BAD_REQUESTS = {
    "no label": (_post(b'{"prompt": "1+1=", "response": "\\\\boxed{2}"}'),
                 "sample 0 has no 'label'"),
    "nested": (_post(b"[" * 100_000 + b"]" * 100_000), "nested too deeply"),
    "length abc": (_post(b'{"response": "2", "label": "2"}', "abc"),
                   "Content-Length 'abc' is not a number"),
    "no length": (_post(b'{"response": "2", "label": "2"}', "-"), "with its Content-Length"),
    "bad json": (_post(b'{"response": '), "the body is not JSON"),
    "response a number": (_post(b'{"response": 5, "label": "2"}'), "no string 'response'"),
    "label a list": (_post(b'{"response": "2", "label": [2]}'), "has a list 'label'"),
    "label a bool": (_post(b'{"response": "2", "label": true}'), "has a bool 'label'"),
    "prompt a dict": (_post(b'{"prompt": {}, "response": "2", "label": 2}'),
                      "'prompt' that is not a string"),
    "array of numbers": (_post(b"[1, 2]"), "sample 0 is a int, not an object"),
    "empty array": (_post(b"[]"), "no samples"),
    "a string": (_post(b'"2"'), "one sample object or an array"),
}


@pytest.mark.subprocess
def test_the_example_server_answers_400_with_the_reason_to_every_bad_request(tmp_path):
    with server("math", tmp_path) as url:
        for name, (raw, reason) in BAD_REQUESTS.items():
            status, body = _exchange(url, raw)
            assert status == 400 and reason in body, (name, status, body)
        # a body cut short by the client (it closes its side): the reason, not a hang
        status, body = _exchange(url, _post(b'{"response": "2"}', "100"), half_close=True)
        assert status == 400 and "the body ended after 17 of 100 bytes" in body
        # Relax reads the 400 as a failure that would come back the same: no retries
        _, errors = model(url, retries=3).score(["1+1="], ["\\boxed{2}"], [None])
        assert "answered HTTP 400 \"sample 0 has no 'label'" in errors[0], errors
        assert stats(url)["posts"] == len(BAD_REQUESTS) + 2
        assert model(url)(PROMPTS, RESPONSES, LABELS) == TRUTH  # and it still serves
    log = (tmp_path / "math-server.log").read_text()
    assert "Traceback" not in log, log


@pytest.mark.subprocess
def test_a_client_that_sends_a_byte_a_second_is_cut_off_at_the_request_timeout(tmp_path):
    with server("math", tmp_path, "--request-timeout", "2") as url:
        host, port = url.split("/")[2].split(":")
        with socket.create_connection((host, int(port)), timeout=ENDED_S) as conn:
            conn.settimeout(0.5)
            closed, start = False, time.monotonic()
            for byte in b"POST /reward HTTP/1.1\r\nHost: " + b"x" * 200:
                if time.monotonic() - start > ENDED_S:
                    break
                try:
                    conn.sendall(bytes([byte]))
                    closed = conn.recv(1) == b""
                except TimeoutError:
                    continue
                except OSError:  # reset: closed as well
                    closed = True
                if closed:
                    break
        assert closed, f"the server still held the connection after {ENDED_S} s"
        assert model(url)(PROMPTS[:2], RESPONSES[:2], LABELS[:2]) == TRUTH[:2]


class _Stop(Exception):
    pass


@pytest.mark.subprocess
def test_an_interrupted_step_leaves_no_request_running_past_its_deadline(tmp_path):
    """A signal's exception in the waiting thread (as a second SIGTERM raises it) ends the
    step at once; the request threads start no retry and end at their request's deadline."""
    def interrupt(signum, frame):
        raise _Stop

    with server("drip-body", tmp_path) as url:
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(_Stop):
                model(url, timeout=1.0, retries=5, backoff=0.01, concurrency=4).score(
                    PROMPTS, RESPONSES, LABELS)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        start = time.monotonic()
        while time.monotonic() - start < ENDED_S and any(
                t.name == "relax-remote-rm" for t in threading.enumerate()):
            time.sleep(0.1)
        assert not [t for t in threading.enumerate() if t.name == "relax-remote-rm"]
        assert stats(url)["posts"] <= 4  # at most the four in flight: no retry, no further sample
