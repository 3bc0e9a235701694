// nanobind wrappers of the tokenizer core (pretokenize.h, bpe_encoder.h, word_counter.h,
// bpe_trainer.h): argument checks with ValueError, str -> UTF-8 without copies, GIL released
// around compute, results converted to Python objects after the GIL is back.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdio.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ats/bpe_encoder.h"
#include "ats/bpe_trainer.h"
#include "ats/pretokenize.h"
#include "ats/word_counter.h"
#include "threads_arg.h"
#include "tokenizer_bindings.h"

namespace nb = nanobind;

static ats_pattern parse_pattern(const std::string &name) {
    ats_pattern p;
    if (ats_pattern_from_name(name.c_str(), &p) != 0) {
        throw nb::value_error(
            ("unknown pattern '" + name + "': native code knows 'gpt4' and 'gpt2'").c_str());
    }
    return p;
}

// Name of the argument in errors: "text" for a single text, "texts[i]" for item i of a batch.
static std::string arg_name(Py_ssize_t index) {
    return index < 0 ? std::string("text") : "texts[" + std::to_string(index) + "]";
}

// UTF-8 view of a Python str, cached inside the str object (valid while it lives); a lone
// surrogate, which UTF-8 cannot encode, is a ValueError naming its index.
static std::string_view utf8_view(nb::handle s, Py_ssize_t index) {
    if (!PyUnicode_Check(s.ptr())) {
        std::string what = arg_name(index);
        throw nb::type_error((what + " must be str, not " +
                              std::string(nb::type_name(s.type()).c_str()))
                                 .c_str());
    }
    Py_ssize_t n = 0;
    const char *p = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
    if (p) return std::string_view(p, (size_t)n);
    PyErr_Clear();
    std::string what = arg_name(index);
    Py_ssize_t len = PyUnicode_GetLength(s.ptr());
    for (Py_ssize_t i = 0; i < len; i++) {
        Py_UCS4 c = PyUnicode_ReadChar(s.ptr(), i);
        if (c >= 0xD800 && c <= 0xDFFF) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "%s contains a lone surrogate at index %zd (U+%04X), which UTF-8 cannot "
                     "encode",
                     what.c_str(), i, (unsigned)c);
            throw nb::value_error(msg);
        }
    }
    throw nb::value_error((what + " cannot be encoded as UTF-8").c_str());
}

// UTF-8 views of every str of a sequence; `keep` holds the references while the views are used.
static void utf8_views(nb::handle seq, std::vector<nb::object> &keep,
                       std::vector<const char *> &ptrs, std::vector<size_t> &lens) {
    if (PyUnicode_Check(seq.ptr())) throw nb::type_error("texts must be a list of str, not a str");
    for (nb::handle item : seq) {
        keep.push_back(nb::borrow(item));
        std::string_view v = utf8_view(item, (Py_ssize_t)keep.size() - 1);
        ptrs.push_back(v.data());
        lens.push_back(v.size());
    }
}


// Python ints of the ids 0..n-1, made once per encoder: turning ids into list items is then an
// incref instead of an allocation (this conversion holds the GIL and is a large share of encode).
static const size_t MAX_CACHED_ID = 1 << 20;

static std::vector<nb::object> id_objects(size_t n) {
    std::vector<nb::object> out(std::min(n, MAX_CACHED_ID));
    for (size_t i = 0; i < out.size(); i++) out[i] = nb::int_((int64_t)i);
    return out;
}

static nb::list ids_to_list(const ats_ids &ids, const std::vector<nb::object> &objects) {
    nb::list out = nb::steal<nb::list>(PyList_New((Py_ssize_t)ids.len));
    if (!out.is_valid()) throw nb::python_error();
    for (size_t i = 0; i < ids.len; i++) {
        size_t id = (size_t)ids.data[i];
        PyObject *item = id < objects.size() ? objects[id].inc_ref().ptr() : PyLong_FromSize_t(id);
        if (!item) throw nb::python_error();
        PyList_SetItem(out.ptr(), (Py_ssize_t)i, item);
    }
    return out;
}

static nb::list pretokenize(nb::handle text, const std::string &pattern_name) {
    ats_pattern pattern = parse_pattern(pattern_name);
    std::string_view s = utf8_view(text, -1);
    std::vector<size_t> ends;
    {
        nb::gil_scoped_release release;
        for (size_t pos = 0; pos < s.size();) {
            pos = ats_pretokenize_next(pattern, s.data(), s.size(), pos);
            ends.push_back(pos);
        }
    }
    nb::list out;
    size_t start = 0;
    for (size_t i = 0; i < ends.size(); i++) {
        out.append(nb::str(s.data() + start, ends[i] - start));
        start = ends[i];
    }
    return out;
}

struct BpeEncoder {
    ats_bpe_encoder *enc = nullptr;
    std::vector<nb::object> objects; // Python ints of the ids, see id_objects

