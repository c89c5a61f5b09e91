/*
 * util/json_text.h - jansson's parse errors worded for users: its message for
 * a \u0000 in a string names the flag that would allow it (JSON_ALLOW_NUL),
 * which means nothing to a client.
 */
#ifndef DF_UTIL_JSON_TEXT_H
#define DF_UTIL_JSON_TEXT_H
#include <jansson.h>

static inline const char *df_json_error_text(const json_error_t *je) {
    return json_error_code(je) == json_error_null_character ? "\\u0000 (a NUL character) is not allowed in a string"
                                                            : je->text;
}

#endif
