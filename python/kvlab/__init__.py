"""kvlab from Python: naive and cached decode side by side, bit for bit, and an exactness check
for a KV cache written in Python.

    import kvlab
    m = kvlab.random_model(seed=1)            # or kvlab.load("stories260K.bin", "tok512.bin")
    d = kvlab.Decoder(m)                      # cached decode on a contiguous cache
    assert (d.prefill([1, 2, 3]) == kvlab.naive_logits(m, [1, 2, 3])).all()
    d.keys(0), d.values(0), d.attention()     # numpy arrays

    assert kvlab.verify(MyCache)              # a cache class, checked as kvlab checks a C plugin

kvlab.verify starts `kvlab verify --plugin-stdio` and answers its calls (docs/plugin-protocol.md)
with the methods of the class given: the same property, shrinking and per-answer checks as
`kvlab verify --plugin` on a shared library (include/kvlab/cache_plugin.h).
"""

import json
import os
import subprocess
import tempfile
import types

from ._kvlab import Decoder, Error, Model, __version__, build_info, load, naive_logits, random_model

__all__ = ["Decoder", "Error", "Model", "Refused", "ReplayResult", "VerifyResult", "build_info", "load", "naive_logits",
           "random_model", "replay", "verify"]

_REQUIRED = ("create", "reserve", "slot")
_REFUSABLE = ("create_pool", "create", "fork", "reserve")


class Refused(Exception):
    """Raised by a cache's create, fork or reserve (or its pool's constructor) to refuse: no room.
    kvlab accepts a refusal of reserve only when the pool is full by its own books; any other
    exception, in any method, is a crash in that call and fails the case, naming it."""
_OPTIONAL = ("fork", "attach_prefix", "attended", "release", "step_done")


def _binary():
    """The kvlab program: $KVLAB_BINARY, else the one of the build this package came from."""
    if os.environ.get("KVLAB_BINARY"):
        return os.environ["KVLAB_BINARY"]
    try:
        from ._paths import KVLAB_BINARY
    except ImportError:
        return "kvlab"
    return KVLAB_BINARY


class VerifyResult:
    """What kvlab.verify found: true when the cache passed every case."""

    def __init__(self, row):
        self.name = row["variant"]
        self.ok = bool(row["ok"])
        self.cases = row["cases"]
        self.result = row["result"]
        self.parameters = row["parameters"]
        self.counterexample = row["counterexample"]
        # The counterexample's sizes (0 when it passed): its longest sequence, the largest pool
        # fill in percent, the most sequences at once; figures: the sizes the run reached.
        self.counterexample_T = row.get("counterexample_T", 0)
        self.counterexample_fill = row.get("counterexample_fill", 0)
        self.counterexample_sequences = row.get("counterexample_sequences", 0)
        self.figures = row.get("figures", "")
        # The failing case's calls as a replayable log (JSON lines; "" when it passed): paste it
        # into a bug report, or run it again with kvlab.replay(log, cache).
        self.log = row.get("replay_log", "")

    def __bool__(self):
        return self.ok

    def __repr__(self):
        if self.ok:
            return f"<{self.name}: {self.result} in {self.cases} cases>"
        return f"<{self.name}: {self.result} after {self.cases} cases: {self.counterexample}>"


class ReplayResult:
    """What kvlab.replay found: true when every call of the log passed kvlab's checks."""

    def __init__(self, r):
        self.calls = r["calls"]
        self.verdict = r["verdict"]  # kvlab's check that failed ("" when none did)
        self.logged_verdict = r["logged"]
        self.same = bool(r["same"])  # the log's verdict again
        self.divergence = r["divergence"]  # the first answer that differs from the log's
        self.report = r["report"]

    def __bool__(self):
        return not self.verdict

    def __repr__(self):
        return f"<replay: {self.report}>"


