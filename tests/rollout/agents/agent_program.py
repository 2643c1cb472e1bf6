"""A scripted agent program for the agentic-rollout tests: standard library only, talks to
RELAX_BASE_URL like any OpenAI client would.

    python agent_program.py MODE      MODE: ok | think | openai | tool | crash | hang | noreward
                                            | rewrite | garbage | spawn | snoop | intrude

ok: two model turns (the prompt, then "again"); writes reward = index % 3 and the replies.
think: as ok, but thinks before each call for a time drawn from the operating system's
entropy (0 to 80 ms), different in every run, as a real agent's tools and network are.
tool: one turn with a tools list, then a tool result message, then a second turn.
crash: prints to stderr and exits 3. hang: never returns. noreward: exits 0 without output.
rewrite: changes the history on its second call (not an extension of the conversation).
openai: as ok, through the openai package's client.
garbage: sends bodies the endpoint must refuse (hostile.py), records the answers, makes one
valid call and writes a reward nested 100000 deep.
spawn: starts a child that would sleep for 5 minutes, records its pid, exits 0.
snoop: records what it can list of its own directory and the one above it.
intrude: calls its own session, then another episode's, with an id read from its files.
"""

import json
import os
import random
import sys
import time
import urllib.request


def chat(messages, **extra):
    if MODE == "think":
        time.sleep(random.SystemRandom().uniform(0.0, 0.08))
    if MODE == "openai":  # the official client, as existing agent programs use it
        from openai import OpenAI

        client = OpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="policy", messages=messages, **extra)
        return {"role": "assistant", "content": reply.choices[0].message.content}
    body = json.dumps({"model": "policy", "messages": messages, **extra}).encode()
    request = urllib.request.Request(os.environ["RELAX_BASE_URL"] + "/chat/completions",
                                     data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["message"]


def main(mode: str) -> None:
    with open(os.environ["RELAX_INPUT_JSON"]) as f:
        task = json.load(f)
    assert task["session_id"] == os.environ["RELAX_SESSION_ID"]
    if mode in ("garbage", "spawn", "snoop", "intrude"):
        import hostile

        hostile.main(mode, task, chat)
        return
    if mode == "crash":
        print("agent: the tool server is unreachable", file=sys.stderr)
        sys.exit(3)
    if mode == "hang":
        time.sleep(3600)
    messages = [{"role": "user", "content": str(task["prompt"])}]
    replies = []
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
    first = chat(messages, **({"tools": tools} if mode == "tool" else {}))
    replies.append(first["content"])
    messages.append(first)
    if mode == "rewrite":
        messages[0] = {"role": "user", "content": "something else"}
    if mode == "tool":
        messages.append({"role": "tool", "content": "42", "tool_call_id": "call_0"})
    else:
        messages.append({"role": "user", "content": "again"})
    second = chat(messages, max_tokens=2)
    replies.append(second["content"])
    if os.environ.get("RELAX_TEST_DIR"):  # lets a test see what the agent was answered
        with open(os.path.join(os.environ["RELAX_TEST_DIR"], f"{task['index']}.json"), "w") as f:
            json.dump(replies, f)
    if mode == "noreward":
        return
    with open(os.environ["RELAX_OUTPUT_JSON"], "w") as f:
        json.dump({"reward": task["index"] % 3}, f)


MODE = sys.argv[1] if __name__ == "__main__" else "ok"

if __name__ == "__main__":
    main(MODE)
