/*
 * BPE pre-tokenizers: llama.cpp's regex lists per `tokenizer.ggml.pre`, matched with PCRE2 in UTF
 * mode with Unicode properties (PCRE2_UCP), so \p{L}, \p{N}, \p{P}, \p{M} and \s come from
 * PCRE2's Unicode tables rather than hand-written ranges.
 *
 * llama.cpp matches these lists three ways (unicode.cpp): hand-written splitters for the exact
 * gpt-2 and llama3 regexes, std::regex on a "collapsed" text (each non-ASCII code point replaced by
 * one byte naming its category) for regexes that use \p{..}, and std::wregex for the others.
 * The three agree with a plain Unicode regex except where noted below; the regexes here are
 * llama.cpp's, adapted only where that is needed to reproduce what llama.cpp computes:
 *   - Non-ASCII whitespace (Unicode White_Space) is replaced by U+000B in the text that is matched,
 *     as llama.cpp does before every std::regex/wregex match; so such characters match \s but not
 *     a literal in a character class (deepseek-llm lists U+3000 in one).
 *   - U+180E is not White_Space in llama.cpp's tables, but PCRE2's \s matches it (\h); it is
 *     matched as U+200B (also Cf, not whitespace) instead.
 *   - The collapsed text maps every letter subcategory to one "letter" byte, so \p{Lu}, \p{Ll}, ...
 *     all mean \p{L} (rewritten at compile time).
 *   - std::wregex runs in the C locale, where \d is ASCII-only: written as [0-9].
 *   - llama.cpp replaces tiny_aya's first regex by its afmoe digit splitter (DIGITS3 below).
 *   - ECMAScript '$' matches only at the end of the subject: PCRE2_DOLLAR_ENDONLY.
 * Each regex of a list is applied separately to every piece the previous one produced, each piece
 * being its own subject (so look-aheads stop at the piece end), and text between matches becomes a
 * piece of its own, as in llama.cpp's unicode_regex_split.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

/* ---- regexes (llama.cpp src/llama-vocab.cpp, adapted as described above) --------------------- */

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                  \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"       \
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define RE_QWEN2                                                                                   \
    CONTRACTIONS                                                                                   \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"           \
    "|\\s+(?!\\S)|\\s+"
#define RE_QWEN35                                                                                  \
    CONTRACTIONS                                                                                   \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"           \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_JAIS2                                                                                   \
    CONTRACTIONS                                                                                   \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"                    \
    "|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)"                \
    "|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"

/* deepseek-llm: cased letters (as listed in its tokenizer.json), full-width punctuation, CJK */
// clang-format off
#define RE_DS_LETTERS \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}" \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}" \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}" \
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}" \
    "\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}" \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}" \
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}" \
    "\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}" \
    "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}" \
    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}" \
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}" \
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}" \
    "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}" \
    "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}" \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}" \
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}" \
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}" \
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
// clang-format on
#define RE_DS_PUNCT                                                                                \
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"
#define RE_DS_CJK   "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_CJK_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"

/* deepseek-v3 family */
#define RE_DS3_ASCII_PUNCT "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
#define RE_DS3_WORD        "[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
#define RE_DS3_PUNCT       " ?[\\p{P}\\p{S}]+"
#define RE_DS3                                                                                     \
    RE_DS3_ASCII_PUNCT "|" RE_DS3_WORD "|" RE_DS3_PUNCT "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_SPARK RE_DS3_ASCII_PUNCT "|" RE_DS3_WORD "|" RE_DS3_PUNCT "|[\\r\\n]|\\s+(?!\\S)|\\s+"

#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"

/* letters by case, as llama.cpp rewrites them (non-ASCII letters count as both cases) */
#define RE_UPPER "((?=[\\p{L}])([^a-z]))"
#define RE_LOWER "((?=[\\p{L}])([^A-Z]))"
#define RE_GPT4O                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+" CONTRACTIONS                                \
    "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+" RE_LOWER "*" CONTRACTIONS                              \
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+"                                  \
    "|\\s+(?!\\S)|\\s+"
