/*
 * Tiered's modules: BKP placement (bit-identical outputs, consistent pools, ping-pong against
 * naive promotion), APP's given and measured rates and its exploration of a starved side, the
 * pulled-keys baseline, and speculation (--kv-spec: selections made and read ahead).
 */
#include "kv_test.h"

/* ---- BKP: placement between the pools ----------------------------------------------------------
 * The same decode run (append a token, attend from it, in both layers) through four caches that
 * differ only in placement: off, naive, on, and on with a working set that forces chunks (against
 * off with the same working set). The output must be bit-identical: placement decides where rows
 * are read from, never which. Then: the hot pool stays within its budget with its slot maps
 * consistent and the sinks hot; BKP finds more selected tokens hot than static placement, and
 * makes at least 5x fewer ping-pong moves than naive promotion. */
static bool pools_consistent(const tr_kv *kv) {
    for (int32_t l = 0; l < kv->shape.n_layer; l++) {
        const tr_kv_slayer *L = &KVS(kv)->layers[l];
        int32_t hot = 0;
        for (int32_t t = 0; t < L->len; t++) {
            if (L->tok[t].where != TR_KV_TOK_HOT) continue;
            hot++;
            if (L->slot_pos[L->tok[t].slot] != t) return false;
        }
        if (hot + L->n_free != KVS(kv)->hot_slots) return false;
        for (int32_t t = 0; t < kv->params.n_sink && t < L->len; t++)
            if (L->tok[t].where != TR_KV_TOK_HOT) return false;
    }
    return true;
}

