#include "backends/paged/gpu_paged_graph_key.h"

namespace attn {
namespace {

void PutPool(const kernels::PagedKvPool &p, GraphKeyWriter &w) {
  w.Put(p.k_pages).Put(p.v_pages).Put(p.num_pages).Put(p.page_tokens).Put(p.num_kv_heads);
  w.Put(p.head_dim).Put(p.kv_dtype);
}

void PutDecodePlan(const kernels::PagedDecodePlan &p, GraphKeyWriter &w) {
  const kernels::PagedDecodeShape &s = p.shape;
  w.Put(s.source).Put(s.dtype).Put(s.kv_dtype).Put(s.batch).Put(s.max_q_len).Put(s.max_kv_len);
  w.Put(s.num_heads).Put(s.num_kv_heads).Put(s.head_dim).Put(s.page_tokens).Put(s.scale);
  w.Put(s.return_lse);
  w.Put(p.device).Put(p.partitions).Put(p.partition_tokens).Put(p.tile_tokens).Put(p.stages);
  w.Put(p.row_chunks).Put(p.smem_bytes).Put(p.grid_blocks).Put(p.workspace_bytes).Put(p.launch);
  w.Put(p.counter_bytes);
}

}  // namespace

void PutAppendGraphKey(const PagedAppendJob &j, GraphKeyWriter &w) {
  w.Put('A').Put(j.B).Put(j.K).Put(j.row_bytes).Put(j.max_new).Put(j.max_blocks).Put(j.launches);
  w.Put(j.fp8).Put(j.src);
  w.Put(j.at_k).Put(j.at_v).Put(j.at_bt).Put(j.at_len).Put(j.at_off).Put(j.at_ks).Put(j.at_vs);
  w.Put(j.at_sat).Put(j.bytes);
  PutPool(j.items[0].layer.pool, w);
  if (j.fp8) {
    for (int64_t b = 0; b < j.B; ++b) w.Put(j.items[b].tokens);
  }
}

bool PutAttendGraphKey(const PagedAttendJob &j, GraphKeyWriter &w) {
  if (j.split.prefill_entries > 0) return false;
  w.Put('T').Put(j.split.decode_entries).Put(j.split.decode_rows).Put(j.K).Put(j.max_blocks);
  w.Put(j.row_bytes).Put(j.fp8);
  w.Put(j.qo_bytes).Put(j.at_q).Put(j.at_bt).Put(j.at_len).Put(j.at_off).Put(j.at_ks);
  w.Put(j.at_vs).Put(j.upload).Put(j.at_o).Put(j.at_ws).Put(j.bytes);
  w.Put(j.appends != nullptr).Put(j.kv_row_bytes).Put(j.at_nk).Put(j.at_nv);
  if (j.split.decode_entries > 0) PutDecodePlan(j.plan, w);
  PutPool(j.layers[0].pool, w);
  return true;
}

}  // namespace attn
