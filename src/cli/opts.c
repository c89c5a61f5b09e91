/*
 * cli/opts.c - the option parser, the help format and the setters every
 * command's table uses; see opts.h.
 */
#include "cli/opts.h"

#include "deltafin.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define HELP_COL 23 /* where an option's help text starts */

static void verror(const char *fmt, va_list ap) {
    fprintf(stderr, "deltafin: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
}

void cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
}

void cli_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
    exit(CLI_EXIT_BAD);
}

/* ---- setters ------------------------------------------------------------------- */

#define AT(type) ((type *)((char *)dst + o->off))

int cli_set_str(const cli_opt *o, void *dst, const char *v) {
    *AT(const char *) = v;
    return 0;
}

int cli_set_true(const cli_opt *o, void *dst, const char *v) {
    (void)v;
    *AT(bool) = true;
    return 0;
}

int cli_set_false(const cli_opt *o, void *dst, const char *v) {
    (void)v;
    *AT(bool) = false;
    return 0;
}

static int parse_long(const cli_opt *o, const char *v, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < o->lo || x > o->hi) {
        cli_error("%s expects an integer in %ld..%ld, got '%s'", o->name, o->lo, o->hi, v);
        return 1;
    }
    *out = x;
    return 0;
}

int cli_set_int(const cli_opt *o, void *dst, const char *v) {
    long x;
    if (parse_long(o, v, &x)) return 1;
    *AT(int) = (int)x;
    return 0;
}

int cli_set_long(const cli_opt *o, void *dst, const char *v) {
    return parse_long(o, v, AT(long));
}

int cli_set_size(const cli_opt *o, void *dst, const char *v) {
    df_error err;
    if (df_parse_size(v, o->name, AT(uint64_t), &err)) {
        cli_error("%s", err.msg);
        return 1;
    }
    return 0;
}

static int parse_float(const cli_opt *o, const char *v, float *out) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || *end || end == v || !isfinite(x)) {
        cli_error("%s expects a number, got '%s'", o->name, v);
        return 1;
    }
    *out = x;
    return 0;
}

int cli_set_float(const cli_opt *o, void *dst, const char *v) {
    return parse_float(o, v, AT(float));
}

int cli_set_float_if(const cli_opt *o, void *dst, const char *v, bool (*ok)(float), const char *what) {
    float x;
    if (parse_float(o, v, &x)) return 1;
    if (!ok(x)) {
        cli_error("%s expects %s, got '%s'", o->name, what, v);
        return 1;
    }
    *AT(float) = x;
    return 0;
}

static bool positive(float x) { return x > 0; }
static bool nonneg(float x) { return x >= 0; }

int cli_set_positive(const cli_opt *o, void *dst, const char *v) {
    return cli_set_float_if(o, dst, v, positive, "a number above 0");
}

int cli_set_nonneg(const cli_opt *o, void *dst, const char *v) {
    return cli_set_float_if(o, dst, v, nonneg, "a number >= 0");
}

int cli_set_share(const cli_opt *o, void *dst, const char *v) {
    float x;
    if (parse_float(o, v, &x)) return 1;
    if (x <= 0 || x > 1) {
        cli_error("%s expects a number in (0, 1], got '%s'", o->name, v);
        return 1;
    }
    *AT(double) = x;
    return 0;
}

/* ---- parsing --------------------------------------------------------------------- */

/* Whether the space-separated list holds the name (len bytes of it). */
static bool listed(const char *list, const char *name, size_t len) {
    for (const char *p = list; p && *p;) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        if (n == len && !strncmp(p, name, len)) return true;
        p += n;
    }
    return false;
}

static bool accepted(const cli_cmd *cmd, const char *name, size_t len) {
    for (int s = 0; s < 4 && cmd->sections[s]; s++)
        for (const cli_section *sec = cmd->sections[s]; sec->names; sec++)
            if (listed(sec->names, name, len)) return true;
    return false;
}

