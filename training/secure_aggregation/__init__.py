"""Secure aggregation of federated clients' updates (Bonawitz et al. 2017, "Practical
Secure Aggregation for Privacy-Preserving Machine Learning", with the sparse neighbour
graph of SecAgg+, Bell et al. 2020): the coordinator learns the sum of a round's client
updates and nothing else of any one of them, even when clients drop out mid-round.

Modules, one job each: ring.py (arithmetic mod 2^bits), quantize.py (floats to the ring
without overflow), prg.py (ChaCha20 masks from seeds), shamir.py (t-of-n secret sharing),
keys.py (X25519 agreement, HKDF, AES-GCM), labels.py (what binds keys to a round),
graph.py (who is whose neighbour, how many shares rebuild a secret), client.py (a
client's phases), server.py (the coordinator's unmasking); settings.py (the run's
section) and messages.py (what the phases carry) join them to the trainer. Nothing is
imported here: a run without secure aggregation never loads the cryptography package.

Threat model: the coordinator is honest but curious: it runs the protocol as written
(routes every message, tells every client the same U1, U2 and U3) but may read everything
it sees and keep it. Clients' shares travel sealed end to end (X25519 + AES-GCM, bound to
the run, the round and both names), so the coordinator never holds a share it was not
given in the unmask phase, where an honest client reveals, for each neighbour, either its
self-mask share (the neighbour's input arrived) or its mask-key share (it did not), never
both; and more than half of a client's neighbours are needed to rebuild either secret.
The sum is protected against the coordinator colluding with fewer than t of a client's
neighbours; a malicious coordinator that lies about the sets, and clients that send
malformed updates, are out of scope (a coordinator's own checks on the sum must do).
Dropouts cost this: a client that leaves after advertising keys and before sending
shares (U1 - U2) costs nothing; one that leaves after sending shares and before its input
(U2 - U3) costs the coordinator the rebuilding of its mask key and one PRG expansion per
neighbour in U3; the round fails (SecAggError naming the client) when fewer than t of a
client's neighbours answer the unmask phase.
"""
