/* Load-time repacking of int8/int4 weights into the layout the VNNI kernels stream (issue 7):
 * rows in groups of 4, interleaved per pair of 32-blocks, scales next to their codes, so a
 * matmul reads one sequential stream instead of 4 row streams plus 4 scale streams.
 *
 *   int4, per row group g, per pair p (160 bytes):
 *     [row 4g+0: 32 bytes, byte j = code of element j of block 2p (low nibble) | of block
 *      2p + 1 (high nibble)] ... [row 4g+3: 32 bytes]
 *     [8 floats: scale of (row 4g+i, block 2p + j) at 2i + j]
 *   int8, per row group g (64 + n_pairs * 256 bytes):
 *     [4 floats: row scales, 48 zero bytes] then per pair p:
 *     [row 4g+0: 64 codes of blocks 2p, 2p+1] ... [row 4g+3: 64 codes]
 *
 * Rows past the last (rows % 4 != 0) and the second block of an odd last pair hold code 0
 * (int8) / 8 (int4: weight 0) with scale 0, so they add nothing. The nibble planes of a row's 32
 * bytes are then its two blocks in element order, so activations stay in natural order (QAct). */
#pragma once
#include <stdint.h>

#include "matmul.h"

struct ats_model;

namespace ats {

/* Bytes of one matrix's packed copy (rows x cols, cols % 32 == 0). */
int64_t packed_bytes(const Weight &w);

/* Packs one matrix w (Q8/Q4, cols % 32 == 0) into dst (packed_bytes(w) bytes), rows spread over
 * the pool. */
void pack_matrix(ThreadPool *pool, const Weight &w, uint8_t *dst);

/* Repacks every int8/int4 matmul weight of the model whose rows are whole 32-blocks, when the
 * model's kernel set has packed kernels; sets Weight.packed (owned by the model). */
void weights_repack(ats_model *m);

}  // namespace ats