static void test_bkp(void) {
    const shp s = {"GQA", 2, 640, 8, 2, 64, 64};
    enum { N0 = 256, NK = 5 };
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 77, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    const uint64_t rec = (uint64_t)s.nkv * (uint64_t)(s.hdk + s.hdv) * 2;
    const tr_kv_bkp mode[NK] = {TR_KV_BKP_OFF, TR_KV_BKP_NAIVE, TR_KV_BKP_ON, TR_KV_BKP_OFF,
                                TR_KV_BKP_ON};
    tr_kv *kv[NK];
    tr_kv_params p[NK];
    for (int i = 0; i < NK; i++) {
        p[i] = params(TR_KV_TIERED, 0.15f);
        p[i].bkp = mode[i];
        p[i].hot_bytes = hot_min(&s, &p[i]) + (uint64_t)s.nl * 48 * rec; /* 66 of 640 tokens */
        p[i].cold_dir = g_tmp;
        if (i >= 3) p[i].ws_bytes = 40 * rec; /* chunks of 20 */
        kv[i] = mk(&s, &p[i]);
        /* joined reads (read gap) add placement-dependent entries to the gathered list, which
         * moves the chunk boundaries and so the online softmax's rounding: exact comparison of
         * chunked runs needs the list to be the selection itself */
        if (kv[i] && i >= 3) tr_kv_pooled_of(kv[i])->read_gap = 0;
        if (!kv[i] || !fill(kv[i], &d, 0, N0)) {
            for (int j = 0; j <= i; j++) tr_kv_free(kv[j]);
            data_free(&d);
            return;
        }
    }
    /* not with another policy */
    {
        tr_kv_params bad = params(TR_KV_QUEST, 0.15f);
        bad.bkp = TR_KV_BKP_ON;
        tr_kv *x = NULL;
        tr_error err = {0};
        const tr_kv_shape sh = to_shape(&s);
        TU_CHECK(tr_kv_create(&sh, &bad, &x, &err) == TR_E_ARG && strstr(err.msg, "tiered"),
                 "bkp with quest: %s", err.msg);
        tr_kv_free(x);
    }
    float *q = malloc(sizeof(float) * qn), *o[NK];
    for (int i = 0; i < NK; i++) o[i] = malloc(sizeof(float) * on);
    const float scale = 1.0f / sqrtf((float)s.hdk);
    tr_error err = {0};
    int differ = 0, inconsistent = 0;
    for (int32_t pos = N0; pos < s.nctx; pos++)
        for (int32_t l = 0; l < s.nl; l++) {
            /* decoding revisits what matters: the query of a step resembles one of a few
             * recurring ones (a topic), so the same tokens keep being selected */
            query_make(q, &s, pos, 500 + (uint64_t)((pos * 7) % 5) + 10 * (uint64_t)l, false);
            for (int i = 0; i < NK; i++) {
                if (tr_kv_append(kv[i], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err) ||
                    attend_rows(kv[i], g_pool, l, 1, &pos, q, qn, scale, NULL, 0, o[i], on,
                                      &err)) {
                    TU_CHECK(0, "bkp %s step %d: %s", tr_kv_bkp_name(mode[i]), pos, err.msg);
                    goto out;
                }
                inconsistent += !pools_consistent(kv[i]);
            }
            for (int i = 1; i < 3; i++) differ += memcmp(o[i], o[0], on * sizeof(float)) != 0;
            differ += memcmp(o[4], o[3], on * sizeof(float)) != 0;
        }
    TU_CHECK(differ == 0, "placement changed the attention output in %d steps", differ);
    TU_CHECK(inconsistent == 0, "hot pool inconsistent (slots, budget or sinks) in %d checks",
             inconsistent);
    tr_kv_stats st[NK];
    for (int i = 0; i < NK; i++) {
        tr_kv_get_stats(kv[i], &st[i]);
        TU_CHECK(st[i].hot_bytes <= p[i].hot_bytes, "hot %llu > budget %llu",
                 (unsigned long long)st[i].hot_bytes, (unsigned long long)p[i].hot_bytes);
        TU_CHECK(st[i].migrated_bytes == st[i].promotions * rec, "migrated bytes");
    }
    const int32_t steps = (s.nctx - N0) * s.nl;
    double hit[NK];
    for (int i = 0; i < NK; i++) {
        hit[i] = (double)st[i].sel_hot / (double)(st[i].sel_hot + st[i].sel_cold);
        printf("bkp %-5s%s: selected found hot %.1f %%, read %.2f MiB, %llu promotions, %llu "
               "demotions, ping-pong %.3f per layer-step\n",
               tr_kv_bkp_name(mode[i]), i >= 3 ? " (chunked)" : "", 100 * hit[i],
               (double)st[i].bytes_read / 1048576.0, (unsigned long long)st[i].promotions,
               (unsigned long long)st[i].demotions, (double)st[i].pingpong / steps);
    }
    TU_CHECK(st[0].promotions == 0 && st[2].promotions > 0 && st[4].promotions > 0,
             "promotions off %llu on %llu", (unsigned long long)st[0].promotions,
             (unsigned long long)st[2].promotions);
    TU_CHECK(hit[2] > hit[0] + 0.05, "BKP hot hit rate %.3f vs static %.3f", hit[2], hit[0]);
    TU_CHECK(st[2].bytes_read < st[0].bytes_read, "BKP read %llu bytes, static %llu",
             (unsigned long long)st[2].bytes_read, (unsigned long long)st[0].bytes_read);
    TU_CHECK(st[1].pingpong > 0 && st[2].pingpong * 5 <= st[1].pingpong,
             "ping-pong: BKP %llu, naive %llu (want 5x fewer)", (unsigned long long)st[2].pingpong,
             (unsigned long long)st[1].pingpong);
out:
    for (int i = 0; i < NK; i++) {
        tr_kv_free(kv[i]);
        free(o[i]);
    }
    free(q);
    data_free(&d);
}

/* APP with its rates given (--kv-app-rates) rather than measured: beta from the balance equation
 * of tr_kv_app_beta, and the given rates are never overwritten by measurements */
