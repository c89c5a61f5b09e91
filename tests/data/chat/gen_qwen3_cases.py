#!/usr/bin/env python3
"""Regenerates qwen3_template_cases.json: random conversations rendered by the real
Jinja chat_template of Qwen3 (assets/tokenizers/qwen3/tokenizer_config.json) the way
transformers' apply_chat_template does (sandboxed jinja2, trim_blocks, lstrip_blocks).
Needs jinja2, which the project does not depend on: the JSON it writes is committed
and tests/test_chat.c only reads it. Run from the repository root."""
import json
import random

from jinja2.sandbox import ImmutableSandboxedEnvironment

cfg = json.load(open("assets/tokenizers/qwen3/tokenizer_config.json"))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols"])
tpl = env.from_string(cfg["chat_template"])
pieces = ["<think>", "</think>", "\n", "\n\n", "abc", " x ", "<tool_response>",
          "</tool_response>", "\u00e9", ""]
rng = random.Random(20240607)
cases = []
for _ in range(200):
    msgs = []
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(["system", "user", "assistant", "tool", "user", "assistant"])
        content = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        msgs.append({"role": role, "content": content})
    gen, think = rng.random() < 0.5, rng.random() < 0.5
    want = tpl.render(messages=msgs, add_generation_prompt=gen, enable_thinking=think)
    cases.append({"messages": msgs, "add_generation_prompt": gen,
                  "enable_thinking": think, "expected": want})
with open("tests/data/chat/qwen3_template_cases.json", "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases) + "\n]\n")
print(len(cases), "cases")
