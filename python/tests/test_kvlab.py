"""The kvlab Python module under pytest: decode through numpy, bit for bit against naive decode,
and kvlab.verify on caches written in Python (an exact block manager, a planted bug, caches that
raise or answer wrongly). Run by ctest with PYTHONPATH=build/python."""
import json
import os
import random
import subprocess
import sys
import zlib

import numpy as np
import pytest

import kvlab

EXAMPLES = os.path.join(os.environ.get("KVLAB_SOURCE_DIR", "."), "examples", "python")
sys.path.insert(0, EXAMPLES)
from block_manager import BlockManager  # noqa: E402
from block_manager_unchained import UnchainedBlockManager  # noqa: E402
from whole_sequences import WholeSequences  # noqa: E402


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def random_case(rng):
    n_kv_heads = rng.choice([1, 2])
    n_heads = n_kv_heads * rng.choice([1, 2])
    head_size = rng.choice([2, 4, 8, 16])
    config = dict(dim=n_heads * head_size, hidden_dim=rng.randint(1, 24), n_layers=rng.randint(1, 3),
                  n_heads=n_heads, n_kv_heads=n_kv_heads, vocab_size=rng.randint(2, 40), max_seq=rng.randint(2, 24))
    m = kvlab.random_model(**config, seed=rng.randint(0, 2**32))
    tokens = [rng.randrange(config["vocab_size"]) for _ in range(rng.randint(2, config["max_seq"]))]
    return m, config, tokens


@pytest.mark.parametrize("cache", ["contiguous-head", "contiguous-seq", "growing", "paged"])
def test_cached_decode_equals_naive_bit_for_bit(cache):
    rng = random.Random(zlib.crc32(cache.encode()))
    for _ in range(15):
        m, config, tokens = random_case(rng)
        settings = f"block_size={rng.randint(1, config['max_seq'])}" if cache == "paged" else ""
        d = kvlab.Decoder(m, cache, settings)
        prompt = rng.randint(1, len(tokens) - 1)
        got = d.prefill(tokens[:prompt])
        assert got.dtype == np.float32 and got.shape == (config["vocab_size"],)
        assert np.array_equal(bits(got), bits(kvlab.naive_logits(m, tokens[:prompt])))
        for t in range(prompt, len(tokens)):
            assert np.array_equal(bits(d.decode(tokens[t])), bits(kvlab.naive_logits(m, tokens[:t + 1])))
        assert d.length == len(tokens) and d.tokens == tokens


def test_a_different_prefix_is_seen():
    # The counter-test: the comparison above can fail. A decoder rolled back and continued with
    # another token no longer equals naive decode of the old sequence.
    m = kvlab.random_model(seed=5)
    d = kvlab.Decoder(m)
    d.prefill([1, 2, 3, 4])
    d.rollback(3)
    other = d.decode(5)
    assert np.array_equal(bits(other), bits(kvlab.naive_logits(m, [1, 2, 3, 5])))
    assert not np.array_equal(bits(other), bits(kvlab.naive_logits(m, [1, 2, 3, 4])))


