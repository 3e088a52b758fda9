/*
 * The KV cache's storage layer (src/kv/kv_store.h): XXH3 checksums (the SIMD build against the
 * library's, streaming), truncate and append again, save/restore round trips and damaged files, and
 * faults and budgets: a cold directory that is not writable, a disk full, a corrupted page, failing
 * reads and writes, configurations that cannot fit.
 */
#include "kv_test.h"

/* the record checksum: the SIMD build picked at start, the library's baseline build and the
 * streaming form give one digest for every length (tails, short inputs, the 16 KiB records) */
static void test_hash(void) {
    tu_rng r = {5};
    const size_t cap = 40000;
    uint8_t *b = malloc(cap);
    for (size_t i = 0; i < cap; i++) b[i] = (uint8_t)tu_next(&r);
    int bad = 0;
    static const size_t lens[] = {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 4095, 16384, 39990};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (size_t off = 0; off < 3; off++) {
            const size_t n = lens[li];
            const uint64_t seed = off == 2 ? 0x1234 : 0;
            const uint64_t a = tr_kv_hash64(b + off, n, seed), c = tr_kv_hash64_ref(b + off, n, seed);
            tr_kv_hasher h;
            tr_kv_hasher_init(&h, seed);
            tr_kv_hasher_update(&h, b + off, n / 3);
            tr_kv_hasher_update(&h, b + off + n / 3, n - n / 3);
            bad += a != c || a != tr_kv_hasher_digest(&h);
        }
    /* a flipped bit changes the digest */
    const uint64_t h0 = tr_kv_hash64(b, 16384, 0);
    b[7777] ^= 8;
    bad += tr_kv_hash64(b, 16384, 0) == h0;
    TU_CHECK(bad == 0, "hash: SIMD, baseline and streaming digests agree (%d mismatches)", bad);
    free(b);
}

