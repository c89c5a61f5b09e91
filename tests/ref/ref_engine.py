#!/usr/bin/python3
"""ref_engine - the float32 reference posing as the engine, for any family.

Owns: dispatching the engine's `logits` / `run` subcommands to the reference of
the checkpoint's model_type (qwen3_ref, deepseek_ref or kimi_linear_ref, whose engine modes
compute in float32), so check_model can run a suite that mixes families without
the C engine:

    check_model.py --suite --set formats --engine "/usr/bin/python3 tests/ref/ref_engine.py"
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_ref  # noqa: E402
import kimi_linear_ref  # noqa: E402
import qwen3_ref  # noqa: E402
import safetensors_np as st  # noqa: E402


def main(argv):
    if not argv or argv[0] not in ("logits", "run") or "--model" not in argv:
        print("usage: ref_engine.py logits|run --model DIR ...", file=sys.stderr)
        return 2
    model = argv[argv.index("--model") + 1]
    if kimi_linear_ref.is_family(model):
        ref = kimi_linear_ref
    else:
        ref = deepseek_ref if deepseek_ref.is_family(model) else qwen3_ref
    return ref.engine_mode(argv)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, KeyError, OSError, st.FormatError) as e:
        print(f"ref_engine: {e}", file=sys.stderr)
        sys.exit(2)