    BpeEncoder(const std::vector<int64_t> &byte_ids,
               const std::vector<std::tuple<int64_t, int64_t, int64_t>> &merges,
               const std::string &pattern_name) {
        ats_pattern pattern = parse_pattern(pattern_name);
        if (byte_ids.size() != 256) {
            throw nb::value_error(("byte_ids must hold 256 ids, got " +
                                   std::to_string(byte_ids.size()))
                                      .c_str());
        }
        std::vector<int32_t> bytes(256);
        for (size_t b = 0; b < 256; b++) bytes[b] = checked_id(byte_ids[b], "byte_ids", b);
        std::vector<int32_t> rows(3 * merges.size());
        for (size_t r = 0; r < merges.size(); r++) {
            rows[3 * r] = checked_id(std::get<0>(merges[r]), "merges", r);
            rows[3 * r + 1] = checked_id(std::get<1>(merges[r]), "merges", r);
            rows[3 * r + 2] = checked_id(std::get<2>(merges[r]), "merges", r);
        }
        ats_bpe_encoder_params params = {bytes.data(), rows.data(), merges.size(), pattern};
        char err[256];
        enc = ats_bpe_encoder_init(&params, err, sizeof err);
        if (!enc) throw nb::value_error(err);
        int32_t max_id = 0;
        for (size_t b = 0; b < 256; b++) max_id = std::max(max_id, bytes[b]);
        for (size_t r = 0; r < merges.size(); r++) max_id = std::max(max_id, rows[3 * r + 2]);
        objects = id_objects((size_t)max_id + 1);
    }
    ~BpeEncoder() { ats_bpe_encoder_free(enc); }
    BpeEncoder(const BpeEncoder &) = delete;
    BpeEncoder &operator=(const BpeEncoder &) = delete;

    static int32_t checked_id(int64_t id, const char *where, size_t index) {
        if (id < 0 || id > INT32_MAX) {
            throw nb::value_error((std::string(where) + "[" + std::to_string(index) +
                                   "] holds id " + std::to_string(id) +
                                   ", outside [0, 2**31 - 1]")
                                      .c_str());
        }
        return (int32_t)id;
    }

    nb::list encode(nb::handle text) const {
        std::string_view s = utf8_view(text, -1);
        ats_ids ids = {nullptr, 0, 0};
        {
            nb::gil_scoped_release release;
            ats_bpe_encoder_encode(enc, s.data(), s.size(), &ids);
        }
        nb::list out = ids_to_list(ids, objects);
        ats_ids_free(&ids);
        return out;
    }

    nb::list encode_batch(nb::handle texts, int64_t threads) const {
        int n_threads = thread_count_arg(threads);
        std::vector<nb::object> keep;
        std::vector<const char *> ptrs;
        std::vector<size_t> lens;
        utf8_views(texts, keep, ptrs, lens);
        std::vector<ats_ids> outs(ptrs.size(), ats_ids{nullptr, 0, 0});
        char err[512];
        int rc;
        {
            nb::gil_scoped_release release;
            rc = ats_bpe_encoder_encode_batch(enc, ptrs.data(), lens.data(), ptrs.size(),
                                              n_threads, outs.data(), err, sizeof err);
        }
        if (rc != 0) {
            for (ats_ids &ids : outs) ats_ids_free(&ids);
            throw nb::value_error(err);
        }
        nb::list result;
        for (size_t i = 0; i < outs.size(); i++) {
            result.append(ids_to_list(outs[i], objects));
            ats_ids_free(&outs[i]);
        }
        return result;
    }
};

static nb::list merges_to_list(const std::vector<int32_t> &merges, size_t n) {
    nb::list out;
    for (size_t i = 0; i < n; i++) {
        out.append(nb::make_tuple(nb::int_(merges[2 * i]), nb::int_(merges[2 * i + 1])));
    }
    return out;
}

static void count_pairs(void *ctx, const char *, size_t len, int64_t) {
    if (len > 1) *(size_t *)ctx += len - 1;
}

static nb::list train(const ats_word_counter *wc, int64_t n_merges, int64_t min_frequency) {
    if (n_merges < 0) {
        throw nb::value_error(("n_merges must be >= 0, got " + std::to_string(n_merges)).c_str());
    }
    // no more merges than adjacent pairs in all words: bounds the buffer for any n_merges
    size_t possible = 0;
    ats_word_counter_foreach(wc, count_pairs, &possible);
    size_t n = std::min((size_t)n_merges, possible);
    if (n > (size_t)INT32_MAX - 256) {
        throw nb::value_error("training would create ids beyond 2**31 - 1");
    }
    ats_bpe_train_params params = {n, min_frequency};
    std::vector<int32_t> merges(2 * n);
    size_t done;
    {
        nb::gil_scoped_release release;
        done = ats_bpe_train(wc, &params, merges.data());
    }
    return merges_to_list(merges, done);
}

struct WordCounter {
    ats_word_counter *wc = nullptr;

