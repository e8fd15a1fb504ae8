// typed-amp: the fused attention on tensor cores, for 16-bit Q, K and V whose heads are HD =
// 16, 32 or 64 columns wide, on GPUs of compute capability 8.0 or higher. Compiled by NVRTC
// for compute_80 as a module of its own, with the entry points `cuda_kernel.rs` instantiates
// (see `MMA_SOURCE` there).
//
// FlashAttention-2's algorithm on `mma.sync.m16n8k16` (16-bit operands, FP32 accumulation):
// a block is four warps, each owning 16 rows (query rows in the forward and the queries'
// gradient, keys in the keys' and values' gradient), 64 rows a block. Scores, the online
// softmax's maxima and sums, the log-sum-exps and every accumulator are FP32; the
// probabilities and the scores' gradient are rounded once to the working precision before
// they enter a product (the CPU kernel rounds them at the same points). The grid's order and
// the causal limits are those of the CUDA-core kernels (attention.cuh), and so are the rules
// for what is masked (probability 0, gradient 0·(dP − D)) and what is padding (exactly 0).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"): with g = lane / 4 and
// t = lane % 4, the A operand's four registers hold rows g, g + 8, g, g + 8 at columns
// 2t, 2t, 2t + 8, 2t + 8 (two consecutive columns each, the lower in the low half); the B
// operand's two hold column g at rows 2t and 2t + 8 (two consecutive rows each); the FP32
// accumulator's four values are row g, columns 2t, 2t + 1, then row g + 8, the same columns.
// So an accumulator tile pair (n-tiles 2k and 2k + 1) is, packed, the A operand of the next
// product over k-step k, and every B operand is two 32-bit reads of a shared tile stored with
// the product's reduction dimension along its rows.
#define AM_T 64          // rows a block owns: 4 warps x 16
#define AM_THREADS 128
#define AM_NEG_INF __uint_as_float(0xff800000u)

