"""Probe: the memory-map lock between the ring's pinning lanes and the caller's own steps (no GPU).

    python3 bench/probe_maplock.py FILE

Four lanes populate a 16 x 16 MiB ring (anonymous, `MADV_HUGEPAGE`, `MADV_POPULATE_WRITE`; no
registration) while the caller maps FILE four times (as the page-cache check does) and starts 20
threads: how long the caller's steps take then, against alone. Variants: a mapping per slot (as
`driver.RegisteredMemory`) or one mapping for the ring, populated in 16 MiB or 2 MiB calls; then
the ring's time with 1, 2 and 4 lanes. Findings in docs/execution.md.
"""
import ctypes, mmap, os, threading, time, statistics, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
HUGE, SLOT, SLOTS, LANES = 2 << 20, 16 << 20, 16, 4
PROT = mmap.PROT_READ | mmap.PROT_WRITE
FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
def amap(n):
    a = libc.mmap(None, n + HUGE, PROT, FLAGS, -1, 0)
    p = a + (-a) % HUGE
    if p > a: libc.munmap(a, p - a)
    libc.munmap(p + n, a + n + HUGE - (p + n))
    return p
def populate(p, n, chunk):
    for o in range(0, n, chunk):
        assert libc.madvise(p + o, min(chunk, n - o), 23) == 0, ctypes.get_errno()
def lanes_per_slot(chunk):
    held = []; nxt = [0]; lock = threading.Lock()
    def lane():
        while True:
            with lock:
                k = nxt[0]; nxt[0] += 1
            if k >= SLOTS: return
            p = amap(SLOT); libc.madvise(p, SLOT, 14); populate(p, SLOT, chunk); held.append((p, SLOT))
    return lane, held, None
def lanes_one_map(chunk):
    held = []; nxt = [0]; lock = threading.Lock()
    base = amap(SLOT * SLOTS); libc.madvise(base, SLOT * SLOTS, 14); held.append((base, SLOT * SLOTS))
    def lane():
        while True:
            with lock:
                k = nxt[0]; nxt[0] += 1
            if k >= SLOTS: return
            populate(base + k * SLOT, SLOT, chunk)
    return lane, held, None
fpath = sys.argv[1] if len(sys.argv) > 1 else __file__
fsize = os.path.getsize(fpath)
def caller():
    """what allocate does meanwhile: map 4 files for mincore, start 20 threads"""
    lat = []
    fd = os.open(fpath, os.O_RDONLY)
    for _ in range(4):
        t = time.perf_counter()
        a = libc.mmap(None, fsize, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0); libc.munmap(a, fsize)
        lat.append(time.perf_counter() - t)
    os.close(fd)
    t = time.perf_counter()
    ths = [threading.Thread(target=time.sleep, args=(0,)) for _ in range(20)]
    [x.start() for x in ths]; [x.join() for x in ths]
    lat.append(time.perf_counter() - t)
    return lat
def run(kind, chunk):
    lane, held, _ = (lanes_per_slot if kind == "per-slot" else lanes_one_map)(chunk)
    t0 = time.perf_counter()
    ths = [threading.Thread(target=lane) for _ in range(LANES)]
    [x.start() for x in ths]
    time.sleep(0.002)
    lat = caller()
    [x.join() for x in ths]
    dt = time.perf_counter() - t0
    for p, n in held: libc.munmap(p, n)
    return dt, sum(lat[:4]), lat[4]
res = {}
for rep in range(5):
    for kind, chunk in (("per-slot", SLOT), ("per-slot", HUGE), ("one-map", SLOT), ("one-map", HUGE)):
        res.setdefault((kind, chunk), []).append(run(kind, chunk))
for (kind, chunk), xs in res.items():
    med = lambda i: statistics.median(x[i] for x in xs)
    print(f"{kind:8s} populate chunk {chunk>>20:2d} MiB: ring {med(0)*1e3:6.1f} ms  caller's 4 file maps {med(1)*1e3:6.2f} ms  20 thread starts {med(2)*1e3:6.2f} ms")
print("caller alone:", [round(x*1e3, 2) for x in caller()])
for lanes in (1, 2, 4):
    LANES = lanes
    xs = [run("per-slot", SLOT)[0] for _ in range(3)]
    ys = [run("one-map", SLOT)[0] for _ in range(3)]
    print(f"lanes {lanes}: per-slot ring {statistics.median(xs)*1e3:.1f} ms, one-map ring {statistics.median(ys)*1e3:.1f} ms")
