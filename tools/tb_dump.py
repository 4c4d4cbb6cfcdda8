#!/usr/bin/env python3
"""tb_dump.py: reads TensorBoard event files with the `tensorboard` package and prints them as JSON (for the specs).

Run: build/py-refs/bin/python tools/tb_dump.py EVENT_FILE ...   (tools/py_refs.sh installs tensorboard there)
Prints {"files": [{"file_version": "...", "scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text]]},
"records": N, "truncated": bool}]}. Every record's CRCs are checked by tensorboard's reader: a bad one raises
DataLossError (exit 1); a truncated last record ends the file, as TensorBoard's loader treats it.
"""
import json
import math
import sys

from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow


def read(path):
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    out = {"file_version": None, "scalars": {}, "texts": {}, "records": 0, "truncated": False}
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return out
        except errors.DataLossError as e:
            if "truncated record" not in str(e):
                raise
            out["truncated"] = True
            return out
        ev = event_pb2.Event.FromString(reader.record())
        out["records"] += 1
        if out["records"] == 1:
            out["file_version"] = ev.file_version
        for v in ev.summary.value:
            if v.HasField("simple_value"):
                x = v.simple_value
                out["scalars"].setdefault(v.tag, []).append([ev.step, None if math.isnan(x) else x])
            elif v.metadata.plugin_data.plugin_name == "text":
                text = v.tensor.string_val[0].decode("utf-8")
                out["texts"].setdefault(v.tag, []).append([ev.step, text])


print(json.dumps({"files": [read(p) for p in sys.argv[1:]]}))