static void test_app_rates(void) {
    const shp s = {"GQA", 2, 64, 8, 2, 64, 64};
    tr_kv_params p = params(TR_KV_TIERED, 0.25f);
    p.research.app_f_c = 2e6;
    p.research.app_f_s = 1e6;
    tr_kv *kv = mk(&s, &p);
    if (!kv) return;
    TU_CHECK(fabs(tr_kv_app_beta(APP(kv)) - 2.0) < 1e-9, "APP rates: beta %g, want 2 (agent half as "
             "fast: the host takes two tokens for each of the agent's)", tr_kv_app_beta(APP(kv)));
    /* the row rates are measured (and reported) but do not move the balance: the split moves
     * no rows (see tr_kv_app_beta) */
    note_rows(kv, 1000, 1000, 1000, 1000); /* measured link rates: 1 byte/ns */
    TU_CHECK(fabs(tr_kv_app_beta(APP(kv)) - 2.0) < 1e-9 && fabs(APP(kv)->bc - 1.0) < 1e-9,
             "APP rates with measured links: beta %g (want 2), B_c %g bytes/ns",
             tr_kv_app_beta(APP(kv)), APP(kv)->bc);
    tr_kv_free(kv);
    p.research.app_b_c = 4e9; /* 4 bytes/ns given: the measurement of the hot-pool copies is ignored */
    kv = mk(&s, &p);
    if (!kv) return;
    note_rows(kv, 1000, 1000, 1000, 1000);
    TU_CHECK(fabs(tr_kv_app_beta(APP(kv)) - 2.0) < 1e-9 && fabs(APP(kv)->bc - 4.0) < 1e-9,
             "APP rates, B_c given: beta %g (want 2), B_c %g bytes/ns", tr_kv_app_beta(APP(kv)),
             APP(kv)->bc);
    printf("APP with given rates: beta %.3f from f_c / f_s, the row rates measured or given and "
           "reported\n", tr_kv_app_beta(APP(kv)));
    tr_kv_free(kv);
}

/* APP's measured rates recover from a stale one: a start-up probe (or a step) that found the agent
 * 1000x slower than it is gives it ~0 tokens, too few to measure it again; every
 * TR_KV_APP_EXPLORE layers it gets TR_KV_APP_MIN_PART tokens, measured at half weight. Without
 * that, beta would stay at 1000. And one outlying sample moves an average by at most a tenth. */
static void test_app_explore(void) {
    double a = 100.0;
    tr_kv_app_avg(&a, 1e6);
    const double a1 = a;
    tr_kv_app_avg(&a, 0.0);
    TU_CHECK(fabs(a1 - 110.0) < 1e-9 && fabs(a - 104.5) < 1e-9,
             "APP average: 100 then a sample of 1e6 gives %g (want 110), then 0 gives %g (104.5)",
             a1, a);
    const shp s = {"GQA", 1, 2700, 4, 1, 32, 32};
    enum { N0 = 2600, ROWS = 48 };
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 93, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    tr_kv_params p = cold_params(&s, true);
    tr_kv *kv = mk(&s, &p);
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on);
    tr_error err = {0};
    int explored = 0, failed = 0;
    double beta0 = 0;
    if (!kv || !fill(kv, &d, 0, N0)) goto out;
    for (int32_t pos = N0; pos < N0 + ROWS && !failed; pos++) {
        query_make(q, &s, pos, 500 + (uint64_t)pos, false);
        if (tr_kv_append(kv, 0, pos, dk(&d, 0, pos), dv(&d, 0, pos), &err) ||
            attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err)) {
            TU_CHECK(0, "APP explore, row %d: %s", pos, err.msg);
            failed = 1;
            break;
        }
        if (pos == N0) { /* after the probe and the first split: the agent's rate made stale */
            APP(kv)->ts = APP(kv)->tc * 1000.0;
            beta0 = tr_kv_app_beta(APP(kv));
        } else {
            /* a split the agent gets TR_KV_APP_MIN_PART of (beta_split = host / agent) */
            explored += APP(kv)->beta_split < 10.0;
        }
    }
    const double beta1 = tr_kv_app_beta(APP(kv));
    /* the layer's selections count from the first row: the 16th, 32nd and 48th explore */
    TU_CHECK(!failed && explored == ROWS / TR_KV_APP_EXPLORE && beta1 < beta0 / 4,
             "APP explore: %d splits fed the starved agent (want %d), beta %g -> %g", explored,
             ROWS / TR_KV_APP_EXPLORE, beta0, beta1);
    printf("APP explore: a stale agent rate (beta %.0f) measured again %d times in %d rows: beta "
           "%.1f\n", beta0, explored, ROWS - 1, beta1);
out:
    tr_kv_free(kv);
    free(q);
    free(o);
    data_free(&d);
}

