"""An agent program for ``relax train --use-agentic-rollout``, written against the OpenAI client
as an existing agent would be: it plays the built-in ``copy`` task in two attempts.

    relax train --use-agentic-rollout --agent-command "python examples/agents/copy_agent.py" \
        --num-rollout 30

The first attempt answers the prompt ("abca="); when it is not exact the agent says how many
characters were right and asks again. The reward it reports is the better attempt's share of
correct characters, so the policy is trained on both turns and on reading the feedback.
Needs the ``openai`` package (installed with the ``agents`` extra).
"""

import json
import os

from openai import OpenAI


def score(target: str, answer: str) -> float:
    answer = answer.strip()
    hits = sum(a == b for a, b in zip(target, answer, strict=False))
    return hits / max(len(target), len(answer), 1)


def main() -> None:
    with open(os.environ["RELAX_INPUT_JSON"]) as f:
        task = json.load(f)
    client = OpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": task["prompt"]}]
    best = 0.0
    for attempt in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages)
        answer = reply.choices[0].message.content or ""
        best = max(best, score(task["label"], answer))
        if best == 1.0 or attempt == 1:
            break
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"{round(best * len(task['label']))} right"}]
    with open(os.environ["RELAX_OUTPUT_JSON"], "w") as f:
        json.dump({"reward": best}, f)


if __name__ == "__main__":
    main()
