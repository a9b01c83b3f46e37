"""Probe: a rank's row-parallel segments read by io_uring (batched) against mapped windows (warm).

    python3 bench/probe_uring.py DATA_DIR [--threads 1,2] [--gib 1]

The question: can batched submission (one `io_uring_enter` per thousands of `IORING_OP_READ`s,
the submission entries written by numpy, no Python per segment) read a dim-1 slice out of the page
cache faster than the executor's mapped windows (`Reader.read_strided`: map 8 MiB of the file, as it then did,
copy the segments with numpy, unmap)? Each thread takes 16 MiB slot jobs of one shape in turn;
the last job is checked against numpy's slicing of the file. Payload GB/s per method, two rounds
each, interleaved. A minimal io_uring binding through ctypes (syscalls 425, 426; the rings mapped
with `mmap`); Linux x86-64 only. Findings in docs/tp.md.
"""
import ctypes, mmap, os, sys, time, threading
import numpy as np
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_SETUP, SYS_ENTER = 425, 426

class SqOff(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("head","tail","ring_mask","ring_entries","flags","dropped","array","resv1")] + [("user_addr", ctypes.c_uint64)]
class CqOff(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("head","tail","ring_mask","ring_entries","overflow","cqes","flags","resv1")] + [("user_addr", ctypes.c_uint64)]
class Params(ctypes.Structure):
    _fields_ = [("sq_entries", ctypes.c_uint32), ("cq_entries", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("sq_thread_cpu", ctypes.c_uint32), ("sq_thread_idle", ctypes.c_uint32), ("features", ctypes.c_uint32),
                ("wq_fd", ctypes.c_uint32), ("resv", ctypes.c_uint32*3), ("sq_off", SqOff), ("cq_off", CqOff)]
SQE = np.dtype([("opcode","u1"),("flags","u1"),("ioprio","u2"),("fd","i4"),("off","u8"),("addr","u8"),("len","u4"),
                ("rw_flags","u4"),("user_data","u8"),("pad","u8",(3,))])
assert SQE.itemsize == 64
CQE = np.dtype([("user_data","u8"),("res","i4"),("flags","u4")])
IORING_OP_READ = 22
IORING_OFF_SQ_RING, IORING_OFF_CQ_RING, IORING_OFF_SQES = 0, 0x8000000, 0x10000000
IORING_ENTER_GETEVENTS = 1

class Ring:
    def __init__(self, entries=4096):
        p = Params()
        fd = libc.syscall(SYS_SETUP, entries, ctypes.byref(p))
        if fd < 0: raise OSError(ctypes.get_errno(), "io_uring_setup")
        self.fd, self.p = fd, p
        sq_sz = p.sq_off.array + p.sq_entries * 4
        cq_sz = p.cq_off.cqes + p.cq_entries * 16
        self.sqm = mmap.mmap(fd, sq_sz, mmap.MAP_SHARED | 0x8000, mmap.PROT_READ | mmap.PROT_WRITE, offset=IORING_OFF_SQ_RING)
        self.cqm = mmap.mmap(fd, cq_sz, mmap.MAP_SHARED | 0x8000, mmap.PROT_READ | mmap.PROT_WRITE, offset=IORING_OFF_CQ_RING)
        self.sqem = mmap.mmap(fd, p.sq_entries * 64, mmap.MAP_SHARED | 0x8000, mmap.PROT_READ | mmap.PROT_WRITE, offset=IORING_OFF_SQES)
        u32 = lambda m, off, n=1: np.frombuffer(m, np.uint32, n, off)
        self.sq_head, self.sq_tail = u32(self.sqm, p.sq_off.head), u32(self.sqm, p.sq_off.tail)
        self.sq_array = u32(self.sqm, p.sq_off.array, p.sq_entries)
        self.sq_array[:] = np.arange(p.sq_entries, dtype=np.uint32)
        self.cq_head, self.cq_tail = u32(self.cqm, p.cq_off.head), u32(self.cqm, p.cq_off.tail)
        self.cqes = np.frombuffer(self.cqm, CQE, p.cq_entries, p.cq_off.cqes)
        self.sqes = np.frombuffer(self.sqem, SQE, p.sq_entries)
        self.n = p.sq_entries
    def read_segments(self, fd, offs, lens, addrs):
        n = len(offs); done = 0
        while done < n:
            m = min(self.n, n - done)
            tail = int(self.sq_tail[0])
            assert tail == int(self.sq_head[0])  # ring empty between batches
            idx = (tail + np.arange(m)) & (self.n - 1)
            s = self.sqes
            # identity array: sqe slot i at position i
            s["opcode"][idx] = IORING_OP_READ; s["fd"][idx] = fd
            s["off"][idx] = offs[done:done+m]; s["addr"][idx] = addrs[done:done+m]; s["len"][idx] = lens[done:done+m]
            s["user_data"][idx] = np.arange(done, done+m, dtype=np.uint64)
            self.sq_tail[0] = (tail + m) & 0xffffffff
            got = 0
            while got < m:
                r = libc.syscall(SYS_ENTER, self.fd, m if got == 0 else 0, m - got, IORING_ENTER_GETEVENTS, None, 0)
                if r < 0: raise OSError(ctypes.get_errno(), "io_uring_enter")
                h, t = int(self.cq_head[0]), int(self.cq_tail[0])
                k = (t - h) & 0xffffffff
                ci = (h + np.arange(k)) & (self.p.cq_entries - 1)
                res = self.cqes["res"][ci]; ud = self.cqes["user_data"][ci]
                bad = res != lens[ud.astype(np.int64)]
                if bad.any(): raise OSError(f"short/failed {res[bad][:4]}")
                self.cq_head[0] = t
                got += k
            done += m

def make(path, size):
    if not os.path.exists(path) or os.path.getsize(path) != size:
        with open(path, "wb") as f:
            f.write(np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes())
    with open(path, "rb") as f:
        while f.read(1 << 24): pass

def mapped(fd, start, seg, stride, count, out, window=8 << 20):
    page = mmap.PAGESIZE
    per = max(1, window // stride); k = 0
    while k < count:
        m = min(per, count - k); lo = start + k * stride; a = lo // page * page
        mm = mmap.mmap(fd, lo + (m - 1) * stride + seg - a, prot=mmap.PROT_READ, offset=a)
        src = np.frombuffer(mm, np.uint8)
        view = np.lib.stride_tricks.as_strided(src[lo - a:], (m, seg), (stride, 1), writeable=False)
        dst = np.lib.stride_tricks.as_strided(out[k * seg:], (m, seg), (seg, 1))
        np.copyto(dst, view); del src, view, dst; mm.close(); k += m

def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--gib", type=int, default=1)
    a = ap.parse_args(argv)
    os.makedirs(a.data, exist_ok=True)
    path, size = os.path.join(a.data, f"uring-{a.gib}g.bin"), a.gib << 30
    make(path, size)
    fd = os.open(path, os.O_RDONLY)
    for threads in (int(x) for x in a.threads.split(",")):
        run_threads(path, fd, size, threads)
    return 0


def run_threads(path, fd, size, threads):
    for seg, stride in ((1024, 8192), (3584, 28672), (4096, 8192), (65536, 131072)):
        slot = 16 << 20
        per = slot // seg
        count_total = size // stride
        jobs = [(i * stride, min(per, count_total - i)) for i in range(0, count_total, per)]
        def check(out, st, cnt):
            ref = np.fromfile(path, np.uint8, count=(cnt - 1) * stride + seg, offset=st)
            v = np.lib.stride_tricks.as_strided(ref, (cnt, seg), (stride, 1))
            assert np.array_equal(out[:cnt * seg].reshape(cnt, seg), v)
        for how in ("mapped", "uring", "mapped", "uring"):
            bufs = [np.empty(slot, np.uint8) for _ in range(threads)]
            rings = [Ring() for _ in range(threads)] if how == "uring" else None
            lock = threading.Lock(); todo = list(jobs)
            def work(t):
                b = bufs[t]
                while True:
                    with lock:
                        if not todo: return
                        st, cnt = todo.pop()
                    if how == "mapped":
                        mapped(fd, st, seg, stride, cnt, b)
                    else:
                        offs = st + np.arange(cnt, dtype=np.uint64) * stride
                        lens = np.full(cnt, seg, np.uint32)
                        addrs = b.ctypes.data + np.arange(cnt, dtype=np.uint64) * seg
                        rings[t].read_segments(fd, offs, lens, addrs)
            t0 = time.perf_counter()
            ths = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
            [x.start() for x in ths]; [x.join() for x in ths]
            dt = time.perf_counter() - t0
            st, cnt = jobs[-1]
            # verify one job
            if how == "uring": rings[0].read_segments(fd, st + np.arange(cnt, dtype=np.uint64)*stride, np.full(cnt, seg, np.uint32), bufs[0].ctypes.data + np.arange(cnt, dtype=np.uint64)*seg)
            else: mapped(fd, st, seg, stride, cnt, bufs[0])
            check(bufs[0], st, cnt)
            payload = seg * count_total
            print(f"seg {seg:6d} stride {stride:6d} threads {threads} {how:7s} {payload/dt/1e9:6.2f} GB/s payload ({dt:.3f} s)")


if __name__ == "__main__":
    raise SystemExit(main())
