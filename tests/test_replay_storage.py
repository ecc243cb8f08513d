"""Reference tests for the replay storage layer (zmqrl.parts.replay): no sockets, no processes.

Everything is checked against a direct, obviously-correct computation: cumulative-sum
search for the sum tree, the textbook formulas for priorities and importance weights,
plain Python bookkeeping for keys, eviction and the rate limiter's window.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from zmqrl.parts.replay import RateLimiter, ReplayTable, SumTree

# ---------------------------------------------------------------------------- sum tree

CAPACITIES = [1, 2, 3, 5, 8, 13, 100, 1000]


def brute_find(prio: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """First slot whose cumulative sum exceeds the query; out-of-range queries clamp to
    the first / last slot with positive priority (what SumTree.find promises)."""
    cums = np.cumsum(prio)
    last_positive = int(np.flatnonzero(prio > 0)[-1])
    found = np.searchsorted(cums, np.maximum(queries, 0.0), side="right")
    return np.minimum(found, last_positive)


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_sum_tree_total_and_find_match_brute_force(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    # Small integers: sums are exact in float64, so the tree and np.cumsum must agree
    # bit for bit, even for queries exactly on a boundary. Plenty of zeros, which must
    # never be found.
    prio = rng.integers(0, 4, capacity).astype(np.float64)
    prio[rng.integers(capacity)] = 2.0
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), prio)
    total = prio.sum()
    assert tree.total == total
    cums = np.cumsum(prio)
    queries = np.concatenate([
        rng.uniform(0.0, total, 2000),
        cums[cums < total],  # exact boundaries: belong to the next positive slot
        [0.0, -1.0, np.nextafter(total, 0.0), total, 2 * total],  # clamped ends
    ])
    found = tree.find(queries)
    np.testing.assert_array_equal(found, brute_find(prio, queries))
    assert np.all(prio[found] > 0)  # never a zero-priority or padding leaf
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), prio)
    assert tree.min() == prio.min()


@pytest.mark.parametrize("capacity", [1, 37, 1000])
def test_sum_tree_random_float_priorities(capacity: int) -> None:
    rng = np.random.default_rng(100 + capacity)
    prio = rng.exponential(1.0, capacity)
    prio[rng.random(capacity) < 0.1] = 0.0
    prio[0] = 0.5
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), prio)
    assert math.isclose(tree.total, prio.sum(), rel_tol=1e-12)
    queries = rng.uniform(0.0, tree.total, 5000)
    found = tree.find(queries)
    expected = brute_find(prio, queries)
    # The tree adds in a different order than np.cumsum, so a query within rounding
    # distance of a boundary may legitimately land on either side of it; anything
    # else must agree exactly.
    cums = np.cumsum(prio)
    for i in np.flatnonzero(found != expected):
        assert np.min(np.abs(cums - queries[i])) < 1e-9 * tree.total
    assert np.all(prio[found] > 0)
    assert tree.min() == prio.min()


def test_sum_tree_batched_updates_last_duplicate_wins() -> None:
    capacity = 37
    rng = np.random.default_rng(7)
    tree = SumTree(capacity)
    ref = np.zeros(capacity)
    filled = np.zeros(capacity, dtype=bool)
    for _ in range(50):
        idx = rng.integers(0, capacity, rng.integers(1, 20))  # duplicates likely
        val = rng.integers(0, 10, idx.shape[0]).astype(np.float64)
        tree.update(idx, val)
        for i, v in zip(idx, val, strict=True):  # sequential assignment: the last one wins
            ref[i] = v
            filled[i] = True
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), ref)
        assert tree.total == ref.sum()
        assert tree.min() == ref[filled].min()
        if ref.sum() > 0:
            q = rng.uniform(0.0, ref.sum(), 200)
            np.testing.assert_array_equal(tree.find(q), brute_find(ref, q))


def test_sum_tree_min_ignores_unfilled_slots_and_validates() -> None:
    tree = SumTree(10)
    assert tree.min() == math.inf
    with pytest.raises(ValueError, match="total priority is 0"):
        tree.find(np.array([0.0]))
    tree.update(np.array([2, 7]), np.array([3.0, 0.5]))
    assert tree.min() == 0.5  # not the 0 of the eight unfilled slots
    tree.update(np.array([7]), np.array([4.0]))
    assert tree.min() == 3.0
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update(np.array([1]), np.array([-1.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update(np.array([1]), np.array([np.nan]))
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        tree.update(np.array([10]), np.array([1.0]))
    with pytest.raises(ValueError):
        SumTree(0)


# ------------------------------------------------------------------------- helpers


def items_for(keys: np.ndarray) -> dict[str, np.ndarray]:
    """Items whose content encodes their key, so every sample can be checked."""
    k = np.asarray(keys, dtype=np.int64)
    return {
        "k": k.copy(),
        "obs": np.stack([k, -k, 2 * k], axis=1).astype(np.float32),
    }


def insert_n(table: ReplayTable, n: int, priorities: np.ndarray | None = None) -> np.ndarray:
    keys = np.arange(table.next_key, table.next_key + n)
    out = table.insert(items_for(keys), priorities)
    np.testing.assert_array_equal(out, keys)
    return out


def assert_items_match_keys(sample) -> None:
    np.testing.assert_array_equal(sample.items["k"], sample.keys)
    np.testing.assert_array_equal(sample.items["obs"], items_for(sample.keys)["obs"])


def expected_weights(stored: np.ndarray, sampled: np.ndarray, beta: float) -> np.ndarray:
    """Schaul et al. 2016 verbatim: w_i = (N P(i))^-beta / max_j (N P(j))^-beta."""
    n = stored.shape[0]
    p = stored / stored.sum()
    w_all = (n * p) ** (-beta)
    return (n * p[sampled]) ** (-beta) / w_all.max()


# ----------------------------------------------------------------- prioritized


def test_prioritized_frequencies_match_priorities() -> None:
    n_items, alpha = 50, 0.6
    rng = np.random.default_rng(1)
    raw = rng.exponential(1.0, n_items) + 0.05
    table = ReplayTable(n_items, sampler="prioritized", alpha=alpha, seed=123)
    insert_n(table, n_items, raw)
    counts = np.zeros(n_items)
    for _ in range(200):  # 20k draws
        s = table.sample(100)
        assert_items_match_keys(s)
        np.add.at(counts, s.keys, 1)
    draws = counts.sum()

    def max_z(probs: np.ndarray) -> float:
        expected = draws * probs
        return float(np.max(np.abs(counts - expected) / np.sqrt(expected * (1 - probs))))

    stored = (raw + 1e-6) ** alpha
    # Each count is (at most) binomial: stratified sampling keeps the mean and only
    # lowers the variance. A 5-sigma two-sided deviation has probability ~6e-7 per item,
    # ~3e-5 over 50 items, so a correct sampler passes for essentially any seed.
    # Smallest expected count here is ~100, so the normal approximation is fine.
    assert max_z(stored / stored.sum()) < 5.0
    # ...and the test has power: the probabilities without the alpha exponent, or
    # uniform ones, are rejected by a wide margin.
    assert max_z(raw / raw.sum()) > 10.0
    assert max_z(np.full(n_items, 1.0 / n_items)) > 10.0


def test_a_stored_priority_is_floored_at_a_fraction_of_the_mean() -> None:
    """A priority of 0 once made the smallest stored priority eps**alpha, and with it every
    other item's weight (p / p_min)**-beta orders of magnitude smaller. Stored priorities
    are at least ``floor`` times the mean: the others' weights fall at most to
    ``floor**beta`` of what they were."""
    alpha, beta = 0.6, 0.4
    table = ReplayTable(100, sampler="prioritized", alpha=alpha, beta=beta, beta_final=beta,
                        seed=5)
    insert_n(table, 100, np.ones(100))
    table.update_priorities(np.array([7]), np.array([0.0]))
    weights = table.sample(64).weights
    others = weights[weights < 1.0]
    assert np.median(others) == pytest.approx(0.01 ** beta, rel=0.01)  # 0.158
    # unfloored the same update gives (1 / 1e-6**0.6)**-0.4 = 0.036
    bare = ReplayTable(100, sampler="prioritized", alpha=alpha, beta=beta, beta_final=beta,
                       seed=5, floor=0.0)
    insert_n(bare, 100, np.ones(100))
    bare.update_priorities(np.array([7]), np.array([0.0]))
    assert np.median(bare.sample(64).weights) < 0.04
    with pytest.raises(ValueError, match="floor must be in"):
        ReplayTable(10, sampler="prioritized", floor=1.0)


def test_importance_weights_and_probabilities_match_formula() -> None:
    alpha, beta, eps = 0.7, 0.5, 1e-3
    # (no floor: the formula itself; the floor is test_a_stored_priority_is_floored...)
    table = ReplayTable(20, sampler="prioritized", alpha=alpha, beta=beta, beta_final=beta,
                        eps=eps, seed=5, floor=0.0)
    rng = np.random.default_rng(2)
    raw = rng.uniform(0.0, 3.0, 20)
    insert_n(table, 20, raw)
    # update a few (with a duplicate: the last value counts)
    table.update_priorities(np.array([3, 4, 3]), np.array([9.0, 0.0, 0.25]))
    raw[3], raw[4] = 0.25, 0.0
    stored = (raw + eps) ** alpha
    s = table.sample(64)
    np.testing.assert_allclose(s.probabilities, stored[s.keys] / stored.sum(), rtol=1e-12)
    np.testing.assert_allclose(s.weights, expected_weights(stored, s.keys, beta), rtol=1e-6)
    assert s.weights.dtype == np.float32 and s.probabilities.dtype == np.float64
    assert s.weights.max() <= 1.0


def test_beta_annealed_per_sample_call() -> None:
    table = ReplayTable(8, sampler="prioritized", beta=0.4, beta_final=1.0, beta_steps=10,
                        alpha=1.0, eps=0.0, seed=0)
    raw = np.arange(1.0, 9.0)
    insert_n(table, 8, raw)
    for call in range(14):
        beta = 0.4 + 0.6 * min(1.0, call / 10)
        assert table.beta == pytest.approx(beta)
        s = table.sample(1 + call % 3)  # batch size must not matter: calls are counted
        np.testing.assert_allclose(s.weights, expected_weights(raw, s.keys, beta), rtol=1e-6)
    assert table.beta == 1.0


def test_new_items_get_max_priority_seen() -> None:
    table = ReplayTable(10, sampler="prioritized", alpha=1.0, eps=0.0)
    insert_n(table, 2)  # nothing seen yet: 1.0
    table.update_priorities(np.array([0]), np.array([5.0]))
    insert_n(table, 1)  # max seen is now 5
    insert_n(table, 1, np.array([0.5]))
    state = table.state_dict()
    np.testing.assert_allclose(state["priorities"], [5.0, 1.0, 5.0, 0.5])


# ------------------------------------------------------------ eviction and keys


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_capacity_wrap_evicts_oldest_and_keys_keep_increasing(sampler: str) -> None:
    table = ReplayTable(5, sampler=sampler, alpha=1.0, eps=0.0, seed=3)
    for n in (3, 4, 5):  # 12 items through a capacity of 5
        insert_n(table, n)
    assert (table.size, table.inserts, table.evictions) == (5, 12, 7)
    assert (table.oldest_key, table.next_key) == (7, 12)
    s = table.sample(200)
    assert_items_match_keys(s)
    assert set(s.keys.tolist()) == {7, 8, 9, 10, 11}
    np.testing.assert_array_equal(table.state_dict()["keys"], np.arange(7, 12))

    applied = table.update_priorities(np.array([0, 3, 8, 11]), np.array([1.0, 1.0, 100.0, 1.0]))
    if sampler == "prioritized":
        assert applied == 2 and table.stale_priority_updates == 2
        s = table.sample(10)
        # key 8 now has priority 100 among 1, 1, 1, 1 (stored = raw with alpha=1, eps=0)
        np.testing.assert_allclose(s.probabilities[s.keys == 8], 100.0 / 104.0)
        np.testing.assert_allclose(s.probabilities[s.keys != 8], 1.0 / 104.0)
        with pytest.raises(ValueError, match="issued"):  # key 12 does not exist yet
            table.update_priorities(np.array([12]), np.array([1.0]))
    else:
        assert applied == 0 and table.stale_priority_updates == 0  # no-op


def test_insert_more_than_capacity_at_once() -> None:
    table = ReplayTable(5, sampler="prioritized", seed=0)
    keys = insert_n(table, 8)
    np.testing.assert_array_equal(keys, np.arange(8))
    assert (table.size, table.evictions, table.inserts) == (5, 3, 8)
    s = table.sample(50)
    assert_items_match_keys(s)
    assert set(s.keys.tolist()) == {3, 4, 5, 6, 7}


def test_uniform_sampling() -> None:
    table = ReplayTable(10, seed=0)
    with pytest.raises(ValueError, match="empty"):
        table.sample(4)
    insert_n(table, 6)
    s = table.sample(600)
    assert_items_match_keys(s)
    assert s.keys.dtype == np.int64
    np.testing.assert_array_equal(s.weights, np.ones(600, dtype=np.float32))
    np.testing.assert_allclose(s.probabilities, 1 / 6)
    counts = np.bincount(s.keys, minlength=6)
    assert counts.min() > 60  # expected 100 each, sd ~9: all present, roughly even
    assert table.samples == 600
    # samples are copies: modifying one does not touch the table
    s.items["k"][:] = -1
    assert_items_match_keys(table.sample(5))


# ------------------------------------------------------------------------- fifo


def test_fifo_returns_each_item_once_in_order() -> None:
    table = ReplayTable(1000, sampler="fifo", seed=0)
    assert table.sample(3).keys.shape == (0,)  # empty: fewer (none), no error
    rng = np.random.default_rng(4)
    got = []
    for _ in range(60):
        insert_n(table, int(rng.integers(0, 7)))
        s = table.sample(int(rng.integers(1, 9)))
        assert_items_match_keys(s)
        np.testing.assert_array_equal(s.weights, 1.0)
        got.append(s.keys)
    for _ in range(100):  # drain (bounded, so a sampler that never consumes fails, not hangs)
        got.append(table.sample(5).keys)
    assert table.size == 0
    got_all = np.concatenate(got)
    np.testing.assert_array_equal(got_all, np.arange(table.inserts))
    assert table.samples == table.inserts and table.evictions == 0


def test_fifo_short_batch_and_eviction() -> None:
    table = ReplayTable(4, sampler="fifo")
    insert_n(table, 3)
    s = table.sample(2)
    np.testing.assert_array_equal(s.keys, [0, 1])
    s = table.sample(10)  # fewer than asked: only what is there
    np.testing.assert_array_equal(s.keys, [2])
    assert table.size == 0
    insert_n(table, 6)  # keys 3..8 into capacity 4: 3 and 4 are overwritten unread
    assert table.evictions == 2
    s = table.sample(10)
    assert_items_match_keys(s)
    np.testing.assert_array_equal(s.keys, [5, 6, 7, 8])


# ----------------------------------------------------------------------- schema


def test_schema_mismatch_errors_name_field_and_both_sides() -> None:
    table = ReplayTable(8)
    obs = np.zeros((2, 3), np.float32)
    table.insert({"obs": obs, "r": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=r"'obs'.*\(4,\).*\(3,\)"):
        table.insert({"obs": np.zeros((2, 4), np.float32), "r": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=r"'r'.*float64.*float32"):
        table.insert({"obs": obs, "r": np.zeros(2, np.float64)})
    with pytest.raises(ValueError, match=r"missing \['r'\].*unexpected \['x'\]"):
        table.insert({"obs": obs, "x": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="same batch size"):
        table.insert({"obs": obs, "r": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="batch axis"):
        table.insert({"obs": obs, "r": np.float32(0)})
    assert table.inserts == 2 and table.size == 2  # rejected inserts changed nothing


def test_rejected_first_insert_does_not_fix_schema() -> None:
    table = ReplayTable(8, sampler="prioritized")
    with pytest.raises(ValueError, match="expected 2 priorities"):
        table.insert({"a": np.zeros(2, np.int32)}, np.ones(3))
    table.insert({"b": np.zeros((2, 5), np.uint8)})
    assert table.fields == {"b": (np.dtype(np.uint8), (5,))}


# ------------------------------------------------------------------ checkpoints


def npz_round_trip(state: dict) -> dict:
    buf = io.BytesIO()
    np.savez(buf, **state)
    buf.seek(0)
    with np.load(buf) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("sampler", ["uniform", "prioritized", "fifo"])
def test_state_dict_round_trip_samples_identically(sampler: str) -> None:
    table = ReplayTable(16, sampler=sampler, beta_steps=50, seed=11)
    rng = np.random.default_rng(9)
    for _ in range(5):
        insert_n(table, 7, rng.uniform(0, 2, 7))
        s = table.sample(4)
        table.update_priorities(s.keys, rng.uniform(0, 2, s.keys.shape[0]))
    state = table.state_dict()
    for k, v in state.items():
        assert isinstance(v, (np.ndarray, int, float, str)), k
    restored = ReplayTable(16, sampler=sampler, beta_steps=50, seed=999)  # other seed
    restored.load_state_dict(npz_round_trip(state))  # as a checkpoint file would
    for attr in ("size", "inserts", "samples", "evictions", "stale_priority_updates",
                 "next_key", "oldest_key", "beta"):
        assert getattr(restored, attr) == getattr(table, attr), attr
    for step in range(4):
        if step == 2:
            for t in (table, restored):
                insert_n(t, 3)
        a, b = table.sample(6), restored.sample(6)
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)
        for name in a.items:
            np.testing.assert_array_equal(a.items[name], b.items[name])
    with pytest.raises(ValueError, match="capacity"):
        ReplayTable(17, sampler=sampler).load_state_dict(state)


def test_table_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="sampler"):
        ReplayTable(4, sampler="lifo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity"):
        ReplayTable(0)
    with pytest.raises(ValueError, match="batch_size"):
        ReplayTable(4).sample(0)
    table = ReplayTable(4, sampler="prioritized", eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        insert_n(table, 1, np.array([0.0]))


# ----------------------------------------------------------------- rate limiter


def test_rate_limiter_min_size_only() -> None:
    lim = RateLimiter(min_size_to_sample=3)
    assert lim.can_insert(10**6)
    assert not lim.can_sample(1, size=2)
    assert lim.can_sample(1000, size=3)  # no ratio: only the size matters
    lim.check_batch(10**6)


def test_rate_limiter_inserts_free_until_min_size() -> None:
    lim = RateLimiter(min_size_to_sample=5, samples_per_insert=1.0, error_buffer=1.0)
    assert (lim.min_diff, lim.max_diff) == (4.0, 6.0)
    for _ in range(5):  # diff 0..4 is below min_diff, yet inserts must go through
        assert lim.can_insert(1) and not lim.can_sample(1, size=lim.inserts)
        lim.on_insert(1)
    assert lim.can_insert(1)  # diff 6 == max_diff: allowed
    lim.on_insert(1)
    assert not lim.can_insert(1)  # diff 7 > max_diff
    # a table that shrank below min size may refill up to exactly min size
    assert lim.can_insert(1, size=4) and not lim.can_insert(2, size=4)
    assert lim.can_sample(2, size=6) and not lim.can_sample(3, size=6)


def test_rate_limiter_keeps_ratio_within_buffer_over_interleaving() -> None:
    spi, min_size, eb, batch = 2.0, 10, 8.0, 4
    lim = RateLimiter(min_size, spi, eb)
    lim.check_batch(batch)
    rng = np.random.default_rng(0)
    size = 0
    for _ in range(3000):
        can_ins, can_smp = lim.can_insert(1, size), lim.can_sample(batch, size)
        assert can_ins or can_smp, f"deadlock at diff={lim.diff}"
        # a writer and a learner racing: pick one of the requests at random
        if can_ins and (not can_smp or rng.random() < 0.5):
            lim.on_insert(1)
            size += 1
        else:
            lim.on_sample(batch)
        if lim.inserts >= min_size:
            assert lim.min_diff <= lim.diff <= lim.max_diff
    # the ratio itself: samples trail spi * inserts by at most the window's offset + eb
    assert abs(lim.samples - spi * lim.inserts) <= min_size * spi + eb
    assert lim.samples > 1000 and lim.inserts > 500  # both sides made progress


def explore(lim: RateLimiter, batch: int) -> tuple[bool, bool]:
    """Explore every diff reachable (after the table reaches min size) by inserts of 1
    and samples of ``batch``. Returns (some reachable state allows neither, some
    sample was ever allowed)."""
    lim.inserts, lim.samples = lim.min_size_to_sample, 0
    seen, todo, sampled, stuck = {lim.diff}, [(lim.inserts, 0)], False, False
    while todo:
        lim.inserts, lim.samples = todo.pop()
        nxt = []
        if lim.can_insert(1, size=10**9):
            nxt.append((lim.inserts + 1, lim.samples))
        if lim.can_sample(batch, size=10**9):
            nxt.append((lim.inserts, lim.samples + batch))
            sampled = True
        stuck |= not nxt
        for ins, smp in nxt:
            d = ins * lim.samples_per_insert - smp
            if d not in seen:  # diffs here are exact binary fractions
                seen.add(d)
                todo.append((ins, smp))
    return stuck, sampled


def test_rate_limiter_check_batch_agrees_with_exhaustive_search() -> None:
    rejected_with_real_deadlock = 0
    # Binary fractions only, so diffs are exact. Off-lattice buffers such as 2.75 are
    # where the deadlock window (eb - spi, batch - eb) can contain a reachable diff.
    for spi in (0.5, 0.75, 1.0, 1.5, 2.0, 3.0):
        for eb in (1.0, 2.0, 2.75, 3.0, 4.0, 5.5, 6.0):
            if eb < max(1.0, spi):
                continue
            for batch in (1, 2, 3, 4, 5, 8):
                for min_size in (1, 5):
                    lim = RateLimiter(min_size, spi, eb)
                    stuck, sampled = explore(lim, batch)
                    try:
                        lim.check_batch(batch)
                    except ValueError as e:
                        if batch > 2 * eb:
                            assert "never" in str(e) and not sampled
                        else:
                            assert "deadlock" in str(e)
                            rejected_with_real_deadlock += stuck
                    else:
                        assert not stuck and sampled, (spi, eb, batch, min_size)
    # the deadlock clause is not vacuous: it catches real deadlocks (e.g. spi=2, eb=2.75,
    # batch=5: at diff offset+2 neither an insert (+2 > 2.75) nor a sample (-5) fits)
    assert rejected_with_real_deadlock > 0
    assert explore(RateLimiter(1, 2.0, 2.75), 5) == (True, False)


def test_rate_limiter_rejects_deadlocking_settings() -> None:
    with pytest.raises(ValueError, match="min_size_to_sample.*empty table"):
        RateLimiter(min_size_to_sample=0)
    with pytest.raises(ValueError, match="samples_per_insert must be .* > 0"):
        RateLimiter(1, samples_per_insert=0.0, error_buffer=5.0)
    with pytest.raises(ValueError, match="samples_per_insert must be .* > 0"):
        RateLimiter(1, samples_per_insert=-1.0, error_buffer=5.0)
    with pytest.raises(ValueError, match=r"error_buffer=2.0 is smaller than .* = 4.*forever"):
        RateLimiter(10, samples_per_insert=4.0, error_buffer=2.0)
    with pytest.raises(ValueError, match=r"error_buffer=0.5 is smaller than .* = 1"):
        RateLimiter(10, samples_per_insert=0.25, error_buffer=0.5)
    with pytest.raises(ValueError, match="needs an error_buffer"):
        RateLimiter(10, samples_per_insert=1.0)
    with pytest.raises(ValueError, match="only has a meaning"):
        RateLimiter(10, error_buffer=3.0)
    lim = RateLimiter(10, samples_per_insert=1.0, error_buffer=10.0)
    with pytest.raises(ValueError, match=r"never be allowed.*error_buffer to at least 16"):
        lim.check_batch(31)
    with pytest.raises(ValueError, match=r"deadlock.*error_buffer to at least 10.5"):
        lim.check_batch(20)
    lim.check_batch(19)


def test_rate_limiter_state_dict_round_trip() -> None:
    lim = RateLimiter(2, samples_per_insert=1.5, error_buffer=3.0)
    lim.on_insert(7)
    lim.on_sample(9)
    other = RateLimiter(2, samples_per_insert=1.5, error_buffer=3.0)
    other.load_state_dict(lim.state_dict())
    assert (other.inserts, other.samples, other.diff) == (7, 9, lim.diff)
    assert other.can_sample(1, 10) == lim.can_sample(1, 10)
    assert other.can_insert(1) == lim.can_insert(1)


# ------------------------------------------------------------------ undoing a sample
@pytest.mark.parametrize("sampler", ["uniform", "prioritized", "fifo"])
def test_undo_sample_gives_the_items_and_counts_back(sampler: str) -> None:
    table = ReplayTable(8, sampler)
    table.insert({"x": np.arange(6)})
    before = (table.size, table.samples, table.beta)
    sample = table.sample(4)
    table.undo_sample(sample)
    assert (table.size, table.samples, table.beta) == before
    if sampler == "fifo":  # the same items come out again, in order
        np.testing.assert_array_equal(table.sample(6).items["x"], np.arange(6))


# ------------------------------------------------------------- waiting sample requests
def test_waiting_samples_bounded_per_peer_per_client_and_in_all() -> None:
    from zmqrl.parts.replay.waiting import Request, WaitingSamples

    waiting = WaitingSamples(per_peer=2, total=5)
    for size in (1, 2, 3):  # a third from one peer replaces its oldest
        waiting.add(Request([b"a"], size))
    assert [r.batch_size for r in waiting._queue] == [2, 3] and waiting.dropped == 1
    waiting.add(Request([b"b"], 4, client="learner.0"))
    waiting.add(Request([b"c"], 5, client="learner.1"))
    # learner.0 on a new socket: its old socket's request goes, learner.1's stays
    assert waiting.add(Request([b"d"], 6, client="learner.0")) == 1
    assert [r.batch_size for r in waiting._queue] == [2, 3, 5, 6]
    waiting.add(Request([b"e"], 7))
    assert waiting.add(Request([b"f"], 8)) == 1  # total bound: the oldest goes
    assert [r.batch_size for r in waiting._queue] == [3, 5, 6, 7, 8]
    assert waiting.drop_peer((b"a",)) == 1 and waiting.dropped == 4
    assert waiting.pop().batch_size == 5 and len(waiting) == 3
    waiting.add(Request([b"a"], 9))
    waiting.add(Request([b"a"], 10))  # peer a's count restarted after it was dropped
    assert [r.batch_size for r in waiting._queue] == [6, 7, 8, 9, 10]


@pytest.mark.parametrize("sampler", ["uniform", "prioritized", "fifo"])
def test_a_reviser_peeks_without_moving_anything_and_revises_held_items(sampler: str) -> None:
    """A reanalyse node's peek moves no counter, beta schedule or fifo position; its
    revisions overwrite the items still held and skip the evicted."""
    table = ReplayTable(capacity=4, sampler=sampler, seed=0)
    table.insert({"v": np.arange(6, dtype=np.float32)})  # keys 2..5 held
    before = (table.samples, table.size, table.beta)
    peek = table.peek(8, np.random.default_rng(0))
    assert set(peek.keys.tolist()) <= {2, 3, 4, 5}
    np.testing.assert_array_equal(peek.items["v"], peek.keys.astype(np.float32))
    assert (table.samples, table.size, table.beta) == before
    assert table.revise(np.array([1, 3]), {"v": np.array([-1.0, -3.0], np.float32)}) == 1
    assert table.peek(64, np.random.default_rng(1)).items["v"][
        table.peek(64, np.random.default_rng(1)).keys == 3].tolist()[0] == -3.0
    with pytest.raises(ValueError, match="field 'w' is not one of the table's"):
        table.revise(np.array([3]), {"w": np.zeros(1, np.float32)})
    with pytest.raises(ValueError, match="field 'v': needs float32"):
        table.revise(np.array([3]), {"v": np.zeros(1, np.float64)})
    with pytest.raises(ValueError, match="keys must be ones this table issued"):
        table.revise(np.array([9]), {"v": np.zeros(1, np.float32)})
