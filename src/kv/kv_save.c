/*
 * Save / restore of a whole cache to one file (both pools; the cold records are read back and
 * verified on the way out).
 *
 *   header   magic "TRKVSAVE", version, shape, policy, score bits, hash of the header
 *   per layer, in order:
 *     block header  magic, layer, positions, calibrated, payload bytes, hash of the block header
 *     payload       tiered: per-channel scales [n_kv][hdk_pad] f32
 *                   records [len][rec] (F16 K then V; zeros for evicted tokens)
 *                   per token: where (u8), pad (u8), hits (u16), h2o mass (f32)
 *     hash          XXH64 of the payload
 *
 * Restore replays the records through the ordinary append path (so the pools, the key copy, the
 * page bounds and the segment files are rebuilt as they would have been), then applies the
 * per-token state. Every size read is checked against what the shape implies before it is used;
 * a checksum mismatch or any other failure leaves the cache empty.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kv/kv_pooled.h"

typedef struct save_header {
    char magic[8];
    uint32_t version, n_layer;
    int32_t n_ctx, n_head, n_head_kv, head_dim_k, head_dim_v, policy, score_bits, pad;
    uint64_t hash;
} save_header;

typedef struct layer_header {
    uint32_t magic, layer;
    int32_t len, calibrated;
    uint64_t payload;
    uint64_t hash;
} layer_header;

#define LAYER_MAGIC 0x594c564bu /* "KVLY" */

typedef struct tok_meta {
    uint8_t where, pad;
    uint16_t hits;
    float mass;
} tok_meta;

/* tiered's per-channel scales of a layer (NULL for the other policies) */
static float *scales_of(const tr_kv *kv, int32_t layer, size_t *bytes, bool **calibrated) {
    *bytes = 0;
    *calibrated = NULL;
    return kv->params.policy == TR_KV_TIERED ? tr_kv_tiered_scales(kv, layer, bytes, calibrated)
                                            : NULL;
}

static float *mass_of(const tr_kv *kv, int32_t layer) {
    return kv->params.policy == TR_KV_H2O ? tr_kv_h2o_mass(kv, layer) : NULL;
}

static uint64_t payload_bytes(const tr_kv *kv, int32_t len) {
    size_t eq;
    bool *cal;
    scales_of(kv, 0, &eq, &cal);
    return eq + (uint64_t)len * (tr_kv_pooled_of(kv)->st.rec + sizeof(tok_meta));
}

static tr_status wr(FILE *f, tr_kv_hasher *h, const void *p, size_t n, const char *path,
                    tr_error *err) {
    if (h) tr_kv_hasher_update(h, p, n);
    if (fwrite(p, 1, n, f) != n)
        return tr_fail(err, TR_E_IO, "KV save: writing %s: %s", path, strerror(errno));
    return TR_OK;
}