def test_keys_values_and_attention_as_numpy():
    rng = random.Random(7)
    for _ in range(10):
        m, config, tokens = random_case(rng)
        contiguous, paged = kvlab.Decoder(m), kvlab.Decoder(m, "paged", "block_size=1")
        contiguous.prefill(tokens)
        paged.prefill(tokens)
        for layer in range(config["n_layers"]):
            k, v = contiguous.keys(layer), contiguous.values(layer)
            assert k.shape == v.shape == (config["n_kv_heads"], len(tokens), config["dim"] // config["n_heads"])
            assert np.isfinite(k).all() and np.isfinite(v).all()
            # Another layout holds the same rows, bit for bit.
            assert np.array_equal(bits(k), bits(paged.keys(layer)))
            assert np.array_equal(bits(v), bits(paged.values(layer)))
        w = contiguous.attention()
        assert w.shape == (config["n_layers"], config["n_heads"], len(tokens))
        assert (w >= 0).all() and np.allclose(w.sum(axis=-1), 1.0, atol=1e-5)
        contiguous.rollback(1)
        assert contiguous.keys(0).shape[1] == 1


def test_bad_input_is_one_error():
    m = kvlab.random_model(seed=1, vocab_size=8)
    with pytest.raises(kvlab.Error, match="outside the vocabulary"):
        kvlab.Decoder(m).prefill([1, 8])
    with pytest.raises(kvlab.Error, match="at least one token"):
        kvlab.naive_logits(m, [])
    with pytest.raises(kvlab.Error, match="unknown cache variant"):
        kvlab.Decoder(m, "no-such-cache")
    with pytest.raises(kvlab.Error):
        kvlab.load("/no/such/checkpoint.bin")
    with pytest.raises(kvlab.Error):
        kvlab.random_model(dim=6, n_heads=4)
    with pytest.raises(kvlab.Error, match="no step"):
        kvlab.Decoder(m).attention()


def test_stories260k_decodes_bit_for_bit():
    models = os.environ.get("KVLAB_MODELS_DIR", "")
    path, tok = os.path.join(models, "stories260K.bin"), os.path.join(models, "tok512.bin")
    if not (os.path.exists(path) and os.path.exists(tok)):
        pytest.skip("stories260K.bin or tok512.bin not found")
    m = kvlab.load(path, tok)
    assert m.config["dim"] == 64 and m.config["vocab_size"] == 512
    tokens = m.encode("Once upon a time")
    d = kvlab.Decoder(m)
    logits = d.prefill(tokens)
    for _ in range(12):
        assert np.array_equal(bits(logits), bits(kvlab.naive_logits(m, tokens)))
        tokens.append(int(np.argmax(logits)))
        logits = d.decode(tokens[-1])


def test_the_module_names_the_kvlab_it_was_built_with():
    # kvlab.__version__ and kvlab.build_info() say what `kvlab --version` says (core/build_info.h).
    info = kvlab.build_info()
    assert info["version"] == kvlab.__version__ and kvlab.__version__.count(".") == 2
    line = subprocess.run([kvlab._binary(), "--version"], capture_output=True, text=True, check=True).stdout
    assert line.startswith(f"kvlab {kvlab.__version__} (commit {info['commit'] or 'unknown'}")
    assert info["compiler"] in line and info["build_type"] in line


def test_verify_passes_the_block_manager():
    r = kvlab.verify(BlockManager)
    assert r, r.counterexample
    assert r.cases == 100 and r.name == "plugin BlockManager"
    assert "prefix reuse" in r.parameters and "forks" in r.parameters


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_verify_catches_the_unchained_hash(seed):
    r = kvlab.verify(UnchainedBlockManager, seed=seed)
    assert not r
    assert "attach_prefix(n=" in r.counterexample


def test_verify_checks_a_manager_that_frees_only_whole_sequences_with_no_rollback_code():
    # nano-vllm's limits, declared: no release, no fork, block size 16. Nothing it lacks is drawn;
    # preemption and recompute stand in for rollback, and the report says what was left out.
    r = kvlab.verify(WholeSequences, seed=2)
    assert r, r.counterexample
    assert "block sizes 16 (the plugin's)" in r.parameters and "preemption and recompute" in r.parameters
    assert "left out: forks (no fork), rollbacks and speculative decoding (release is NULL" in r.parameters
    assert int(r.figures.split("; ")[-1].split(" preemptions")[0]) > 0, r.figures


class DedupBlockManager(BlockManager):
    """Deduplicates as SGLang's radix cache does: a block that fills with the same tokens after the
    same prefix as a published block moves onto it at step_done, and its own block is freed."""

    def _duplicate(self, h, token_ids, own):
        block_id = self.hash_to_block_id.get(h)
        same = block_id is not None and block_id != own and self.blocks[block_id].token_ids == token_ids
        return block_id if same else None

    def step_done(self, seq):
        bs, moves = self.block_size, []
        for b in range(seq.full, len(seq.token_ids) // bs):
            own = seq.block_table[b]
            prefix = self.blocks[seq.block_table[b - 1]].hash if b > 0 else None
            token_ids = seq.token_ids[b * bs:(b + 1) * bs]
            same = self._duplicate(self.block_hash(prefix, token_ids), token_ids, own)
            if same is None:
                if self.blocks[own].hash is None:
                    self._publish(seq, b)
                continue
            if self.blocks[same].ref_count == 0:
                self.free_block_ids.remove(same)
            self.blocks[same].ref_count += 1
            self._let_go(own)
            seq.block_table[b] = same
            moves.append((b * bs, bs, same * bs))
        seq.full = len(seq.token_ids) // bs
        return moves


class TokensOnlyDedup(DedupBlockManager):
    def _duplicate(self, h, token_ids, own):  # the planted bug: the same tokens after any prefix
        for block in self.blocks:
            if block.hash is not None and block.block_id != own and block.token_ids == token_ids:
                return block.block_id
        return None


@pytest.mark.parametrize("seed", [1, 2])
def test_verify_accepts_deduplicating_moves_onto_identical_rows_and_catches_others(seed):
    r = kvlab.verify(DedupBlockManager, seed=seed)
    assert r, r.counterexample
    assert int(r.figures.split(" preemptions, ")[1].split(" positions moved")[0]) > 0, r.figures
    bad = kvlab.verify(TokensOnlyDedup, seed=seed)
    assert not bad and "step_done() moved positions" in bad.counterexample, bad.counterexample


def test_a_failing_case_s_log_replays_to_its_verdict_and_a_fixed_cache_passes_it():
    bad = kvlab.verify(TokensOnlyDedup, seed=3)
    assert not bad and bad.log.count("\n") >= 3 and '"verdict"' in bad.log.splitlines()[-1]
    assert json.loads(bad.log.splitlines()[0])["kvlab_replay"] == 1
    again = kvlab.replay(bad.log, TokensOnlyDedup)
    assert not again and again.same and "step_done() moved positions" in again.verdict, again.report
    assert again.verdict in bad.counterexample and not again.divergence
    fixed = kvlab.replay(bad.log, DedupBlockManager)
    assert fixed and not fixed.same and '"call":"step_done"' in fixed.divergence, fixed.report
    leaky = kvlab.verify(LeakyRollback, seed=3)
    assert not leaky and kvlab.replay(leaky.log, LeakyRollback).same
    assert kvlab.verify(FreeList, cases=5).log == ""
    with pytest.raises(kvlab.Error, match="not a JSON object"):
        kvlab.replay("hello\n", FreeList)


class FreeList:
    """One slot a position, freed slots reused first: exact (no fork, no prefix reuse)."""

    def __init__(self, config):
        self.free = list(range(config.n_slots))

    def create(self):
        return []

    def reserve(self, seq, length, tokens):
        if len(tokens) > len(self.free):
            raise MemoryError("full")
        seq.extend(self.free.pop() for _ in tokens)

    def slot(self, seq, pos):
        return seq[pos]

    def release(self, seq, n):
        self.free.extend(seq[n:])
        del seq[n:]

    def destroy(self, seq):  # without it a finished sequence's slots leak: kvlab sees refusals with room
        self.release(seq, 0)


class LeakyRollback(FreeList):
    def release(self, seq, n):  # frees one slot too many: a held position's slot is given again
        self.free.extend(seq[max(n - 1, 0):])
        del seq[n:]


class RaisingSlot(FreeList):
    def slot(self, seq, pos):
        if pos >= 1:
            raise KeyError(pos)
        return seq[pos]


class NoPool(FreeList):
    def __init__(self, config):
        raise RuntimeError("no pool today")


class NoDestroy(FreeList):
    destroy = None  # a finished sequence's slots are never freed


class CrashesWhenFull(FreeList):
    def reserve(self, seq, length, tokens):  # no room check: pop() from an empty list raises IndexError
        seq.extend(self.free.pop() for _ in tokens)


class RefusesWithRoom(FreeList):
    def __init__(self, config):
        super().__init__(config)
        self.n_slots = config.n_slots

    def reserve(self, seq, length, tokens):  # refuses to fill more than half the pool, though it has room
        if len(self.free) - len(tokens) < self.n_slots // 2:
            raise kvlab.Refused("half full")
        super().reserve(seq, length, tokens)


def test_verify_a_plain_free_list_and_its_leaky_copy():
    assert kvlab.verify(FreeList, cases=50)
    leaky = kvlab.verify(LeakyRollback)
    assert not leaky and "which is still held" in leaky.counterexample


def test_verify_names_what_a_python_cache_raised():
    r = kvlab.verify(RaisingSlot)
    assert not r and "slot(pos=1) raised KeyError: 1" in r.counterexample
    r = kvlab.verify(NoPool, cases=5)
    assert not r and "create_pool() raised RuntimeError: no pool today" in r.counterexample


def test_verify_tells_a_crash_in_reserve_from_a_refusal_and_fills_pools():
    # A refusal (kvlab.Refused or MemoryError) is accepted only when the pool is full; any other
    # exception is a crash in its call, even on a full pool. The plain free list refuses only when
    # full, and the run fills pools to a refusal and reaches position 257.
    ok = kvlab.verify(FreeList, cases=30, seed=3)
    assert ok and " to a refusal" in ok.figures and int(ok.figures.split("largest T ")[1].split(",")[0]) >= 98
    crash = kvlab.verify(CrashesWhenFull, seed=3)
    assert not crash and "raised IndexError" in crash.counterexample and "reserve(length=" in crash.counterexample
    assert crash.counterexample_T > 0 and crash.counterexample_sequences > 0
    early = kvlab.verify(RefusesWithRoom, seed=3)
    assert not early and "refused: Refused: half full, but" in early.counterexample
    leak = kvlab.verify(NoDestroy, seed=3)
    assert not leak and "refused: MemoryError: full, but" in leak.counterexample


def test_verify_takes_the_cli_s_options_and_refuses_a_bad_one_in_one_line():
    assert kvlab.verify(FreeList, cases=10, seed=4, kv_format="fp8-e4m3", device="gpu-host", attention="tiled", tile=3)
    leaky = kvlab.verify(LeakyRollback, seed=4, kv_format="int4")  # the failing case names its format
    assert not leaky and " in int4, " in leaky.counterexample, leaky.counterexample
    for bad, needle in ((dict(profile="deep"), "unknown profile 'deep'"), (dict(tile=0), "tile"),
                        (dict(attention="sparse"), "sparse")):
        with pytest.raises(kvlab.Error, match=needle):
            kvlab.verify(FreeList, cases=1, **bad)


def test_verify_takes_block_sizes_max_sequences_and_a_time_limit():
    r = kvlab.verify(BlockManager, cases=20, block_sizes=[3, 5], max_sequences=2)
    assert r and "1-2 sequences (--max-sequences), block sizes 3, 5 (--block-sizes)" in r.parameters, r.parameters
    with pytest.raises(kvlab.Error, match="accepts none of them"):
        kvlab.verify(WholeSequences, block_sizes=[8])
    timed = kvlab.verify(FreeList, cases=100000, time_limit=0.001)
    assert timed and "ended the run after 10 of 100000 cases" in timed.figures, timed.figures


def test_verify_long_profile_reaches_thousands_of_positions():
    # One round trip a sequence a step ("slots"), so a Python cache meets the long profile's sizes.
    r = kvlab.verify(FreeList, cases=3, seed=2, profile="long")
    assert r and "position 8191" in r.parameters
    assert int(r.figures.split("largest T ")[1].split(",")[0]) > 1024, r.figures
    with pytest.raises(kvlab.Error, match="no method reserve"):
        kvlab.verify(type("Nothing", (), {"create": lambda self: None}))


@pytest.mark.parametrize("answers,needle", [
    ("", "closed the pipe instead of answering hello"),
    ("not json\n", "not a JSON object"),
    ('{"name": "x", "methods": []}\n{"pool": "one"}\n', 'no integer "pool"'),
    ('{"name": "x", "methods": []}\n{"pool": 1}\n{"seq": 1}\n{"copies": [[0, 1]]}\n', "not [from, to, count]"),
])
def test_plugin_stdio_ends_a_broken_conversation_in_one_line(answers, needle):
    # A server that breaks the protocol is an error of the run, not a verdict on a cache.
    p = subprocess.run([os.environ.get("KVLAB_BINARY", "kvlab"), "verify", "--plugin-stdio", "--cases", "3"],
                       input=answers, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert p.stderr.startswith("kvlab: error: ") and p.stderr.count("\n") == 1 and needle in p.stderr, p.stderr
    assert '"op": "result"' not in p.stdout and '"op":"result"' not in p.stdout


def kvlab_cli(*args):
    p = subprocess.run([os.environ.get("KVLAB_BINARY", "kvlab"), *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


SHAPE = dict(dim=16, hidden_dim=24, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=40, max_seq=16)
SHAPE_TEXT = ",".join(f"{k}={v}" for k, v in SHAPE.items())


def test_a_trace_is_numpy_arrays_equal_to_the_module_s_decode(tmp_path):
    kvlab_cli("trace", "--shape", SHAPE_TEXT, "--model-seed", 9, "--tokens", "1,5,7,2", "--steps", 5,
              "--attention-weights", "--out", tmp_path / "t")
    manifest = json.load(open(tmp_path / "t" / "manifest.json"))
    arrays = {name: np.load(tmp_path / "t" / entry["file"]) for name, entry in manifest["arrays"].items()}
    assert arrays["k"].shape == (2, 2, 9, 4) and arrays["logits"].shape == (6, 40)
    d = kvlab.Decoder(kvlab.random_model(**SHAPE, seed=9))
    tokens = [int(t) for t in arrays["tokens"]]
    assert tokens[:4] == [1, 5, 7, 2]
    assert np.array_equal(bits(d.prefill(tokens[:4])), bits(arrays["logits"][0]))
    for i, t in enumerate(tokens[4:]):
        assert t == int(np.argmax(arrays["logits"][i]))  # greedy
        got = d.decode(t)
        assert np.array_equal(bits(got), bits(arrays["logits"][i + 1]))
        assert np.array_equal(bits(d.attention()), bits(arrays["attention"][i + 1][..., :d.length]))
    for layer in range(2):
        assert np.array_equal(bits(d.keys(layer)), bits(arrays["k"][layer]))
        assert np.array_equal(bits(d.values(layer)), bits(arrays["v"][layer]))


def test_the_numpy_example_recomputes_step_0_and_sees_another_model(tmp_path):
    example = os.path.join(EXAMPLES, "trace_numpy.py")
    kvlab_cli("export", "--shape", SHAPE_TEXT, "--seed", 4, tmp_path / "m.bin")
    kvlab_cli("export", "--shape", SHAPE_TEXT, "--seed", 5, tmp_path / "other.bin")
    kvlab_cli("trace", "--model", tmp_path / "m.bin", "--tokens", "3,1,4,1,5,9,2,6", "--steps", 3, "--out", tmp_path / "t")
    ok = subprocess.run([sys.executable, example, tmp_path / "t", tmp_path / "m.bin"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "logits[0]" in ok.stdout
    # The counter-test: the same trace against another model's weights is far outside the tolerance.
    bad = subprocess.run([sys.executable, example, tmp_path / "t", tmp_path / "other.bin"], capture_output=True,
                         text=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
