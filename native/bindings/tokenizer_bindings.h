// Registration of the tokenizer bindings into the one nanobind module (see module.cpp).
#pragma once
#include <nanobind/nanobind.h>

void bind_tokenizer(nanobind::module_ &m);
