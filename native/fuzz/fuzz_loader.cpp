// libFuzzer harness for everything that reads untrusted model files. The first input byte picks the
// target, the rest is the file: 0 safetensors header (st_parse; accepted images have every tensor
// byte read, so AddressSanitizer catches a validated offset outside the buffer), 1 JSON
// (json_parse), 2 config.json (config_parse), 3 a whole model directory load (ats_model_init on a
// fixed tiny config.json with the input as model.safetensors, then a forward pass when it loads),
// 4 tokenizer.json (ats_tokenizer_init, then an encode). Build and run: see README.md.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "ats/model.h"
#include "ats/tokenizer_json.h"
#include "json.h"
#include "model_impl.h"
#include "safetensors.h"

// A tiny dense model every target-3 input is loaded against (vocab 16, dim 8, one layer).
static const char *TINY_CONFIG =
    "{\"family\": \"dense\", \"vocab_size\": 16, \"dim\": 8, \"n_layer\": 1, \"n_head\": 2, "
    "\"n_kv_head\": 1, \"head_dim\": 4, \"ffn_dim\": 8, \"max_seq_len\": 8, "
    "\"rope_theta\": 10000.0, \"rope_scaling\": null, \"norm_eps\": 1e-05, "
    "\"tie_embeddings\": true, \"init_std\": 0.02, \"moe\": null, \"mod\": null, "
    "\"format_version\": 1}";

static std::string scratch_dir() {
    static std::string dir;
    if (dir.empty()) {
        char tmpl[] = "/dev/shm/ats-fuzz-XXXXXX";
        if (!mkdtemp(tmpl)) abort();
        dir = tmpl;
        FILE *f = fopen((dir + "/config.json").c_str(), "wb");
        fputs(TINY_CONFIG, f);
        fclose(f);
    }
    return dir;
}

static void write_file(const std::string &path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path.c_str(), "wb");
    if (!f) abort();
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t which = data[0] % 5;
    const uint8_t *body = data + 1;
    const size_t n = size - 1;
    std::string err;
    if (which == 0) {
        // a private copy of exactly n bytes, so reads past the end hit ASan's redzone
        std::vector<uint8_t> buf(body, body + n);
        std::vector<ats::StTensor> tensors;
        if (ats::st_parse(buf.data(), buf.size(), "fuzz", &tensors, &err)) {
            volatile uint32_t sum = 0;
            for (const ats::StTensor &t : tensors) {
                for (size_t i = 0; i < t.nbytes; i++) sum = sum + t.data[i];
            }
        }
    } else if (which == 1) {
        std::string text(reinterpret_cast<const char *>(body), n);
        ats::JsonValue v;
        ats::json_parse(text.data(), text.size(), &v, &err);
    } else if (which == 2) {
        std::string text(reinterpret_cast<const char *>(body), n);
        ats::Config c;
        ats::config_parse(text, &c, &err);
    } else if (which == 3) {
        std::string dir = scratch_dir();
        write_file(dir + "/model.safetensors", body, n);
        ats_model_params p = {dir.c_str(), 1, "auto", nullptr, nullptr};
        char msg[512];
        ats_model *m = ats_model_init(&p, msg, sizeof msg);
        if (m) {
            int32_t ids[3] = {1, 2, 15};
            std::vector<float> out(3 * 16);
            ats_model_logits(m, ids, 1, 3, out.data(), msg, sizeof msg);
            ats_model_free(m);
        }
    } else {
        std::string path = scratch_dir() + "/tokenizer.json";
        write_file(path, body, n);
        char msg[512];
        ats_tokenizer *t = ats_tokenizer_init(path.c_str(), msg, sizeof msg);
        if (t) {
            ats_ids ids = {nullptr, 0, 0};
            const char *text = "Hello world, 12345 ünïcode!\n  x";
            ats_tokenizer_encode(t, text, strlen(text), &ids);
            for (size_t i = 0; i < ids.len; i++) {
                size_t len = 0;
                ats_tokenizer_id_bytes(t, ids.data[i], &len);
            }
            ats_ids_free(&ids);
            ats_tokenizer_free(t);
        }
    }
    return 0;
}
