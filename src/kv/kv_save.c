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
#include "kv/kv_internal.h"

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

static uint64_t payload_bytes(const tr_kv *kv, int32_t len) {
    const uint64_t eq = kv->params.policy == TR_KV_TIERED
                            ? (uint64_t)kv->shape.n_head_kv * (uint64_t)kv->hdk_pad * 4
                            : 0;
    return eq + (uint64_t)len * (kv->rec + sizeof(tok_meta));
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
        tr_kv_layer *L = &kv->layers[l];
        layer_header lh = {.magic = LAYER_MAGIC,
                           .layer = (uint32_t)l,
                           .len = L->len,
                           .calibrated = L->calibrated,
                           .payload = payload_bytes(kv, L->len)};
        lh.hash = tr_kv_hash64(&lh, offsetof(layer_header, hash), 0);
        st = wr(f, NULL, &lh, sizeof lh, path, err);
        tr_kv_hasher h;
        tr_kv_hasher_init(&h, 0);
        if (!st && kv->params.policy == TR_KV_TIERED)
            st = wr(f, &h, L->eq, (size_t)kv->shape.n_head_kv * (size_t)kv->hdk_pad * 4, path, err);
        for (int32_t p = 0; p < L->len && !st; p++) {
            const tr_kv_tok *t = &L->tok[p];
            const uint8_t *rec = kv->rec_tmp;
            if (t->where == TR_KV_TOK_HOT)
                rec = L->hot + (size_t)t->slot * kv->rec;
            else if (t->where == TR_KV_TOK_COLD)
                st = tr_kv_cold_read_sync(kv, l, p, 1, kv->rec_tmp, err);
            else
                memset(kv->rec_tmp, 0, kv->rec);
            if (!st) st = wr(f, &h, rec, kv->rec, path, err);
        }
        for (int32_t p = 0; p < L->len && !st; p++) {
            const tr_kv_tok *t = &L->tok[p];
            tok_meta m = {.where = t->where, .hits = t->hits, .mass = L->mass ? L->mass[p] : 0.0f};
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
    tr_kv_layer *L = &kv->layers[l];
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
    if (kv->params.policy == TR_KV_TIERED) {
        st = rd(f, &h, L->eq, (size_t)kv->shape.n_head_kv * (size_t)kv->hdk_pad * 4, path, err);
        if (st) return st;
        for (int32_t i = 0; i < kv->shape.n_head_kv * kv->hdk_pad; i++)
            if (!(L->eq[i] > 0.0f && L->eq[i] < 1e30f))
                return tr_fail(err, TR_E_FORMAT, "KV restore: %s: layer %d: bad channel scale",
                               path, l);
        L->calibrated = lh.calibrated != 0;
    }
    for (int32_t p = 0; p < lh.len; p++) {
        if ((st = rd(f, &h, kv->rec_tmp, kv->rec, path, err))) return st;
        if ((st = tr_kv_append_rec(kv, l, kv->rec_tmp, err))) return st;
    }
    for (int32_t p = 0; p < lh.len; p++) {
        tok_meta m;
        if ((st = rd(f, &h, &m, sizeof m, path, err))) return st;
        if (m.where != TR_KV_TOK_HOT && m.where != TR_KV_TOK_COLD && m.where != TR_KV_TOK_EVICTED)
            return tr_fail(err, TR_E_FORMAT, "KV restore: %s: layer %d position %d: state %u", path,
                           l, p, m.where);
        tr_kv_tok *t = &L->tok[p];
        t->hits = m.hits;
        if (L->mass) L->mass[p] = m.mass;
        if (m.where == TR_KV_TOK_EVICTED && t->where != TR_KV_TOK_EVICTED) {
            if (t->where == TR_KV_TOK_HOT) tr_kv_drop_hot(kv, L, p);
            t->where = TR_KV_TOK_EVICTED;
            L->n_evicted++;
        }
    }
    uint64_t d;
    if ((st = rd(f, NULL, &d, sizeof d, path, err))) return st;
    if (d != tr_kv_hasher_digest(&h))
        return tr_fail(err, TR_E_FORMAT, "KV restore: %s: layer %d: checksum mismatch", path, l);
    return TR_OK;
}

tr_status tr_kv_restore(tr_kv *kv, const char *path, tr_error *err) {
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
        for (int32_t l = 0; l < kv->shape.n_layer; l++) {
            tr_kv_layer *L = &kv->layers[l];
            L->n_evicted = 0;
        }
    }
    return st;
}