tr_status tr_kv_save(const tr_kv *ckv, const char *path, tr_error *err) {
    /* reading cold records back updates the read counters: the cache itself does not change */
    tr_kv *kv = (tr_kv *)ckv;
    if (kv->ops != &tr_kv_pooled_kv_ops)
        return tr_fail(err, TR_E_UNSUPPORTED, "KV save: the %s policy is not saved this way",
                       tr_kv_policy_name(kv->params.policy));
    tr_kv_store *S = &tr_kv_pooled_of(kv)->st;
    FILE *f = fopen(path, "wb");
    if (!f) return tr_fail(err, TR_E_IO, "KV save: cannot create %s: %s", path, strerror(errno));
    save_header sh = {.version = 2,
                      .n_layer = (uint32_t)kv->shape.n_layer,
                      .n_ctx = kv->shape.n_ctx,
                      .n_head = kv->shape.n_head,
                      .n_head_kv = kv->shape.n_head_kv,
                      .head_dim_k = kv->shape.head_dim_k,
                      .head_dim_v = kv->shape.head_dim_v,
                      .policy = (int32_t)kv->params.policy,
                      .score_bits = kv->params.score_bits};
    memcpy(sh.magic, "TRKVSAVE", 8);
    sh.hash = tr_kv_hash64(&sh, offsetof(save_header, hash), 0);
    tr_status st = wr(f, NULL, &sh, sizeof sh, path, err);
    for (int32_t l = 0; l < kv->shape.n_layer && !st; l++) {
        tr_kv_slayer *L = &S->layers[l];
        size_t eq_bytes;
        bool *calibrated;
        const float *eq = scales_of(kv, l, &eq_bytes, &calibrated);
        const float *mass = mass_of(kv, l);
        layer_header lh = {.magic = LAYER_MAGIC,
                           .layer = (uint32_t)l,
                           .len = L->len,
                           .calibrated = calibrated && *calibrated,
                           .payload = payload_bytes(kv, L->len)};
        lh.hash = tr_kv_hash64(&lh, offsetof(layer_header, hash), 0);
        st = wr(f, NULL, &lh, sizeof lh, path, err);
        tr_kv_hasher h;
        tr_kv_hasher_init(&h, 0);
        if (!st && eq) st = wr(f, &h, eq, eq_bytes, path, err);
        for (int32_t p = 0; p < L->len && !st; p++) {
            const tr_kv_tok *t = &L->tok[p];
            const uint8_t *rec = S->rec_tmp;
            if (t->where == TR_KV_TOK_HOT)
                rec = L->hot + (size_t)t->slot * S->rec;
            else if (t->where == TR_KV_TOK_COLD)
                st = tr_kv_cold_read_sync(S, l, p, 1, S->rec_tmp, err);
            else
                memset(S->rec_tmp, 0, S->rec);
            if (!st) st = wr(f, &h, rec, S->rec, path, err);
        }
        for (int32_t p = 0; p < L->len && !st; p++) {
            const tr_kv_tok *t = &L->tok[p];
            tok_meta m = {.where = t->where, .hits = t->hits, .mass = mass ? mass[p] : 0.0f};
            st = wr(f, &h, &m, sizeof m, path, err);
        }
        if (!st) {
            const uint64_t d = tr_kv_hasher_digest(&h);
            st = wr(f, NULL, &d, sizeof d, path, err);
        }
    }
    if (fclose(f) && !st)
        st = tr_fail(err, TR_E_IO, "KV save: writing %s: %s", path, strerror(errno));
    if (st) remove(path);
    return st;
}

static tr_status rd(FILE *f, tr_kv_hasher *h, void *p, size_t n, const char *path, tr_error *err) {
    if (fread(p, 1, n, f) != n)
        return tr_fail(err, ferror(f) ? TR_E_IO : TR_E_FORMAT, "KV restore: %s: %s", path,
                       ferror(f) ? strerror(errno) : "file ends early");
    if (h) tr_kv_hasher_update(h, p, n);
    return TR_OK;
}

static tr_status restore_layer(tr_kv *kv, FILE *f, int32_t l, const char *path, tr_error *err) {
    tr_kv_store *S = &tr_kv_pooled_of(kv)->st;
    tr_kv_slayer *L = &S->layers[l];
    size_t eq_bytes;
    bool *calibrated;
    float *eq = scales_of(kv, l, &eq_bytes, &calibrated);
    float *mass = mass_of(kv, l);
    layer_header lh;
    tr_status st = rd(f, NULL, &lh, sizeof lh, path, err);
    if (st) return st;
    if (lh.magic != LAYER_MAGIC || lh.hash != tr_kv_hash64(&lh, offsetof(layer_header, hash), 0))
        return tr_fail(err, TR_E_FORMAT, "KV restore: %s: layer %d header is damaged", path, l);
    if (lh.layer != (uint32_t)l || lh.len < 0 || lh.len > kv->shape.n_ctx ||
        lh.payload != payload_bytes(kv, lh.len))
        return tr_fail(err, TR_E_FORMAT,
                       "KV restore: %s: layer block %u with %d positions and %llu payload bytes "
                       "(expected layer %d, at most %d positions)",
                       path, lh.layer, lh.len, (unsigned long long)lh.payload, l, kv->shape.n_ctx);
    tr_kv_hasher h;
    tr_kv_hasher_init(&h, 0);
    if (eq) {
        st = rd(f, &h, eq, eq_bytes, path, err);
        if (st) return st;
        for (size_t i = 0; i < eq_bytes / 4; i++)
            if (!(eq[i] > 0.0f && eq[i] < 1e30f))
                return tr_fail(err, TR_E_FORMAT, "KV restore: %s: layer %d: bad channel scale",
                               path, l);
        *calibrated = lh.calibrated != 0;
    }
    for (int32_t p = 0; p < lh.len; p++) {
        if ((st = rd(f, &h, S->rec_tmp, S->rec, path, err))) return st;
        if ((st = tr_kv_pooled_append_rec(kv, l, S->rec_tmp, err))) return st;
    }
    for (int32_t p = 0; p < lh.len; p++) {
        tok_meta m;
        if ((st = rd(f, &h, &m, sizeof m, path, err))) return st;
        if (m.where != TR_KV_TOK_HOT && m.where != TR_KV_TOK_COLD && m.where != TR_KV_TOK_EVICTED)
            return tr_fail(err, TR_E_FORMAT, "KV restore: %s: layer %d position %d: state %u", path,
                           l, p, m.where);
        tr_kv_tok *t = &L->tok[p];
        t->hits = m.hits;
        if (mass) mass[p] = m.mass;
        if (m.where == TR_KV_TOK_EVICTED && t->where != TR_KV_TOK_EVICTED)
            tr_kv_store_evict(S, L, p);
    }
    uint64_t d;
    if ((st = rd(f, NULL, &d, sizeof d, path, err))) return st;
    if (d != tr_kv_hasher_digest(&h))
        return tr_fail(err, TR_E_FORMAT, "KV restore: %s: layer %d: checksum mismatch", path, l);
    return TR_OK;
}

