// Registration of the model runtime bindings (Model, generation iterator, cpu_features) and the
// tokenizer.json Tokenizer into the one nanobind module (see module.cpp).
#pragma once
#include <nanobind/nanobind.h>

#include <string.h>

// Raises ValueError(msg). Messages may quote bytes of a corrupt file that are not valid UTF-8:
// those are shown as backslash escapes instead of failing the conversion.
[[noreturn]] inline void raise_value_error(const char *msg) {
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "backslashreplace");
    if (text) {
        PyErr_SetObject(PyExc_ValueError, text);
        Py_DECREF(text);
    }
    throw nanobind::python_error();
}

void bind_model(nanobind::module_ &m);
void bind_tokenizer_json(nanobind::module_ &m);
