/* ats_batch (include/ats/batch.h): per-slot request state over one ats_session; the
 * prefill / decode / sample / stop loop of every generation (the Python bindings' generate and
 * the server's scheduler both drive it). */
#include "ats/batch.h"

#include <math.h>

#include <algorithm>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "argmax.h"
#include "forward.h"

namespace {

struct Slot {
    bool busy = false;
    std::vector<int32_t> prompt;
    int32_t fed = 0;      /* prompt tokens already in the cache */
    int32_t produced = 0; /* tokens sampled */
    int32_t last = -1;    /* last sampled token, fed at the next step */
    ats_sampler *sampler = nullptr;
    ats_request_params req{};
    int32_t limit = 0; /* ids below it are drawn (the request's vocab_limit, or V) */
    std::vector<int32_t> stops;
};

void slot_clear(Slot *s) {
    ats_sampler_free(s->sampler);
    s->sampler = nullptr;
    s->busy = false;
    s->prompt.clear();
    s->stops.clear();
    s->fed = s->produced = 0;
    s->last = -1;
}

/* log-softmax of logits at token, and the n most likely ids with theirs (ties: lower id first). */
void logprobs(const float *logits, int32_t V, int32_t token, int32_t n, ats_batch_event *ev,
              std::vector<int32_t> *scratch) {
    float mx = logits[0];
    for (int32_t i = 1; i < V; i++) mx = std::max(mx, logits[i]);
    double total = 0.0;
    for (int32_t i = 0; i < V; i++) total += exp((double)logits[i] - mx);
    double logz = (double)mx + log(total);
    ev->logprob = (float)((double)logits[token] - logz);
    ev->n_top = std::min(n, V);
    if (ev->n_top == 0) return;
    std::vector<int32_t> &order = *scratch;
    order.resize((size_t)V);
    for (int32_t i = 0; i < V; i++) order[(size_t)i] = i;
    std::partial_sort(order.begin(), order.begin() + ev->n_top, order.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int32_t i = 0; i < ev->n_top; i++) {
        ev->top_ids[i] = order[(size_t)i];
        ev->top_logprobs[i] = (float)((double)logits[order[(size_t)i]] - logz);
    }
}

}  // namespace

struct ats_batch {
    ats_model *model;
    ats_session *session;
    int32_t max_len;
    std::vector<Slot> slots;
    std::vector<float> logits; /* (n_slots, V) */
    std::vector<int32_t> tokens; /* (n_slots): a greedy step's ids */
    std::vector<int32_t> scratch;
    ~ats_batch() {
        for (Slot &s : slots) slot_clear(&s);
        ats_session_free(session);
    }
};

using ats::sampler_takes_argmax;
using ats::session_forward_tokens;
using ats::set_err;

extern "C" {

ats_batch *ats_batch_init(ats_model *model, int32_t n_slots, int32_t max_len, char *err,
                          size_t err_cap) {
    try {
        ats_session *session = ats_session_init(model, n_slots, max_len, err, err_cap);
        if (!session) return nullptr;
        std::unique_ptr<ats_batch> b(new ats_batch());
        b->model = model;
        b->session = session;
        b->max_len = max_len;
        b->slots.resize((size_t)n_slots);
        b->logits.assign((size_t)n_slots * (size_t)model->cfg.vocab_size, 0.0f);
        return b.release();
    } catch (const std::bad_alloc &) {
        set_err(err, err_cap, "out of memory allocating a batch");
        return nullptr;
    }
}

void ats_batch_free(ats_batch *b) { delete b; }

int32_t ats_batch_n_slots(const ats_batch *b) { return (int32_t)b->slots.size(); }

int32_t ats_batch_busy(const ats_batch *b, int32_t slot) {
    return slot >= 0 && slot < (int32_t)b->slots.size() && b->slots[(size_t)slot].busy ? 1 : 0;
}

int ats_batch_start(ats_batch *b, int32_t slot, const int32_t *prompt, int32_t n_prompt,
                    const ats_sampler_params *sampling, const int32_t *bias_ids, const float *bias,
                    int32_t n_bias, const ats_request_params *req, char *err, size_t err_cap) {
    const int32_t V = (int32_t)b->model->cfg.vocab_size;
    if (slot < 0 || slot >= (int32_t)b->slots.size()) {
        set_err(err, err_cap, "slot " + std::to_string(slot) + " is out of range [0, " +
                                  std::to_string(b->slots.size()) + ")");
        return -1;
    }
    if (b->slots[(size_t)slot].busy) {
        set_err(err, err_cap, "slot " + std::to_string(slot) + " is busy");
        return -1;
    }
    if (n_prompt < 1) {
        set_err(err, err_cap, "the prompt is empty: need at least one token");
        return -1;
    }
    if (n_prompt >= b->max_len) {
        set_err(err, err_cap, "a prompt of " + std::to_string(n_prompt) + " tokens leaves no room to generate within " +
                                  std::to_string(b->max_len) + " tokens");
        return -1;
    }
    if (req->max_new_tokens < 1 || req->n_stop < 0 || req->logprobs < 0 || req->logprobs > 1 ||
        req->top_logprobs < 0 || req->top_logprobs > ATS_MAX_TOP_LOGPROBS ||
        (req->top_logprobs > 0 && !req->logprobs)) {
        set_err(err, err_cap, "request parameters: need max_new_tokens >= 1, n_stop >= 0, logprobs 0 or 1, "
                              "top_logprobs in [0, 20] (and logprobs 1 when > 0)");
        return -1;
    }
    if (req->vocab_limit < 0 || req->vocab_limit > V) {
        set_err(err, err_cap, "vocab_limit " + std::to_string(req->vocab_limit) + " is out of range [0, " +
                                  std::to_string(V) + "] (0 = the whole vocabulary)");
        return -1;
    }
    const int32_t limit = req->vocab_limit > 0 ? req->vocab_limit : V;
    for (int32_t i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= V) {
            set_err(err, err_cap, "prompt token id " + std::to_string(prompt[i]) + " at position " +
                                      std::to_string(i) + " is out of range [0, " + std::to_string(V) + ")");
            return -1;
        }
    }
    try {
        /* the sampler sees logits[0, limit) only: it never draws an id at or past the limit */
        ats_sampler *sampler = ats_sampler_init(sampling, limit, err, err_cap);
        if (!sampler) return -1;
        if (ats_sampler_set_logit_bias(sampler, bias_ids, bias, n_bias, err, err_cap) != 0) {
            ats_sampler_free(sampler);
            return -1;
        }
        if (ats_session_reset(b->session, slot, err, err_cap) != 0) {
            ats_sampler_free(sampler);
            return -1;
        }
        Slot &s = b->slots[(size_t)slot];
        s.sampler = sampler;
        s.prompt.assign(prompt, prompt + n_prompt);
        s.stops.assign(req->stop_tokens, req->stop_tokens + req->n_stop);
        s.req = *req;
        s.req.stop_tokens = nullptr; /* copied into s.stops */
        s.limit = limit;
        s.busy = true;
        return 0;
    } catch (const std::bad_alloc &) {
        slot_clear(&b->slots[(size_t)slot]);
        set_err(err, err_cap, "out of memory starting a request");
        return -1;
    }
}

