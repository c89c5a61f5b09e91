/* gate.h - the economics gate of speculative decoding (library-internal): from
 * the measured cost of plain steps, verify passes and drafting, and the
 * acceptance seen so far, how many tokens the next pass should draft (0: a
 * plain step). Pure arithmetic on wall times, so tests can drive it with
 * synthetic costs; speculative.c feeds it the real ones. */
#ifndef DF_DECODE_GATE_H
#define DF_DECODE_GATE_H
#include <stdbool.h>
#include <stdint.h>

#define GATE_K_MAX 16

typedef struct spec_gate {
    int k_max, fixed;
    bool model;        /* the drafter is a model: it must catch up before a probe */
    double a;          /* per-token acceptance estimate: a_num / a_den */
    double a_num, a_den;
    double t_plain;    /* running mean of plain steps, seconds */
    double t_plain_min; /* the fastest plain step seen (0: none yet) */
    double t_draft;    /* drafter seconds per drafted token (running mean; < 0: unknown) */
    double t_catchup;  /* draft model seconds per caught-up token (< 0: unknown) */
    int n_draft_obs;   /* drafting measured in passes */
    /* Verify pass cost by depth, in plain steps (running means), and how many
     * passes measured it; the fit through them: 1 + f + g k. */
    double vc[GATE_K_MAX + 1];
    int vn[GATE_K_MAX + 1];
    double f, g;
    bool suspect[GATE_K_MAX + 1], suspect_plain, suspect_draft; /* the last one was left out */
    int n_plain;
    int off_left, backoff, on_passes, since_plain;
    bool probing;      /* the next verify pass starts a probe */
    int probe_passes;  /* verify passes in the current probe */
    double probe_s;    /* their wall time, catch-up included */
    int probe_tokens;  /* tokens they produced */
    int left;          /* tokens still wanted, as of the last gate_depth */
    uint64_t switched_off, probes_declined, explored;
} spec_gate;

/* t_draft, t_catchup: a draft model's costs measured at load (< 0: unknown). */
void gate_init(spec_gate *g, int k_max, int fixed, bool model, double t_draft, double t_catchup);

/* Depth for the next pass: 0 = a plain step. lag: history tokens the draft
 * model has not seen yet; left: tokens still wanted. */
int gate_depth(spec_gate *g, int lag, int left);

/* A plain step took secs. */
void gate_plain(spec_gate *g, double secs);

/* A verify pass drafted `drafted` tokens of which `accepted` were accepted.
 * verify_s: the target's evaluation and the ruling; draft_s: the drafting
 * without the draft model's catch-up (what drafting costs in the steady
 * state); total_s: the whole pass (what it cost). */
void gate_verify(spec_gate *g, int drafted, int accepted, double verify_s, double draft_s, double total_s);

/* The draft model caught up `tokens` tokens at `per` seconds each. */
void gate_catchup(spec_gate *g, double per);

/* For reports: the depth the gate would draft at now (0: off), and what one
 * drafted token costs there in plain steps (verify row and drafting). */
int gate_current_depth(const spec_gate *g);
double gate_row_cost(const spec_gate *g);
#endif
