/*
 * forward.c - df_forward: checks that a batch is well formed (each sequence's
 * rows are its next positions, in order), runs the architecture's forward
 * pass, and advances the sequences once it succeeded (a failed pass leaves
 * them where they were, so the same rows can be evaluated again; a sequence
 * with recurrent state, which the pass may have partly advanced, goes back
 * to its latest kept position, or to the start).
 */
#include "model/forward.h"

#include "model/arch.h"
#include "model/blocks.h"

#include <string.h>

void df_forward_logits(df_fwd *f, const float *x, float *xb, int T, float *logits, bool all_rows) {
    const df_model *m = f->m;
    size_t H = (size_t)m->cfg.hidden_size;
    float eps = (float)m->cfg.rms_norm_eps;
    if (f->n_out > 0) {
        /* the chosen rows side by side, so the LM head is read once for all */
        for (int i = 0; i < f->n_out; i++)
            df_rmsnorm_rows(xb + (size_t)i * H, x + (size_t)f->out_rows[i] * H, m->final_norm, 1, (int)H, eps);
        df_linear(f->pool, logits, xb, &m->lm_head, f->n_out);
        return;
    }
    int first = all_rows ? 0 : T - 1;
    df_rmsnorm_rows(xb, x + (size_t)first * H, m->final_norm, T - first, (int)H, eps);
    df_linear(f->pool, logits, xb, &m->lm_head, T - first);
}

int df_forward(df_fwd *f, const df_batch *b, float *logits, bool all_rows, df_error *err) {
    if (b->n <= 0 || b->n > f->max_rows)
        return df_fail(err, DF_ERR_ARG, "forward pass of %d rows (1..%d)", b->n, f->max_rows);
    for (int i = 0; i < f->n_out; i++)
        if (f->out_rows[i] < 0 || f->out_rows[i] >= b->n || (i && f->out_rows[i] <= f->out_rows[i - 1]))
            return df_fail(err, DF_ERR_ARG, "forward pass: logits row %d of %d rows is out of order",
                           f->out_rows[i], b->n);
    /* A row's position is its sequence's position plus the rows of that
     * sequence before it in the batch. Sequences are few: a quadratic scan. */
    for (int i = 0; i < b->n; i++) {
        int before = 0;
        for (int j = 0; j < i; j++) before += b->seq[j] == b->seq[i];
        if (b->pos[i] != b->seq[i]->pos + before || b->pos[i] >= b->seq[i]->max_ctx)
            return df_fail(err, DF_ERR_ARG, "forward pass: row %d is at position %d, its sequence at %d + %d of %d",
                           i, b->pos[i], b->seq[i]->pos, before, b->seq[i]->max_ctx);
    }
    f->blk = DF_BLK_OTHER, f->blk_t = df_now();
    int rc = f->m->cfg.arch->forward(f, b, logits, all_rows, err);
    df_blk_enter(f, DF_BLK_OTHER); /* the pass's last block is charged */
    if (rc) {
        /* positional states stay; a recurrent one goes back to a kept position */
        for (int i = 0; i < b->n; i++)
            if (!b->seq[i]->positional) df_seq_recover(b->seq[i]);
        return rc;
    }
    for (int i = 0; i < b->n; i++) b->seq[i]->pos++;
    return DF_OK;
}