template <typename T> struct AmMma;
template <> struct AmMma<tamp_bf16> {
    static __device__ __forceinline__ void mma(float *c, const u32 *a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // `lo` and `hi` rounded to nearest-even, `lo` in the low half.
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct AmMma<tamp_f16> {
    static __device__ __forceinline__ void mma(float *c, const u32 *a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

typedef unsigned short u16;

// Two consecutive 16-bit elements of global memory (zero where `ok` is false), as a register.
__device__ __forceinline__ u32 am_pair(const u16 *p, bool ok, u64 i) {
    return ok ? ((u32)p[i] | ((u32)p[i + 1] << 16)) : 0u;
}

// Two consecutive 16-bit elements of a shared tile (the column is even, rows are 4-byte
// aligned), as a register.
__device__ __forceinline__ u32 am_word(const u16 *p) { return *(const u32 *)p; }

// The A operand of rows r0 and r0 + 8 (= r1) at head columns 16·kk of a packed row-major
// matrix whose row `r` starts at `row(r)`.
template <int HD>
__device__ __forceinline__ void am_rows(u32 (*a)[4], const u16 *p, u64 at0, bool ok0, u64 at1,
                                        bool ok1, u32 t) {
    #pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        const u64 c = kk * 16 + t * 2;
        a[kk][0] = am_pair(p, ok0, at0 + c);
        a[kk][1] = am_pair(p, ok1, at1 + c);
        a[kk][2] = am_pair(p, ok0, at0 + c + 8);
        a[kk][3] = am_pair(p, ok1, at1 + c + 8);
    }
}

// Packs accumulator n-tiles 2k and 2k + 1 into the A operand of k-step k.
template <typename T>
__device__ __forceinline__ void am_as_a(u32 *a, const float *lo, const float *hi) {
    a[0] = AmMma<T>::pack(lo[0], lo[1]);
    a[1] = AmMma<T>::pack(lo[2], lo[3]);
    a[2] = AmMma<T>::pack(hi[0], hi[1]);
    a[3] = AmMma<T>::pack(hi[2], hi[3]);
}

// acc[n] += A · B for n-tiles n < N, B's column n·8 + g being row n·8 + g of `tile` (stride
// LD) from column `c0` on.
template <typename T, int N, int LD>
__device__ __forceinline__ void am_product(float (*acc)[4], const u32 *a, const u16 (*tile)[LD],
                                           u32 c0, u32 g, u32 t) {
    #pragma unroll
    for (int n = 0; n < N; ++n) {
        const u16 *r = &tile[n * 8 + g][c0 + t * 2];
        AmMma<T>::mma(acc[n], a, am_word(r), am_word(r + 8));
    }
}

template <typename T>
__device__ __forceinline__ void am_put(T *p, u64 i, float g, u32 accumulate) {
    store(p, i, accumulate ? g + load(p, i) : g);
}

// Block indices: `bid` = (tile · batch + b) · heads + h.
struct AmBlock { u64 tile, b, h; };
__device__ __forceinline__ AmBlock am_block(u64 bid, u64 batch, u64 heads) {
    AmBlock k;
    k.h = bid % heads; bid /= heads;
    k.b = bid % batch;
    k.tile = bid / batch;
    return k;
}

// ---- forward ----
template <typename T, int HD>
__device__ void am_attn_forward(u64 batch, u64 tokens, u64 heads, u32 causal, float scale,
                                const T *qkv, T *y, float *lse) {
    __shared__ __align__(16) u16 ks[AM_T][HD + 8];   // K: [key][column]
    __shared__ __align__(16) u16 vt[HD][AM_T + 8];   // V, transposed: [column][key]

    const u64 width = heads * HD, row3 = 3 * width;
    const u64 qtiles = (tokens + AM_T - 1) / AM_T;
    const AmBlock blk = am_block(blockIdx.x, batch, heads);
    // The last query tiles see the most keys (causal): they go first.
    const u64 i0 = (qtiles - 1 - blk.tile) * AM_T, base = blk.b * tokens;
    const u16 *q = (const u16 *)qkv + blk.h * HD, *k = q + width, *v = q + 2 * width;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const u64 r0 = i0 + warp * 16 + g, r1 = r0 + 8;

    u32 qa[HD / 16][4];
    am_rows<HD>(qa, q, (base + r0) * row3, r0 < tokens, (base + r1) * row3, r1 < tokens, t);
    float o[HD / 8][4], m[2] = {AM_NEG_INF, AM_NEG_INF}, sum[2] = {0.0f, 0.0f};
    #pragma unroll
    for (int n = 0; n < HD / 8; ++n)
        #pragma unroll
        for (int c = 0; c < 4; ++c) o[n][c] = 0.0f;

    // Causal: keys up to the tile's last row at most.
    const u64 kend = (causal && i0 + AM_T < tokens) ? i0 + AM_T : tokens;
    for (u64 j0 = 0; j0 < kend; j0 += AM_T) {
        __syncthreads();
        for (u32 e = tid; e < AM_T * HD; e += AM_THREADS) {
            const u32 r = e / HD, c = e % HD;
            const u64 kj = j0 + r;
            const bool ok = kj < tokens;
            ks[r][c] = ok ? k[(base + kj) * row3 + c] : (u16)0;
            vt[c][r] = ok ? v[(base + kj) * row3 + c] : (u16)0;
        }
        __syncthreads();
        float s[AM_T / 8][4];
        #pragma unroll
        for (int n = 0; n < AM_T / 8; ++n)
            #pragma unroll
            for (int c = 0; c < 4; ++c) s[n][c] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)
            am_product<T, AM_T / 8, HD + 8>(s, qa[kk], ks, kk * 16, g, t);
        // The online softmax per row (accumulator values 0, 1: row r0; 2, 3: row r1); the four
        // lanes of a quad hold the same rows and agree through shuffles. Masked and padding
        // keys become -inf (probability 0); `fmaxf` skips NaN, and a visible NaN score stays
        // NaN through the exponential into the sum and the output.
        #pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const u64 i = hr ? r1 : r0;
            float tmax = AM_NEG_INF;
            #pragma unroll
            for (int n = 0; n < AM_T / 8; ++n)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const u64 j = j0 + n * 8 + t * 2 + e;
                    float &x = s[n][hr * 2 + e];
                    x = __fmul_rn(x, scale);
                    if (j < tokens && (!causal || j <= i)) tmax = fmaxf(tmax, x);
                    else x = AM_NEG_INF;
                }
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
            const float nm = fmaxf(m[hr], tmax);
            float psum = 0.0f;
            #pragma unroll
            for (int n = 0; n < AM_T / 8; ++n)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float &x = s[n][hr * 2 + e];
                    x = nm != AM_NEG_INF ? expf(x - nm) : 0.0f;
                    psum += x;
                }
            psum += __shfl_xor_sync(0xffffffffu, psum, 1);
            psum += __shfl_xor_sync(0xffffffffu, psum, 2);
            const float rescale = m[hr] == AM_NEG_INF ? 0.0f : expf(m[hr] - nm);
            sum[hr] = sum[hr] * rescale + psum;
            m[hr] = nm;
            #pragma unroll
            for (int n = 0; n < HD / 8; ++n) {
                o[n][hr * 2] *= rescale;
                o[n][hr * 2 + 1] *= rescale;
            }
        }
        // o += P·V over the tile's keys, 16 at a time.
        #pragma unroll
        for (int kk = 0; kk < AM_T / 16; ++kk) {
            u32 pa[4];
            am_as_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
            am_product<T, HD / 8, AM_T + 8>(o, pa, vt, kk * 16, g, t);
        }
    }
    #pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const u64 i = hr ? r1 : r0;
        if (i >= tokens) continue;
        const float inv = 1.0f / sum[hr];
        #pragma unroll
        for (int n = 0; n < HD / 8; ++n)
            #pragma unroll
            for (int e = 0; e < 2; ++e)
                store(y, (base + i) * width + blk.h * HD + n * 8 + t * 2 + e, o[n][hr * 2 + e] * inv);
        if (t == 0) lse[(blk.b * heads + blk.h) * tokens + i] = m[hr] + logf(sum[hr]);
    }
}

