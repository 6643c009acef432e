"""The pattern vocabulary against dense masks written out pair by pair (tests/reference.py)."""

import pytest
import torch

from tests.reference import (
    band_rule,
    block_table_rule,
    causal_rule,
    global_rule,
    local_rule,
    rule_mask,
    strided_rule,
    summary_rule,
)
from variants import patterns as P

LENGTHS = (23, 37)  # odd, and not multiples of any block, stride or tile used here


def random_blocks(length, causal, seed=0, **window):
    return P.Random.draw(length, 5, 2, seed, causal=causal, **window)


# (pattern, hand-written rule); one case per primitive and option corner.
CASES = {
    "causal": (lambda L: P.Causal(), lambda L: causal_rule),
    "everything": (lambda L: P.Everything(), lambda L: lambda i, j: True),
    "local 5,1,1": (lambda L: P.Local(5, 1, 1), lambda L: local_rule(5, 1, 1)),
    "local 4,0,2": (lambda L: P.Local(4, 0, 2), lambda L: local_rule(4, 0, 2)),
    "local 3,2,0": (lambda L: P.Local(3, 2, 0), lambda L: local_rule(3, 2, 0)),
    "band 3": (lambda L: P.Band(3), lambda L: band_rule(3)),
    "strided 4": (lambda L: P.Strided(4), lambda L: strided_rule(4)),
    "strided 1": (lambda L: P.Strided(1), lambda L: strided_rule(1)),
    "global 3": (lambda L: P.Global(3, False), lambda L: global_rule(3, False)),
    "global 3 causal": (lambda L: P.Global(3, True), lambda L: global_rule(3, True)),
    "summary 5,2": (lambda L: P.Summary(5, 2), lambda L: summary_rule(5, 2)),
    "summary 4,4": (lambda L: P.Summary(4, 4), lambda L: summary_rule(4, 4)),
    "random": (
        lambda L: random_blocks(L, False),
        lambda L: block_table_rule(random_blocks(L, False).blocks.tolist(), 5),
    ),
}


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("case", CASES)
def test_predicate_equals_the_hand_written_mask(case, length):
    make, rule = CASES[case]
    assert torch.equal(make(length).dense(length), rule_mask(length, rule(length)))


@pytest.mark.parametrize("length", LENGTHS)
def test_union_intersection_and_complement_follow_their_parts(length):
    local, strided, glob = P.Local(5, 1, 0), P.Strided(4), P.Global(2, False)
    a, b, c = (
        rule_mask(length, r) for r in (local_rule(5, 1, 0), strided_rule(4), global_rule(2, False))
    )
    causal = rule_mask(length, causal_rule)
    assert torch.equal(((local | strided | glob) & P.Causal()).dense(length), (a | b | c) & causal)
    assert torch.equal((local & ~strided).dense(length), a & ~b)
    assert torch.equal(P.union([local]).dense(length), a)
    assert torch.equal(P.intersection([local, glob]).dense(length), a & c)


def assert_states_describe(pattern, length, tile, exact):
    """EMPTY tiles allow no pair, FULL ones every pair; with `exact`, PARTIAL ones some."""
    mask = pattern.dense(length)
    states = pattern.tile_states(length, tile)
    n = -(-length // tile)
    assert states.shape == (n, n)
    for a in range(n):
        for b in range(n):
            tile_mask = mask[a * tile : (a + 1) * tile, b * tile : (b + 1) * tile]
            state = int(states[a, b])
            if state == P.EMPTY:
                assert not tile_mask.any()
            elif state == P.FULL:
                assert tile_mask.all()
            elif exact:
                assert tile_mask.any() and not tile_mask.all()


@pytest.mark.parametrize("tile", [5, 4, 7])
@pytest.mark.parametrize("case", CASES)
def test_block_form_of_each_primitive_is_exact(case, tile):
    make, _ = CASES[case]
    assert_states_describe(make(37), 37, tile, exact=True)


@pytest.mark.parametrize("tile", [5, 6])
def test_block_form_of_compositions_is_safe(tile):
    for pattern in (
        (P.Local(5, 1, 0) | P.Strided(4) | P.Global(2, True)) & P.Causal(),
        P.Local(5, 1, 1) & ~P.Summary(5, 2),
        (random_blocks(37, True) | P.Summary(5, 1)) & P.Causal(),
    ):
        assert_states_describe(pattern, 37, tile, exact=False)


@pytest.mark.parametrize("tile", [5, 8])
@pytest.mark.parametrize("case", CASES)
def test_pair_count_equals_the_hand_written_mask(case, tile):
    make, rule = CASES[case]
    assert make(37).pairs(37, tile) == int(rule_mask(37, rule(37)).sum())


@pytest.mark.parametrize("case", CASES)
def test_shift_invariance_claims_hold(case):
    pattern = CASES[case][0](60)
    position = torch.arange(30)
    for period in (4, 5, 10):
        if pattern.shift_invariant(period):
            shifted = pattern.allows(position[:, None] + period, position[None, :] + period)
            assert torch.equal(shifted, pattern.allows(position[:, None], position[None, :]))


@pytest.mark.parametrize("causal", [False, True])
def test_random_draws_distinct_blocks_outside_the_window(causal):
    table = P.Random.draw(
        60, 5, 3, 7, causal=causal, look_backward=1, look_forward=1, skip_first=1
    ).blocks  # 12 x 12
    for query_block, row in enumerate(table.tolist()):
        drawn = [kb for kb, seen in enumerate(row) if seen]
        candidates = [
            kb
            for kb in range(12)
            if kb >= 1
            and not query_block - 1 <= kb <= query_block + (0 if causal else 1)
            and (kb < query_block or not causal)
        ]
        assert set(drawn) <= set(candidates)
        assert len(drawn) == min(3, len(candidates))


def test_random_is_reproducible_by_seed_and_differs_between_seeds():
    first = P.Random.draw(200, 5, 2, 11, causal=False).blocks
    assert torch.equal(first, P.Random.draw(200, 5, 2, 11, causal=False).blocks)
    assert not torch.equal(first, P.Random.draw(200, 5, 2, 12, causal=False).blocks)


def test_summary_positions_are_the_last_columns_of_each_block():
    assert P.Summary(5, 2).positions(23).tolist() == [3, 4, 8, 9, 13, 14, 18, 19]
