"""Secure aggregation's pure parts with literal vectors: Shamir sharing (and its refusal below the
threshold), X25519 / AES-CTR / HKDF against published vectors, mask cancellation with and without
dropouts, the quantisation round trip and its bound, the neighbourhood graph, share envelopes and one
whole round against numpy FedAvg."""

from __future__ import annotations

import random

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from fedprompt.shared.secagg import graph, masks, protocol, quantise, shamir, shares
from fedprompt.shared.secagg.protocol import PeerKeys, RoundSecrets

# RFC 7748 section 6.1
ALICE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PUB = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
BOB = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PUB = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")


def _counting(*values: int):
    it = iter(values)
    return lambda n: next(it)


# -- Shamir ------------------------------------------------------------------------------------


def test_shamir_literal_polynomial() -> None:
    secret = (5).to_bytes(32, "big")
    # f(x) = 5 + 2x + 3x²
    got = shamir.split(secret, 3, [1, 2, 3, 4], randbelow=_counting(2, 3))
    assert got == {1: 10, 2: 21, 3: 38, 4: 61}
    assert shamir.reconstruct({2: 21, 3: 38, 4: 61}, 3) == secret
    assert shamir.reconstruct({1: 10, 4: 61, 3: 38}, 3) == secret
    # f(x) = 5 + 7x
    assert shamir.split(secret, 2, [1, 2, 3], randbelow=_counting(7)) == {1: 12, 2: 19, 3: 26}


def test_shamir_literal_field_wraparound() -> None:
    # f(x) = 1 + (p − 1)·x: f(1) = 0, f(2) = p − 1, f(3) = p − 2 (mod p)
    secret = (1).to_bytes(32, "big")
    p = shamir.PRIME
    got = shamir.split(secret, 2, [1, 2, 3], randbelow=_counting(p - 1))
    assert got == {1: 0, 2: p - 1, 3: p - 2}
    assert shamir.reconstruct({1: 0, 3: p - 2}, 2) == secret


def test_shamir_any_t_of_n_reconstruct_and_fewer_are_refused() -> None:
    secret = bytes(range(32))
    rng = random.Random(7)
    split = shamir.split(secret, 4, list(range(1, 8)), randbelow=rng.randrange)
    for subset in ([1, 2, 3, 4], [4, 5, 6, 7], [1, 3, 5, 7]):
        assert shamir.reconstruct({x: split[x] for x in subset}, 4) == secret
    with pytest.raises(shamir.ShamirError, match="3 share"):
        shamir.reconstruct({x: split[x] for x in (1, 2, 3)}, 4)
    # three shares of a threshold-4 polynomial, read as threshold 3, give no 32-byte secret
    with pytest.raises(shamir.ShamirError, match="do not belong"):
        shamir.reconstruct({x: split[x] for x in (1, 2, 3)}, 3)


def test_shamir_refuses_bad_input() -> None:
    with pytest.raises(shamir.ShamirError, match="repeated"):
        shamir.split(b"x", 2, [1, 1, 2])
    with pytest.raises(shamir.ShamirError, match=r"\[1, p\)"):
        shamir.split(b"x", 2, [0, 1])
    with pytest.raises(shamir.ShamirError, match="threshold"):
        shamir.split(b"x", 4, [1, 2, 3])
    with pytest.raises(shamir.ShamirError, match="64 bytes"):
        shamir.split(b"x" * 65, 2, [1, 2])
    y = 123456789
    assert shamir.share_from_bytes(shamir.share_to_bytes(y)) == y
    with pytest.raises(shamir.ShamirError):
        shamir.share_from_bytes(shamir.PRIME.to_bytes(shamir.SHARE_BYTES, "big"))


# -- key agreement, PRG, masks ------------------------------------------------------------------


def test_x25519_rfc7748_vector_and_hkdf() -> None:
    assert masks.public_bytes(masks.private_from_bytes(ALICE)) == ALICE_PUB
    assert masks.public_bytes(masks.private_from_bytes(BOB)) == BOB_PUB
    expected = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"fedprompt secagg pairwise mask|ctx"
    ).derive(SHARED)
    assert masks.pairwise_seed(ALICE, BOB_PUB, b"ctx") == expected
    assert masks.pairwise_seed(BOB, ALICE_PUB, b"ctx") == expected
    assert masks.pairwise_seed(ALICE, BOB_PUB, b"other round") != expected


