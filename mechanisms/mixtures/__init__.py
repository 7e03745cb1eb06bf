"""Clustering and mixture models from ZIL-privatized records: DR k-means, DR Gaussian mixtures
with diagonal covariances, the exact deconvolution likelihood, and the component bookkeeping
(canonical order, matching) they share. docs/mechanisms.md §7.
"""

from mechanisms.mixtures.components import (
    canonical_order,
    match_components,
    max_centre_error,
    mixture_density,
    mixture_tv_distance,
)
from mechanisms.mixtures.deconvolution import DeconvolutionMixtureLoss
from mechanisms.mixtures.fit import MixtureFit, fit_gaussian_mixture, fit_kmeans
from mechanisms.mixtures.gaussian import GaussianMixtureLoss
from mechanisms.mixtures.kmeans import KMeansLoss

__all__ = [
    "DeconvolutionMixtureLoss",
    "GaussianMixtureLoss",
    "KMeansLoss",
    "MixtureFit",
    "canonical_order",
    "fit_gaussian_mixture",
    "fit_kmeans",
    "match_components",
    "max_centre_error",
    "mixture_density",
    "mixture_tv_distance",
]