static void test_truncate(void) {
    const shp s = {"GQA", 2, 160, 8, 2, 64, 64};
    data d1, d2;
    data_make(&d1, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 61, false);
    data_make(&d2, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 62, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on),
          *ro = malloc(sizeof(float) * on);
    /* d mixes: positions < 70 from d1, the rest from d2 */
    data dm;
    data_make(&dm, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 61, false);
    for (int32_t l = 0; l < s.nl; l++)
        for (int32_t t = 70; t < s.nctx; t++) {
            memcpy((float *)dk(&dm, l, t), dk(&d2, l, t), sizeof(float) * (size_t)(s.nkv * s.hdk));
            memcpy((float *)dv(&dm, l, t), dv(&d2, l, t), sizeof(float) * (size_t)(s.nkv * s.hdv));
        }
    float worst = 0;
    for (int pol = TR_KV_OFFLOAD; pol <= TR_KV_TIERED; pol++) {
        tr_kv_params p = params((tr_kv_policy)pol, 1.0f);
        p.hot_bytes = hot_min(&s, &p);
        p.cold_dir = g_tmp;
        tr_kv *kv = mk(&s, &p);
        if (!kv) continue;
        tr_error err = {0};
        fill(kv, &d1, 0, 120);
        /* position 70 is inside page 4 (64..79), whose first tokens are cold by now */
        TU_CHECK(KVS(kv)->layers[0].tok[64].where == TR_KV_TOK_COLD, "token 64 should be cold");
        TU_CHECK(tr_kv_truncate(kv, 70, &err) == TR_OK, "truncate: %s", err.msg);
        fill(kv, &dm, 70, 160);
        for (int32_t l = 0; l < s.nl; l++)
            for (int32_t pos = 75; pos < 160; pos += 21) {
                query_make(q, &s, pos, 3 + (uint64_t)pos, false);
                tr_status st =
                    attend_rows(kv, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
                TU_CHECK(st == TR_OK, "attend after truncate: %s", err.msg);
                ref_attend(&dm, l, &s, pos, q, 0.125f, NULL, 0, NULL, ro);
                const float e = maxdiff(o, ro, on);
                if (e > worst) worst = e;
            }
        tr_kv_free(kv);
    }
    TU_CHECK(worst <= TOL, "attention after truncate + append: %.3g", worst);
    printf("truncate into a page with cold tokens, append new tokens: attention = reference "
           "(%.2e), offload/h2o/quest/tiered\n",
           (double)worst);
    free(q);
    free(o);
    free(ro);
    data_free(&d1);
    data_free(&d2);
    data_free(&dm);
}

static void test_save_restore(void) {
    const shp s = {"GQA", 2, 200, 8, 2, 64, 64};
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 71, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn), *o1 = malloc(sizeof(float) * on),
          *o2 = malloc(sizeof(float) * on);
    char path[300];
    snprintf(path, sizeof path, "%s/kv.save", g_tmp);
    const tr_kv_policy pols[] = {TR_KV_TIERED, TR_KV_H2O, TR_KV_QUEST};
    for (int pi = 0; pi < 3; pi++) {
        tr_kv_params p = params(pols[pi], 0.3f);
        p.hot_bytes = hot_min(&s, &p);
        p.cold_dir = g_tmp;
        tr_kv *a = mk(&s, &p), *b = mk(&s, &p);
        if (!a || !b) {
            tr_kv_free(a);
            tr_kv_free(b);
            continue;
        }
        tr_error err = {0};
        fill(a, &d, 0, 180);
        /* some steps, so h2o has evicted and hits are counted */
        for (int32_t pos = 100; pos < 180; pos += 7)
            for (int32_t l = 0; l < s.nl; l++) {
                query_make(q, &s, pos, (uint64_t)pos, false);
                attend_rows(a, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, 0, o1, on, &err);
            }
        tr_status st = tr_kv_save(a, path, &err);
        TU_CHECK(st == TR_OK, "save: %s", err.msg);
        fill(b, &d, 0, 20); /* restore replaces what was there */
        st = tr_kv_restore(b, path, &err);
        TU_CHECK(st == TR_OK, "restore: %s", err.msg);
        int same_state = 1;
        for (int32_t l = 0; l < s.nl; l++) {
            same_state &= KVS(a)->layers[l].len == KVS(b)->layers[l].len;
            for (int32_t t = 0; t < 180; t++)
                same_state &= KVS(a)->layers[l].tok[t].hits == KVS(b)->layers[l].tok[t].hits &&
                              (KVS(a)->layers[l].tok[t].where == TR_KV_TOK_EVICTED) ==
                                  (KVS(b)->layers[l].tok[t].where == TR_KV_TOK_EVICTED);
        }
        TU_CHECK(same_state, "%s: restored token state differs", tr_kv_policy_name(pols[pi]));
        float worst = 0;
        for (int32_t l = 0; l < s.nl; l++) {
            int32_t pos = 179;
            query_make(q, &s, pos, 4242, false);
            attend_rows(a, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, 0, o1, on, &err);
            attend_rows(b, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, 0, o2, on, &err);
            const float e = maxdiff(o1, o2, on);
            if (e > worst) worst = e;
        }
        TU_CHECK(worst == 0.0f, "%s: restored cache attends differently (%.3g)",
                 tr_kv_policy_name(pols[pi]), worst);
        if (pi == 0) {
            /* a damaged file is refused and leaves the cache empty */
            flip_byte(path, 5000);
            st = tr_kv_restore(b, path, &err);
            TU_CHECK(st == TR_E_FORMAT && strstr(err.msg, "checksum"), "damaged save: %d %s", st,
                     err.msg);
            TU_CHECK(KVS(b)->layers[0].len == 0, "a failed restore left %d positions", KVS(b)->layers[0].len);
            printf("save/restore: damaged file -> %s\n", err.msg);
            /* another shape is refused */
            shp s2 = s;
            s2.nctx = 100;
            tr_kv *c = mk(&s2, &p);
            tr_kv_save(a, path, &err);
            st = c ? tr_kv_restore(c, path, &err) : TR_E_INTERNAL;
            TU_CHECK(st == TR_E_FORMAT, "restore into another shape: %d", st);
            tr_kv_free(c);
        }
        tr_kv_free(a);
        tr_kv_free(b);
    }
    unlink(path);
    printf("save/restore: tiered, h2o, quest round trips attend identically (with evictions and "
           "hit counts)\n");
    free(q);
    free(o1);
    free(o2);
    data_free(&d);
}