#define RE_TEKKEN                                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER             \
    "+" RE_LOWER "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_UPPER_M "((?=[\\p{L}\\p{M}])([^a-z]))"
#define RE_LOWER_M "((?=[\\p{L}\\p{M}])([^A-Z]))"
#define RE_GRANITE_EMB                                                                             \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER_M "*" RE_LOWER_M "+" CONTRACTIONS                            \
    "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER_M "+" RE_LOWER_M "*" CONTRACTIONS                          \
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"                                                \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* the \p{Lu}.. classes below become \p{L} at compile time (see above) */
#define RE_CASED(num)                                                                              \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"     \
    "+" CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"               \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" CONTRACTIONS "?|" num "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"      \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_YOUTU_CJK                                                                               \
    "[\\x{AC00}-\\x{D7A3}\\x{3131}-\\x{318E}]+|[\\x{FF01}\\x{2026}\\x{201C}\\x{201D}\\x{2018}"     \
    "\\x{2019}\\x{2014}\\x{FF1A}\\x{FF1B}\\x{FF0C}\\x{3001}-\\x{303F}\\x{FE30}-\\x{FE4F}]+"        \
    "|[\\x{3105}-\\x{312F}]+|" RE_CJK_KANA

static const char *const L_DEFAULT[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+",
                                        "[0-9][0-9][0-9]"};
static const char *const L_GPT2[] = {RE_GPT2};
static const char *const L_LLAMA3[] = {RE_LLAMA3};
static const char *const L_QWEN2[] = {RE_QWEN2};
static const char *const L_QWEN35[] = {RE_QWEN35};
static const char *const L_JAIS2[] = {RE_JAIS2};
static const char *const L_STARCODER[] = {"\\p{N}", RE_GPT2};
static const char *const L_FALCON[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"};
static const char *const L_DS_LLM[] = {"[\r\n]", RE_DS_LETTERS, RE_DS_PUNCT,
                                       "\\s+$",  RE_DS_CJK,     "\\p{N}+"};
static const char *const L_DS_CODER[] = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DS_CJK,
                                         "\\p{N}"};
