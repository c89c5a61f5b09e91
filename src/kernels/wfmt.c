/*
 * wfmt.c - the weight formats of kernels.h: descriptors (names, byte counts,
 * which are computable), views of some rows, the one-value decodings that
 * define the scaled formats (e4m3, e2m1, INT4, E8M0), the portable decoding of
 * 16 scaled values (the C path's, and the definition the SIMD paths match),
 * the 4-bit formats' scaled tables (df_e2m1_tables, df_i4_tables), FP8's
 * F16-form maps (df_fp8_map_build) and df_wview_decode_rows.
 */
#include "kernels/scaled.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const ELEM_NAMES[DF_EL_COUNT] = {"F32", "F16", "BF16", "F8_E4M3", "I4", "E2M1"};
static const char *const SCALE_NAMES[] = {"", "F32", "BF16", "E8M0"};

bool df_wfmt_of_dtype(df_dtype t, df_wfmt *out) {
    df_wfmt f = {DF_EL_F32, DF_SC_NONE, 0, 0};
    switch (t) {
    case DF_DT_F32: f.elem = DF_EL_F32; break;
    case DF_DT_F16: f.elem = DF_EL_F16; break;
    case DF_DT_BF16: f.elem = DF_EL_BF16; break;
    case DF_DT_F8_E4M3: f.elem = DF_EL_F8_E4M3; break;
    default: return false;
    }
    *out = f;
    return true;
}

const char *df_wfmt_name(df_wfmt f) {
    static __thread char buf[48];
    const char *e = (unsigned)f.elem < DF_EL_COUNT ? ELEM_NAMES[f.elem] : "?";
    if (f.scale == DF_SC_NONE) return e;
    snprintf(buf, sizeof buf, "%s/%s[%dx%d]", e, (unsigned)f.scale <= DF_SC_E8M0 ? SCALE_NAMES[f.scale] : "?",
             f.block_rows, f.block_cols);
    return buf;
}

bool df_wfmt_computable(df_wfmt f) {
    if (f.scale == DF_SC_NONE) return f.elem == DF_EL_F32 || f.elem == DF_EL_F16 || f.elem == DF_EL_BF16;
    /* the SIMD paths take one scale per 16-value chunk */
    bool shape = f.block_rows >= 1 && f.block_cols >= 16 && f.block_cols % 16 == 0;
    return shape && ((f.elem == DF_EL_F8_E4M3 && f.scale == DF_SC_F32) ||
                     (f.elem == DF_EL_I4 && f.scale == DF_SC_BF16) ||
                     (f.elem == DF_EL_E2M1 && f.scale == DF_SC_E8M0));
}

size_t df_wfmt_row_bytes(df_wfmt f, int cols) {
    size_t c = cols > 0 ? (size_t)cols : 0;
    switch (f.elem) {
    case DF_EL_F32: return 4 * c;
    case DF_EL_F16: case DF_EL_BF16: return 2 * c;
    case DF_EL_F8_E4M3: return c;
    default: return (c + 1) / 2; /* two 4-bit values per byte */
    }
}

uint64_t df_wfmt_bytes(df_wfmt f, int rows, int cols) {
    return (uint64_t)(rows > 0 ? rows : 0) * df_wfmt_row_bytes(f, cols);
}

uint64_t df_wfmt_scale_bytes(df_wfmt f, int rows, int cols) {
    if (f.scale == DF_SC_NONE || f.block_rows <= 0 || f.block_cols <= 0 || rows <= 0 || cols <= 0) return 0;
    uint64_t gr = ((uint64_t)rows + (uint64_t)f.block_rows - 1) / (uint64_t)f.block_rows;
    uint64_t gc = ((uint64_t)cols + (uint64_t)f.block_cols - 1) / (uint64_t)f.block_cols;
    return gr * gc * df_sc_size(f.scale);
}