def test_expand_is_the_aes256_ctr_keystream() -> None:
    # AES-256 of the zero block under the zero key (FIPS-197 style known answer)
    block = bytes.fromhex("dc95c078a2408989ad48a21492842087")
    got = masks.expand(b"\x00" * 32, 2)
    assert got.dtype == np.uint64
    assert got.tolist() == [int.from_bytes(block[:8], "little"), int.from_bytes(block[8:], "little")]


def test_pairwise_and_self_masks_cancel() -> None:
    x = {
        1: np.array([1, 2, 3], np.uint64),
        2: np.array([10, 20, 30], np.uint64),
        3: np.array([7, 0, 2**64 - 1], np.uint64),
    }
    keys = {i: masks.private_bytes(masks.new_private_key()) for i in x}
    pubs = {i: masks.public_bytes(masks.private_from_bytes(k)) for i, k in keys.items()}
    seeds = {i: masks.new_seed() for i in x}
    masked = {
        i: masks.mask(
            x[i], i, seeds[i], {j: masks.pairwise_seed(keys[i], pubs[j], b"c") for j in x if j != i}
        )
        for i in x
    }
    total = sum(masked.values(), np.zeros(3, np.uint64))
    expected = sum(x.values(), np.zeros(3, np.uint64))
    assert not np.array_equal(masked[1], x[1])
    assert masks.unmask(total, seeds.values(), []).tolist() == expected.tolist()
    # client 3 dropped after its keys were used: the survivors' pairwise masks with it are undone
    survivors_total = masked[1] + masked[2]
    pairs = [(i, 3, masks.pairwise_seed(keys[3], pubs[i], b"c")) for i in (1, 2)]
    got = masks.unmask(survivors_total, [seeds[1], seeds[2]], pairs)
    assert got.tolist() == (x[1] + x[2]).tolist()


# -- quantisation -----------------------------------------------------------------------------


def test_quantise_literal_levels_and_round_trip() -> None:
    q = quantise.quantise(np.array([-1.0, 0.0, 1.0, 2.0, -0.5, -3.0]), 1.0, 8)
    assert q.tolist() == [0, 128, 255, 255, 64, 0]
    assert quantise.step(1.0, 8) == 2 / 255
    assert quantise.error_bound(1.0, 8) == 1 / 255
    back = quantise.dequantise(q, 1.0, 8)
    np.testing.assert_allclose(back, [-1.0, 1 / 255, 1.0, 1.0, -1 + 64 * 2 / 255, -1.0])
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, 10_000)
    for bits in (8, 16, 20, 32):
        err = np.abs(quantise.dequantise(quantise.quantise(x, 2.0, bits), 2.0, bits) - x)
        assert err.max() <= quantise.error_bound(2.0, bits) * (1 + 1e-9)


def test_weighted_mean_within_the_bound_of_fedavg() -> None:
    rng = np.random.default_rng(1)
    updates = [rng.uniform(-0.5, 0.5, 500) for _ in range(10)]
    weights = [int(w) for w in rng.integers(1, 5000, 10)]
    fedavg = sum(w * u for w, u in zip(weights, updates, strict=True)) / sum(weights)
    for bits in (12, 20):
        total = sum(
            (
                quantise.weighted(quantise.quantise(u, 0.5, bits), w)
                for w, u in zip(weights, updates, strict=True)
            ),
            np.zeros(500, np.uint64),
        )
        mean = quantise.weighted_mean(total, sum(weights), 0.5, bits)
        assert np.abs(mean - fedavg).max() <= quantise.error_bound(0.5, bits)
    assert quantise.ring_capacity(20) == (2**64 - 1) // (2**20 - 1)
    with pytest.raises(quantise.QuantisationError, match="overflows"):
        quantise.weighted_mean(np.zeros(1, np.uint64), quantise.ring_capacity(20) + 1, 1.0, 20)
    with pytest.raises(quantise.QuantisationError):
        quantise.levels(40)


