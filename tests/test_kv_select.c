/*
 * How the selective policies choose: top-k, the selection against a brute-force one, the
 * step-to-step repeat, the recall of INT8 and INT4 scoring against the exact per-head top-k with four
 * aggregations over heads and the channel equalisation (measured, printed), h2o's permanent
 * eviction, quest's bounds, and the tail estimate of the unselected tokens.
 */
#include "kv_test.h"

static void test_topk(void) {
    tu_rng r = {77};
    float *s = malloc(sizeof(float) * 1000), *srt = malloc(sizeof(float) * 1000),
          *got = malloc(sizeof(float) * 1000);
    int32_t *idx = malloc(sizeof(int32_t) * 1000);
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        const int32_t n = 1 + (int32_t)(tu_next(&r) % 1000), k = (int32_t)(tu_next(&r) % (n + 1));
        const bool ties = it % 3 == 0;
        for (int32_t i = 0; i < n; i++) {
            s[i] = ties ? (float)(tu_next(&r) % 7) : tu_uniform(&r);
            srt[i] = s[i];
            idx[i] = i;
        }
        tr_kv_topk(s, idx, n, k);
        qsort(srt, (size_t)n, sizeof(float), cmp_f_desc);
        for (int32_t i = 0; i < k; i++) got[i] = s[idx[i]];
        qsort(got, (size_t)k, sizeof(float), cmp_f_desc);
        /* the k values chosen are the k largest (as a multiset), and idx stays a permutation */
        for (int32_t i = 0; i < k; i++)
            if (got[i] != srt[i]) bad++;
        int64_t sum = 0;
        for (int32_t i = 0; i < n; i++) sum += idx[i];
        if (sum != (int64_t)n * (n - 1) / 2) bad++;
    }
    TU_CHECK(bad == 0, "top-k differs from sorting in %d places", bad);
    free(s);
    free(srt);
    free(got);
    free(idx);
}

static void test_selection(void) {
    const shp s = {"GQA", 2, 500, 8, 2, 64, 64};
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 21, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on),
          *ro = malloc(sizeof(float) * on), *sc = malloc(sizeof(float) * 500);
    int32_t *cand = malloc(sizeof(int32_t) * 500), *sel = malloc(sizeof(int32_t) * 500);
    uint8_t *want = malloc(500);
    int checked = 0;
    for (int cold = 0; cold < 2; cold++)
        for (int ai = 0; ai < 2; ai++) {
            tr_kv_params p = params(TR_KV_TIERED, ai ? 0.3f : 0.1f);
            if (cold) {
                p.hot_bytes = hot_min(&s, &p);
                p.cold_dir = g_tmp;
            }
            tr_kv *kv = mk(&s, &p);
            if (!kv || !fill(kv, &d, 0, s.nctx)) {
                tr_kv_free(kv);
                continue;
            }
            tr_error err = {0};
            for (int32_t pos = 20; pos < 500; pos += 61) {
                for (int32_t l = 0; l < s.nl; l++) {
                    query_make(q, &s, pos, 900 + (uint64_t)pos, false);
                    const int32_t swa = pos % 2 ? 100 : 0;
                    /* brute force: forced keys plus the k best of the rest by the same scores */
                    const int32_t lo = tr_kv_visible_lo(pos, swa), nvis = pos - lo + 1;
                    const int32_t k = tr_kv_count(p.alpha, nvis);
                    int32_t nc = 0;
                    memset(want, 0, 500);
                    for (int32_t t = lo; t <= pos; t++) {
                        if (t < p.n_sink || t > pos - p.n_window)
                            want[t] = 1;
                        else
                            cand[nc++] = t;
                    }
                    /* the forced keys join the per-head normalisation, not the ranking */
                    int32_t nall = nc;
                    for (int32_t t = lo; t <= pos; t++)
                        if (want[t]) cand[nall++] = t;
                    /* group A: the candidates on storage (see tr_kv_score_tokens) */
                    int32_t na = 0;
                    const int32_t written =
                        KVS(kv)->cold ? KVS(kv)->layers[l].pages_written * TR_KV_PAGE : 0;
                    while (na < nc && cand[na] < written) na++;
                    tr_kv_score_tokens(KEYS(kv), NULL, l, q, 0.125f, cand, nall, na, KEYS(kv)->agg, sc);
                    for (int32_t i = 0; i < nc && k < nc; i++) {
                        int32_t above = 0; /* rank by counting: brute force */
                        for (int32_t j = 0; j < nc; j++) above += sc[j] > sc[i];
                        if (above < k) want[cand[i]] = 1;
                    }
                    if (k >= nc)
                        for (int32_t i = 0; i < nc; i++) want[cand[i]] = 1;
                    int32_t n = 0;
                    tr_status st = tr_kv_select_row(kv, g_pool, l, pos, q, false, 0.125f, swa, &n, &err);
                    TU_CHECK(st == TR_OK, "select: %s", err.msg);
                    int32_t nwant = 0, miss = 0;
                    for (int32_t t = 0; t < 500; t++) nwant += want[t];
                    for (int32_t i = 0; i < n; i++) {
                        miss += !want[tr_kv_pooled_of(kv)->sel[i]];
                        if (i) miss += tr_kv_pooled_of(kv)->sel[i] <= tr_kv_pooled_of(kv)->sel[i - 1];
                    }
                    TU_CHECK(n == nwant && miss == 0,
                             "tiered selection at %d (alpha %.1f, swa %d): %d chosen, %d expected, "
                             "%d wrong",
                             pos, (double)p.alpha, swa, n, nwant, miss);
                    /* and the attention over that selection (gathered from both pools) */
                    memcpy(sel, tr_kv_pooled_of(kv)->sel, sizeof(int32_t) * (size_t)n);
                    st = attend_rows(kv, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, swa, o, on,
                                           &err);
                    TU_CHECK(st == TR_OK, "attend: %s", err.msg);
                    TU_CHECK(tr_kv_pooled_of(kv)->layer_selected[l] == (uint64_t)n, "selected %llu vs %d",
                             (unsigned long long)tr_kv_pooled_of(kv)->layer_selected[l], n);
                    memset(want, 0, 500);
                    for (int32_t i = 0; i < n; i++) want[sel[i]] = 1;
                    ref_attend(&d, l, &s, pos, q, 0.125f, NULL, swa, want, ro);
                    const float e = maxdiff(o, ro, on);
                    TU_CHECK(e <= TOL, "tiered alpha %.1f attention over its selection: %.3g",
                             (double)p.alpha, e);
                    checked++;
                }
            }
            tr_kv_free(kv);
        }
    printf("selection: %d tiered selections equal the brute-force top-k plus sinks and window, "
           "and their attention the reference over them\n",
           checked);
    free(q);
    free(o);
    free(ro);
    free(sc);
    free(cand);
    free(sel);
    free(want);
    data_free(&d);
}

