/*
 * Every KV policy at alpha = 1 against a straightforward reference attention (MHA, GQA, MQA;
 * hot only and with most tokens cold; sinks, SWA, multi-row calls; the working set big enough,
 * forced into halves, and read in pipelined chunks), and the check that the comparison can fail.
 * tr_kv_attend_many (several caches in one call, as a batched decode step) against each cache
 * attended alone: the same bits.
 */
#include "kv_test.h"

static float g_alpha1_worst;

/* ws: 0 whole working set, 1 a small one (read in halves), 2 whole and read in TR_KV_PIPE
 * chunks at every size (attended chunk by chunk as they come in) */
static void check_policy_alpha1(const shp *s, tr_kv_policy pol, bool cold, int ws,
                                const data *d) {
    const bool small_ws = ws == 1;
    tr_kv_params p = params(pol, 1.0f);
    if (cold) {
        p.hot_bytes = hot_min(s, &p);
        p.cold_dir = g_tmp;
    }
    if (small_ws) p.ws_bytes = 40ull * (uint64_t)s->nkv * (uint64_t)(s->hdk + s->hdv) * 2;
    tr_kv *kv = mk(s, &p);
    if (!kv) return;
    if (ws == 2) tr_kv_pooled_of(kv)->pipe_min = 1;
    if (!fill(kv, d, 0, s->nctx)) {
        tr_kv_free(kv);
        return;
    }
    if (cold) {
        tr_kv_stats stt;
        tr_kv_get_stats(kv, &stt);
        TU_CHECK(stt.cold_bytes > 0 && stt.hot_bytes <= p.hot_bytes,
                 "%s %s: hot %llu (budget %llu), cold %llu", s->name, tr_kv_policy_name(pol),
                 (unsigned long long)stt.hot_bytes, (unsigned long long)p.hot_bytes,
                 (unsigned long long)stt.cold_bytes);
    }
    const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
    float *q = malloc(sizeof(float) * qn * 8), *o = malloc(sizeof(float) * on * 8),
          *ro = malloc(sizeof(float) * on);
    float *sinks = malloc(sizeof(float) * (size_t)s->nh);
    for (int32_t h = 0; h < s->nh; h++) sinks[h] = 0.5f * (float)h - 1.0f;
    const float scale = 1.0f / sqrtf((float)s->hdk);
    tr_error err = {0};
    float worst = 0;
    /* single rows (decode) at a few positions, in both layers */
    const int32_t at[] = {0, 17, 100, 199};
    for (int32_t l = 0; l < s->nl; l++)
        for (int i = 0; i < 4; i++) {
            query_make(q, s, at[i], 100 + (uint64_t)at[i], false);
            tr_status st =
                attend_rows(kv, g_pool, l, 1, &at[i], q, qn, scale, NULL, 0, o, on, &err);
            TU_CHECK(st == TR_OK, "%s %s attend: %s", s->name, tr_kv_policy_name(pol), err.msg);
            ref_attend(d, l, s, at[i], q, scale, NULL, 0, NULL, ro);
            const float e = maxdiff(o, ro, on);
            if (e > worst) worst = e;
        }
    /* 8 rows at once (prefill), each with its own causal limit, softmax sinks and SWA of 24 */
    int32_t pos[8];
    for (int r = 0; r < 8; r++) {
        pos[r] = 150 + r;
        query_make(q + r * qn, s, pos[r], 300 + (uint64_t)r, false);
    }
    tr_status st = attend_rows(kv, g_pool, 1, 8, pos, q, qn, scale, sinks, 24, o, on, &err);
    TU_CHECK(st == TR_OK, "%s %s attend rows: %s", s->name, tr_kv_policy_name(pol), err.msg);
    for (int r = 0; r < 8; r++) {
        ref_attend(d, 1, s, pos[r], q + r * qn, scale, sinks, 24, NULL, ro);
        const float e = maxdiff(o + r * on, ro, on);
        if (e > worst) worst = e;
    }
    TU_CHECK(worst <= TOL, "%s %s alpha=1 %s%s: max |diff| %.3g > %.3g", s->name,
             tr_kv_policy_name(pol), cold ? "cold" : "hot",
             ws == 1 ? " chunked" : ws == 2 ? " pipelined" : "", worst, TOL);
    if (worst > g_alpha1_worst) g_alpha1_worst = worst;
    tr_kv_stats stt;
    tr_kv_get_stats(kv, &stt);
    if (cold)
        TU_CHECK(stt.bytes_read > 0, "%s %s cold: nothing read from storage", s->name,
                 tr_kv_policy_name(pol));
    else
        TU_CHECK(stt.bytes_read == 0, "%s %s hot: %llu bytes read", s->name, tr_kv_policy_name(pol),
                 (unsigned long long)stt.bytes_read);
    free(q);
    free(o);
    free(ro);
    free(sinks);
    tr_kv_free(kv);
}

