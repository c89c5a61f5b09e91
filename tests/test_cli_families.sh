#!/usr/bin/env bash
# test_cli_families.sh ENGINE - the command line on each architecture family and
# weight format (test_cli.sh has the rest): bad checkpoints of the DeepSeek-V3 family,
# Kimi-Linear and Kimi K3, companion tensors and quantization_config of the weights as
# shipped, each giving one line that names the file, field or tensor and exit 2;
# inspect (--config-only against the checkpoint's bytes), chat templates, logits,
# NaN weights, and --stats' per-token split of the evaluation time.
# Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
ENG=${1:-build/deltafin-san}
MODELS=${DF_TEST_MODELS:-build/test-models}
PY=/usr/bin/python3
GOOD=$MODELS/engine-dense
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. tests/lib.sh

# ---- the DeepSeek-V3 family: bad input, inspect, chat, logits
DS=$MODELS/engine-ds; DS2=$MODELS/engine-ds-v2; DSC=$MODELS/engine-ds-chat
KIMI=$MODELS/engine-kimi; KW=$MODELS/engine-kimi-wrap
copy_of() { rm -rf "$T/m"; cp -r "$1" "$T/m"; }
# set_cfg FILE KEY=JSON... : top-level fields of a JSON file (KEY=DEL removes; a.b=... nests)
set_cfg() { $PY - "$@" <<'PYEOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p, encoding="utf-8"))
for kv in sys.argv[2:]:
    k, v = kv.split("=", 1); o = c; ks = k.split(".")
    for x in ks[:-1]: o = o[x]
    if v == "DEL": o.pop(ks[-1])
    else: o[ks[-1]] = json.loads(v)
json.dump(c, open(p, "w", encoding="utf-8"), ensure_ascii=False)
PYEOF
}
# drop_tensor DIR NAME: removes a tensor from its shard's header and from the index
drop_tensor() { $PY - "$1" "$2" <<'PYEOF'
import glob, json, os, struct, sys
d, name = sys.argv[1], sys.argv[2]
for path in glob.glob(d + "/*.safetensors"):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    if h.pop(name, None) is None: continue
    s = json.dumps(h, separators=(",", ":")).encode(); s += b" " * (-len(s) % 8)
    open(path, "wb").write(struct.pack("<Q", len(s)) + s + b[8 + n:])
ix = d + "/model.safetensors.index.json"
if os.path.exists(ix):
    j = json.load(open(ix)); j["weight_map"].pop(name); json.dump(j, open(ix, "w"))
PYEOF
}
# missing MLA and router tensors: the tensor named, against the index of a sharded checkpoint
for t in self_attn.kv_b_proj.weight self_attn.kv_a_layernorm.weight self_attn.q_a_layernorm.weight \
         self_attn.kv_a_proj_with_mqa.weight mlp.gate.e_score_correction_bias mlp.shared_experts.up_proj.weight; do
    copy_of "$DS"; drop_tensor "$T/m" "model.layers.1.$t"
    expect_error "ds-missing-${t%.weight}" "model.safetensors.index.json: tensor 'model.layers.1.$t' is missing" \
        "$ENG" inspect --model "$T/m"
done
copy_of "$DS2"; drop_tensor "$T/m" model.layers.2.self_attn.q_proj.weight
expect_error ds-v2-missing-q_proj "/model.safetensors: tensor 'model.layers.2.self_attn.q_proj.weight' is missing" \
    "$ENG" inspect --model "$T/m"
copy_of "$KW"; drop_tensor "$T/m" language_model.model.layers.0.self_attn.kv_b_proj.weight
expect_error kimi-wrap-missing-kv_b "tensor 'language_model.model.layers.0.self_attn.kv_b_proj.weight' is missing" \
    "$ENG" inspect --model "$T/m"
# latent sizes that disagree with the config: the tensor, its shape and the config's
copy_of "$DS"; set_cfg "$T/m/config.json" kv_lora_rank=16
expect_error ds-kv-lora-rank "model-00001-of-00004.safetensors: tensor 'model.layers.0.self_attn.kv_a_proj_with_mqa.weight' has shape \[40,96\] but config.json implies \[24,96\]" \
    "$ENG" inspect --model "$T/m"
copy_of "$DS2"; set_cfg "$T/m/config.json" q_lora_rank=48
expect_error ds-v2-q-lora-rank "tensor 'model.layers.0.self_attn.q_a_proj.weight' is missing" "$ENG" inspect --model "$T/m"
# router fields: the file and the field
for kv in "n_group=3|field 'n_group' \(3\) must divide n_routed_experts \(16\)" \
          "topk_group=5|field 'topk_group' \(5\) exceeds n_group \(4\)" \
          "scoring_func=\"softplus\"|field 'scoring_func' 'softplus' is not supported \(supported: softmax, sigmoid\)" \
          "topk_method=\"random\"|field 'topk_method' 'random' is not supported \(supported: greedy" \
          "attention_bias=true|field 'attention_bias' true is not supported" \
          "qk_rope_head_dim=7|field 'qk_rope_head_dim' \(7\) must be even"; do
    copy_of "$DS"; set_cfg "$T/m/config.json" "${kv%%|*}"
    expect_error "ds-cfg-${kv%%=*}" "/config.json: ${kv#*|}" "$ENG" inspect --model "$T/m"