/* sel_follow / sel_repeat against the selections themselves: rows at consecutive positions (some
 * with the same query, so that much repeats), a jump (not counted), and an SWA layer */
static void test_sel_repeat(void) {
    const shp s = {"GQA", 2, 400, 8, 2, 64, 64};
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 23, false);
    float *q = malloc(sizeof(float) * (size_t)s.nh * s.hdk);
    uint8_t *prev = calloc(400, 1), *cur = calloc(400, 1);
    tr_kv_params p = params(TR_KV_TIERED, 0.2f);
    tr_kv *kv = mk(&s, &p);
    if (!kv || !fill(kv, &d, 0, s.nctx)) {
        TU_CHECK(0, "sel_repeat: cache");
        tr_kv_free(kv);
        return;
    }
    static const int32_t rows[] = {100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110,
                                   200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210};
    tr_error err = {0};
    for (int32_t l = 0; l < s.nl; l++) {
        const int32_t swa = l ? 150 : 0;
        uint64_t want_f = 0, want_r = 0;
        tr_kv_stats st0, st1;
        tr_kv_get_stats(kv, &st0);
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            const int32_t pos = rows[i];
            query_make(q, &s, pos, 700 + (uint64_t)(pos / 3), false); /* same query in threes */
            int32_t n = 0;
            tr_status st = tr_kv_select_row(kv, g_pool, l, pos, q, false, 0.125f, swa, &n, &err);
            TU_CHECK(st == TR_OK, "select: %s", err.msg);
            const int32_t lo = tr_kv_visible_lo(pos, swa);
            const int32_t win_lo = pos - p.n_window + 1 > lo ? pos - p.n_window + 1 : lo;
            memset(cur, 0, 400);
            for (int32_t j = 0; j < n; j++)
                if (tr_kv_pooled_of(kv)->sel[j] >= p.n_sink && tr_kv_pooled_of(kv)->sel[j] < win_lo) cur[tr_kv_pooled_of(kv)->sel[j]] = 1;
            const bool follows = i > 0 && rows[i - 1] == pos - 1;
            for (int32_t t = 0; t < 400 && follows; t++) {
                want_f += cur[t];
                want_r += cur[t] && prev[t];
            }
            memcpy(prev, cur, 400);
        }
        tr_kv_get_stats(kv, &st1);
        const uint64_t f = st1.sel_follow - st0.sel_follow, r = st1.sel_repeat - st0.sel_repeat;
        TU_CHECK(f == want_f && r == want_r && r > 0 && r < f,
                 "layer %d: %llu of %llu selected tokens repeat, want %llu of %llu", l,
                 (unsigned long long)r, (unsigned long long)f, (unsigned long long)want_r,
                 (unsigned long long)want_f);
        printf("sel_repeat: layer %d (swa %d): %llu of %llu tokens selected by the row before too, "
               "as counted from the selections\n",
               l, swa, (unsigned long long)r, (unsigned long long)f);
    }
    tr_kv_free(kv);
    free(q);
    free(prev);
    free(cur);
    data_free(&d);
}

