#!/usr/bin/env bash
# --kv-policy auto where the KV fits (it resolves to full) against --kv-policy full, in
# alternating pairs on the same prompt: a ~3.4K-token King James prompt at -c 4096, 64 tokens
# decoded greedily. Prints each run's prefill and decode rates and the ratios of the means.
# usage: bench/auto_paired.sh [PAIRS]   (run it under `cpu excl`)
set -euo pipefail
cd "$(dirname "$0")/.."
M=$(bash scripts/get_model.sh smollm2)
[ -f build/kjv.txt ] || bible gen1:1-rev22:21 > build/kjv.txt
P=$(mktemp /tmp/terrace-paired.XXXXXX)
trap 'rm -f "$P"' EXIT
head -c 13000 build/kjv.txt > "$P"
pairs=${1:-2}
for i in $(seq "$pairs"); do
    for pol in full auto; do
        flags=(); [ "$pol" = full ] && flags=(--kv-policy full)
        out=$(build/terrace run -m "$M" -f "$P" -c 4096 -n 64 --ignore-eos --temp 0 -t 2 -v "${flags[@]}" 2>&1 >/dev/null)
        pp=$(grep -oP 'prompt\s+\d+ tokens\s+[\d.]+ ms\s+\K[\d.]+' <<<"$out")
        tg=$(grep -oP 'generated\s+\d+ tokens\s+[\d.]+ ms\s+\K[\d.]+' <<<"$out")
        note=$(grep -o 'kv cache auto: [^(]*' <<<"$out" || true)
        echo "$pol $pp $tg $note"
    done
done | awk '{print; pp[$1]+=$2; tg[$1]+=$3; n[$1]++}
  END {printf "mean: full prefill %.2f tok/s decode %.2f tok/s; auto prefill %.2f tok/s (%.3fx) decode %.2f tok/s (%.3fx)\n",
       pp["full"]/n["full"], tg["full"]/n["full"], pp["auto"]/n["auto"], pp["auto"]/pp["full"], tg["auto"]/n["auto"], tg["auto"]/tg["full"]}'