/* The agent's baseline (tr_kv.pull_keys): host scoring that reads every cold page's key copy from
 * storage first. Same outputs as tiered, more bytes read (the key copies of every written page),
 * and a corrupted key copy on storage is a named error. */
static void test_pull_keys(void) {
    const shp s = {"GQA", 2, 256, 8, 2, 64, 64};
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 83, false);
    tr_kv_params p = params(TR_KV_TIERED, 0.25f);
    p.cold_dir = g_tmp;
    p.hot_bytes = hot_min(&s, &p);
    tr_kv *kv[2] = {mk(&s, &p), mk(&s, &p)};
    float *q = malloc(sizeof(float) * qn), *o[2] = {malloc(sizeof(float) * on),
                                                     malloc(sizeof(float) * on)};
    tr_error err = {0};
    if (!kv[0] || !kv[1] || !fill(kv[0], &d, 0, 256) || !fill(kv[1], &d, 0, 256)) goto out;
    set_pull_keys(kv[1], true);
    int32_t pos = 255;
    query_make(q, &s, pos, 7, false);
    uint64_t bytes[2];
    for (int i = 0; i < 2; i++) {
        tr_kv_stats st;
        tr_kv_get_stats(kv[i], &st);
        const uint64_t b0 = st.bytes_read;
        TU_CHECK(attend_rows(kv[i], g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o[i], on,
                                   &err) == TR_OK,
                 "pull keys %d: %s", i, err.msg);
        tr_kv_get_stats(kv[i], &st);
        bytes[i] = st.bytes_read - b0;
    }
    const uint64_t keys = (uint64_t)KVS(kv[1])->layers[1].pages_written *
                          (uint64_t)(KVS(kv[1])->page_toff - KVS(kv[1])->page_qoff);
    TU_CHECK(memcmp(o[0], o[1], on * sizeof(float)) == 0, "pull keys: outputs differ");
    TU_CHECK(bytes[1] >= bytes[0] + keys, "pull keys: %llu bytes read vs %llu + key copies %llu",
             (unsigned long long)bytes[1], (unsigned long long)bytes[0],
             (unsigned long long)keys);
    printf("pull keys: same output, %llu bytes read vs %llu (key copies of %d pages: %llu)\n",
           (unsigned long long)bytes[1], (unsigned long long)bytes[0],
           KVS(kv[1])->layers[1].pages_written, (unsigned long long)keys);
    char fdpath[64];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", KVS(kv[1])->layers[1].fd);
    flip_byte(fdpath, (off_t)(tr_kv_page_offset(KVS(kv[1]), 2) + KVS(kv[1])->page_qoff + 5));
    tr_status st = attend_rows(kv[1], g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o[1], on,
                                     &err);
    TU_CHECK(st == TR_E_IO && strstr(err.msg, "key copy") && strstr(err.msg, "page 2") &&
                 strstr(err.msg, "layer 1"),
             "pull keys, corrupted key copy: %d %s", st, err.msg);
    printf("pull keys, corrupted key copy: %s\n", err.msg);
out:
    for (int i = 0; i < 2; i++) {
        tr_kv_free(kv[i]);
        free(o[i]);
    }
    free(q);
    data_free(&d);
}

/* --kv-spec: a selection made ahead (during the previous layer's attention, its reads started
 * then) equals the same speculative selection made at the layer itself; the agent's equals the
 * host's; the speculation is used (outputs differ from selecting with the real query); the row's
 * own record, stored after the reads were started, is attended; misuse is a named error */
