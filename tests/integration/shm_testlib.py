"""Helpers for the host shared-memory tests (sequence.proto SharedMemoryLease): a POSIX shm object
made as a co-located frontend makes one (shm_open O_CREAT | O_EXCL through CPython's
_posixshmem, ftruncate, a MAP_SHARED view), and a lease stream kept open until closed.
"""
import itertools
import mmap
import os
import queue

import _posixshmem

from attention_client._pb import sequence_pb2 as spb

_COUNTER = itertools.count()


def identity(name):
    return (("x-attn-identity", name),)


class ShmObject:
    """A fresh shm object of `size` bytes named /attn-it-<pid>-<n>, mapped read-write (`view`)."""

    def __init__(self, size):
        self.name = f"/attn-it-{os.getpid()}-{next(_COUNTER)}"
        self.size = size
        self.fd = _posixshmem.shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        os.ftruncate(self.fd, size)
        self.view = mmap.mmap(self.fd, size)

    def truncate(self, size):
        """The hostile client's move: shrink the object under the server."""
        self.view.close()
        self.view = None
        os.ftruncate(self.fd, size)

    def close(self):
        if self.view is not None:
            self.view.close()
            self.view = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            _posixshmem.shm_unlink(self.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Lease:
    """A SharedMemoryLease stream: the first message names the object; `region()` waits for the
    response (raises grpc.RpcError when the server refused); the identity is `who`
    (x-attn-identity) unless `metadata` is given (e.g. a bearer token); `close()` half-closes (the server
    then releases the region and ends the stream OK), `cancel()` cancels."""

    def __init__(self, stub, name, size, who="", timeout=120, metadata=None):
        self._q = queue.Queue()
        self._q.put(spb.SharedMemoryLeaseRequest(name=name, bytes=size))

        def gen():
            while True:
                item = self._q.get()
                if item is None:
                    return
                yield item

        self.call = stub.SharedMemoryLease(
            gen(), metadata=identity(who) if metadata is None else metadata, timeout=timeout)

    def region(self):
        return next(self.call)

    def send(self, name="/ignored", size=1):
        self._q.put(spb.SharedMemoryLeaseRequest(name=name, bytes=size))

    def close(self):
        """Half-closes and returns the stream's final code (after any remaining responses)."""
        self._q.put(None)
        for _ in self.call:
            pass
        return self.call.code()

    def cancel(self):
        self.call.cancel()
        self._q.put(None)
