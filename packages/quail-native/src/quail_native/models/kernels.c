/* Quail's fused CPU kernels (elementwise work, and attention in fp32 and in bf16), built once per machine by
 * quail_native.models.kernels.
 *
 * One pass over memory where torch's eager ops make several: GELU-tanh(gate) · up reads gate and up
 * once and writes the product once. Loops are written so the compiler vectorises them (-O3 -march=native),
 * with an exp of our own: -ffast-math would vectorise libm's, but a library built with it switches the
 * whole process's denormals to zero when it loads. Threads come from OpenMP, the runtime torch uses.
 * bf16 values are the upper 16 bits of an fp32; results round to nearest even, as torch rounds.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float widen(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float wide;
    memcpy(&wide, &bits, sizeof wide);
    return wide;
}

static inline uint16_t narrow(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* e^x for |x| <= 87: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n ln2 is exact), e^r by its Taylor
 * series to r^degree (a constant once inlined), 2^n put into the exponent bits. To r^7 the remainder is < 2e-8
 * relative (about an ulp); to r^5 < 3e-6. Written without calls so that it vectorises. */
#define EXP_ROUND_SHIFT 12582912.0f /* 1.5 · 2^23: adding and subtracting it rounds to an integer */
#define EXP_LOG2_E 1.4426950408889634f
#define EXP_LN2_HIGH 0.693145751953125f
#define EXP_LN2_LOW 1.4286068203094173e-06f
static const float INVERSE_FACTORIALS[8] = {1.0f, 1.0f, 0.5f, 1.0f / 6.0f, 1.0f / 24.0f, 1.0f / 120.0f,
                                            1.0f / 720.0f, 1.0f / 5040.0f};
static inline __attribute__((always_inline)) float exp_within_87_to(float x, int degree) {
    float n = (x * EXP_LOG2_E + EXP_ROUND_SHIFT) - EXP_ROUND_SHIFT;
    float r = x - n * EXP_LN2_HIGH;
    r = r - n * EXP_LN2_LOW;
    float p = INVERSE_FACTORIALS[degree];
    for (int k = degree - 1; k >= 0; k--) p = p * r + INVERSE_FACTORIALS[k];
    int32_t exponent = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &exponent, sizeof scale);
    return p * scale;
}

static inline float exp_within_87(float x) { return exp_within_87_to(x, 7); }

/* v with its magnitude at most 87, in integer operations on its bits (a non-negative float orders as its
 * bits do): a float clamp, if-converted by the compiler, made it compute the division after it once per
 * case (three divisions a vector instead of one). */
static inline float within_87(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint32_t magnitude = bits & 0x7fffffffu, limit = 0x42ae0000u; /* 87.0f */
    bits = (magnitude < limit ? magnitude : limit) | (bits & 0x80000000u);
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* σ(2u) · x with u = √(2/π)(x + 0.044715 x³), i.e. 0.5 (1 + tanh u) · x; past ±87 σ is 0 or 1 to fp32
 * precision already. */
static inline float gelu_tanh(float x) {
    const float linear = 1.5957691216057308f; /* 2 √(2/π) */
    const float cubic = 1.5957691216057308f * 0.044715f;
    float z = x * (linear + cubic * x * x);
    float clamped = within_87(z);
    float gelu = x / (1.0f + exp_within_87(-clamped));
    return z < -87.0f ? x * 0.0f : gelu; /* σ is under fp32's normal range there: 0 (torch keeps a denormal) */
}

/* The same for a GELU rounded to bf16 next: e^r only to r^5 (remainder < 3e-6 relative, a thousandth of
 * bf16's rounding step; 5 % faster). The loop is bound by its instructions even in L1 (~1.5 cycles an
 * element on a Zen 4 core, which splits 512-bit operations in two); one division a vector stays: a
 * hand-written AVX-512 version with vrcp14ps measured 12 % slower than this one vectorised by the compiler. */
static inline float gelu_tanh_bf16(float x) {
    const float linear = 1.5957691216057308f; /* 2 √(2/π) */
    const float cubic = 1.5957691216057308f * 0.044715f;
    float z = x * (linear + cubic * x * x);
    float gelu = x / (1.0f + exp_within_87_to(-within_87(z), 5));
    return z < -87.0f ? x * 0.0f : gelu;
}

#define CHUNK 256

/* out[r, :] = GELU-tanh(gate[r, :]) · up[r, :] for `rows` rows of `width`; gate and up rows are `stride`
 * elements apart (both halves of one [rows, 2 width] projection), out is contiguous. As in torch, the
 * bf16 GELU is rounded to bf16 before the product, which is rounded again. */
void quail_gelu_tanh_times_bf16(const uint16_t *gate, const uint16_t *up, uint16_t *out, int64_t rows,
                                int64_t width, int64_t stride) {
    #pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        const uint16_t *g = gate + row * stride, *u = up + row * stride;
        uint16_t *o = out + row * width;
        float product[CHUNK];
        for (int64_t start = 0; start < width; start += CHUNK) {
            int64_t count = width - start < CHUNK ? width - start : CHUNK;
            #pragma omp simd
            for (int64_t j = 0; j < count; j++)
                product[j] = widen(narrow(gelu_tanh_bf16(widen(g[start + j])))) * widen(u[start + j]);
            for (int64_t j = 0; j < count; j++)
                o[start + j] = narrow(product[j]);
        }
    }
}

void quail_gelu_tanh_times_f32(const float *gate, const float *up, float *out, int64_t rows, int64_t width,
                               int64_t stride) {
    #pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        const float *g = gate + row * stride, *u = up + row * stride;
        float *o = out + row * width;
        #pragma omp simd
        for (int64_t j = 0; j < width; j++)
            o[j] = gelu_tanh(g[j]) * u[j];
    }
}

/* e^-g over fp32's whole range, as SiLU needs it: beyond 87 as the square of e^(-g/2) (torch's SiLU is still a
 * normal number down to g = -88.5), infinite past fp32's largest (where torch's SiLU is -0). */
static inline float exp_of_negated(float g) {
    if (-g <= 87.0f) return exp_within_87(within_87(-g));
    if (-g < 88.72f) {
        float half = exp_within_87(-0.5f * g);
        return half * half;
    }
    return INFINITY;
}

/* out[r, :] = SiLU(gate[r, :]) · up[r, :] in bf16, laid out as the GELU kernel's: SiLU in fp32 rounded to bf16, then
 * the product rounded — F.silu(gate).mul_(up) in one pass, the same bits for every bf16 input (tested over all of
 * them). */
void quail_silu_times_bf16(const uint16_t *gate, const uint16_t *up, uint16_t *out, int64_t rows, int64_t width,
                           int64_t stride) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t row = 0; row < rows; row++) {
        const uint16_t *g = gate + row * stride, *u = up + row * stride;
        uint16_t *o = out + row * width;
        for (int64_t j = 0; j < width; j++) {
            float x = widen(g[j]);
            o[j] = narrow(widen(narrow(x / (1.0f + exp_of_negated(x)))) * widen(u[j]));
        }
    }
}

/* One RMSNorm row into `o`: Gemma scales by `weight` = 1 + w in fp32 and rounds once; Qwen (`gemma` 0)
 * rounds the normalised row first, then multiplies by its weight w and rounds again, as torch does. */
#define NORMALIZE_ROW(NAME, T, LOAD, STORE)                                                               \
static inline void NAME(const T *row, int64_t width, const float *weight, float eps, int gemma, T *o) {  \
    float squares = 0.0f;                                                                                 \
    _Pragma("omp simd reduction(+:squares)")                                                              \
    for (int64_t j = 0; j < width; j++) { float v = LOAD(row[j]); squares += v * v; }                     \
    float scale = 1.0f / sqrtf(squares / (float)width + eps);                                             \
    if (gemma) {                                                                                          \
        _Pragma("omp simd")                                                                               \
        for (int64_t j = 0; j < width; j++) o[j] = STORE(LOAD(row[j]) * scale * weight[j]);               \
    } else {                                                                                              \
        _Pragma("omp simd")                                                                               \
        for (int64_t j = 0; j < width; j++) o[j] = STORE(LOAD(STORE(LOAD(row[j]) * scale)) * weight[j]);  \
    }                                                                                                     \
}

/* RMSNorm of rows of `width`: row (o, g) starts at x + o · outer_stride + g · width; out is contiguous
 * [outer, groups, width]. With `residual` (contiguous like out) the result is residual + norm, rounded
 * once more. */
