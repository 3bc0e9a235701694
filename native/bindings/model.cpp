// nanobind wrappers of the model runtime (include/ats/model.h, batch.h, cpu.h): ids arrive as a
// sequence or a numpy integer array, logits leave as a numpy array owning the C++ buffer (no
// copy), the GIL is released around every compute call, and one lock per model serializes calls
// from several Python threads (the model's thread pool runs one job at a time). generate and
// generate_batch are shims over ats_batch, which owns the prefill / sample / stop loop.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ats/cpu.h"
#include "ats/half.h"
#include "ats/matmul.h"
#include "ats/model.h"
#include "ats/sampler.h"
#include "model_bindings.h"
#include "seed_arg.h"
#include "threads_arg.h"

namespace nb = nanobind;
using namespace nb::literals;

Ids to_ids(nb::handle obj, int32_t vocab, const char *what) {
    nb::module_ np = nb::module_::import_("numpy");
    nb::object arr = np.attr("asarray")(obj);
    std::string kind = nb::cast<std::string>(arr.attr("dtype").attr("kind"));
    int ndim = nb::cast<int>(arr.attr("ndim"));
    int64_t size = nb::cast<int64_t>(arr.attr("size"));
    if (size == 0) throw nb::value_error((std::string(what) + " is empty: need at least one token").c_str());
    if (kind != "i" && kind != "u") {
        throw nb::type_error((std::string(what) + " must hold integers, got dtype " +
                              nb::cast<std::string>(arr.attr("dtype").attr("name")))
                                 .c_str());
    }
    if (ndim != 1 && ndim != 2) {
        throw nb::value_error((std::string(what) + " must be (T,) or (B, T), got " +
                               std::to_string(ndim) + " dimensions")
                                  .c_str());
    }
    nb::object flat = np.attr("ascontiguousarray")(arr, "dtype"_a = np.attr("int64"));
    auto view = nb::cast<nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>>(flat);
    Ids out;
    out.batched = ndim == 2;
    out.n_seq = ndim == 2 ? (int32_t)view.shape(0) : 1;
    out.T = (int32_t)view.shape(ndim - 1);
    out.data.resize((size_t)size);
    const int64_t *p = view.data();
    for (int64_t i = 0; i < size; i++) {
        if (p[i] < 0 || p[i] >= vocab) {
            throw nb::value_error((std::string(what) + ": token id " + std::to_string(p[i]) +
                                   " at index " + std::to_string(i) + " is out of range [0, " +
                                   std::to_string(vocab) + ")")
                                      .c_str());
        }
        out.data[(size_t)i] = (int32_t)p[i];
    }
    return out;
}

namespace {

ats_sampler_params sampling(float temperature, int32_t top_k, float top_p, uint64_t seed) {
    return ats_sampler_params{temperature, top_k, top_p, seed, 0.0f, 0.0f};
}

// Streaming generation over one sequence: a one-slot Batch stepped once per next() (the first
// step prefills the prompt).
struct Generation {
    Batch batch;
    bool done = false;
    int32_t next() {
        if (done) throw nb::stop_iteration();
        int32_t n = batch_step(batch, 0);
        if (n == 0) {
            done = true;
            throw nb::stop_iteration();
        }
        const ats_batch_event &e = batch.events[0];
        done = e.finish != ATS_FINISH_NONE;
        return e.token;
    }
};

std::vector<int32_t> to_list(nb::handle obj) {
    std::vector<int32_t> out;
    for (nb::handle h : obj) out.push_back(nb::cast<int32_t>(h));
    return out;
}

}  // namespace

