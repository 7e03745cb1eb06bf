"""Telemetry schema: which fields a report carries and how each is privatized (docs/schema.md §1–§2).

A :class:`TelemetrySchema` is written by hand in TOML, e.g.::

    name = "flights"
    version = 1

    [numeric]                 # all numeric fields form ONE ZIL vector
    zero_prob = 0.2
    scale = 1.0               # or: epsilon = 2.0 and delta = 0.25 (calibrated, record level)

    [[numeric.fields]]
    name = "arr_delay"
    low = -60.0
    high = 240.0
    unit = "min"

    [[categorical]]
    name = "carrier"
    categories = ["9E", "AA", "..."]
    sensitive = ["OO", "YV"]
    mechanism = "urap"        # or "urr"
    epsilon = 1.0
    # theta = 0.6             # uRAP only; default e^{ε/2}/(e^{ε/2}+1)
    # fallback = "other"      # unknown values map to this category instead of failing
    # personalized = { bots = 1 }   # PUM (docs/frequency.md §6): bot symbols appended to the domain

    [event_time]              # optional: each report carries its event time, rounded down
    field = "time_hour"       # the events' time column (not privatized)
    resolution = "1h"

    [privacy]                 # optional: the unit of every privacy statement (default "event")
    unit = "device"           # one device over one period ...
    period = "1d"
    reports_per_period = 24   # ... of at most 24 fresh reports (the device ledger enforces it)

The schema is frozen; its :attr:`TelemetrySchema.fingerprint` (16-byte blake2b of the canonical
JSON) travels in every wire record and changes with any parameter.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from ingest.client.privacy_summary import summarize
from ingest.client.schema_fields import (
    CategoricalField,
    ClientSettings,
    EventTimeSetting,
    NumericField,
    NumericGroup,
    PersonalizedSetting,
    PrivacySetting,
    check_unique,
)
from ingest.errors import SchemaError
from ingest.files import parse_toml, read_text_file
from ingest.model import FrozenModel

logger = logging.getLogger(__name__)

__all__ = [
    "CategoricalField",
    "ClientSettings",
    "EventTimeSetting",
    "NumericField",
    "NumericGroup",
    "PersonalizedSetting",
    "PrivacySetting",
    "TelemetrySchema",
]

_FINGERPRINT_DOMAIN = b"ldp-stream/schema/v1\n"


class TelemetrySchema(FrozenModel):
    """A versioned report schema (docs/schema.md §1–§2).

    Parameters
    ----------
    name : str
    version : int
        ≥ 1; bump it when the meaning of a field changes.
    description : str, optional
    numeric : NumericGroup, optional
        The ZIL vector; omitted when the schema has no numeric field.
    categorical : list of CategoricalField
        In wire order.
    client : ClientSettings, optional
        How clients draw their noise.
    event_time : EventTimeSetting, optional
        The events' time column and the resolution the client rounds it down to; without it the
        Kafka record timestamp is the event time of a record's reports.
    privacy : PrivacySetting, optional
        The unit of the privacy statements: one event (the default, also when omitted) or one
        device over a period of ``reports_per_period`` reports (docs/privacy.md §7).

    Raises
    ------
    SchemaError
        On any invalid parameter; the message names the field (e.g.
        ``numeric field 'arr_delay': low must be < high``). Field names must be unique across
        the whole schema (the event-time column included), and a schema must have at least one
        field.

    Notes
    -----
    Construct with :meth:`load` (TOML file), :meth:`loads` (TOML text) or :meth:`from_dict`;
    plain ``TelemetrySchema(...)`` raises pydantic's ``ValidationError`` instead of
    ``SchemaError``.
    """

    name: str = Field(min_length=1)
    version: int = Field(default=1, ge=1)
    description: str | None = None
    numeric: NumericGroup | None = None
    categorical: tuple[CategoricalField, ...] = ()
    client: ClientSettings | None = None
    event_time: EventTimeSetting | None = None
    privacy: PrivacySetting | None = None

    @model_validator(mode="after")
    def _whole(self) -> TelemetrySchema:
        names = [f.name for f in self.numeric.fields] if self.numeric else []
        names += [c.name for c in self.categorical]
        if not names:
            raise ValueError(f"schema {self.name!r} has no field")
        check_unique("field names", names)
        if self.event_time is not None and self.event_time.field in names:
            raise ValueError(f"event_time.field {self.event_time.field!r} is also a numeric or "
                             "categorical field: the time column must be a column of its own")
        return self

    @property
    def privacy_unit(self) -> PrivacySetting:
        """The ``[privacy]`` setting, ``unit = "event"`` when the schema has none."""
        return self.privacy if self.privacy is not None else PrivacySetting()

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TelemetrySchema:
        """Build and validate a schema from plain data (as parsed from TOML or JSON).

        Raises
        ------
        SchemaError
            Naming the offending field and the constraint.
        """
        if not isinstance(data, Mapping):
            raise SchemaError(f"schema must be a mapping, got {type(data).__name__}")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise SchemaError(_describe(exc, data)) from None

    @classmethod
    def loads(cls, text: str) -> TelemetrySchema:
        """Parse a schema from TOML text. Raises SchemaError on bad TOML or bad content."""
        return cls.from_dict(parse_toml(text, SchemaError, "schema is not valid TOML: "))

    @classmethod
    def load(cls, path: str | Path) -> TelemetrySchema:
        """Read a schema from a TOML file (``.toml``) or canonical JSON file (``.json``).

        Raises
        ------
        SchemaError
            If the file cannot be read or parsed, or the schema is invalid.
        """
        p = Path(path)
        text = read_text_file(p, SchemaError, f"cannot read schema file {str(p)!r}")
        if p.suffix.lower() == ".json":
            try:
                return cls.from_dict(json.loads(text))
            except json.JSONDecodeError as exc:
                raise SchemaError(f"schema file {str(p)!r} is not valid JSON: {exc}") from None
        return cls.loads(text)

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (``None`` entries dropped); ``from_dict(to_dict())`` == self."""
        return _drop_none(self.model_dump(mode="json"))

    def canonical_json(self) -> str:
        """Canonical JSON: keys sorted, no whitespace, defaults filled, ``None`` dropped.

        Stable across the key order of the source file; changes with any parameter.
        """
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)

    def dumps_toml(self) -> str:
        """A TOML rendering that :meth:`loads` parses back to an equal schema."""
        d = self.to_dict()
        out = [f"name = {_toml(d['name'])}", f"version = {d['version']}"]
        if "description" in d:
            out.append(f"description = {_toml(d['description'])}")
        if "numeric" in d:
            num = d["numeric"]
            out += ["", "[numeric]"]
            out += [f"{k} = {_toml(v)}" for k, v in num.items() if k != "fields"]
            for f in num["fields"]:
                out += ["", "[[numeric.fields]]"] + [f"{k} = {_toml(v)}" for k, v in f.items()]
        if "client" in d:
            out += ["", "[client]"] + [f"{k} = {_toml(v)}" for k, v in d["client"].items()]
        for table in ("event_time", "privacy"):
            if table in d:
                out += ["", f"[{table}]"] + [f"{k} = {_toml(v)}" for k, v in d[table].items()]
        for c in d.get("categorical", []):
            out += ["", "[[categorical]]"]
            for k, v in c.items():
                if k == "personalized":
                    inner = ", ".join(f"{a} = {_toml(b)}" for a, b in v.items())
                    out.append(f"personalized = {{ {inner} }}")
                else:
                    out.append(f"{k} = {_toml(v)}")
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------------ derived
    @cached_property
    def fingerprint(self) -> bytes:
        """16-byte blake2b digest of :meth:`canonical_json` (docs/schema.md §2).

        The calibrated scale is a deterministic function of fields that are hashed
        (epsilon, delta, zero_prob, d), so it is not hashed itself.
        """
        return hashlib.blake2b(_FINGERPRINT_DOMAIN + self.canonical_json().encode("utf-8"),
                               digest_size=16).digest()

    @property
    def numeric_names(self) -> tuple[str, ...]:
        """Numeric field names in ZIL-vector (column) order."""
        return tuple(f.name for f in self.numeric.fields) if self.numeric else ()

    @property
    def categorical_names(self) -> tuple[str, ...]:
        """Categorical field names in wire order."""
        return tuple(c.name for c in self.categorical)

    @property
    def time_resolution_s(self) -> int | None:
        """Seconds of ``[event_time] resolution``, or None without ``[event_time]``: what
        ``ingest.client.codec.encode`` takes as ``time_resolution`` for this schema's batches."""
        return self.event_time.resolution_s if self.event_time is not None else None

    @property
    def dim(self) -> int:
        """d, the number of numeric fields (0 if none)."""
        return len(self.numeric_names)

    def field(self, name: str) -> NumericField | CategoricalField:
        """Return the field called ``name``. Raises SchemaError if there is none."""
        for f in self.numeric.fields if self.numeric else ():
            if f.name == name:
                return f
        for c in self.categorical:
            if c.name == name:
                return c
        raise SchemaError(f"schema {self.name!r} has no field {name!r}")

    def categorical_field(self, name: str) -> CategoricalField:
        """Return the categorical field ``name``. Raises SchemaError if there is none."""
        f = self.field(name)
        if not isinstance(f, CategoricalField):
            raise SchemaError(f"field {name!r} is numeric, not categorical")
        return f

    @cached_property
    def resolved_scale(self) -> float | None:
        """λ: the declared scale, or the one calibrated from (epsilon, delta); None without numerics.

        Raises
        ------
        SchemaError
            If no scale meets the (epsilon, delta) target.
        """
        if self.numeric is None:
            return None
        if self.numeric.scale is not None:
            return float(self.numeric.scale)
        from mechanisms.privacy import calibrate_zil

        d = self.dim
        try:
            res = calibrate_zil(self.numeric.epsilon, self.numeric.delta, self.numeric.zero_prob,
                                math.sqrt(d), dim=d)
        except ValueError as exc:
            raise SchemaError(f"numeric: cannot calibrate scale for epsilon={self.numeric.epsilon}, "
                              f"delta={self.numeric.delta}: {exc}") from None
        return float(_scale_from_calibration(res))

    def zil_mechanism(self):
        """The :class:`mechanisms.zil.ZILMechanism` of the numeric block, or ``None``.

        Returns
        -------
        ZILMechanism or None
            ``ZILMechanism(zero_prob, resolved_scale, lows, highs)`` over the numeric fields in order.
        """
        if self.numeric is None:
            return None
        from mechanisms.zil import ZILMechanism

        lows = [f.low for f in self.numeric.fields]
        highs = [f.high for f in self.numeric.fields]
        return ZILMechanism(self.numeric.zero_prob, self.resolved_scale, lows, highs)

    def categorical_mechanism(self, name: str):
        """The uRR / uRAP mechanism object of categorical field ``name`` (``mechanisms.uldp``).

        For PUM fields the mechanism runs over the extended domain (categories + bots) with the
        bots added to the sensitive set.

        Raises
        ------
        SchemaError
            If ``name`` is not a categorical field.
        """
        f = self.categorical_field(name)
        from mechanisms import uldp

        sens = list(f.sensitive_codes)
        if f.mechanism == "urr":
            return uldp.URR(f.k, sens, f.epsilon)
        return uldp.URAP(f.k, sens, f.epsilon, theta=f.theta)

    def category_code(self, field: str, value: str) -> int:
        """Code (position in ``categories``) of ``value`` in categorical ``field``.

        Unknown values map to the field's ``fallback`` if declared.

        Raises
        ------
        SchemaError
            If the field is unknown or not categorical, or the value is unknown without fallback.
        """
        f = self.categorical_field(field)
        lut = self._code_tables[field]
        if isinstance(value, str) and value in lut:
            return lut[value]
        if f.fallback is not None and isinstance(value, str):
            return lut[f.fallback]
        raise SchemaError(f"categorical field {field!r}: unknown category {value!r}")

    @cached_property
    def _code_tables(self) -> dict[str, dict[str, int]]:
        return {c.name: {v: i for i, v in enumerate(c.categories)} for c in self.categorical}

    def privacy_summary(self, unit: PrivacySetting | None = None) -> dict[str, Any]:
        """Every field's privacy guarantee in plain data (for docs, CLI, serve and the demo).

        Parameters
        ----------
        unit : PrivacySetting, optional
            The unit to state the guarantees for; default the schema's own ``[privacy]`` (one
            event when it has none). The demo passes a device unit at a stated reporting rate.

        Returns
        -------
        dict
            ``{"schema", "version", "fingerprint", "unit": {...}, "numeric": {...} | None,
            "categorical": {name: {...}}, "event_time": {...}}``. ``unit`` names the unit, its
            period and reports, and says which guarantee holds for it. The numeric entry gives
            zero_prob and the exact-release statement, λ, d, c_I = √d/λ (record level), c_A = 1/λ
            (attribute level), per-field noise std in original units, (ε, δ̃) pairs per report at
            record and attribute level and, for a device unit, ``"composed"``: the same over the
            period's reports with the probability that one of them is an exact release. Each
            categorical entry gives the mechanism, ε, the sensitive-set size, what non-sensitive
            reports reveal and, for a device unit, its composed (ε, δ) for sensitive values.
            ``memoized`` (and the numeric ``memo_buckets``) say which parts are memoized.
            ``event_time`` says what event time travels in clear with the reports.

        Source: docs/privacy.md §1, §2, §7, docs/frequency.md §1, docs/schema.md §4.
        """
        return summarize(self, unit if unit is not None else self.privacy_unit)

    def __repr__(self) -> str:
        return (f"TelemetrySchema(name={self.name!r}, version={self.version}, "
                f"numeric={list(self.numeric_names)}, "
                f"categorical={list(self.categorical_names)}, fingerprint={self.fingerprint.hex()[:12]})")