#define RMS_NORM(NAME, NORMALIZE, T, LOAD, STORE)                                                         \
void NAME(const T *x, int64_t outer, int64_t outer_stride, int64_t groups, int64_t width,                \
          const float *weight, float eps, int gemma, const T *residual, T *out) {                         \
    _Pragma("omp parallel for schedule(static)")                                                          \
    for (int64_t index = 0; index < outer * groups; index++) {                                            \
        T *o = out + index * width;                                                                       \
        NORMALIZE(x + (index / groups) * outer_stride + (index % groups) * width, width, weight, eps, gemma, o); \
        if (residual) {                                                                                   \
            const T *r = residual + index * width;                                                        \
            _Pragma("omp simd")                                                                           \
            for (int64_t j = 0; j < width; j++) o[j] = STORE(LOAD(r[j]) + LOAD(o[j]));                    \
        }                                                                                                 \
    }                                                                                                     \
}

/* RMSNorm then RoPE of q or k heads: rows as above, row (o, g) at position o takes the tables' row o
 * (cos, and sin with the rotation's sign on its first half). As torch computes it: the normalised head
 * is rounded, then n · cos rounded, then + swap(n) · sin rounded; the halves rotate in place, in pairs. */
#define RMS_NORM_ROPE(NAME, NORMALIZE, T, LOAD, STORE)                                                    \
void NAME(const T *x, int64_t outer, int64_t outer_stride, int64_t groups, int64_t width,                \
          const float *weight, float eps, int gemma, const T *cos, const T *sin, T *out) {                \
    int64_t half = width / 2;                                                                             \
    _Pragma("omp parallel for schedule(static)")                                                          \
    for (int64_t index = 0; index < outer * groups; index++) {                                            \
        int64_t position = index / groups;                                                                \
        const T *c = cos + position * width, *s = sin + position * width;                                 \
        T *o = out + index * width;                                                                       \
        NORMALIZE(x + position * outer_stride + (index % groups) * width, width, weight, eps, gemma, o);  \
        _Pragma("omp simd")                                                                               \
        for (int64_t j = 0; j < half; j++) {                                                              \
            float first = LOAD(o[j]), second = LOAD(o[j + half]);                                         \
            o[j] = STORE(LOAD(STORE(first * LOAD(c[j]))) + second * LOAD(s[j]));                          \
            o[j + half] = STORE(LOAD(STORE(second * LOAD(c[j + half]))) + first * LOAD(s[j + half]));     \
        }                                                                                                 \
    }                                                                                                     \
}

static inline float same(float value) { return value; }
NORMALIZE_ROW(normalize_bf16, uint16_t, widen, narrow)
NORMALIZE_ROW(normalize_f32, float, same, same)
RMS_NORM(quail_rms_norm_bf16, normalize_bf16, uint16_t, widen, narrow)
RMS_NORM(quail_rms_norm_f32, normalize_f32, float, same, same)
RMS_NORM_ROPE(quail_rms_norm_rope_bf16, normalize_bf16, uint16_t, widen, narrow)
RMS_NORM_ROPE(quail_rms_norm_rope_f32, normalize_f32, float, same, same)

/* Attention of one segment in fp32, on any CPU: the bf16 kernel's plan (below) in plain loops the compiler
 * vectorises for the CPU it builds on (AVX2 or AVX-512): keys packed in blocks of F32_BLOCK columns, four
 * query heads against each loaded key vector, each row only over the runs of blocks it sees, the softmax
 * in place. torch's fp32 GEMMs around a softmax compute every masked score and take three more passes
 * (whole fp32 queries 5–10 % faster with this kernel on a 2-core EPYC; a 663-row segment 186 GFLOP/s of
 * visible scores and sums with AVX-512, 158 as an AVX2 build). */
#include <omp.h>
#include <stdlib.h>

#define F32_HEADS 4 /* query heads computed together */
/* Key columns side by side in the packed layout (and dimensions a step in the weighted sum): two vectors
 * per head, so the four heads keep eight independent sums in flight (one vector each left FMA latency-bound
 * at half the rate on AVX-512). */
#if defined(__AVX512F__)
#define F32_LANES 16
#else
#define F32_LANES 8
#endif
#define F32_BLOCK (2 * F32_LANES)
/* One vector register of fp32 lanes, in GCC's portable vector extension: the sums below live in registers
 * (written as arrays the compiler vectorised, they went through the stack on every step: the kernel ran at
 * about half the rate). */
typedef float Lanes __attribute__((vector_size(F32_LANES * sizeof(float))));

static inline Lanes load_lanes(const float *from) {
    Lanes value;
    memcpy(&value, from, sizeof value);
    return value;
}

static inline void store_lanes(float *to, Lanes value) { memcpy(to, &value, sizeof value); }

/* Runs of column blocks: [first, last) blocks of `width` columns, each holding a column the row may see. */
typedef struct {
    int64_t first, last;
} BlockRun;

/* The runs of blocks of `width` columns of a mask row's `columns` that hold a visible column, in order; how
 * many. A row that continues a sibling of its pass sees the sibling's first rows, then a gap, then its own
 * rows: the gap's blocks are never computed (nor a sliding window's blocks before it). */
static int64_t visible_runs(const uint8_t *mask, int64_t columns, int64_t width, BlockRun *runs) {
    int64_t count = 0;
    for (int64_t b = 0; b * width < columns; b++) {
        int64_t left = columns - b * width, stop = left < width ? left : width;
        uint8_t any = 0;
        for (int64_t c = 0; c < stop; c++) any |= mask[b * width + c];
        if (!any) continue;
        if (count > 0 && runs[count - 1].last == b)
            runs[count - 1].last = b + 1;
        else
            runs[count++] = (BlockRun){b, b + 1};
    }
    return count;
}

/* Column c (of `padded`) of one kv head: keys into [blocks][dim][F32_BLOCK], values into [dim / F32_BLOCK][padded]
 * [F32_BLOCK] (a step of the weighted sum reads one contiguous run); zero past the last. Both packed: read in
 * place, values of scattered arena slots measured 10–40 % slower than packing them. */
static void pack_column_f32(int64_t c, const float *context_keys, const float *context_values, const int64_t *slots,
                            int64_t context, const float *keys, int64_t key_stride, const float *values,
                            int64_t value_stride, int64_t columns, int64_t padded, int64_t dim, float *packed_keys,
                            float *packed_values) {
    const float *k = NULL, *v = NULL;
    if (c < context) {
        k = context_keys + slots[c] * dim;
        v = context_values + slots[c] * dim;
    } else if (c < columns) {
        k = keys + (c - context) * key_stride;
        v = values + (c - context) * value_stride;
    }
    float *key_column = packed_keys + (c / F32_BLOCK) * dim * F32_BLOCK + c % F32_BLOCK;
    for (int64_t d = 0; d < dim; d++) key_column[d * F32_BLOCK] = k ? k[d] : 0.0f;
    for (int64_t d = 0; d < dim; d++)
        packed_values[(d / F32_BLOCK) * padded * F32_BLOCK + c * F32_BLOCK + d % F32_BLOCK] = v ? v[d] : 0.0f;
}

/* scores[h][c] = q_h · key c for four heads over the blocks of the runs: two vectors of columns per head, eight
 * sums in flight. */
static void scores4_f32(const float *const q[F32_HEADS], const float *packed_keys, const BlockRun *runs,
                        int64_t count, int64_t dim, float *scores, int64_t width) {
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    for (int64_t r = 0; r < count; r++)
        for (int64_t b = runs[r].first; b < runs[r].last; b++) {
            Lanes a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
            const float *block = packed_keys + b * dim * F32_BLOCK;
            for (int64_t p = 0; p < dim; p++) {
                Lanes low = load_lanes(block + p * F32_BLOCK), high = load_lanes(block + p * F32_BLOCK + F32_LANES);
                a0 += q0[p] * low, b0 += q0[p] * high;
                a1 += q1[p] * low, b1 += q1[p] * high;
                a2 += q2[p] * low, b2 += q2[p] * high;
                a3 += q3[p] * low, b3 += q3[p] * high;
            }
            float *s = scores + b * F32_BLOCK;
            store_lanes(s, a0), store_lanes(s + F32_LANES, b0);
            store_lanes(s + width, a1), store_lanes(s + width + F32_LANES, b1);
            store_lanes(s + 2 * width, a2), store_lanes(s + 2 * width + F32_LANES, b2);
            store_lanes(s + 3 * width, a3), store_lanes(s + 3 * width + F32_LANES, b3);
        }
}

/* The softmax of one head's scores over the visible columns of the runs, in place (0 where hidden). */
static void softmax_in_place(float *scores, const uint8_t *mask, int64_t columns, const BlockRun *runs,
                            int64_t count) {
    float top = -INFINITY, total = 0.0f;
    for (int64_t r = 0; r < count; r++) {
        int64_t first = runs[r].first * F32_BLOCK, last = runs[r].last * F32_BLOCK;
        last = last < columns ? last : columns;
        #pragma omp simd reduction(max:top) /* a select, not a branch: it vectorises */
        for (int64_t c = first; c < last; c++) {
            float seen = mask[c] ? scores[c] : -INFINITY;
            top = seen > top ? seen : top;
        }
    }
    for (int64_t r = 0; r < count; r++) {
        int64_t first = runs[r].first * F32_BLOCK, last = runs[r].last * F32_BLOCK;
        last = last < columns ? last : columns;
        #pragma omp simd reduction(+:total)
        for (int64_t c = first; c < last; c++) {
            float shifted = scores[c] - top;
            float e = exp_within_87(shifted < -87.0f ? -87.0f : shifted);
            e = mask[c] ? e : 0.0f;
            scores[c] = e;
            total += e;
        }
    }
    float inverse = 1.0f / total;
    for (int64_t r = 0; r < count; r++) {
        int64_t first = runs[r].first * F32_BLOCK, last = runs[r].last * F32_BLOCK;
        last = last < columns ? last : columns;
        #pragma omp simd
        for (int64_t c = first; c < last; c++) scores[c] *= inverse;
    }
}