done
# a wrapper: text_config must be an object; its fields are named under it
copy_of "$KW"; set_cfg "$T/m/config.json" 'text_config="kimi_k2"'
expect_error kimi-wrap-text-config "/config.json: field 'text_config' must be an object" "$ENG" inspect --model "$T/m"
copy_of "$KW"; set_cfg "$T/m/config.json" 'text_config.topk_method="best"'
expect_error kimi-wrap-field "/config.json: field 'text_config.topk_method' 'best' is not supported" \
    "$ENG" inspect --model "$T/m"
# a malformed tiktoken.model: the file, the line and what is wrong
tiktoken_edit() { $PY - "$T/m/tiktoken.model" "$1" <<'PYEOF'
import sys
p, how = sys.argv[1], sys.argv[2]
L = open(p).read().splitlines()
tok = L[300].split()[0]
if how == "b64": L[300] = "QQ=A 300"
if how == "dup-rank": L[300] = tok + " 17"
if how == "dup-token": L[300] = L[65].split()[0] + " 300"
if how == "missing-rank": del L[300]
open(p, "w").write("\n".join(L) + "\n")
PYEOF
}
for c in 'b64|line 301: bad base64 "QQ=A"' 'dup-rank|line 301: rank 17 given twice' \
         'dup-token|line 301: token "Yg==" given twice' 'missing-rank|line 1007: rank 1007, but ranks must be 0..1006 \(one per line\): some rank is missing'; do
    copy_of "$KIMI"; tiktoken_edit "${c%%|*}"
    expect_error "tiktoken-${c%%|*}" "/tiktoken.model: ${c#*|}" "$ENG" inspect --model "$T/m"
done
# tokenizer_config.json: read for its chat_template whatever the tokenizer's format
copy_of "$DS"; echo '{"chat_template": ' >"$T/m/tokenizer_config.json"
expect_error tokenizer-config-malformed "/tokenizer_config.json: malformed JSON" "$ENG" inspect --model "$T/m"
copy_of "$DS"; set_cfg "$T/m/tokenizer_config.json" chat_template=7
expect_error tokenizer-config-template "/tokenizer_config.json: field 'chat_template' must be a string" \
    "$ENG" inspect --model "$T/m"

# inspect: the family's lines, and bytes that add up: always-active (shared experts
# and dense layers included) + routed + not used (a wrapper's vision tower) = total
inspect_bytes() { # DIR -> "ok" or why not, from its inspect output in $T/inspect-NAME
    $PY -c '
import json, re, sys
d = sys.argv[1]; out = sys.stdin.read()
c = json.load(open(d + "/config.json")); c = c.get("text_config", c)
m = re.search(r"bytes: total .*?\((\d+)\), always-active .*?\((\d+)\), routed experts .*?\((\d+)\)\n(?:not used: \d+ tensors?, .*?\((\d+)\))?", out)
total, act, routed, unread = (int(x or 0) for x in m.groups())
read = skipped = grouped = 0; names = []
for ln in out.splitlines():
    g = re.match(r"  (\S+)\s+\S+\s+\S+\s+(\d+)(  not used)?$", ln)
    e = re.match(r"  (\S+\.experts\.\*)\s+(\d+) tensors", ln)
    if g:
        names.append((g.group(1), bool(g.group(3))))
        if g.group(3): skipped += int(g.group(2))
        else: read += int(g.group(2))
    elif e: grouped += 1
moe = [l for l in range(c["num_hidden_layers"]) if l >= c["first_k_dense_replace"]]
want_routed = len(moe) * c["n_routed_experts"] * 3 * c["moe_intermediate_size"] * c["hidden_size"] * 2
dense_mlp = [n for n, nr in names if re.search(r"layers\.0\.mlp\.(gate|up|down)_proj", n) and not nr]
shared = [n for n, nr in names if "shared_experts" in n and not nr]
why = []
if total != act + routed + unread: why.append(f"{total} != {act} + {routed} + {unread}")
if act != read: why.append(f"always-active {act} != listed read tensors {read}")
if unread != skipped: why.append(f"not used {unread} != listed {skipped}")
if routed != want_routed or grouped != len(moe): why.append(f"routed {routed} != {want_routed} ({grouped} groups)")
if len(dense_mlp) != 3 or len(shared) != 3 * len(moe): why.append(f"dense {dense_mlp} shared {shared}")
print("; ".join(why) or "ok")' "$1" <"$T/inspect-$(basename "$1")"
}
for m in "$DS" "$DS2" "$KW"; do
    "$ENG" inspect --model "$m" >"$T/inspect-$(basename "$m")" 2>&1
    r=$(inspect_bytes "$m"); [ "$r" = ok ] && ok "inspect-bytes-$(basename "$m")" || bad "inspect-bytes-$(basename "$m")" "$r"
