"""The reader of a digest-verified load: a `reader.Reader` whose every read, once its bytes are in
their ring slot (or a host-path part's buffer), is handed to a `planc.manifest.digest.Verifier` on the same
thread. The bytes are hashed where they lie: no second read, no second copy.

`DigestReader(reader, verifier)` forwards everything else to `reader` (the pipeline, the report
and `close` see the reader they always see); `abort()` releases reads waiting for earlier ones
when the load fails.
"""

from __future__ import annotations


class DigestReader:
    def __init__(self, reader, verifier):
        self._reader, self.verifier = reader, verifier

    def __getattr__(self, name):
        return getattr(self._reader, name)

    # A failed read (or hash) aborts the verifier: a later read of the same extent, waiting for this
    # one's bytes, would otherwise wait for ever, and the pool's shutdown with it.
    def read_into(self, rel: str, offset: int, length: int, buf, needed: int) -> int:
        try:
            n = self._reader.read_into(rel, offset, length, buf, needed)
            self.verifier.feed(rel, offset, buf[:needed])
        except BaseException:
            self.verifier.abort()
            raise
        return n

    def read_strided(self, rel: str, offset: int, length: int, stride: int, count: int, buf) -> int:
        try:
            n = self._reader.read_strided(rel, offset, length, stride, count, buf)
            for k in range(count):  # the segments lie packed in the slot, in file order
                self.verifier.feed(rel, offset + k * stride, buf[k * length:(k + 1) * length])
        except BaseException:
            self.verifier.abort()
            raise
        return n

    def read_plain(self, rel: str, offset: int, buf) -> None:
        try:
            self._reader.read_plain(rel, offset, buf)
            self.verifier.feed(rel, offset, buf)
        except BaseException:
            self.verifier.abort()
            raise

    def abort(self) -> None:
        self.verifier.abort()

    def close(self) -> None:
        self.verifier.abort()  # a read still waiting for an earlier one stops waiting
        self._reader.close()
