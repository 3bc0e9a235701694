/* A small JSON reader (DOM) for config.json, safetensors headers and tokenizer.json: bounds-checked,
 * depth-limited (JSON_MAX_DEPTH), never reads past `len`; malformed input gives an error message
 * with the byte offset, never a crash. Internal to the runtime (C++), not part of the C API. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <string>
#include <vector>

namespace ats {

const int JSON_MAX_DEPTH = 64;

enum JsonType { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct JsonValue {
    JsonType type = JSON_NULL;
    bool boolean = false;          /* JSON_BOOL */
    double number = 0.0;           /* JSON_NUMBER */
    bool is_int = false;           /* JSON_NUMBER written as an integer that fits int64 */
    int64_t integer = 0;           /* the integer when is_int */
    std::string str;               /* JSON_STRING (UTF-8) */
    std::vector<JsonValue> items;  /* JSON_ARRAY elements, or JSON_OBJECT values */
    std::vector<std::string> keys; /* JSON_OBJECT keys, keys[i] names items[i] */

    /* The value of `key` in an object (first occurrence), NULL if absent or not an object. */
    const JsonValue *get(const char *key) const;
};

/* Parses text[0, len) as one JSON document into *out. Returns false and sets *err on failure. */
bool json_parse(const char *text, size_t len, JsonValue *out, std::string *err);

/* Name of a JSON type for error messages ("object", "string", ...). */
const char *json_type_name(JsonType t);

}  // namespace ats