df_wview df_wview_rows(const df_wview *v, int r0, int n) {
    df_wview s = *v;
    s.data = (const char *)v->data + (size_t)r0 * df_wfmt_row_bytes(v->fmt, v->cols);
    s.rows = n;
    if (v->f16map) s.f16map = v->f16map + (size_t)r0 * df_fp8_map_words(v->cols);
    if (v->fmt.scale != DF_SC_NONE && v->fmt.block_rows > 0) {
        int a = v->row0 + r0;
        s.scale = df_scale_row(v, r0);
        s.row0 = a % v->fmt.block_rows;
    }
    return s;
}

size_t df_fp8_map_words(int cols) { return cols > 0 ? (((size_t)cols + 63) / 64 + 63) / 64 : 0; }

/* Whether one of the 8 codes in x needs the F16 form: ((q & 0x7f) + 1) & 0x70 is the
 * test's (q + 1) & 0x70 (bit 7 cannot carry into bits 4-6), and no byte carries into the
 * next (at most 0x80); shifted down, a flagged byte is 0, found by the usual zero-byte test
 * (exact for bytes below 0x80). */
static inline bool f16_codes8(uint64_t x) {
    const uint64_t ones = 0x0101010101010101ull;
    uint64_t z = (((x & 0x7f7f7f7f7f7f7f7full) + ones) & 0x7070707070707070ull) >> 4;
    return ((z - ones) & ~z & 0x8080808080808080ull) != 0;
}

void df_fp8_map_build(uint64_t *map, const df_wview *v) {
    size_t wpr = df_fp8_map_words(v->cols), rs = df_wfmt_row_bytes(v->fmt, v->cols);
    for (int r = 0; r < v->rows; r++) {
        const uint8_t *row = (const uint8_t *)v->data + (size_t)r * rs;
        uint64_t *m = map + (size_t)r * wpr;
        memset(m, 0, wpr * sizeof *m);
        for (int g = 0; g * 64 < v->cols; g++) {
            int n = v->cols - 64 * g < 64 ? v->cols - 64 * g : 64; /* the last group may be short */
            bool f = false;
            for (int i = 0; i < n; i += 8) {
                uint64_t x = 0x4040404040404040ull; /* past the row's end: codes that pass (e = 8) */
                memcpy(&x, row + 64 * (size_t)g + (size_t)i, n - i < 8 ? (size_t)(n - i) : 8);
                f |= f16_codes8(x);
            }
            m[g / 64] |= (uint64_t)f << (g % 64);
        }
    }
}

/* ---- the definitions ------------------------------------------------------ */

float df_e4m3_to_f32(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    float r;
    if (e == 15 && m == 7) r = NAN; /* e4m3fn: no infinity, this is the only NaN */
    else if (e == 0) r = ldexpf((float)m, -9); /* 2^-6 * m/8 */
    else r = ldexpf((float)(8 + m), e - 10);   /* 2^(e-7) * (1 + m/8) */
    return (b & 0x80) ? -r : r;
}

float df_e2m1_to_f32(unsigned nibble) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float r = mag[nibble & 7];
    return (nibble & 8) ? -r : r; /* 0x8 is -0 */
}

float df_i4_to_f32(unsigned nibble) { return (float)((int)(nibble & 15) - 8); }

float df_e8m0_to_f32(uint8_t s) { return s == 255 ? NAN : ldexpf(1.0f, (int)s - 127); }

/* fl(e2m1(q) * e8m0(s)) for every scale s and code q (scaled.h) */
static _Alignas(64) float e2m1_tables[256][16];
static pthread_once_t e2m1_once = PTHREAD_ONCE_INIT;

static void e2m1_init(void) {
    for (int s = 0; s < 256; s++)
        for (unsigned q = 0; q < 16; q++) e2m1_tables[s][q] = df_e2m1_to_f32(q) * df_e8m0_to_f32((uint8_t)s);
}

const float (*df_e2m1_tables(void))[16] {
    pthread_once(&e2m1_once, e2m1_init);
    return (const float (*)[16])e2m1_tables;
}

/* fl((q - 8) * s) for every code q and the BF16 scales s with bits from
 * DF_I4_TAB_LO on (scaled.h) */
static _Alignas(64) float i4_tables[DF_I4_TAB_N][16];
static pthread_once_t i4_once = PTHREAD_ONCE_INIT;

