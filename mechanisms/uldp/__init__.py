"""Utility-optimized LDP mechanisms for categorical data (Murakami & Kawamoto 2019; DESIGN §3).

Public API: :class:`URR`, :class:`RR`, :class:`URAP`, :class:`RAPPOR` (privatize → counts →
estimate), :class:`FrequencyCounts`, :class:`FrequencyEstimate`, :class:`SparseBits`.
"""

from mechanisms.uldp.base import FrequencyMechanism, project_simplex, threshold_estimate
from mechanisms.uldp.counts import FrequencyCounts, FrequencyEstimate
from mechanisms.uldp.sparse import SparseBits
from mechanisms.uldp.urap import RAPPOR, URAP
from mechanisms.uldp.urr import RR, URR

__all__ = [
    "RAPPOR",
    "RR",
    "URAP",
    "URR",
    "FrequencyCounts",
    "FrequencyEstimate",
    "FrequencyMechanism",
    "SparseBits",
    "project_simplex",
    "threshold_estimate",
]