static const char *const L_DS3[] = {"\\p{N}{1,3}", RE_CJK_KANA, RE_DS3};
static const char *const L_SPARK[] = {"\\p{N}{1,3}", RE_CJK_KANA, RE_SPARK, "\\p{N}"};
static const char *const L_YOUTU[] = {RE_YOUTU_CJK, RE_CASED("\\p{N}")};
static const char *const L_PORO[] = {RE_PORO};
static const char *const L_VIKING[] = {RE_PORO, "\\p{N}"};
static const char *const L_TEKKEN[] = {RE_TEKKEN};
static const char *const L_CHAMELEON[] = {
    "<sentinel:[0-9]+>",      "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",     "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2};
static const char *const L_GPT4O[] = {RE_GPT4O};
static const char *const L_GRANITE_EMB[] = {RE_GRANITE_EMB};
/* Not a regex: llama.cpp's hand-written digit splitter (unicode_regex_split_custom_afmoe), which it
 * uses for afmoe's "\p{AFMoE_digits}" and for tiny_aya's "\d{1,3}(?=(?:\d{3})*\b)". Every run of
 * \p{N} is cut into a leading group of (length mod 3) characters, if any, then groups of three;
 * the text before a run stays attached to its first group (later regexes separate it). */
#define DIGITS3 "@digits3"

static const char *const L_TINY_AYA[] = {DIGITS3, RE_CASED("\\p{N}{1,3}")};
static const char *const L_AFMOE[] = {DIGITS3,
                                      "[\\x{4E00}-\\x{9FFF}\\x{3400}-\\x{4DBF}\\x{F900}-\\x{FAFF}"
                                      "\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}"
                                      "\\x{FF65}-\\x{FF9F}\\x{2F00}-\\x{2FDF}\\x{0E00}-\\x{0E7F}"
                                      "\\x{0E80}-\\x{0EFF}\\x{1780}-\\x{17FF}"
                                      "\\x{1000}-\\x{109F}\\x{AA60}-\\x{AA7F}\\x{A9E0}-\\x{A9FF}"
                                      "\\x{AC00}-\\x{D7AF}\\x{1100}-\\x{11FF}]+",
                                      RE_DS3};
static const char *const L_SUPERBPE[] = {"\\p{N}+", "(?=([0-9]{3})+(?![0-9]))"};
static const char *const L_BAILING[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"};
static const char *const L_SEED_CODER[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
static const char *const L_UFAKZEKA[] = {
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)"
    "|\\s+"};
static const char *const L_LAGUNA[] = {"[^\\n]+|[\\n]+", RE_QWEN2};
static const char *const L_EXAONE_MOE[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
                 "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"};
static const char *const L_LINES[] = {"[^\\n]+|[\\n]+"};
static const char *const L_MINICPM5[] = {
    "\\p{N}{1,3}",
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};

#define LIST(a) a, sizeof(a) / sizeof(a[0])

enum {
    F_IGNORE_MERGES = 1,
    F_ADD_BOS = 2,
    F_NO_CLEAN = 4,
    F_ESCAPE_WS = 8,
    F_RAW_UTF8 = 16,
    F_NO_BOS_ID = 32,
    F_ADD_SEP = 64,
    F_GEMMA4 = 128
};

struct tr_pretok_family {
    const char *name;
    const char *const *re;
    size_t n_re;
    unsigned flags;
};

/* Every `tokenizer.ggml.pre` value llama.cpp accepts, with the flags its load() sets. Not
 * supported: kimi-k2 (a hand-written splitter), whitespace and hybriddna sessions. */
static const tr_pretok_family families[] = {
    {"default", LIST(L_DEFAULT), 0},
    {"minicpm5", LIST(L_MINICPM5), F_IGNORE_MERGES},
    {"llama3", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"llama-v3", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"llama-bpe", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"falcon3", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"falcon-h1", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"pixtral", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"midm-2.0", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"lfm2", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"jina-v5-nano", LIST(L_LLAMA3), F_IGNORE_MERGES | F_ADD_BOS},
    {"deepseek-llm", LIST(L_DS_LLM), F_NO_CLEAN},
    {"deepseek-coder", LIST(L_DS_CODER), F_NO_CLEAN},
    {"deepseek-v3", LIST(L_DS3), F_NO_CLEAN},
    {"spark2_5", LIST(L_SPARK), F_NO_CLEAN},
    {"youtu", LIST(L_YOUTU), F_NO_CLEAN | F_IGNORE_MERGES},
    {"falcon", LIST(L_FALCON), 0},
    {"mpt", LIST(L_GPT2), 0},
    {"starcoder", LIST(L_STARCODER), 0},
    {"gpt-2", LIST(L_GPT2), 0},
    {"phi-2", LIST(L_GPT2), 0},
    {"jina-es", LIST(L_GPT2), 0},
    {"jina-de", LIST(L_GPT2), 0},
    {"gigachat", LIST(L_GPT2), 0},
    {"jina-v2-es", LIST(L_GPT2), 0},
    {"jina-v2-de", LIST(L_GPT2), 0},
    {"a.x-4.0", LIST(L_GPT2), 0},
    {"mellum", LIST(L_GPT2), 0},
    {"modern-bert", LIST(L_GPT2), 0},
    {"jais-2", LIST(L_JAIS2), 0},
    {"gemma4", LIST(L_LINES), F_ESCAPE_WS | F_RAW_UTF8 | F_GEMMA4},
    {"granite-embed-multi-311m", LIST(L_LINES), F_ESCAPE_WS | F_RAW_UTF8 | F_GEMMA4},
    {"sarvam-moe", LIST(L_LINES), F_ESCAPE_WS | F_RAW_UTF8 | F_NO_CLEAN},
    {"jina-v1-en", LIST(L_GPT2), F_ADD_SEP},
    {"jina-v2-code", LIST(L_GPT2), F_ADD_SEP},
    {"roberta-bpe", LIST(L_GPT2), F_ADD_SEP},
    {"refact", LIST(L_STARCODER), 0},
    {"command-r", LIST(L_STARCODER), F_NO_CLEAN},
    {"qwen2", LIST(L_QWEN2), F_NO_CLEAN},
    {"deepseek-r1-qwen", LIST(L_QWEN2), F_NO_CLEAN},
    {"kormo", LIST(L_QWEN2), F_NO_CLEAN},
    {"f2llmv2", LIST(L_QWEN2), F_NO_CLEAN},
    {"qwen35", LIST(L_QWEN35), F_NO_CLEAN},
    {"stablelm2", LIST(L_QWEN2), 0},
    {"olmo", LIST(L_GPT2), 0},
    {"dbrx", LIST(L_LLAMA3), 0},
    {"smaug-bpe", LIST(L_LLAMA3), 0},
    {"poro-chat", LIST(L_PORO), F_NO_CLEAN},
    {"glm4", LIST(L_LLAMA3), F_NO_BOS_ID},
    {"chatglm-bpe", LIST(L_LLAMA3), F_NO_BOS_ID},
    {"viking", LIST(L_VIKING), F_NO_CLEAN},
    {"jais", LIST(L_GPT2), 0},
    {"tekken", LIST(L_TEKKEN), F_NO_CLEAN | F_IGNORE_MERGES | F_ADD_BOS},
    {"smollm", LIST(L_STARCODER), F_NO_CLEAN},
    {"codeshell", LIST(L_STARCODER), 0},
    {"bloom", LIST(L_PORO), 0},
    {"gpt3-finnish", LIST(L_PORO), 0},
    {"exaone", LIST(L_STARCODER), 0},
    {"exaone4", LIST(L_GPT2), 0},
    {"exaone-moe", LIST(L_EXAONE_MOE), 0},
    {"chameleon", LIST(L_CHAMELEON), F_ADD_BOS | F_NO_CLEAN},
    {"minerva-7b", LIST(L_STARCODER), 0},
    {"megrez", LIST(L_QWEN2), 0},
    {"gpt-4o", LIST(L_GPT4O), F_NO_CLEAN},
    {"llama4", LIST(L_GPT4O), F_NO_CLEAN},
    {"kanana2", LIST(L_GPT4O), F_NO_CLEAN},
    {"talkie", LIST(L_GPT4O), F_NO_CLEAN},
    {"granite-embed-multi-97m", LIST(L_GRANITE_EMB), F_NO_CLEAN | F_IGNORE_MERGES},
    {"tiny_aya", LIST(L_TINY_AYA), F_NO_CLEAN},
    {"cohere2moe", LIST(L_TINY_AYA), F_NO_CLEAN},
    {"superbpe", LIST(L_SUPERBPE), F_NO_CLEAN},
    {"trillion", LIST(L_GPT2), F_NO_CLEAN},
    {"granite-docling", LIST(L_GPT2), F_NO_CLEAN},
    {"bailingmoe", LIST(L_BAILING), F_NO_CLEAN},
    {"bailingmoe2", LIST(L_BAILING), F_NO_CLEAN},
    {"llada-moe", LIST(L_BAILING), F_NO_CLEAN},
    {"seed-coder", LIST(L_SEED_CODER), F_NO_CLEAN},
    {"hunyuan", LIST(L_QWEN2), F_NO_CLEAN},
    {"hunyuan-dense", LIST(L_DS3), F_NO_CLEAN},
    {"hy_v4", LIST(L_DS3), F_NO_CLEAN},
    {"joyai-llm", LIST(L_DS3), F_NO_CLEAN},
    {"afmoe", LIST(L_AFMOE), F_NO_CLEAN},
    {"ufakzeka", LIST(L_UFAKZEKA), F_NO_CLEAN},
    {"grok-2", LIST(L_QWEN2), F_NO_CLEAN},
    {"laguna", LIST(L_LAGUNA), F_NO_CLEAN},
    {"minimax-m2", LIST(L_GPT4O), F_NO_CLEAN},
    {"solar-open", LIST(L_QWEN2), F_NO_CLEAN},
    {"mellum2", LIST(L_STARCODER), 0},
};

const tr_pretok_family *tr_pretok_lookup(const char *name) {
    if (!name || !*name) return &families[0];
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i].name, name)) return &families[i];
    return NULL;
}

