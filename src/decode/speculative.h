/* speculative.h - library-internal hooks of speculative decoding (beyond
 * deltafin.h): a caller-supplied drafter, for tests that need a drafter with a
 * known acceptance (e.g. one that is always wrong). */
#ifndef DF_DECODE_SPECULATIVE_H
#define DF_DECODE_SPECULATIVE_H
#include "deltafin.h"

/* Proposes up to k tokens to follow ctx[0..n_ctx) into out; returns how many.
 * Its distribution counts as one-hot on what it proposes. */
typedef int (*df_spec_draft_fn)(void *user, const int32_t *ctx, int n_ctx, int32_t *out, int k);

/* Replaces the drafter of sp (made with draft "lookup") by fn. */
void df_spec_set_drafter(df_spec *sp, df_spec_draft_fn fn, void *user);
#endif
