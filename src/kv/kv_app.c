/*
 * APP: the host/agent split of the scoring (kv_app.h).
 */
#include <math.h>

#include "kv/kv_app.h"

void tr_kv_app_init(tr_kv_app *A, const tr_kv_research *given) {
    *A = (tr_kv_app){.given = given};
    if (given->app_f_c > 0) A->tc = 1e9 / given->app_f_c; /* ns per token */
    if (given->app_f_s > 0) A->ts = 1e9 / given->app_f_s;
    if (given->app_b_c > 0) A->bc = given->app_b_c / 1e9; /* bytes per ns */
    if (given->app_b_s > 0) A->bs = given->app_b_s / 1e9;
}

/* HillInfer's balance, n_c/f_c + a_c n_c rec/B_c = n_s/f_s + a_s n_s rec/B_s, is written for a
 * device where a side's share of the tokens is also where their rows live: rows selected from the
 * host's share cross B_c, the others B_s. Here the split moves the scoring only. A selected
 * token's row comes from where BKP placed it (the hot pool's copy, or the agent's reads) whoever
 * scored it, so at every split both sides move the same rows: the row terms (and with them the
 * selected fractions a_c, a_s that correct for BKP's skew) are the same on both sides and drop
 * out. What is left is the two scorings running side by side, equal when n_c / n_s = f_c / f_s.
 * The balance with its row terms chose beta 1.73-2.04 on the 16K bench, where the step was
 * fastest at 2.5 and the scoring from 3 to 6; this one chose 2.5-2.9 (bench/results/kv.md). */
double tr_kv_app_beta(const tr_kv_app *A) {
    if (A->given->beta >= 0.0f) return A->given->beta;
    if (!(A->tc > 0 && A->ts > 0)) return 1.0; /* nothing measured yet: an even split */
    return A->ts / A->tc;
}

int32_t tr_kv_app_host_part(tr_kv_app *A, bool agent, int32_t n_a, int32_t n_b) {
    const double beta = agent ? tr_kv_app_beta(A) : (double)A->given->beta;
    A->beta = beta;
    int32_t n_c = (int32_t)lround((double)n_a * beta / (1.0 + beta));
    /* APP keeps measuring both sides: a starved side gets a part big enough to be measured once
     * in TR_KV_APP_EXPLORE layers */
    const int32_t mp = TR_KV_APP_MIN_PART;
    A->exploring = 0;
    if (agent && A->given->beta < 0.0f && n_a >= 2 * mp && ++A->explore % TR_KV_APP_EXPLORE == 0) {
        if (n_a - n_c < mp) {
            n_c = n_a - mp;
            A->exploring = 2;
        } else if (n_c + n_b < mp) {
            n_c = mp - n_b;
            A->exploring = 1;
        }
    }
    return n_c;
}

void tr_kv_app_note_split(tr_kv_app *A, int32_t n_c, int32_t n_a) {
    A->beta_split = n_a > 0 ? (double)n_c / n_a : 0.0;
}

/* a scoring rate's sample: a part given to a starved side weighs half */
static void sample(double *avg, double s, bool explored) {
    if (explored)
        *avg = 0.5 * *avg + 0.5 * s;
    else
        tr_kv_app_avg(avg, s);
}

void tr_kv_app_note_scoring(tr_kv_app *A, double tc, int32_t host_n, double ts, int32_t agent_n) {
    /* parts big enough that the per-call costs (waking threads, the request round trip) do not
     * dominate */
    if (!(A->given->app_f_c > 0) && (host_n >= TR_KV_APP_MIN_PART || A->tc <= 0))
        sample(&A->tc, tc, A->exploring == 1);
    if (!(A->given->app_f_s > 0) && (agent_n >= TR_KV_APP_MIN_PART || A->ts <= 0))
        sample(&A->ts, ts, A->exploring == 2);
    A->exploring = 0;
}

void tr_kv_app_note_hot(void *ctx, uint64_t bytes, uint64_t ns) {
    tr_kv_app *A = ctx;
    if (!(A->given->app_b_c > 0) && bytes && ns) tr_kv_app_avg(&A->bc, (double)bytes / (double)ns);
}

void tr_kv_app_note_agent_rows(tr_kv_app *A, uint64_t bytes, uint64_t ns) {
    if (!(A->given->app_b_s > 0) && bytes && ns) tr_kv_app_avg(&A->bs, (double)bytes / (double)ns);
}

void tr_kv_app_note_selected(tr_kv_app *A, int32_t k_a, int32_t n_a, int32_t k_c, int32_t n_c) {
    tr_kv_app_avg(&A->as, (double)k_a / n_a);
    tr_kv_app_avg(&A->ac, (double)k_c / n_c);
}