void tr_pretok_names(char *buf, size_t cap) {
    size_t n = 0;
    if (!cap) return;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        size_t l = strlen(families[i].name);
        if (n + l + 3 >= cap) break; /* the caller's message is bounded anyway */
        if (n) {
            memcpy(buf + n, ", ", 2);
            n += 2;
        }
        memcpy(buf + n, families[i].name, l);
        n += l;
        buf[n] = 0;
    }
}

tr_pretok_flags tr_pretok_family_flags(const tr_pretok_family *f) {
    tr_pretok_flags fl = {
        .ignore_merges = f->flags & F_IGNORE_MERGES,
        .add_bos = f->flags & F_ADD_BOS,
        .clean_spaces = !(f->flags & F_NO_CLEAN),
        .escape_ws = f->flags & F_ESCAPE_WS,
        .byte_encode = !(f->flags & F_RAW_UTF8),
        .no_bos_id = f->flags & F_NO_BOS_ID,
        .add_sep = f->flags & F_ADD_SEP,
    };
    return fl;
}

bool tr_pretok_is_gemma4(const tr_pretok_family *f) { return f->flags & F_GEMMA4; }

/* ---- compile --------------------------------------------------------------------------------- */

/* \p{Lu} \p{Ll} \p{Lt} \p{Lm} \p{Lo} -> \p{L} (llama.cpp collapses letter subcategories) */
static char *collapse_letter_cats(const char *re) {
    size_t n = strlen(re);
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + 5 < n && !strncmp(re + i, "\\p{L", 4) && strchr("ultmo", re[i + 4]) &&
            re[i + 5] == '}') {
            memcpy(out + o, "\\p{L}", 5);
            o += 5;
            i += 6;
        } else if (re[i] == '\\' && i + 1 < n) {
            out[o++] = re[i++]; /* keep escapes intact, e.g. "\\\\p" */
            out[o++] = re[i++];
        } else {
            out[o++] = re[i++];
        }
    }
    out[o] = 0;
    return out;
}

