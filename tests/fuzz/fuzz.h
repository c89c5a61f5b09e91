/*
 * fuzz.h - what tests/fuzz/driver.c offers the fuzz targets besides calling
 * LLVMFuzzerTestOneInput (the optional df_fuzz_outcome / df_fuzz_dict hooks are
 * described there).
 */
#ifndef DF_FUZZ_H
#define DF_FUZZ_H

/* A path named `name` in a directory of this process's own, made on first use
 * and removed with everything in it at exit: for loaders that only take paths.
 * The same name gives the same path. */
const char *df_fuzz_scratch(const char *name);

#endif
