// typed-amp: the fused attention's CUDA templates, compiled by NVRTC at run time with the
// entry points `cuda_kernel.rs` instantiates per precision (see `SOURCE` there).
#define AT_T 64      // rows of a block's own tile (and keys per forward step)
#define AT_S 32      // rows of the backward kernels' inner tile
#define AT_KC 16     // head columns per step of the score products
#define AT_DC 64     // output columns per block
#define AT_LD 68     // row stride of 64-wide shared tiles (16-byte rows)
#define AT_LDS 36    // row stride of 32-wide shared tiles (16-byte rows)

static_assert(BLOCK == 256, "the attention kernels map 256 threads onto 16 groups of 16 lanes");

#define AT_NEG_INF __uint_as_float(0xff800000u)

// Reductions over the 16 lanes of a group (lanes differing in their low four bits): every lane
// ends with the same bits, since each step adds (or takes the max of) the same two values on
// both lanes of a pair. Called by all 32 lanes of the warp.
__device__ __forceinline__ float at_group_max(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float at_group_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ void at_unpack4(float4 v, float *a) { a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w; }

// Writes (or adds to the old value, `accumulate`) one gradient element, rounded once.
template <typename T>
__device__ __forceinline__ void at_put(T *p, u64 i, float g, u32 accumulate) {
    store(p, i, accumulate ? g + load(p, i) : g);
}

// Block indices: `bid` = ((tile · batch + b) · heads + h) · chunks + chunk.
struct AtBlock { u64 tile, b, h, chunk; };
__device__ __forceinline__ AtBlock at_block(u64 bid, u64 batch, u64 heads, u64 chunks) {
    AtBlock k;
    k.chunk = bid % chunks; bid /= chunks;
    k.h = bid % heads; bid /= heads;
    k.b = bid % batch;
    k.tile = bid / batch;
    return k;
}

// ---- forward ----
// qkv: rows of 3·W (W = heads·hd), row b·T + t = [q | k | v], head h at column h·hd of each
// part. y: rows of W. lse: (b·heads + h)·T + t.
template <typename T>
__device__ void amp_attn_forward(u64 batch, u64 tokens, u64 heads, u64 hd, u32 causal,
                                 float scale, const T *qkv, T *y, float *lse) {
    __shared__ __align__(16) float qs[AT_KC][AT_LD];   // a Q chunk, transposed: [column][query]
    __shared__ __align__(16) float ks[AT_KC][AT_LD];   // a K chunk, transposed: [column][key]
    __shared__ __align__(16) float ps[AT_T][AT_LD];    // probabilities: [key][query]
    __shared__ __align__(16) float vs[AT_T][AT_LD];    // V: [key][output column]

    const u64 width = heads * hd, row3 = 3 * width;
    const u64 qtiles = (tokens + AT_T - 1) / AT_T, chunks = (hd + AT_DC - 1) / AT_DC;
    AtBlock blk = at_block(blockIdx.x, batch, heads, chunks);
    // The last query tiles see the most keys (causal): they go first.
    const u64 i0 = (qtiles - 1 - blk.tile) * AT_T, c0 = blk.chunk * AT_DC;
    const u64 base = blk.b * tokens;
    const T *q = qkv + blk.h * hd, *k = q + width, *v = q + 2 * width;
    const u32 tid = threadIdx.x, g = tid >> 4, l = tid & 15;
    // This thread: query rows i0 + g·4 + r (r < 4); keys j0 + l·4 + x and output columns
    // c0 + l·4 + x (x < 4).

    float m[4], sum[4], o[4][4];
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
        m[r] = AT_NEG_INF;
        sum[r] = 0.0f;
        #pragma unroll
        for (int c = 0; c < 4; ++c) o[r][c] = 0.0f;
    }
    // Causal: keys up to the tile's last row (i0 + AT_T − 1) at most.
    const u64 kend = (causal && i0 + AT_T < tokens) ? i0 + AT_T : tokens;
    for (u64 j0 = 0; j0 < kend; j0 += AT_T) {
        float s[4][4];
        #pragma unroll
        for (int r = 0; r < 4; ++r)
            #pragma unroll
            for (int x = 0; x < 4; ++x) s[r][x] = 0.0f;
        for (u64 d0 = 0; d0 < hd; d0 += AT_KC) {
            // Every thread is done with the previous chunk (and with the previous key tile's
            // ps and vs) before anyone overwrites them.
            __syncthreads();
            for (u32 e = tid; e < AT_T * AT_KC; e += BLOCK) {
                u32 r = e / AT_KC, c = e % AT_KC;
                u64 col = d0 + c, qi = i0 + r, kj = j0 + r;
                qs[c][r] = (qi < tokens && col < hd) ? load(q, (base + qi) * row3 + col) : 0.0f;
                ks[c][r] = (kj < tokens && col < hd) ? load(k, (base + kj) * row3 + col) : 0.0f;
            }
            __syncthreads();
            #pragma unroll
            for (int c = 0; c < AT_KC; ++c) {
                float a[4], b[4];
                at_unpack4(*(const float4 *)&qs[c][g * 4], a);
                at_unpack4(*(const float4 *)&ks[c][l * 4], b);
                #pragma unroll
                for (int r = 0; r < 4; ++r)
                    #pragma unroll
                    for (int x = 0; x < 4; ++x) s[r][x] = fmaf(a[r], b[x], s[r][x]);
            }
        }
        // The online softmax, per row: the new maximum rescales what earlier tiles summed.
        // `fmaxf` skips NaN, and a NaN score stays NaN through the exponential into the sum
        // and the output. Masked and padding keys count as probability 0.
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const u64 i = i0 + g * 4 + r;
            bool vis[4];
            float tmax = AT_NEG_INF;
            #pragma unroll
            for (int x = 0; x < 4; ++x) {
                const u64 j = j0 + l * 4 + x;
                vis[x] = j < tokens && (!causal || j <= i);
                s[r][x] = __fmul_rn(s[r][x], scale);
                if (vis[x]) tmax = fmaxf(tmax, s[r][x]);
            }
            const float nm = fmaxf(m[r], at_group_max(tmax));
            float psum = 0.0f;
            #pragma unroll
            for (int x = 0; x < 4; ++x) {
                float p = (vis[x] && nm != AT_NEG_INF) ? expf(s[r][x] - nm) : 0.0f;
                s[r][x] = p;
                psum += p;
            }
            psum = at_group_sum(psum);
            const float rescale = m[r] == AT_NEG_INF ? 0.0f : expf(m[r] - nm);
            sum[r] = sum[r] * rescale + psum;
            m[r] = nm;
            #pragma unroll
            for (int c = 0; c < 4; ++c) o[r][c] *= rescale;
        }
        for (u32 e = tid; e < AT_T * AT_DC; e += BLOCK) {
            u32 r = e / AT_DC, c = e % AT_DC;
            u64 kj = j0 + r, col = c0 + c;
            vs[r][c] = (kj < tokens && col < hd) ? load(v, (base + kj) * row3 + col) : 0.0f;
        }
        #pragma unroll
        for (int r = 0; r < 4; ++r)
            #pragma unroll
            for (int x = 0; x < 4; ++x) ps[l * 4 + x][g * 4 + r] = s[r][x];
        __syncthreads();
        // o += P·V over the tile's 64 keys, in key order.
        #pragma unroll 8
        for (int j = 0; j < AT_T; ++j) {
            float p[4], w[4];
            at_unpack4(*(const float4 *)&ps[j][g * 4], p);
            at_unpack4(*(const float4 *)&vs[j][l * 4], w);
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                #pragma unroll
                for (int c = 0; c < 4; ++c) o[r][c] = fmaf(p[r], w[c], o[r][c]);
        }
    }
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
        const u64 i = i0 + g * 4 + r;
        if (i >= tokens) continue;
        const float inv = 1.0f / sum[r];
        #pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u64 col = c0 + l * 4 + c;
            if (col < hd) store(y, (base + i) * width + blk.h * hd + col, o[r][c] * inv);
        }
        if (blk.chunk == 0 && l == 0) lse[(blk.b * heads + blk.h) * tokens + i] = m[r] + logf(sum[r]);
    }
}

