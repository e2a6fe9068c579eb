"""Secure aggregation (Bonawitz et al., CCS 2017) over a sparse neighbourhood graph (SecAgg+, Bell et
al., CCS 2020), as pure functions: no I/O.

- ``shamir``: Shamir's secret sharing over the prime field GF(2^521 − 1).
- ``quantise``: clipping to a stated range, the fixed-point ring Z_2^64, weight pre-multiplication and
  the error bound of the weighted mean.
- ``masks``: X25519 key agreement, HKDF-derived seeds, AES-CTR expansion into pairwise and self masks,
  and their removal from the sum.
- ``graph``: the neighbourhood graph (each client talks to O(log n) others).
- ``shares``: the AES-GCM envelopes in which shares travel through the coordinator.
- ``protocol``: one client's side of a round and the coordinator's unmasking, built from the above.

Randomness comes from the OS CSPRNG (``secrets``, X25519 key generation) unless a test or a simulation
passes a seeded source.
"""
