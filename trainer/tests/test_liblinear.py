"""liblinear called directly gives LinearSVC's coefficients bit for bit."""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt
import pytest
import sklearn
from sklearn.exceptions import ConvergenceWarning
from sklearn.svm import LinearSVC

from polycorn_trainer.liblinear import linear_svc

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


def reference(
    x: F64, y: B, w: F64, *, c: float = 1.0, max_iter: int = 2000
) -> tuple[F64, float, int]:
    """LinearSVC as fit.py's reference path fits it."""
    m = LinearSVC(penalty="l2", loss="squared_hinge", C=c, dual="auto", max_iter=max_iter)
    with warnings.catch_warnings(), sklearn.config_context(assume_finite=True):
        warnings.simplefilter("ignore", ConvergenceWarning)
        m.fit(x, y, sample_weight=w)
    return m.coef_[0], float(m.intercept_[0]), int(m.n_iter_)


def balanced(y: B) -> F64:
    n, f = len(y), int(y.sum())
    return np.where(y, n / (2.0 * f), n / (2.0 * (n - f)))


def same(x: F64, y: B, w: F64, *, c: float = 1.0, max_iter: int = 2000) -> None:
    # The same draw from NumPy's global generator for both (LinearSVC's
    # random_state=None), so that the dual solver's shuffle is the same too.
    np.random.seed(1234)
    want = reference(x, y, w, c=c, max_iter=max_iter)
    np.random.seed(1234)
    got = linear_svc(x, y, w, c=c, max_iter=max_iter)
    assert got[0].tobytes() == want[0].tobytes(), (got, want)
    assert got[1] == want[1] or (np.isnan(got[1]) and np.isnan(want[1]))
    assert got[2] == want[2]


def cells(seed: int) -> list[tuple[F64, B]]:
    """Standardised features and rare failures, as the trainer fits them."""
    rng = np.random.default_rng(seed)
    out = []
    for n, d in ((100, 1), (100, 2), (37, 2), (8, 1), (2, 1), (3, 2)):
        x = rng.normal(size=(n, d))
        y = (x[:, 0] + rng.normal(size=n)) > 1.0
        y[0], y[-1] = True, False  # both classes
        out.append(((x - x.mean(axis=0)) / x.std(axis=0), y))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_cells_fit_as_linear_svc(seed: int) -> None:
    for x, y in cells(seed):
        same(np.ascontiguousarray(x), y, balanced(y))
        same(np.ascontiguousarray(x), y, np.ones(len(y)), c=0.3)


def test_degenerate_inputs_fit_as_linear_svc() -> None:
    # Duplicate points with both labels, a constant feature, separable
    # points, the iteration cap, fewer samples than features (the dual
    # solver, seeded from the global generator).
    dup = np.array([[0.5], [0.5], [0.5], [-1.0], [-1.0], [2.0]])
    dup_y = np.array([True, False, True, False, False, True])
    same(dup, dup_y, balanced(dup_y))
    const = np.column_stack([np.linspace(-1, 1, 10), np.ones(10)])
    const_y = np.arange(10) > 6
    same(const, const_y, balanced(const_y))
    sep = np.linspace(-2, 2, 20)[:, None]
    sep_y = sep[:, 0] > 0.3
    same(sep, sep_y, balanced(sep_y), c=100.0, max_iter=3)
    one = np.array([[0.3, -1.2]])
    few = np.array([[0.3, -1.2, 0.8]])
    with pytest.raises(ValueError):
        reference(one, np.array([True]), np.ones(1))
    with pytest.raises(ValueError):
        linear_svc(one, np.array([True]), np.ones(1), c=1.0, max_iter=2000)
    same(np.vstack([few, -few]), np.array([True, False]), np.ones(2))


@pytest.mark.parametrize("label", [True, False])
def test_one_class_is_refused_like_linear_svc(label: bool) -> None:
    x = np.linspace(0, 1, 5)[:, None]
    y = np.full(5, label)
    with pytest.raises(ValueError, match="at least 2 classes"):
        reference(x, y, np.ones(5))
    with pytest.raises(ValueError, match="at least 2 classes"):
        linear_svc(x, y, np.ones(5), c=1.0, max_iter=2000)


def test_the_input_must_be_what_linear_svc_would_make_of_it() -> None:
    x = np.asfortranarray(np.ones((4, 2)))
    with pytest.raises(ValueError, match="C-contiguous float64"):
        linear_svc(x, np.array([True, False, True, False]), np.ones(4), c=1.0, max_iter=10)
