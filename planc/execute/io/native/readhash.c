/* planc's read-and-hash loop: one request of a digest-verified load read a piece at a time into
 * its ring slot, each span of it (a leaf, or a witness's part of one) hashed with xxh3-128 while its
 * bytes are in the core's cache, with no return to the interpreter between pieces
 * (planc/execute/io/readhash.py calls it through ctypes, which lets the other readers run for the
 * whole call).
 *
 * The hash is XXH3's 128-bit long-input path (seed 0, default secret) written here, for spans of
 * more than 240 bytes (readhash.py hashes shorter ones with the xxhash package), with AVX2 or
 * AVX-512 where the processor and the system allow it (`planc_simd`): the package's library is
 * built for SSE2 only and hashes about half as fast a byte (docs/reload.md). A span lies whole in
 * the request's buffer, so its stripes are taken from there as the pieces land, and its last stripe
 * (the input's last 64 bytes) at the end. It links nothing: pread comes in as a function pointer, so
 * the shared object is self-contained. Built when planc is installed (setup.py;
 * tools/build_native.sh in place); readhash.py does not use an object built from another version of
 * this file, and checks its digests against the package's when loaded. */

#include <cpuid.h>
#include <immintrin.h>

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned long size_t_;
typedef i64 (*pread_fn)(int, void *, size_t_, i64);
typedef struct { u64 low64, high64; } hash128;

/* XXH3's constants (its specification): the default secret and the primes. */
static const unsigned char SECRET[192] __attribute__((aligned(64))) = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};
#define P32_1 0x9E3779B1U
#define P32_2 0x85EBCA77U
#define P32_3 0xC2B2AE3DU
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL
#define STRIPE 64
#define BLOCK_STRIPES 16 /* (sizeof SECRET - STRIPE) / 8 */
#define SCRAMBLE_KEY (SECRET + sizeof SECRET - STRIPE)
#define LAST_KEY (SECRET + sizeof SECRET - STRIPE - 7)
#define MAX_SHORT 240 /* longer inputs take the stripe path */

enum { SIMD_SCALAR = 1, SIMD_AVX2 = 2, SIMD_AVX512 = 3 };

static u64 read64(const unsigned char *p)
{
    u64 v;
    __builtin_memcpy(&v, p, 8);
    return v;
}

/* ---- the stripes: `n` stripes from `in` into `acc`, stripe k keyed by `key + 8 k` ---- */

static void stripes_scalar(u64 *acc, const unsigned char *in, const unsigned char *key, i64 n)
{
    for (i64 s = 0; s < n; s++, in += STRIPE, key += 8)
        for (int i = 0; i < 8; i++) {
            u64 v = read64(in + 8 * i), k = v ^ read64(key + 8 * i);
            acc[i ^ 1] += v;
            acc[i] += (u64)(u32)k * (k >> 32);
        }
}

static void scramble_scalar(u64 *acc)
{
    for (int i = 0; i < 8; i++) {
        u64 a = acc[i];
        a ^= a >> 47;
        a ^= read64(SCRAMBLE_KEY + 8 * i);
        acc[i] = a * P32_1;
    }
}

__attribute__((target("avx2"))) static void stripes_avx2(u64 *acc, const unsigned char *in,
                                                         const unsigned char *key, i64 n)
{
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc), a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    for (i64 s = 0; s < n; s++, in += STRIPE, key += 8) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)in), v1 = _mm256_loadu_si256((const __m256i *)(in + 32));
        __m256i k0 = _mm256_xor_si256(v0, _mm256_loadu_si256((const __m256i *)key));
        __m256i k1 = _mm256_xor_si256(v1, _mm256_loadu_si256((const __m256i *)(key + 32)));
        __m256i p0 = _mm256_mul_epu32(k0, _mm256_srli_epi64(k0, 32));
        __m256i p1 = _mm256_mul_epu32(k1, _mm256_srli_epi64(k1, 32));
        a0 = _mm256_add_epi64(a0, _mm256_add_epi64(p0, _mm256_shuffle_epi32(v0, _MM_SHUFFLE(1, 0, 3, 2))));
        a1 = _mm256_add_epi64(a1, _mm256_add_epi64(p1, _mm256_shuffle_epi32(v1, _MM_SHUFFLE(1, 0, 3, 2))));
    }
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
}

