"""Exact AUC against a brute-force pair count; the schedule's shape."""

import itertools
import math

import torch

from neo.train.metrics import BinaryMetrics, exact_auc, log_loss
from neo.train.schedule import LRSchedule


def brute_auc(scores, labels):
    pos = [s for s, l in zip(scores, labels) if l]
    neg = [s for s, l in zip(scores, labels) if not l]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_matches_pair_count_with_ties():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(2, 60, (1,), generator=g))
        scores = torch.randint(0, 6, (n,), generator=g).float()        # many ties
        labels = torch.randint(0, 2, (n,), generator=g)
        if labels.min() == labels.max():
            continue
        assert math.isclose(exact_auc(scores, labels), brute_auc(scores.tolist(), labels.tolist()), rel_tol=1e-12)


def test_auc_edge_cases():
    assert exact_auc(torch.tensor([0.1, 0.9]), torch.tensor([0, 1])) == 1.0
    assert exact_auc(torch.tensor([0.9, 0.1]), torch.tensor([0, 1])) == 0.0
    assert math.isnan(exact_auc(torch.tensor([0.3, 0.4]), torch.tensor([1, 1])))


def test_binary_metrics_single_process():
    m = BinaryMetrics()
    m.update(torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.0]))
    m.update(torch.tensor([0.5]), torch.tensor([0.0]))
    r = m.compute()
    assert r["count"] == 3 and r["auc"] == 1.0 and math.isclose(r["accuracy"], 2 / 3)
    p = torch.sigmoid(torch.tensor([2.0, -1.0, 0.5]))
    expected = -(math.log(p[0]) + math.log(1 - p[1]) + math.log(1 - p[2])) / 3
    assert math.isclose(r["logloss"], expected, rel_tol=1e-6)
    assert math.isclose(log_loss(p, torch.tensor([1.0, 0.0, 0.0])), expected, rel_tol=1e-6)


def test_schedule():
    s = LRSchedule(1.0, warmup_steps=4, decay_start=10, decay_steps=10, power=2.0)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(9) == 1.0 and s(10) == 1.0
    assert math.isclose(s(15), 0.25) and s(20) == 0.0 and s(100) == 0.0
    # the shape the tables follow: lr / base_lr, and the same shape where the dense lr is 0 (before,
    # the tables then ran at their full rates throughout: audit of 2026-11-30)
    z = LRSchedule(0.0, warmup_steps=4, decay_start=10, decay_steps=10, power=2.0)
    assert [z.factor(i) for i in (0, 3, 9, 15, 20)] == [s.factor(i) for i in (0, 3, 9, 15, 20)] == \
        [0.25, 1.0, 1.0, s(15), 0.0]
    assert all(z(i) == 0.0 for i in range(25))


def test_a_decay_inside_the_warmup_is_refused():
    """decay_start before the warmup's end: the decay would be part done when the warmup ends and
    the lr would fall 4x in one step; refused, naming both fields."""
    import pytest

    from neo.config import ConfigError
    from neo.config.train import OptimConfig

    OptimConfig(lr=1.0, warmup_steps=4, decay_start=4, decay_steps=4).validate()
    OptimConfig(lr=1.0, warmup_steps=4, decay_start=0, decay_steps=0).validate()       # no decay: any start
    with pytest.raises(ConfigError, match=r"optim\.decay_start: 2 is inside the warmup \(optim\.warmup_steps = 4\)"):
        OptimConfig(lr=1.0, warmup_steps=4, decay_start=2, decay_steps=4).validate()


def test_nan_logits_have_no_auc_and_accuracy_is_exact_near_zero():
    """A NaN logit (a diverged model) gives NaN AUC and accuracy, as it gives NaN log loss (a sort
    ranked NaN above every number: AUC 1.0 for positives scored NaN); a logit of 1e-9 predicts a
    click (its float32 sigmoid rounds to 0.5)."""
    m = BinaryMetrics()
    m.update(torch.tensor([float("nan"), float("nan"), 0.2, -0.1]), torch.tensor([1.0, 1.0, 0.0, 0.0]))
    r = m.compute()
    assert math.isnan(r["auc"]) and math.isnan(r["accuracy"]) and math.isnan(r["logloss"])
    m = BinaryMetrics()
    m.update(torch.tensor([1e-9, -1e-9]), torch.tensor([1.0, 0.0]))
    assert m.compute()["accuracy"] == 1.0


def test_ne_and_calibration_equal_torchrecs():
    """Normalized entropy and calibration against TorchRec's own formulas (torchrec.metrics)."""
    import pytest

    ne_mod = pytest.importorskip("torchrec.metrics.ne")
    from torchrec.metrics.calibration import compute_calibration

    g = torch.Generator().manual_seed(3)
    for n, rate in ((50, 0.3), (400, 0.05), (1000, 0.5)):
        logits = torch.randn(n, generator=g) * 2 - 1
        labels = (torch.rand(n, generator=g) < rate).float()
        m = BinaryMetrics()
        m.update(logits[: n // 2], labels[: n // 2])
        m.update(logits[n // 2:], labels[n // 2:])
        r = m.compute()
        probs = torch.sigmoid(logits).double()
        w = torch.ones(n, dtype=torch.float64)
        ce = ne_mod.compute_cross_entropy(labels.double(), probs, w, 1e-7)
        want_ne = ne_mod.compute_ne(ce.sum(), w.sum(), labels.double().sum(), (1 - labels.double()).sum(), 1e-12)
        want_cal = compute_calibration(probs.sum(), labels.double().sum())
        assert math.isclose(r["ne"], float(want_ne), rel_tol=1e-6), (n, rate)
        assert math.isclose(r["calibration"], float(want_cal), rel_tol=1e-6), (n, rate)


def test_ne_and_calibration_of_one_class_are_nan():
    m = BinaryMetrics()
    m.update(torch.tensor([0.3, -0.2]), torch.tensor([0.0, 0.0]))
    r = m.compute()
    assert math.isnan(r["ne"]) and math.isnan(r["calibration"]) and math.isnan(r["auc"])
    assert math.isnan(BinaryMetrics().compute()["ne"])


def test_saturated_predictions_keep_their_log_loss():
    """Logits of +-30 (float32 probabilities of exactly 0 or 1): the log loss from the logits in
    float64, against the same sum written out with log1p."""
    logits = torch.tensor([30.0, -30.0, 30.0, -30.0, 2.0])
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
    m = BinaryMetrics()
    m.update(logits, labels)
    r = m.compute()
    want = sum(math.log1p(math.exp(-x)) if y else math.log1p(math.exp(x)) for x, y in zip(logits.tolist(),
                                                                                          labels.tolist())) / 5
    assert math.isclose(r["logloss"], want, rel_tol=1e-12)
    ctr = 0.6
    assert math.isclose(r["ne"], want / -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr)), rel_tol=1e-12)
