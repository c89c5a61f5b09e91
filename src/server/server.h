/*
 * server.h - `deltafin serve`: an OpenAI-compatible HTTP server over the public
 * API (deltafin.h). See docs/server.md.
 */
#ifndef DF_SERVER_H
#define DF_SERVER_H

/* argv holds the options after "serve"; returns the process exit code. */
int df_serve_main(int argc, char **argv);

#endif