static void test_alpha1(void) {
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++) {
        const shp *s = &SHAPES[i];
        data d;
        data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 11 + i, false);
        for (int pol = TR_KV_FULL; pol <= TR_KV_TIERED; pol++)
            for (int cold = 0; cold < 2; cold++)
                for (int ws = 0; ws < 3; ws++) {
                    if ((pol == TR_KV_FULL && cold) || (ws == 2 && !cold)) continue;
                    check_policy_alpha1(s, (tr_kv_policy)pol, cold, ws, &d);
                }
        data_free(&d);
    }
    printf("alpha=1, every policy vs reference (MHA/GQA/MQA, hot/cold, whole/chunked working "
           "set, pipelined reads, sinks, SWA, 8-row calls): max |diff| %.2e (tolerance %.1e)\n",
           (double)g_alpha1_worst, (double)TOL);

    /* the comparison can fail: dropping the single most attended key moves the output by more */
    const shp *s = &SHAPES[0];
    data d;
    data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 11, false);
    const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
    float *q = malloc(sizeof(float) * qn), *a = malloc(sizeof(float) * on),
          *b = malloc(sizeof(float) * on);
    uint8_t *allow = malloc(200);
    memset(allow, 1, 200);
    query_make(q, s, 199, 5, false);
    ref_attend(&d, 0, s, 199, q, 0.2f, NULL, 0, NULL, a);
    float best = 0;
    for (int32_t t = 0; t < 200; t++) {
        allow[t] = 0;
        ref_attend(&d, 0, s, 199, q, 0.2f, NULL, 0, allow, b);
        allow[t] = 1;
        const float e = maxdiff(a, b, on);
        if (e > best) best = e;
    }
    TU_CHECK(best > 4 * TOL, "dropping one key moves the output by only %.3g", best);
    printf("  (dropping the most attended of 200 keys moves the output by %.3g)\n", best);
    free(q);
    free(a);
    free(b);
    free(allow);
    data_free(&d);
}

/* n caches (full ones, and a tiered one among them) of different lengths, one row each or a
 * chunk of rows, attended by one tr_kv_attend_many call: each output has the bits of that cache
 * attended alone; on every shape, with and without the pool, so the tiles are split both ways */
static void test_many(void) {
    enum { N = 7 };
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++) {
        const shp *s = &SHAPES[i];
        data d;
        data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 31 + i, false);
        const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
        tr_kv *kv[N];
        tr_kv_query qs[N];
        int32_t pos[N][3];
        float *q = malloc(sizeof(float) * qn * 3 * N), *a = malloc(sizeof(float) * on * 3 * N),
              *b = malloc(sizeof(float) * on * 3 * N);
        bool ok = q && a && b;
        for (int c = 0; c < N; c++) {
            /* cache 4 tiered: a run of full caches is broken by it, attended on its own */
            tr_kv_params p = params(c == 4 ? TR_KV_TIERED : TR_KV_FULL, 1.0f);
            kv[c] = ok ? mk(s, &p) : NULL;
            ok = ok && kv[c] && fill(kv[c], &d, 0, 20 + 25 * c);
            const int32_t rows = c == 2 ? 3 : 1; /* a prefill chunk beside decode rows */
            for (int32_t r = 0; r < rows; r++) {
                pos[c][r] = 20 + 25 * c - rows + r;
                if (ok) query_make(q + (size_t)(3 * c + r) * qn, s, pos[c][r], 700 + (uint64_t)(3 * c + r), false);
            }
            qs[c] = (tr_kv_query){.layer = 1, .rows = rows, .pos = pos[c],
                                  .q = q + (size_t)3 * c * qn, .q_stride = qn,
                                  .scale = 1.0f / sqrtf((float)s->hdk), .swa = c == 5 ? 16 : 0,
                                  .out = a + (size_t)3 * c * on, .out_stride = on};
        }
        for (int use_pool = 0; ok && use_pool < 2; use_pool++) {
            tr_pool *pool = use_pool ? g_pool : NULL;
            tr_error err = {0};
            memset(a, 0, sizeof(float) * on * 3 * N);
            tr_status st = tr_kv_attend_many(kv, pool, qs, N, &err);
            TU_CHECK(st == TR_OK, "%s attend_many: %s", s->name, err.msg);
            for (int c = 0; c < N; c++) {
                tr_kv_query one = qs[c];
                one.out = b + (size_t)3 * c * on;
                st = tr_kv_attend(kv[c], pool, &one, &err);
                TU_CHECK(st == TR_OK, "%s attend: %s", s->name, err.msg);
                TU_CHECK(!memcmp(a + (size_t)3 * c * on, b + (size_t)3 * c * on,
                                 sizeof(float) * on * (size_t)qs[c].rows),
                         "%s cache %d (%s%s): attend_many differs from attending it alone",
                         s->name, c, c == 4 ? "tiered" : "full", use_pool ? ", pool" : "");
            }
        }
        /* a row beyond what a cache holds is refused, naming it, and nothing is attended */
        if (ok) {
            tr_error err = {0};
            pos[3][0] = 20 + 25 * 3;
            tr_status st = tr_kv_attend_many(kv, g_pool, qs, 4, &err);
            TU_CHECK(st == TR_E_ARG && strstr(err.msg, "holds"), "%s: a row past the cache: %d %s",
                     s->name, (int)st, err.msg);
        }
        for (int c = 0; c < N; c++)
            if (kv[c]) tr_kv_free(kv[c]);
        free(q);
        free(a);
        free(b);
        data_free(&d);
    }
    printf("attend_many: %d caches (full, one tiered; decode rows and a chunk) in one call, the "
           "bits of each attended alone, with and without the pool\n", N);
}

int main(void) {
    static void (*const tests[])(void) = {test_alpha1, test_many};
    return kv_test_main("test_kv_attend", tests, (int)(sizeof tests / sizeof *tests));
}