def _serve(cmd, cache):
    """Runs kvlab's cmd, answering its calls with the cache class's methods, until its result."""
    server = _Server(cache)
    result = None
    with tempfile.TemporaryFile(mode="w+") as errors:
        with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True) as p:
            try:
                for line in p.stdout:
                    msg = json.loads(line)
                    if msg.get("op") == "result":
                        result = msg
                        break
                    p.stdin.write(json.dumps(server.answer(msg)) + "\n")
                    p.stdin.flush()
            except BrokenPipeError:
                pass
            finally:
                p.stdin.close()
        errors.seek(0)
        stderr = errors.read().strip()
    if result is None:
        raise Error(f"kvlab {cmd[1]} --plugin-stdio ended with status {p.returncode} and no result: "
                    f"{stderr or '(nothing on stderr)'}")
    return result


def _check_methods(cache):
    for name in _REQUIRED:
        if not callable(getattr(cache, name, None)):
            raise Error(f"kvlab: {getattr(cache, '__name__', cache)!r} has no method {name}() "
                        f"({', '.join(_REQUIRED)} are required)")


def replay(log, cache):
    """Runs a failing case's calls again (VerifyResult.log, or a file `kvlab verify --plugin`
    wrote) against a cache class alone, through kvlab's same checks, as `kvlab replay` does for a
    C plugin. Returns a ReplayResult: true when every call passes, else its verdict and whether
    it is the log's; the first answer that differs from the log's is named."""
    _check_methods(cache)
    if not isinstance(log, str):
        raise Error("kvlab.replay: the log is the text of a replay log (VerifyResult.log)")
    with tempfile.NamedTemporaryFile(mode="w", suffix=".jsonl") as f:
        f.write(log)
        f.flush()
        return ReplayResult(_serve([_binary(), "replay", f.name, "--plugin-stdio"], cache)["replay"])


class _Server:
    """Answers kvlab's calls with the cache class's methods. Pools and sequences are numbered
    here; the class sees its own objects only: cls(config) is a pool, create() and fork(seq)
    return sequence handles that the other methods take."""

    def __init__(self, cls):
        self.cls = cls
        self.pools = {}  # id -> the class's object
        self.seqs = {}  # id -> (pool, handle)
        self.next_id = 0

    def _new(self, table, value):
        self.next_id += 1
        table[self.next_id] = value
        return self.next_id

    def answer(self, msg):
        op = msg.get("op")
        try:
            return self._answer(op, msg)
        except Exception as e:  # the class's own: a refusal (Refused, MemoryError), else a crash in the call
            text = f"{type(e).__name__}: {e}".replace("\n", " ")
            refusal = isinstance(e, (Refused, MemoryError)) and op in _REFUSABLE
            return {"refused": text} if refusal else {"error": text}

    def _answer(self, op, msg):
        if op == "hello":  # "slots": every held position's slot in one answer, from slot() each
            methods = [m for m in _OPTIONAL if callable(getattr(self.cls, m, None))] + ["slots"]
            block_sizes = getattr(self.cls, "block_sizes", None)
            return {"name": self.cls.__name__, "abi": 3, "methods": methods,
                    "block_sizes": None if block_sizes is None else [int(b) for b in block_sizes],
                    "max_sequences": int(getattr(self.cls, "max_sequences", 0) or 0)}
        if op == "create_pool":
            return {"pool": self._new(self.pools, self.cls(types.SimpleNamespace(**msg["config"])))}
        if op == "destroy_pool":
            self.pools.pop(msg["pool"], None)
            return {}
        if op == "memory":
            pool = self.pools[msg["pool"]]
            return {"bytes": int(pool.memory()) if callable(getattr(pool, "memory", None)) else 0}
        if op == "create":
            pool = self.pools[msg["pool"]]
            return {"seq": self._new(self.seqs, (pool, pool.create()))}
        pool, handle = self.seqs[msg["seq"]]
        if op == "fork":
            return {"seq": self._new(self.seqs, (pool, pool.fork(handle)))}
        if op == "reserve":
            copies = pool.reserve(handle, msg["length"], msg["tokens"]) or []
            return {"copies": [[int(f), int(t), int(n)] for f, t, n in copies]}
        if op == "slot":
            return {"slot": int(pool.slot(handle, msg["pos"]))}
        if op == "slots":
            slots = []
            for pos in range(msg["n"]):
                try:
                    slots.append(int(pool.slot(handle, pos)))
                except Exception as e:  # named as slot(pos=...) by kvlab
                    return {"error": f"{type(e).__name__}: {e}".replace("\n", " "), "pos": pos}
            return {"slots": slots}
        if op == "attach_prefix":
            return {"n": int(pool.attach_prefix(handle, msg["tokens"]))}
        if op == "attended":
            return {"positions": [int(p) for p in pool.attended(handle, msg["pos"])]}
        if op == "release":
            pool.release(handle, msg["n"])
            return {}
        if op == "step_done":
            moves = pool.step_done(handle) or []
            return {"moves": [[int(p), int(n), int(s)] for p, n, s in moves]}
        if op == "destroy":
            self.seqs.pop(msg["seq"])
            if callable(getattr(pool, "destroy", None)):
                pool.destroy(handle)
            return {}
        raise ValueError(f"unknown op {op!r}")