static void test_spec(void) {
    const shp s = {"GQA", 3, 400, 8, 2, 64, 64};
    enum { N0 = 200, NR = 4 };
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 77, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    /* 0: ahead, host; 1: at the layer, host; 2: ahead, agent; 3: no speculation */
    tr_kv *kv[NR] = {0};
    for (int i = 0; i < NR; i++) {
        tr_kv_params p = cold_params(&s, i == 2);
        p.n_window = TR_KV_PAGE; /* as in use: at least a page (see tr_kv_select_row) */
        p.bkp = TR_KV_BKP_ON;
        p.research.beta = 0.5f; /* the same host/agent split everywhere */
        p.spec = i != 3;
        kv[i] = mk(&s, &p);
        if (!kv[i]) goto out;
        tr_kv_pooled_of(kv[i])->read_gap = 0;
        tr_kv_pooled_of(kv[i])->pipe_min = 1; /* pipelined reads at every size: the ones started ahead */
        if (!fill(kv[i], &d, 0, N0)) goto out;
    }
    {
        float *q = malloc(sizeof(float) * qn * s.nl), *qs = malloc(sizeof(float) * qn * s.nl);
        float *o[NR];
        for (int i = 0; i < NR; i++) o[i] = malloc(sizeof(float) * on);
        const float scale = 1.0f / sqrtf((float)s.hdk);
        tr_error err = {0};
        int same01 = 0, same02 = 0, same03 = 0, n = 0, failed = 0;
        for (int32_t pos = N0; pos < s.nctx && !failed; pos++) {
            for (int32_t l = 0; l < s.nl; l++) {
                query_make(q + l * qn, &s, pos, 500 + (uint64_t)l, false);
                query_make(qs + l * qn, &s, pos, 7000 + (uint64_t)l * 31 + (uint64_t)pos, false);
            }
            for (int32_t l = 0; l < s.nl && !failed; l++) {
                for (int i = 0; i < NR && !failed; i++) {
                    tr_status st = TR_OK;
                    if ((i == 0 || i == 2) && l + 1 < s.nl) /* ahead: during layer l */
                        st = tr_kv_seam_spec_query(kv[i], l + 1, 1, &pos, qs + (l + 1) * qn, qn, scale,
                                              0, &err);
                    if (!st) st = tr_kv_append(kv[i], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err);
                    if (!st && i == 1 && l > 0) /* at the layer itself */
                        st = tr_kv_seam_spec_query(kv[i], l, 1, &pos, qs + l * qn, qn, scale, 0, &err);
                    if (!st)
                        st = attend_rows(kv[i], g_pool, l, 1, &pos, q + l * qn, qn, scale,
                                               NULL, 0, o[i], on, &err);
                    if (st) {
                        TU_CHECK(0, "spec run %d, step %d, layer %d: %s", i, pos, l, err.msg);
                        failed = 1;
                    }
                }
                if (failed) break;
                if (l == 0) continue; /* layer 0 has no speculation */
                n++;
                same01 += !memcmp(o[0], o[1], on * sizeof(float));
                same02 += !memcmp(o[0], o[2], on * sizeof(float));
                same03 += !memcmp(o[0], o[3], on * sizeof(float));
            }
        }
        tr_kv_stats st[NR];
        for (int i = 0; i < NR; i++) tr_kv_get_stats(kv[i], &st[i]);
        TU_CHECK(!failed && same01 == n && same02 == n,
                 "speculative selection: ahead vs at the layer %d of %d outputs identical, agent "
                 "vs host %d", same01, n, same02);
        TU_CHECK(same03 < n / 2, "the speculative query is not used: %d of %d outputs equal to "
                 "the real query's selection", same03, n);
        TU_CHECK(st[0].spec_rows == (uint64_t)n && st[0].spec_early == (uint64_t)n &&
                     st[2].spec_early == (uint64_t)n && st[1].spec_rows == (uint64_t)n &&
                     st[1].spec_early == 0 && st[3].spec_rows == 0,
                 "spec counters: ahead %llu/%llu, agent %llu, at the layer %llu/%llu of %d",
                 (unsigned long long)st[0].spec_early, (unsigned long long)st[0].spec_rows,
                 (unsigned long long)st[2].spec_early, (unsigned long long)st[1].spec_early,
                 (unsigned long long)st[1].spec_rows, n);
        TU_CHECK(st[2].bytes_read == st[0].bytes_read && st[0].bytes_read > 0,
                 "rows read: agent %llu, host %llu", (unsigned long long)st[2].bytes_read,
                 (unsigned long long)st[0].bytes_read);
        printf("spec: %d layer steps selected ahead, identical to the same selection made at the "
               "layer and to the agent's; %d of them equal to the real query's; mean cosine %.3f\n",
               n, same03, st[0].spec_rows ? st[0].spec_cos_sum / (double)st[0].spec_rows : 0.0);
        /* a selection made ahead for a step that does not come (truncated): dropped, its reads
         * waited for; the next steps are exact again */
        int32_t pos = s.nctx - 8;
        tr_status ts = tr_kv_truncate(kv[2], pos, &err);
        for (int32_t l = 0; l < 1 && !ts; l++) {
            ts = tr_kv_seam_spec_query(kv[2], 1, 1, &pos, qs + qn, qn, scale, 0, &err);
            if (!ts) ts = tr_kv_append(kv[2], 0, pos, dk(&d, 0, pos), dv(&d, 0, pos), &err);
            if (!ts)
                ts = attend_rows(kv[2], g_pool, 0, 1, &pos, q, qn, scale, NULL, 0, o[2],
                                       on, &err);
        }
        if (!ts) ts = tr_kv_truncate(kv[2], pos, &err); /* layer 1's selection was made ahead */
        for (int32_t l = 0; l < s.nl && !ts; l++) {
            ts = tr_kv_append(kv[2], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err);
            if (!ts)
                ts = attend_rows(kv[2], g_pool, l, 1, &pos, q, qn, scale, NULL, 0, o[2],
                                       on, &err);
        }
        TU_CHECK(!ts, "spec: truncate with a selection made ahead: %s", err.msg);
        /* rows computed together (a prefill), as the forward pass gives them: layer l + 1's
         * queries before layer l attends; each layer's rows select with its own */
        const uint64_t rows0 = stats_of(kv[0]).spec_rows;
        pos = s.nctx - 8;
        ts = tr_kv_truncate(kv[0], pos, &err);
        const int32_t prow[2] = {pos, pos + 1};
        for (int32_t l = 0; l < s.nl && !ts; l++) {
            if (l + 1 < s.nl)
                ts = tr_kv_seam_spec_query(kv[0], l + 1, 2, prow, qs + (l + 1) * qn, 0, scale, 0, &err);
            for (int r = 0; r < 2 && !ts; r++)
                ts = tr_kv_append(kv[0], l, prow[r], dk(&d, l, prow[r]), dv(&d, l, prow[r]), &err);
            float o2[2 * 8 * 64];
            if (!ts)
                ts = attend_rows(kv[0], g_pool, l, 2, prow, q + l * qn, 0, scale, NULL, 0,
                                       o2, on, &err);
        }
        /* the agent killed while the rows of layer 1, requested ahead during layer 0, are
         * awaited: the step fails within a second naming it, and nothing hangs (the free below
         * waits for the request made ahead) */
        {
            pos = s.nctx - 7; /* the next position: the runs above stored up to s.nctx - 8 */
            const uint64_t early0 = stats_of(kv[2]).spec_early;
            tr_status fs = tr_kv_truncate(kv[2], pos, &err);
            if (!fs) fs = tr_kv_seam_spec_query(kv[2], 1, 1, &pos, qs + qn, qn, scale, 0, &err);
            if (!fs) fs = tr_kv_append(kv[2], 0, pos, dk(&d, 0, pos), dv(&d, 0, pos), &err);
            if (!fs)
                fs = attend_rows(kv[2], g_pool, 0, 1, &pos, q, qn, scale, NULL, 0, o[2], on,
                                       &err);
            const bool ahead = stats_of(kv[2]).spec_early == early0 + 1;
            kill(tr_kv_seam_agent_pid(kv[2]), SIGKILL);
            const uint64_t t0 = tr_now_ns();
            for (int32_t l = 1; l < s.nl && !fs; l++) {
                fs = tr_kv_append(kv[2], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err);
                if (!fs)
                    fs = attend_rows(kv[2], g_pool, l, 1, &pos, q + l * qn, qn, scale, NULL,
                                           0, o[2], on, &err);
            }
            const double ms = (double)(tr_now_ns() - t0) / 1e6;
            TU_CHECK(ahead && fs != TR_OK && strstr(err.msg, "killed by signal 9") && ms < 1000.0,
                     "spec: agent killed with rows requested ahead (%s): status %d after %.0f ms, "
                     "'%s'", ahead ? "they were" : "they were NOT", (int)fs, ms, err.msg);
            printf("spec: agent killed with the next layer's rows requested ahead: %s (%.0f ms)\n",
                   err.msg, ms);
        }
        TU_CHECK(!ts && stats_of(kv[0]).spec_rows - rows0 == (uint64_t)(2 * (s.nl - 1)),
                 "spec, 2 rows at once: %llu rows selected with their speculative query, want %d "
                 "(%s)", (unsigned long long)(stats_of(kv[0]).spec_rows - rows0), 2 * (s.nl - 1),
                 ts ? err.msg : "ok");
        for (int i = 0; i < NR; i++) free(o[i]);
        free(q);
        free(qs);
    }
    {
        tr_error err = {0};
        int32_t pos = 0;
        float qq[8] = {0};
        TU_CHECK(tr_kv_seam_spec_query(kv[3], 1, 1, &pos, qq, 0, 1.0f, 0, &err) == TR_E_ARG &&
                     strstr(err.msg, "--kv-spec"),
                 "a speculative query without --kv-spec: %s", err.msg);
        tr_kv_params p = params(TR_KV_TIERED, 0.15f);
        p.spec = true;
        p.tail_bits = 4;
        tr_kv *bad = NULL;
        const tr_kv_shape sh = to_shape(&s);
        TU_CHECK(tr_kv_create(&sh, &p, &bad, &err) == TR_E_ARG && strstr(err.msg, "--kv-tail"),
                 "--kv-spec with --kv-tail: %s", err.msg);
        p = params(TR_KV_QUEST, 0.15f);
        p.spec = true;
        TU_CHECK(tr_kv_create(&sh, &p, &bad, &err) == TR_E_ARG && strstr(err.msg, "tiered"),
                 "--kv-spec with quest: %s", err.msg);
    }
out:
    for (int i = 0; i < NR; i++) tr_kv_free(kv[i]);
    data_free(&d);
}