static void test_faults(void) {
    const shp s = {"GQA", 2, 256, 8, 2, 64, 64};
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 81, false);
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on);
    tr_error err = {0};
    tr_kv *kv = NULL;
    tr_kv_params p = params(TR_KV_TIERED, 0.5f);
    p.hot_bytes = hot_min(&s, &p);
    tr_status st;

    /* budgets */
    tr_kv_params b = p;
    b.hot_bytes = hot_min(&s, &p) - 1;
    b.cold_dir = g_tmp;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "need"), "hot pool too small: %d %s", st,
             err.msg);
    printf("budget: %s\n", err.msg);
    b = p;
    b.cold_dir = NULL;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "--kv-cold"), "no cold dir: %d %s", st, err.msg);
    printf("budget: %s\n", err.msg);
    b = p;
    b.policy = TR_KV_FULL;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "bytes"), "full over budget: %d %s", st, err.msg);
    printf("budget: %s\n", err.msg);
    b = p;
    b.cold_dir = g_tmp;
    b.ws_bytes = 1000;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "working set"), "ws too small: %d %s", st,
             err.msg);
    printf("budget: %s\n", err.msg);
    TU_CHECK(tr_kv_dram_bytes(&(tr_kv_shape){2, 256, 8, 2, 64, 64, NULL, NULL}, &p) > p.hot_bytes,
             "dram bytes");
    b = p;
    b.alpha = 0;
    TU_CHECK(try_create(&s, &b, &err, &kv) == TR_E_ARG, "alpha 0 accepted");

    /* cold directory not writable. Root ignores permission bits, so: (1) a path below a regular
     * file (ENOTDIR), (2) a read-only tmpfs mount (EROFS), when mounting is permitted */
    char path[300];
    snprintf(path, sizeof path, "%s/plainfile", g_tmp);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    b = p;
    b.cold_dir = path;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_IO && strstr(err.msg, path), "cold dir is a file: %d %s", st, err.msg);
    printf("cold dir: %s\n", err.msg);
    char sub[320];
    snprintf(sub, sizeof sub, "%s/sub", path);
    b.cold_dir = sub;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_IO && strstr(err.msg, sub), "cold dir below a file: %d %s", st, err.msg);
    printf("cold dir: %s\n", err.msg);
    unlink(path);

    char mnt[300];
    snprintf(mnt, sizeof mnt, "%s/mnt", g_tmp);
    mkdir(mnt, 0700);
    if (mount("tmpfs", mnt, "tmpfs", MS_RDONLY, "size=1m") == 0) {
        b = p;
        b.cold_dir = mnt;
        st = try_create(&s, &b, &err, &kv);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, mnt) && strstr(err.msg, "writable"),
                 "read-only cold dir: %d %s", st, err.msg);
        printf("cold dir (read-only tmpfs): %s\n", err.msg);
        tr_kv_free(kv);
        kv = NULL;
        umount2(mnt, MNT_DETACH);
        /* disk full: a 1 MiB tmpfs cannot hold the reserved segment files */
        if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") == 0) {
            shp big = s;
            big.nctx = 4096; /* 2 layers x 4096 x 512 bytes: 4 MiB of segment files */
            b.cold_dir = mnt;
            st = try_create(&big, &b, &err, &kv);
            TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "needs") && strstr(err.msg, mnt),
                     "disk full: %d %s", st, err.msg);
            printf("disk full (1 MiB tmpfs): %s\n", err.msg);
            tr_kv_free(kv);
            kv = NULL;
            /* a pool that fits is reserved in full at create: the device cannot fill up later */
            shp s2 = s;
            s2.nctx = 64;
            tr_kv_params b2 = b;
            b2.n_sink = 0;
            b2.hot_bytes = (uint64_t)s2.nl * 16 * 512;
            st = try_create(&s2, &b2, &err, &kv);
            TU_CHECK(st == TR_OK, "small pool on tmpfs: %s", err.msg);
            tr_kv_free(kv);
            kv = NULL;
            umount2(mnt, MNT_DETACH);
        } else {
            printf("disk full: SKIPPED (mount not permitted: %s)\n", strerror(errno));
        }
    } else {
        printf("read-only cold dir and disk full on tmpfs: SKIPPED (mount not permitted: %s)\n",
               strerror(errno));
    }
    rmdir(mnt);

    /* a write that fails (ENOSPC injected into the 5th page write) */
    b = p;
    b.cold_dir = g_tmp;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_OK, "create: %s", err.msg);
    if (kv) {
        set_write_fault(kv, 5, ENOSPC);
        st = TR_OK;
        for (int32_t t = 0; t < 256 && !st; t++)
            for (int32_t l = 0; l < s.nl && !st; l++)
                st = tr_kv_append(kv, l, t, dk(&d, l, t), dv(&d, l, t), &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "full") && strstr(err.msg, "page"),
                 "write fault: %d %s", st, err.msg);
        printf("write fault: %s\n", err.msg);
        tr_kv_free(kv);
        kv = NULL;
    }

    /* a corrupted page: one flipped bit in a cold record -> TR_E_IO naming file, layer, page */
    b = p;
    b.cold_dir = g_tmp;
    b.alpha = 1.0f;
    b.policy = TR_KV_OFFLOAD;
    st = try_create(&s, &b, &err, &kv);
    if (kv && fill(kv, &d, 0, 256)) {
        int32_t pos = 255;
        query_make(q, &s, pos, 1, false);
        st = attend_rows(kv, g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_OK, "attend before corruption: %s", err.msg);
        char seg[400], fdpath[64];
        tr_kv_seg_path(KVS(kv), 1, seg, sizeof seg);
        /* the file is unlinked already (it lives on through the cache's descriptor) */
        TU_CHECK(access(seg, F_OK) != 0, "%s still has a name", seg);
        snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", KVS(kv)->layers[1].fd);
        flip_byte(fdpath, (off_t)(tr_kv_page_offset(KVS(kv), 3) + 2 * KVS(kv)->rec + 77));
        st = attend_rows(kv, g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "checksum") && strstr(err.msg, "layer 1") &&
                     strstr(err.msg, "page 3") && strstr(err.msg, "position 50") &&
                     strstr(err.msg, seg),
                 "corrupted page: %d %s", st, err.msg);
        printf("corrupted page: %s\n", err.msg);
        /* the other layer is unaffected */
        st = attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_OK, "layer 0 after corrupting layer 1: %s", err.msg);
        /* a failing read (EIO on the next read) */
        tr_io_pool_set_faults(KVS(kv)->io, KVS(kv)->pool_reads + 1, 0);
        st = attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "Input/output error"), "read fault: %d %s", st,
                 err.msg);
        printf("read fault: %s\n", err.msg);
        /* the same with the reads in flight as chunks attended as they arrive (tr_kv.pipe): the
         * failing chunk is named, the others are waited for, and the cache works afterwards */
        tr_kv_pooled_of(kv)->pipe_min = 1;
        st = attend_rows(kv, g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "checksum") && strstr(err.msg, "position 50"),
                 "corrupted page, pipelined: %d %s", st, err.msg);
        tr_io_pool_set_faults(KVS(kv)->io, KVS(kv)->pool_reads + 3, 0);
        st = attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "Input/output error"),
                 "read fault, pipelined: %d %s", st, err.msg);
        st = attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_OK, "layer 0 after a failed pipelined read: %s", err.msg);
        /* the cold files are removed at free */
        char dir[400];
        snprintf(dir, sizeof dir, "%s", tr_kv_cold_path(kv));
        tr_kv_free(kv);
        kv = NULL;
        TU_CHECK(access(dir, F_OK) != 0, "cold directory %s left behind", dir);
    }
    tr_kv_free(kv);
    /* ... and kept with keep */
    b = p;
    b.cold_dir = g_tmp;
    b.keep = true;
    if (try_create(&s, &b, &err, &kv) == TR_OK) {
        char dir[400], seg0[400], seg1[400];
        snprintf(dir, sizeof dir, "%s", tr_kv_cold_path(kv));
        fill(kv, &d, 0, 64);
        tr_kv_seg_path(KVS(kv), 0, seg0, sizeof seg0);
        tr_kv_seg_path(KVS(kv), 1, seg1, sizeof seg1);
        tr_kv_free(kv);
        TU_CHECK(access(seg0, F_OK) == 0 && access(seg1, F_OK) == 0, "keep: %s removed", seg0);
        unlink(seg0);
        unlink(seg1);
        rmdir(dir);
    }
    free(q);
    free(o);
    data_free(&d);
}

int main(void) {
    static void (*const tests[])(void) = {test_hash, test_truncate, test_save_restore, test_faults};
    return kv_test_main("test_kv_store", tests, (int)(sizeof tests / sizeof *tests));
}
