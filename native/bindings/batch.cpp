// nanobind wrapper of ats_batch (include/ats/batch.h): continuous batching for a server's
// scheduler thread. Events leave as plain tuples; the GIL is released around every step.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model_bindings.h"
#include "seed_arg.h"

namespace nb = nanobind;
using namespace nb::literals;

Batch batch_open(nb::handle model_h, int32_t n_slots, int32_t max_len) {
    Model &model = nb::cast<Model &>(model_h);
    char err[512];
    ats_batch *b = ats_batch_init(model.m, n_slots, max_len, err, sizeof err);
    if (!b) raise_value_error(err);
    Batch out;
    out.owner = nb::borrow(model_h);
    out.model = &model;
    out.b = b;
    out.max_len = max_len;
    out.events.resize((size_t)n_slots);
    return out;
}

void batch_start(Batch &self, int32_t slot, const std::vector<int32_t> &prompt, int32_t max_new_tokens,
                 const ats_sampler_params &sp, const std::vector<int32_t> &bias_ids,
                 const std::vector<float> &bias, const std::vector<int32_t> &stops, bool logprobs,
                 int32_t top_logprobs, int32_t vocab_limit) {
    ats_request_params rp{max_new_tokens, stops.data(), (int32_t)stops.size(), logprobs ? 1 : 0,
                          top_logprobs, vocab_limit};
    char err[512];
    int rc = ats_batch_start(self.b, slot, prompt.data(), (int32_t)prompt.size(), &sp, bias_ids.data(),
                             bias.data(), (int32_t)bias_ids.size(), &rp, err, sizeof err);
    if (rc != 0) raise_value_error(err);
}

/* One byte to fd; true when written or when the pipe is full (a wake-up is already pending),
 * else false with errno set. */
static bool wake(int fd) {
    const char byte = 0;
    while (write(fd, &byte, 1) < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    return true;
}

int32_t batch_step(Batch &self, int32_t prefill_budget, const std::vector<int> &wake_fds) {
    char err[512];
    int32_t n = 0;
    int rc = 0;
    {
        nb::gil_scoped_release release;
        /* the wake-ups go out without the GIL: the thread they wake (a server's event loop) takes
         * the GIL at once, and this thread starts stepping without waiting to get it back */
        for (int fd : wake_fds) {
            if (!wake(fd)) {
                snprintf(err, sizeof err, "wake_fds: cannot write to fd %d: %s", fd, strerror(errno));
                rc = -1;
                break;
            }
        }
        if (rc == 0) {
            std::lock_guard<std::mutex> guard(self.model->lock);
            rc = ats_batch_step(self.b, prefill_budget, self.events.data(), &n, err, sizeof err);
        }
    }
    if (rc != 0) raise_value_error(err);
    return n;
}

namespace {

using Event = std::tuple<int32_t, int32_t, int32_t, float, std::vector<std::pair<int32_t, float>>>;

}  // namespace

void bind_batch(nb::module_ &m) {
    nb::class_<Batch>(m, "Batch",
                      "Continuous batching over one KV cache of n_slots sequences (ats_batch): start "
                      "requests in free slots, step them all with one forward pass, cancel any.")
        .def(
            "__init__",
            [](Batch *self, nb::handle model, int32_t n_slots, int32_t max_len) {
                Batch opened = batch_open(model, n_slots, max_len);
                new (self) Batch(std::move(opened));
            },
            "model"_a, "n_slots"_a, "max_len"_a)
        .def_prop_ro("n_slots", [](Batch &self) { return ats_batch_n_slots(self.b); })
        .def_prop_ro("max_len", [](Batch &self) { return self.max_len; })
        .def("busy", [](Batch &self, int32_t slot) { return ats_batch_busy(self.b, slot) != 0; }, "slot"_a)
        .def(
            "start",
            [](Batch &self, int32_t slot, nb::handle prompt, int32_t max_new_tokens, float temperature,
               int32_t top_k, float top_p, nb::handle seed_h, float presence_penalty,
               float frequency_penalty, nb::dict logit_bias, const std::vector<int32_t> &stop_tokens,
               bool logprobs, int32_t top_logprobs, int32_t vocab_limit) {
                Ids in = to_ids(prompt, ats_model_vocab_size(self.model->m), "prompt");
                if (in.batched) throw nb::value_error("start takes one prompt (T,)");
                std::vector<int32_t> bias_ids;
                std::vector<float> bias;
                for (auto [k, v] : logit_bias) {
                    bias_ids.push_back(nb::cast<int32_t>(k));
                    bias.push_back(nb::cast<float>(v));
                }
                ats_sampler_params sp{temperature, top_k, top_p, seed_arg(seed_h), presence_penalty,
                                      frequency_penalty};
                batch_start(self, slot, in.data, max_new_tokens, sp, bias_ids, bias, stop_tokens, logprobs,
                            top_logprobs, vocab_limit);
            },
            "slot"_a, "prompt"_a, "max_new_tokens"_a, "temperature"_a = 0.0f, "top_k"_a = 0,
            "top_p"_a = 1.0f, "seed"_a = nb::int_(0), "presence_penalty"_a = 0.0f, "frequency_penalty"_a = 0.0f,
            "logit_bias"_a = nb::dict(), "stop_tokens"_a = std::vector<int32_t>(), "logprobs"_a = false,
            "top_logprobs"_a = 0, "vocab_limit"_a = 0,
            "Starts a request in a free slot (ValueError naming the problem otherwise). vocab_limit "
            "N > 0: only ids below N are drawn, argmaxed and in logprobs (a model vocabulary padded "
            "past the tokenizer's N ids); 0 = the whole vocabulary.")
        .def(
            "step",
            [](Batch &self, int32_t prefill_budget, const std::vector<int> &wake_fds) {
                int32_t n = batch_step(self, prefill_budget, wake_fds);
                std::vector<Event> out;
                out.reserve((size_t)n);
                for (int32_t i = 0; i < n; i++) {
                    const ats_batch_event &e = self.events[(size_t)i];
                    std::vector<std::pair<int32_t, float>> top;
                    for (int32_t j = 0; j < e.n_top; j++) top.emplace_back(e.top_ids[j], e.top_logprobs[j]);
                    out.emplace_back(e.slot, e.token, e.finish, e.logprob, std::move(top));
                }
                return out;
            },
            "prefill_budget"_a = 0, "wake_fds"_a = std::vector<int>(),
            "One forward pass over every busy slot -> [(slot, token, finish, logprob, [(id, "
            "logprob), ...])]; finish 0 = running, 1 = stop token, 2 = length (the slot is free "
            "again). prefill_budget caps the prompt tokens of this step (0 = no limit). First, with "
            "the GIL released, one byte goes to each fd of wake_fds (a full pipe counts as woken; "
            "ValueError and no step when one cannot be written).")
        .def("cancel", [](Batch &self, int32_t slot) { ats_batch_cancel(self.b, slot); }, "slot"_a,
             "Ends the request in slot and frees it.");
    m.attr("FINISH_NONE") = (int)ATS_FINISH_NONE;
    m.attr("FINISH_STOP") = (int)ATS_FINISH_STOP;
    m.attr("FINISH_LENGTH") = (int)ATS_FINISH_LENGTH;
    m.attr("MAX_TOP_LOGPROBS") = (int)ATS_MAX_TOP_LOGPROBS;
}
