"""Serialized form of a state: ``FORMAT_MAGIC`` + a UTF-8 JSON document, arrays base64.

The document is ``{"class", "query", "query_digest", "schema", "n", "data"}``: the state class's
name, the query name, the first 16 hex digits of the SHA-256 of the query spec (canonical JSON),
the schema fingerprint (hex) and the number of reports; ``data`` is the class's own plain-data
dict (``State._get_data``) with every numpy array replaced by
``{"__nd__": dtype, "shape": […], "b64": …}`` (little-endian bytes) and every non-finite float by
``{"__float__": repr}``. Never pickle. This layout is the checkpoint format of the state topic;
:func:`state_from_bytes` checks class, query and schema before restoring.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from typing import Any

import numpy as np

from aggregator.errors import StateError
from aggregator.queries import Query, parse_query

__all__ = ["FORMAT_MAGIC", "decode_arrays", "encode_arrays", "query_digest", "schema_fingerprint",
           "state_from_bytes", "state_to_bytes"]

FORMAT_MAGIC = b"LDPS1\n"
"""Leading bytes of every serialized state (format version 1)."""


def encode_arrays(obj: Any) -> Any:
    """Recursively replace numpy arrays by ``{"__nd__": dtype, "shape": …, "b64": …}`` (little-endian)."""
    t = type(obj)  # the plain types first, by identity (a closed window pane is serialized per pane)
    if t is int or t is str or t is bool or obj is None:
        return obj
    if t is float:
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if t is list or t is tuple:
        return [encode_arrays(v) for v in obj]
    if t is dict:
        return {str(k): encode_arrays(v) for k, v in obj.items()}
    if t is np.ndarray and obj.dtype.kind in "fiub" and obj.dtype.str[0] in "<|":
        # already little-endian: its bytes as they are (tobytes is C order; the general case below)
        return {"__nd__": obj.dtype.str, "shape": list(obj.shape),
                "b64": base64.b64encode(obj.tobytes()).decode()}
    if isinstance(obj, np.ndarray):
        dt = obj.dtype.newbyteorder("<") if obj.dtype.byteorder not in ("|", "=", "<") else obj.dtype
        a = np.ascontiguousarray(obj, dtype=dt.newbyteorder("<") if dt.kind in "fiub" else dt)
        if a.dtype.kind not in "fiub":
            raise StateError(f"cannot serialize an array of dtype {a.dtype}")
        return {"__nd__": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode()}
    if isinstance(obj, dict):
        return {str(k): encode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_arrays(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"__float__": repr(obj)}
    return obj


def decode_arrays(obj: Any) -> Any:
    """Inverse of :func:`encode_arrays`.

    Raises
    ------
    StateError
        On a malformed array entry.
    """
    if isinstance(obj, dict):
        if "__nd__" in obj:
            try:
                dt = np.dtype(obj["__nd__"])
                if dt.kind not in "fiub":
                    raise ValueError(f"dtype {dt} not allowed")
                raw = base64.b64decode(obj["b64"], validate=True)
                shape = tuple(int(s) for s in obj["shape"])
                a = np.frombuffer(raw, dtype=dt).reshape(shape)
            except (KeyError, TypeError, ValueError) as exc:
                raise StateError(f"malformed array in serialized state: {exc}") from None
            return a.astype(dt.newbyteorder("="), copy=True)
        if "__float__" in obj and len(obj) == 1:
            return float(obj["__float__"])
        return {k: decode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_arrays(v) for v in obj]
    return obj


#: Digests by query object (queries are frozen): a windowed query serializes one state per pane.
_DIGESTS: dict[int, tuple[Query, str]] = {}


def query_digest(query: Query) -> str:
    """First 16 hex digits of the SHA-256 of the query spec as canonical JSON (a query without a
    ``window`` has the digest it had before windows existed: its checkpoints stay readable)."""
    hit = _DIGESTS.get(id(query))
    if hit is not None and hit[0] is query:
        return hit[1]
    digest = _query_digest(query)
    if len(_DIGESTS) > 4096:
        _DIGESTS.clear()
    _DIGESTS[id(query)] = (query, digest)
    return digest


def _query_digest(query: Query) -> str:
    spec = query.model_dump(mode="json")
    if spec.get("window", 0) is None:
        del spec["window"]
    doc = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def schema_fingerprint(schema) -> str:
    """The schema fingerprint as hex (``str`` of it when it is not bytes)."""
    fp = getattr(schema, "fingerprint", b"")
    if callable(fp):
        fp = fp()
    return fp.hex() if isinstance(fp, (bytes, bytearray)) else str(fp)


def state_to_bytes(state) -> bytes:
    """``state``'s serialized form (see the module docstring); :meth:`State.to_bytes`."""
    doc = {
        "class": type(state).__name__,
        "query": state.query.name,
        "query_digest": query_digest(state.query),
        "schema": schema_fingerprint(state.schema),
        "n": state._n,
        "data": encode_arrays(state._get_data()),
    }
    return FORMAT_MAGIC + json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def state_from_bytes(data: bytes, query, schema, *, expected: type | None = None, loss=None):
    """Restore a state written by :func:`state_to_bytes`, of the class the document names.

    Parameters
    ----------
    data : bytes
    query : Query or mapping
        Must be the same spec the state was built with.
    schema : TelemetrySchema
        Must have the same fingerprint.
    expected : type, optional
        The restored class must be this one or a subclass (``RenewableState.from_bytes``); None: any
        registered state class.
    loss : loss object, optional
        A custom query's resolved loss, passed to the state class (no user code is imported;
        see :func:`aggregator.state.build_state`).

    Returns
    -------
    State

    Raises
    ------
    StateError
        Bad magic, malformed JSON, another class/query/schema, a malformed ``data`` entry.
    ConfigError
        ``loss`` given for a query that is not ``custom``.
    """
    from aggregator.state.registry import construct, known_classes

    raw = bytes(data)
    if not raw.startswith(FORMAT_MAGIC):
        raise StateError("serialized state does not start with the LDPS1 magic")
    try:
        doc = json.loads(raw[len(FORMAT_MAGIC):].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"serialized state is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "class" not in doc or "data" not in doc:
        raise StateError("serialized state lacks 'class' or 'data'")
    klass = next((c for c in known_classes() if c.__name__ == doc["class"]), None)
    if klass is None:
        raise StateError(f"unknown state class {doc['class']!r}")
    if expected is not None and not issubclass(klass, expected):
        raise StateError(f"serialized state is a {doc['class']}, not a {expected.__name__}")
    q = parse_query(query)
    if doc.get("query") != q.name or doc.get("query_digest") != query_digest(q):
        raise StateError(
            f"serialized state belongs to query {doc.get('query')!r} with another spec; "
            f"cannot restore it as {q.name!r}"
        )
    if doc.get("schema") != schema_fingerprint(schema):
        raise StateError("serialized state was written for another schema (fingerprint differs)")
    state = construct(klass, q, schema, loss)
    try:
        state._set_data(decode_arrays(doc["data"]))
        state._n = int(doc["n"])
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise StateError(f"serialized {doc['class']} is malformed: {exc!r}") from None
    return state


def _restore(klass, data, query, schema):
    """Unpickling a state (``State.__reduce__``): its serialized form, never its attributes."""
    return klass.from_bytes(data, query, schema)
