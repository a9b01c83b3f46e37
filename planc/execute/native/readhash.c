/* planc's read-and-hash loop: one request of a digest-verified load read a piece at a time into
 * its ring slot, each piece hashed into its leaf's xxh3-128 state while it is in the core's cache,
 * with no return to the interpreter between pieces (planc/execute/readhash.py calls it through
 * ctypes, which lets the other readers run for the whole call).
 *
 * It links nothing: pread and xxhash's reset / update come in as function pointers (libc's, and
 * those of the xxhash package's own library), so the shared object is self-contained.
 * Built by tools/build_native.sh; tests/test_readhash.py fails when it is older than this file. */

typedef long long i64;
typedef unsigned long size_t_;
typedef i64 (*pread_fn)(int, void *, size_t_, i64);
typedef int (*reset_fn)(void *);
typedef int (*update_fn)(void *, const void *, size_t_);
typedef struct { unsigned long long low64, high64; } hash128;
typedef hash128 (*digest_fn)(const void *);

static void canonical(unsigned char *out, hash128 h)
{
    for (int k = 0; k < 8; k++) {
        out[k] = (unsigned char)(h.high64 >> (56 - 8 * k));
        out[8 + k] = (unsigned char)(h.low64 >> (56 - 8 * k));
    }
}

/* Read bytes [offset, offset + needed) of `fd` (at most `cap` bytes, `piece` at a time: each read
 * ends at a file offset that is a multiple of `piece`, or at `cap`) into `base`, and hash bytes
 * [lo[i], hi[i]) (relative to `offset`, sorted, disjoint, inside [0, needed)) into `states[i]`,
 * its 16-byte digest (xxhash's canonical form: big-endian, high half first) into out[16 i].
 * Returns the bytes read (at least `needed`), or the bytes read before the file ended (less than
 * `needed`: no digests), or -1 when a read failed: the caller reads the request again its own way,
 * which says why. With `direct`, a read that ends off a 4096-byte boundary ends the loop (O_DIRECT at the
 * end of a file). */
i64 planc_read_hash(pread_fn pread, reset_fn reset, update_fn update, digest_fn digest, int fd,
                    unsigned char *base, i64 offset, i64 needed, i64 cap, i64 piece, int direct,
                    const i64 *lo, const i64 *hi, void *const *states, i64 nleaves, unsigned char *out)
{
    i64 got = 0, hashed = 0, li = 0;
    if (piece <= 0 || cap < needed)
        return -1;
    while (got < needed) {
        i64 stop = ((offset + got) / piece + 1) * piece - offset;
        if (stop > cap)
            stop = cap;
        i64 n = pread(fd, base + got, (size_t_)(stop - got), offset + got);
        if (n < 0)
            return -1;
        if (n == 0)
            return got;
        got += n;
        while (li < nleaves && hashed < got) {
            if (hashed < lo[li]) {
                hashed = lo[li];
                if (hashed >= got)
                    break;
            }
            if (hashed == lo[li] && reset(states[li]) != 0)
                return -1;
            i64 upto = got < hi[li] ? got : hi[li];
            if (update(states[li], base + hashed, (size_t_)(upto - hashed)) != 0)
                return -1;
            hashed = upto;
            if (hashed == hi[li])
                li++;
        }
        if (direct && (got & 4095))
            break;
    }
    if (got < needed || li < nleaves)
        return got < needed ? got : -1;
    for (i64 i = 0; i < nleaves; i++)
        canonical(out + 16 * i, digest(states[i]));
    return got;
}
