"""Gradient parity as a verdict: PASS, FAIL (naming the known cause where there is one), or
None for a cell that checked no parity.

Every arm of a cell is given the same micro-batches and the same loss. The exact gradient of
that work is the sum/sum gradient g_exact = sum_i grad(loss_sum_i) / sum_i den_i: every loss
token weighs the same whichever micro-batch holds it. A record's `parity.rel_l2` is
||g - g_exact|| / ||g_exact|| for the gradient g its optimizer saw at the first warmup step.
Two float32 programs that compute the same sum in a different order differ by ~1e-6 on it;
`GRAD_TOLERANCE` leaves an order of magnitude above that and stays far below any real
difference in what is computed (a mean of micro-batch means is off by 1e-1 to 1e0 on ragged
batches, a bfloat16 rounding by ~1e-3). Work computed in bfloat16 is rounded at every
operation, so two programs of it differ by far more: its tolerance is sized by the floor the
record measures (`tolerance`).

A trainer that computes something else than sum/sum does not do the same work, so its
speed is not comparable with an arm that does. The known causes are read from the record
(which arm, which GA, which denominators), never guessed from the size of rel_l2.

This module imports nothing but `reports.record` (the standard library), so the harness can
judge a cell the moment it finishes.
"""

from __future__ import annotations

import dataclasses

from reports.record import Parity, Record, Spec

GRAD_TOLERANCE = 1e-5
"""Largest rel_l2 vs the exact sum/sum gradient (float32) that passes gradient parity."""

FLOOR_FACTOR = 1.0
"""A cell computing in bfloat16 is held to FLOOR_FACTOR x its floor: rel_l2 of the exact
reference against the same reference in float32 (`Parity.floor_rel_l2`), the whole rounding
error of the dtype on this gradient. An arm doing the same work in the same dtype rounds at
the same places as the reference, only summing in another order, so it lies well inside
that: on small-untied seq 128 batch 4, `engine` and `native` are 7.50e-3 (GA 1) and 7.89e-3
(GA 4) from the bfloat16 reference, whose floor is 2.57e-2 and 2.42e-2 (0.29 and 0.33
floors). Doing other work moves the gradient by more than the dtype's whole rounding error:
a mean of micro-batch means on ragged batches is off by 1e-1 to 1e0."""


TOLERANCE_RULE = f"PASS <= {GRAD_TOLERANCE:g}; bfloat16: <= its floor"
"""The rule `tolerance` applies, for a table's header."""


def tolerance(parity: Parity) -> float:
    """The largest rel_l2 that passes: GRAD_TOLERANCE for float32 work, FLOOR_FACTOR x the
    floor for work in a lower dtype (never below GRAD_TOLERANCE)."""
    if parity.floor_rel_l2 is None:
        return GRAD_TOLERANCE
    return max(GRAD_TOLERANCE, FLOOR_FACTOR * parity.floor_rel_l2)

PASS, FAIL = "PASS", "FAIL"

MEAN_OF_MEANS = "mean of micro-batch means (optax.MultiSteps)"
"""Tunix's PeftTrainer accumulates with optax.MultiSteps: the mean over micro-batches of each
micro-batch's mean loss gradient. That equals sum/sum only when every micro-batch has the same
denominator; with ragged loss-token counts the small micro-batches weigh too much."""

BF16_TIED_HEAD = "tied output head read in bfloat16 (MaxText 0.2.5; tied presets)"
"""MaxText's Qwen3 casts the embedding to bfloat16 for a tied output head, so its logits and
gradient differ from float32 by ~1e-3 whatever the trainer; untied presets are exact."""