typedef struct recall_acc {
    double sum;
    int n;
} recall_acc;

/* share of each head's softmax mass (scale 1/sqrt(d)) on the chosen tokens, averaged over heads */
static double mass_of(const uint8_t *chosen, double *const *exact, int32_t nh, int32_t n,
                      double scale) {
    double r = 0;
    for (int32_t h = 0; h < nh; h++) {
        double mx = -INFINITY, all = 0, got = 0;
        for (int32_t t = 0; t < n; t++) mx = fmax(mx, exact[h][t] * scale);
        for (int32_t t = 0; t < n; t++) {
            const double e = exp(exact[h][t] * scale - mx);
            all += e;
            if (chosen[t]) got += e;
        }
        r += got / all;
    }
    return r / nh;
}

/* recall of each head's exact top-k by one selection of k tokens, averaged over heads */
static double recall_of(const uint8_t *chosen, double *const *exact, int32_t nh, int32_t n,
                        int32_t k, float *tmp, int32_t *idx) {
    /* k may be smaller than the selection: how many of each head's k best it holds */
    double r = 0;
    for (int32_t h = 0; h < nh; h++) {
        for (int32_t t = 0; t < n; t++) {
            tmp[t] = (float)exact[h][t];
            idx[t] = t;
        }
        tr_kv_topk(tmp, idx, n, k);
        int32_t hit = 0;
        for (int32_t i = 0; i < k; i++) hit += chosen[idx[i]];
        r += (double)hit / k;
    }
    return r / nh;
}

