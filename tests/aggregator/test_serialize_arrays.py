"""``encode_arrays`` (the checkpoint format's array and float encoding, aggregator/state/serialize.py)
against the layout written out by hand: little-endian bytes in base64, the dtype string, the shape,
non-finite floats as ``{"__float__": repr}``, numpy scalars as Python numbers — whatever the
array's byte order, memory layout or container; and ``decode_arrays`` inverts it."""

from __future__ import annotations

import base64
import json
import math
from collections import OrderedDict

import numpy as np
import pytest

from aggregator.errors import StateError
from aggregator.state.serialize import decode_arrays, encode_arrays


def _expected_array(a: np.ndarray) -> dict:
    little = a.astype(a.dtype.newbyteorder("<"), copy=True) if a.dtype.itemsize > 1 else a.copy()
    raw = b"".join(little.ravel(order="C")[i:i + 1].tobytes() for i in range(little.size))
    return {"__nd__": little.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(raw).decode()}


ARRAYS = {
    "f8": np.arange(6, dtype=np.float64).reshape(2, 3) / 7.0,
    "f8-big-endian": (np.arange(5, dtype=np.float64) - 2.5).astype(">f8"),
    "i8-big-endian": np.arange(4, dtype=">i8") - 2,
    "f8-transposed": (np.arange(12, dtype=np.float64).reshape(3, 4) ** 1.5).T,
    "f8-strided": np.linspace(0.0, 1.0, 20)[::3],
    "i4": np.array([-3, 0, 7], dtype=np.int32),
    "u1": np.array([0, 255, 17], dtype=np.uint8),
    "bool": np.array([True, False, True]),
    "empty": np.zeros((0, 3)),
    "0-d": np.array(2.5),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_arrays_are_little_endian_base64_of_their_values(name):
    a = ARRAYS[name]
    got = encode_arrays(a)
    assert got == _expected_array(a)
    back = decode_arrays(json.loads(json.dumps(got)))
    assert back.dtype == a.dtype.newbyteorder("=") and back.shape == a.shape
    np.testing.assert_array_equal(back, a)


def test_containers_scalars_and_non_finite_floats():
    doc = {"a": [1, 2.5, True, None, "s", (3, 4)], 7: OrderedDict(x=np.float64(1.25), y=np.int64(-4)),
           "inf": math.inf, "nan": [math.nan, -math.inf], "arr": [ARRAYS["i4"]]}
    got = encode_arrays(doc)
    assert got == {"a": [1, 2.5, True, None, "s", [3, 4]], "7": {"x": 1.25, "y": -4},
                   "inf": {"__float__": "inf"}, "nan": [{"__float__": "nan"}, {"__float__": "-inf"}],
                   "arr": [_expected_array(ARRAYS["i4"])]}
    assert type(got["7"]["x"]) is float and type(got["7"]["y"]) is int
    json.dumps(got, allow_nan=False)  # plain JSON


def test_object_arrays_are_refused():
    with pytest.raises(StateError, match="cannot serialize an array of dtype object"):
        encode_arrays(np.array([object()], dtype=object))
