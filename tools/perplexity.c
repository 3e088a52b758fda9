/*
 * terrace perplexity -m MODEL -f TEXT [-c N] [-b N]
 *
 * llama.cpp's method (examples/perplexity): tokenize the whole text (with BOS if the model adds
 * one), cut it into non-overlapping chunks of -c tokens, evaluate each chunk from an empty
 * context with its first token replaced by BOS (when the model adds BOS), and score the second
 * half of each chunk: position i predicts token i+1 for i in [c/2, c-1). Prints the running
 * estimate per chunk and the final PPL with llama.cpp's uncertainty.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "common.h"

static void ppl_usage(FILE *f) {
    fprintf(f, "usage: terrace perplexity -m MODEL.gguf -f TEXT.txt [-c N] [-b N] [-t N]\n\n");
    gen_print_common_flags(f);
}

/* -log p(tok) from one row of logits, in double as llama.cpp does */
static double nll_of(const float *logits, int32_t n_vocab, int32_t tok) {
    float mx = logits[0];
    for (int32_t j = 1; j < n_vocab; j++) mx = logits[j] > mx ? logits[j] : mx;
    double sum = 0.0;
    for (int32_t j = 0; j < n_vocab; j++) sum += expf(logits[j] - mx);
    return -((double)(logits[tok] - mx) - log(sum));
}

int cmd_perplexity(int argc, char **argv) {
    gen_opts o;
    if (!gen_parse(argc, argv, &o, "perplexity", ppl_usage)) return CLI_EXIT_USAGE;
    if (!o.prompt_file && !o.prompt) {
        cli_error("perplexity: no text (-f FILE)");
        return CLI_EXIT_USAGE;
    }
    size_t len = 0;
    char *text = NULL;
    int rc = CLI_EXIT_ERROR;
    loaded ld;
    memset(&ld, 0, sizeof ld);
    tr_session *s = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    tr_error err = {0};
    if (!load_model(&o, &ld)) {
        if (ld.usage_error) rc = CLI_EXIT_USAGE;
        goto out;
    }
    {
        const int32_t c = o.n_ctx > 0 ? o.n_ctx
                          : (tr_model_n_ctx_train(ld.model) < 4096 ? tr_model_n_ctx_train(ld.model)
                                                                   : 4096);
        /* with --chunks only so many contexts are scored: more text than they can hold is an
         * error; without, the whole file is the text (up to read_file's bound) */
        char why[96];
        snprintf(why, sizeof why, "%d chunks of %d tokens can hold (raise --chunks or -c)",
                 o.n_chunks, c);
        text = !o.prompt_file ? strdup(o.prompt)
               : o.n_chunks > 0
                   ? read_file_max(o.prompt_file,
                                   text_bound(ld.tok, ((size_t)o.n_chunks + 1) * (size_t)c), why,
                                   &len)
                   : read_file(o.prompt_file, &len);
        if (!text) goto out;
        if (!o.prompt_file) len = strlen(text);
    }
    const double t_tok = now_ms();
    size_t n_tok = 0;
    if (!(toks = tokenize_alloc(ld.tok, text, len, true, false, &n_tok))) goto out;
    const double tok_ms = now_ms() - t_tok;

    const int32_t n_ctx = o.n_ctx > 0 ? o.n_ctx
                          : (tr_model_n_ctx_train(ld.model) < 4096 ? tr_model_n_ctx_train(ld.model) : 4096);
    if (n_tok < 2 * (size_t)n_ctx && !(o.n_chunks == 1 && n_tok >= (size_t)n_ctx)) {
        cli_error("perplexity: the text has %zu tokens; at least 2 * c = %d are needed (lower -c)",
                  n_tok, 2 * n_ctx);
        goto out;
    }
    tr_session_params sp = session_params(&o);
    /* teacher-forced: every position is scored with the selection decoding would make there */
    sp.kv.prefill_select = true;
    sp.n_ctx = n_ctx;
    sp.n_batch = o.n_batch > 0 ? (o.n_batch < n_ctx ? o.n_batch : n_ctx) : (n_ctx < 512 ? n_ctx : 512);
    if (tr_session_create(ld.model, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto out;
    }
    print_kv_note(s, o.verbose);
    warn_context(&ld, s);
    const int32_t n_vocab = tr_model_n_vocab(ld.model), n_batch = sp.n_batch;
    if (!(logits = malloc(sizeof(float) * (size_t)n_batch * n_vocab))) {
        cli_error("out of memory for %d x %d logits", n_batch, n_vocab);
        goto out;
    }
    size_t n_chunk = n_tok / (size_t)n_ctx;
    if (o.n_chunks > 0 && (size_t)o.n_chunks < n_chunk) n_chunk = (size_t)o.n_chunks;
    const int32_t first = n_ctx / 2;
    const bool add_bos = tr_tokenizer_add_bos(ld.tok);
    const int32_t bos = tr_token_bos(ld.tok);
    fprintf(stderr, "perplexity: %zu tokens (tokenized in %.0f ms), %zu chunks of %d, batch %d\n",
            n_tok, tok_ms, n_chunk, n_ctx, n_batch);
    double nll = 0.0, nll2 = 0.0;
    size_t count = 0;
    const double t0 = now_ms();
    for (size_t c = 0; c < n_chunk; c++) {
        int32_t *chunk = toks + c * (size_t)n_ctx;
        const int32_t saved = chunk[0];
        if (add_bos && bos >= 0) chunk[0] = bos;
        tr_session_truncate(s, 0, &err);
        for (int32_t b0 = 0; b0 < n_ctx; b0 += n_batch) {
            const int32_t nb = n_ctx - b0 < n_batch ? n_ctx - b0 : n_batch;
            /* logits only where they are scored: rows [first, n_ctx - 1) */
            const bool want = b0 + nb > first;
            if (tr_session_eval(s, chunk + b0, nb, want ? logits : NULL, true, &err)) {
                chunk[0] = saved;
                cli_error("%s", err.msg);
                goto out;
            }
            for (int32_t i = b0; want && i < b0 + nb; i++) {
                if (i < first || i >= n_ctx - 1) continue;
                const double v = nll_of(logits + (size_t)(i - b0) * n_vocab, n_vocab, chunk[i + 1]);
                nll += v;
                nll2 += v * v;
                count++;
            }
        }
        chunk[0] = saved;
        printf("[%zu]%.4f,", c + 1, exp(nll / (double)count));
        fflush(stdout);
        if (c == 0) {
            const double per_chunk = (now_ms() - t0) / 1e3;
            fprintf(stderr, "perplexity: %.2f s per chunk, about %.1f minutes in all\n", per_chunk,
                    per_chunk * (double)n_chunk / 60.0);
        }
    }
    const double mean = nll / (double)count, mean2 = nll2 / (double)count;
    const double ppl = exp(mean);
    double unc = mean2 - mean * mean;
    unc = unc > 0 && count > 1 ? sqrt(unc / (double)(count - 1)) : 0.0;
    printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, unc * ppl);
    fprintf(stderr, "perplexity: %zu chunks x %d tokens in %.1f s (%.1f tok/s), peak RSS %.1f MiB\n",
            n_chunk, n_ctx, (now_ms() - t0) / 1e3,
            (double)(n_chunk * (size_t)n_ctx) / ((now_ms() - t0) / 1e3), peak_rss_mib());
    print_kv_stats(stderr, s, "perplexity: ");
    if (!close_outputs(&ld)) goto out;
    rc = 0;
out:
    free(logits);
    free(toks);
    free(text);
    tr_session_free(s);
    if (ld.model) unload_model(&ld);
    return rc;
}
