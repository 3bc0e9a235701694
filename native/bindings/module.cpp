// The single nanobind module of ats-native: thin wrappers over the C-style core in include/ats/.
#include <nanobind/nanobind.h>

#include "ats/version.h"

namespace nb = nanobind;

NB_MODULE(_ats_native, m) {
    m.doc() = "ATS native runtime";
    m.def("version", &ats_version, "Version of the native core.");
}