// ---- backward ----
// D = rowsum(dY ⊙ Y) per (b, h, t), in the lse's order.
template <typename T>
__device__ void amp_attn_delta(u64 n, u64 tokens, u64 heads, u64 hd, const T *y, const T *dy,
                               float *delta) {
    FOR_EACH(e, n) {
        const u64 i = e % tokens, bh = e / tokens, h = bh % heads, b = bh / heads;
        const u64 at = (b * tokens + i) * heads * hd + h * hd;
        float acc = 0.0f;
        for (u64 c = 0; c < hd; ++c) acc = fmaf(load(y, at + c), load(dy, at + c), acc);
        delta[e] = acc;
    }
}

// The keys' and values' gradients: a block per 64 keys (× 64 columns × head × sequence).
template <typename T>
__device__ void amp_attn_dkv(u64 batch, u64 tokens, u64 heads, u64 hd, u32 causal,
                             u32 accumulate, float scale, const T *qkv, const T *dy,
                             const float *lse, const float *delta, T *dqkv) {
    __shared__ __align__(16) float ks[AT_KC][AT_LD];    // K chunk, transposed: [column][key]
    __shared__ __align__(16) float vs[AT_KC][AT_LD];    // V chunk, transposed
    __shared__ __align__(16) float qs[AT_KC][AT_LDS];   // Q chunk, transposed: [column][query]
    __shared__ __align__(16) float ys[AT_KC][AT_LDS];   // dY chunk, transposed
    __shared__ __align__(16) float ps[AT_S][AT_LD];     // P: [query][key]
    __shared__ __align__(16) float dss[AT_S][AT_LD];    // dS: [query][key]
    __shared__ __align__(16) float qc[AT_S][AT_LD];     // Q: [query][output column]
    __shared__ __align__(16) float yc[AT_S][AT_LD];     // dY: [query][output column]

    const u64 width = heads * hd, row3 = 3 * width;
    const u64 chunks = (hd + AT_DC - 1) / AT_DC;
    AtBlock blk = at_block(blockIdx.x, batch, heads, chunks);
    // Causal: the first key tiles are seen by the most queries: they go first.
    const u64 j0 = blk.tile * AT_T, c0 = blk.chunk * AT_DC;
    const u64 base = blk.b * tokens, lrow = (blk.b * heads + blk.h) * tokens;
    const T *q = qkv + blk.h * hd, *k = q + width, *v = q + 2 * width;
    const T *dyh = dy + blk.h * hd;
    const u32 tid = threadIdx.x, g = tid >> 4, l = tid & 15;
    // This thread: keys j0 + g·4 + a (a < 4); queries i0 + l·2 + x (x < 2) of the scores;
    // output columns c0 + l·4 + c (c < 4) of the gradients.

    float dk[4][4], dv[4][4];
    #pragma unroll
    for (int a = 0; a < 4; ++a)
        #pragma unroll
        for (int c = 0; c < 4; ++c) dk[a][c] = dv[a][c] = 0.0f;
    // Causal: queries before j0 see none of these keys.
    for (u64 i0 = causal ? j0 : 0; i0 < tokens; i0 += AT_S) {
        float s[4][2], dp[4][2];
        #pragma unroll
        for (int a = 0; a < 4; ++a)
            #pragma unroll
            for (int x = 0; x < 2; ++x) s[a][x] = dp[a][x] = 0.0f;
        for (u64 d0 = 0; d0 < hd; d0 += AT_KC) {
            __syncthreads();
            for (u32 e = tid; e < AT_T * AT_KC; e += BLOCK) {
                u32 r = e / AT_KC, c = e % AT_KC;
                u64 col = d0 + c, kj = j0 + r;
                bool ok = kj < tokens && col < hd;
                ks[c][r] = ok ? load(k, (base + kj) * row3 + col) : 0.0f;
                vs[c][r] = ok ? load(v, (base + kj) * row3 + col) : 0.0f;
            }
            for (u32 e = tid; e < AT_S * AT_KC; e += BLOCK) {
                u32 r = e / AT_KC, c = e % AT_KC;
                u64 col = d0 + c, qi = i0 + r;
                bool ok = qi < tokens && col < hd;
                qs[c][r] = ok ? load(q, (base + qi) * row3 + col) : 0.0f;
                ys[c][r] = ok ? load(dyh, (base + qi) * width + col) : 0.0f;
            }
            __syncthreads();
            #pragma unroll
            for (int c = 0; c < AT_KC; ++c) {
                float kk[4], vv[4];
                at_unpack4(*(const float4 *)&ks[c][g * 4], kk);
                at_unpack4(*(const float4 *)&vs[c][g * 4], vv);
                const float2 qq = *(const float2 *)&qs[c][l * 2];
                const float2 yy = *(const float2 *)&ys[c][l * 2];
                #pragma unroll
                for (int a = 0; a < 4; ++a) {
                    s[a][0] = fmaf(qq.x, kk[a], s[a][0]);
                    s[a][1] = fmaf(qq.y, kk[a], s[a][1]);
                    dp[a][0] = fmaf(yy.x, vv[a], dp[a][0]);
                    dp[a][1] = fmaf(yy.y, vv[a], dp[a][1]);
                }
            }
        }
        // P from the forward's log-sum-exp, and dS. Padding (past the sequence) is exactly 0;
        // masked pairs inside the tiles have P = 0 and dS = 0·(dP − D), as on the CPU.
        #pragma unroll
        for (int x = 0; x < 2; ++x) {
            const u64 i = i0 + l * 2 + x;
            const bool qin = i < tokens;
            const float li = qin ? lse[lrow + i] : 0.0f, di = qin ? delta[lrow + i] : 0.0f;
            #pragma unroll
            for (int a = 0; a < 4; ++a) {
                const u64 j = j0 + g * 4 + a;
                const bool kin = j < tokens, vis = qin && kin && (!causal || j <= i);
                const float p = vis ? expf(__fmul_rn(s[a][x], scale) - li) : 0.0f;
                ps[l * 2 + x][g * 4 + a] = p;
                dss[l * 2 + x][g * 4 + a] = (qin && kin) ? p * (dp[a][x] - di) : 0.0f;
            }
        }
        for (u32 e = tid; e < AT_S * AT_DC; e += BLOCK) {
            u32 r = e / AT_DC, c = e % AT_DC;
            u64 qi = i0 + r, col = c0 + c;
            bool ok = qi < tokens && col < hd;
            qc[r][c] = ok ? load(q, (base + qi) * row3 + col) : 0.0f;
            yc[r][c] = ok ? load(dyh, (base + qi) * width + col) : 0.0f;
        }
        __syncthreads();
        // dV += Pᵀ·dY and dK += dSᵀ·Q over the tile's 32 queries, in query order.
        #pragma unroll 8
        for (int x = 0; x < AT_S; ++x) {
            float pp[4], dd[4], yy[4], qq[4];
            at_unpack4(*(const float4 *)&ps[x][g * 4], pp);
            at_unpack4(*(const float4 *)&dss[x][g * 4], dd);
            at_unpack4(*(const float4 *)&yc[x][l * 4], yy);
            at_unpack4(*(const float4 *)&qc[x][l * 4], qq);
            #pragma unroll
            for (int a = 0; a < 4; ++a)
                #pragma unroll
                for (int c = 0; c < 4; ++c) {
                    dv[a][c] = fmaf(pp[a], yy[c], dv[a][c]);
                    dk[a][c] = fmaf(dd[a], qq[c], dk[a][c]);
                }
        }
    }
    #pragma unroll
    for (int a = 0; a < 4; ++a) {
        const u64 j = j0 + g * 4 + a;
        if (j >= tokens) continue;
        #pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u64 col = c0 + l * 4 + c;
            if (col >= hd) continue;
            const u64 at = (base + j) * row3 + blk.h * hd + col;
            at_put(dqkv, at + width, dk[a][c] * scale, accumulate);
            at_put(dqkv, at + 2 * width, dv[a][c], accumulate);
        }
    }
}