void ats_batch_cancel(ats_batch *b, int32_t slot) {
    if (slot >= 0 && slot < (int32_t)b->slots.size()) slot_clear(&b->slots[(size_t)slot]);
}

int ats_batch_step(ats_batch *b, int32_t prefill_budget, ats_batch_event *events, int32_t *n_events,
                   char *err, size_t err_cap) {
    const int32_t n_slots = (int32_t)b->slots.size();
    const int32_t V = (int32_t)b->model->cfg.vocab_size;
    *n_events = 0;
    if (prefill_budget < 0) {
        set_err(err, err_cap, "prefill_budget must be >= 0 (0 = no limit)");
        return -1;
    }
    std::vector<const int32_t *> ids((size_t)n_slots, nullptr);
    std::vector<int32_t> n_new((size_t)n_slots, 0);
    int32_t budget = prefill_budget > 0 ? prefill_budget : INT32_MAX;
    bool any = false;
    for (int32_t i = 0; i < n_slots; i++) {
        Slot &s = b->slots[(size_t)i];
        if (!s.busy) continue;
        int32_t rest = (int32_t)s.prompt.size() - s.fed;
        if (rest > 0) {
            int32_t take = std::min(rest, budget);
            budget -= take;
            ids[(size_t)i] = s.prompt.data() + s.fed;
            n_new[(size_t)i] = take;
        } else {
            ids[(size_t)i] = &s.last;
            n_new[(size_t)i] = 1;
        }
        any = any || n_new[(size_t)i] > 0;
    }
    if (!any) return 0;
    /* every busy slot greedy without logprobs over the whole vocabulary: the forward pass returns
     * the ids (on the GPU only those come back), else the logits for the samplers (a greedy
     * sampler over a vocab_limit takes the first maximum of the row's first limit logits) */
    bool greedy = true;
    for (const Slot &s : b->slots) {
        if (s.busy) greedy = greedy && sampler_takes_argmax(s.sampler) && !s.req.logprobs && s.limit == V;
    }
    std::vector<int32_t> &tokens = b->tokens;
    tokens.assign((size_t)n_slots, -1);
    if (session_forward_tokens(b->session, ids.data(), n_new.data(), greedy ? nullptr : b->logits.data(),
                               nullptr, greedy ? tokens.data() : nullptr, err, err_cap) != 0) {
        return -1;
    }
    try {
        for (int32_t i = 0; i < n_slots; i++) {
            Slot &s = b->slots[(size_t)i];
            if (!s.busy || n_new[(size_t)i] == 0) continue;
            if (s.fed < (int32_t)s.prompt.size()) {
                s.fed += n_new[(size_t)i];
                if (s.fed < (int32_t)s.prompt.size()) continue; /* more prompt to prefill */
            }
            const float *row = b->logits.data() + (size_t)i * (size_t)V;
            ats_batch_event &ev = events[(*n_events)++];
            ev.slot = i;
            ev.token = greedy ? tokens[(size_t)i] : ats_sampler_sample(s.sampler, row);
            ev.logprob = 0.0f;
            ev.n_top = 0;
            if (s.req.logprobs) logprobs(row, s.limit, ev.token, s.req.top_logprobs, &ev, &b->scratch);
            ats_sampler_accept(s.sampler, ev.token);
            s.last = ev.token;
            s.produced++;
            ev.finish = ATS_FINISH_NONE;
            if (std::find(s.stops.begin(), s.stops.end(), ev.token) != s.stops.end()) {
                ev.finish = ATS_FINISH_STOP;
            } else if (s.produced >= s.req.max_new_tokens || ats_session_length(b->session, i) >= b->max_len) {
                ev.finish = ATS_FINISH_LENGTH;
            }
            if (ev.finish != ATS_FINISH_NONE) slot_clear(&s);
        }
        return 0;
    } catch (const std::bad_alloc &) {
        set_err(err, err_cap, "out of memory sampling");
        return -1;
    }
}

}  // extern "C"
