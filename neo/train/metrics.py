"""Evaluation metrics: exact AUC (ties counted half, as the Mann-Whitney U statistic), log loss,
normalized entropy, calibration, accuracy.

Normalized entropy (NE; He et al., "Practical Lessons from Predicting Clicks on Ads at Facebook",
ADKDD 2014; TorchRec's ``NEMetric``): the log loss divided by the entropy of the evaluation set's
click rate p, ``-(p log p + (1 - p) log(1 - p))``: 1.0 for a model that predicts p for every
sample, lower is better; NaN when the labels hold one class only (the entropy is 0; TorchRec
then divides by its eta and reports about 1e11). Calibration (TorchRec's ``CalibrationMetric``):
the sum of the predicted probabilities over the number of positives (1.0: as many clicks
predicted as observed); NaN without positives (TorchRec: 0). The log loss is computed from the
logits in float64 (no clamping of saturated probabilities, where TorchRec clamps at 1e-12).

``BinaryMetrics`` accumulates predictions on each rank; ``compute(group)`` gathers every
rank's predictions (variable counts allowed) so that the AUC is exact over the whole
evaluation set, not an average of per-rank AUCs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.distributed as dist


def exact_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels``; ties between scores count 1/2.

    Computed as the Mann-Whitney U statistic over average ranks, in O(n log n), in float64.
    Returns NaN when only one class is present, or when a score is NaN (a sort would rank it
    above every number: a diverged model would get an AUC of up to 1).
    """
    scores = scores.detach().double().flatten()
    labels = labels.detach().flatten() > 0.5
    n_pos = int(labels.sum())
    n_neg = labels.numel() - n_pos
    if n_pos == 0 or n_neg == 0 or bool(torch.isnan(scores).any()):
        return float("nan")
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()                    # 1-based rank of each tie group's last member
    avg_rank = ends - (counts.double() - 1) / 2                # average 1-based rank of the group
    ranks = avg_rank[inverse]                                  # (n,) in sorted order
    pos_rank_sum = float(ranks[labels[order]].sum())
    return (pos_rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def log_loss(probs: torch.Tensor, labels: torch.Tensor, eps: float = 1e-7) -> float:
    p = probs.detach().double().clamp(eps, 1 - eps)
    y = labels.detach().double()
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


def normalized_entropy(logloss: float, labels: torch.Tensor) -> float:
    """``logloss`` over the entropy of the labels' click rate (module doc); NaN when the labels
    hold one class only (the entropy is 0)."""
    ctr = float(labels.detach().double().mean()) if labels.numel() else float("nan")
    if not 0 < ctr < 1:
        return float("nan")
    return logloss / -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))


def calibration(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Sum of the predicted probabilities over the number of positives; NaN without positives."""
    positives = float(labels.detach().double().sum())
    return float(probs.detach().double().sum()) / positives if positives > 0 else float("nan")


@dataclass
class BinaryMetrics:
    """Collects logits and labels of an evaluation pass."""

    logits: List[torch.Tensor] = field(default_factory=list)
    labels: List[torch.Tensor] = field(default_factory=list)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        self.logits.append(logits.detach().float().cpu().flatten())
        self.labels.append(labels.detach().float().cpu().flatten())

    def _gathered(self, group: Optional[dist.ProcessGroup]):
        logits = torch.cat(self.logits) if self.logits else torch.empty(0)
        labels = torch.cat(self.labels) if self.labels else torch.empty(0)
        if group is None or dist.get_world_size(group) == 1:
            return logits, labels
        both = torch.stack([logits, labels], dim=1)                          # (n, 2)
        sizes = [None] * dist.get_world_size(group)
        dist.all_gather_object(sizes, both.shape[0], group=group)
        padded = torch.zeros(max(sizes), 2)
        padded[: both.shape[0]] = both
        parts = [torch.zeros_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        merged = torch.cat([p[:n] for p, n in zip(parts, sizes)])
        return merged[:, 0], merged[:, 1]

    def compute(self, group: Optional[dist.ProcessGroup] = None) -> Dict[str, float]:
        """AUC, log loss, normalized entropy (``ne``), ``calibration``, accuracy and count over every
        rank's samples (all ranks get the result)."""
        logits, labels = self._gathered(group)
        if labels.numel() == 0:
            nan = float("nan")
            return {"auc": nan, "logloss": nan, "ne": nan, "calibration": nan, "accuracy": nan, "count": 0}
        # from the logits in float64: exact where a float32 probability saturates at 0 or 1
        loss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double()))
        return {
            "auc": exact_auc(logits, labels),
            "logloss": loss,
            "ne": normalized_entropy(loss, labels),
            "calibration": calibration(torch.sigmoid(logits.double()), labels),
            # a click predicted where the logit is > 0 (exact; a float32 sigmoid rounds to 0.5 near 0);
            # a NaN logit predicts nothing right
            "accuracy": float("nan") if bool(torch.isnan(logits).any())
            else float(((logits > 0).float() == labels).double().mean()),
            "count": int(labels.numel()),
        }
