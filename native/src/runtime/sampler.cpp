/* ats_sampler: logit bias and OpenAI presence/frequency penalties, then greedy / temperature /
 * top-k / top-p with a splitmix64 generator (Steele et al. 2014), so a seed fixes the whole stream
 * of draws. Scratch buffers live in the sampler. */
#include "ats/sampler.h"

#include <math.h>
#include <stdio.h>

#include <algorithm>
#include <new>
#include <vector>

#include "argmax.h"

struct ats_sampler {
    ats_sampler_params p;
    int32_t vocab;
    uint64_t state;
    std::vector<float> z;         /* scaled logits */
    std::vector<int32_t> order;   /* ids sorted by logit, descending (top-p) */
    std::vector<float> adjusted;  /* logits + bias - penalties (when any applies) */
    std::vector<int32_t> bias_ids;
    std::vector<float> bias;
    std::vector<int32_t> count;   /* times each id was accepted (penalties) */
    std::vector<int32_t> seen;    /* ids with count > 0, in first-seen order */
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" {

ats_sampler *ats_sampler_init(const ats_sampler_params *p, int32_t vocab_size, char *err,
                              size_t err_cap) {
    const char *bad = nullptr;
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature)) bad = "temperature must be a finite number >= 0 (0 = greedy)";
    else if (p->top_k < 0) bad = "top_k must be >= 0 (0 = off)";
    else if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) bad = "top_p must be in (0, 1] (1 = off)";
    else if (vocab_size < 1) bad = "vocab_size must be >= 1";
    else if (!isfinite(p->presence_penalty)) bad = "presence_penalty must be a finite number";
    else if (!isfinite(p->frequency_penalty)) bad = "frequency_penalty must be a finite number";
    if (bad) {
        if (err && err_cap) snprintf(err, err_cap, "%s", bad);
        return nullptr;
    }
    ats_sampler *s = new (std::nothrow) ats_sampler();
    if (!s) {
        if (err && err_cap) snprintf(err, err_cap, "out of memory");
        return nullptr;
    }
    s->p = *p;
    s->vocab = vocab_size;
    s->state = p->seed;
    return s;
}

void ats_sampler_free(ats_sampler *s) { delete s; }

int ats_sampler_set_logit_bias(ats_sampler *s, const int32_t *ids, const float *bias, int32_t n,
                               char *err, size_t err_cap) {
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->vocab) {
            if (err && err_cap) snprintf(err, err_cap, "logit_bias token id %d is out of range [0, %d)", ids[i], s->vocab);
            return -1;
        }
        if (!isfinite(bias[i])) {
            if (err && err_cap) snprintf(err, err_cap, "logit_bias of token id %d is not a finite number", ids[i]);
            return -1;
        }
    }
    s->bias_ids.assign(ids, ids + n);
    s->bias.assign(bias, bias + n);
    return 0;
}

void ats_sampler_accept(ats_sampler *s, int32_t token) {
    if (token < 0 || token >= s->vocab) return;
    if (s->count.empty()) s->count.assign((size_t)s->vocab, 0);
    if (s->count[(size_t)token]++ == 0) s->seen.push_back(token);
}

/* logits + bias - presence * [count > 0] - frequency * count, or logits itself when nothing
 * applies (OpenAI's penalty definition: platform.openai.com/docs/advanced-usage). */
static const float *adjust(ats_sampler *s, const float *logits) {
    bool penalize = (s->p.presence_penalty != 0.0f || s->p.frequency_penalty != 0.0f) && !s->seen.empty();
    if (s->bias_ids.empty() && !penalize) return logits;
    s->adjusted.assign(logits, logits + s->vocab);
    for (size_t i = 0; i < s->bias_ids.size(); i++) s->adjusted[(size_t)s->bias_ids[i]] += s->bias[i];
    if (penalize) {
        for (int32_t id : s->seen) {
            int32_t c = s->count[(size_t)id];
            s->adjusted[(size_t)id] -= s->p.presence_penalty + s->p.frequency_penalty * (float)c;
        }
    }
    return s->adjusted.data();
}

int32_t ats_sampler_sample(ats_sampler *s, const float *raw_logits) {
    const int32_t V = s->vocab;
    const float *logits = adjust(s, raw_logits);
    if (s->p.temperature == 0.0f) return ats::logits_argmax(logits, V);
    std::vector<float> &z = s->z;
    z.resize((size_t)V);
    for (int32_t i = 0; i < V; i++) z[(size_t)i] = logits[i] / s->p.temperature;
    if (s->p.top_k > 0 && s->p.top_k < V) { /* drop everything below the k-th largest */
        std::vector<float> tmp(z);
        std::nth_element(tmp.begin(), tmp.begin() + (s->p.top_k - 1), tmp.end(), std::greater<float>());
        float kth = tmp[(size_t)(s->p.top_k - 1)];
        for (float &v : z) {
            if (v < kth) v = -INFINITY;
        }
    }
    float mx = *std::max_element(z.begin(), z.end());
    if (s->p.top_p < 1.0f) { /* drop a token when the mass before it already reaches top_p */
        std::vector<int32_t> &order = s->order;
        order.resize((size_t)V);
        for (int32_t i = 0; i < V; i++) order[(size_t)i] = i;
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return z[(size_t)a] > z[(size_t)b]; });
        double total = 0.0;
        for (int32_t i = 0; i < V; i++) total += exp((double)z[(size_t)i] - mx);
        double before = 0.0;
        for (int32_t i = 0; i < V; i++) {
            int32_t id = order[(size_t)i];
            double pi = exp((double)z[(size_t)id] - mx) / total;
            if (before >= s->p.top_p) z[(size_t)id] = -INFINITY;
            before += pi;
        }
    }
    double total = 0.0;
    for (int32_t i = 0; i < V; i++) total += exp((double)z[(size_t)i] - mx);
    double u = (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0) * total;
    double acc = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < V; i++) {
        double e = exp((double)z[(size_t)i] - mx);
        if (e == 0.0) continue;
        last = i;
        acc += e;
        if (u < acc) return i;
    }
    return last;
}

}  // extern "C"

namespace ats {

int32_t logits_argmax(const float *logits, int32_t V) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++) {
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

bool sampler_takes_argmax(const ats_sampler *s) {
    return s->p.temperature == 0.0f && s->bias_ids.empty() && s->p.presence_penalty == 0.0f &&
           s->p.frequency_penalty == 0.0f;
}

}  // namespace ats