/* out_h = Σ_c weights_h[c] · value c over the columns of the runs below `stop`, F32_BLOCK dimensions a step (eight
 * sums in flight); only the first `heads` outputs are written. */
static void weighted_values4_f32(const float *const weights[F32_HEADS], const float *packed_values,
                                 const BlockRun *runs, int64_t count, int64_t stop, int64_t padded, int64_t dim,
                                 int64_t heads, float *const out[F32_HEADS]) {
    const float *w0 = weights[0], *w1 = weights[1], *w2 = weights[2], *w3 = weights[3];
    for (int64_t d0 = 0; d0 < dim; d0 += F32_BLOCK) {
        Lanes a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        for (int64_t r = 0; r < count; r++) {
            int64_t last = runs[r].last * F32_BLOCK < stop ? runs[r].last * F32_BLOCK : stop;
            for (int64_t c = runs[r].first * F32_BLOCK; c < last; c++) {
                const float *v = packed_values + d0 * padded + c * F32_BLOCK;
                Lanes low = load_lanes(v), high = load_lanes(v + F32_LANES);
                a0 += w0[c] * low, b0 += w0[c] * high;
                a1 += w1[c] * low, b1 += w1[c] * high;
                a2 += w2[c] * low, b2 += w2[c] * high;
                a3 += w3[c] * low, b3 += w3[c] * high;
            }
        }
        Lanes sums[F32_HEADS][2] = {{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}};
        for (int64_t h = 0; h < heads; h++)
            store_lanes(out[h] + d0, sums[h][0]), store_lanes(out[h] + d0 + F32_LANES, sums[h][1]);
    }
}

/* One query row, all heads, four at a time (a group of fewer repeats its first head, never written). */
static void attend_row_f32(const float *q, const uint8_t *visible, int64_t columns, const float *packed_keys,
                           const float *packed_values, int64_t padded, float *out, int64_t heads,
                           int64_t kv_heads, int64_t dim, char *scratch, BlockRun *runs) {
    float *scores = (float *)scratch; /* F32_HEADS rows of `padded`: the scores, then the weights in place */
    int64_t width = padded, stop = columns, group = heads / kv_heads;
    int64_t count = visible_runs(visible, columns, F32_BLOCK, runs);
    while (stop > 0 && !visible[stop - 1]) stop--;
    for (int64_t g = 0; g < kv_heads; g++) {
        const float *packed_k = packed_keys + g * padded * dim, *packed_v = packed_values + g * padded * dim;
        for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += F32_HEADS) {
            int64_t heads_here = (g + 1) * group - h0 < F32_HEADS ? (g + 1) * group - h0 : F32_HEADS;
            const float *query[F32_HEADS], *weight_rows[F32_HEADS];
            float *target[F32_HEADS];
            for (int64_t h = 0; h < F32_HEADS; h++) {
                int64_t head = h < heads_here ? h : 0;
                query[h] = q + (h0 + head) * dim;
                target[h] = out + (h0 + head) * dim;
                weight_rows[h] = scores + head * width;
            }
            scores4_f32(query, packed_k, runs, count, dim, scores, width);
            for (int64_t h = 0; h < heads_here; h++)
                softmax_in_place(scores + h * width, visible, columns, runs, count);
            weighted_values4_f32(weight_rows, packed_v, runs, count, stop, padded, dim, heads_here, target);
        }
    }
}

/* Where each segment of a pass lives in the operands and in the kernel's scratch. */
typedef struct {
    int64_t first_row, rows, columns, first_slot, mask_offset, padded, packed_offset;
} SegmentPlan;

/* Plans `count` segments given as (own rows, context columns) pairs, in pass order, with packed columns
 * padded to whole blocks of `block` plus `extra` blocks; the widest padding. */
static int64_t plan_segments(const int64_t *shapes, int64_t count, int64_t block, int64_t extra, int64_t kv_heads,
                             int64_t dim, SegmentPlan *plan) {
    int64_t row = 0, slot = 0, mask = 0, packed = 0, widest = 0;
    for (int64_t s = 0; s < count; s++) {
        int64_t rows = shapes[2 * s], context = shapes[2 * s + 1], columns = context + rows;
        int64_t padded = ((columns + block - 1) / block + extra) * block;
        plan[s] = (SegmentPlan){row, rows, columns, slot, mask, padded, packed};
        row += rows;
        slot += context;
        mask += rows * columns;
        packed += kv_heads * padded * dim;
        widest = padded > widest ? padded : widest;
    }
    return widest;
}

/* The segment holding pass row `row` (segments cover the pass's rows in order). */
static int64_t segment_of(const SegmentPlan *plan, int64_t count, int64_t row) {
    int64_t low = 0, high = count - 1;
    while (low < high) {
        int64_t middle = (low + high + 1) / 2;
        if (plan[middle].first_row <= row) low = middle; else high = middle - 1;
    }
    return low;
}

/* Query rows handed out together: `count` consecutive queries from `first`, consecutive rows of one segment. */
typedef struct {
    int64_t first, count, segment;
} RowBlock;

/* Cuts the queries into blocks of at most `most` rows (a block never spans two segments or a gap between query
 * rows); how many. */
static int64_t plan_row_blocks(const SegmentPlan *plan, int64_t segments, int64_t queries, const int64_t *query_rows,
                               int64_t most, RowBlock *blocks) {
    int64_t count = 0, previous = -2;
    for (int64_t i = 0; i < queries; i++) {
        int64_t row = query_rows ? query_rows[i] : i, segment = segment_of(plan, segments, row);
        RowBlock *last = count > 0 ? &blocks[count - 1] : NULL;
        if (last && last->segment == segment && last->count < most && row == previous + 1)
            last->count++;
        else
            blocks[count++] = (RowBlock){i, 1, segment};
        previous = row;
    }
    return count;
}

/* Masked attention of a whole pass, every segment in one call (one thread team, blocks of rows of all segments
 * shared out dynamically: a pass of many small segments pays one call, not one per segment).
 *
 * The pass's rows form `count` segments, in order, each given by its (own rows, context columns) in `shapes`:
 * segment s reads its context from arena slots (the next `context` entries of `slots`), then its own rows of
 * the pass's keys and values ([pass rows][kv_heads][dim], rows key_stride and value_stride apart), under its
 * mask (the next rows × (context + rows) bytes of `masks`, true = may attend). The arena holds
 * [kv_heads][slots][dim] (kv heads arena_head_stride apart). `queries` rows of q ([queries][heads][dim], already
 * scaled, q_stride apart) ask: query i is pass row query_rows[i] (NULL: pass row i), and its output goes to
 * out's row i ([queries][heads][dim], out_stride apart). Query head h reads kv head h / (heads / kv_heads); dim
 * is a multiple of 32. A row that may attend to nothing gets zeros. Returns 0, or -1 with nothing written when
 * the scratch cannot be allocated.
 *
 * Each segment's keys and values are packed per kv head (PACK, UNIT columns at a time) into blocks of BLOCK
 * columns, padded by EXTRA blocks; ATTEND_ROWS computes a block of at most ROWS query rows (consecutive rows
 * of one segment), all heads, with SCRATCH(widest padded columns, heads, dim) bytes of scratch and room for
 * the block runs of 16 columns of the widest segment. */