static void test_recall(void) {
    enum { N = 2048, NQ = 12 };
    const shp shapes[] = {{"MHA 8/8", 1, N, 8, 8, 128, 128},
                          {"GQA 8/2", 1, N, 8, 2, 128, 128},
                          {"MQA 8/1", 1, N, 8, 1, 128, 128}};
    const int32_t k = (int32_t)ceil(0.2 * N);
    /* [iid][shape][bits 8/4][eq][agg: max, sum, pmax, psum] */
    enum { NA = 4 };
    static const char *agg_name[NA] = {"max", "sum", "pmax", "psum"};
    double res[2][3][2][3][NA], mass[2][3][3][NA]; /* mass: [iid][shape][exact/INT8/INT4][agg] */
    double hh[2][3][3][NA];                        /* heavy hitters: recall of each head's top 2% */
    const int32_t k2 = (int32_t)ceil(0.02 * N);
    const double scale = 1 / sqrt(128.0);
    double exact_agg[2][3][NA], hmax[8], hsum[8];
    float *tmp = malloc(sizeof(float) * N), *sc = malloc(sizeof(float) * N);
    int32_t *idx = malloc(sizeof(int32_t) * N), *cand = malloc(sizeof(int32_t) * N);
    uint8_t *chosen = malloc(N);
    for (int32_t t = 0; t < N; t++) cand[t] = t;
    for (int iid = 0; iid < 2; iid++)
        for (int si = 0; si < 3; si++) {
            const shp *s = &shapes[si];
            data d;
            data_make(&d, 1, N, s->nkv, s->hdk, s->hdv, 31 + (uint64_t)si, iid);
            double *exact[8];
            for (int h = 0; h < 8; h++) exact[h] = malloc(sizeof(double) * N);
            float *q = malloc(sizeof(float) * (size_t)s->nh * s->hdk);
            tr_kv *kvs[2][3];
            for (int b = 0; b < 2; b++)
                for (int e = 0; e < 3; e++) {
                    tr_kv_params p = params(TR_KV_TIERED, 0.2f);
                    p.score_bits = b ? 4 : 8;
                    kvs[b][e] = mk(s, &p);
                    if (!kvs[b][e]) continue;
                    KEYS(kvs[b][e])->eq_mode = (tr_kv_eq)e;
                    fill(kvs[b][e], &d, 0, N);
                }
            memset(res[iid][si], 0, sizeof res[iid][si]);
            memset(mass[iid][si], 0, sizeof mass[iid][si]);
            memset(hh[iid][si], 0, sizeof hh[iid][si]);
            memset(exact_agg[iid][si], 0, sizeof exact_agg[iid][si]);
            for (int qi = 0; qi < NQ; qi++) {
                query_make(q, s, N - 1, 4000 + (uint64_t)qi * 31 + (uint64_t)si, iid);
                const int32_t G = s->nh / s->nkv;
                for (int32_t h = 0; h < s->nh; h++)
                    for (int32_t t = 0; t < N; t++) {
                        const float *kk = dk(&d, 0, t) + (size_t)(h / G) * s->hdk;
                        double a = 0;
                        for (int32_t c = 0; c < s->hdk; c++)
                            a += (double)r16(q[h * s->hdk + c]) * (double)r16(kk[c]);
                        exact[h][t] = a;
                    }
                /* each head's softmax over all keys, for the normalised aggregations */
                for (int32_t h = 0; h < s->nh; h++) {
                    hmax[h] = -INFINITY;
                    hsum[h] = 0;
                    for (int32_t t = 0; t < N; t++) hmax[h] = fmax(hmax[h], exact[h][t] * scale);
                    for (int32_t t = 0; t < N; t++) hsum[h] += exp(exact[h][t] * scale - hmax[h]);
                }
                for (int agg = 0; agg < NA; agg++) {
                    /* aggregation alone: exact scores, aggregated */
                    for (int32_t t = 0; t < N; t++) {
                        double a = agg == 0 || agg == 2 ? -INFINITY : 0;
                        for (int32_t h = 0; h < s->nh; h++) {
                            const double l = exact[h][t] * scale - hmax[h];
                            a = agg == 0   ? fmax(a, exact[h][t])
                                : agg == 1 ? a + exact[h][t]
                                : agg == 2 ? fmax(a, l)
                                           : a + exp(l) / hsum[h];
                        }
                        sc[t] = (float)a;
                        idx[t] = t;
                    }
                    tr_kv_topk(sc, idx, N, k);
                    memset(chosen, 0, N);
                    for (int32_t i = 0; i < k; i++) chosen[idx[i]] = 1;
                    exact_agg[iid][si][agg] += recall_of(chosen, exact, s->nh, N, k, tmp, idx) / NQ;
                    mass[iid][si][0][agg] += mass_of(chosen, exact, s->nh, N, scale) / NQ;
                    hh[iid][si][0][agg] += recall_of(chosen, exact, s->nh, N, k2, tmp, idx) / NQ;
                    for (int b = 0; b < 2; b++)
                        for (int e = 0; e < 3; e++) {
                            if (!kvs[b][e]) continue;
                            tr_kv_score_tokens(KEYS(kvs[b][e]), g_pool, 0, q, (float)scale, cand, N, 0,
                                               (tr_kv_agg)agg, sc);
                            for (int32_t t = 0; t < N; t++) idx[t] = t;
                            tr_kv_topk(sc, idx, N, k);
                            memset(chosen, 0, N);
                            for (int32_t i = 0; i < k; i++) chosen[idx[i]] = 1;
                            res[iid][si][b][e][agg] +=
                                recall_of(chosen, exact, s->nh, N, k, tmp, idx) / NQ;
                            if (e == TR_KV_EQ_ABSMAX) {
                                mass[iid][si][1 + b][agg] +=
                                    mass_of(chosen, exact, s->nh, N, scale) / NQ;
                                hh[iid][si][1 + b][agg] +=
                                    recall_of(chosen, exact, s->nh, N, k2, tmp, idx) / NQ;
                            }
                        }
                }
            }
            for (int b = 0; b < 2; b++)
                for (int e = 0; e < 3; e++) tr_kv_free(kvs[b][e]);
            for (int h = 0; h < 8; h++) free(exact[h]);
            free(q);
            data_free(&d);
        }
    printf("recall of each head's exact top-20%% (%d of %d keys, head dim 128, %d queries), "
           "tiered scoring:\n",
           k, N, NQ);
    printf("  %-10s %-8s %-4s | %-5s | %-17s | %-17s | %-17s | %s\n", "keys", "shape", "agg",
           "exact", "INT8 eq none/abs/sqrt", "INT4 eq none/abs/sqrt", "top-2% exact/8/4",
           "softmax mass exact/8/4");
    double tot[NA] = {0};
    for (int iid = 0; iid < 2; iid++)
        for (int si = 0; si < 3; si++)
            for (int agg = 0; agg < NA; agg++) {
                const double(*r)[3][NA] = res[iid][si];
                printf("  %-10s %-8s %-4s | %.3f | %.3f %.3f %.3f     | %.3f %.3f %.3f     | "
                       "%.3f %.3f %.3f | %.3f %.3f %.3f\n",
                       iid ? "iid noise" : "realistic", shapes[si].name, agg_name[agg],
                       exact_agg[iid][si][agg], r[0][0][agg], r[0][1][agg], r[0][2][agg],
                       r[1][0][agg], r[1][1][agg], r[1][2][agg], hh[iid][si][0][agg],
                       hh[iid][si][1][agg], hh[iid][si][2][agg], mass[iid][si][0][agg],
                       mass[iid][si][1][agg], mass[iid][si][2][agg]);
                for (int b = 0; b < 2; b++) tot[agg] += r[b][TR_KV_EQ_ABSMAX][agg];
                /* quantization must not lose much against the exact aggregated scores */
                TU_CHECK(r[0][TR_KV_EQ_ABSMAX][agg] >= 0.93 * exact_agg[iid][si][agg],
                         "INT8 recall %.3f vs exact %.3f", r[0][1][agg], exact_agg[iid][si][agg]);
                TU_CHECK(r[1][TR_KV_EQ_ABSMAX][agg] >= 0.80 * exact_agg[iid][si][agg],
                         "INT4 recall %.3f vs exact %.3f", r[1][1][agg], exact_agg[iid][si][agg]);
            }
    double eqtot[3] = {0, 0, 0}, hht[NA] = {0}, mst[NA] = {0};
    for (int iid = 0; iid < 2; iid++)
        for (int si = 0; si < 3; si++) {
            for (int b = 0; b < 2; b++)
                for (int e = 0; e < 3; e++)
                    for (int agg = 0; agg < NA; agg++) eqtot[e] += res[iid][si][b][e][agg];
            for (int agg = 0; agg < NA; agg++)
                for (int b = 1; b < 3; b++) {
                    hht[agg] += hh[iid][si][b][agg] / 12;
                    mst[agg] += mass[iid][si][b][agg] / 12;
                }
        }
    /* The decision: the recall of each head's top 2% (the keys that carry its attention) and the
     * softmax mass the selection holds, which bounds the output error. Recall of the whole top
     * 20% favours sum: it rewards the flat middle of each head's ranking, which carries little
     * attention. */
    int best = 0;
    printf("  mean over shapes, INT8+INT4 (absmax):\n");
    for (int agg = 0; agg < NA; agg++) {
        printf("    %-4s top-20%% recall %.3f, top-2%% recall %.3f, softmax mass %.3f\n",
               agg_name[agg], tot[agg] / 12, hht[agg], mst[agg]);
        if (hht[agg] + mst[agg] > hht[best] + mst[best]) best = agg;
    }
    const tr_kv_agg chosen_agg = (tr_kv_agg)best;
    printf("  -> %s\n", agg_name[best]);
    printf("  channel equalisation (mean top-20%% recall): none %.3f, absmax %.3f, sqrt %.3f\n",
           eqtot[0] / (12 * NA), eqtot[1] / (12 * NA), eqtot[2] / (12 * NA));
    /* the defaults are the measured better choices */
    tr_kv_params p = params(TR_KV_TIERED, 0.2f);
    tr_kv *kv = mk(&shapes[0], &p);
    if (kv) {
        TU_CHECK(KEYS(kv)->agg == chosen_agg, "default aggregation is not the better one");
        TU_CHECK(eqtot[KEYS(kv)->eq_mode] >= fmax(eqtot[0], fmax(eqtot[1], eqtot[2])) - 0.005 * 12 * NA,
                 "default equalisation is not the better one");
        tr_kv_free(kv);
    }
    free(tmp);
    free(sc);
    free(idx);
    free(cand);
    free(chosen);
}

