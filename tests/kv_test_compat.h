#include "kv/kv_app.h"
#include "kv/kv_csd.h"
#include "kv/kv_keys.h"
#include "kv/kv_pooled.h"
#define KVS(kv) (&tr_kv_pooled_of(kv)->st)
#define KEYS(kv) tr_kv_tiered_keys(kv)
#define APP(kv) tr_kv_tiered_app(kv)
static tr_status attend_rows(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t rows,
                             const int32_t *pos, const float *q, size_t q_stride, float scale,
                             const float *sinks, int32_t swa, float *out, size_t out_stride,
                             tr_error *err) {
    const tr_kv_query kq = {.layer = layer, .rows = rows, .pos = pos, .q = q, .q_stride = q_stride,
                            .scale = scale, .sinks = sinks, .swa = swa, .out = out,
                            .out_stride = out_stride};
    return tr_kv_attend(kv, pool, &kq, err);
}
static void set_write_fault(tr_kv *kv, uint64_t at, int e) {
    KVS(kv)->fault_write_at = at;
    KVS(kv)->n_writes = 0;
    KVS(kv)->fault_errno = e;
}
static void note_rows(tr_kv *kv, uint64_t hb, uint64_t hn, uint64_t ab, uint64_t an) {
    tr_kv_app_note_hot(APP(kv), hb, hn);
    tr_kv_app_note_agent_rows(APP(kv), ab, an);
}
static tr_kv_stats stats_of(const tr_kv *kv) {
    tr_kv_stats st;
    tr_kv_get_stats(kv, &st);
    return st;
}
static void set_pull_keys(tr_kv *kv, bool on) {
    tr_kv_seam sm;
    tr_kv_seam_get(kv, &sm);
    sm.pull_keys = on;
    tr_kv_seam_set(kv, &sm, NULL);
}
static void set_csd_gap(tr_kv *kv, int32_t gap) {
    tr_kv_seam sm;
    tr_kv_seam_get(kv, &sm);
    sm.csd_read_gap = gap;
    tr_kv_seam_set(kv, &sm, NULL);
}
