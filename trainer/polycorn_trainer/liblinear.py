"""scikit-learn's ``LinearSVC``, called without the estimator around it.

The trainer fits three tiny SVMs (a hundred handovers, one or two features)
per cell, a few hundred thousand per refit of a large fleet. ``LinearSVC.fit``
spends some 20 times longer checking and converting its inputs than
liblinear spends solving, so :func:`linear_svc` calls the same solver the
same way ``LinearSVC.fit`` does (``sklearn.svm._base._fit_liblinear``, for
``LinearSVC(penalty="l2", loss="squared_hinge", dual="auto", tol=1e-4,
fit_intercept=True, intercept_scaling=1, class_weight=None,
random_state=None)``): the same arrays, the same solver type and
parameters, the same seed drawn from the same generator. Its coefficients
are therefore bit for bit those of ``LinearSVC`` (``tests/test_liblinear.py``
asserts it); what it leaves out is only validation the trainer does itself
(finite, standardised, two classes).

``sklearn.svm._liblinear`` is a private module of scikit-learn: the
trainer pins scikit-learn's version (``trainer/pyproject.toml``) and the
test above fails if an upgrade changes what ``LinearSVC`` computes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from sklearn.svm import _liblinear  # the solver LinearSVC calls

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

# liblinear's solver types (sklearn.svm._base._get_liblinear_solver_type):
# L2-regularised squared hinge loss, primal (trust-region Newton) or dual
# (coordinate descent, which shuffles with the seed).
L2R_L2LOSS_SVC_DUAL = 1
L2R_L2LOSS_SVC = 2
TOL = 1e-4  # LinearSVC's default
EPSILON = 0.1  # _fit_liblinear's default (used by the regression solvers only)
INTERCEPT_SCALING = 1  # LinearSVC's default: the bias feature's value
INT_MAX = int(np.iinfo("i").max)


def linear_svc(
    x: F64, y: B, sample_weight: F64, *, c: float, max_iter: int
) -> tuple[F64, float, int]:
    """``LinearSVC(C=c, max_iter=max_iter).fit(x, y, sample_weight)``: its
    ``coef_[0]`` (one value per feature), ``intercept_[0]`` and ``n_iter_``.
    ``x`` is a C-contiguous float64 (samples × features) array, ``y`` the
    boolean labels, ``sample_weight`` float64 per sample. Raises
    ``ValueError`` as ``LinearSVC`` does when ``y`` has one class only."""
    if x.ndim != 2 or x.dtype != np.float64 or not x.flags.c_contiguous:
        raise ValueError("x must be a C-contiguous float64 array of samples x features")
    n_pos = int(np.count_nonzero(y))
    if n_pos in (0, len(y)):
        raise ValueError(
            "This solver needs samples of at least 2 classes in the data, but the data "
            f"contains only one class: {n_pos > 0!r}"
        )
    # dual="auto": the dual problem when there are fewer samples than features.
    solver = L2R_L2LOSS_SVC_DUAL if x.shape[0] < x.shape[1] else L2R_L2LOSS_SVC
    # LabelEncoder's codes (False -> 0, True -> 1) as liblinear's float labels.
    labels = np.require(y.astype(np.float64), requirements="W")
    weights = np.require(np.asarray(sample_weight, dtype=np.float64), requirements=("C", "W"))
    # random_state=None: a seed from NumPy's global generator, as check_random_state(None).
    seed = np.random.mtrand._rand.randint(INT_MAX)
    _liblinear.set_verbosity_wrap(0)
    raw, n_iter = _liblinear.train_wrap(
        x,
        labels,
        False,  # dense
        solver,
        TOL,
        float(INTERCEPT_SCALING),  # bias
        c,
        np.ones(2, dtype=np.float64),  # class_weight=None
        max_iter,
        seed,
        EPSILON,
        weights,
    )
    coef: F64 = raw[0, :-1]
    intercept = float(INTERCEPT_SCALING * raw[0, -1])
    return coef, intercept, int(np.max(n_iter))