static void test_h2o(void) {
    const shp s = {"MHA", 1, 160, 4, 4, 32, 32};
    data d;
    data_make(&d, 1, s.nctx, s.nkv, s.hdk, s.hdv, 41, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn * 16), *o = malloc(sizeof(float) * on * 16),
          *ro = malloc(sizeof(float) * on);
    uint8_t *allow = malloc(160), *ever = malloc(160);
    for (int cold = 0; cold < 2; cold++) {
        tr_kv_params p = params(TR_KV_H2O, 0.4f);
        if (cold) {
            p.hot_bytes = hot_min(&s, &p);
            p.cold_dir = g_tmp;
        }
        tr_kv *kv = mk(&s, &p), *kv2 = mk(&s, &p);
        if (!kv || !kv2) {
            tr_kv_free(kv);
            tr_kv_free(kv2);
            continue;
        }
        tr_error err = {0};
        memset(ever, 0, 160);
        float worst = 0;
        int broken = 0;
        /* decode one token at a time */
        for (int32_t t = 0; t < 128; t++) {
            fill(kv, &d, t, t + 1);
            query_make(q, &s, t, 7000 + (uint64_t)t, false);
            for (int32_t i = 0; i <= t; i++)
                allow[i] = KVS(kv)->layers[0].tok[i].where != TR_KV_TOK_EVICTED;
            tr_status st =
                attend_rows(kv, g_pool, 0, 1, &t, q, qn, 0.2f, NULL, 0, o, on, &err);
            TU_CHECK(st == TR_OK, "h2o attend: %s", err.msg);
            ref_attend(&d, 0, &s, t, q, 0.2f, NULL, 0, allow, ro);
            const float e = maxdiff(o, ro, on);
            if (e > worst) worst = e;
            int32_t kept = 0;
            for (int32_t i = 0; i <= t; i++) {
                const bool ev = KVS(kv)->layers[0].tok[i].where == TR_KV_TOK_EVICTED;
                if (ever[i] && !ev) broken++; /* an evicted token came back */
                ever[i] |= ev;
                kept += !ev;
                if (ev && (i < p.n_sink || i > t - p.n_window)) broken++;
            }
            const int32_t forced =
                p.n_sink + (t + 1 - p.n_sink < p.n_window ? t + 1 - p.n_sink : p.n_window);
            int32_t budget = (int32_t)ceil(0.4 * (t + 1));
            if (budget < forced) budget = forced;
            if (kept > budget) broken++;
        }
        tr_kv_stats stt;
        tr_kv_get_stats(kv, &stt);
        TU_CHECK(broken == 0 && stt.evicted > 0,
                 "h2o eviction rules broken %d times (%llu evicted)", broken,
                 (unsigned long long)stt.evicted);
        TU_CHECK(worst <= TOL, "h2o attention over the kept tokens: %.3g", worst);
        /* the same 128 steps as one multi-row call: the same outputs and the same evictions */
        fill(kv2, &d, 0, 128);
        int32_t pos[16];
        float *o1 = malloc(sizeof(float) * on * 128);
        memset(o1, 0, sizeof(float) * on * 128);
        for (int32_t b = 0; b < 128; b += 16) {
            for (int r = 0; r < 16; r++) {
                pos[r] = b + r;
                query_make(q + r * qn, &s, pos[r], 7000 + (uint64_t)pos[r], false);
            }
            attend_rows(kv2, g_pool, 0, 16, pos, q, qn, 0.2f, NULL, 0, o1 + b * on, on, &err);
        }
        int diff = 0;
        for (int32_t i = 0; i < 128; i++)
            diff += (KVS(kv)->layers[0].tok[i].where == TR_KV_TOK_EVICTED) !=
                    (KVS(kv2)->layers[0].tok[i].where == TR_KV_TOK_EVICTED);
        TU_CHECK(diff == 0, "h2o: a 16-row call evicts differently from 16 single steps (%d)",
                 diff);
        /* truncate keeps earlier evictions; re-appended positions are new */
        tr_status st = tr_kv_truncate(kv, 100, &err);
        TU_CHECK(st == TR_OK, "truncate: %s", err.msg);
        int kept_ev = 0;
        for (int32_t i = 0; i < 100; i++)
            kept_ev += ever[i] == (KVS(kv)->layers[0].tok[i].where == TR_KV_TOK_EVICTED);
        TU_CHECK(kept_ev == 100, "h2o truncate changed evictions below the cut");
        fill(kv, &d, 100, 120);
        for (int32_t i = 100; i < 120; i++)
            TU_CHECK(KVS(kv)->layers[0].tok[i].where != TR_KV_TOK_EVICTED, "re-appended %d evicted", i);
        printf("h2o (%s): %llu of 128 tokens evicted at alpha 0.4, none returned, sinks and "
               "window kept; attention = reference over the kept set (%.2e); multi-row = "
               "sequential\n",
               cold ? "cold" : "hot", (unsigned long long)stt.evicted, (double)worst);
        free(o1);
        tr_kv_free(kv);
        tr_kv_free(kv2);
    }
    free(q);
    free(o);
    free(ro);
    free(allow);
    free(ever);
    data_free(&d);
}

