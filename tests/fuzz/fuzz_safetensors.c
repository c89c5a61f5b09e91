/*
 * fuzz_safetensors.c - libFuzzer target for df_st_parse (the untrusted
 * safetensors header). Each input is parsed as is and, when it can be, once
 * more with the 8-byte header length recomputed to end at the last '}' so
 * that mutations inside the JSON are not all stopped by a stale length.
 * Whatever parses must satisfy the documented invariants; a violation aborts.
 */
#include "model/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char outcome[2208];

const char *df_fuzz_outcome(void) { return outcome; }

/* Outcome lines are newline-separated: names must not break them. */
static void flatten(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20) *s = '?';
}


static const char *const DICT[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"format\"", "\"pt\"",
    "\"F32\"", "\"F16\"", "\"BF16\"", "\"F64\"", "\"I64\"", "\"I32\"", "\"I16\"", "\"I8\"",
    "\"U8\"", "\"BOOL\"", "\"F8_E4M3\"", "\"F8_E5M2\"", "\"F4\"", "\"U16\"",
    "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}",
    "\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}", "[0,0]", "[1,1,1,1,1,1,1,1,1]",
};

const char *const *df_fuzz_dict(size_t *n) {
    *n = sizeof DICT / sizeof *DICT;
    return DICT;
}

static void check(const uint8_t *data, size_t size, const df_tensor *t, size_t n) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    uint64_t prev_end = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t elems = 1;
        if (t[i].ndim < 0 || t[i].ndim > DF_MAX_DIMS || !t[i].name || t[i].file != 0) abort();
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0) abort();
            elems *= (uint64_t)t[i].shape[d];
        }
        if (elems * df_dtype_size(t[i].dtype) != t[i].nbytes) abort();
        if (t[i].file_offset < 8 + hlen || t[i].file_offset > size ||
            t[i].nbytes > size - t[i].file_offset)
            abort();
        if ((const uint8_t *)t[i].data != data + t[i].file_offset) abort();
        /* sorted by offset and disjoint */
        if (t[i].nbytes) {
            if (t[i].file_offset < prev_end) abort();
            prev_end = t[i].file_offset + t[i].nbytes;
            /* touch both ends: ASan flags any byte outside the input */
            volatile uint8_t x = ((const uint8_t *)t[i].data)[0];
            x = ((const uint8_t *)t[i].data)[t[i].nbytes - 1];
            (void)x;
        }
    }
}

/* Tensor names come from the input and may hold anything, quotes included, so
 * a message about a tensor is reduced to the kind of complaint: the text after
 * "'NAME': " begins with one of the parser's fixed phrasings. */
static const char *const KINDS[] = {
    "entry is not", "unknown key", "missing 'dtype'", "missing 'shape'",
    "missing 'data_offsets'", "dtype is not", "unknown dtype", "shape is not", "shape has",
    "shape[", "element count", "byte size", "data_offsets is not", "negative data_offsets",
    "data_offsets end", "data_offsets span", "data [",
};

static void describe(char *res, size_t cap, int rc, const char *msg) {
    if (strncmp(msg, "f: tensor '", 11) == 0) {
        for (const char *p = strstr(msg + 11, "': "); p; p = strstr(p + 1, "': ")) {
            for (size_t k = 0; k < sizeof KINDS / sizeof *KINDS; k++) {
                if (strncmp(p + 3, KINDS[k], strlen(KINDS[k])) == 0) {
                    snprintf(res, cap, "%d tensor: %s", rc, KINDS[k]);
                    return;
                }
            }
        }
    }
    snprintf(res, cap, "%d %s", rc, msg);
    flatten(res);
}

/* Parses one buffer; describes the result in res (for the driver's guidance). */
static void run(const uint8_t *data, size_t size, char *res, size_t cap) {
    df_tensor *t = NULL;
    size_t n = 0;
    df_error err = {0};
    int rc = df_st_parse(data, size, "f", &t, &n, &err);
    if (rc == DF_OK) {
        check(data, size, t, n);
        snprintf(res, cap, "ok %s", n ? "some" : "none");
        df_st_free_tensors(t, n);
    } else {
        if (t || n || err.code != rc || strncmp(err.msg, "f: ", 3) != 0) abort();
        describe(res, cap, rc, err.msg);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char raw[1100], fixed[1100];
    run(data, size, raw, sizeof raw);
    fixed[0] = 0;
    const uint8_t *end = size >= 10 ? memrchr(data + 8, '}', size - 8) : NULL;
    if (end) {
        uint8_t *copy = malloc(size);
        if (!copy) abort();
        memcpy(copy, data, size);
        uint64_t hlen = (uint64_t)(end - data) - 7;
        for (int i = 0; i < 8; i++) copy[i] = (uint8_t)(hlen >> (8 * i));
        run(copy, size, fixed, sizeof fixed);
        free(copy);
    }
    snprintf(outcome, sizeof outcome, "%s\n%s", raw, fixed);
    return 0;
}