    explicit WordCounter(const std::string &pattern_name) {
        wc = ats_word_counter_init(parse_pattern(pattern_name));
    }
    ~WordCounter() { ats_word_counter_free(wc); }
    WordCounter(const WordCounter &) = delete;
    WordCounter &operator=(const WordCounter &) = delete;

    void add(nb::handle texts, int64_t threads) {
        int n_threads = thread_count_arg(threads);
        std::vector<nb::object> keep;
        std::vector<const char *> ptrs;
        std::vector<size_t> lens;
        utf8_views(texts, keep, ptrs, lens);
        char err[512];
        int rc;
        {
            nb::gil_scoped_release release;
            rc = ats_word_counter_add(wc, ptrs.data(), lens.data(), ptrs.size(), n_threads, err,
                                      sizeof err);
        }
        if (rc != 0) throw nb::value_error(err);
    }

    void prune(int64_t max_words) {
        if (max_words < 0) {
            throw nb::value_error(
                ("max_words must be >= 0, got " + std::to_string(max_words)).c_str());
        }
        nb::gil_scoped_release release;
        ats_word_counter_prune(wc, (size_t)max_words);
    }

    static void visit(void *ctx, const char *word, size_t len, int64_t count) {
        nb::dict &out = *(nb::dict *)ctx;
        out[nb::bytes(word, len)] = nb::int_(count);
    }

    nb::dict counts() const {
        nb::dict out;
        ats_word_counter_foreach(wc, visit, &out);
        return out;
    }

    size_t size() const { return ats_word_counter_size(wc); }
};

static nb::list train_bpe(nb::dict counts, int64_t n_merges, int64_t min_frequency) {
    WordCounter words("gpt4");
    for (auto kv : counts) {
        if (!PyBytes_Check(kv.first.ptr())) {
            throw nb::type_error(("counts keys must be bytes, got " +
                                  std::string(nb::type_name(kv.first.type()).c_str()))
                                     .c_str());
        }
        nb::bytes word = nb::borrow<nb::bytes>(kv.first);
        int64_t count;
        if (!PyLong_Check(kv.second.ptr()) || !nb::try_cast<int64_t>(kv.second, count) ||
            count < 0) {
            throw nb::value_error(("counts[" + nb::cast<std::string>(nb::repr(kv.first)) + "] = " +
                                   nb::cast<std::string>(nb::repr(kv.second)) +
                                   ": counts must be ints >= 0 (below 2**63)")
                                      .c_str());
        }
        // a word seen zero times holds no pairs, as in the reference trainer
        if (count > 0) {
            ats_word_counter_insert(words.wc, (const char *)word.data(), word.size(), count);
        }
    }
    return train(words.wc, n_merges, min_frequency);
}

void bind_tokenizer(nb::module_ &m) {
    m.def("pretokenize", &pretokenize, nb::arg("text"), nb::arg("pattern"),
          nb::sig("def pretokenize(text: str, pattern: str) -> list[str]"),
          "Split text like regex.findall(PATTERN, text) for the named pattern 'gpt4' or 'gpt2'.");
    nb::class_<BpeEncoder>(m, "BpeEncoder")
        .def(nb::init<const std::vector<int64_t> &,
                      const std::vector<std::tuple<int64_t, int64_t, int64_t>> &,
                      const std::string &>(),
             nb::arg("byte_ids"), nb::arg("merges"), nb::arg("pattern"))
        .def("encode", &BpeEncoder::encode, nb::arg("text"),
             nb::sig("def encode(self, text: str) -> list[int]"))
        .def("encode_batch", &BpeEncoder::encode_batch, nb::arg("texts"), nb::arg("threads") = 0,
             nb::sig("def encode_batch(self, texts: list[str], threads: int = 0) -> "
                     "list[list[int]]"));
    nb::class_<WordCounter>(m, "WordCounter")
        .def(nb::init<const std::string &>(), nb::arg("pattern"))
        .def("add", &WordCounter::add, nb::arg("texts"), nb::arg("threads") = 0,
             nb::sig("def add(self, texts: list[str], threads: int = 0) -> None"))
        .def("prune", &WordCounter::prune, nb::arg("max_words"))
        .def("counts", &WordCounter::counts,
             nb::sig("def counts(self) -> dict[bytes, int]"))
        .def("__len__", &WordCounter::size)
        .def(
            "train",
            [](const WordCounter &self, int64_t n_merges, int64_t min_frequency) {
                return train(self.wc, n_merges, min_frequency);
            },
            nb::arg("n_merges"), nb::arg("min_frequency"),
            nb::sig("def train(self, n_merges: int, min_frequency: int) -> "
                    "list[tuple[int, int]]"));
    m.def("train_bpe", &train_bpe, nb::arg("counts"), nb::arg("n_merges"),
          nb::arg("min_frequency"),
          nb::sig("def train_bpe(counts: dict[bytes, int], n_merges: int, min_frequency: int) "
                  "-> list[tuple[int, int]]"),
          "Learn BPE merges from word counts (byte b has id b; merge i creates id 256 + i).");
}
