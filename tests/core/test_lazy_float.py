"""LazyFloat: forward_backward's return value reads the device once, when first used, and behaves as a number."""

from __future__ import annotations

import math
import pickle
import statistics

import pytest
import torch

from twinkle.engine import LazyFloat


class Probe:
    """A device value that counts how often it is read."""

    def __init__(self, value: float) -> None:
        self.value, self.reads = value, 0

    def detach(self) -> Probe:
        return self

    def __float__(self) -> float:
        self.reads += 1
        return self.value


def test_nothing_is_read_until_the_number_is_used_and_then_once():
    total, count = Probe(6.0), Probe(4.0)
    loss = LazyFloat(total, count)
    assert total.reads == count.reads == 0
    assert float(loss) == 1.5 and loss == 1.5 and f"{loss:.2f}" == "1.50"
    assert total.reads == count.reads == 1


def test_it_is_the_per_item_mean_with_at_least_one_item():
    assert float(LazyFloat(torch.tensor(9.0, dtype=torch.float64), torch.tensor(3))) == 3.0
    assert float(LazyFloat(torch.tensor(2.0), 0)) == 2.0  # no items: the sum, as max(items, 1) says
    assert float(LazyFloat(5)) == 5.0


def test_it_behaves_as_a_number():
    loss = LazyFloat(torch.tensor(3.0), 2)
    assert loss + 1 == 2.5 and 1 + loss == 2.5 and loss * 2 == 3.0 and 3 / loss == 2.0 and loss - loss == 0.0
    assert loss < 2 and loss >= 1.5 and -loss == -1.5 and abs(-loss) == 1.5 and round(loss) == 2
    assert repr(loss) == "1.5" and str(loss) == "1.5" and hash(loss) == hash(1.5) and bool(loss)
    # approx and isclose accept it as a number (the point here); 3 / 2 is exact, compared exactly above
    assert loss == pytest.approx(1.5) and math.isclose(loss, 1.5) and math.isfinite(loss)
    assert statistics.mean([loss, LazyFloat(2.5)]) == 2.0 and sum([loss, loss]) == 3.0
    assert loss.item() == 1.5


def test_pickling_sends_a_plain_float():
    """Ray results and torch.save keep a number, never the device tensors."""
    restored = pickle.loads(pickle.dumps(LazyFloat(torch.tensor(3.0), 2)))
    assert type(restored) is float and restored == 1.5