done
inspect_has() { # NAME DIR PATTERN... (the inspect output kept above, or a fresh one)
    local name=$1 dir=$2 p out=$T/inspect-$(basename "$2"); shift 2
    if [ "$dir" = "$T/m" ] || [ ! -s "$out" ]; then
        "$ENG" inspect --model "$dir" >"$T/out" 2>&1 || { bad "$name" "$(tail -1 "$T/out")"; return; }
        out=$T/out
    fi
    for p in "$@"; do grep -qE -- "$p" "$out" || { bad "$name" "no /$p/ in: $(grep -vE '^  |^$' "$out" | tr '\n' '|')"; return; }; done
    ok "$name"
}
inspect_has inspect-ds "$DS" "^attention +MLA, 4 heads, q-LoRA 48, kv_lora_rank 32, qk nope 16 \+ rope 8, v 16$" \
    "^latent cache +40 values per token per layer" "^dense layers +1, MLPs always-active: 90.00 KiB$" \
    "^experts +16 routed, top-4, 1 shared, moe_intermediate 32$" "^shared experts +1 per MoE layer, always-active: 36.00 KiB$" \
    "^router +sigmoid, noaux_tc, 4 groups keep 2, norm_topk_prob yes, routed_scaling_factor 2.5, selection on score \+ e_score_correction_bias$" \
    "^rope +theta 10000, interleaved, scaling yarn \(factor 4\)$" "^stop tokens +1$" "^chat template +DeepSeek-V3$"
inspect_has inspect-ds-v2 "$DS2" "^attention +MLA, 4 heads, q_proj," "^shared experts +2 per MoE layer" \
    "^router +softmax, greedy, norm_topk_prob no, routed_scaling_factor 1$" "^MoE layers +2 of 3 \(first dense 1"
inspect_has inspect-kimi-wrap "$KW" "^architecture +kimi_k2$" "^text model +text_config, tensors under 'language_model\.'$" \
    "^  vision_tower\.\S+ .* not used$" "^not used: [0-9]+ tensors" "^router +sigmoid, noaux_tc, .*routed_scaling_factor 2.827, " "^chat template +Kimi K2$"

