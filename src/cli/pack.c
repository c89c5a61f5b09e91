/*
 * cli/pack.c - `deltafin pack`: writes a checkpoint's routed experts into a
 * pack (one --out directory per drive) or verifies an existing pack. Options
 * and messages only; the work is in experts/pack_write.c and pack_verify.c.
 *
 * Exit codes: 0 success (including "already up to date"), 2 bad input or a
 * failure the message explains, 1 out of memory.
 */
#include "cli/cli.h"
#include "experts/pack.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct pack_args {
    const char *model;
    const char **outs; /* --out directories, or --verify's */
    int n_out;
    bool verify, quiet, stray;
    const char *first_stray;
} pack_args;

static int add_out(const cli_opt *o, void *dst, const char *v) {
    (void)o;
    pack_args *p = dst;
    p->outs[p->n_out++] = v;
    return 0;
}

/* --verify's directories; anything else that is not an option is an error,
 * said once every option is read (--verify may come later). */
static int positional(void *dst, const char *arg) {
    pack_args *p = dst;
    if (!p->stray) p->first_stray = arg;
    p->stray = true;
    p->outs[p->n_out++] = arg;
    return 0;
}

static const cli_opt PACK_OPTS[] = {
    {"--model", "DIR", "Hugging Face checkpoint directory (a model with routed experts)", cli_set_str,
     CLI_FIELD(pack_args, model), 0, 0},
    {"--out", "PACKDIR", "output directory (created if missing); repeat for striping", add_out, 0, 0, 0},
    {"--verify", NULL, "re-read every record of the pack in the given directories\n"
     "and check every checksum", cli_set_true, CLI_FIELD(pack_args, verify), 0, 0},
    {"--quiet", NULL, "no progress bar", cli_set_true, CLI_FIELD(pack_args, quiet), 0, 0},
    {0},
};

static const cli_section PACK_SECTIONS[] = {{NULL, "--model --out --verify --quiet"}, {0}};

static const cli_cmd PACK_CMD = {
    .usage = "usage: deltafin pack --model DIR --out PACKDIR [--out PACKDIR2 ...]\n"
             "       deltafin pack --verify PACKDIR [PACKDIR2 ...]\n"
             "\n"
             "Rewrites the routed experts of the checkpoint in DIR into an expert pack: one\n"
             "4 KiB-aligned record per expert (each of its weights), read with O_DIRECT at run\n"
             "time. With several --out directories (one per drive) every expert is striped\n"
             "across all of them, so one expert read uses every drive at once.\n"
             "\n"
             "An interrupted pack resumes when the same command is run again. A directory\n"
             "that already holds this model's complete pack is left alone; one holding\n"
             "another model's pack is refused.\n",
    .table = PACK_OPTS, .sections = {PACK_SECTIONS}, .positional = positional};

static int fail(const df_error *e) {
    fprintf(stderr, "deltafin pack: %s\n", e->msg);
    return e->code == DF_ERR_NOMEM ? 1 : 2;
}

#ifdef DF_TEST_HOOKS
static long env_long(const char *name) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : 0;
}
#endif

/* What the options say together; nonzero: said why. */
static int check(const pack_args *p) {
    const char *why = NULL;
    if (p->stray && !p->verify) {
        cli_error("unexpected argument '%s' (see deltafin pack --help)", p->first_stray);
        return CLI_EXIT_BAD;
    }
    if (p->n_out == 0)
        why = p->verify ? "--verify needs at least one pack directory"
                        : "--model DIR and at least one --out PACKDIR are needed";
    else if (p->verify && p->model) why = "--verify takes pack directories, not --model";
    else if (!p->verify && !p->model) why = "--model DIR is needed";
    else if (p->n_out > DF_PACK_MAX_STRIPES) why = "at most 64 output directories";
    if (why) cli_error("%s (see deltafin pack --help)", why);
    return why ? CLI_EXIT_BAD : 0;
}

static int verify(const pack_args *p) {
    df_error err = {0};
    double t0 = df_now();
    df_pack *pk = NULL;
    if (df_pack_verify(p->outs, p->n_out, &err) || df_pack_open(&pk, p->outs, p->n_out, NULL, &err))
        return fail(&err);
    uint64_t bytes = 0;
    for (int i = 0; i < df_pack_count(pk); i++) bytes += df_pack_at(pk, i)->padded;
    printf("pack OK: %d experts, %.1f MB in %d stripe%s, every checksum matches (%.1f s)\n", df_pack_count(pk),
           (double)bytes / 1e6, p->n_out, p->n_out == 1 ? "" : "s", df_now() - t0);
    df_pack_close(pk);
    return 0;
}

static int write_pack(const pack_args *p) {
    df_pack_write_opts o = {0};
    o.progress = !p->quiet && isatty(2);
    o.log = stderr;
#ifdef DF_TEST_HOOKS
    /* test hooks for the command-line tests (test build only); see df_pack_write_opts */
    o.stop_after_records = (int)env_long("DF_PACK_TEST_STOP_AFTER");
    o.checkpoint_every_records = (int)env_long("DF_PACK_TEST_CHECKPOINT_EVERY");
    o.fail_enospc_after_bytes = (uint64_t)env_long("DF_PACK_TEST_ENOSPC_AFTER");
#endif
    df_pack_write_result res;
    df_error err = {0};
    if (df_pack_write(p->model, p->outs, p->n_out, &o, &res, &err)) return fail(&err);
    if (!res.up_to_date)
        printf("packed %d experts (%.1f MB) into %d stripe%s in %.1f s%s\n", res.records, (double)res.bytes / 1e6,
               p->n_out, p->n_out == 1 ? "" : "s", res.seconds, res.resumed_from ? " (resumed)" : "");
    return 0;
}

int cli_pack_main(int argc, char **argv) {
    pack_args p = {0};
    p.outs = calloc((size_t)argc + 1, sizeof *p.outs);
    if (!p.outs) return 1;
    int rc = cli_parse(&PACK_CMD, &p, argc, argv);
    if (rc == CLI_HELP) rc = 0;
    else if (!rc && !(rc = check(&p))) rc = p.verify ? verify(&p) : write_pack(&p);
    free(p.outs);
    return rc;
}
