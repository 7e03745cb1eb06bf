"""DR k-means restarts: centres the data do not place (a non-positive corrected cell weight, or
held on the box) are moved by splitting the largest other cell (``split_dead_cells``), and the
batch fit prefers the fit with the fewest such centres (``KMeansLoss.minimise``)."""

from __future__ import annotations

import numpy as np

from mechanisms.mixtures.kmeans import KMeansLoss, split_dead_cells, weighted_lloyd

TRUE = np.array([[-0.6, -0.6], [0.0, 0.0], [0.6, 0.6]])


def _three_clusters(rng, n_per=400, sd=0.05):
    return np.concatenate([c + sd * rng.standard_normal((n_per, 2)) for c in TRUE])


def test_split_moves_a_dead_centre_along_the_principal_axis_of_the_largest_cell():
    rng = np.random.default_rng(1)
    long_cell = rng.uniform(-1, 1, (3000, 1)) * [0.5, 0.0] + [0.0, 0.2] * rng.standard_normal((3000, 1))
    z = np.concatenate([long_cell, [3.0, 3.0] + 0.01 * rng.standard_normal((100, 2))])
    w = rng.uniform(0.5, 1.5, z.shape[0])
    C = np.array([[0.0, 0.0], [3.0, 3.0], [-5.0, 5.0]])  # centre 2: an empty cell
    out = split_dead_cells(z, w, C, np.array([False, False, True]))
    # independent: the weighted scatter of cell 0 about its centre, its top eigenvector
    cell = np.linalg.norm(z - C[0], axis=1) < np.linalg.norm(z - C[1], axis=1)
    r, wc = z[cell] - C[0], w[cell]
    scatter = np.einsum("i,ij,ik->jk", wc, r, r) / wc.sum()
    lam, vec = np.linalg.eigh(scatter)
    half = 0.5 * np.sqrt(lam[-1]) * vec[:, -1]
    assert abs(vec[0, -1]) > 0.9  # the long axis of the cell is the first field
    pair = np.sort(out[[0, 2], 0])
    np.testing.assert_allclose(pair, np.sort([C[0, 0] - half[0], C[0, 0] + half[0]]), rtol=1e-12)
    np.testing.assert_array_equal(out[1], C[1])


def test_split_then_lloyd_finds_the_centre_a_dead_start_missed():
    z = _three_clusters(np.random.default_rng(2))
    w = np.ones(z.shape[0])
    start = np.array([[-0.3, -0.3], [0.6, 0.6], [-0.9, 0.9]])  # one centre for two clusters, one dead
    C, _, W = weighted_lloyd(z, w, start)
    assert W[2] == 0 and np.allclose(C[2], start[2])  # Lloyd cannot move an empty cell's centre
    C2, conv, W2 = weighted_lloyd(z, w, split_dead_cells(z, w, C, W <= 0))
    assert conv and np.all(W2 > 0)
    np.testing.assert_allclose(np.sort(C2, axis=0), TRUE, atol=0.02)


def test_split_returns_none_when_nothing_is_dead_or_nothing_is_left_to_split():
    z = _three_clusters(np.random.default_rng(3))
    w = np.ones(z.shape[0])
    assert split_dead_cells(z, w, TRUE, np.zeros(3, bool)) is None
    assert split_dead_cells(z, w, TRUE, np.ones(3, bool)) is None


def test_held_on_box_flags_a_coordinate_on_either_bound():
    loss = KMeansLoss(3, 2, box=(-1.0, 1.0))
    C = np.array([[0.0, 0.0], [1.0, 0.2], [-0.5, -1.0]])
    assert loss.held_on_box(C).tolist() == [False, True, True]
    assert KMeansLoss(3, 2).held_on_box(C).tolist() == [False, False, False]


def test_minimise_splits_a_start_that_leaves_a_centre_outside_the_data():
    """A start given as θ₀ with an empty cell (n_init = 1): its DR-Lloyd result has a dead centre,
    the split restart places it, and the fit recovers the three clusters."""
    from mechanisms.corrected import corrected_loss

    z = _three_clusters(np.random.default_rng(4))
    loss = KMeansLoss(3, 2, box=(-1.0, 1.0), n_init=1)
    theta0 = np.array([[-0.3, -0.3], [0.6, 0.6], [-0.9, 0.9]]).ravel()
    theta, conv, how = loss.minimise(corrected_loss(loss, "naive"), z, None, theta0)
    C = loss.centres(theta)
    assert conv and "restarts with dead cells split" in how
    np.testing.assert_allclose(np.sort(C, axis=0), TRUE, atol=0.02)
    assert not loss.held_on_box(C).any()


def test_centres_beyond_the_distinct_points_stay_named_with_infinite_stderr():
    """Five centres on three distinct points (naive): two cells stay empty — a cell of identical
    points has no axis to split — and the fit names them for their cell weight."""
    import warnings

    from mechanisms.errors import ConvergenceWarning
    from mechanisms.mixtures import fit_kmeans

    x = np.repeat(TRUE * 4.0 + 5.0, 100, axis=0)  # fields in [0, 10]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit = fit_kmeans(x, k=5, low=[0.0, 0.0], high=[10.0, 10.0], method="naive")
    empty = [j for j, why in fit.unidentified.items() if "cell weight" in why]
    assert len(empty) == 2  # (the others may be named too: the Hessian of exact points is singular)
    se = fit.stderr.reshape(5, 2)
    for j in range(5):
        assert np.all(np.isinf(se[j])) == (j in fit.unidentified)
    placed = [j for j in range(5) if j not in empty]
    np.testing.assert_allclose(np.sort(fit.centres[placed], axis=0), TRUE * 4.0 + 5.0, atol=1e-9)