tr_status tr_pretok_compile(tr_pretok *p, const tr_pretok_family *fam, tr_error *err) {
    memset(p, 0, sizeof *p);
    p->fam = fam;
    p->re = calloc(fam->n_re, sizeof *p->re);
    if (!p->re) return tr_fail(err, TR_E_NOMEM, "pre-tokenizer '%s': out of memory", fam->name);
    p->n_re = fam->n_re;
    for (size_t i = 0; i < fam->n_re; i++) {
        bool digits = !strcmp(fam->re[i], DIGITS3);
        char *src = collapse_letter_cats(digits ? "\\p{N}+" : fam->re[i]);
        if (!src) return tr_fail(err, TR_E_NOMEM, "pre-tokenizer '%s': out of memory", fam->name);
        int ec;
        PCRE2_SIZE eoff;
        pcre2_code *code = pcre2_compile(
            (PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED,
            PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_AUTO_CAPTURE, &ec, &eoff, NULL);
        free(src);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return tr_fail(err, TR_E_INTERNAL,
                           "pre-tokenizer '%s': regex %zu does not compile: %s at %zu", fam->name,
                           i, (const char *)msg, (size_t)eoff);
        }
        /* JIT is an optimization only; where it is unavailable the interpreter runs */
        (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
        p->re[i] = code;
    }
    return TR_OK;
}

void tr_pretok_free(tr_pretok *p) {
    if (!p->re) return;
    for (size_t i = 0; i < p->n_re; i++) pcre2_code_free((pcre2_code *)p->re[i]);
    free(p->re);
    p->re = NULL;
    p->n_re = 0;
}

/* ---- split ----------------------------------------------------------------------------------- */

/* llama.cpp's White_Space set above ASCII (the ASCII ones are \t\n\v\f\r and space) */
static bool is_nonascii_ws(uint32_t c) {
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static tr_status match_fail(int rc, tr_error *err) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return tr_fail(err, TR_E_INTERNAL, "pre-tokenizer regex match failed: %s", (const char *)msg);
}

/* One match attempt; falls back from JIT to the interpreter if the JIT stack runs out. */
static int do_match(const pcre2_code *re, const char *s, size_t n, size_t pos, uint32_t opts,
                    pcre2_match_data *md) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, opts | PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, opts | PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                         NULL);
    return rc;
}

