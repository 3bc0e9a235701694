// Registration of the model runtime bindings (Model, generation iterator, Batch, cpu_features)
// and the tokenizer.json Tokenizer into the one nanobind module (see module.cpp).
#pragma once
#include <nanobind/nanobind.h>

#include <string.h>

#include <mutex>
#include <utility>
#include <vector>

#include "ats/batch.h"
#include "ats/model.h"

// A loaded model; one lock serializes compute calls from several Python threads (the model's
// thread pool runs one job at a time).
struct Model {
    ats_model *m = nullptr;
    std::mutex lock;
    ~Model() { ats_model_free(m); }
};

// ids (a sequence or numpy integer array) as (n_seq, T) int32 ids checked against the vocabulary.
struct Ids {
    int32_t n_seq = 0, T = 0;
    bool batched = false;
    std::vector<int32_t> data;
};
Ids to_ids(nanobind::handle obj, int32_t vocab, const char *what);

// An ats_batch owned by Python, keeping its Model alive.
struct Batch {
    nanobind::object owner;
    Model *model = nullptr;
    ats_batch *b = nullptr;
    int32_t max_len = 0;
    std::vector<ats_batch_event> events;
    Batch() = default;
    Batch(Batch &&o) noexcept
        : owner(std::move(o.owner)), model(o.model), b(o.b), max_len(o.max_len), events(std::move(o.events)) {
        o.b = nullptr;
    }
    Batch(const Batch &) = delete;
    Batch &operator=(const Batch &) = delete;
    Batch &operator=(Batch &&o) noexcept {
        std::swap(owner, o.owner);
        std::swap(model, o.model);
        std::swap(b, o.b);
        std::swap(max_len, o.max_len);
        std::swap(events, o.events);
        return *this;
    }
    ~Batch() { ats_batch_free(b); }
};
// A batch of n_slots sequences of up to max_len tokens over the Model behind model_h; raises
// ValueError with the core's message.
Batch batch_open(nanobind::handle model_h, int32_t n_slots, int32_t max_len);
// Starts a request (ats_batch_start) in slot; raises ValueError with the core's message.
void batch_start(Batch &self, int32_t slot, const std::vector<int32_t> &prompt, int32_t max_new_tokens,
                 const ats_sampler_params &sp, const std::vector<int32_t> &bias_ids,
                 const std::vector<float> &bias, const std::vector<int32_t> &stops, bool logprobs,
                 int32_t top_logprobs, int32_t vocab_limit = 0);
// One ats_batch_step with the GIL released and the model locked; returns the number of events,
// which land in self.events. First, with the GIL already released, one byte is written to each
// of wake_fds (a full pipe counts as woken); an fd that cannot be written raises ValueError and
// nothing is stepped.
int32_t batch_step(Batch &self, int32_t prefill_budget, const std::vector<int> &wake_fds = {});

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
void bind_batch(nanobind::module_ &m);
void bind_tokenizer_json(nanobind::module_ &m);