#define ATTENTION(NAME, T, BLOCK, EXTRA, ROWS, SCRATCH, UNIT, PACK, ATTEND_ROWS)                               \
int NAME(const T *q, int64_t q_stride, T *out, int64_t out_stride, int64_t queries, const int64_t *query_rows,   \
         const T *context_keys, const T *context_values, int64_t arena_head_stride, const int64_t *slots,        \
         const T *keys, int64_t key_stride, const T *values, int64_t value_stride, const int64_t *shapes,        \
         int64_t count, const uint8_t *masks, int64_t heads, int64_t kv_heads, int64_t dim) {                  \
    SegmentPlan *plan = malloc((size_t)(count > 0 ? count : 1) * sizeof(SegmentPlan));                        \
    RowBlock *blocks = malloc((size_t)(queries > 0 ? queries : 1) * sizeof(RowBlock));                        \
    if (plan == NULL || blocks == NULL) {                                                                    \
        free(plan);                                                                                          \
        free(blocks);                                                                                        \
        return -1;                                                                                           \
    }                                                                                                        \
    int64_t widest = plan_segments(shapes, count, BLOCK, EXTRA, kv_heads, dim, plan);                        \
    int64_t block_count = plan_row_blocks(plan, count, queries, query_rows, ROWS, blocks);                   \
    const SegmentPlan *last = count > 0 ? &plan[count - 1] : NULL;                                             \
    size_t packed = last ? (size_t)(last->packed_offset + kv_heads * last->padded * dim) : 0;                 \
    size_t runs_bytes = ((size_t)(widest / 16 + 1) * sizeof(BlockRun) + 63) / 64 * 64;                       \
    size_t per_thread = ((size_t)(SCRATCH(widest, heads, dim)) + 63) / 64 * 64 + runs_bytes;                  \
    int64_t threads = omp_get_max_threads();                                                                 \
    /* packed keys, packed values, then per thread the rows' scratch and block runs: one allocation */       \
    char *memory = aligned_alloc(64, 2 * packed * sizeof(T) + threads * per_thread + 64);                    \
    if (memory == NULL) {                                                                                    \
        free(plan);                                                                                          \
        free(blocks);                                                                                        \
        return -1;                                                                                           \
    }                                                                                                        \
    T *packed_keys = (T *)memory, *packed_values = packed_keys + packed;                                     \
    char *scratch_of_threads = (char *)memory + (2 * packed * sizeof(T) + 63) / 64 * 64;                     \
    _Pragma("omp parallel num_threads(threads)")                                                              \
    {                                                                                                        \
        for (int64_t s = 0; s < count; s++) {                                                                \
            const SegmentPlan *p = &plan[s];                                                                 \
            int64_t context = p->columns - p->rows;                                                          \
            _Pragma("omp for schedule(static) nowait")                                                        \
            for (int64_t index = 0; index < kv_heads * (p->padded / UNIT); index++) {                        \
                int64_t g = index / (p->padded / UNIT), at = p->packed_offset + g * p->padded * dim;         \
                PACK(index % (p->padded / UNIT) * UNIT, context_keys + g * arena_head_stride,                \
                     context_values + g * arena_head_stride, slots + p->first_slot, context,                 \
                     keys + p->first_row * key_stride + g * dim, key_stride,                                 \
                     values + p->first_row * value_stride + g * dim, value_stride, p->columns, p->padded, dim, \
                     packed_keys + at, packed_values + at);                                                  \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("omp barrier")                                                                                \
        char *scratch = scratch_of_threads + omp_get_thread_num() * per_thread;                             \
        BlockRun *runs = (BlockRun *)(scratch + per_thread - runs_bytes);                                    \
        _Pragma("omp for schedule(dynamic, 1)")                                                               \
        for (int64_t b = 0; b < block_count; b++) {                                                          \
            const RowBlock *block = &blocks[b];                                                              \
            const SegmentPlan *p = &plan[block->segment];                                                    \
            int64_t row = query_rows ? query_rows[block->first] : block->first;                              \
            ATTEND_ROWS(q + block->first * q_stride, q_stride, block->count,                                 \
                        masks + p->mask_offset + (row - p->first_row) * p->columns, p->columns,              \
                        packed_keys + p->packed_offset, packed_values + p->packed_offset, p->padded,         \
                        out + block->first * out_stride, out_stride, heads, kv_heads, dim, scratch, runs);    \
        }                                                                                                    \
    }                                                                                                        \
    free(memory);                                                                                            \
    free(blocks);                                                                                            \
    free(plan);                                                                                              \
    return 0;                                                                                                \
}

/* `count` consecutive query rows, one at a time: rows q_stride and out_stride apart, mask rows `columns` apart. */
#define ROW_BY_ROW(NAME, T, ATTEND_ROW)                                                                         \
static void NAME(const T *q, int64_t q_stride, int64_t count, const uint8_t *mask, int64_t columns,             \
                 const T *packed_keys, const T *packed_values, int64_t padded, T *out, int64_t out_stride,      \
                 int64_t heads, int64_t kv_heads, int64_t dim, char *scratch, BlockRun *runs) {                  \
    for (int64_t r = 0; r < count; r++)                                                                       \
        ATTEND_ROW(q + r * q_stride, mask + r * columns, columns, packed_keys, packed_values, padded,            \
                   out + r * out_stride, heads, kv_heads, dim, scratch, runs);                                   \
}

/* Keys in blocks of F32_BLOCK columns, values in blocks of F32_BLOCK dimensions; the scores hold the weights in
 * place. */
ROW_BY_ROW(attend_rows_f32, float, attend_row_f32)
#define F32_SCRATCH(widest, heads, dim) (F32_HEADS * (widest) * sizeof(float))
ATTENTION(quail_attention_f32, float, F32_BLOCK, 0, 4, F32_SCRATCH, 1, pack_column_f32, attend_rows_f32)

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

/* Attention in bf16, on CPUs with AVX-512 BF16 (vdpbf16ps: pairs of bf16 products summed into fp32). torch's
 * two GEMMs around a softmax compute every (row, column) score, half of them under the causal mask, and take
 * four more passes over the scores (mask, softmax, two roundings); here each row computes only the blocks it
 * sees, scores and the softmax stay in fp32 (one rounding, of the weights), and the context is packed once a
 * call straight from its arena slots. 2–3× faster on the segments of a pass on a 2-core EPYC, and closer to
 * an fp32 reference; a 663-row segment runs its scores at ~90 % of the machine's bf16 GEMM rate. */

#define ATTENTION_HEADS 4 /* query heads computed together: each key and value load feeds four products */
#define VALUE_CHUNK 64 /* dimensions of the weighted sum a step: four vectors of sums per head */

/* exp_within_87 (above) on 16 lanes, written with intrinsics: the softmax reads it under a lane mask. */
static inline __m512 exp_within_87_x16(__m512 x) {
    const __m512 round_shift = _mm512_set1_ps(EXP_ROUND_SHIFT);
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(EXP_LOG2_E), round_shift), round_shift);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HIGH), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LOW), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(exponent));
}

/* Which of the 16 columns from `column` (below `stop`) the mask row lets the query see. */
static inline __mmask16 visible16(const uint8_t *mask, int64_t column, int64_t stop) {
    int64_t left = stop - column;
    __mmask16 inside = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1u) : (__mmask16)0;
    __m128i bytes = _mm_maskz_loadu_epi8(inside, mask + column);
    return _mm_mask_test_epi8_mask(inside, bytes, bytes);
}

/* weights[c] = the softmax of scores[c] over the visible columns in the runs of blocks of `block` (16 or 32)
 * columns (of `columns`), rounded to bf16 once; 0 at hidden columns of the runs (all of them when the row sees
 * none there), unwritten between runs. The buffers run a block past the last. */
static void softmax_to_bf16(float *scores, const uint8_t *mask, int64_t columns, const BlockRun *runs,
                            int64_t count, int64_t block, uint16_t *weights) {
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t r = 0; r < count; r++)
        for (int64_t c = runs[r].first * block; c < runs[r].last * block; c += 16)
            top = _mm512_mask_max_ps(top, visible16(mask, c, columns), top, _mm512_load_ps(scores + c));
    __m512 peak = _mm512_set1_ps(_mm512_reduce_max_ps(top)), floor = _mm512_set1_ps(-87.0f);
    __m512 total = _mm512_setzero_ps();
    for (int64_t r = 0; r < count; r++)
        for (int64_t c = runs[r].first * block; c < runs[r].last * block; c += 16) {
            __m512 shifted = _mm512_max_ps(_mm512_sub_ps(_mm512_load_ps(scores + c), peak), floor);
            __m512 e = _mm512_maskz_mov_ps(visible16(mask, c, columns), exp_within_87_x16(shifted));
            _mm512_store_ps(scores + c, e);
            total = _mm512_add_ps(total, e);
        }
    float sum = _mm512_reduce_add_ps(total);
    __m512 inverse = _mm512_set1_ps(sum > 0.0f ? 1.0f / sum : 0.0f);
    for (int64_t r = 0; r < count; r++)
        for (int64_t c = runs[r].first * block; c < runs[r].last * block; c += 16)
            _mm256_store_si256((__m256i *)(weights + c),
                               (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(scores + c), inverse)));
}

/* Column c (of `padded`) of one kv head's keys and values, in the layouts vdpbf16ps reads: keys as [column blocks
 * of 16][dim / 2][16][2] (a block's 16 columns side by side, two dimensions each), values as [dimension chunks of
 * 64 (the last may be 32)][column pairs][chunk][2] (a step of the weighted sum reads one contiguous run: by column
 * pair over all dimensions, its reads were 1 KB apart). Column c < `context` is arena slot slots[c], column
 * context + j the segment's own row j; columns past the last are zero. */
