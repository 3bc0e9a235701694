// The single nanobind module of ats-native: thin wrappers over the C-style core in include/ats/.
// Each concern registers itself from its own file in bindings/.
#include <nanobind/nanobind.h>

#include "ats/version.h"
#include "model_bindings.h"
#include "tokenizer_bindings.h"

namespace nb = nanobind;

NB_MODULE(_ats_native, m) {
    m.doc() = "ATS native runtime";
    m.def("version", &ats_version, "Version of the native core.");
    bind_tokenizer(m);
    bind_model(m);
    bind_batch(m);
    bind_tokenizer_json(m);
}
