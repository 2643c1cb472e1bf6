"""The hostile modes of agent_program.py (garbage, spawn, snoop, intrude); what each saw goes to
``RELAX_TEST_DIR/<index>.json`` for the test to check."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

DEEP = 100_000
BAD_BODIES = {
    "numbers": json.dumps({"messages": [1, 2, 3]}).encode(),
    "empty": json.dumps({"messages": []}).encode(),
    "bare_string": json.dumps({"messages": [{"role": "user", "content": "hi"}, "again"]}).encode(),
    "deep": b'{"messages": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "image": json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}).encode(),
    "surrogate": b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    "max_tokens": json.dumps({"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": "x"}).encode(),
    "role": json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(),
    "huge": b" " * (9 << 20),
}


def post(body: bytes, base_url: str | None = None) -> tuple[int, str]:
    base_url = base_url or os.environ["RELAX_BASE_URL"]
    request = urllib.request.Request(base_url + "/chat/completions",
                                     data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, ""
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)["error"]["message"]


def intrude(own_sid: str):
    """Find another episode's session id in the workspace and call it: the status, or why no
    id could be read (a non-root user cannot list the workspace)."""
    workspace = os.path.dirname(os.path.dirname(os.environ["RELAX_INPUT_JSON"]))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            folders = os.listdir(workspace)
        except OSError as e:
            return type(e).__name__
        for folder in folders:
            try:
                with open(os.path.join(workspace, folder, "in.json")) as f:
                    sid = json.load(f)["session_id"]
            except (OSError, ValueError):
                continue
            if sid != own_sid:
                url = os.environ["RELAX_BASE_URL"].replace(own_sid, sid)
                return post(json.dumps({"messages": [{"role": "user", "content": "hi"}]}
                                       ).encode(), url)
        time.sleep(0.05)
    return "no other session found"


def main(mode: str, task: dict, chat) -> None:
    seen: dict = {}
    if mode == "garbage":
        seen = {name: post(body) for name, body in BAD_BODIES.items()}
        seen["valid"] = chat([{"role": "user", "content": str(task["prompt"])}])["role"]
        reward = b'{"reward": ' + b"[" * DEEP + b"]" * DEEP + b"}"
        with open(os.environ["RELAX_OUTPUT_JSON"], "wb") as f:
            f.write(reward)
    elif mode == "spawn":  # a tool server the agent forgets to stop
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        seen = {"child": child.pid}
    elif mode == "intrude":  # call into another episode with a session id read from disk
        seen["own"] = post(json.dumps({"messages": [{"role": "user", "content": "hi"}]}
                                      ).encode())[0]
        seen["other"] = intrude(task["session_id"])
    elif mode == "snoop":
        own = os.path.dirname(os.environ["RELAX_INPUT_JSON"])
        seen["own"] = sorted(os.listdir(own))
        try:
            seen["parent"] = sorted(os.listdir(os.path.dirname(own)))
        except OSError as e:
            seen["parent"] = type(e).__name__
    with open(os.path.join(os.environ["RELAX_TEST_DIR"], f"{task['index']}.json"), "w") as f:
        json.dump(seen, f)
    if mode != "garbage":
        with open(os.environ["RELAX_OUTPUT_JSON"], "w") as f:
            json.dump({"reward": 1.0}, f)