static void test_quest(void) {
    const shp s = {"GQA", 1, 300, 8, 2, 64, 64};
    data d;
    data_make(&d, 1, s.nctx, s.nkv, s.hdk, s.hdv, 51, false);
    tr_kv_params p = params(TR_KV_QUEST, 0.25f);
    p.hot_bytes = hot_min(&s, &p);
    p.cold_dir = g_tmp;
    tr_kv *kv = mk(&s, &p);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn), *q16 = malloc(sizeof(float) * (size_t)s.hdk),
          *o = malloc(sizeof(float) * on), *ro = malloc(sizeof(float) * on);
    uint8_t *allow = malloc(300);
    if (kv && fill(kv, &d, 0, 290)) {
        tr_error err = {0};
        /* truncating into a page and appending again must leave true bounds too */
        TU_CHECK(tr_kv_truncate(kv, 250, &err) == TR_OK, "truncate: %s", err.msg);
        fill(kv, &d, 250, 300);
        int viol = 0, checks = 0;
        double slack = INFINITY;
        for (int qi = 0; qi < 20; qi++) {
            query_make(q, &s, 299, 500 + (uint64_t)qi, qi % 2);
            for (int32_t h = 0; h < s.nh; h++) {
                for (int32_t c = 0; c < s.hdk; c++) q16[c] = r16(q[h * s.hdk + c]);
                const int32_t g = h / (s.nh / s.nkv);
                for (int32_t pg = 0; pg < (300 + 15) / 16; pg++) {
                    const float ub = tr_kv_quest_bound(kv, 0, pg, g, q16);
                    for (int32_t t = pg * 16; t < pg * 16 + 16 && t < 300; t++) {
                        double a = 0;
                        for (int32_t c = 0; c < s.hdk; c++)
                            a += (double)q16[c] * (double)r16(dk(&d, 0, t)[g * s.hdk + c]);
                        if ((double)ub < a - 1e-4 * (1 + fabs(a))) viol++;
                        if ((double)ub - a < slack) slack = (double)ub - a;
                        checks++;
                    }
                }
            }
        }
        TU_CHECK(viol == 0, "quest: %d of %d keys score above their page's bound", viol, checks);
        /* its attention over what it selects */
        int32_t pos = 299;
        query_make(q, &s, pos, 77, false);
        tr_status st =
            attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_OK, "quest attend: %s", err.msg);
        int32_t n = 0;
        st = tr_kv_select_row(kv, g_pool, 0, pos, q, false, 0.125f, 0, &n, &err);
        memset(allow, 0, 300);
        int whole = 1;
        for (int32_t i = 0; i < n; i++) allow[tr_kv_pooled_of(kv)->sel[i]] = 1;
        for (int32_t t = p.n_sink; t <= pos - p.n_window; t++)
            if (allow[t] != allow[(t / 16) * 16 > p.n_sink ? (t / 16) * 16 : p.n_sink]) whole = 0;
        TU_CHECK(whole, "quest selected part of a page");
        TU_CHECK(n >= (int32_t)ceil(0.25 * 300) &&
                     n <= (int32_t)ceil(0.25 * 300) + 16 + p.n_sink + p.n_window,
                 "quest selected %d keys", n);
        ref_attend(&d, 0, &s, pos, q, 0.125f, NULL, 0, allow, ro);
        TU_CHECK(maxdiff(o, ro, on) <= TOL, "quest attention over its pages: %.3g",
                 maxdiff(o, ro, on));
        printf("quest: %d key scores checked against their page bounds, none above (smallest "
               "slack %.3g); %d keys attended in whole pages\n",
               checks, slack, n);
    }
    tr_kv_free(kv);
    free(q);
    free(q16);
    free(o);
    free(ro);
    free(allow);
    data_free(&d);
}