__attribute__((target("avx2"))) static void scramble_avx2(u64 *acc)
{
    const __m256i prime = _mm256_set1_epi32((int)P32_1);
    for (int h = 0; h < 2; h++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(acc + 4 * h));
        a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(SCRAMBLE_KEY + 32 * h)));
        __m256i lo = _mm256_mul_epu32(a, prime);
        __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), prime);
        _mm256_storeu_si256((__m256i *)(acc + 4 * h), _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32)));
    }
}

__attribute__((target("avx512f"))) static void stripes_avx512(u64 *acc, const unsigned char *in,
                                                              const unsigned char *key, i64 n)
{
    __m512i a = _mm512_loadu_si512((const void *)acc);
    for (i64 s = 0; s < n; s++, in += STRIPE, key += 8) {
        __m512i v = _mm512_loadu_si512((const void *)in);
        __m512i k = _mm512_xor_si512(v, _mm512_loadu_si512((const void *)key));
        __m512i p = _mm512_mul_epu32(k, _mm512_srli_epi64(k, 32));
        a = _mm512_add_epi64(a, _mm512_add_epi64(p, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2))));
    }
    _mm512_storeu_si512((void *)acc, a);
}

__attribute__((target("avx512f"))) static void scramble_avx512(u64 *acc)
{
    __m512i a = _mm512_loadu_si512((const void *)acc);
    a = _mm512_xor_si512(a, _mm512_srli_epi64(a, 47));
    a = _mm512_xor_si512(a, _mm512_loadu_si512((const void *)SCRAMBLE_KEY));
    const __m512i prime = _mm512_set1_epi32((int)P32_1);
    __m512i lo = _mm512_mul_epu32(a, prime), hi = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), prime);
    _mm512_storeu_si512((void *)acc, _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32)));
}

static void stripes(int simd, u64 *acc, const unsigned char *in, const unsigned char *key, i64 n)
{
    if (simd == SIMD_AVX512)
        stripes_avx512(acc, in, key, n);
    else if (simd == SIMD_AVX2)
        stripes_avx2(acc, in, key, n);
    else
        stripes_scalar(acc, in, key, n);
}

static void scramble(int simd, u64 *acc)
{
    if (simd == SIMD_AVX512)
        scramble_avx512(acc);
    else if (simd == SIMD_AVX2)
        scramble_avx2(acc);
    else
        scramble_scalar(acc);
}

/* ---- one leaf hashed by the stripe path: its accumulators and how many stripes they hold ---- */

typedef struct { u64 acc[8]; i64 done; } leaf_state;

static void leaf_reset(leaf_state *st)
{
    static const u64 init[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    for (int i = 0; i < 8; i++)
        st->acc[i] = init[i];
    st->done = 0;
}

/* Take `n` stripes at `in` into `st`, keyed by their place in the block, scrambling after each
 * block of 16. */
static void feed_n(int simd, leaf_state *st, const unsigned char *in, i64 n)
{
    while (n > 0) {
        i64 in_block = st->done % BLOCK_STRIPES, m = BLOCK_STRIPES - in_block;
        if (m > n)
            m = n;
        stripes(simd, st->acc, in, SECRET + 8 * in_block, m);
        st->done += m;
        in += STRIPE * m;
        n -= m;
        if (st->done % BLOCK_STRIPES == 0)
            scramble(simd, st->acc);
    }
}

/* Take the stripes of a `len`-byte input at `in` (`avail` of its bytes there so far) that lie
 * within those bytes and are followed by at least one more byte of it (XXH3 keeps the last stripe
 * for the end). */
static void leaf_feed(int simd, leaf_state *st, const unsigned char *in, i64 avail, i64 len)
{
    i64 upto = (avail < len ? avail : len - 1) / STRIPE; /* stripes that may be taken */
    if (st->done < upto)
        feed_n(simd, st, in + st->done * STRIPE, upto - st->done);
}

static u64 avalanche(u64 h)
{
    h ^= h >> 37;
    h *= 0x165667919E3779F9ULL;
    return h ^ (h >> 32);
}

static u64 merge(const u64 *acc, const unsigned char *key, u64 start)
{
    u64 r = start;
    for (int i = 0; i < 4; i++) {
        unsigned __int128 m = (unsigned __int128)(acc[2 * i] ^ read64(key + 16 * i)) *
                              (acc[2 * i + 1] ^ read64(key + 16 * i + 8));
        r += (u64)m ^ (u64)(m >> 64);
    }
    return avalanche(r);
}

/* The digest of a `len`-byte input at `in` (len > MAX_SHORT) whose stripes before the last are in
 * `st`: the last stripe, then the 128-bit merge. */
static hash128 leaf_digest(int simd, leaf_state *st, const unsigned char *in, i64 len)
{
    leaf_feed(simd, st, in, len, len);
    stripes(simd, st->acc, in + len - STRIPE, LAST_KEY, 1);
    hash128 h;
    h.low64 = merge(st->acc, SECRET + 11, (u64)len * P64_1);
    h.high64 = merge(st->acc, SECRET + sizeof SECRET - STRIPE - 11, ~((u64)len * P64_2));
    return h;
}

static void canonical(unsigned char *out, hash128 h)
{
    for (int k = 0; k < 8; k++) {
        out[k] = (unsigned char)(h.high64 >> (56 - 8 * k));
        out[8 + k] = (unsigned char)(h.low64 >> (56 - 8 * k));
    }
}

/* The fastest stripe path this processor and system run: SIMD_AVX512, SIMD_AVX2 or SIMD_SCALAR. */
int planc_simd(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)) || !(c & (1u << 28)))
        return SIMD_SCALAR; /* no OSXSAVE or no AVX */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6) != 6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return SIMD_SCALAR; /* the system does not save the vector registers */
    if ((b & (1u << 16)) && (lo & 0xe0) == 0xe0)
        return SIMD_AVX512;
    return (b & (1u << 5)) ? SIMD_AVX2 : SIMD_SCALAR;
}

