# Owns the in-memory cache a Python rank builds from the entries it loads, in the shape of
# TensorRT-LLM's autotuner sections (key text -> (runner_id, tactic, min_time in ms)): shared
# entries, and this rank's own. One definition for the rank (tunecache_rank.py) and the parse
# floor (parse_floor.py), which the harness runs with this file prepended (`python -c`).
import json


def build_view(entries, rank):
    """Returns (shared, own) built from `entries` (tunecache.v1.Entry), skipping other ranks'."""
    shared, own = {}, {}
    for entry in entries:
        if entry.key.HasField("rank"):
            if entry.key.rank != rank:
                continue
            section = own
        else:
            section = shared
        config = json.loads(entry.result.config)
        section[entry.key.problem] = (config["runner_id"], config["tactic"], entry.result.time_us / 1000.0)
    return shared, own
