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

Tokens sampled in an earlier step are off-policy: ``--mask-offpolicy-in-partial-rollout``
leaves them out of the loss (they stay in the context); otherwise the importance correction
(``--use-tis`` or ``--use-rollout-logprobs``, required by the configuration) weighs them with
the sampler's log-probs (reinforce_plus_plus.md §7a).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax.rollout.agreement import Agreement, GroupAgreement
from relax.rollout.batch import StepBatch
from relax.rollout.collectors import StreamPosition, rollout_generator
from relax.rollout.data import PromptSource, format_prompt
from relax.rollout.generate import Rollout, left_pad, tokenize_prompts

ROW_KEYS = ("prompt", "text", "label", "ids", "log_probs", "versions", "eos", "aborted")


class PartialRollouts(StreamPosition):
    """``collect(step) -> StepBatch`` with unfinished groups carried between steps; the
    arguments are :class:`~relax.rollout.collectors.PromptCollector`'s plus ``world``."""

    def __init__(self, rollout, batches, ctx, *, seed: int, source: PromptSource, tokenizer,
                 sampler, scorer, timer, tracker, max_aborted: int, mask_offpolicy: bool,
                 agree: Agreement | None = None):
        self.ctx, self.source, self.tokenizer = ctx, source, tokenizer
        self.agree = agree or GroupAgreement(ctx.group, ctx.device)
        self.sampler, self.scorer, self.timer, self.tracker = sampler, scorer, timer, tracker
        self.seed, self.n = seed, batches.samples_per_prompt
        self.quota = batches.rollout_batch_size // ctx.world_size
        self.per_step = batches.over_sampling_batch_size // ctx.world_size
        self.max_len, self.max_aborted = rollout.sampling.max_response_len, max_aborted
        self.mask_offpolicy = mask_offpolicy
        self.format = dict(apply_chat_template=rollout.data.apply_chat_template,
                           system_prompt=rollout.data.system_prompt)
        self.cursor = 0  # prompts of the stream taken by all ranks so far
        self.carried: list[list[dict]] = []  # this rank's groups in flight: n rows each

    # ------------------------------------------------------------------ the step
    def collect(self, step: int) -> StepBatch:
        groups = self.carried + self._fresh(self.per_step - len(self.carried))
        rows = [r for g in groups for r in g]
        ready = [self._complete(r) for r in rows]  # carried rows that ended: not decoded again
        todo = [r for r, c in zip(rows, ready, strict=True) if not c]
        with self.timer("generate"):
            out = self._decode(todo, groups, ready, step)
        self._extend(todo, out, step)
        complete = [self._complete(r) for r in rows]
        done = [i for i in range(len(groups))
                if all(complete[i * self.n:(i + 1) * self.n])][:self.quota]
        self.carried = [self._carry(g, all(complete[i * self.n:(i + 1) * self.n]))
                        for i, g in enumerate(groups) if i not in set(done)]
        self.tracker.add_sum("rollout/partial_carried_groups", len(self.carried))
        with self.timer("reward"):
            return self._batch([groups[i] for i in done], out, step)

    def _fresh(self, count: int) -> list[list[dict]]:
        """``count`` new groups of this rank: every rank's count is shared (one all-reduce),
        so the ranks take consecutive, disjoint prompts of the stream."""
        counts = torch.zeros(self.ctx.world_size, dtype=torch.float64, device=self.ctx.device)
        counts[self.ctx.rank] = count
        counts = self.agree.reduce(counts, dist.ReduceOp.SUM).long().tolist()
        start = self.cursor + sum(counts[:self.ctx.rank])
        self.cursor += sum(counts)
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

    def _decode(self, rows: list[dict], groups: list[list[dict]], ready: list[bool],
                step: int) -> Rollout:
        """Continue ``rows`` (the incomplete ones) until the stop rule holds; ``ready``: which
        rows of ``groups`` were complete before the step."""
        device = self.ctx.device
        ids, mask = left_pad([r["prompt"] + r["ids"] for r in rows], self.tokenizer.pad_token_id,
                             device)
        budgets = torch.tensor([self.max_len - len(r["ids"]) for r in rows], device=device)
        must = torch.tensor([g[0]["aborted"] >= self.max_aborted for g in groups], device=device)
        ready = torch.tensor(ready, device=device)
        generator = rollout_generator(self.seed, self.ctx.rank, step, 0, device)

        def enough(finished: torch.Tensor) -> bool:
            """The quota of complete groups, and every group at the carry bound complete."""
            now = ready.clone()
            now[~ready] = finished
            complete = now.view(-1, self.n).all(-1)
            return int(complete.sum()) >= self.quota and bool(complete[must].all())

        return self.sampler(ids, mask, int(budgets.max()), generator, budgets=budgets,
                            stop=enough)

    def _extend(self, rows: list[dict], out: Rollout, step: int) -> None:
        """Append this step's tokens (and their sampler log-probs and step) to ``rows``."""
        for i, r in enumerate(rows):
            keep = out.response_mask[i]
            r["ids"] = r["ids"] + out.response_ids[i][keep].tolist()
            r["log_probs"] = r["log_probs"] + out.log_probs[i][keep].tolist()
            r["versions"] = r["versions"] + [step] * int(keep.sum())
            r["eos"] = not bool(out.truncated[i])

    def _carry(self, group: list[dict], complete: bool) -> list[dict]:
        for r in group:
            r["aborted"] += 0 if complete else 1
        return group

    def _batch(self, groups: list[list[dict]], out: Rollout, step: int) -> StepBatch:
        """The complete groups as the step's batch (scored); ``out`` (this step's decode) is
        what was generated, for the generation metrics."""
        rows = [r for g in groups for r in g]
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
        rollout = Rollout(prompt_ids, prompt_mask, ids.to(device), trained.to(device),
                          torch.tensor([not r["eos"] for r in rows], device=device),
                          context_mask=present.to(device) if self.mask_offpolicy else None,
                          log_probs=log_probs.to(device))
        texts, labels = [r["text"] for r in rows], [r["label"] for r in rows]
        group_index = torch.arange(len(groups), device=device).repeat_interleave(self.n)
        responses = self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        rewards = self.scorer.score(texts, responses, labels, group_index, tracker=self.tracker)
        return StepBatch(prompts=texts, labels=labels, group_index=group_index, rollout=rollout,
                         responses=responses, rewards=rewards, generated=out,
                         decode_steps=out.response_ids.shape[1])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The stream position and this rank's groups in flight (plain lists: the rank's
        checkpoint file holds them)."""
        return {"cursor": self.cursor,
                "carried": [[{k: r[k] for k in ROW_KEYS} for r in g] for g in self.carried]}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = int(state["cursor"])
        self.carried = [[dict(r) for r in g] for g in state.get("carried", [])]