// ---- backward: the keys' and values' gradients, a block per 64 keys ----
// BQ queries per step (64 for heads up to 64 columns wide: four tiles of BQ × HD in 37 KiB).
template <typename T, int HD, int BQ>
__device__ void am_attn_dkv(u64 batch, u64 tokens, u64 heads, u32 causal, u32 accumulate,
                            float scale, const T *qkv, const T *dy, const float *lse,
                            const float *delta, T *dqkv) {
    __shared__ __align__(16) u16 qs[BQ][HD + 8];   // Q: [query][column]
    __shared__ __align__(16) u16 qt[HD][BQ + 8];   // Q, transposed: [column][query]
    __shared__ __align__(16) u16 ys[BQ][HD + 8];   // dY: [query][column]
    __shared__ __align__(16) u16 yt[HD][BQ + 8];   // dY, transposed
    __shared__ float ls[BQ], ds[BQ];               // the queries' log-sum-exps and D

    const u64 width = heads * HD, row3 = 3 * width;
    const AmBlock blk = am_block(blockIdx.x, batch, heads);
    // Causal: the first key tiles are seen by the most queries: they go first.
    const u64 j0 = blk.tile * AM_T, base = blk.b * tokens;
    const u64 lrow = (blk.b * heads + blk.h) * tokens;
    const u16 *q = (const u16 *)qkv + blk.h * HD, *k = q + width, *v = q + 2 * width;
    const u16 *dyh = (const u16 *)dy + blk.h * HD;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const u64 k0 = j0 + warp * 16 + g, k1 = k0 + 8;   // this thread's keys (accumulator rows)

    u32 ka[HD / 16][4], va[HD / 16][4];
    am_rows<HD>(ka, k, (base + k0) * row3, k0 < tokens, (base + k1) * row3, k1 < tokens, t);
    am_rows<HD>(va, v, (base + k0) * row3, k0 < tokens, (base + k1) * row3, k1 < tokens, t);
    float dk[HD / 8][4], dv[HD / 8][4];
    #pragma unroll
    for (int n = 0; n < HD / 8; ++n)
        #pragma unroll
        for (int c = 0; c < 4; ++c) dk[n][c] = dv[n][c] = 0.0f;

    // Causal: queries before j0 see none of these keys.
    for (u64 i0 = causal ? j0 : 0; i0 < tokens; i0 += BQ) {
        __syncthreads();
        for (u32 e = tid; e < BQ * HD; e += AM_THREADS) {
            const u32 r = e / HD, c = e % HD;
            const u64 qi = i0 + r;
            const bool ok = qi < tokens;
            const u16 qv = ok ? q[(base + qi) * row3 + c] : (u16)0;
            const u16 yv = ok ? dyh[(base + qi) * width + c] : (u16)0;
            qs[r][c] = qv;
            qt[c][r] = qv;
            ys[r][c] = yv;
            yt[c][r] = yv;
        }
        for (u32 e = tid; e < BQ; e += AM_THREADS) {
            const u64 qi = i0 + e;
            ls[e] = qi < tokens ? lse[lrow + qi] : 0.0f;
            ds[e] = qi < tokens ? delta[lrow + qi] : 0.0f;
        }
        __syncthreads();
        // Sᵀ = K·Qᵀ and dPᵀ = V·dYᵀ: rows are this warp's keys, columns the tile's queries.
        float s[BQ / 8][4], dp[BQ / 8][4];
        #pragma unroll
        for (int n = 0; n < BQ / 8; ++n)
            #pragma unroll
            for (int c = 0; c < 4; ++c) s[n][c] = dp[n][c] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            am_product<T, BQ / 8, HD + 8>(s, ka[kk], qs, kk * 16, g, t);
            am_product<T, BQ / 8, HD + 8>(dp, va[kk], ys, kk * 16, g, t);
        }
        // Pᵀ from the forward's log-sum-exps, and dSᵀ = Pᵀ ⊙ (dPᵀ − D), in place.
        #pragma unroll
        for (int n = 0; n < BQ / 8; ++n)
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
                const u64 j = c < 2 ? k0 : k1;
                const u32 x = n * 8 + t * 2 + (c & 1);
                const u64 i = i0 + x;
                const bool qin = i < tokens, kin = j < tokens;
                const bool vis = qin && kin && (!causal || j <= i);
                const float p = vis ? expf(__fmul_rn(s[n][c], scale) - ls[x]) : 0.0f;
                dp[n][c] = (qin && kin) ? p * (dp[n][c] - ds[x]) : 0.0f;
                s[n][c] = p;
            }
        // dV += Pᵀ·dY and dK += dSᵀ·Q over the tile's queries, 16 at a time.
        #pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk) {
            u32 pa[4], da[4];
            am_as_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
            am_as_a<T>(da, dp[2 * kk], dp[2 * kk + 1]);
            am_product<T, HD / 8, BQ + 8>(dv, pa, yt, kk * 16, g, t);
            am_product<T, HD / 8, BQ + 8>(dk, da, qt, kk * 16, g, t);
        }
    }
    #pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const u64 j = hr ? k1 : k0;
        if (j >= tokens) continue;
        #pragma unroll
        for (int n = 0; n < HD / 8; ++n)
            #pragma unroll
            for (int e = 0; e < 2; ++e) {
                const u64 at = (base + j) * row3 + blk.h * HD + n * 8 + t * 2 + e;
                am_put(dqkv, at + width, dk[n][hr * 2 + e] * scale, accumulate);
                am_put(dqkv, at + 2 * width, dv[n][hr * 2 + e], accumulate);
            }
    }
}