# chat: the family's template, its markers single control tokens, message content
# plain text; `tokenize --chat` shows the very ids `run --chat` evaluates
ids_of_text() { "$ENG" tokenize --model "$1" --text "$2" 2>&1; }
chat_ids() { "$ENG" tokenize --model "$@" --chat 2>&1; }
run_rows() { # DIR ARGS... -> prompt rows of a --chat run
    "$ENG" run --model "$1" --chat --max-new 1 --temp 0 --events "$T/ev" "${@:2}" >/dev/null 2>"$T/err" \
        && sed -n 's/^{"event":"prefill","rows":\([0-9]*\),.*/\1/p' "$T/ev"
}
# chat_check NAME DIR WANT_TEXT USER [SYSTEM]: the conversation's ids are those of WANT_TEXT
# with its specials recognised (so they decode to it: tokenize-roundtrip); without a system
# message, also that they are what run --chat evaluates
chat_check() {
    local name=$1 dir=$2 want=$3 ids all rows sys=(); [ $# -ge 5 ] && sys=(--system "$5")
    ids=$(chat_ids "$dir" --text "$4" "${sys[@]}"); all=$(ids_of_text "$dir" "$want")
    rows=$(echo "$ids" | wc -w); [ $# -ge 5 ] || rows=$(run_rows "$dir" --prompt "$4")
    if [ -n "$ids" ] && [ "$ids" = "$all" ] && [ "$rows" = "$(echo "$ids" | wc -w)" ]; then ok "$name"
    else bad "$name" "ids '$ids', want those of '$want': '$all'; run --chat rows '$rows' $(tail -1 "$T/err")"; fi
}
BOS='<｜begin▁of▁sentence｜>'; USR='<｜User｜>'; AST='<｜Assistant｜>'; EOS='<｜end▁of▁sentence｜>'
chat_check chat-ds "$DSC" "${BOS}${USR}Hello${AST}" Hello
chat_check chat-ds-system "$DSC" "${BOS}Be brief.${USR}Hello${AST}" Hello "Be brief."
# DeepSeek-V2-Chat's own template, chosen when the checkpoint's Jinja is V2's (V2.5's,
# with V3's markers, keeps V3's: engine-ds-v2 carries V3's tokenizer_config.json)
copy_of "$DSC"; set_cfg "$T/m/config.json" model_type='"deepseek_v2"'
set_cfg "$T/m/tokenizer_config.json" chat_template='"{{ bos_token }}{% for message in messages %}{% if message['"'"'role'"'"'] == '"'"'user'"'"' %}{{ '"'"'User: '"'"' + message['"'"'content'"'"'] + '"'"'\\n\\n'"'"' }}{% endif %}{% endfor %}"'
inspect_has inspect-ds-v2-template "$T/m" "^chat template +DeepSeek-V2$"
chat_check chat-ds-v2 "$T/m" "${BOS}User: Hello

Assistant:" Hello
chat_check chat-ds-v2-system "$T/m" "${BOS}Be brief.

User: Hello

Assistant:" Hello "Be brief."
inspect_has inspect-ds-v2-v3-template "$DS2" "^chat template +DeepSeek-V3$"
KSYS='<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>'
chat_check chat-kimi "$KIMI" "${KSYS}<|im_user|>user<|im_middle|>Hello<|im_end|><|im_assistant|>assistant<|im_middle|>" Hello
chat_check chat-kimi-system "$KIMI" "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hello<|im_end|><|im_assistant|>assistant<|im_middle|>" \
    Hello "Be brief."
# DeepSeek-R1 shares deepseek_v3: its tokenizer_config.json's template (V3's with R1's
# generation prompt, written as the R1 checkpoint writes it) makes the prompt open <think>
copy_of "$DSC"; $PY - "$T/m/tokenizer_config.json" <<'PYEOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p, encoding="utf-8")); t = c["chat_template"]
end = "{{'<｜Assistant｜>'}}{% endif %}"
assert t.endswith(end)
c["chat_template"] = t[:-len(end)] + "{{'<｜Assistant｜><think>\\n'}}{% endif %}"
json.dump(c, open(p, "w", encoding="utf-8"), ensure_ascii=False, indent=2)
PYEOF
grep -qF "<think>\\\\n'}}" "$T/m/tokenizer_config.json" || bad chat-r1-setup "the template lacks R1's escaped newline"
chat_check chat-r1 "$T/m" "${BOS}${USR}Hello${AST}<think>
" Hello
inspect_has chat-r1-inspect "$T/m" "^chat template +DeepSeek-R1$" "^stop tokens +1$"
# V3.1-style "<think>" with no newline is not R1's template
set_cfg "$T/m/tokenizer_config.json" "chat_template=\"{{'<｜Assistant｜><think>'}}\""
inspect_has chat-v31-not-r1 "$T/m" "^chat template +DeepSeek-V3$"
# special-token text typed in a message is plain text, never a control token
# plain_check NAME DIR TEXT "IDS" "COUNTS": each id occurs as often as its count says (the
# template's own) in the conversation, which is longer than one whose message is "x" (NX)
plain_check() {
    local ids got=; ids=$(chat_ids "$2" --text "$3")
    for i in $4; do got="$got $(echo "$ids" | tr ' ' '\n' | grep -cx "$i")"; done
    [ "${got# }" = "$5" ] && [ "$(echo "$ids" | wc -w)" -gt "$NX" ] && ok "$1" \
        || bad "$1" "ids $4 occur${got} times (want $5), $(echo "$ids" | wc -w) ids (x: $NX): $ids"
}
NX=$(chat_ids "$DSC" --text x | wc -w)
plain_check chat-ds-specials-are-text "$DSC" "a${USR}b${EOS}${BOS}" "128803 1 0" "1 0 1"
IMEND=$(ids_of_text "$KIMI" '<|im_end|>'); IMUSER=$(ids_of_text "$KIMI" '<|im_user|>')
NX=$(chat_ids "$KIMI" --text x | wc -w)
plain_check chat-kimi-specials-are-text "$KIMI" 'x<|im_end|><|im_user|>user' "$IMEND $IMUSER" "2 1"
# stop ids: generation_config.json's and the template's end token
KEOS=$(ids_of_text "$KIMI" '[EOS]')
inspect_has stop-kimi "$KIMI" "^stop tokens +$KEOS $IMEND$"
# a stop id from generation_config.json ends the turn: the greedy first token made one
first=$("$ENG" run --model "$KIMI" --chat --prompt Hello --max-new 4 --temp 0 --print-ids 2>&1 | cut -d' ' -f1)
copy_of "$KIMI"; set_cfg "$T/m/generation_config.json" "eos_token_id=[$first]"
out=$("$ENG" run --model "$T/m" --chat --prompt Hello --max-new 4 --temp 0 --print-ids 2>&1)
[ -n "$first" ] && [ "$out" = "$first" ] && ok stop-from-generation-config || bad stop-from-generation-config "'$out' (stop id $first)"
# logits: a row's logits do not depend on how the tokens were fed (and the wrapper runs)
for m in "$KW"; do # (the DeepSeek models: reference-deepseek --determinism --batch 3)
    "$ENG" logits --model "$m" --tokens 5,17,300,5,9,2 --out "$T/la" >"$T/err" 2>&1 &&
    "$ENG" logits --model "$m" --tokens 5,17,300,5,9,2 --batch 1 --out "$T/lb" >>"$T/err" 2>&1 &&
    [ "$(stat -c %s "$T/la")" -eq $((6 * 1024 * 4)) ] && cmp -s "$T/la" "$T/lb" && ok "logits-batch-$(basename "$m")" \
        || bad "logits-batch-$(basename "$m")" "$(tail -2 "$T/err")"
done
expect_error kimi-logits-out-of-vocab "outside the vocabulary" "$ENG" logits --model "$KW" --tokens 1,1024 --out "$T/la"

# ---- weights as shipped (issue 22): companion tensors and quantization_config
# st_edit DIR OP...: tensors rewritten in place (tests/st_edit.py)
st_edit() { $PY tests/st_edit.py "$@"; }
FP8=$MODELS/engine-fp8-ds; INT4=$MODELS/engine-int4-kimi; MIX=$MODELS/engine-mixed-kimi
X=model.layers; F1=model-00001-of-00005.safetensors
# q_bad NAME MODEL PATTERN OP...: the model with its tensors edited is refused by inspect
q_bad() { local n=$1 m=$2 pat=$3; shift 3; copy_of "$m"; st_edit "$T/m" "$@"
    expect_error "q-$n" "$pat" "$ENG" inspect --model "$T/m"; }
# scale grids of the wrong shape (a dense weight and a routed expert, each format)
q_bad fp8-grid "$FP8" "/$F1: tensor '$X.0.self_attn.o_proj.weight_scale_inv' has shape \[2,2\] but one scale per 128x128 block of the weight's shape gives \[2,1\]" \
    shape=$X.0.self_attn.o_proj.weight_scale_inv:2,2
q_bad fp8-expert-grid "$FP8" "tensor '$X.1.mlp.experts.3.down_proj.weight_scale_inv' has shape \[1,1\] but one scale per 128x128 block of the weight's shape gives \[2,1\]" \
    shape=$X.1.mlp.experts.3.down_proj.weight_scale_inv:1,1
q_bad int4-grid "$MIX" "tensor '$X.0.self_attn.q_b_proj.weight_scale' has shape \[96,2\] but one scale per 32 values of the weight's shape gives \[96,1\]" \
    shape=$X.0.self_attn.q_b_proj.weight_scale:96,2
q_bad int4-expert-grid "$INT4" "tensor '$X.1.mlp.experts.3.down_proj.weight_scale' has shape \[64,2\] but one scale per 32 values of the weight's shape gives \[64,1\]" \
    shape=$X.1.mlp.experts.3.down_proj.weight_scale:64,2
q_bad mxfp4-expert-grid "$MIX" "tensor '$X.1.mlp.experts.0.gate_proj.weight_scale' has shape \[32,1\] but one scale per 32 values of the weight's shape gives \[32,2\]" \
    shape=$X.1.mlp.experts.0.gate_proj.weight_scale:32,1
# packed widths that disagree with weight_shape
q_bad int4-weight-shape "$MIX" "tensor '$X.0.self_attn.o_proj.weight_shape' holds \[64,32\] but the weight is \[64,64\]" \
    vals=$X.0.self_attn.o_proj.weight_shape:64,32
q_bad int4-expert-weight-shape "$INT4" "tensor '$X.1.mlp.experts.3.down_proj.weight_shape' holds \[64,64\] but the weight is \[64,32\]" \
    vals=$X.1.mlp.experts.3.down_proj.weight_shape:64,64
q_bad int4-packed-width "$INT4" "tensor '$X.2.mlp.experts.1.up_proj.weight_packed' has shape \[32,4\] but eight values per word of the weight's shape gives \[32,8\]" \
    shape=$X.2.mlp.experts.1.up_proj.weight_packed:32,4
q_bad mxfp4-packed-width "$MIX" "tensor '$X.1.mlp.experts.4.down_proj.weight_packed' has shape \[64,8\] but two values per byte of the weight's shape gives \[64,16\]" \
    shape=$X.1.mlp.experts.4.down_proj.weight_packed:64,8
# NaN scales in always-active weights: refused at load (F32 NaN, BF16 NaN)
q_bad fp8-nan-scale "$FP8" "/$F1: tensor '$X.0.self_attn.o_proj.weight_scale_inv': scale 1 is not finite" \
    set=$X.0.self_attn.o_proj.weight_scale_inv:1:7fc00000
q_bad int4-nan-scale "$MIX" "tensor '$X.0.self_attn.q_b_proj.weight_scale': scale 5 is not finite" \
    set=$X.0.self_attn.q_b_proj.weight_scale:5:7fc0
# a format named in the config, its tensors missing
q_bad fp8-no-scale "$FP8" "/model.safetensors.index.json: tensor '$X.0.mlp.up_proj.weight_scale_inv' is missing from the checkpoint" \
    drop=$X.0.mlp.up_proj.weight_scale_inv
q_bad int4-no-weight-shape "$INT4" "tensor '$X.1.mlp.experts.5.gate_proj.weight_shape' is missing from the checkpoint \(pack-quantized" \
    drop=$X.1.mlp.experts.5.gate_proj.weight_shape
q_bad mxfp4-no-packed "$MIX" "tensor '$X.2.mlp.experts.5.down_proj.weight_packed' is missing from the checkpoint" \
    drop=$X.2.mlp.experts.5.down_proj.weight_packed
# tensors the config does not name: a scale beside a BF16 weight; an F8 weight of a
# module the config keeps in BF16; a packed weight of an ignored module
q_bad stray-scale "$INT4" "tensor '$X.0.self_attn.o_proj.weight_scale' is there but quantization_config gives module '$X.0.self_attn.o_proj' the format bf16" \
    add=$X.0.self_attn.o_proj.weight_scale:BF16:64,2
copy_of "$FP8"; set_cfg "$T/m/config.json" "quantization_config.modules_to_not_convert=[\"$X.1.self_attn.q_a_proj\"]"
expect_error q-fp8-not-converted "tensor '$X.1.self_attn.q_a_proj.weight' is F8_E4M3 but the checkpoint's quantization_config does not give module" \
    "$ENG" inspect --model "$T/m"
copy_of "$MIX"; set_cfg "$T/m/config.json" "quantization_config.ignore=[\"re:.*lm_head.*\", \"$X.0.self_attn.o_proj\"]"
expect_error q-ignored-packed "tensor '$X.0.self_attn.o_proj.weight_packed' is packed but the checkpoint's quantization_config gives module '$X.0.self_attn.o_proj' no packed format" \
    "$ENG" run --model "$T/m" --prompt-tokens 1 --max-new 1
# unsupported quantization_config: the field; two groups targeting one module: both named
copy_of "$INT4"; set_cfg "$T/m/config.json" quantization_config.config_groups.group_0.weights.num_bits=8
expect_error q-num-bits "/config.json: field 'quantization_config.config_groups.group_0.weights.num_bits' must be 4" \
    "$ENG" inspect --model "$T/m"
copy_of "$FP8"; set_cfg "$T/m/config.json" 'quantization_config.activation_scheme="static"'
expect_error q-static "/config.json: field 'quantization_config.activation_scheme' must be \"dynamic\"" \
    "$ENG" run --model "$T/m" --prompt-tokens 1 --max-new 1
copy_of "$MIX"; set_cfg "$T/m/config.json" 'quantization_config.config_groups.group_1.targets=["Linear"]'
expect_error q-two-groups "module '$X.1.mlp.experts.0.gate_proj' is targeted by config groups 'group_0' and 'group_1'" \
    "$ENG" inspect --model "$T/m"
# NaN scales in routed experts are not read at load: the pack writer refuses them as it
# copies the expert (E8M0 0xFF, BF16 and F32 infinities), and resident experts are
# scanned once at open (inspect reads no expert)
q_nan_expert() { # NAME MODEL TENSOR INDEX HEX
    local msg="tensor '$3': scale $4 is (the E8M0 NaN code 0xFF|not finite)"
    copy_of "$2"; st_edit "$T/m" "set=$3:$4:$5"
    expect_error "q-pack-$1" "^deltafin pack: .*$msg" "$ENG" pack --model "$T/m" --out "$T/p-$1"
    expect_error "q-resident-$1" "^deltafin: .*$msg" "$ENG" run --model "$T/m" --prompt-tokens 1,2 --max-new 1
    "$ENG" inspect --model "$T/m" >/dev/null 2>&1 && ok "q-inspect-$1" || bad "q-inspect-$1" "inspect read the expert scales"
}
q_nan_expert mxfp4 "$MIX" $X.1.mlp.experts.2.up_proj.weight_scale 5 ff
q_nan_expert int4 "$INT4" $X.2.mlp.experts.7.down_proj.weight_scale 3 7f80
q_nan_expert fp8 "$FP8" $X.2.mlp.experts.15.up_proj.weight_scale_inv 1 ff800000

# A NaN where the checkpoint should hold a number and that no load-time scan
# sees (the final norm here; an expert's scale streamed from the safetensors
# alike) makes every logit NaN: generation stops with an error naming the
# position, on each path that samples (plain, speculative, batched), instead
# of emitting id 0 over and over with exit 0. `logits` still writes them.
copy_of "$GOOD"; st_edit "$T/m" "set=model.norm.weight:5:7e00"
NANMSG="the model's logits after 2 tokens are all NaN or infinite: the checkpoint holds NaN or Inf"
expect_error nan-logits-run "^deltafin: $NANMSG" "$ENG" run --model "$T/m" --prompt-tokens 1,2 --max-new 3
expect_error nan-logits-spec "^deltafin: $NANMSG" \
    "$ENG" run --model "$T/m" --prompt-tokens 1,2 --max-new 3 --draft lookup
printf '%s\n' '{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":[1,2],"max_tokens":3}}' >"$T/nan.jsonl"
rm -f "$T/nan.out"
if "$ENG" batch --model "$T/m" --input "$T/nan.jsonl" --output "$T/nan.out" >/dev/null 2>"$T/err"; then
    bad nan-logits-batch "exit 0: $(cat "$T/err")"
else
    grep -q "job 'a' (line 1) failed: $NANMSG" "$T/err" && ok nan-logits-batch || bad nan-logits-batch "$(cat "$T/err")"
fi
"$ENG" logits --model "$T/m" --tokens 1,2 --out "$T/nan.f32" 2>/dev/null && ok nan-logits-written \
    || bad nan-logits-written "logits refused the NaN model"

# ---- the Kimi-Linear family (issue 23): a malformed schedule or KDA tensor names the field
# or the tensor, exit 2
KL=$MODELS/engine-kimi-linear; K3=$MODELS/engine-k3; A=model.layers.0.self_attn
kl_cfg() { local n=$1 pat=$2; shift 2; copy_of "$KL"; set_cfg "$T/m/config.json" "$@"
    expect_error "kl-$n" "$pat" "$ENG" inspect --model "$T/m"; }
kl_cfg schedule-range "/config.json: field 'linear_attn_config.full_attn_layers' entry 0 must be a layer number in 1..4" \
    'linear_attn_config.full_attn_layers=[9]'
kl_cfg schedule-twice "field 'linear_attn_config.full_attn_layers': layer 2 is listed twice" \
    'linear_attn_config.full_attn_layers=[2,4]'
kl_cfg schedule-gap "layer 4 is in neither kda_layers nor full_attn_layers" 'linear_attn_config.full_attn_layers=[]'
kl_cfg gate-form "tensor '$A.g_proj.weight' is missing from the checkpoint" 'linear_attn_config.use_full_rank_gate=true'
kl_cfg conv-kernel "tensor '$A.q_conv1d.weight' has shape \[64,1,4\] but config.json implies \[64,1,3\]" \
    'linear_attn_config.short_conv_kernel_size=3'
kl_cfg heads "tensor '$A.q_proj.weight' has shape \[64,96\] but config.json implies \[80,96\]" \
    'linear_attn_config.num_heads=5'
kl_cfg situ-beta "field 'activation_situ_beta' is missing" 'hidden_act="situ"'
kl_bad() { local n=$1 m=$2 pat=$3; shift 3; copy_of "$m"; st_edit "$T/m" "$@"
    expect_error "kl-$n" "$pat" "$ENG" inspect --model "$T/m"; }
kl_bad kda-shape "$KL" "/model.safetensors: tensor '$A.k_proj.weight' has shape \[48,96\] but config.json implies \[64,96\]" \
    shape=$A.k_proj.weight:48,96
kl_bad conv-shape "$KL" "tensor '$A.v_conv1d.weight' has shape \[64,1,2\] but config.json implies \[64,1,4\]" \
    shape=$A.v_conv1d.weight:64,1,2
kl_bad a-log "$KL" "tensor '$A.A_log' has shape \[3\] but config.json implies \[4\]" shape=$A.A_log:3
kl_bad k3-attn-res "$K3" "tensor 'language_model.model.layers.1.mlp_res_proj.weight' is missing" \
    drop=language_model.model.layers.1.mlp_res_proj.weight
kl_bad k3-latent "$K3" "tensor 'language_model.model.layers.2.block_sparse_moe.routed_expert_norm.weight' is missing" \
    drop=language_model.model.layers.2.block_sparse_moe.routed_expert_norm.weight
# the sizes of a full-size Kimi K3 from its config.json alone
out=$("$ENG" inspect --model tests/data/configs/Kimi-K3 --config-only --ram 128G --drive-bw 24 2>&1)
echo "$out" | grep -q "always-active         105.71 GiB (113.5 GB)" && echo "$out" | grep -q "one routed expert     16.73 MiB (17547264 B)" &&
    echo "$out" | grep -q "expert bytes/token    24.06 GiB (25.8 GB)" && echo "$out" | grep -q "expected              0.9" \
    && ok k3-config-only || bad k3-config-only "$out"
# every family's sizes from config.json alone equal the bytes of its checkpoint's
# tensors (inspect reading the safetensors): the always-active ones exactly, and
# one routed expert (INT4's weight_shape companions, 8 bytes a matrix, are
# counted by the plan only)
for m in engine-dense engine-moe engine-ds engine-ds-v2 engine-fp8-ds engine-kimi-wrap engine-int4-kimi engine-kimi-linear; do
    plan=$("$ENG" inspect --model "$MODELS/$m" --config-only 2>&1)
    full=$("$ENG" inspect --model "$MODELS/$m" 2>&1)
    pa=$(echo "$plan" | sed -n 's/^always-active .*(\([0-9]*\) B)$/\1/p')
    fa=$(echo "$full" | sed -n 's/^bytes: .*always-active [^(]*(\([0-9]*\)).*/\1/p')
    pe=$(echo "$plan" | sed -n 's/^routed experts .*(\([0-9]*\) B)$/\1/p')
    fe=$(echo "$full" | sed -n 's/^bytes: .*routed experts [^(]*(\([0-9]*\)).*/\1/p')
    # INT4: each matrix's weight_shape (I32 [2], 8 B) is in the plan's expert, not in inspect's expert bytes
    px=$(echo "$plan" | sed -n 's/^one routed expert .*(\([0-9]*\) B)$/\1/p')
    [ $m = engine-int4-kimi ] && [ -n "$px" ] && fe=$((fe + 3 * 8 * pe / px))
    if [ -n "$pa" ] && [ "$pa" = "$fa" ] && [ "${pe:-x}" = "${fe:-0}" ]; then ok "config-only-$m"
    else bad "config-only-$m" "plan $pa / $pe vs checkpoint $fa / $fe: $plan"; fi
done
# Qwen3-235B-A22B from its published config: 235.1e9 parameters, 22.1e9 active
# (BF16: 2 bytes each; 8 of 128 experts in each of 94 layers)
out=$("$ENG" inspect --model tests/data/configs/Qwen3-235B-A22B --config-only 2>&1)
a=$(echo "$out" | sed -n 's/^always-active .*(\([0-9.]*\) GB)$/\1/p')
x=$(echo "$out" | sed -n 's/^routed experts .*(\([0-9.]*\) GB)$/\1/p')
t=$(echo "$out" | sed -n 's/^expert bytes\/token .*(\([0-9.]*\) GB)$/\1/p')
$PY -c "import sys; a,x,t=map(float,sys.argv[1:]); sys.exit(not (abs((a+x)/2-235.1)<0.5 and abs((a+t)/2-22.2)<0.3))" \
    "${a:-0}" "${x:-0}" "${t:-0}" && ok config-only-qwen3-235b || bad config-only-qwen3-235b "$out"

# --stats' per-token split of the evaluation time: KDA time on the K3 model and none
# on Qwen3 or DeepSeek, attention, spine and experts on all three; with "other" the
# blocks add up to the evaluation time, in --events and in bench's summary
split_check() { # NAME MODEL WANT_KDA(1|0) [run options...]
    local n=$1 m=$2 kda=$3; shift 3
    if "$ENG" bench run --model "$m" --prompt-tokens 5,17,300,5,17,300,5,17 --max-new 6 --temp 0 --print-ids --stats \
            --events "$T/ev" "$@" >"$T/out" 2>"$T/err" &&
        grep -qE "^  per token, prefill \(eval [0-9.]+ ms\): KDA [0-9.]+ ms \([0-9.]+%\), attention .*, MoE spine .*, experts .*, waiting on reads .*, other " "$T/err" &&
        grep -qE "^  per token, decode \(eval [0-9.]+ ms\): KDA " "$T/err" &&
        "$ENG" bench --model "$m" --random-prompt 8 --max-new 4 "$@" >"$T/arm.json" 2>>"$T/err" &&
        $PY - "$T/ev" "$T/arm.json" "$kda" >"$T/why" 2>&1 <<'PYEOF'
import json, sys
kda = sys.argv[3] == "1"
ev = [json.loads(l) for l in open(sys.argv[1])]
summ = [e for e in ev if e["event"] == "summary"] + [json.loads(open(sys.argv[2]).read())]
pre = [e for e in ev if e["event"] == "prefill"]
assert len(summ) == 2 and len(pre) == 1, (len(summ), len(pre))
def check(d, p, total):
    parts = [d[p + k] for k in ("kda_s", "attn_s", "ffn_s", "experts_s", "other_s")]
    assert (d[p + "kda_s"] > 0) == kda, (p, "kda_s", d[p + "kda_s"])
    for k in ("attn_s", "ffn_s", "experts_s"):
        assert d[p + k] > 0, (p, k, d[p + k])
    wait = d["read_wait_s"] if p == "" else d.get(p + "read_wait_s", 0.0)
    assert abs(sum(parts) + wait - total) < 1e-5 + 1e-3 * total, (p, parts, wait, total)
for s in summ:
    check(s, "", s["eval_s"])
    check(s, "prefill_", s["prefill_eval_s"])
# the prefill event: the same phase as the summary's prefill_ fields
check(pre[0], "", summ[0]["prefill_eval_s"])
PYEOF
    then ok "stats-split-$n"; else bad "stats-split-$n" "$(tail -3 "$T/err") $(tail -2 "$T/why")"; fi
}
split_check k3 "$K3" 1
split_check kimi-linear "$KL" 1
split_check qwen3 "$MODELS/engine-moe" 0
split_check deepseek "$MODELS/engine-ds" 0
# streamed: the waits on reads are their own part, not the experts'
"$ENG" pack --model "$MODELS/engine-k3-stream" --out "$T/k3pack" >/dev/null 2>&1 || bad k3-pack "pack failed"
split_check k3-streamed "$MODELS/engine-k3-stream" 1 --experts "$T/k3pack" --expert-cache 20K

finish
