"""The fields of a telemetry schema: the numeric (ZIL) block and its fields, categorical fields,
their PUM setting, the client settings and the event-time setting (docs/schema.md).
:class:`ingest.client.schema.TelemetrySchema` puts them together; every name here is importable from
:mod:`ingest.client.schema`.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, field_validator, model_validator

from ingest.client.event_time import MAX_RESOLUTION_S, parse_duration
from ingest.model import FrozenModel

__all__ = [
    "DEFAULT_MEMO_BUCKETS",
    "MAX_MEMO_BUCKETS",
    "CategoricalField",
    "ClientSettings",
    "EventTimeSetting",
    "NumericField",
    "NumericGroup",
    "PersonalizedSetting",
    "PrivacySetting",
    "check_unique",
]

#: ``[privacy] reports_per_period``: at most this many reports per device and period (the
#: composition of 10⁵ reports is already no guarantee; beyond it the accounting only costs time).
MAX_REPORTS_PER_PERIOD = 100_000
#: ``[privacy] period``: from one minute to one year.
PERIOD_RANGE_S = (60, 366 * 86_400)
#: ``memo_buckets`` of a memoized numeric field when the schema does not say (docs/devices.md §3).
DEFAULT_MEMO_BUCKETS = 32
#: the largest ``memo_buckets``.
MAX_MEMO_BUCKETS = 65_536


class NumericField(FrozenModel):
    """One numeric field of the ZIL vector (docs/schema.md §1; docs/mechanisms.md §1.4–§1.5).

    Parameters
    ----------
    name : str
        Field name (the key in events / column in batches).
    low, high : float
        Finite bounds in original units, ``low < high``. Values are clipped into ``[low, high]``
        before noise is added; the guarantee holds only for the clipped box.
    unit, description : str, optional
        Documentation only (part of the fingerprint nonetheless).
    memoize : bool, optional
        ``true``: a device resends its memoized report while the field's α-rounded value stays in
        the same bucket (docs/devices.md §3; every numeric field or none). ``false`` (the default)
        is stored as absent, so it leaves the fingerprint unchanged.
    memo_buckets : int, optional
        With ``memoize = true``: the number of equal buckets of ``[low, high]`` the α-point
        rounding uses, 1 to 65,536 (default :data:`DEFAULT_MEMO_BUCKETS`, filled in).

    Raises
    ------
    SchemaError
        Through :class:`TelemetrySchema` when ``low >= high``, a bound is not finite, or
        ``memo_buckets`` is out of range or given without ``memoize = true``.
    """

    name: str = Field(min_length=1)
    low: float
    high: float
    unit: str | None = None
    description: str | None = None
    memoize: bool | None = Field(default=None, strict=True)
    memo_buckets: int | None = Field(default=None, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _memo_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("memoize") is False:  # the default: absent, as in schemas before memoize
                data = {k: v for k, v in data.items() if k != "memoize"}
            if data.get("memoize") is True and data.get("memo_buckets") is None:
                data = {**data, "memo_buckets": DEFAULT_MEMO_BUCKETS}
        return data

    @model_validator(mode="after")
    def _bounds(self) -> NumericField:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"numeric field {self.name!r}: low and high must be finite")
        if self.low >= self.high:
            raise ValueError(
                f"numeric field {self.name!r}: low must be < high, got low={self.low} high={self.high}"
            )
        if self.memo_buckets is not None:
            if not self.memoize:
                raise ValueError(f"numeric field {self.name!r}: memo_buckets needs memoize = true")
            if not 1 <= self.memo_buckets <= MAX_MEMO_BUCKETS:
                raise ValueError(f"numeric field {self.name!r}: memo_buckets must be an integer in "
                                 f"[1, {MAX_MEMO_BUCKETS}], got {self.memo_buckets}")
        return self


class NumericGroup(FrozenModel):
    """The numeric block: ONE ZIL(δ, λ²I) vector over all numeric fields (docs/schema.md §1;
    docs/mechanisms.md §1.3).

    Parameters
    ----------
    zero_prob : float
        δ ∈ (0, 1): probability that a report carries the **exact** (clipped) values.
    scale : float, optional
        λ > 0, noise std per unit of range (standardized coordinates). Give either ``scale`` or
        both ``epsilon`` and ``delta``.
    epsilon, delta : float, optional
        Target record-level (ε, δ′) guarantee; λ is calibrated with
        ``mechanisms.privacy.calibrate_zil`` for the standardized box of diameter √d
        (docs/privacy.md §2.7). Requires ``zero_prob < delta < 1`` and ``epsilon > 0``.
    fields : list of NumericField
        At least one field; names unique.

    Raises
    ------
    SchemaError
        Through :class:`TelemetrySchema` when both or neither of scale / (epsilon, delta) are
        given, ``delta <= zero_prob``, or a parameter is out of range.
    """

    zero_prob: float
    scale: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    fields: tuple[NumericField, ...]

    @model_validator(mode="after")
    def _params(self) -> NumericGroup:
        if not 0.0 < self.zero_prob < 1.0:
            raise ValueError(f"numeric.zero_prob must be in (0, 1), got {self.zero_prob}")
        has_scale = self.scale is not None
        has_target = self.epsilon is not None or self.delta is not None
        if has_scale == has_target:
            raise ValueError(
                "numeric: give either scale or both epsilon and delta (exactly one of the two), "
                f"got scale={self.scale}, epsilon={self.epsilon}, delta={self.delta}"
            )
        if has_scale and not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"numeric.scale must be a finite number > 0, got {self.scale}")
        if has_target:
            if self.epsilon is None or self.delta is None:
                raise ValueError("numeric: epsilon and delta must be given together")
            if not (math.isfinite(self.epsilon) and self.epsilon > 0):
                raise ValueError(f"numeric.epsilon must be a finite number > 0, got {self.epsilon}")
            if not self.zero_prob < self.delta < 1.0:
                raise ValueError(
                    f"numeric.delta must be in (zero_prob, 1) = ({self.zero_prob}, 1), got {self.delta} "
                    "(a ZIL report is exact with probability zero_prob, so delta > zero_prob)"
                )
        if not self.fields:
            raise ValueError("numeric.fields must list at least one field")
        check_unique("numeric.fields", [f.name for f in self.fields])
        memo = [f.name for f in self.fields if f.memoize]
        if memo and len(memo) != len(self.fields):
            rest = [f.name for f in self.fields if not f.memoize]
            raise ValueError(f"numeric: memoize must be true on every numeric field or on none (they "
                             f"share one ZIL noise vector); true on {memo}, not on {rest}")
        return self

    @property
    def memoized(self) -> bool:
        """Whether the numeric block is memoized (``memoize = true`` on every field)."""
        return bool(self.fields[0].memoize)


class PersonalizedSetting(FrozenModel):
    """PUM setting of a categorical field (docs/frequency.md §6; Murakami & Kawamoto 2019 §5).

    Parameters
    ----------
    bots : int
        κ ≥ 1 bot symbols ``⊥₁..⊥_κ`` appended to the domain (codes ``k .. k+κ−1``). A user maps
        her own personally sensitive values to her bot symbol before the common mechanism runs;
        the bots are sensitive in the extended domain.
    """

    bots: int = Field(default=1, ge=1, le=255)


class CategoricalField(FrozenModel):
    """One categorical field privatized with uRR or uRAP (docs/schema.md §1; docs/frequency.md §2–§3).

    Parameters
    ----------
    name : str
    categories : list of str
        The domain 𝒳 (k ≥ 2 distinct values); the code of a value is its position.
    sensitive : list of str
        𝒳_S ⊆ categories (may be empty only if ``personalized`` is set). Non-sensitive values
        may be revealed (uRR: w.p. c₃; uRAP: w.p. 1 − d₂).
    mechanism : {"urap", "urr"}
    epsilon : float
        ε > 0 of the ULDP guarantee for the sensitive values.
    theta : float, optional
        uRAP's θ ∈ (0, 1); default ``e^{ε/2}/(e^{ε/2}+1)``. Not allowed with uRR.
    fallback : str, optional
        A category that unknown (string) values are mapped to; ``None`` means unknown values
        are invalid.
    personalized : PersonalizedSetting, optional
        PUM with κ bot symbols.
    memoize : bool, optional
        ``true``: a device resends its memoized report of a value it has reported before
        (docs/devices.md §3). ``false`` (the default) is stored as absent, so it leaves the
        fingerprint unchanged.

    Raises
    ------
    SchemaError
        Through :class:`TelemetrySchema` when a constraint fails (the message names the field).
    """

    name: str = Field(min_length=1)
    categories: tuple[str, ...]
    sensitive: tuple[str, ...] = ()
    mechanism: str
    epsilon: float
    theta: float | None = None
    fallback: str | None = None
    personalized: PersonalizedSetting | None = None
    memoize: bool | None = Field(default=None, strict=True)

    @field_validator("mechanism", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("memoize")
    @classmethod
    def _memoize(cls, v: bool | None) -> bool | None:
        return True if v else None  # false is the default: absent, as in schemas before memoize

    @model_validator(mode="after")
    def _check(self) -> CategoricalField:
        where = f"categorical field {self.name!r}"
        if self.mechanism not in ("urap", "urr"):
            raise ValueError(f"{where}: mechanism must be 'urap' or 'urr', got {self.mechanism!r}")
        if len(self.categories) < 2:
            raise ValueError(f"{where}: categories must list at least 2 values, got {len(self.categories)}")
        check_unique(f"{where}: categories", list(self.categories))
        cats = set(self.categories)
        bad = [s for s in self.sensitive if s not in cats]
        if bad:
            raise ValueError(f"{where}: sensitive values not in categories: {bad}")
        check_unique(f"{where}: sensitive", list(self.sensitive))
        if not self.sensitive and self.personalized is None:
            raise ValueError(f"{where}: sensitive must list at least one category (or set personalized)")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"{where}: epsilon must be a finite number > 0, got {self.epsilon}")
        if self.theta is not None:
            if self.mechanism != "urap":
                raise ValueError(f"{where}: theta is a uRAP parameter, not allowed with {self.mechanism!r}")
            if not 0.0 < self.theta < 1.0:
                raise ValueError(f"{where}: theta must be in (0, 1), got {self.theta}")
        if self.fallback is not None and self.fallback not in cats:
            raise ValueError(f"{where}: fallback {self.fallback!r} is not one of the categories")
        return self

    @property
    def k(self) -> int:
        """Size of the wire domain: ``len(categories)`` plus κ bots for PUM fields."""
        return len(self.categories) + (self.personalized.bots if self.personalized else 0)

    @property
    def sensitive_codes(self) -> tuple[int, ...]:
        """Codes of the sensitive set in the wire domain (bots included for PUM), ascending."""
        idx = {c: i for i, c in enumerate(self.categories)}
        codes = sorted(idx[s] for s in self.sensitive)
        if self.personalized:
            codes += list(range(len(self.categories), self.k))
        return tuple(codes)

    @property
    def resolved_theta(self) -> float | None:
        """θ actually used (uRAP): the declared one or ``e^{ε/2}/(e^{ε/2}+1)``; None for uRR."""
        if self.mechanism != "urap":
            return None
        if self.theta is not None:
            return self.theta
        h = math.exp(self.epsilon / 2)
        return h / (h + 1.0)


class ClientSettings(FrozenModel):
    """``[client]``: how clients of this schema draw their noise (docs/privacy.md §6.3).

    Parameters
    ----------
    rng : {"os", "secure"}
        ``"os"`` (default): numpy's PCG64 seeded from OS entropy; ``"secure"``: ChaCha20 keyed from
        the OS CSPRNG (``mechanisms.rng.secure_generator``). Used by ``Privatizer`` when it is
        given ``rng=None``. Part of the fingerprint like every schema setting.
    """

    rng: str = "os"

    @field_validator("rng")
    @classmethod
    def _rng(cls, v: str) -> str:
        if v not in ("os", "secure"):
            raise ValueError(f"rng must be 'os' or 'secure', got {v!r}")
        return v


class EventTimeSetting(FrozenModel):
    """``[event_time]``: the column that holds each event's time, and how coarsely the client
    sends it (docs/schema.md §1, docs/wire-format.md §3.1).

    Parameters
    ----------
    field : str
        The time column of the events (ISO-8601 text, ``datetime64``, ``datetime`` or Unix
        seconds; ``ingest.client.event_time.to_unix_seconds``). Not a numeric or categorical field: it is
        not privatized.
    resolution : str
        A duration from ``"1s"`` to ``"7d"`` (``"30s"``, ``"15m"``, ``"1h"``, ``"1d"``); the client
        rounds every event time down to a multiple of it (Unix seconds, UTC), and the rounded
        time travels in clear with each report.

    Raises
    ------
    SchemaError
        Through :class:`TelemetrySchema` when ``resolution`` is not such a duration (the message
        names ``event_time.resolution``) or ``field`` is also the name of a schema field.
    """

    field: str = Field(min_length=1)
    resolution: str

    @field_validator("resolution")
    @classmethod
    def _resolution(cls, v: str) -> str:
        try:
            seconds = parse_duration(v, "event_time.resolution")
        except ValueError:
            seconds = None
        if seconds is None or seconds > MAX_RESOLUTION_S:
            raise ValueError("event_time.resolution must be a duration from \"1s\" to \"7d\" like "
                             f"\"30s\", \"15m\", \"1h\" or \"1d\", got {v!r}")
        return v

    @property
    def resolution_s(self) -> int:
        """The resolution in seconds (``"1h"`` → 3600)."""
        return parse_duration(self.resolution)


class PrivacySetting(FrozenModel):
    """``[privacy]``: the unit every privacy statement of the schema is about (docs/privacy.md §7).

    Parameters
    ----------
    unit : {"event", "device"}
        ``"event"`` (default): the guarantees protect one report, whatever else its device sends.
        ``"device"``: they protect everything one device sends in one ``period``, composed over
        ``reports_per_period`` reports; the client's device ledger refuses to send more
        (``ingest.device.ledger``).
    period : str, optional
        For ``unit = "device"``: a duration from ``"1m"`` to ``"366d"`` (``"1h"``, ``"1d"``,
        ``"7d"``); periods are aligned to the Unix epoch in UTC.
    reports_per_period : int, optional
        For ``unit = "device"``: how many fresh reports a device may send per period, 1 to
        100,000. With memoized fields a resent memoized report is not a fresh one.

    Raises
    ------
    SchemaError
        Through :class:`TelemetrySchema`, naming ``privacy.<key>``: an unknown unit, ``period`` or
        ``reports_per_period`` missing for ``"device"`` or given for ``"event"``, a period or count
        out of range.
    """

    unit: str = "event"
    period: str | None = None
    reports_per_period: int | None = None

    @model_validator(mode="after")
    def _check(self) -> PrivacySetting:
        if self.unit not in ("event", "device"):
            raise ValueError(f"privacy.unit must be 'event' or 'device', got {self.unit!r}")
        if self.unit == "event":
            if self.period is not None or self.reports_per_period is not None:
                raise ValueError("privacy.period and privacy.reports_per_period belong to "
                                 "unit = 'device'; with unit = 'event' every report is the unit")
            return self
        if self.period is None or self.reports_per_period is None:
            raise ValueError("privacy.unit = 'device' needs privacy.period (e.g. \"1d\") and "
                             "privacy.reports_per_period (e.g. 24)")
        lo, hi = PERIOD_RANGE_S
        try:
            seconds = parse_duration(self.period, "privacy.period")
        except ValueError:
            seconds = None
        if seconds is None or not lo <= seconds <= hi:
            raise ValueError("privacy.period must be a duration from \"1m\" to \"366d\" like "
                             f"\"1h\", \"1d\" or \"7d\", got {self.period!r}")
        t = self.reports_per_period
        if isinstance(t, bool) or not 1 <= t <= MAX_REPORTS_PER_PERIOD:
            raise ValueError(f"privacy.reports_per_period must be an integer in [1, "
                             f"{MAX_REPORTS_PER_PERIOD}], got {t!r}")
        return self

    @property
    def period_s(self) -> int | None:
        """The period in seconds (``"1d"`` → 86400); ``None`` for ``unit = "event"``."""
        return None if self.period is None else parse_duration(self.period)

    @property
    def reports(self) -> int:
        """Reports one statement composes: ``reports_per_period`` for a device, 1 for an event."""
        return 1 if self.reports_per_period is None else self.reports_per_period


def check_unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    dups = sorted({n for n in names if n in seen or seen.add(n)})
    if dups:
        raise ValueError(f"{what}: duplicate names {dups}")