# -- graph ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "k"), [(1, 0), (2, 1), (3, 2), (5, 4), (10, 4), (16, 8), (100, 36), (1000, 72)]
)
def test_neighbourhood_meets_its_bound_and_is_symmetric_regular_and_connected(n: int, k: int) -> None:
    assert graph.neighbourhood_size(n) == k
    g = graph.neighbours(n, b"seed", k)
    assert set(g) == set(range(1, n + 1))
    for i, peers in g.items():
        assert len(peers) == k and i not in peers
        assert all(i in g[j] for j in peers)
    assert graph.is_connected(g)
    assert graph.neighbours(n, b"seed", k) == g
    if 2 <= k < n - 1:  # the smallest even k that meets the bound
        assert graph.failure_bound_holds(n, k, 0.5) and not graph.failure_bound_holds(n, k - 2, 0.5)


def test_failure_bound_by_hand() -> None:
    # n = 10: ceil(0.2·10) = 2 corrupted, ceil(0.1·10) = 1 dropping, among the 9 others
    # k = 2, t = 2: P[both neighbours corrupted] = C(2,2)/C(9,2) = 1/36; 10/36 > 2^-20
    assert not graph.failure_bound_holds(10, 2, 0.5)
    # k = 4, t = 3: 3 corrupted neighbours of 2 is impossible, and so are 2 dropped of 1
    assert graph.failure_bound_holds(10, 4, 0.5)
    assert graph.threshold(4, 0.5) == 3 and graph.threshold(2, 0.1) == 2 and graph.threshold(1, 0.5) == 1


@pytest.mark.parametrize("n", [7, 8, 9, 11, 12, 13])
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_every_client_has_the_stated_degree_for_odd_and_even_n(n: int, k: int) -> None:
    g = graph.neighbours(n, b"x", k)
    want = graph.regular_degree(n, k)
    assert want == (k + k % 2 if k + k % 2 < n - 1 else n - 1)
    assert all(len(peers) == want for peers in g.values())
    assert all(i in g[j] for i, peers in g.items() for j in peers)


def test_neighbourhood_literal_and_seeded() -> None:
    assert graph.permutation(5, b"a") == graph.permutation(5, b"a")
    assert sorted(graph.permutation(50, b"a")) == list(range(1, 51))
    assert graph.permutation(50, b"a") != graph.permutation(50, b"b")
    g = graph.neighbours(6, b"0", 2)
    assert all(len(p) == 2 for p in g.values())
    assert graph.is_connected(g)
    assert graph.neighbours(30, b"1", 6) != graph.neighbours(30, b"2", 6)
    assert not graph.is_connected({1: [2], 2: [1], 3: [4], 4: [3]})
    assert graph.relabel({1: [2], 2: [1]}, [9, 4]) == {4: [9], 9: [4]}
    with pytest.raises(ValueError):
        graph.neighbours(3, b"0", -1)


# -- envelopes --------------------------------------------------------------------------------


def test_envelope_round_trip_and_refusals() -> None:
    env = shares.seal(ALICE, BOB_PUB, b"ctx", 1, 2, 11, 22)
    assert len(env) == shares.ENVELOPE_BYTES
    assert shares.open_envelope(BOB, ALICE_PUB, b"ctx", 1, 2, env) == (11, 22)
    with pytest.raises(shares.EnvelopeError):
        shares.open_envelope(BOB, ALICE_PUB, b"another round", 1, 2, env)
    with pytest.raises(shares.EnvelopeError):
        shares.open_envelope(BOB, ALICE_PUB, b"ctx", 3, 2, env)
    altered = bytearray(env)
    altered[20] ^= 1
    with pytest.raises(shares.EnvelopeError):
        shares.open_envelope(BOB, ALICE_PUB, b"ctx", 1, 2, bytes(altered))


# -- one whole round ----------------------------------------------------------------------------


