#!/usr/bin/env bash
# KV policies against --kv-policy full, in alternating rounds on the same prompt: a ~3.4K-token
# King James prompt, 64 tokens decoded greedily (CTX, default 4096; N, default 64). Policies:
# auto (where the KV fits it resolves to full), tiered (no --kv-hot: every token hot), cold
# (tiered with an 8 MiB hot pool and a cold pool in a temporary directory). Prints each run's
# prefill and decode rates (and the cold runs' bytes read in prefill) and each policy's means
# against full's.
# usage: bench/auto_paired.sh [ROUNDS [POLICY...]]   (default: 2 auto; run it under `cpu excl`)
set -euo pipefail
cd "$(dirname "$0")/.."
M=$(bash scripts/get_model.sh smollm2)
[ -f build/kjv.txt ] || bible gen1:1-rev22:21 > build/kjv.txt
P=$(mktemp /tmp/terrace-paired.XXXXXX)
COLD=$(mktemp -d /tmp/terrace-paired-cold.XXXXXX)
trap 'rm -rf "$P" "$COLD"' EXIT
head -c 13000 build/kjv.txt > "$P"
rounds=${1:-2}
shift || true
pols=(full "${@:-auto}")
for i in $(seq "$rounds"); do
    for pol in "${pols[@]}"; do
        case $pol in
        full) flags=(--kv-policy full) ;;
        auto) flags=() ;;
        tiered) flags=(--kv-policy tiered) ;;
        cold) flags=(--kv-policy tiered --kv-hot 8M --kv-cold "$COLD") ;;
        *) echo "unknown policy $pol" >&2; exit 2 ;;
        esac
        out=$(build/terrace run -m "$M" -f "$P" -c "${CTX:-4096}" -n "${N:-64}" --ignore-eos --temp 0 \
              -t 2 -v "${flags[@]}" 2>&1 >/dev/null)
        pp=$(grep -oP 'prompt\s+\d+ tokens\s+[\d.]+ ms\s+\K[\d.]+' <<<"$out")
        tg=$(grep -oP 'generated\s+\d+ tokens\s+[\d.]+ ms\s+\K[\d.]+' <<<"$out")
        note=$(grep -oE 'kv cache auto: [^(]*|kv prefill .*' <<<"$out" || true)
        echo "$pol $pp $tg $note"
    done
done | awk '{print; pp[$1]+=$2; tg[$1]+=$3; n[$1]++}
  END {printf "mean: full prefill %.2f tok/s decode %.2f tok/s\n", pp["full"]/n["full"], tg["full"]/n["full"];
       for (p in pp) if (p != "full")
         printf "mean: %s prefill %.2f tok/s (%.3fx full) decode %.2f tok/s (%.3fx full)\n",
           p, pp[p]/n[p], pp[p]/pp["full"], tg[p]/n[p], tg[p]/tg["full"]}'
