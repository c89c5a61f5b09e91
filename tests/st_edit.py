"""st_edit.py DIR OP... - rewrites tensors of a checkpoint directory in place,
for the command-line bad-input tests (tests/test_cli.sh): each shard that holds
an edited tensor is written again whole (tests/ref/safetensors_np.py), and the
index follows renames, drops and additions. Ops:
  shape=NAME:R,C        the tensor with another 2-D shape (its values repeated)
  set=NAME:I:HEX        element I (flat) holds the raw bits HEX (dtype-sized)
  vals=NAME:A,B,...     every element, as integers (weight_shape)
  drop=NAME             the tensor removed
  add=NAME:DTYPE:R,C    a tensor of zeros added (to the shard of the first tensor)
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import safetensors_np as stn  # noqa: E402


def load(d):
    """{file: (metadata, {name: (dtype, raw array)})} in data order."""
    ck = stn.Checkpoint(d)
    out = {}
    for fn, f in ck.files.items():
        names = sorted(f.keys(), key=lambda n: f.header[n]["data_offsets"][0])
        out[fn] = (f.metadata, {n: (f.info(n)[0], np.array(f.raw(n))) for n in names})
    ck.close()
    return out, ck.index


def main():
    d, ops = sys.argv[1], sys.argv[2:]
    files, index = load(d)
    where = {n: fn for fn, (_, ts) in files.items() for n in ts}
    touched = set()
    for op in ops:
        kind, arg = op.split("=", 1)
        name, _, rest = arg.partition(":")
        if kind == "add":
            dt, dims = rest.split(":")
            fn = sorted(files)[0]
            shape = [int(x) for x in dims.split(",")]
            files[fn][1][name] = (dt, np.zeros(shape, dtype=stn._STORAGE[dt]))
            where[name] = fn
            touched.add(fn)
            continue
        fn = where[name]
        touched.add(fn)
        ts = files[fn][1]
        dt, a = ts[name]
        if kind == "shape":
            shape = [int(x) for x in rest.split(",")]
            ts[name] = (dt, np.resize(a, shape))
        elif kind == "set":
            i, hx = rest.split(":")
            b = a.reshape(-1).copy()
            b.view(np.uint8)[int(i) * b.itemsize:(int(i) + 1) * b.itemsize] = \
                np.frombuffer(int(hx, 16).to_bytes(b.itemsize, "little"), dtype=np.uint8)
            ts[name] = (dt, b.reshape(a.shape))
        elif kind == "vals":
            ts[name] = (dt, np.array([int(x) for x in rest.split(",")], dtype=a.dtype).reshape(a.shape))
        elif kind == "drop":
            del ts[name]
            del where[name]
        else:
            sys.exit(f"st_edit: unknown op {kind}")
    for fn in touched:
        meta, ts = files[fn]
        specs = [(n, dt, a.shape) for n, (dt, a) in ts.items()]
        w = stn.SafeTensorsWriter(os.path.join(d, fn), specs, meta)
        for n, (dt, a) in ts.items():
            w.write_part(n, a, raw=True)
        w.close()
    if index is not None:
        index["weight_map"] = dict(sorted(where.items()))
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f)


if __name__ == "__main__":
    main()