/* ---- the spans of one request: fed in order as its bytes become available ---- */

typedef struct {
    const i64 *lo, *hi;
    i64 nspans, si;
    unsigned char *out;
    int simd, begun;
    leaf_state st;
} spans_t;

/* Hash what the first `got` bytes at `base` (the request's byte 0) hold of the spans not yet done. */
static void feed_spans(spans_t *S, const unsigned char *base, i64 got)
{
    while (S->si < S->nspans && S->lo[S->si] < got) {
        i64 si = S->si, a = S->lo[si], b = S->hi[si];
        if (!S->begun)
            leaf_reset(&S->st);
        S->begun = 1;
        if (got < b) {
            leaf_feed(S->simd, &S->st, base + a, got - a, b - a);
            return;
        }
        canonical(S->out + 16 * si, leaf_digest(S->simd, &S->st, base + a, b - a));
        S->begun = 0;
        S->si++;
    }
}

/* Read bytes [offset, offset + needed) of `fd` (at most `cap` bytes, `piece` at a time: each read
 * ends at a file offset that is a multiple of `piece`, or at `cap`) into `base`, and hash bytes
 * [lo[i], hi[i]) (relative to `offset`, sorted, disjoint, inside [0, needed), each more than
 * MAX_SHORT bytes), its 16-byte digest (xxhash's canonical form: big-endian, high half first) into
 * out[16 i], with the stripe path of level `simd` (SIMD_SCALAR to planc_simd()). Returns the bytes
 * read (at least `needed`), or the bytes read before the file ended (less than `needed`: no
 * digests), or -1 when a read failed or the arguments are not as said: the caller reads the request
 * again its own way, which says why. With `direct`, a read that ends off a 4096-byte boundary ends
 * the loop (O_DIRECT at the end of a file). */
i64 planc_read_hash(pread_fn pread, int fd, unsigned char *base, i64 offset, i64 needed, i64 cap, i64 piece,
                    int direct, const i64 *lo, const i64 *hi, i64 nspans, unsigned char *out, int simd)
{
    i64 got = 0;
    spans_t S = {lo, hi, nspans, 0, out, simd, 0, {{0}, 0}};
    if (piece <= 0 || cap < needed || simd < SIMD_SCALAR || simd > SIMD_AVX512)
        return -1;
    for (i64 i = 0; i < nspans; i++)
        if (lo[i] < (i ? hi[i - 1] : 0) || hi[i] - lo[i] <= MAX_SHORT || hi[i] > needed)
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
        feed_spans(&S, base, got);
        if (direct && (got & 4095))
            break;
    }
    if (got < needed || S.si < nspans)
        return got < needed ? got : -1;
    return got;
}