static inline void pack_column(int64_t c, const uint16_t *context_keys, const uint16_t *context_values,
                               const int64_t *slots, int64_t context, const uint16_t *keys, int64_t key_stride,
                               const uint16_t *values, int64_t value_stride, int64_t columns, int64_t padded,
                               int64_t dim, uint16_t *packed_keys, uint16_t *packed_values) {
    const uint16_t *k = NULL, *v = NULL;
    if (c < context) {
        k = context_keys + slots[c] * dim;
        v = context_values + slots[c] * dim;
    } else if (c < columns) {
        k = keys + (c - context) * key_stride;
        v = values + (c - context) * value_stride;
    }
    int64_t half = dim / 2;
    uint32_t *key_pairs = (uint32_t *)(packed_keys + (c / 16) * half * 32) + c % 16;
    for (int64_t p = 0; p < half; p++) {
        uint32_t pair = 0;
        if (k) memcpy(&pair, k + 2 * p, 4);
        key_pairs[p * 16] = pair;
    }
    for (int64_t d0 = 0; d0 < dim; d0 += VALUE_CHUNK) {
        int64_t chunk = dim - d0 < VALUE_CHUNK ? dim - d0 : VALUE_CHUNK;
        uint16_t *value_column = packed_values + d0 * padded + (c / 2) * chunk * 2 + c % 2;
        for (int64_t d = 0; d < chunk; d++) value_column[2 * d] = v ? v[d0 + d] : 0;
    }
}

/* Columns [c0, c0 + 16) (one block of keys, eight column pairs of values) in pack_column's layouts. Whole blocks
 * are written a 64-byte row of keys and a run of value pairs at a time (column by column, every store of a column
 * landed in another cache line: packing took ~40 % of a pass of short segments once the tiles computed the
 * rest); a block reaching past the last column goes column by column. */
static inline void pack_block(int64_t c0, const uint16_t *context_keys, const uint16_t *context_values,
                              const int64_t *slots, int64_t context, const uint16_t *keys, int64_t key_stride,
                              const uint16_t *values, int64_t value_stride, int64_t columns, int64_t padded,
                              int64_t dim, uint16_t *packed_keys, uint16_t *packed_values) {
    if (c0 + 16 > columns) {
        for (int64_t c = c0; c < c0 + 16; c++)
            pack_column(c, context_keys, context_values, slots, context, keys, key_stride, values, value_stride,
                        columns, padded, dim, packed_keys, packed_values);
        return;
    }
    const uint16_t *k[16], *v[16];
    for (int64_t j = 0; j < 16; j++) {
        int64_t c = c0 + j;
        k[j] = c < context ? context_keys + slots[c] * dim : keys + (c - context) * key_stride;
        v[j] = c < context ? context_values + slots[c] * dim : values + (c - context) * value_stride;
    }
    int64_t half = dim / 2;
    uint32_t *key_pairs = (uint32_t *)(packed_keys + (c0 / 16) * half * 32);
    for (int64_t p = 0; p < half; p++)
        for (int64_t j = 0; j < 16; j++) memcpy(&key_pairs[p * 16 + j], k[j] + 2 * p, 4);
    for (int64_t d0 = 0; d0 < dim; d0 += VALUE_CHUNK) {
        int64_t chunk = dim - d0 < VALUE_CHUNK ? dim - d0 : VALUE_CHUNK;
        for (int64_t pair = 0; pair < 8; pair++) {
            const uint16_t *even = v[2 * pair] + d0, *odd = v[2 * pair + 1] + d0;
            uint16_t *to = packed_values + d0 * padded + (c0 / 2 + pair) * chunk * 2;
            #pragma omp simd
            for (int64_t d = 0; d < chunk; d++) to[2 * d] = even[d], to[2 * d + 1] = odd[d];
        }
    }
}

/* scores[h][c] = q_h · key c for four query heads and `step` column blocks from `block` (2 or 4: eight or
 * sixteen independent sums, to hide vdpbf16ps's latency); rows of `scores` are `width` floats apart. */
static inline __attribute__((always_inline)) void score_blocks(const uint16_t *const q[ATTENTION_HEADS],
                                                               const uint16_t *block, int64_t half, int step,
                                                               float *scores, int64_t width) {
    __m512 sums[ATTENTION_HEADS][4];
    for (int h = 0; h < ATTENTION_HEADS; h++)
        for (int j = 0; j < step; j++) sums[h][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < half; p++) {
        __m512bh queries[ATTENTION_HEADS];
        for (int h = 0; h < ATTENTION_HEADS; h++) {
            int32_t pair;
            memcpy(&pair, q[h] + 2 * p, 4);
            queries[h] = (__m512bh)_mm512_set1_epi32(pair);
        }
        for (int j = 0; j < step; j++) { /* each key vector loaded once, for the four heads */
            __m512bh keys = (__m512bh)_mm512_load_si512((const void *)(block + (j * half + p) * 32));
            for (int h = 0; h < ATTENTION_HEADS; h++) sums[h][j] = _mm512_dpbf16_ps(sums[h][j], keys, queries[h]);
        }
    }
    for (int h = 0; h < ATTENTION_HEADS; h++)
        for (int j = 0; j < step; j++) _mm512_store_ps(scores + h * width + 16 * j, sums[h][j]);
}

/* scores[h][c] for the column blocks [first, last): four blocks a step, then two (the last step may compute
 * the padding block past `last`). */
static void scores4(const uint16_t *const q[ATTENTION_HEADS], const uint16_t *packed_keys, int64_t first,
                    int64_t last, int64_t dim, float *scores, int64_t width) {
    int64_t half = dim / 2, b = first;
    for (; b + 4 <= last; b += 4) score_blocks(q, packed_keys + b * half * 32, half, 4, scores + b * 16, width);
    for (; b < last; b += 2) score_blocks(q, packed_keys + b * half * 32, half, 2, scores + b * 16, width);
}

/* out_h[d0, d0 + 16 vectors) = Σ_c weights_h[c] · value c over the column pairs of the runs below `pairs`, for
 * four heads (up to sixteen sums), from the values' chunk at d0 (`pack_column`, `padded` columns); only the first
 * `heads` outputs are written, rounded to bf16. */
static inline __attribute__((always_inline)) void weighted_values4(const uint16_t *const weights[ATTENTION_HEADS],
                                                                   const uint16_t *packed_values, const BlockRun *runs,
                                                                   int64_t count, int64_t pairs, int64_t padded,
                                                                   int64_t d0, int vectors, int64_t heads,
                                                                   uint16_t *const out[ATTENTION_HEADS]) {
    __m512 sums[ATTENTION_HEADS][4];
    for (int h = 0; h < ATTENTION_HEADS; h++)
        for (int j = 0; j < vectors; j++) sums[h][j] = _mm512_setzero_ps();
    for (int64_t r = 0; r < count; r++)
    for (int64_t p = runs[r].first * 8; p < runs[r].last * 8 && p < pairs; p++) {
        const uint16_t *pair = packed_values + d0 * padded + p * 32 * vectors;
        __m512bh w[ATTENTION_HEADS];
        for (int h = 0; h < ATTENTION_HEADS; h++) {
            int32_t both;
            memcpy(&both, weights[h] + 2 * p, 4);
            w[h] = (__m512bh)_mm512_set1_epi32(both);
        }
        for (int j = 0; j < vectors; j++) { /* each value vector loaded once, for the four heads */
            __m512bh v = (__m512bh)_mm512_load_si512((const void *)(pair + 32 * j));
            for (int h = 0; h < ATTENTION_HEADS; h++) sums[h][j] = _mm512_dpbf16_ps(sums[h][j], v, w[h]);
        }
    }
    for (int64_t h = 0; h < heads; h++)
        for (int j = 0; j < vectors; j++)
            _mm256_storeu_si256((__m256i *)(out[h] + d0 + 16 * j), (__m256i)_mm512_cvtneps_pbh(sums[h][j]));
}

/* One query row, all heads, over the runs of blocks that hold its visible columns (`visible_runs`: sliding
 * layers skip the blocks before the window, a row continuing a sibling skips the gap after the sibling's
 * rows it sees); query heads go four at a time, a group of fewer repeating its first head (computed, never
 * written). A row that sees no column gets zeros. `runs` is scratch for (columns + 15) / 16 runs. */