static void i4_init(void) {
    for (unsigned i = 0; i < DF_I4_TAB_N; i++) {
        uint32_t u = (DF_I4_TAB_LO + i) << 16;
        float s;
        memcpy(&s, &u, 4);
        for (unsigned q = 0; q < 16; q++) i4_tables[i][q] = df_i4_to_f32(q) * s;
    }
}

const float (*df_i4_tables(void))[16] {
    pthread_once(&i4_once, i4_init);
    return (const float (*)[16])i4_tables;
}

static float scale_def(const uint8_t *srow, df_scale_type t, int j) {
    if (t == DF_SC_F32) {
        float f;
        memcpy(&f, srow + 4 * (size_t)j, 4);
        return f;
    }
    if (t == DF_SC_BF16) {
        uint16_t h;
        memcpy(&h, srow + 2 * (size_t)j, 2);
        return df_bf16_to_f32(h);
    }
    return df_e8m0_to_f32(srow[j]);
}

void df_qdecode16_c(float w[16], const df_wview *v, const uint8_t *row, const uint8_t *srow, int k0) {
    for (int i = 0; i < 16; i++) {
        int k = k0 + i;
        if (k >= v->cols) {
            w[i] = 0.0f; /* padding: +0, whatever the bytes past the row hold */
            continue;
        }
        float q;
        switch (v->fmt.elem) {
        case DF_EL_F8_E4M3: q = df_e4m3_to_f32(row[k]); break;
        case DF_EL_I4: q = df_i4_to_f32((unsigned)row[k >> 1] >> (4 * (k & 1))); break;
        default: q = df_e2m1_to_f32((unsigned)row[k >> 1] >> (4 * (k & 1))); break;
        }
        float s = scale_def(srow, v->fmt.scale, k / v->fmt.block_cols);
        w[i] = q * s; /* one rounding; -ffp-contract=off keeps it unfused */
    }
}

void df_qdecode_c(float *dst, const df_wview *w, int r0, int n) {
    size_t rb = df_wfmt_row_bytes(w->fmt, w->cols);
    for (int r = r0; r < r0 + n; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb, *srow = df_scale_row(w, r);
        float *d = dst + (size_t)(r - r0) * (size_t)w->cols;
        for (int k = 0; k < w->cols; k += 16) {
            float b[16];
            df_qdecode16_c(b, w, row, srow, k);
            memcpy(d + k, b, sizeof(float) * (size_t)(w->cols - k < 16 ? w->cols - k : 16));
        }
    }
}

void df_wview_decode_rows(float *dst, const df_wview *v, int r0, int n) {
    if (n <= 0 || v->cols <= 0) return;
    if (v->fmt.scale == DF_SC_NONE) {
        static const df_dtype DT[] = {DF_DT_F32, DF_DT_F16, DF_DT_BF16, DF_DT_F8_E4M3};
        if ((unsigned)v->fmt.elem > DF_EL_F8_E4M3) abort(); /* no unscaled 4-bit format exists */
        size_t rb = df_wfmt_row_bytes(v->fmt, v->cols);
        df_to_f32(dst, (const char *)v->data + (size_t)r0 * rb, DT[v->fmt.elem], (size_t)n * (size_t)v->cols);
        return;
    }
    if (!df_wfmt_computable(v->fmt) || !v->scale) {
        /* a programming error: loaders refuse what the kernels do not compute */
        fprintf(stderr, "deltafin: decode of weight format %s\n", df_wfmt_name(v->fmt));
        abort();
    }
    df_qdecode_on(df_isa_get(), dst, v, r0, n);
}

void df_qdecode_on(df_isa isa, float *dst, const df_wview *v, int r0, int n) {
#if defined(__x86_64__) || defined(__i386__)
    switch (isa) {
    case DF_ISA_AVX512: df_qdecode_avx512(dst, v, r0, n); return;
    case DF_ISA_AVX2: df_qdecode_avx2(dst, v, r0, n); return;
    default: break;
    }
#else
    (void)isa;
#endif
    df_qdecode_c(dst, v, r0, n);
}
