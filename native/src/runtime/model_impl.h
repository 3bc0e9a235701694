/* The loaded model behind the opaque ats_model handle: its config, weight views (into mmap'd
 * safetensors or owned fp32 copies of bf16 tensors), RoPE tables, thread pool and kernels. */
#pragma once
#include <stdint.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "../cuda/backend.h"
#include "huge_pages.h"
#include "kernels.h"
#include "matmul.h"
#include "safetensors.h"
#include "threadpool.h"

namespace ats {

/* config.json (ats_model.ModelConfig.to_dict()), resolved. */
struct Config {
    std::string family; /* dense | moe | mod | hybrid */
    int64_t vocab_size, dim, n_layer, n_head, n_kv_head, head_dim, ffn_dim, max_seq_len;
    double rope_theta, norm_eps;
    bool rope_scaling; /* Llama-3.1 frequency scaling on */
    double rs_factor, rs_low_freq_factor, rs_high_freq_factor, rs_original_max_seq_len;
    bool tie_embeddings;
    /* MoE (family moe / hybrid) */
    bool has_moe;
    int64_t n_experts, top_k, n_shared_experts;
    bool has_capacity; /* capacity_factor not null */
    double capacity_factor, router_temperature;
    bool norm_topk;
    /* MoD (family mod / hybrid) */
    bool has_mod;
    double mod_capacity;
    std::string mod_routing, mod_placement; /* learned|static|random ; all|later_half|every_n */
    int64_t mod_every_n, mod_predictor_dim, mod_seed;
};

struct Layer {
    const float *attn_norm, *ffn_norm; /* (C) */
    Weight wq, wk, wv, wo;
    Weight w1, w2, w3;                 /* dense FFN */
    const float *router = nullptr;     /* MoE router (E, C) */
    const float *expert_bias = nullptr; /* (E) */
    Weight ew1, ew2, ew3;              /* stacked experts: (E, F, C), (E, C, F), (E, F, C) */
    bool has_shared = false;
    Weight sw1, sw2, sw3;              /* shared experts fused, width n_shared * F */
    bool is_mod = false;
    const float *mod_router = nullptr; /* (1, C), learned routing */
    const float *pred_in = nullptr;    /* (P, C) causal predictor */
    const float *pred_out = nullptr;   /* (1, P) */
    int64_t mod_seed = 0;              /* random routing: config seed * 100003 + layer index */
};

}  // namespace ats

struct ats_model {
    ats::Config cfg;
    std::string config_text;
    std::string weight_format; /* f32 | bf16 | int8 | int4 */
    std::vector<ats::StFile> files;
    std::vector<std::unique_ptr<float[]>> owned; /* fp32 copies (bf16 or unaligned tensors) */
    std::vector<ats::HugeBuffer> packed; /* repacked int8/int4 */
    const float *tok_embeddings;                  /* (V, C) */
    const float *norm;                            /* (C) */
    ats::Weight output;                           /* (V, C): output.weight or tied embeddings */
    std::vector<ats::Layer> layers;
    std::vector<float> rope_cos, rope_sin; /* (max_seq_len, head_dim) */
    std::unique_ptr<ats::ThreadPool> pool;
    const ats::Kernels *kernels;
    std::string device = "cpu";     /* cpu | cuda */
    bool kv_f16 = false;            /* sessions keep keys and values in half precision */
    ats::CudaModel *cuda = nullptr; /* device cuda: the GPU copy (src/cuda/backend.h) */
};

namespace ats {
/* Parses config.json text into *cfg; false with *err naming the key on problems. */
bool config_parse(const std::string &text, Config *cfg, std::string *err);
/* Loads every tensor of the model directory into model (config already parsed). */
bool weights_load(ats_model *model, const std::string &dir, std::string *err);
}  // namespace ats
