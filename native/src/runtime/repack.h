/* Load-time repacking of int8/int4 weights into the layout the integer kernels stream (issue 7):
 * rows in groups of PACK_ROWS = 16, one row per 32-bit lane of a 512-bit vector, so vpdpbusd
 * with a broadcast of 4 activation codes adds a 4-element piece of 16 different dot products and
 * a block's 8 such steps leave one finished block dot per lane: the float scaling is then one
 * convert and one FMA per 16 outputs per block (llama.cpp's Q4_0x8 idea: one output row per
 * lane; our own layout and code). Per row group g (rows 16g + L, L = 0..15):
 *
 *   int8 (1.0 byte per weight): [16 fp32 row scales] then per block b (512 bytes):
 *     byte 64k + 4L + m (k = 0..7, m = 0..3) = code(row, element 32b + 4k + m) + 128 (u8)
 *   int4 (0.5625 byte per weight, as Q4_0): per block b (288 bytes):
 *     byte 64k + 4L + m (k = 0..3) = code(row, 32b + 4k + m) | code(row, 32b + 16 + 4k + m) << 4
 *     then 16 fp16 scales: scale(row, b) rounded to half precision (F16C cvtph on load)
 *
 * The low nibbles of vector k are elements 4k..4k+3 of the block and the high nibbles elements
 * 16+4k..16+4k+3, so the activations stay in natural order (QAct) and vector k' (0..7, high
 * nibbles of k = k' - 4) always meets activation codes 4k'..4k'+3. Rows past the last
 * (rows % 16 != 0) hold weight 0 with scale 0. Only this in-memory copy changes: the safetensors
 * format keeps fp32 scales. */
#pragma once
#include <stdint.h>

#include <string>

#include "matmul.h"

struct ats_model;

namespace ats {

/* Bytes of one matrix's packed copy (rows x cols, cols % 32 == 0), and of one row group. */
int64_t packed_bytes(const Weight &w);
int64_t packed_group_bytes(const Weight &w);

/* Checks that w can be packed: every int4 scale is finite in fp16 (|scale| <= 65504); false with
 * *err naming the first offending value. */
bool pack_check(const Weight &w, std::string *err);

/* Packs one matrix w (Q8/Q4, cols % 32 == 0) into dst (packed_bytes(w) bytes), row groups spread
 * over the pool. */
void pack_matrix(ThreadPool *pool, const Weight &w, uint8_t *dst);

/* Repacks every int8/int4 matmul weight of the model whose rows are whole 32-blocks, when the
 * model's kernel set has packed kernels; sets Weight.packed (owned by the model). false with *err
 * naming the tensor when a weight cannot be packed (pack_check). */
bool weights_repack(ats_model *m, std::string *err);

}  // namespace ats