def verify(cache, cases=100, seed=1, kv_format="", profile="fast", device="", attention="", tile=None,
           block_sizes=None, max_sequences=None, time_limit=None):
    """Checks a cache class written in Python for exactness, as `kvlab verify --plugin` checks a
    C plugin: drawn engine operations (requests sharing or editing prompts, forks, batched
    steps, rollbacks, speculative decoding), every logit against naive decode bit for bit, every
    answer checked, a failing case shrunk.

    cache(config) is a pool (config: max_seq, n_slots, n_layers, n_kv_heads, head_size,
    max_sequences, block_size). Its methods, as include/kvlab/cache_plugin.h's table:
      create() -> seq                         a new empty sequence (any object)
      reserve(seq, length, tokens) -> copies  room for positions length.., len(tokens) of them;
                                              None or [(from, to, count), ...] slot copies kvlab
                                              makes first (copy-on-write); raise kvlab.Refused
                                              (or MemoryError) to refuse when the pool is full
      slot(seq, pos) -> int                   the slot of a held position
      release(seq, n)                         optional: forget positions n and later (without
                                              it sequences are freed only whole, by destroy:
                                              kvlab preempts instead of rolling back)
      fork(seq) -> seq                        optional: a child sharing every position's slot
      attach_prefix(seq, tokens) -> int       optional: positions of tokens already held (reuse)
      attended(seq, pos) -> [positions]       optional: what a query at pos reads (exact: 0..pos)
      step_done(seq) -> moves                 optional: the latest reserve's rows are written
                                              (publish prefix blocks here); None or
                                              [(pos, count, slot), ...]: positions moved onto
                                              slots holding identical rows (deduplication)
      destroy(seq), memory() -> int           optional
    and may declare, as class attributes, block_sizes (the block sizes a pool accepts; kvlab
    draws config.block_size from them) and max_sequences (the most a pool holds at once).
    The options are `kvlab verify`'s: kv_format (K and V stored in it, naive decode too; "": drawn
    per case), profile ("fast" reaches positions 97 and 257, "long" 4097 and 8191 with 8-64
    sequences; pools are filled until reserve refuses, accepted only when the pool is full),
    device ("cpu", "gpu-host", "gpu" or two joined by a comma), attention ("simple" or "tiled")
    and tile (keys per tile), block_sizes (a list: the block sizes pools are drawn from, of those
    the class accepts), max_sequences (the most a pool holds) and time_limit (seconds after which
    no new case starts). A value kvlab refuses raises kvlab.Error with its one line.
    Any other exception a method raises is a crash in that call: the case fails, naming it.
    Returns a VerifyResult (true when every case passed; its counterexample otherwise, and its
    calls as a replayable log, .log, for kvlab.replay).
    """
    _check_methods(cache)
    cmd = [_binary(), "verify", "--plugin-stdio", "--cases", str(int(cases)), "--seed", str(int(seed)),
           "--profile", str(profile)]
    for flag, value in (("--kv-format", kv_format), ("--device", device), ("--attention", attention)):
        if value:
            cmd += [flag, str(value)]
    if tile is not None:
        cmd += ["--tile", str(int(tile))]
    if block_sizes is not None:
        cmd += ["--block-sizes", ",".join(str(int(b)) for b in block_sizes)]
    if max_sequences is not None:
        cmd += ["--max-sequences", str(int(max_sequences))]
    if time_limit is not None:
        cmd += ["--time-limit", repr(float(time_limit))]
    return VerifyResult(_serve(cmd, cache)["row"])