// ---- backward: the queries' gradient, a block per 64 query rows ----
template <typename T, int HD>
__device__ void am_attn_dq(u64 batch, u64 tokens, u64 heads, u32 causal, u32 accumulate,
                           float scale, const T *qkv, const T *dy, const float *lse,
                           const float *delta, T *dqkv) {
    __shared__ __align__(16) u16 ks[AM_T][HD + 8];   // K: [key][column]
    __shared__ __align__(16) u16 kt[HD][AM_T + 8];   // K, transposed: [column][key]
    __shared__ __align__(16) u16 vs[AM_T][HD + 8];   // V: [key][column]

    const u64 width = heads * HD, row3 = 3 * width;
    const u64 qtiles = (tokens + AM_T - 1) / AM_T;
    const AmBlock blk = am_block(blockIdx.x, batch, heads);
    const u64 i0 = (qtiles - 1 - blk.tile) * AM_T, base = blk.b * tokens;
    const u64 lrow = (blk.b * heads + blk.h) * tokens;
    const u16 *q = (const u16 *)qkv + blk.h * HD, *k = q + width, *v = q + 2 * width;
    const u16 *dyh = (const u16 *)dy + blk.h * HD;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const u64 r0 = i0 + warp * 16 + g, r1 = r0 + 8;

    u32 qa[HD / 16][4], ya[HD / 16][4];
    am_rows<HD>(qa, q, (base + r0) * row3, r0 < tokens, (base + r1) * row3, r1 < tokens, t);
    am_rows<HD>(ya, dyh, (base + r0) * width, r0 < tokens, (base + r1) * width, r1 < tokens, t);
    const float li[2] = {r0 < tokens ? lse[lrow + r0] : 0.0f, r1 < tokens ? lse[lrow + r1] : 0.0f};
    const float di[2] = {r0 < tokens ? delta[lrow + r0] : 0.0f, r1 < tokens ? delta[lrow + r1] : 0.0f};
    float dq[HD / 8][4];
    #pragma unroll
    for (int n = 0; n < HD / 8; ++n)
        #pragma unroll
        for (int c = 0; c < 4; ++c) dq[n][c] = 0.0f;

    const u64 kend = (causal && i0 + AM_T < tokens) ? i0 + AM_T : tokens;
    for (u64 j0 = 0; j0 < kend; j0 += AM_T) {
        __syncthreads();
        for (u32 e = tid; e < AM_T * HD; e += AM_THREADS) {
            const u32 r = e / HD, c = e % HD;
            const u64 kj = j0 + r;
            const bool ok = kj < tokens;
            const u16 kv = ok ? k[(base + kj) * row3 + c] : (u16)0;
            ks[r][c] = kv;
            kt[c][r] = kv;
            vs[r][c] = ok ? v[(base + kj) * row3 + c] : (u16)0;
        }
        __syncthreads();
        // S = Q·Kᵀ and dP = dY·Vᵀ: rows are this warp's queries, columns the tile's keys.
        float s[AM_T / 8][4], dp[AM_T / 8][4];
        #pragma unroll
        for (int n = 0; n < AM_T / 8; ++n)
            #pragma unroll
            for (int c = 0; c < 4; ++c) s[n][c] = dp[n][c] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            am_product<T, AM_T / 8, HD + 8>(s, qa[kk], ks, kk * 16, g, t);
            am_product<T, AM_T / 8, HD + 8>(dp, ya[kk], vs, kk * 16, g, t);
        }
        // dS = P ⊙ (dP − D), in place of S.
        #pragma unroll
        for (int n = 0; n < AM_T / 8; ++n)
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
                const u64 i = c < 2 ? r0 : r1, j = j0 + n * 8 + t * 2 + (c & 1);
                const bool qin = i < tokens, kin = j < tokens;
                const bool vis = qin && kin && (!causal || j <= i);
                const float p = vis ? expf(__fmul_rn(s[n][c], scale) - li[c >> 1]) : 0.0f;
                s[n][c] = (qin && kin) ? p * (dp[n][c] - di[c >> 1]) : 0.0f;
            }
        // dQ += dS·K over the tile's keys, 16 at a time.
        #pragma unroll
        for (int kk = 0; kk < AM_T / 16; ++kk) {
            u32 da[4];
            am_as_a<T>(da, s[2 * kk], s[2 * kk + 1]);
            am_product<T, HD / 8, AM_T + 8>(dq, da, kt, kk * 16, g, t);
        }
    }
    #pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const u64 i = hr ? r1 : r0;
        if (i >= tokens) continue;
        #pragma unroll
        for (int n = 0; n < HD / 8; ++n)
            #pragma unroll
            for (int e = 0; e < 2; ++e)
                am_put(dqkv, (base + i) * row3 + blk.h * HD + n * 8 + t * 2 + e,
                       dq[n][hr * 2 + e] * scale, accumulate);
    }
}