static void attend_row(const uint16_t *q, const uint8_t *visible, int64_t columns, const uint16_t *packed_keys,
                       const uint16_t *packed_values, int64_t padded, uint16_t *out, int64_t heads,
                       int64_t kv_heads, int64_t dim, char *scratch, BlockRun *runs) {
    /* ATTENTION_HEADS rows of `padded` fp32 scores, then as many of bf16 weights */
    float *scores = (float *)scratch;
    uint16_t *weights = (uint16_t *)(scores + ATTENTION_HEADS * padded);
    int64_t width = padded, stop = columns, group = heads / kv_heads;
    int64_t count = visible_runs(visible, columns, 16, runs);
    while (stop > 0 && !visible[stop - 1]) stop--;
    for (int64_t g = 0; g < kv_heads; g++) {
        const uint16_t *packed_k = packed_keys + g * padded * dim, *packed_v = packed_values + g * padded * dim;
        for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += ATTENTION_HEADS) {
            int64_t heads_here = (g + 1) * group - h0 < ATTENTION_HEADS ? (g + 1) * group - h0 : ATTENTION_HEADS;
            const uint16_t *query[ATTENTION_HEADS], *weight_rows[ATTENTION_HEADS];
            uint16_t *target[ATTENTION_HEADS];
            for (int64_t h = 0; h < ATTENTION_HEADS; h++) {
                int64_t head = h < heads_here ? h : 0;
                query[h] = q + (h0 + head) * dim;
                target[h] = out + (h0 + head) * dim;
                weight_rows[h] = weights + head * width;
            }
            for (int64_t r = 0; r < count; r++)
                scores4(query, packed_k, runs[r].first, runs[r].last, dim, scores, width);
            for (int64_t h = 0; h < heads_here; h++)
                softmax_to_bf16(scores + h * width, visible, columns, runs, count, 16, weights + h * width);
            for (int64_t d0 = 0; d0 < dim; d0 += VALUE_CHUNK) /* 64 dimensions a step, then 32 */
                if (dim - d0 >= VALUE_CHUNK) /* two calls, each inlined with its count of vectors a constant */
                    weighted_values4(weight_rows, packed_v, runs, count, (stop + 1) / 2, padded, d0, 4, heads_here,
                                     target);
                else
                    weighted_values4(weight_rows, packed_v, runs, count, (stop + 1) / 2, padded, d0, 2, heads_here,
                                     target);
        }
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>

/* Attention of a block of up to 16 query rows in AMX tiles, on CPUs that have them (Sapphire Rapids and later):
 * one tile instruction multiplies 16 rows by 16 columns over 32 dimensions, eight times the products of the
 * vdpbf16ps the row kernel issues. The 16 rows × the four heads of a group make four score tiles against each
 * loaded tile of keys (the same packed keys the row kernel reads: their [block][dim / 2][16][2] layout is the
 * tiles' pair-interleaved one); the softmax is the row kernel's, row by row under each row's mask, over the
 * blocks of 32 columns any row of the block sees; the weighted sums take tiles of 32 weights against the packed
 * values' column pairs (strided loads of their chunks of 64 dimensions). */

#define TILE_ROWS 16
#define TILE_MIN_ROWS 4 /* fewer rows in a block go row by row */

typedef struct __attribute__((packed)) {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} TileConfig;

/* Whether this process may use the tiles: Linux hands their 8 KB of register state out on request. */
static int tiles_permitted(void) {
    static int permitted = -1;
    if (permitted < 0) permitted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                           18 /* XFEATURE_XTILEDATA */) == 0;
    return permitted;
}

/* 1 when the bf16 kernel computes blocks of rows in AMX tiles here, else 0 (for the report). */
int quail_attention_bf16_tiles(void) { return tiles_permitted(); }

/* Every tile register 16 rows of 64 bytes: 16 × 32 bf16, or 16 × 16 fp32 sums. */
static void configure_tiles(void) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) config.bytes_per_row[t] = 64, config.rows[t] = TILE_ROWS;
    _tile_loadconfig(&config);
}

/* Scratch of a block: fp32 scores and bf16 weights of ATTENTION_HEADS × 16 rows, the sums of one chunk, a copy
 * of a short block's query rows, the block's union of mask rows. */
#define TILE_SCRATCH(padded, heads, dim) \
    (ATTENTION_HEADS * TILE_ROWS * (padded) * (sizeof(float) + sizeof(uint16_t)) + TILE_ROWS * VALUE_CHUNK * sizeof(float) \
     + TILE_ROWS * (heads) * (dim) * sizeof(uint16_t) + (padded))

/* scores[h][r][c] (rows of `padded`) = q_h of row r · key c, for the 16-column blocks of the runs (of 32). */
static void tile_scores(const uint16_t *const query[ATTENTION_HEADS], int64_t q_bytes, const uint16_t *packed_keys,
                        const BlockRun *runs, int64_t count, int64_t dim, float *scores, int64_t padded) {
    int64_t half = dim / 2, stride = padded * (int64_t)sizeof(float);
    for (int64_t r = 0; r < count; r++)
        for (int64_t b = 2 * runs[r].first; b < 2 * runs[r].last; b++) {
            const uint16_t *block = packed_keys + b * half * 32;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t t = 0; t < dim / 32; t++) { /* 16 key pairs (32 dimensions) a step */
                _tile_loadd(4, block + t * 16 * 32, 64);
                _tile_loadd(5, query[0] + t * 32, q_bytes);
                _tile_dpbf16ps(0, 5, 4);
                _tile_loadd(6, query[1] + t * 32, q_bytes);
                _tile_dpbf16ps(1, 6, 4);
                _tile_loadd(5, query[2] + t * 32, q_bytes);
                _tile_dpbf16ps(2, 5, 4);
                _tile_loadd(6, query[3] + t * 32, q_bytes);
                _tile_dpbf16ps(3, 6, 4);
            }
            float *s = scores + b * 16;
            _tile_stored(0, s, stride);
            _tile_stored(1, s + TILE_ROWS * padded, stride);
            _tile_stored(2, s + 2 * TILE_ROWS * padded, stride);
            _tile_stored(3, s + 3 * TILE_ROWS * padded, stride);
        }
}

/* out row r (out_stride apart) = Σ_c weights[r][c] · value c over the runs (of 32 columns), for the chunk of
 * `chunk` (64 or 32) dimensions at d0 of one head; the first `count` rows written, rounded to bf16. */
static void tile_weighted_values(const uint16_t *weights, int64_t padded, const uint16_t *packed_values,
                                 const BlockRun *runs, int64_t runs_count, int64_t d0, int64_t chunk, float *sums,
                                 uint16_t *out, int64_t out_stride, int64_t count) {
    int64_t weight_bytes = padded * (int64_t)sizeof(uint16_t), value_bytes = chunk * 2 * (int64_t)sizeof(uint16_t);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t r = 0; r < runs_count; r++)
        for (int64_t b = runs[r].first; b < runs[r].last; b++) { /* 32 columns: 16 column pairs */
            const uint16_t *pairs = packed_values + d0 * padded + b * 16 * chunk * 2;
            _tile_loadd(4, weights + b * 32, weight_bytes);
            _tile_loadd(5, pairs, value_bytes);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, pairs + 32, value_bytes);
            _tile_dpbf16ps(1, 4, 6);
            if (chunk == VALUE_CHUNK) {
                _tile_loadd(5, pairs + 64, value_bytes);
                _tile_dpbf16ps(2, 4, 5);
                _tile_loadd(6, pairs + 96, value_bytes);
                _tile_dpbf16ps(3, 4, 6);
            }
        }
    int64_t sums_bytes = VALUE_CHUNK * (int64_t)sizeof(float);
    _tile_stored(0, sums, sums_bytes);
    _tile_stored(1, sums + 16, sums_bytes);
    _tile_stored(2, sums + 32, sums_bytes);
    _tile_stored(3, sums + 48, sums_bytes);
    for (int64_t r = 0; r < count; r++)
        for (int64_t j = 0; j < chunk; j += 16)
            _mm256_storeu_si256((__m256i *)(out + r * out_stride + d0 + j),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(sums + r * VALUE_CHUNK + j)));
}

/* A block of `count` (≤ 16) consecutive query rows of one segment, all heads (four a group, as the row kernel
 * goes), over the blocks of 32 columns any of its rows sees; each row's softmax under its own mask row. A
 * short block's rows are copied into 16 rows of scratch first (the tiles read 16). */