static bool push_piece(tr_zbuf *out, size_t a, size_t b) {
    if (a == b) return true; /* empty words produce no tokens in llama.cpp either */
    return tr_zbuf_push(out, a) && tr_zbuf_push(out, b);
}

/* Split subject s[0..n) (absolute offset `base` in the match string) with one regex, with the
 * semantics of std::regex_iterator as llama.cpp uses it: matches in order, text between them as
 * pieces of their own; after an empty match, a non-empty match is tried at the same position
 * before moving one character on. */
static tr_status split_one(const pcre2_code *re, const char *s, size_t n, size_t base,
                           pcre2_match_data *md, tr_zbuf *out, tr_error *err) {
    size_t pos = 0, last = 0;
    bool prev_empty = false;
    while (pos <= n) {
        int rc;
        if (prev_empty) {
            rc = do_match(re, s, n, pos, PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED, md);
            if (rc == PCRE2_ERROR_NOMATCH) {
                prev_empty = false;
                if (pos >= n) break;
                pos += tr_utf8_len((unsigned char)s[pos]);
                continue;
            }
        } else {
            rc = do_match(re, s, n, pos, 0, md);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return match_fail(rc, err);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > last && !push_piece(out, base + last, base + ms)) goto oom;
        if (!push_piece(out, base + ms, base + me)) goto oom;
        last = me;
        pos = me;
        prev_empty = ms == me;
    }
    if (last < n && !push_piece(out, base + last, base + n)) goto oom;
    return TR_OK;
oom:
    return tr_fail(err, TR_E_NOMEM, "pre-tokenizer: out of memory");
}

/* advance over k UTF-8 characters of valid text */
static size_t skip_chars(const char *s, size_t pos, size_t k) {
    while (k--) pos += tr_utf8_len((unsigned char)s[pos]);
    return pos;
}

/* the DIGITS3 splitter; `re` is \p{N}+ */
static tr_status split_digits3(const pcre2_code *re, const char *s, size_t n, size_t base,
                               pcre2_match_data *md, tr_zbuf *out, tr_error *err) {
    size_t pos = 0, prev = 0;
    while (pos < n) {
        int rc = do_match(re, s, n, pos, 0, md);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return match_fail(rc, err);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1], count = 0;
        for (size_t i = ms; i < me; i += tr_utf8_len((unsigned char)s[i])) count++;
        size_t cur = ms;
        if (count % 3) {
            cur = skip_chars(s, cur, count % 3);
            if (!push_piece(out, base + prev, base + cur)) goto oom;
            prev = cur;
        }
        while (cur < me) {
            cur = skip_chars(s, cur, 3);
            if (!push_piece(out, base + prev, base + cur)) goto oom;
            prev = cur;
        }
        pos = me;
    }
    if (prev < n && !push_piece(out, base + prev, base + n)) goto oom;
    return TR_OK;
