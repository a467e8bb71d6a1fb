"""Rollout-shaped micro-batches: a left-padded prompt and a right-padded completion per row,
as Tunix's GRPO learner hands them to its loss.

A row of a rollout micro-batch of sequence length L holds the prompt in its first
`prompt_len(L)` = L // 2 columns (real tokens at the end, pads in front) and the completion in
the rest (real tokens first, ending in eos unless the completion fills its slot, then pads),
so the shared `MicroBatch` fields keep their meaning:
- `tokens`: prompt ++ completion ids (what Tunix concatenates before calling the model);
- `targets`: the next token of each position (pad at the end), as for the other losses;
- `positions`, `segment_ids`: what `tunix.rl.common.process_ids` derives from the pads (the
  position among the row's real tokens; 1 on a real token, 0 on a pad), from that function;
- `loss_mask`: 0 over the prompt, the completion mask (`completion != pad`, as the learner
  builds it) over the completion, so its sum is the micro-batch's completion-token count;
- `advantages`: the row's advantage repeated over the row (Tunix's estimator, by group);
- `old_logprobs` / `ref_logprobs`: the completion's per-token log-probs under the initial
  policy (0 over the prompt), filled in by `with_policy_logprobs`.

Every value comes from one numpy generator seeded by the caller, so the data, and with it
the batch's digest, depend on the seed and step alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from arms.workload.batches import MicroBatch

PAD_ID = 0
"""The pad token id (the tokenizer's, as the rollout reports it)."""
EOS_ID = 1
"""The eos token id; real prompt and completion content is drawn from ids >= 2."""
FILL = 0.7
"""Without exact counts, the expected share of its slot a completion fills (times the cell's
mask_fraction): rollouts end at different lengths, and the ones this workload follows left
30% of their completion slots as padding."""


def prompt_len(seq: int) -> int:
    """Columns of a row of length `seq` given to the prompt (the completion has the rest)."""
    return seq // 2


def group_size(rows: int) -> int:
    """Completions per prompt (GRPO's num_generations) for a step of `rows` rows: 4 where it
    divides the rows, else 2; advantages are normalized within each group."""
    if rows % 2:
        raise ValueError(f"--batch {rows}: the tunix-grpo loss groups completions by prompt "
                         "(GRPO's num_generations of 2 or 4); give an even --batch")
    return 4 if rows % 4 == 0 else 2


def completion_lengths(rng: np.random.Generator, rows: int, slot: int, total: int | None,
                       fraction: float) -> np.ndarray:
    """Real completion tokens of each row: exactly `total` over the rows, spread unevenly
    (each row at most `slot`), or each row 1 + Binomial(slot - 1, fraction)."""
    if total is None:
        return 1 + rng.binomial(slot - 1, fraction, rows)
    if not 0 <= total <= rows * slot:
        raise ValueError(f"ragged count {total} is more completion tokens than the micro-batch "
                         f"holds ({rows} rows x {slot}-token completions = {rows * slot}); "
                         f"use counts <= {rows * slot} or a longer --seq")
    lengths = np.minimum(np.floor(rng.dirichlet(np.ones(rows)) * total).astype(int), slot)
    order = rng.permutation(rows)
    while lengths.sum() < total:  # the remainder, one token per row with room, in turn
        for row in order:
            if lengths.sum() < total and lengths[row] < slot:
                lengths[row] += 1
    return lengths


def _row(rng: np.random.Generator, vocab: int, prompt: int, completion: int,
         n_prompt: int, n_completion: int) -> np.ndarray:
    """One row's ids: pads, `n_prompt` prompt tokens, `n_completion` completion tokens (the
    last of them eos when the completion ends before its slot does), pads."""
    ids = np.full(prompt + completion, PAD_ID, np.int32)
    ids[prompt - n_prompt:prompt] = rng.integers(EOS_ID + 1, vocab, n_prompt)
    ids[prompt:prompt + n_completion] = rng.integers(EOS_ID + 1, vocab, n_completion)
    if 0 < n_completion < completion:
        ids[prompt + n_completion - 1] = EOS_ID
    return ids


def make_rollouts(*, seed: int, batch_size: int, seq_len: int, vocab_size: int,
                  num_micro_batches: int, loss_tokens: Sequence[int] | None = None,
                  mask_fraction: float = 1.0) -> list[MicroBatch]:
    """`num_micro_batches` rollout micro-batches of [batch_size, seq_len], log-probs unset.

    `loss_tokens` gives each micro-batch its exact number of completion tokens (its
    token-mean denominator), spread unevenly over its rows; otherwise each row's completion
    fills about FILL x `mask_fraction` of its slot. Advantages are Tunix's GRPO estimator over the
    whole step's rows (groups of `group_size` consecutive rows) on standard-normal rewards.
    """
    from tunix.rl.algo_core import compute_advantages
    from tunix.rl.common import process_ids

    prompt = prompt_len(seq_len)
    completion = seq_len - prompt
    if prompt < 1 or vocab_size <= EOS_ID + 1:
        raise ValueError(f"--seq {seq_len} / vocab {vocab_size}: a rollout needs a prompt "
                         "and a completion column each and ids beyond pad and eos")
    rows = batch_size * num_micro_batches
    rng = np.random.default_rng(seed)
    rewards = rng.standard_normal(rows)
    advantages = compute_advantages(rewards, group_size(rows)).astype(np.float32)
    batches = []
    for i in range(num_micro_batches):
        n_prompt = 1 + rng.binomial(prompt - 1, 0.5, batch_size)
        n_completion = completion_lengths(
            rng, batch_size, completion, None if loss_tokens is None else int(loss_tokens[i]),
            FILL * mask_fraction)
        ids = np.stack([_row(rng, vocab_size, prompt, completion, p, c)
                        for p, c in zip(n_prompt, n_completion, strict=True)])
        _, positions, _, segment_ids = process_ids(ids[:, :prompt], ids[:, prompt:], PAD_ID,
                                                   EOS_ID)
        loss_mask = np.zeros(ids.shape, np.float32)
        loss_mask[:, prompt:] = ids[:, prompt:] != PAD_ID
        adv = advantages[i * batch_size:(i + 1) * batch_size]
        batches.append(MicroBatch(
            tokens=ids,
            targets=np.concatenate([ids[:, 1:], np.full((batch_size, 1), PAD_ID, np.int32)], 1),
            positions=np.asarray(positions, np.int32),
            segment_ids=np.asarray(segment_ids, np.int32), loss_mask=loss_mask,
            advantages=np.repeat(adv[:, None], seq_len, axis=1)))
    return batches


def with_policy_logprobs(batches: Sequence[MicroBatch], policy, *, reference: bool
                         ) -> list[MicroBatch]:
    """`batches` with `old_logprobs` (and with `reference`, `ref_logprobs`) set to the
    completion's per-token log-probs under `policy`, computed the way Tunix's rollout does
    (`tunix.rl.common.compute_per_token_logps`, gradient stopped); 0 over the prompt."""
    import jax
    from flax import nnx
    from tunix.rl import common

    from arms.workload.tunix_call import tunix_module

    graph, state = nnx.split(tunix_module(policy))
    out = []
    for batch in batches:
        prompt = prompt_len(batch.tokens.shape[1])
        logps = common.compute_per_token_logps(
            graph, state, prompt_tokens=batch.tokens[:, :prompt],
            completion_tokens=batch.tokens[:, prompt:], pad_id=PAD_ID, eos_id=EOS_ID)
        full = np.zeros(batch.tokens.shape, np.float32)
        full[:, prompt:] = np.asarray(jax.device_get(logps), np.float32)
        out.append(batch._replace(old_logprobs=full, ref_logprobs=full if reference else None))
    return out