static void attend_block_tiles(const uint16_t *q, int64_t q_stride, int64_t count, const uint8_t *masks,
                               int64_t columns, const uint16_t *packed_keys, const uint16_t *packed_values,
                               int64_t padded, uint16_t *out, int64_t out_stride, int64_t heads, int64_t kv_heads,
                               int64_t dim, char *scratch, BlockRun *runs) {
    float *scores = (float *)scratch;
    uint16_t *weights = (uint16_t *)(scores + ATTENTION_HEADS * TILE_ROWS * padded);
    float *sums = (float *)(weights + ATTENTION_HEADS * TILE_ROWS * padded);
    uint16_t *rows_copy = (uint16_t *)(sums + TILE_ROWS * VALUE_CHUNK);
    uint8_t *seen = (uint8_t *)(rows_copy + TILE_ROWS * heads * dim);
    if (count < TILE_ROWS) {
        for (int64_t r = 0; r < count; r++)
            memcpy(rows_copy + r * heads * dim, q + r * q_stride, (size_t)(heads * dim) * sizeof(uint16_t));
        memset(rows_copy + count * heads * dim, 0, (size_t)((TILE_ROWS - count) * heads * dim) * sizeof(uint16_t));
        q = rows_copy;
        q_stride = heads * dim;
    }
    memcpy(seen, masks, (size_t)columns);
    for (int64_t r = 1; r < count; r++)
        for (int64_t c = 0; c < columns; c++) seen[c] |= masks[r * columns + c];
    int64_t runs_count = visible_runs(seen, columns, 32, runs), group = heads / kv_heads;
    configure_tiles();
    for (int64_t g = 0; g < kv_heads; g++) {
        const uint16_t *packed_k = packed_keys + g * padded * dim, *packed_v = packed_values + g * padded * dim;
        for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += ATTENTION_HEADS) {
            int64_t heads_here = (g + 1) * group - h0 < ATTENTION_HEADS ? (g + 1) * group - h0 : ATTENTION_HEADS;
            const uint16_t *query[ATTENTION_HEADS];
            for (int64_t h = 0; h < ATTENTION_HEADS; h++) query[h] = q + (h0 + (h < heads_here ? h : 0)) * dim;
            tile_scores(query, q_stride * (int64_t)sizeof(uint16_t), packed_k, runs, runs_count, dim, scores, padded);
            for (int64_t h = 0; h < heads_here; h++)
                for (int64_t r = 0; r < count; r++) {
                    int64_t at = (h * TILE_ROWS + r) * padded;
                    softmax_to_bf16(scores + at, masks + r * columns, columns, runs, runs_count, 32, weights + at);
                }
            for (int64_t h = 0; h < heads_here; h++)
                for (int64_t d0 = 0; d0 < dim; d0 += VALUE_CHUNK)
                    tile_weighted_values(weights + h * TILE_ROWS * padded, padded, packed_v, runs, runs_count, d0,
                                         dim - d0 < VALUE_CHUNK ? dim - d0 : VALUE_CHUNK, sums,
                                         out + (h0 + h) * dim, out_stride, count);
        }
    }
    _tile_release();
}
#endif

ROW_BY_ROW(attend_rows_one_by_one, uint16_t, attend_row)

/* A block of rows: in AMX tiles where this CPU and process have them and the block has enough rows, else row by
 * row. */
static void attend_rows(const uint16_t *q, int64_t q_stride, int64_t count, const uint8_t *masks, int64_t columns,
                        const uint16_t *packed_keys, const uint16_t *packed_values, int64_t padded, uint16_t *out,
                        int64_t out_stride, int64_t heads, int64_t kv_heads, int64_t dim, char *scratch,
                        BlockRun *runs) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (count >= TILE_MIN_ROWS && tiles_permitted()) {
        attend_block_tiles(q, q_stride, count, masks, columns, packed_keys, packed_values, padded, out, out_stride,
                           heads, kv_heads, dim, scratch, runs);
        return;
    }
#endif
    attend_rows_one_by_one(q, q_stride, count, masks, columns, packed_keys, packed_values, padded, out, out_stride,
                           heads, kv_heads, dim, scratch, runs);
}

/* Keys in blocks of 16 columns, columns padded to whole blocks of 32 and one more (zero: the row kernel's last
 * step of two blocks may compute it), values by column pair within chunks of 64 dimensions; fp32 scores and
 * bf16 weights. */
#define ROW_SCRATCH(padded) (ATTENTION_HEADS * (padded) * (sizeof(float) + sizeof(uint16_t)))
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define BF16_ROWS (tiles_permitted() ? TILE_ROWS : 4)
#define BF16_SCRATCH(padded, heads, dim) (tiles_permitted() ? TILE_SCRATCH(padded, heads, dim) : ROW_SCRATCH(padded))
#else
#define BF16_ROWS 4
#define BF16_SCRATCH(padded, heads, dim) ROW_SCRATCH(padded)
#endif
ATTENTION(quail_attention_bf16, uint16_t, 32, 1, BF16_ROWS, BF16_SCRATCH, 16, pack_block, attend_rows)
#endif

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
/* Projections of one row (a decode step of one sequence): every weight is read once a step, so the rate is the
 * memory's. oneDNN reached ~0.8 of a plain read over Gemma 3 270M's layer weights at one row; this loop, four weight
 * rows at a time with their fp32 sums in registers and a software prefetch ahead of the stream, matches the read.
 * From two rows on it is no faster than oneDNN, which takes them. Sums in fp32 (vdpbf16ps: pairs of exact bf16
 * products), bias added in fp32, one rounding to bf16 — as oneDNN does, in another order. */
#define GEMV_PREFETCH_BYTES 16384 /* how far ahead of the weight stream each thread asks for its lines */

static inline __mmask32 lanes_left(int64_t left) {
    return left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1u);
}

/* x · w[r] for four weight rows from w (k apart), each sum in a register of its own (as an array indexed in a
 * loop GCC kept them on the stack: half the memory's rate). */
static inline __attribute__((always_inline)) void four_sums(const uint16_t *x, const uint16_t *w, int64_t k,
                                                            float sums[4]) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 32 <= k; c += 32) {
        _mm_prefetch((const char *)(w + c) + GEMV_PREFETCH_BYTES, _MM_HINT_T0);
        __m512bh xv = (__m512bh)_mm512_loadu_si512(x + c);
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + c), xv);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + k + c), xv);
        a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w + 2 * k + c), xv);
        a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w + 3 * k + c), xv);
    }
    if (c < k) {
        __mmask32 lanes = lanes_left(k - c);
        __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(lanes, x + c);
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(lanes, w + c), xv);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_maskz_loadu_epi16(lanes, w + k + c), xv);
        a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_maskz_loadu_epi16(lanes, w + 2 * k + c), xv);
        a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_maskz_loadu_epi16(lanes, w + 3 * k + c), xv);
    }
    sums[0] = _mm512_reduce_add_ps(a0);
    sums[1] = _mm512_reduce_add_ps(a1);
    sums[2] = _mm512_reduce_add_ps(a2);
    sums[3] = _mm512_reduce_add_ps(a3);
}

/* The same for one weight row (the last rows of a weight whose row count is not a multiple of four). */
static float one_sum(const uint16_t *x, const uint16_t *w, int64_t k) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 32) {
        __mmask32 lanes = lanes_left(k - c);
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(lanes, w + c),
                               (__m512bh)_mm512_maskz_loadu_epi16(lanes, x + c));
    }
    return _mm512_reduce_add_ps(acc);
}

static inline float bias_of(const uint16_t *bias, int64_t r) { return bias != NULL ? widen(bias[r]) : 0.0f; }

/* out[r] = x · w[r] (+ bias[r]) in bf16, for one input row of k and a contiguous [n, k] weight. */
void quail_gemv_bf16(const uint16_t *x, const uint16_t *w, int64_t n, int64_t k, const uint16_t *bias,
                     uint16_t *out) {
    int64_t blocks = n / 4;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        float sums[4];
        four_sums(x, w + b * 4 * k, k, sums);
        for (int r = 0; r < 4; r++) out[b * 4 + r] = narrow(sums[r] + bias_of(bias, b * 4 + r));
    }
    for (int64_t r = blocks * 4; r < n; r++) out[r] = narrow(one_sum(x, w + r * k, k) + bias_of(bias, r));
}

#define HEAD_MAX_TOP 16

/* Keeps the `count` largest (value, index) pairs seen, largest first; an equal value keeps the lower index (the
 * pairs arrive in increasing index). */
static inline void keep_largest(float *values, int64_t *indices, int64_t count, float value, int64_t index) {
    if (!(value > values[count - 1])) return;
    int64_t at = count - 1;
    while (at > 0 && value > values[at - 1]) {
        values[at] = values[at - 1];
        indices[at] = indices[at - 1];
        at--;
    }
    values[at] = value;
    indices[at] = index;
}

/* The indices of the `top` (<= HEAD_MAX_TOP) largest fp32 logits x · w[r] of one row over a [n, k] head, largest
 * first (ties: the lower index), into `indices`: a greedy choice reads no more, so the logits are never written
 * out. Each thread keeps its own over its share of the rows; the shares merge in order. 0 when computed, 1 for a
 * `top` it does not take. */
