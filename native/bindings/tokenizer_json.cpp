// nanobind wrapper of the tokenizer.json tokenizer (include/ats/tokenizer_json.h): encode str ->
// list[int] (GIL released while encoding), decode ids -> bytes (unknown ids raise ValueError).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "ats/tokenizer_json.h"
#include "model_bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

struct Tokenizer {
    ats_tokenizer *t = nullptr;
    ~Tokenizer() { ats_tokenizer_free(t); }
};

}  // namespace

void bind_tokenizer_json(nb::module_ &m) {
    nb::class_<Tokenizer>(m, "Tokenizer", "Byte-level BPE tokenizer read from a tokenizer.json.")
        .def(
            "__init__",
            [](Tokenizer *self, const std::string &path) {
                char err[1024];
                ats_tokenizer *t = ats_tokenizer_init(path.c_str(), err, sizeof err);
                if (!t) raise_value_error(err);
                new (self) Tokenizer();
                self->t = t;
            },
            "path"_a)
        .def_prop_ro("vocab_size", [](Tokenizer &self) { return ats_tokenizer_vocab_size(self.t); })
        .def(
            "encode",
            [](Tokenizer &self, nb::handle text) {
                if (!PyUnicode_Check(text.ptr())) throw nb::type_error("text must be str");
                Py_ssize_t n = 0;
                const char *p = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
                if (!p) {
                    PyErr_Clear();
                    throw nb::value_error("text contains a lone surrogate, which UTF-8 cannot encode");
                }
                ats_ids ids = {nullptr, 0, 0};
                {
                    nb::gil_scoped_release release;
                    ats_tokenizer_encode(self.t, p, (size_t)n, &ids);
                }
                std::vector<int32_t> out(ids.data, ids.data + ids.len);
                ats_ids_free(&ids);
                return out;
            },
            "text"_a, "Token ids of text (special tokens are not matched: encode_ordinary).")
        .def(
            "decode",
            [](Tokenizer &self, const std::vector<int64_t> &ids) {
                std::string out;
                for (size_t i = 0; i < ids.size(); i++) {
                    size_t len = 0;
                    const char *b = ids[i] < 0 || ids[i] > INT32_MAX
                                        ? nullptr
                                        : ats_tokenizer_id_bytes(self.t, (int32_t)ids[i], &len);
                    if (!b) {
                        throw nb::value_error(("token id " + std::to_string(ids[i]) + " at index " +
                                               std::to_string(i) + " is not in the vocabulary")
                                                  .c_str());
                    }
                    out.append(b, len);
                }
                return nb::bytes(out.data(), out.size());
            },
            "ids"_a, "The bytes the ids stand for.");
}
