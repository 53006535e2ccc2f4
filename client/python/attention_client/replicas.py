"""ReplicaSet: one client over several attention-server replicas (DESIGN.md §12).

Stateless calls (attend) go round-robin over the replicas; a replica that answers UNAVAILABLE
(draining for shutdown, or unreachable) is skipped and the call goes to the next one. New
sequences are created round-robin the same way, and every later call on a sequence goes to the
replica that holds it: the id's first 8 hex digits are that replica's tag (GetServerInfo
.replica.replica_tag), so ``ReplicaSet.sequence(id)`` finds the replica for an id made
elsewhere, and a :class:`Sequence` handle from ``create_sequence`` is bound to its replica.

Targets: a list of "host:port" strings, or one "host:port" whose host resolves to several
addresses (a Kubernetes headless Service: one A record per ready pod). Each host is resolved
with ``socket.getaddrinfo``; ``refresh()`` resolves again (scale-up, replaced pods).
"""
import itertools
import socket
import threading

from .client import AttentionClient, Sequence
from .errors import NotFound, Unavailable

_TAG_DIGITS = 8


def resolve(targets):
    """"host:port" strings (or one string) → sorted unique "ip:port" strings (IPv6 as
    "[ip]:port"). A host that resolves to nothing raises Unavailable."""
    if isinstance(targets, str):
        targets = [targets]
    out = set()
    for t in targets:
        host, sep, port = t.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"target must be host:port, got {t!r}")
        host = host.strip("[]")
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise Unavailable(f"cannot resolve {host!r}: {e}", method="resolve") from None
        for family, _, _, _, addr in infos:
            ip = addr[0]
            out.add(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    if not out:
        raise Unavailable(f"no address for {list(targets)}", method="resolve")
    return sorted(out)


class ReplicaSet:
    """Client over replicas of attention-server.

    ReplicaSet(targets, **client_kwargs): targets as described in the module docstring;
    client_kwargs go to each replica's :class:`AttentionClient` (timeout, identity,
    max_message_bytes). Context manager; thread-safe.

    attend(...) and create_sequence(...) take AttentionClient's arguments. Each tries every
    replica at most once, starting at the next one in round-robin order, moving on only on
    Unavailable (other errors are the request's and are raised at once); when all are
    unavailable the last Unavailable is raised. sequence(id) and replica_for(id) route by the
    id's replica tag.
    """

    def __init__(self, targets, **client_kwargs):
        self._targets = targets
        self._kwargs = client_kwargs
        self._lock = threading.Lock()
        self._clients = {}  # "ip:port" → AttentionClient
        self._tags = {}     # replica tag → "ip:port"
        self._rr = itertools.count()
        self.refresh()

    # -- membership -------------------------------------------------------------------------
    def refresh(self):
        """Resolves the targets again, opens clients to new addresses, closes clients of
        addresses that are gone and learns each replica's tag. Returns the addresses."""
        addrs = resolve(self._targets)
        with self._lock:
            for a in set(self._clients) - set(addrs):
                self._clients.pop(a).close()
                self._tags = {t: x for t, x in self._tags.items() if x != a}
            for a in addrs:
                if a not in self._clients:
                    self._clients[a] = AttentionClient(a, **self._kwargs)
            clients = dict(self._clients)
        for a, c in clients.items():
            self._learn_tag(a, c)
        return addrs

    def _learn_tag(self, addr, client):
        try:
            tag = client.server_info().replica.replica_tag
        except Unavailable:
            return  # unreachable or starting: learned on a later refresh
        if tag:
            with self._lock:
                self._tags[tag] = addr

    @property
    def addresses(self):
        """The replicas' "ip:port" addresses in round-robin order."""
        with self._lock:
            return sorted(self._clients)

    def close(self):
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- routing ----------------------------------------------------------------------------
    def _rotation(self):
        with self._lock:
            addrs = sorted(self._clients)
            clients = [self._clients[a] for a in addrs]
        if not clients:
            raise Unavailable("no replicas", method="route")
        start = next(self._rr) % len(clients)
        return clients[start:] + clients[:start]

    def _round_robin(self, fn):
        last = None
        for client in self._rotation():
            try:
                return fn(client)
            except Unavailable as e:  # draining or unreachable: the next replica
                last = e
        raise last

    def replica_for(self, sequence_id):
        """The AttentionClient of the replica holding `sequence_id` (by its tag); refreshes
        once when the tag is unknown. Raises NotFound when no known replica has that tag."""
        tag = str(sequence_id)[:_TAG_DIGITS]
        for attempt in range(2):
            with self._lock:
                addr = self._tags.get(tag)
                if addr is not None and addr in self._clients:
                    return self._clients[addr]
            if attempt == 0:
                self.refresh()
        raise NotFound(f"sequence {sequence_id}: no replica with tag {tag!r} among "
                       f"{self.addresses} (the replica is gone, or the id is not one of ours)",
                       method="route")

    # -- calls ------------------------------------------------------------------------------
    def attend(self, q, k, v, **kwargs):
        """AttentionClient.attend on the next replica that is not draining."""
        return self._round_robin(lambda c: c.attend(q, k, v, **kwargs))

    def create_sequence(self, num_layers, num_heads, num_kv_heads, head_dim, **kwargs):
        """AttentionClient.create_sequence on the next replica that admits new sequences; the
        returned Sequence sends every later call to that replica."""
        def create(c):
            seq = c.create_sequence(num_layers, num_heads, num_kv_heads, head_dim, **kwargs)
            with self._lock:
                for a, known in self._clients.items():
                    if known is c:
                        self._tags[seq.id[:_TAG_DIGITS]] = a
            return seq
        return self._round_robin(create)

    def sequence(self, sequence_id, **kwargs):
        """A Sequence handle for an existing id, bound to the replica that holds it."""
        return self.replica_for(sequence_id).sequence(sequence_id, **kwargs)

    def extend_batch(self, steps, **kwargs):
        """AttentionClient.extend_batch over steps (sequence, layer, position, q, k, v) whose
        sequences (Sequence handles) may live on different replicas: one ExtendBatch per
        replica, results merged back in the order of `steps`."""
        steps = list(steps)
        groups = {}
        for i, s in enumerate(steps):
            if not isinstance(s[0], Sequence):
                raise TypeError("extend_batch: each step's first item must be a Sequence")
            client = s[0]._client
            groups.setdefault(id(client), (client, []))[1].append(i)
        out = [None] * len(steps)
        for client, idx in groups.values():
            for i, r in zip(idx, client.extend_batch([steps[i] for i in idx], **kwargs)):
                out[i] = r
        return out