int quail_head_top_bf16(const uint16_t *x, const uint16_t *w, int64_t n, int64_t k, int64_t top, int64_t *indices) {
    if (top < 1 || top > HEAD_MAX_TOP || top > n) return 1;
    int threads = omp_get_max_threads();
    float values[threads][HEAD_MAX_TOP];
    int64_t found[threads][HEAD_MAX_TOP];
    for (int t = 0; t < threads; t++)
        for (int64_t j = 0; j < top; j++) values[t][j] = -INFINITY, found[t][j] = -1;
    int64_t blocks = n / 4;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num();
        float mine[HEAD_MAX_TOP], floor = -INFINITY; /* the smallest kept, in a register: most rows stop there */
        int64_t mine_found[HEAD_MAX_TOP];
        for (int64_t j = 0; j < top; j++) mine[j] = -INFINITY, mine_found[j] = -1;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            float sums[4];
            four_sums(x, w + b * 4 * k, k, sums);
            for (int r = 0; r < 4; r++)
                if (sums[r] > floor) {
                    keep_largest(mine, mine_found, top, sums[r], b * 4 + r);
                    floor = mine[top - 1];
                }
        }
        for (int64_t j = 0; j < top; j++) values[t][j] = mine[j], found[t][j] = mine_found[j];
    }
    for (int64_t r = blocks * 4; r < n; r++) /* the last rows, after every block: with the last thread's */
        keep_largest(values[threads - 1], found[threads - 1], top, one_sum(x, w + r * k, k), r);
    float best[HEAD_MAX_TOP];
    for (int64_t j = 0; j < top; j++) best[j] = -INFINITY, indices[j] = -1;
    for (int t = 0; t < threads; t++) /* each thread's rows follow the previous one's: ties keep the lower index */
        for (int64_t j = 0; j < top && found[t][j] >= 0; j++) keep_largest(best, indices, top, values[t][j], found[t][j]);
    return 0;
}

/* A decode step of one sequence through every layer, in one call. At one row each layer is a dozen small
 * operations between four weight reads, and on a 270M model the Python between them (~150 µs a layer) cost a
 * quarter of the step; here the same kernels run back to back — the norms, RoPE, GELU and attention above, the
 * one-row projections — rounding where the layer's torch ops round, so the step equals the layer-by-layer one. */
typedef struct {
    const uint16_t *qkv, *qkv_bias, *o, *gate_up, *down; /* [rows, k] weights; the bias may be NULL */
    const float *input_norm, *post_attention_norm, *pre_feedforward_norm, *post_feedforward_norm;
    /* norm weights as applied (`applied_norm`); the feed-forward pair only with Gemma's norms */
    const float *q_norm, *k_norm; /* QK-norm weights as applied (q's times the attention scale), or NULL */
    const uint16_t *arena_keys, *arena_values; /* the layer's [kv_heads, slots, head_dim] KV */
    int64_t sliding; /* 1: the sliding-window mask and RoPE tables */
} DecodeLayer;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, ffn;
    int64_t gemma_norms, gelu; /* Gemma's (1 + w) norms and post-norms; GELU-tanh (else SiLU) */
    float eps, attention_scale; /* the scale multiplies rotated queries only without QK-norm */
    int64_t arena_head_stride, segments;
    const int64_t *slots, *shapes; /* the pass's attention layout (`FlatSegments`) */
    const uint8_t *masks[2]; /* full, sliding */
    const uint16_t *cos[2], *sin[2]; /* the row's RoPE tables (the sine signed), full and sliding */
} DecodeStep;

/* One row's RMSNorm into out (plus `residual` when given), on this thread: at one row a parallel region costs more
 * than the norm. The same arithmetic as quail_rms_norm_bf16. */
static void norm_row(const uint16_t *x, int64_t width, const float *weight, float eps, int gemma,
                     const uint16_t *residual, uint16_t *out) {
    normalize_bf16(x, width, weight, eps, gemma, out);
    if (residual != NULL)
        for (int64_t j = 0; j < width; j++) out[j] = narrow(widen(residual[j]) + widen(out[j]));
}

/* RoPE of one head in place, then the query scale, rounded as torch's ops round: n · cos, + swap(n) · sin, · s. */
static void rotate_head(uint16_t *head, int64_t dim, const uint16_t *c, const uint16_t *s, float scale) {
    int64_t half = dim / 2;
    for (int64_t j = 0; j < half; j++) {
        float first = widen(head[j]), second = widen(head[j + half]);
        head[j] = narrow(widen(narrow(first * widen(c[j]))) + second * widen(s[j]));
        head[j + half] = narrow(widen(narrow(second * widen(c[j + half]))) + first * widen(s[j + half]));
        if (scale != 1.0f) {
            head[j] = narrow(widen(head[j]) * scale);
            head[j + half] = narrow(widen(head[j + half]) * scale);
        }
    }
}

/* q or k heads from the projection: QK-norm and RoPE (the norm's kernel), or RoPE and the scale. */
static void position_heads(const uint16_t *from, int64_t count, const DecodeStep *step, const float *norm,
                           const uint16_t *c, const uint16_t *s, float scale, uint16_t *out) {
    int64_t dim = step->head_dim;
    if (norm != NULL) {
        quail_rms_norm_rope_bf16(from, 1, count * dim, count, dim, norm, step->eps, (int)step->gemma_norms, c, s, out);
        return;
    }
    memcpy(out, from, (size_t)(count * dim) * sizeof(uint16_t));
    for (int64_t h = 0; h < count; h++) rotate_head(out + h * dim, dim, c, s, scale);
}

/* x += y in bf16, rounded as torch's add. */
static void add_rows(uint16_t *x, const uint16_t *y, int64_t width) {
    for (int64_t j = 0; j < width; j++) x[j] = narrow(widen(x[j]) + widen(y[j]));
}

/* The gated activation of one row's [gate; up] into out, with the MLP's own kernels. */
static void activate(const uint16_t *gate_up, int64_t ffn, int gelu, uint16_t *out) {
    if (gelu)
        quail_gelu_tanh_times_bf16(gate_up, gate_up + ffn, out, 1, ffn, 2 * ffn);
    else
        quail_silu_times_bf16(gate_up, gate_up + ffn, out, 1, ffn, 2 * ffn);
}

/* Every layer over the row x ([hidden], replaced by the last layer's output); each layer's new key and value go to
 * keys / values ([layers, kv_heads, head_dim]). 0 when computed, -1 when out of memory. */
int quail_decode_row_bf16(const DecodeLayer *layers, int64_t count, const DecodeStep *step, uint16_t *x,
                          uint16_t *keys, uint16_t *values) {
    int64_t hidden = step->hidden, dim = step->head_dim, kv = step->kv_heads * dim, queries = step->heads * dim;
    int64_t ffn = step->ffn, projected = queries + 2 * kv;
    size_t elements = 3 * (size_t)hidden + (size_t)projected + 2 * (size_t)queries + 3 * (size_t)ffn;
    uint16_t *memory = malloc(elements * sizeof(uint16_t));
    if (memory == NULL) return -1;
    uint16_t *normed = memory, *out = normed + hidden, *kept = out + hidden, *qkv = kept + hidden;
    uint16_t *q = qkv + projected, *attended = q + queries, *gate_up = attended + queries, *act = gate_up + 2 * ffn;
    int gemma = (int)step->gemma_norms;
    for (int64_t l = 0; l < count; l++) {
        const DecodeLayer *layer = &layers[l];
        int kind = layer->sliding ? 1 : 0;
        uint16_t *k = keys + l * kv, *v = values + l * kv;
        norm_row(x, hidden, layer->input_norm, step->eps, gemma, NULL, normed);
        quail_gemv_bf16(normed, layer->qkv, projected, hidden, layer->qkv_bias, qkv);
        position_heads(qkv, step->heads, step, layer->q_norm, step->cos[kind], step->sin[kind],
                       step->attention_scale, q);
        position_heads(qkv + queries, step->kv_heads, step, layer->k_norm, step->cos[kind], step->sin[kind], 1.0f,
                       k);
        memcpy(v, qkv + queries + kv, (size_t)kv * sizeof(uint16_t));
        if (quail_attention_bf16(q, queries, attended, queries, 1, NULL, layer->arena_keys, layer->arena_values,
                                 step->arena_head_stride, step->slots, k, kv, v, kv, step->shapes, step->segments,
                                 step->masks[kind], step->heads, step->kv_heads, dim) != 0) {
            free(memory);
            return -1;
        }
        quail_gemv_bf16(attended, layer->o, hidden, queries, NULL, out);
        if (gemma) {
            memcpy(kept, x, (size_t)hidden * sizeof(uint16_t)); /* the residual: x is written over */
            norm_row(out, hidden, layer->post_attention_norm, step->eps, gemma, kept, x);
            norm_row(x, hidden, layer->pre_feedforward_norm, step->eps, gemma, NULL, normed);
        } else {
            add_rows(x, out, hidden);
            norm_row(x, hidden, layer->post_attention_norm, step->eps, gemma, NULL, normed);
        }
        quail_gemv_bf16(normed, layer->gate_up, 2 * ffn, hidden, NULL, gate_up);
        activate(gate_up, ffn, (int)step->gelu, act);
        quail_gemv_bf16(act, layer->down, hidden, ffn, NULL, out);
        if (gemma) {
            memcpy(kept, x, (size_t)hidden * sizeof(uint16_t));
            norm_row(out, hidden, layer->post_feedforward_norm, step->eps, gemma, kept, x);
        } else {
            add_rows(x, out, hidden);
        }
    }
    free(memory);
    return 0;
}
#endif