# ---------------------------------------------------------------------- helpers
def _describe(exc: ValidationError, data: Mapping[str, Any]) -> str:
    """Turn pydantic errors into messages that name the schema field."""
    msgs = []
    for err in exc.errors():
        loc = list(err.get("loc", ()))
        label = _loc_label(loc, data)
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        # the field's own checks already start with "categorical field 'x'" / "numeric field 'x'"
        last = label.rsplit(".", 1)[-1] if label else ""
        named = bool(last) and msg.startswith(last + ":")
        named = named or (bool(label) and msg.startswith(label + " "))
        msgs.append(f"{label}: {msg}" if label and not named else msg)
    return "invalid schema: " + "; ".join(msgs)


def _loc_label(loc: list, data: Mapping[str, Any]) -> str:
    """``['categorical', 1, 'epsilon']`` → ``categorical field 'dest'.epsilon``."""
    parts: list[str] = []
    node: Any = data
    i = 0
    while i < len(loc):
        key = loc[i]
        if isinstance(node, Mapping) and key in node:
            nxt = node[key]
            if isinstance(nxt, list | tuple) and i + 1 < len(loc) and isinstance(loc[i + 1], int):
                idx = loc[i + 1]
                item = nxt[idx] if idx < len(nxt) else None
                kind = {"categorical": "categorical field", "fields": "numeric field"}.get(str(key), str(key))
                name = item.get("name") if isinstance(item, Mapping) else None
                parts.append(f"{kind} {name!r}" if name is not None else f"{kind}[{idx}]")
                node = item
                i += 2
                continue
            parts.append(str(key))
            node = nxt
        else:
            parts.append(str(key))
            node = None
        i += 1
    return ".".join(parts)


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    raise TypeError(f"cannot render {v!r} as TOML")


def _scale_from_calibration(res: Any) -> float:
    """Accept either λ directly or an object/mapping carrying ``scale``."""
    if isinstance(res, Mapping):
        return float(res["scale"])
    if hasattr(res, "scale"):
        return float(res.scale)
    return float(res)
