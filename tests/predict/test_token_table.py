"""TokenTable: lookups, compact bytes, JSON round trip through a Placement."""

import numpy as np
import pytest

from sempar.errors import InputError
from sempar.placement.placement import Placement
from sempar.predict.token_table import TokenTable


def table() -> TokenTable:
    return TokenTable(np.array([3, 7, 10]), np.array([[0, 1, 2], [2, 2, 0]]),
                      np.array([[0.5, 0.9, 1.0], [0.25, 0.3, 0.7]]))


def test_lookup_known_and_unknown() -> None:
    dev, conf = table().lookup(np.array([7, 4, 10, 3, 99]))
    assert dev.tolist() == [[1, 2], [-1, -1], [2, 0], [0, 2], [-1, -1]]
    assert conf[0].tolist() == pytest.approx([0.9, 0.3])
    assert conf[1].tolist() == [-1.0, -1.0]
    d1, _ = table().lookup(np.array([10, 11]), layer=1)
    assert d1.tolist() == [0, -1]


def test_bytes_are_int16_devices() -> None:
    assert table().nbytes()["device"] == 2 * 6
    assert table().device.dtype == np.int16


def test_rejects_unsorted_and_misshaped() -> None:
    with pytest.raises(InputError, match="sorted"):
        TokenTable(np.array([3, 2]), np.zeros((1, 2)), np.zeros((1, 2)))
    with pytest.raises(InputError, match="shape"):
        TokenTable(np.array([1, 2]), np.zeros((1, 3)), np.zeros((1, 3)))


def test_round_trip_through_placement_json() -> None:
    p = Placement(np.array([[0, 1, 2, 3], [3, 2, 1, 0]]), 4, 4, np.zeros(4, int), "x",
                  token_table=table())           # the table names devices 0..2
    d = p.to_json()
    assert "token_table" in d["info"]          # on disk inside "info", where files have it
    q = Placement.from_json(d)
    t = q.token_table
    assert isinstance(t, TokenTable)
    assert t.token_id.tolist() == [3, 7, 10]
    assert t.device.tolist() == table().device.tolist()
    assert np.allclose(t.confidence, table().confidence, atol=1e-4)
