"""placement.capacity: equal shares and the proposal rounds shared by the oracle, the pre-router,
the next-best re-batching and the sempar solver's token step (checked by hand)."""

from __future__ import annotations

import numpy as np

from sempar.placement.capacity import capacity_home, equal_shares, fill_in_order, proposal_rounds


def test_equal_shares():
    assert equal_shares(10, 4).tolist() == [3, 3, 2, 2]
    assert equal_shares(3, 4).tolist() == [1, 1, 1, 0]


def test_full_device_spills_to_the_askers_own_next_best():
    pref = np.array([[0, 2, 1], [0, 1, 2], [0, 1, 2]])
    home, room = proposal_rounds(pref, np.array([1.0, 3.0, 2.0]), np.array([1, 1, 1]))
    # device 0 takes the highest priority (item 1); item 2 asks 1, item 0 asks 2 (its own next)
    assert home.tolist() == [2, 0, 1] and room.tolist() == [0, 0, 0]


def test_ties_go_to_the_earlier_item_and_none_entries_are_skipped():
    pref = np.array([[0, 1], [0, 1], [-1, 1]])
    home, room = proposal_rounds(pref, np.zeros(3), np.array([1, 2]))
    assert home.tolist() == [0, 1, 1] and room.tolist() == [0, 0]


def test_weights_block_behind_a_heavy_asker_and_leftovers_are_the_callers():
    pref = np.array([[0], [0], [0]])
    home, room = proposal_rounds(pref, np.array([3.0, 2.0, 1.0]), np.array([2.0]),
                                 weight=np.array([1.0, 2.0, 1.0]))
    # item 0 (1) fits; item 1 (2) would make 3 > 2; item 2 counts item 1's weight before it too
    assert home.tolist() == [0, -1, -1] and room.tolist() == [1.0]
    assert fill_in_order(np.array([-1, 0, -1]), np.array([1, 0, 1])).tolist() == [0, 0, 2]


def test_per_round_priority():
    pref = np.array([[1, 0], [0, 1], [1, 0]])
    prio = np.array([[1.0, 9.0], [0.0, 0.0], [2.0, 0.0]])    # item 0 is strong only at device 0
    home, _ = proposal_rounds(pref, prio, np.array([2, 1]))
    # round 0: device 1 takes item 2 (2 > 1), device 0 takes item 1; round 1: item 0 -> 0
    assert home.tolist() == [0, 0, 1]


def test_capacity_home_per_batch():
    hits = np.array([[2, 0], [2, 1], [1, 1], [0, 2]])
    # one batch: device 0 keeps the two with most hits at their best (2, 2: earlier first)
    assert capacity_home(hits).tolist() == [0, 0, 1, 1]
    # batches of 2: each device takes one per batch; token 1 spills to device 1
    assert capacity_home(hits, 2).tolist() == [0, 1, 0, 1]
