"""Cases of a test world (tests/world.py) run one after another in one launch of their own,
for the launchers a test world cannot stand in for (``horovodrun``, ``horovodrun --gloo``):
``launch_cases.py CASES.json OUT.json``, CASES.json a list of ``[case, kwargs]``; rank 0
writes the list of its return values to OUT.json."""
import importlib
import json
import sys

from hetgrad.runtime import fail_fast

with fail_fast():
    results = []
    for case, kwargs in json.loads(open(sys.argv[1]).read()):
        module, _, function = case.partition(":")
        results.append(getattr(importlib.import_module(module), function)(**kwargs))
    import horovod.tensorflow as hvd
    if hvd.rank() == 0:
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)