/* ---- tail: the unselected tokens' estimated share ----------------------------------------------
 * Tiered at alpha 0.1 with --kv-tail 8 / 4 against the same selection without it: the output
 * must come closer to exact full attention (RMS over the last rows, every attention shape), with
 * the pools hot or mostly cold; alpha 1 leaves nothing out and must equal the reference; a bad
 * precision, another policy, the storage agent and attention sinks are named errors. */
static double rms_vs_ref(tr_kv *kv, const data *d, const shp *s, int32_t from, int32_t to,
                         double *ref_rms) {
    const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on),
          *want = malloc(sizeof(float) * on);
    double se = 0.0, sr = 0.0;
    size_t cnt = 0;
    tr_error err = {0};
    for (int32_t pos = from; pos < to; pos++) {
        query_make(q, s, pos, 1000 + (uint64_t)pos, false);
        const int32_t l = pos % s->nl;
        if (attend_rows(kv, g_pool, l, 1, &pos, q, qn, 1.0f / sqrtf((float)s->hdk), NULL, 0,
                              o, on, &err)) {
            TU_CHECK(0, "tail %s pos %d: %s", s->name, pos, err.msg);
            break;
        }
        ref_attend(d, l, s, pos, q, 1.0f / sqrtf((float)s->hdk), NULL, 0, NULL, want);
        for (size_t i = 0; i < on; i++) {
            se += ((double)o[i] - want[i]) * ((double)o[i] - want[i]);
            sr += (double)want[i] * want[i];
        }
        cnt += on;
    }
    free(q);
    free(o);
    free(want);
    if (ref_rms) *ref_rms = sqrt(sr / (double)(cnt ? cnt : 1));
    return sqrt(se / (double)(cnt ? cnt : 1));
}