// The queries' gradient: a block per 64 query rows (× 64 columns × head × sequence).
template <typename T>
__device__ void amp_attn_dq(u64 batch, u64 tokens, u64 heads, u64 hd, u32 causal,
                            u32 accumulate, float scale, const T *qkv, const T *dy,
                            const float *lse, const float *delta, T *dqkv) {
    __shared__ __align__(16) float qs[AT_KC][AT_LD];    // Q chunk, transposed: [column][query]
    __shared__ __align__(16) float ys[AT_KC][AT_LD];    // dY chunk, transposed
    __shared__ __align__(16) float ks[AT_KC][AT_LDS];   // K chunk, transposed: [column][key]
    __shared__ __align__(16) float vs[AT_KC][AT_LDS];   // V chunk, transposed
    __shared__ __align__(16) float dst[AT_S][AT_LD];    // dS: [key][query]
    __shared__ __align__(16) float kc[AT_S][AT_LD];     // K: [key][output column]

    const u64 width = heads * hd, row3 = 3 * width;
    const u64 qtiles = (tokens + AT_T - 1) / AT_T, chunks = (hd + AT_DC - 1) / AT_DC;
    AtBlock blk = at_block(blockIdx.x, batch, heads, chunks);
    const u64 i0 = (qtiles - 1 - blk.tile) * AT_T, c0 = blk.chunk * AT_DC;
    const u64 base = blk.b * tokens, lrow = (blk.b * heads + blk.h) * tokens;
    const T *q = qkv + blk.h * hd, *k = q + width, *v = q + 2 * width;
    const T *dyh = dy + blk.h * hd;
    const u32 tid = threadIdx.x, g = tid >> 4, l = tid & 15;
    // This thread: query rows i0 + g·4 + a (a < 4); keys j0 + l·2 + x (x < 2) of the scores;
    // output columns c0 + l·4 + c (c < 4) of the gradient.

    float li[4], di[4], dq[4][4];
    #pragma unroll
    for (int a = 0; a < 4; ++a) {
        const u64 i = i0 + g * 4 + a;
        li[a] = i < tokens ? lse[lrow + i] : 0.0f;
        di[a] = i < tokens ? delta[lrow + i] : 0.0f;
        #pragma unroll
        for (int c = 0; c < 4; ++c) dq[a][c] = 0.0f;
    }
    const u64 kend = (causal && i0 + AT_T < tokens) ? i0 + AT_T : tokens;
    for (u64 j0 = 0; j0 < kend; j0 += AT_S) {
        float s[4][2], dp[4][2];
        #pragma unroll
        for (int a = 0; a < 4; ++a)
            #pragma unroll
            for (int x = 0; x < 2; ++x) s[a][x] = dp[a][x] = 0.0f;
        for (u64 d0 = 0; d0 < hd; d0 += AT_KC) {
            __syncthreads();
            for (u32 e = tid; e < AT_T * AT_KC; e += BLOCK) {
                u32 r = e / AT_KC, c = e % AT_KC;
                u64 col = d0 + c, qi = i0 + r;
                bool ok = qi < tokens && col < hd;
                qs[c][r] = ok ? load(q, (base + qi) * row3 + col) : 0.0f;
                ys[c][r] = ok ? load(dyh, (base + qi) * width + col) : 0.0f;
            }
            for (u32 e = tid; e < AT_S * AT_KC; e += BLOCK) {
                u32 r = e / AT_KC, c = e % AT_KC;
                u64 col = d0 + c, kj = j0 + r;
                bool ok = kj < tokens && col < hd;
                ks[c][r] = ok ? load(k, (base + kj) * row3 + col) : 0.0f;
                vs[c][r] = ok ? load(v, (base + kj) * row3 + col) : 0.0f;
            }
            __syncthreads();
            #pragma unroll
            for (int c = 0; c < AT_KC; ++c) {
                float qq[4], yy[4];
                at_unpack4(*(const float4 *)&qs[c][g * 4], qq);
                at_unpack4(*(const float4 *)&ys[c][g * 4], yy);
                const float2 kk = *(const float2 *)&ks[c][l * 2];
                const float2 vv = *(const float2 *)&vs[c][l * 2];
                #pragma unroll
                for (int a = 0; a < 4; ++a) {
                    s[a][0] = fmaf(qq[a], kk.x, s[a][0]);
                    s[a][1] = fmaf(qq[a], kk.y, s[a][1]);
                    dp[a][0] = fmaf(yy[a], vv.x, dp[a][0]);
                    dp[a][1] = fmaf(yy[a], vv.y, dp[a][1]);
                }
            }
        }
        #pragma unroll
        for (int a = 0; a < 4; ++a) {
            const u64 i = i0 + g * 4 + a;
            const bool qin = i < tokens;
            #pragma unroll
            for (int x = 0; x < 2; ++x) {
                const u64 j = j0 + l * 2 + x;
                const bool kin = j < tokens, vis = qin && kin && (!causal || j <= i);
                const float p = vis ? expf(__fmul_rn(s[a][x], scale) - li[a]) : 0.0f;
                dst[l * 2 + x][g * 4 + a] = (qin && kin) ? p * (dp[a][x] - di[a]) : 0.0f;
            }
        }
        for (u32 e = tid; e < AT_S * AT_DC; e += BLOCK) {
            u32 r = e / AT_DC, c = e % AT_DC;
            u64 kj = j0 + r, col = c0 + c;
            kc[r][c] = (kj < tokens && col < hd) ? load(k, (base + kj) * row3 + col) : 0.0f;
        }
        __syncthreads();
        // dQ += dS·K over the tile's 32 keys, in key order.
        #pragma unroll 8
        for (int x = 0; x < AT_S; ++x) {
            float dd[4], kk[4];
            at_unpack4(*(const float4 *)&dst[x][g * 4], dd);
            at_unpack4(*(const float4 *)&kc[x][l * 4], kk);
            #pragma unroll
            for (int a = 0; a < 4; ++a)
                #pragma unroll
                for (int c = 0; c < 4; ++c) dq[a][c] = fmaf(dd[a], kk[c], dq[a][c]);
        }
    }
    #pragma unroll
    for (int a = 0; a < 4; ++a) {
        const u64 i = i0 + g * 4 + a;
        if (i >= tokens) continue;
        #pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u64 col = c0 + l * 4 + c;
            if (col < hd) at_put(dqkv, (base + i) * row3 + blk.h * hd + col, dq[a][c] * scale, accumulate);
        }
    }
}
