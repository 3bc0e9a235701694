// A sampling seed from Python: any int 0 .. 2**64 - 1 (the generator's whole seed space); a
// negative or larger one, or a non-int, is a ValueError naming it (not nanobind's TypeError).
#pragma once
#include <nanobind/nanobind.h>
#include <stdint.h>

#include <string>

inline uint64_t seed_arg(nanobind::handle seed) {
    const std::string bad = "seed = " + std::string(nanobind::str(nanobind::repr(seed)).c_str()) +
                            ": expected an integer 0 to 2**64 - 1";
    if (!PyLong_Check(seed.ptr()) || PyBool_Check(seed.ptr())) throw nanobind::value_error(bad.c_str());
    unsigned long long v = PyLong_AsUnsignedLongLong(seed.ptr());
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        throw nanobind::value_error(bad.c_str());
    }
    return (uint64_t)v;
}