void bind_model(nb::module_ &m) {
    m.def("cuda_built", []() { return ats_cuda_built() == 1; },
          "True when this build holds the CUDA backend (Model(..., device=\"cuda\")).");
    m.def(
        "cpu_features",
        []() {
            ats_cpu_features f;
            ats_cpu_features_get(&f);
            nb::dict d;
            d["kernels"] = f.kernels;
            d["avx2"] = (bool)f.avx2;
            d["fma"] = (bool)f.fma;
            d["avx512f"] = (bool)f.avx512f;
            d["avx512bw"] = (bool)f.avx512bw;
            d["avx512vl"] = (bool)f.avx512vl;
            d["avx512vnni"] = (bool)f.avx512vnni;
            d["neon"] = (bool)f.neon;
            return d;
        },
        "CPU SIMD features and the kernel set chosen for them (avx512 / avx2 / neon / scalar).");

    m.def("threads_max", &ats_threads_max,
          "The most threads one call (Model, encode_batch, ...) may use: 4 x the hardware threads.");

    m.def(
        "cpu_peak",
        [](const std::string &kind, int64_t threads, double seconds) {
            const int n_threads = thread_count_arg(threads);
            char err[512];
            double rate;
            {
                nb::gil_scoped_release release;
                rate = ats_cpu_peak(kind.c_str(), n_threads, seconds, err, sizeof err);
            }
            if (rate < 0) raise_value_error(err);
            return rate;
        },
        "kind"_a, "threads"_a = 2, "seconds"_a = 0.5,
        "Measured peak multiply-adds per second of this CPU on `threads` threads: kind 'int8' "
        "(int8 dot products: AVX-512 VNNI vpdpbusd, else AVX2) or 'fp32' (FMA), register-only "
        "loops running `seconds` each.");

    m.def(
        "quantized_matmul",
        [](nb::ndarray<nb::numpy, nb::c_contig, nb::device::cpu> codes,
           nb::ndarray<nb::numpy, const float, nb::c_contig, nb::device::cpu> scale,
           nb::ndarray<nb::numpy, const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> x,
           int bits, int group, const std::string &kernels, int64_t threads) {
            if (codes.ndim() != 2) throw nb::value_error("codes must be 2-D (rows, bytes per row)");
            if (bits == 8 && codes.dtype() != nb::dtype<int8_t>()) throw nb::type_error("bits 8: codes must be int8");
            if (bits == 4 && codes.dtype() != nb::dtype<uint8_t>()) throw nb::type_error("bits 4: codes must be uint8");
            int64_t rows = (int64_t)codes.shape(0), cols = (int64_t)x.shape(1), n = (int64_t)x.shape(0);
            int64_t row_bytes = bits == 4 ? cols / 2 : cols;
            if (bits == 4 && cols % 2 != 0) throw nb::value_error("int4: x has an odd number of columns");
            if ((int64_t)codes.shape(1) != row_bytes) {
                throw nb::value_error(("codes have " + std::to_string(codes.shape(1)) +
                                       " bytes per row; x's " + std::to_string(cols) +
                                       " columns need " + std::to_string(row_bytes))
                                          .c_str());
            }
            int64_t per_row = bits == 4 && group > 0 ? cols / group : 1;
            bool group_ok = bits != 4 || (group > 0 && cols % group == 0); /* else the core says why */
            if (group_ok && (int64_t)scale.size() != rows * per_row) {
                throw nb::value_error(("scale has " + std::to_string(scale.size()) +
                                       " values, expected " + std::to_string(rows * per_row))
                                          .c_str());
            }
            std::unique_ptr<float[]> y(new float[(size_t)(n * rows)]);
            ats_matmul_params p{kernels.c_str(), thread_count_arg(threads), bits, group};
            char err[512];
            int rc;
            {
                nb::gil_scoped_release release;
                rc = ats_matmul_quantized(&p, codes.data(), scale.data(), rows, cols, x.data(), n,
                                          y.get(), err, sizeof err);
            }
            if (rc != 0) raise_value_error(err);
            float *data = y.release();
            nb::capsule owner(data, [](void *q) noexcept { delete[] (float *)q; });
            size_t shape[2] = {(size_t)n, (size_t)rows};
            return nb::ndarray<nb::numpy, float>(data, 2, shape, owner);
        },
        "codes"_a, "scale"_a, "x"_a, "bits"_a, "group"_a = 32, "kernels"_a = "auto",
        "threads"_a = 1,
        "x (n, cols) @ W.T for int8 (bits 8: codes int8 (rows, cols), scale (rows,)) or int4 (bits 4: "
        "codes uint8 (rows, cols / 2), scale (rows, cols / group)) weights, through the model "
        "runtime's own matmul path (kernel tests).");

    m.def(
        "half_round",
        [](nb::ndarray<nb::numpy, const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> x,
           const std::string &kernels) {
            const int64_t n = (int64_t)x.shape(0);
            std::unique_ptr<float[]> y(new float[(size_t)std::max<int64_t>(n, 1)]);
            char err[512];
            if (ats_half_round(kernels.c_str(), x.data(), n, y.get(), err, sizeof err) != 0) {
                raise_value_error(err);
            }
            float *data = y.release();
            nb::capsule owner(data, [](void *q) noexcept { delete[] (float *)q; });
            size_t shape[1] = {(size_t)n};
            return nb::ndarray<nb::numpy, float>(data, 1, shape, owner);
        },
        "x"_a, "kernels"_a = "auto",
        "x (float32, 1-D) rounded to half precision and back by the kernel set's conversions, as "
        "keys and values pass through the f16 KV cache (kernel tests).");

    nb::class_<Generation>(m, "Generation", "Iterator over generated token ids (Model.generate).")
        .def("__iter__", [](nb::handle self) { return self; })
        .def("__next__", &Generation::next);

    nb::class_<Model>(m, "Model", "An ATS model directory loaded by the native runtime.")
        .def(
            "__init__",
            [](Model *self, const std::string &path, int64_t threads, const std::string &kernels,
               const std::string &device, const std::string &kv_cache) {
                ats_model_params p{path.c_str(), thread_count_arg(threads), kernels.c_str(),
                                   device.c_str(), kv_cache.c_str()};
                char err[1024];
                ats_model *mm;
                {
                    nb::gil_scoped_release release;
                    mm = ats_model_init(&p, err, sizeof err);
                }
                if (!mm) raise_value_error(err);
                new (self) Model();
                self->m = mm;
            },
            "path"_a, "threads"_a = 0, "kernels"_a = "auto", "device"_a = "cpu",
            "kv_cache"_a = "f32")
        .def_prop_ro("config",
                     [](Model &self) {
                         return nb::module_::import_("json").attr("loads")(
                             ats_model_config_json(self.m));
                     })
        .def_prop_ro("vocab_size", [](Model &self) { return ats_model_vocab_size(self.m); })
        .def_prop_ro("kernels", [](Model &self) { return std::string(ats_model_kernels(self.m)); })
        .def_prop_ro("device", [](Model &self) { return std::string(ats_model_device(self.m)); })
        .def_prop_ro("weight_format",
                     [](Model &self) { return std::string(ats_model_weight_format(self.m)); })
        .def_prop_ro("kv_cache",
                     [](Model &self) { return std::string(ats_model_kv_cache(self.m)); })
        .def(
            "logits",
            [](Model &self, nb::handle ids) {
                int32_t V = ats_model_vocab_size(self.m);
                Ids in = to_ids(ids, V, "ids");
                size_t count = (size_t)in.n_seq * (size_t)in.T * (size_t)V;
                std::unique_ptr<float[]> out(new float[count]);
                char err[512];
                int rc;
                {
                    nb::gil_scoped_release release;
                    std::lock_guard<std::mutex> guard(self.lock);
                    rc = ats_model_logits(self.m, in.data.data(), in.n_seq, in.T, out.get(), err,
                                          sizeof err);
                }
                if (rc != 0) raise_value_error(err);
                float *data = out.release();
                nb::capsule owner(data, [](void *p) noexcept { delete[] (float *)p; });
                if (in.batched) {
                    size_t shape[3] = {(size_t)in.n_seq, (size_t)in.T, (size_t)V};
                    return nb::ndarray<nb::numpy, float>(data, 3, shape, owner);
                }
                size_t shape[2] = {(size_t)in.T, (size_t)V};
                return nb::ndarray<nb::numpy, float>(data, 2, shape, owner);
            },
            "ids"_a, "Float32 logits (T, V) or (B, T, V) of fresh sequences (no cache).")
        .def(
            "generate",
            [](nb::handle self_h, nb::handle ids, int32_t max_new_tokens, float temperature,
               int32_t top_k, float top_p, nb::handle seed_h, nb::handle stop_tokens) {
                const uint64_t seed = seed_arg(seed_h);
                Model &self = nb::cast<Model &>(self_h);
                int32_t V = ats_model_vocab_size(self.m);
                Ids in = to_ids(ids, V, "ids");
                if (in.batched) throw nb::value_error("generate takes one sequence (T,); use generate_batch");
                if (max_new_tokens < 0) throw nb::value_error("max_new_tokens must be >= 0");
                int64_t need = (int64_t)in.T + max_new_tokens;
                if (need > ats_model_max_seq_len(self.m)) {
                    throw nb::value_error(("prompt (" + std::to_string(in.T) + ") + max_new_tokens (" +
                                           std::to_string(max_new_tokens) + ") exceeds max_seq_len " +
                                           std::to_string(ats_model_max_seq_len(self.m)))
                                              .c_str());
                }
                std::unique_ptr<Generation> g(new Generation());
                if (max_new_tokens == 0) {
                    ats_sampler_params sp = sampling(temperature, top_k, top_p, seed);
                    char err[512];
                    ats_sampler *check = ats_sampler_init(&sp, V, err, sizeof err);
                    if (!check) raise_value_error(err);
                    ats_sampler_free(check);
                    g->done = true;
                } else {
                    g->batch = batch_open(self_h, 1, (int32_t)need);
                    batch_start(g->batch, 0, in.data, max_new_tokens, sampling(temperature, top_k, top_p, seed),
                                {}, {}, to_list(stop_tokens), false, 0);
                }
                return nb::cast(g.release(), nb::rv_policy::take_ownership);
            },
            "ids"_a, "max_new_tokens"_a, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f,
            "seed"_a = nb::int_(0), "stop_tokens"_a = nb::tuple(),
            "Iterator of new token ids: prefill, then one decode step per id (KV cache).")
        .def(
            "generate_batch",
            [](nb::handle self_h, nb::handle prompts, int32_t max_new_tokens, float temperature,
               int32_t top_k, float top_p, nb::handle seed_h, nb::handle stop_tokens) {
                const uint64_t seed = seed_arg(seed_h);
                Model &self = nb::cast<Model &>(self_h);
                int32_t V = ats_model_vocab_size(self.m);
                std::vector<std::vector<int32_t>> seqs;
                int32_t longest = 0;
                for (nb::handle p : prompts) {
                    Ids in = to_ids(p, V, "prompt");
                    if (in.batched) throw nb::value_error("generate_batch takes a list of 1-D prompts");
                    seqs.push_back(in.data);
                    longest = std::max(longest, in.T);
                }
                int32_t B = (int32_t)seqs.size();
                if (B == 0) throw nb::value_error("generate_batch needs at least one prompt");
                if (max_new_tokens < 0) throw nb::value_error("max_new_tokens must be >= 0");
                int64_t need = (int64_t)longest + max_new_tokens;
                if (need > ats_model_max_seq_len(self.m)) {
                    throw nb::value_error("longest prompt + max_new_tokens exceeds max_seq_len");
                }
                std::vector<std::vector<int32_t>> out((size_t)B);
                if (max_new_tokens == 0) return out;
                std::vector<int32_t> stops = to_list(stop_tokens);
                Batch batch = batch_open(self_h, B, (int32_t)need);
                for (int32_t b = 0; b < B; b++) {
                    batch_start(batch, b, seqs[(size_t)b], max_new_tokens,
                                sampling(temperature, top_k, top_p, seed + (uint64_t)b /* wraps mod 2**64 */), {}, {}, stops, false, 0);
                }
                for (int32_t n = batch_step(batch, 0); n > 0; n = batch_step(batch, 0)) {
                    for (int32_t i = 0; i < n; i++) {
                        const ats_batch_event &e = batch.events[(size_t)i];
                        out[(size_t)e.slot].push_back(e.token);
                    }
                }
                return out;
            },
            "prompts"_a, "max_new_tokens"_a, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f,
            "seed"_a = nb::int_(0), "stop_tokens"_a = nb::tuple(),
            "New token ids of several prompts generated together (one forward per step).");
}
