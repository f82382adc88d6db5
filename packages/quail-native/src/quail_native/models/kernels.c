/* Quail's fused elementwise kernels for the CPU, built once per machine by quail_native.models.kernels.
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

/* e^x for |x| <= 87 to about an ulp: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n ln2 is
 * exact), e^r by its Taylor series to r^7 (remainder < 2e-8 relative), 2^n put into the exponent bits.
 * Written without calls so that it vectorises. */
static inline float exp_within_87(float x) {
    const float round_shift = 12582912.0f; /* 1.5 · 2^23: adding and subtracting it rounds to an integer */
    float n = (x * 1.4426950408889634f + round_shift) - round_shift;
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.4286068203094173e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t exponent = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &exponent, sizeof scale);
    return p * scale;
}

/* σ(2u) · x with u = √(2/π)(x + 0.044715 x³), i.e. 0.5 (1 + tanh u) · x; past ±87 σ is 0 or 1 to fp32
 * precision already. */
static inline float gelu_tanh(float x) {
    const float linear = 1.5957691216057308f; /* 2 √(2/π) */
    const float cubic = 1.5957691216057308f * 0.044715f;
    float z = x * (linear + cubic * x * x);
    float clamped = z > 87.0f ? 87.0f : (z < -87.0f ? -87.0f : z);
    float gelu = x / (1.0f + exp_within_87(-clamped));
    return z < -87.0f ? x * 0.0f : gelu; /* σ is under fp32's normal range there: 0 (torch keeps a denormal) */
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
                product[j] = widen(narrow(gelu_tanh(widen(g[start + j])))) * widen(u[start + j]);
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
