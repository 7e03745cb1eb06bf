"""Utility-optimized LDP mechanisms for categorical data (Murakami & Kawamoto 2019; docs/frequency.md).

Public API: :class:`URR`, :class:`RR`, :class:`URAP`, :class:`RAPPOR` (privatize → counts →
estimate), :class:`PUM`, :func:`audit_uldp`, :class:`FrequencyCounts`,
:class:`FrequencyEstimate`, :class:`SparseBits`.
"""

from mechanisms.uldp.audit import AuditResult, audit_uldp
from mechanisms.uldp.base import FrequencyMechanism, project_simplex, threshold_estimate
from mechanisms.uldp.counts import FrequencyCounts, FrequencyEstimate
from mechanisms.uldp.pum import PUM
from mechanisms.uldp.sparse import SparseBits
from mechanisms.uldp.urap import RAPPOR, URAP
from mechanisms.uldp.urr import RR, URR

__all__ = [
    "PUM",
    "RAPPOR",
    "RR",
    "URAP",
    "URR",
    "AuditResult",
    "FrequencyCounts",
    "FrequencyEstimate",
    "FrequencyMechanism",
    "SparseBits",
    "audit_uldp",
    "project_simplex",
    "threshold_estimate",
]
