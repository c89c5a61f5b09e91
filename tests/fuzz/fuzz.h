/*
 * fuzz.h - what tests/fuzz/driver.c offers the fuzz targets besides calling
 * LLVMFuzzerTestOneInput (the optional df_fuzz_outcome / df_fuzz_dict hooks are
 * described there).
 */
#ifndef DF_FUZZ_H
#define DF_FUZZ_H

#include <stddef.h>

/* A path named `name` in a directory of this process's own, made on first use
 * and removed with everything in it at exit: for loaders that only take paths.
 * The same name gives the same path. */
const char *df_fuzz_scratch(const char *name);

/* An outcome (df_fuzz_outcome) from an error message: `head`, then msg[0, len)
 * with what varies between inputs of the same kind taken out: every number
 * (decimal, hex, with exponent) becomes one '#', control characters '#', and
 * the span from the first to the last `quote` character (0: none) is left out;
 * at most 60 characters in all, and never more than cap - 1. */
void df_fuzz_describe(char *out, size_t cap, const char *head, const char *msg, size_t len,
                      char quote);

#endif