/* Prefill through the tiers: calls of several rows (chunks of B positions) attend exactly, as
 * full does, over a cold pool, reading each cold page at most once per chunk and layer: the
 * bytes read stay within the sum of the cold pool's size at each chunk, itself within
 * ceil(n / B) x the final one. With prefill_select each row selects as a decode step and reads
 * far more; a single-row call after the prefill still selects. The exact path runs with the
 * list in one gather, in working-set halves and pipelined. */
static void test_prefill(void) {
    enum { N = 600, B = 96 };
    const shp s = {"GQA", 2, N + 8, 8, 2, 64, 64};
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    const uint64_t rec = (uint64_t)s.nkv * (uint64_t)(s.hdk + s.hdv) * 2;
    const float scale = 0.125f;
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 91, false);
    float *q = malloc(sizeof(float) * qn * B), *o = malloc(sizeof(float) * on * B),
          *ro = malloc(sizeof(float) * on);
    int32_t pos[B];
    tr_error err = {0};
    enum { V_ONE, V_HALVES, V_PIPE, V_SELECT, NV };
    static const char *const vname[NV] = {"one gather", "halves", "pipelined", "select"};
    uint64_t read[NV] = {0};
    for (int v = 0; v < NV; v++) {
        tr_kv_params p = params(TR_KV_TIERED, 0.15f);
        p.cold_dir = g_tmp;
        p.hot_bytes = hot_min(&s, &p) + (uint64_t)s.nl * 32 * rec;
        p.prefill_select = v == V_SELECT;
        p.max_rows = B;
        if (v == V_HALVES) p.ws_bytes = 128 * rec;
        tr_kv *kv = mk(&s, &p);
        if (!kv) break;
        if (v == V_PIPE) {
            tr_kv_seam sm;
            tr_kv_seam_get(kv, &sm);
            sm.pipe_min = 0;
            TU_CHECK(tr_kv_seam_set(kv, &sm, &err) == TR_OK, "seam: %s", err.msg);
        }
        float worst = 0.0f;
        bool ok = true;
        for (int32_t c0 = 0; c0 < N && ok; c0 += B) {
            const int32_t nr = N - c0 < B ? N - c0 : B;
            for (int32_t l = 0; l < s.nl && ok; l++) {
                for (int32_t r = 0; r < nr && ok; r++) {
                    pos[r] = c0 + r;
                    query_make(q + (size_t)r * qn, &s, pos[r], 500 + (uint64_t)(l * N + pos[r]),
                               false);
                    ok = tr_kv_append(kv, l, pos[r], dk(&d, l, pos[r]), dv(&d, l, pos[r]),
                                      &err) == TR_OK;
                }
                ok = ok && attend_rows(kv, g_pool, l, nr, pos, q, qn, scale, NULL, 0, o, on,
                                       &err) == TR_OK;
                TU_CHECK(ok, "prefill %s, chunk at %d, layer %d: %s", vname[v], c0, l, err.msg);
                for (int32_t r = 0; r < nr && ok && v != V_SELECT; r++) {
                    ref_attend(&d, l, &s, pos[r], q + (size_t)r * qn, scale, NULL, 0, NULL, ro);
                    const float e = maxdiff(o + (size_t)r * on, ro, on);
                    if (e > worst) worst = e;
                }
            }
        }
        const tr_kv_stats st = stats_of(kv);
        read[v] = st.bytes_read;
        if (v != V_SELECT) {
            const uint64_t chunks = (N + B - 1) / B;
            TU_CHECK(worst <= TOL, "prefill %s: max |diff| to exact attention %.3g > %.3g",
                     vname[v], worst, TOL);
            TU_CHECK(st.prefill_chunks == chunks && st.bytes_read == st.prefill_bytes_read &&
                         st.bytes_read > 0 && st.bytes_read <= st.prefill_read_bound &&
                         st.prefill_read_bound <= chunks * st.cold_bytes,
                     "prefill %s: %llu chunks, read %llu (prefill %llu), bound %llu, %llu x cold "
                     "%llu", vname[v], (unsigned long long)st.prefill_chunks,
                     (unsigned long long)st.bytes_read, (unsigned long long)st.prefill_bytes_read,
                     (unsigned long long)st.prefill_read_bound, (unsigned long long)chunks,
                     (unsigned long long)st.cold_bytes);
            printf("prefill %s: max |diff| %.2g, read %llu bytes in %llu chunks (bound %llu, "
                   "cold pool %llu)\n", vname[v], (double)worst, (unsigned long long)st.bytes_read,
                   (unsigned long long)st.prefill_chunks, (unsigned long long)st.prefill_read_bound,
                   (unsigned long long)st.cold_bytes);
        } else {
            TU_CHECK(st.prefill_chunks == 0 && read[V_SELECT] > 2 * read[V_ONE],
                     "prefill_select: %llu exact chunks, read %llu vs exact %llu",
                     (unsigned long long)st.prefill_chunks, (unsigned long long)read[V_SELECT],
                     (unsigned long long)read[V_ONE]);
            printf("prefill with selection per row: read %llu bytes (exact: %llu)\n",
                   (unsigned long long)read[V_SELECT], (unsigned long long)read[V_ONE]);
        }
        /* decode after the prefill selects */
        if (ok && v == V_ONE) {
            pos[0] = N;
            for (int32_t l = 0; l < s.nl && ok; l++) {
                query_make(q, &s, N, 77, false);
                ok = tr_kv_append(kv, l, N, dk(&d, l, N), dv(&d, l, N), &err) == TR_OK &&
                     attend_rows(kv, g_pool, l, 1, pos, q, qn, scale, NULL, 0, o, on, &err) ==
                         TR_OK;
            }
            const tr_kv_stats s2 = stats_of(kv);
            TU_CHECK(ok && s2.selected < (uint64_t)s.nl * (N + 1) / 2 &&
                         s2.prefill_chunks == st.prefill_chunks,
                     "decode after prefill: %s, %llu tokens attended over %d layers", err.msg,
                     (unsigned long long)s2.selected, s.nl);
        }
        tr_kv_free(kv);
    }
    free(q);
    free(o);
    free(ro);
    data_free(&d);
}

int main(void) {
    static void (*const tests[])(void) = {test_bkp,       test_app_rates, test_app_explore,
                                          test_pull_keys, test_spec,      test_prefill};
    return kv_test_main("test_kv_tiered", tests, (int)(sizeof tests / sizeof *tests));
}
