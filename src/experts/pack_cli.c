/*
 * pack_cli.c - `deltafin pack`: writes a checkpoint's routed experts into a pack
 * (one --out directory per drive) or verifies an existing pack. Argument
 * parsing and messages only; the work is in pack_write.c and pack_verify.c.
 *
 * Exit codes: 0 success (including "already up to date"), 2 bad input or a
 * failure the message explains, 1 out of memory.
 */
#include "experts/pack.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static const char PACK_HELP[] =
    "usage: deltafin pack --model DIR --out PACKDIR [--out PACKDIR2 ...]\n"
    "       deltafin pack --verify PACKDIR [PACKDIR2 ...]\n"
    "\n"
    "Rewrites the routed experts of the checkpoint in DIR into an expert pack: one\n"
    "4 KiB-aligned record per expert (gate, up, down), read with O_DIRECT at run time.\n"
    "With several --out directories (one per drive) every expert is striped across\n"
    "all of them, so one expert read uses every drive at once.\n"
    "\n"
    "An interrupted pack resumes when the same command is run again. A directory\n"
    "that already holds this model's complete pack is left alone; one holding\n"
    "another model's pack is refused.\n"
    "\n"
    "  --model DIR      Hugging Face checkpoint directory (qwen3_moe)\n"
    "  --out PACKDIR    output directory (created if missing); repeat for striping\n"
    "  --verify         re-read every record of the pack in the given directories\n"
    "                   and check every checksum\n"
    "  --quiet          no progress bar\n"
    "  -h, --help       this text\n";

static int bad(const char *fmt, const char *arg) {
    fprintf(stderr, "deltafin pack: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see deltafin pack --help)\n");
    return 2;
}

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

/* "--flag VALUE" or "--flag=VALUE"; *i advances past what was used. */
static const char *value(int argc, char **argv, int *i, const char *flag) {
    size_t n = strlen(flag);
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (*i + 1 >= argc) return NULL;
    return argv[++*i];
}

static bool is_flag(const char *a, const char *flag) {
    size_t n = strlen(flag);
    return strncmp(a, flag, n) == 0 && (a[n] == 0 || a[n] == '=');
}

int df_pack_main(int argc, char **argv) {
    const char *model = NULL;
    const char **outs = calloc((size_t)argc + 1, sizeof *outs);
    if (!outs) return 1;
    int n_out = 0, rc = 0;
    bool verify = false, quiet = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(PACK_HELP, stdout);
            free(outs);
            return 0;
        } else if (is_flag(a, "--model")) {
            if (!(model = value(argc, argv, &i, "--model"))) rc = bad("%s needs a directory", a);
        } else if (is_flag(a, "--out")) {
            const char *v = value(argc, argv, &i, "--out");
            if (!v) rc = bad("%s needs a directory", a);
            else outs[n_out++] = v;
        } else if (!strcmp(a, "--verify")) {
            verify = true;
        } else if (!strcmp(a, "--quiet")) {
            quiet = true;
        } else if (a[0] == '-' && a[1]) {
            rc = bad("unknown option '%s'", a);
        } else if (verify) {
            outs[n_out++] = a;
        } else {
            rc = bad("unexpected argument '%s'", a);
        }
        if (rc) break;
    }
    if (!rc && n_out == 0)
        rc = bad("%s", verify ? "--verify needs at least one pack directory"
                              : "--model DIR and at least one --out PACKDIR are needed");
    if (!rc && verify && model) rc = bad("%s", "--verify takes pack directories, not --model");
    if (!rc && !verify && !model) rc = bad("%s", "--model DIR is needed");
    if (!rc && n_out > DF_PACK_MAX_STRIPES) rc = bad("at most %s output directories", "64");
    if (rc) {
        free(outs);
        return rc;
    }

    df_error err = {0};
    if (verify) {
        double t0 = df_now();
        df_pack *p = NULL;
        if (df_pack_verify(outs, n_out, &err) || df_pack_open(&p, outs, n_out, NULL, &err)) {
            rc = fail(&err);
        } else {
            uint64_t bytes = 0;
            for (int i = 0; i < df_pack_count(p); i++) bytes += df_pack_at(p, i)->padded;
            printf("pack OK: %d experts, %.1f MB in %d stripe%s, every checksum matches "
                   "(%.1f s)\n", df_pack_count(p), (double)bytes / 1e6, n_out,
                   n_out == 1 ? "" : "s", df_now() - t0);
            df_pack_close(p);
        }
        free(outs);
        return rc;
    }

    df_pack_write_opts o = {0};
    o.progress = !quiet && isatty(2);
    o.log = stderr;
#ifdef DF_TEST_HOOKS
    /* test hooks for the command-line tests (test build only); see df_pack_write_opts */
    o.stop_after_records = (int)env_long("DF_PACK_TEST_STOP_AFTER");
    o.checkpoint_every_records = (int)env_long("DF_PACK_TEST_CHECKPOINT_EVERY");
    o.fail_enospc_after_bytes = (uint64_t)env_long("DF_PACK_TEST_ENOSPC_AFTER");
#endif
    df_pack_write_result res;
    if (df_pack_write(model, outs, n_out, &o, &res, &err)) {
        rc = fail(&err);
    } else if (!res.up_to_date) {
        printf("packed %d experts (%.1f MB) into %d stripe%s in %.1f s%s\n", res.records,
               (double)res.bytes / 1e6, n_out, n_out == 1 ? "" : "s", res.seconds,
               res.resumed_from ? " (resumed)" : "");
    }
    free(outs);
    return rc;
}
