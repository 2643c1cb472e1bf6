"""Partial rollouts (``--partial-rollout``): a step stops decoding once it holds enough finished
groups, and the responses still being written are continued in a later step.

Each rank starts ``--over-sampling-batch-size / WORLD_SIZE`` groups per step: the groups it
carried over first, then fresh prompts of the stream. The decode stops at the first token step
at which the first ``--rollout-batch-size / WORLD_SIZE`` groups to be complete are complete (a
group is complete when each of its responses ended at EOS or at ``--rollout-max-response-len``)
and every group carried ``--partial-rollout-max-aborted-count`` times is complete too. The
first complete groups, in row order (carried before fresh), are the step's batch; every other
group is carried into the next step with its tokens, the sampler's log-probs and the step each
token was sampled at, and continues under the newer policy (its prompt and the tokens so far are
prefilled again). The stop depends on token counts only, never on time, so a seeded run repeats
exactly, and the carried groups are part of the checkpoint (``state_dict``), so ``--load``
continues exactly.

With ``--dynamic-sampling-filter-path`` a group is judged once, when it completes: scored and
filtered after the decode round it completed in; a failing group is dropped (a fresh prompt
takes its place in the next step), a passing one keeps its rewards and verdict until it is
trained. The step decodes in rounds (``--dynamic-sampling-max-rounds``) while some rank is short
of passing groups and every rank has groups in flight, and every rank trains on the fewest
passing groups any rank holds, at most its share (docs/configuration.md, "Off-policy").

Tokens sampled in an earlier step are off-policy: ``--mask-offpolicy-in-partial-rollout``
leaves them out of the loss (they stay in the context); otherwise the importance correction
(``--use-tis`` or ``--use-rollout-logprobs``, required by the configuration) weighs them with
the sampler's log-probs (reinforce_plus_plus.md §7a).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from relax.agreement import Agreement, GroupAgreement
from relax.rollout.collectors import StreamPosition, rollout_generator
from relax.rollout.filters import kept_groups
from relax.rollout.generation.batch import StepBatch
from relax.rollout.generation.generate import Rollout, concat_rollouts, left_pad, tokenize_prompts
from relax.rollout.prompts.data import PromptSource, format_prompt

ROW_KEYS = ("prompt", "text", "label", "ids", "log_probs", "versions", "eos", "aborted",
            "routes")
JUDGED = ("reward", "passed")  # a completed group's verdict under a filter, kept while carried


class PartialRollouts(StreamPosition):
    """``collect(step) -> StepBatch`` with unfinished groups carried between steps; the
    arguments are :class:`~relax.rollout.collectors.PromptCollector`'s plus ``world``."""

    def __init__(self, rollout, batches, ctx, *, seed: int, source: PromptSource, tokenizer,
                 sampler, scorer, timer, tracker, max_aborted: int, mask_offpolicy: bool,
                 group_filter=None, filter_timeout: float | None = None,
                 agree: Agreement | None = None):
        self.ctx, self.source, self.tokenizer = ctx, source, tokenizer
        self.agree = agree or GroupAgreement(ctx.group, ctx.device)
        self.sampler, self.scorer, self.timer, self.tracker = sampler, scorer, timer, tracker
        self.seed, self.n = seed, batches.n_samples_per_prompt
        self.quota = batches.rollout_batch_size // ctx.world_size
        self.per_step = batches.over_sampling_batch_size // ctx.world_size
        self.max_len, self.max_aborted = rollout.sampling.rollout_max_response_len, max_aborted
        self.mask_offpolicy = mask_offpolicy
        # --dynamic-sampling-filter-path: groups are judged once, when they complete
        self.group_filter, self.filter_timeout = group_filter, filter_timeout
        self.rounds = batches.dynamic_sampling_max_rounds if group_filter is not None else 1
        self.format = dict(apply_chat_template=rollout.data.apply_chat_template,
                           system_prompt=rollout.data.system_prompt)
        self.cursor = 0  # prompts of the stream taken by all ranks so far
        self.carried: list[list[dict]] = []  # this rank's groups in flight: n rows each

    # ------------------------------------------------------------------ the step
    def collect(self, step: int) -> StepBatch:
        # after a resume with fewer ranks a rank may carry more than it starts
        count = max(0, self.per_step - len(self.carried))
        if self.group_filter is not None:
            # passing groups may all be carried (a short step): at least one fresh group keeps
            # every rank decoding in every round
            count = max(1, count)
        groups = self.carried + self._fresh(count)
        if self.group_filter is None:
            return self._unfiltered(step, groups)
        return self._filtered(step, groups)

    def _unfiltered(self, step: int, groups: list[list[dict]]) -> StepBatch:
        """The first ``quota`` complete groups; every other group is carried."""
        out = self._round(groups, step, 0)
        done = [i for i, g in enumerate(groups) if self._group_complete(g)][:self.quota]
        self.carried = [self._carry(g) for i, g in enumerate(groups) if i not in set(done)]
        self.tracker.add_sum("rollout/partial_carried_groups", len(self.carried))
        with self.timer("reward"):
            return self._batch([groups[i] for i in done], [out], step)

    def _filtered(self, step: int, groups: list[list[dict]]) -> StepBatch:
        """Rounds of decoding (at most ``--dynamic-sampling-max-rounds``): after each, the groups
        that completed are scored and filtered once; a failing group is dropped, a passing one
        waits (in row order) to be trained. The rounds end when every rank holds ``quota``
        passing groups, or some rank has no group left in flight; every rank trains on the
        fewest passing groups any rank holds (at most ``quota``) and carries the rest."""
        outs, judged, kept, rewards = [], 0, 0, []
        for r in range(self.rounds):
            outs.append(self._round(groups, step, r))
            with self.timer("reward"):
                groups, scored, passed = self._judge(groups)
            judged, kept, rewards = judged + len(scored) // self.n, kept + passed, rewards + scored
            have = sum(1 for g in groups if g[0].get("passed"))
            k, more = self._agree(have, sum(not self._group_complete(g) for g in groups))
            if not more:
                break
        trained = [i for i, g in enumerate(groups) if g[0].get("passed")][:k]
        self.carried = [self._carry(g) for i, g in enumerate(groups) if i not in set(trained)]
        t = self.tracker
        t.add_sum("rollout/partial_carried_groups", len(self.carried))
        t.add_sum("rollout/groups_generated", judged)
        t.add_sum("rollout/groups_kept", kept)
        t.add_sum("rollout/groups_trained", k)
        t.add_max("rollout/sampling_rounds", len(outs))
        t.add_ratio("rollout/filtered_fraction", judged - kept, judged)
        t.add_ratio("rollout/generated_reward", sum(rewards), len(rewards))
        if k < self.quota and self.ctx.is_main:
            print(f"relax train: warning: partial rollouts hold {k} of {self.quota} passing "
                  f"groups per rank after {len(outs)} rounds (--dynamic-sampling-max-rounds); "
                  + ("training on those" if k else "no update this step"), file=sys.stderr)
        return self._batch([groups[i] for i in trained], outs, step, scored=True)

    def _round(self, groups: list[list[dict]], step: int, round_: int) -> Rollout:
        """Continue the incomplete rows of ``groups`` until the stop rule holds."""
        rows = [r for g in groups for r in g]
        ready = [self._complete(r) for r in rows]  # rows that ended: not decoded again
        todo = [r for r, c in zip(rows, ready, strict=True) if not c]
        with self.timer("generate"):
            out = self._decode(todo, groups, ready, step, round_)
        self._extend(todo, out, step)
        return out

    def _judge(self, groups: list[list[dict]]) -> tuple[list[list[dict]], list[float], int]:
        """Score and filter the groups that completed and were not judged yet: each row keeps
        its reward, a passing group is marked, a failing one is dropped. Returns the groups
        left, the new rewards and how many groups passed. Every rank calls the scorer once
        per round (its error agreement is collective), with no rows when none completed."""
        new = [g for g in groups if self._group_complete(g) and "passed" not in g[0]]
        rows = [r for g in new for r in g]
        texts, labels = [r["text"] for r in rows], [r["label"] for r in rows]
        responses = [self.tokenizer.decode(r["ids"], skip_special_tokens=True) for r in rows]
        index = torch.arange(len(new), device=self.ctx.device).repeat_interleave(self.n)
        rewards = self.scorer.score(texts, responses, labels, index,
                                    tracker=self.tracker).tolist()
        passing = set(kept_groups(self.group_filter, rewards, responses, labels, self.n,
                                  timeout=self.filter_timeout))
        for j, g in enumerate(new):
            for m, r in enumerate(g):
                r["reward"], r["passed"] = rewards[j * self.n + m], j in passing
        left = [g for g in groups if g[0].get("passed", True)]
        return left, rewards, len(passing)

    def _agree(self, have: int, in_flight: int) -> tuple[int, bool]:
        """The groups every rank trains (the fewest passing groups any rank holds, at most
        ``quota``) and whether another round runs (some rank is short and every rank still has
        groups in flight, so every rank decodes in it): one all-reduce."""
        mins = torch.tensor([-float(min(have, self.quota)), -float(in_flight)],
                            dtype=torch.float64, device=self.ctx.device)
        mins = self.agree.reduce(mins, dist.ReduceOp.MAX).neg().long().tolist()
        return mins[0], mins[0] < self.quota and mins[1] > 0

    def _fresh(self, count: int) -> list[list[dict]]:
        """``count`` new groups of this rank: every rank's count is shared (one all-reduce),
        so the ranks take consecutive, disjoint prompts of the stream."""
        start, self.cursor = share_stream(self.cursor, count, self.ctx, self.agree)
        samples = self.source.take(start, count) if count else []
        texts = [format_prompt(self.tokenizer, s.prompt, **self.format) for s in samples]
        if not texts:
            return []
        ids, mask = tokenize_prompts(self.tokenizer, texts, "cpu")
        prompts = [row[keep].tolist() for row, keep in zip(ids, mask, strict=True)]
        return [[dict(prompt=p, text=t, label=s.label, ids=[], log_probs=[], versions=[],
                      eos=False, aborted=0) for _ in range(self.n)]
                for p, t, s in zip(prompts, texts, samples, strict=True)]

    def _complete(self, row: dict) -> bool:
        return row["eos"] or len(row["ids"]) >= self.max_len

    def _group_complete(self, group: list[dict]) -> bool:
        return all(self._complete(r) for r in group)

    def _decode(self, rows: list[dict], groups: list[list[dict]], ready: list[bool],
                step: int, round_: int) -> Rollout:
        """Continue ``rows`` (the incomplete ones) until the stop rule holds; ``ready``: which
        rows of ``groups`` were complete before the step."""
        device = self.ctx.device
        ids, mask = left_pad([r["prompt"] + r["ids"] for r in rows], self.tokenizer.pad_token_id,
                             device)
        budgets = torch.tensor([self.max_len - len(r["ids"]) for r in rows], device=device)
        must = torch.tensor([g[0]["aborted"] >= self.max_aborted for g in groups], device=device)
        ready = torch.tensor(ready, device=device)
        generator = rollout_generator(self.seed, self.ctx.rank, step, round_, device)

        def enough(finished: torch.Tensor) -> bool:
            """The quota of complete groups, and every group at the carry bound complete."""
            now = ready.clone()
            now[~ready] = finished
            complete = now.view(-1, self.n).all(-1)
            return int(complete.sum()) >= self.quota and bool(complete[must].all())

        return self.sampler(ids, mask, int(budgets.max()), generator, budgets=budgets,
                            stop=enough)

    def _extend(self, rows: list[dict], out: Rollout, step: int) -> None:
        """Append this step's tokens (and their sampler log-probs and step) to ``rows``; a
        mixture of experts' routing record is this decode's for the whole row (it prefilled
        the prompt and the earlier tokens again: the routing the newest sampler used)."""
        for i, r in enumerate(rows):
            keep = out.response_mask[i]
            r["ids"] = r["ids"] + out.response_ids[i][keep].tolist()
            r["log_probs"] = r["log_probs"] + out.log_probs[i][keep].tolist()
            r["versions"] = r["versions"] + [step] * int(keep.sum())
            r["eos"] = not bool(out.truncated[i])
            if out.routed_experts is not None:
                attended = torch.cat([out.prompt_mask[i], keep])
                r["routes"] = out.routed_experts[i][attended].cpu()

    def _carry(self, group: list[dict]) -> list[dict]:
        complete = self._group_complete(group)
        for r in group:
            r["aborted"] += 0 if complete else 1
        return group

    def _batch(self, groups: list[list[dict]], outs: list[Rollout], step: int, *,
               scored: bool = False) -> StepBatch:
        """The trained groups as the step's batch, scored now unless ``scored`` (their rows
        hold the rewards they were filtered with); ``outs`` (this step's decodes, one per
        round) are what was generated, for the generation metrics."""
        rows = [r for g in groups for r in g]
        device, pad = self.ctx.device, self.tokenizer.pad_token_id
        generated = outs[0] if len(outs) == 1 else concat_rollouts(outs, pad)
        decode_steps = sum(o.response_ids.shape[1] for o in outs)
        if not rows:  # a filtered step that holds no passing group on some rank: no update
            return StepBatch(prompts=[], labels=[], group_index=torch.zeros(0, dtype=torch.long,
                             device=device), rollout=generated.select([]), responses=[],
                             rewards=torch.zeros(0, device=device), generated=generated,
                             decode_steps=decode_steps)
        rollout = self._rows_rollout(rows, step)
        texts, labels = [r["text"] for r in rows], [r["label"] for r in rows]
        group_index = torch.arange(len(groups), device=device).repeat_interleave(self.n)
        responses = self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        rewards = (torch.tensor([r["reward"] for r in rows], dtype=torch.float32, device=device)
                   if scored else self.scorer.score(texts, responses, labels, group_index,
                                                    tracker=self.tracker))
        return StepBatch(prompts=texts, labels=labels, group_index=group_index, rollout=rollout,
                         responses=responses, rewards=rewards, generated=generated,
                         decode_steps=decode_steps)

    def _rows_rollout(self, rows: list[dict], step: int) -> Rollout:
        """``rows`` as a Rollout: every token in the context, this step's (or, without
        ``--mask-offpolicy-in-partial-rollout``, every) token trained."""
        device, pad = self.ctx.device, self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = left_pad([r["prompt"] for r in rows], pad, device)
        T = max(1, max(len(r["ids"]) for r in rows))
        ids = torch.full((len(rows), T), pad, dtype=torch.long)
        present = torch.zeros((len(rows), T), dtype=torch.bool)
        current = torch.zeros((len(rows), T), dtype=torch.bool)
        log_probs = torch.zeros((len(rows), T), dtype=torch.float32)
        for i, r in enumerate(rows):
            k = len(r["ids"])
            ids[i, :k] = torch.tensor(r["ids"], dtype=torch.long)
            present[i, :k] = True
            current[i, :k] = torch.tensor([v == step for v in r["versions"]], dtype=torch.bool)
            log_probs[i, :k] = torch.tensor(r["log_probs"], dtype=torch.float32)
        self.tracker.add_ratio("rollout/partial_offpolicy_tokens", (present & ~current).sum(),
                               present.sum())
        trained = current if self.mask_offpolicy else present
        return Rollout(prompt_ids, prompt_mask, ids.to(device), trained.to(device),
                       torch.tensor([not r["eos"] for r in rows], device=device),
                       context_mask=present.to(device) if self.mask_offpolicy else None,
                       log_probs=log_probs.to(device),
                       routed_experts=rows_routes(rows, prompt_ids.shape[1], T, device))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The stream position and this rank's groups in flight (plain lists: the rank's
        checkpoint file holds them)."""
        return {"cursor": self.cursor,
                "carried": [[{k: r[k] for k in ROW_KEYS + JUDGED if k in r} for r in g]
                            for g in self.carried]}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = int(state["cursor"])
        self.carried = [[dict(r) for r in g] for g in state.get("carried", [])]


def rows_routes(rows: list[dict], P: int, T: int, device) -> torch.Tensor | None:
    """The rows' routing records (``routes`` [prompt + ids, layers, k]) on the [B, P + T]
    grid of their Rollout, -1 elsewhere; None when a row has none (a dense model)."""
    if not rows or any("routes" not in r for r in rows):
        return None
    first = rows[0]["routes"]
    out = torch.full((len(rows), P + T, *first.shape[1:]), -1, dtype=first.dtype)
    for i, r in enumerate(rows):
        p, n = len(r["prompt"]), len(r["ids"])
        out[i, P - p:P + n] = r["routes"][:p + n]
    return out.to(device)


def share_stream(cursor: int, count: int, ctx, agree: Agreement) -> tuple[int, int]:
    """(this rank's first index, the cursor after this step) when every rank takes ``count``
    items of a stream at ``cursor``: the counts are shared (one reduction over the shares,
    relax/agreement.py), so the ranks take consecutive, disjoint items in rank order."""
    counts = torch.zeros(ctx.world_size, dtype=torch.float64, device=ctx.device)
    counts[ctx.rank] = count
    counts = agree.reduce(counts, dist.ReduceOp.SUM).long().tolist()
    return cursor + sum(counts[:ctx.rank]), cursor + sum(counts)


def deal_carried(states: list[dict | None], rank: int, world: int) -> dict | None:
    """``rank``'s collector state when a checkpoint of ``len(states)`` ranks resumes with
    ``world`` ranks: every saved rank's carried groups in global order (rank 0's first, each
    rank's in its own order), dealt out round-robin, so the new ranks hold the same groups
    between them, as evenly as can be. None when the states are not partial rollouts' (those
    collectors restart from the prompt-stream position)."""
    if not states or not all(isinstance(s, dict) and "carried" in s for s in states):
        return None
    every = [g for s in states for g in s["carried"]]
    return {"cursor": int(states[0]["cursor"]), "carried": every[rank::world]}
