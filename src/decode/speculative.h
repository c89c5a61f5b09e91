/* speculative.h - library-internal hooks of speculative decoding (beyond
 * deltafin.h): a caller-supplied drafter, for tests that need a drafter with a
 * known acceptance (e.g. one that is always wrong), and df_spec_step in two
 * halves around the target's evaluation, so that df_batchgen can verify
 * several requests' drafts in one df_eval_multi. */
#ifndef DF_DECODE_SPECULATIVE_H
#define DF_DECODE_SPECULATIVE_H
#include "deltafin.h"

/* Proposes up to k tokens to follow ctx[0..n_ctx) into out; returns how many.
 * Its distribution counts as one-hot on what it proposes. */
typedef int (*df_spec_draft_fn)(void *user, const int32_t *ctx, int n_ctx, int32_t *out, int k);

/* Replaces the drafter of sp (made with draft "lookup") by fn. */
void df_spec_set_drafter(df_spec *sp, df_spec_draft_fn fn, void *user);

/* df_spec_step is df_spec_begin, the evaluation of *item's rows (all rows'
 * logits, into sp's buffer), then df_spec_end. Begin drafts (the gate may
 * choose none: item then holds the plain decode row) and fills *item; end
 * rules on the rows (the acceptance of df_spec_step), rolls back the rejected
 * ones and puts the pass's tokens in out (room for the item's rows). Between
 * them sp belongs to that pass: one df_spec serves one session at a time. */
int df_spec_begin(df_spec *sp, df_session *s, df_sampler *smp, const int32_t *hist, int n_hist, int max_out,
                  df_eval_item *item, df_error *err);
int df_spec_end(df_spec *sp, df_session *s, df_sampler *smp, int32_t *out, int *n_out, df_error *err);
#endif