static void test_tail(void) {
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        const shp *s = &SHAPES[si];
        data d;
        data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 91 + si, false);
        /* [selection alone, tail 8, tail 4, tail 4 at the default tail_min (1), tail 8 with
         * a threshold no token reaches][hot, cold] */
        double e[5][2], ref = 0.0, kept[2] = {0};
        for (int cold = 0; cold < 2; cold++)
            for (int b = 0; b < 5; b++) {
                tr_kv_params p = params(TR_KV_TIERED, 0.1f);
                p.tail_bits = b == 0 ? 0 : b == 1 || b == 4 ? 8 : 4;
                p.tail_min = b == 3 ? 1.0f : b == 4 ? 1e6f : 0.0f;
                if (cold) {
                    p.cold_dir = g_tmp;
                    p.hot_bytes = hot_min(s, &p);
                }
                tr_kv *kv = mk(s, &p);
                e[b][cold] = kv && fill(kv, &d, 0, s->nctx)
                                 ? rms_vs_ref(kv, &d, s, s->nctx - 40, s->nctx, &ref)
                                 : 1e9;
                tr_kv_stats st;
                if (kv && b == 3) {
                    tr_kv_get_stats(kv, &st);
                    kept[cold] = st.tail_cand ? (double)st.tail_kept / (double)st.tail_cand : -1.0;
                }
                tr_kv_free(kv);
            }
        for (int cold = 0; cold < 2; cold++) {
            TU_CHECK(e[1][cold] < 0.5 * e[0][cold] && e[2][cold] < 0.7 * e[0][cold],
                     "tail %s %s: RMS error vs full %.3g (tail 8) / %.3g (tail 4), selection "
                     "alone %.3g",
                     s->name, cold ? "cold" : "hot", e[1][cold], e[2][cold], e[0][cold]);
            /* the default threshold sums a part of the unselected tokens and keeps most of the
             * gain; a threshold nobody reaches is the selection alone, bit for bit */
            TU_CHECK(kept[cold] > 0.0 && kept[cold] < 1.0 && e[3][cold] < 0.8 * e[0][cold],
                     "tail %s %s at tail_min 1: %.1f %% summed, RMS %.3g (all summed %.3g, none "
                     "%.3g)",
                     s->name, cold ? "cold" : "hot", 100.0 * kept[cold], e[3][cold], e[2][cold],
                     e[0][cold]);
            TU_CHECK(e[4][cold] == e[0][cold], "tail %s %s, threshold 1e6: RMS %.6g, not %.6g",
                     s->name, cold ? "cold" : "hot", e[4][cold], e[0][cold]);
            printf("tail %s %s, alpha 0.1: RMS error vs full %.4f selection alone, %.4f tail 8, "
                   "%.4f tail 4; %.4f tail 4 at tail_min 1 (%.1f %% of the unselected summed) "
                   "(output RMS %.3f)\n",
                   s->name, cold ? "cold" : "hot", e[0][cold], e[1][cold], e[2][cold], e[3][cold],
                   100.0 * kept[cold], ref);
        }
        /* alpha 1: nothing left out */
        tr_kv_params p = params(TR_KV_TIERED, 1.0f);
        p.tail_bits = 8;
        tr_kv *kv = mk(s, &p);
        const double e1 = kv && fill(kv, &d, 0, s->nctx)
                              ? rms_vs_ref(kv, &d, s, s->nctx - 10, s->nctx, NULL)
                              : 1e9;
        TU_CHECK(e1 < TOL, "tail %s alpha 1: RMS %.3g vs full", s->name, e1);
        tr_kv_free(kv);
        data_free(&d);
    }
    const shp *s = &SHAPES[1];
    const tr_kv_shape sh = to_shape(s);
    tr_error err = {0};
    tr_kv *kv = NULL;
    tr_kv_params p = params(TR_KV_TIERED, 0.1f);
    p.tail_bits = 3;
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "--kv-tail 3"),
             "tail 3: %s", err.msg);
    p.tail_bits = 4;
    p.tail_min = -0.5f;
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "--kv-tail-min"),
             "tail_min -0.5: %s", err.msg);
    p.tail_min = NAN;
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "--kv-tail-min"),
             "tail_min NaN: %s", err.msg);
    p = params(TR_KV_QUEST, 0.1f);
    p.tail_bits = 8;
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "tiered"),
             "tail with quest: %s", err.msg);
    p = params(TR_KV_TIERED, 0.1f);
    p.tail_bits = 8;
    p.csd = true;
    p.cold_dir = g_tmp;
    p.hot_bytes = hot_min(s, &p);
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "--csd"),
             "tail with the agent: %s", err.msg);
    p = params(TR_KV_TIERED, 0.1f);
    p.tail_bits = 8;
    kv = mk(s, &p);
    data d;
    data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 5, false);
    if (kv && fill(kv, &d, 0, s->nctx)) {
        const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
        float *q = calloc(qn, sizeof(float)), *o = calloc(on, sizeof(float)),
              *sinks = calloc((size_t)s->nh, sizeof(float));
        int32_t pos = s->nctx - 1;
        const tr_status st =
            attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, sinks, 0, o, on, &err);
        TU_CHECK(st == TR_E_ARG && strstr(err.msg, "sinks"), "tail with sinks: %d %s", st, err.msg);
        free(q);
        free(o);
        free(sinks);
    }
    tr_kv_free(kv);
    data_free(&d);
}

int main(void) {
    static void (*const tests[])(void) = {test_topk, test_selection, test_sel_repeat, test_recall, test_h2o, test_quest, test_tail};
    return kv_test_main("test_kv_select", tests, (int)(sizeof tests / sizeof *tests));
}