tr_status tr_kv_restore(tr_kv *kv, const char *path, tr_error *err) {
    if (kv->ops != &tr_kv_pooled_kv_ops)
        return tr_fail(err, TR_E_UNSUPPORTED, "KV restore: the %s policy is not restored this way",
                       tr_kv_policy_name(kv->params.policy));
    FILE *f = fopen(path, "rb");
    if (!f) return tr_fail(err, TR_E_IO, "KV restore: cannot open %s: %s", path, strerror(errno));
    save_header sh;
    tr_status st = rd(f, NULL, &sh, sizeof sh, path, err);
    if (!st && !memcmp(sh.magic, "TRKVSAVE", 8) && sh.version != 2)
        st = tr_fail(err, TR_E_FORMAT,
                     "KV restore: %s is a terrace KV file of format %u; this build reads format 2 "
                     "(format 1 used XXH64 checksums): save it again with this build",
                     path, sh.version);
    if (!st && (memcmp(sh.magic, "TRKVSAVE", 8) ||
                sh.hash != tr_kv_hash64(&sh, offsetof(save_header, hash), 0)))
        st = tr_fail(err, TR_E_FORMAT, "KV restore: %s is not a terrace KV file (or is damaged)",
                     path);
    if (!st && (sh.n_layer != (uint32_t)kv->shape.n_layer || sh.n_ctx != kv->shape.n_ctx ||
                sh.n_head != kv->shape.n_head || sh.n_head_kv != kv->shape.n_head_kv ||
                sh.head_dim_k != kv->shape.head_dim_k || sh.head_dim_v != kv->shape.head_dim_v))
        st = tr_fail(err, TR_E_FORMAT,
                     "KV restore: %s holds %u layers, n_ctx %d, %d/%d heads, dims %d/%d; this "
                     "cache has %d layers, n_ctx %d, %d/%d heads, dims %d/%d",
                     path, sh.n_layer, sh.n_ctx, sh.n_head, sh.n_head_kv, sh.head_dim_k,
                     sh.head_dim_v, kv->shape.n_layer, kv->shape.n_ctx, kv->shape.n_head,
                     kv->shape.n_head_kv, kv->shape.head_dim_k, kv->shape.head_dim_v);
    if (!st && (sh.policy != (int32_t)kv->params.policy || sh.score_bits != kv->params.score_bits))
        st = tr_fail(err, TR_E_FORMAT,
                     "KV restore: %s was saved by policy %s with %d-bit scoring; this cache is %s "
                     "with %d bits",
                     path, tr_kv_policy_name((tr_kv_policy)sh.policy), sh.score_bits,
                     tr_kv_policy_name(kv->params.policy), kv->params.score_bits);
    if (!st) st = tr_kv_truncate(kv, 0, err);
    for (int32_t l = 0; l < kv->shape.n_layer && !st; l++) st = restore_layer(kv, f, l, path, err);
    fclose(f);
    if (st) {
        tr_kv_truncate(kv, 0, NULL);
        for (int32_t l = 0; l < kv->shape.n_layer; l++)
            tr_kv_pooled_of(kv)->st.layers[l].n_evicted = 0;
    }
    return st;
}