oom:
    return tr_fail(err, TR_E_NOMEM, "pre-tokenizer: out of memory");
}

tr_status tr_pretok_split(const tr_pretok *p, const char *text, size_t len, bool byte_encode,
                          tr_cbuf *words, tr_zbuf *ends, tr_error *err) {
    if (!len) return TR_OK;
    tr_status st = TR_OK;
    uint32_t *cps = NULL;
    size_t *soff = NULL;
    char *s = NULL;
    tr_zbuf cur = {0}, next = {0};
    pcre2_match_data *md = NULL;

    /* code points with llama.cpp's decoding (invalid bytes -> U+FFFD), and the string PCRE2
     * matches: always valid UTF-8, one character per code point, whitespace as described above */
    if (len > SIZE_MAX / 8) goto oom;
    cps = malloc(len * sizeof *cps);
    soff = malloc((len + 1) * sizeof *soff);
    s = malloc(len * 3 + 1);
    md = pcre2_match_data_create(1, NULL);
    if (!cps || !soff || !s || !md) goto oom;
    size_t ncp = 0, sn = 0;
    for (size_t off = 0; off < len;) {
        uint32_t c = tr_utf8_decode((const unsigned char *)text, len, &off);
        cps[ncp] = c;
        soff[ncp++] = sn;
        uint32_t m = c;
        if (is_nonascii_ws(c))
            m = 0x0b;
        else if (c == 0x180e)
            m = 0x200b;
        /* PCRE2 needs valid UTF-8: a surrogate is matched as a private-use character, which
         * like a surrogate in llama.cpp's tables is none of L, M, N, P, S or whitespace */
        else if (c >= 0xd800 && c <= 0xdfff)
            m = 0xe000;
        sn += tr_utf8_encode(m, s + sn);
    }
    soff[ncp] = sn;
    s[sn] = 0;

    if (!tr_zbuf_push(&cur, 0) || !tr_zbuf_push(&cur, sn)) goto oom;
    for (size_t r = 0; r < p->n_re; r++) {
        next.n = 0;
        for (size_t i = 0; i < cur.n; i += 2) {
            size_t a = cur.v[i], b = cur.v[i + 1];
            st = !strcmp(p->fam->re[r], DIGITS3)
                     ? split_digits3((const pcre2_code *)p->re[r], s + a, b - a, a, md, &next, err)
                     : split_one((const pcre2_code *)p->re[r], s + a, b - a, a, md, &next, err);
            if (st) goto done;
        }
        tr_zbuf tmp = cur;
        cur = next;
        next = tmp;
    }

    /* emit: map byte offsets in s back to code points, re-encode the original code points */
    size_t ci = 0;
    for (size_t i = 0; i < cur.n; i += 2) {
        size_t a = cur.v[i], b = cur.v[i + 1];
        while (soff[ci] < a) ci++; /* pieces are in increasing order */
        for (; ci < ncp && soff[ci] < b; ci++) {
            char u[4];
            size_t un = tr_utf8_encode(cps[ci], u);
            if (!byte_encode) {
                if (!tr_cbuf_append(words, u, un)) goto oom;
                continue;
            }
            for (size_t k = 0; k < un; k++) {
                char e[4];
                size_t en = tr_utf8_encode(tr_byte_to_cp((unsigned char)u[k]), e);
                if (!tr_cbuf_append(words, e, en)) goto oom;
            }
        }
        if (!tr_zbuf_push(ends, words->n)) goto oom;
    }
    goto done;
oom:
    st = tr_fail(err, TR_E_NOMEM, "pre-tokenizer: out of memory (text of %zu bytes)", len);
done:
    free(cps);
    free(soff);
    free(s);
    tr_zbuf_free(&cur);
    tr_zbuf_free(&next);
    if (md) pcre2_match_data_free(md);
    return st;
}