static const cli_opt *lookup(const cli_cmd *cmd, const char *name, size_t len) {
    for (const cli_opt *o = cmd->table; o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, name, len)) return o;
    return NULL;
}

static int one_option(const cli_cmd *cmd, void *dst, int argc, char **argv, int *i) {
    const char *a = argv[*i], *eq = strchr(a, '=');
    int len = (int)(eq ? (size_t)(eq - a) : strlen(a));
    if (listed(cmd->refused, a, (size_t)len)) {
        cli_error("%.*s %s", len, a, cmd->refused_why);
        return CLI_EXIT_BAD;
    }
    const cli_opt *o = accepted(cmd, a, (size_t)len) ? lookup(cmd, a, (size_t)len) : NULL;
    if (!o) {
        if (listed(cmd->bench_only, a, (size_t)len))
            cli_error("%.*s is for benchmarks and tests only: it is under `%s` (see its --help)", len, a,
                      cmd->bench_where);
        else cli_error("unknown option '%.*s' for this command (see --help)", len, a);
        return CLI_EXIT_BAD;
    }
    if (!o->arg) {
        if (eq) {
            cli_error("%s takes no value", o->name);
            return CLI_EXIT_BAD;
        }
        return o->set(o, dst, NULL) ? CLI_EXIT_BAD : 0;
    }
    const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    if (!v) {
        cli_error("%s needs a value", o->name);
        return CLI_EXIT_BAD;
    }
    /* "--prompt --stats": the value forgotten, the next option taken for it
     * (--opt=VALUE still passes a value that looks like an option) */
    if (!eq && !strncmp(v, "--", 2) && lookup(cmd, v, strcspn(v, "="))) {
        cli_error("%s needs a value (got the option %s; write %s=%s if that is the value)", o->name, v, o->name, v);
        return CLI_EXIT_BAD;
    }
    return o->set(o, dst, v) ? CLI_EXIT_BAD : 0;
}

int cli_parse(const cli_cmd *cmd, void *dst, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_help(cmd, stdout);
            return CLI_HELP;
        }
        int rc;
        if (!strncmp(a, "--", 2) && a[2]) {
            rc = one_option(cmd, dst, argc, argv, &i);
        } else if (a[0] == '-' && a[1]) {
            cli_error("unknown option '%s' for this command (see --help)", a);
            rc = CLI_EXIT_BAD;
        } else if (cmd->positional) {
            rc = cmd->positional(dst, a) ? CLI_EXIT_BAD : 0;
        } else {
            cli_error("unexpected argument '%s' (see --help)", a);
            rc = CLI_EXIT_BAD;
        }
        if (rc) return rc;
    }
    return 0;
}

/* ---- help ------------------------------------------------------------------------- */

static void help_option(FILE *f, const cli_opt *o) {
    char label[96];
    int n = snprintf(label, sizeof label, "  %s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    fputs(label, f);
    fprintf(f, "%*s", n < HELP_COL - 1 ? HELP_COL - n : 2, "");
    for (const char *p = o->help; *p;) {
        size_t k = strcspn(p, "\n");
        fwrite(p, 1, k, f);
        fputc('\n', f);
        p += k;
        if (*p == '\n' && *++p) fprintf(f, "%*s", HELP_COL, "");
    }
}

void cli_help(const cli_cmd *cmd, FILE *f) {
    fputs(cmd->usage, f);
    for (int s = 0; s < 4 && cmd->sections[s]; s++)
        for (const cli_section *sec = cmd->sections[s]; sec->names; sec++) {
            if (sec->title) fprintf(f, "\n%s:\n", sec->title);
            for (const char *p = sec->names; *p;) {
                while (*p == ' ') p++;
                size_t n = strcspn(p, " ");
                const cli_opt *o = n ? lookup(cmd, p, n) : NULL;
                if (o && o->help) help_option(f, o);
                p += n;
            }
        }
    if (cmd->footer) fprintf(f, "\n%s", cmd->footer);
}