_PEFT_ARMS = ("peft-decoder", "peft-maxtext", "peft-tunix")
"""The named arms whose trainer is Tunix's PeftTrainer (a pair is spelled `peft:MODEL`)."""
_MAXTEXT_MODEL_ARMS = ("peft-maxtext", "maxtext-engine")
"""The named arms on MaxText's Qwen3 (a pair is spelled `TRAINER:maxtext`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParityVerdict:
    """One cell's gradient parity, judged."""

    status: str
    """PASS or FAIL."""
    rel_l2: float | None
    """The measured ||g - g_exact|| / ||g_exact||; None when it was not finite."""
    tolerance: float
    """The largest rel_l2 that passes."""
    causes: tuple[str, ...] = ()
    """For a FAIL: the known reasons this arm's gradient is not sum/sum on this work (empty
    when none is known). Always empty for a PASS."""

    @property
    def passed(self) -> bool:
        return self.status == PASS

    @property
    def measured(self) -> str:
        """'rel_l2 8.28e-01 > 1e-05' (the comparison that decided it)."""
        value = "not finite" if self.rel_l2 is None else f"{self.rel_l2:.2e}"
        return f"rel_l2 {value} {'<=' if self.passed else '>'} {self.tolerance:g}"

    @property
    def cause(self) -> str:
        """The known causes joined ('' for a PASS; 'cause unknown' for a FAIL with none)."""
        if self.passed:
            return ""
        return "; ".join(self.causes) or "cause unknown"

    def text(self) -> str:
        """'PASS (rel_l2 1.79e-06 <= 1e-05)' or 'FAIL (rel_l2 8.28e-01 > 1e-05: mean of
        micro-batch means (optax.MultiSteps))': one line for a console or a table cell."""
        return f"{self.status} ({self.measured}{': ' + self.cause if self.cause else ''})"


def judge(arm: str | None, spec: Spec | None, parity: Parity | None
          ) -> ParityVerdict | None:
    """The verdict of one cell's parity section (None when it has none: not checked), at
    the section's `tolerance`."""
    if parity is None:
        return None
    limit = tolerance(parity)
    rel = parity.rel_l2
    finite = rel is not None and rel == rel and abs(rel) != float("inf")
    if finite and rel <= limit:
        return ParityVerdict(status=PASS, rel_l2=rel, tolerance=limit)
    return ParityVerdict(status=FAIL, rel_l2=rel if finite else None, tolerance=limit,
                         causes=known_causes(arm or "", spec, parity))


def parity_verdict(record: Record) -> ParityVerdict | None:
    """PASS / FAIL of a record's gradient parity against the exact sum/sum gradient, with the
    known cause of a FAIL; None when the record checked no parity (a later round, a failed
    cell, `--no-parity`).

    `verdict.status` is "PASS" or "FAIL", `verdict.passed` the same as a bool, `verdict.text()`
    one line such as 'FAIL (rel_l2 8.28e-01 > 1e-05: mean of micro-batch means
    (optax.MultiSteps))'.
    """
    return judge(record.arm, record.spec, record.parity)


def known_causes(arm: str, spec: Spec | None, parity: Parity) -> tuple[str, ...]:
    """Why this arm's gradient is known not to be sum/sum on this work, from the record alone:
    - a PeftTrainer arm at GA > 1 whose micro-batches have unequal denominators (ragged loss
      tokens) averages micro-batch means (optax.MultiSteps);
    - an arm on MaxText's Qwen3 reads a tied output head in bfloat16 (where the record says
      the head is tied, or does not say)."""
    causes = []
    ga = spec.ga if spec is not None else len(parity.denominators)
    if _is_peft(arm) and ga > 1 and len(set(parity.denominators)) > 1:
        causes.append(MEAN_OF_MEANS + _as_predicted(parity))
    if (arm in _MAXTEXT_MODEL_ARMS or arm.endswith(":maxtext")) and parity.tied_head is not False:
        causes.append(BF16_TIED_HEAD)
    return tuple(causes)


def _as_predicted(parity: Parity) -> str:
    """', at its predicted rel_l2 8.28e-01 (the mean of means to 3.1e-07: PASS)': what the
    record says of the mean of micro-batch means, where it computed one ('' else): its own
    distance from the exact gradient (the rel_l2 a trainer averaging micro-batch means is
    predicted to show), and the trainer's distance from it, judged at the cell's
    tolerance."""
    predicted, measured = parity.predicted_rel_l2, parity.mean_of_means_rel_l2
    if predicted is None or measured is None:
        return ""
    verdict = PASS if measured <= tolerance(parity) else FAIL
    return (f", at its predicted rel_l2 {predicted:.2e} (the mean of means to "
            f"{measured:.1e}: {verdict})")


def _is_peft(arm: str) -> bool:
    return arm in _PEFT_ARMS or arm.startswith("peft:")