def _run_round(
    n: int,
    drop_after_share: set[int],
    drop_after_upload: set[int],
    fraction: float = 0.5,
    k: int | None = None,
):
    rng = np.random.default_rng(5)
    ctx = protocol.round_context(1, 1, 1)
    clip, bits = 1.0, 20
    k = graph.neighbourhood_size(n) if k is None else k
    g = graph.neighbours(n, b"round", k)
    t = protocol.threshold(k, fraction)
    sec = {i: RoundSecrets.new() for i in g}
    keys = {i: PeerKeys.from_json(sec[i].advertisement()) for i in g}
    inbox: dict[int, dict[int, bytes]] = {i: {} for i in g}
    for i in g:
        for j, env in protocol.share_keys(sec[i], i, {j: keys[j] for j in g[i]}, t, ctx).items():
            inbox[j][i] = env
    updates = {i: rng.uniform(-0.3, 0.3, 40) for i in g}
    weights = {i: int(rng.integers(1, 100)) for i in g}
    uploaders = [i for i in g if i not in drop_after_share]
    masked = {
        i: protocol.masked_vector(
            sec[i],
            i,
            quantise.weighted(quantise.quantise(updates[i], clip, bits), weights[i]),
            {j: keys[j].mask_key for j in inbox[i]},
            ctx,
        )
        for i in uploaders
    }
    survivors = sorted(masked)
    dropped = sorted(drop_after_share)
    revealed: dict[int, dict[int, int]] = {}
    for holder in survivors:
        if holder in drop_after_upload:
            continue
        reply = protocol.unmask_reply(sec[holder], holder, inbox[holder], keys, survivors, dropped, t, ctx)
        for sender, item in reply.items():
            revealed.setdefault(sender, {})[holder] = shamir.share_from_bytes(protocol.unb64(item["share"]))
    total = sum(masked.values(), np.zeros(40, np.uint64))
    included = {j: [i for i in survivors if j in inbox[i]] for j in dropped}
    summed = protocol.unmasked_sum(total, survivors, included, revealed, keys, t, ctx)
    mean = quantise.weighted_mean(summed, sum(weights[i] for i in survivors), clip, bits)
    fedavg = sum(weights[i] * updates[i] for i in survivors) / sum(weights[i] for i in survivors)
    return mean, fedavg, quantise.error_bound(clip, bits), masked, updates


def test_whole_round_equals_fedavg_within_the_bound() -> None:
    mean, fedavg, bound, masked, updates = _run_round(10, set(), set())
    assert np.abs(mean - fedavg).max() <= bound
    for vector in masked.values():  # no masked vector resembles any update's levels
        levels = vector.astype(np.float64) / 2**64
        for u in updates.values():
            assert abs(np.corrcoef(levels, u)[0, 1]) < 0.9


def test_whole_round_with_dropouts_after_sharing_and_after_upload() -> None:
    mean, fedavg, bound, _, _ = _run_round(10, {3, 7}, {5}, k=8)  # 3 of 10 drop: more than k = 4 is sized for
    assert np.abs(mean - fedavg).max() <= bound


def test_unmasking_below_the_threshold_is_refused() -> None:
    with pytest.raises((shamir.ShamirError, protocol.ProtocolError)):
        _run_round(10, set(), {1, 2, 3, 4, 5, 6, 7}, fraction=0.9)


def test_unmask_reply_never_reveals_both_secrets_of_one_client() -> None:
    s = RoundSecrets.new()
    with pytest.raises(protocol.ProtocolError, match="both"):
        protocol.unmask_reply(s, 1, {}, {}, [1, 2], [2], 1, b"c")
    with pytest.raises(protocol.ProtocolError, match="below the threshold"):
        protocol.unmask_reply(s, 1, {}, {}, [1], [], 2, b"c")
    assert RoundSecrets.from_json(s.to_json()) == s


def test_masked_upload_format() -> None:
    v = np.array([1, 2**64 - 1], np.uint64)
    body = protocol.encode_masked(v, {"round": "1", "weight": 3})
    assert protocol.decode_masked(body, 2).tolist() == v.tolist()
    with pytest.raises(protocol.ProtocolError, match="shape"):
        protocol.decode_masked(body, 3)
    shapes = {"a": (2, 3), "b": (4,)}
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
    back = protocol.unflatten(protocol.flatten(tensors, shapes), shapes)
    assert all(np.array_equal(back[k], tensors[k]) for k in shapes)
