/* sampler.h - the sampler's library-internal entry points (beyond deltafin.h):
 * for speculative decoding, which must draw from exactly the distribution the
 * plain sampler would, with the same random stream; and the check of a
 * model's logits row before any sampling. */
#ifndef DF_DECODE_SAMPLER_H
#define DF_DECODE_SAMPLER_H
#include "deltafin.h"

#include <stdbool.h>

/* A model's logits row with no finite value (every one NaN or infinite) says
 * the checkpoint holds NaN or Inf where it should not (weights, norms, scales
 * read as shipped): DF_ERR_FORMAT naming the position (the tokens evaluated,
 * n_tokens), instead of a sampler quietly picking id 0 over and over. */
int df_logits_check(const float *logits, int vocab, int n_tokens, df_error *err);
/* The next uniform double in [0, 1) of the sampler's stream (seeded by params.seed). */
double df_sampler_uniform(df_sampler *s);
/* What df_sampler_sample would pick here if `ahead` more tokens were sampled
 * first: the same pipeline drawing with that later uniform, leaving the stream
 * where it is. A drafter that guesses with the uniform the target will use
 * agrees with the target whenever their distributions put that uniform on the
 * same token. */
int32_t df_sampler_sample_at(df_sampler *s, float *logits, int vocab, const int32_t *history,
                             int n_history, int ahead);
/* temperature == 0: df_sampler_sample never touches the random stream. */
bool df_sampler_is_greedy(const df_sampler *s);
#endif
