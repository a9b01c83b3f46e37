"""The reader of a digest-verified load: a `reader.Reader` whose reads hand their bytes to a
`planc.manifest.digestcheck.Verifier` on the reader's own thread, a piece at a time
(`Verifier.piece_bytes`: the leaf, 16 MiB by default; `Verifier.stream`) as each piece lands in its ring slot (or a host-path part's
buffer), while it is in the cache: no second read, no second copy, no second pass over the slot.

`DigestReader(reader, verifier)` forwards everything else to `reader` (the pipeline, the report
and `close` see the reader they always see); `abort()` releases reads waiting for earlier ones
when the load fails. A reader whose `read_into` takes no `sink` (a test's stand-in) has its
bytes handed over after each read instead.
"""

from __future__ import annotations

import inspect


def _takes_sink(reader) -> bool:
    try:
        params = inspect.signature(reader.read_into).parameters
        return "sink" in params and "tail" in params
    except (TypeError, ValueError):
        return False


class DigestReader:
    def __init__(self, reader, verifier):
        self._reader, self.verifier = reader, verifier
        self._pieces = _takes_sink(reader)

    def __getattr__(self, name):
        return getattr(self._reader, name)

    # A failed read (or hash) aborts the verifier: a later read of the same leaf, waiting for this
    # one's bytes, would otherwise wait for ever, and the pool's shutdown with it.
    def read_into(self, rel: str, offset: int, length: int, buf, needed: int) -> int:
        v, deferred = self.verifier, []
        try:
            if self._pieces:
                sink = v.stream(rel, deferred)
                n = self._reader.read_into(rel, offset, length, buf, needed, piece=v.piece_bytes,
                                           tail=v.digest.leaf_bytes, sink=sink)
                sink.flush()
            else:
                n = self._reader.read_into(rel, offset, length, buf, needed)
                v.feed(rel, offset, buf[:needed], deferred)
            v.settle(deferred)  # parts of leaves whose earlier bytes came in another read
        except BaseException:
            v.abort()
            raise
        return n

    def read_strided(self, rel: str, offset: int, length: int, stride: int, count: int, buf) -> int:
        v, deferred = self.verifier, []
        try:
            n = self._reader.read_strided(rel, offset, length, stride, count, buf)
            for k in range(count):  # the segments lie packed in the slot, in file order
                v.feed(rel, offset + k * stride, buf[k * length:(k + 1) * length], deferred)
            v.settle(deferred)
        except BaseException:
            v.abort()
            raise
        return n

    def read_plain(self, rel: str, offset: int, buf) -> None:
        v, deferred = self.verifier, []
        try:
            self._reader.read_plain(rel, offset, buf)
            v.feed(rel, offset, buf, deferred)
            v.settle(deferred)
        except BaseException:
            v.abort()
            raise

    def abort(self) -> None:
        self.verifier.abort()

    def close(self) -> None:
        self.verifier.abort()  # a read still waiting for an earlier one stops waiting
        self._reader.close()
