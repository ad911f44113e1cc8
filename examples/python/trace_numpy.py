"""Recompute a kvlab trace's step 0 in plain numpy: how another engine compares with kvlab.

    build/kvlab trace --model ../shared/models/stories260K.bin --prompt "Once upon a time" --out /tmp/trace
    python3 examples/python/trace_numpy.py /tmp/trace ../shared/models/stories260K.bin

reads the trace's arrays with numpy.load (torch.from_numpy(numpy.load(...)) gives PyTorch the
same tensors), reads the llama2.c checkpoint's weights, runs the prompt through the model in
float64 and compares the logits of its last position with the trace's logits[0], and every
position's K and V with k.npy and v.npy. numpy adds in another order than kvlab's kernels
(core/NUMERICS.md), so the comparison is within a tolerance, not bit for bit: the largest
difference relative to the largest magnitude must stay under 1e-4. An engine that follows
kvlab's kernel order instead matches it bit for bit (kvlab golden, docs/traces.md).
"""
import json
import os
import sys

import numpy as np

TOLERANCE = 1e-4


def load_checkpoint(path):
    """llama2.c's checkpoint: seven int32 (a negative vocab_size: a separate classifier), then float32 tensors."""
    raw = np.fromfile(path, dtype=np.uint8)
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, max_seq = np.frombuffer(raw[:28], dtype=np.int32)
    shared = vocab > 0
    vocab = abs(vocab)
    floats = np.frombuffer(raw[28:], dtype=np.float32)
    head_size, at = dim // n_heads, 0
    kv_dim = n_kv_heads * head_size

    def take(*shape):
        nonlocal at
        n = int(np.prod(shape))
        t = floats[at:at + n].reshape(shape).astype(np.float64)
        at += n
        return t

    w = dict(embed=take(vocab, dim), rms_att=take(n_layers, dim), wq=take(n_layers, dim, dim),
             wk=take(n_layers, kv_dim, dim), wv=take(n_layers, kv_dim, dim), wo=take(n_layers, dim, dim),
             rms_ffn=take(n_layers, dim), w1=take(n_layers, hidden, dim), w2=take(n_layers, dim, hidden),
             w3=take(n_layers, hidden, dim), rms_final=take(dim))
    take(max_seq, head_size // 2)  # the stored RoPE tables (computed below instead, as llama2.c does)
    take(max_seq, head_size // 2)
    w["cls"] = w["embed"] if shared else take(vocab, dim)
    return w, dict(dim=int(dim), n_layers=int(n_layers), n_heads=int(n_heads), n_kv_heads=int(n_kv_heads),
                   head_size=int(head_size))


def rmsnorm(x, weight):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * weight


def rope(x, head_size):
    """Rotates each pair (x[2j], x[2j+1]) of every head by position * 10000^(-2j / head_size)."""
    T, width = x.shape
    i = np.arange(0, width, 2)
    freq = 1.0 / 10000.0 ** ((i % head_size) / head_size)
    angle = np.arange(T)[:, None] * freq[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    out = x.copy()
    out[:, 0::2] = x[:, 0::2] * cos - x[:, 1::2] * sin
    out[:, 1::2] = x[:, 0::2] * sin + x[:, 1::2] * cos
    return out


def forward(w, c, tokens):
    """Every position's K and V per layer, and the last position's logits."""
    hs, n_heads, n_kv = c["head_size"], c["n_heads"], c["n_kv_heads"]
    T = len(tokens)
    x = w["embed"][tokens]
    ks, vs = [], []
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(c["n_layers"]):
        h = rmsnorm(x, w["rms_att"][l])
        q, k, v = rope(h @ w["wq"][l].T, hs), rope(h @ w["wk"][l].T, hs), h @ w["wv"][l].T
        ks.append(k.reshape(T, n_kv, hs).transpose(1, 0, 2))
        vs.append(v.reshape(T, n_kv, hs).transpose(1, 0, 2))
        att = np.zeros_like(q)
        for head in range(n_heads):
            kv = head // (n_heads // n_kv)
            qh, kh, vh = q[:, head * hs:(head + 1) * hs], k[:, kv * hs:(kv + 1) * hs], v[:, kv * hs:(kv + 1) * hs]
            s = qh @ kh.T / np.sqrt(hs) + mask
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            att[:, head * hs:(head + 1) * hs] = (p / p.sum(axis=-1, keepdims=True)) @ vh
        x = x + att @ w["wo"][l].T
        h = rmsnorm(x, w["rms_ffn"][l])
        a, b = h @ w["w1"][l].T, h @ w["w3"][l].T
        x = x + (a / (1.0 + np.exp(-a)) * b) @ w["w2"][l].T
    logits = rmsnorm(x[-1], w["rms_final"]) @ w["cls"].T
    return np.stack(ks), np.stack(vs), logits


def relative_error(ours, theirs):
    return float(np.max(np.abs(ours - theirs)) / max(np.max(np.abs(theirs)), 1e-30))


def main(trace_dir, checkpoint):
    manifest = json.load(open(os.path.join(trace_dir, "manifest.json")))
    arrays = {name: np.load(os.path.join(trace_dir, entry["file"])) for name, entry in manifest["arrays"].items()}
    if manifest["run"]["kv_format"] != "fp32":
        sys.exit("this example recomputes fp32 traces only")
    w, c = load_checkpoint(checkpoint)
    P = manifest["run"]["prompt_length"]
    k, v, logits = forward(w, c, arrays["tokens"][:P])
    errors = {"logits[0]": relative_error(logits, arrays["logits"][0]),
              "k": relative_error(k, arrays["k"][:, :, :P]), "v": relative_error(v, arrays["v"][:, :, :P])}
    for name, e in errors.items():
        print(f"{name:>9}: largest difference {e:.2e} of the largest magnitude (tolerance {TOLERANCE:g})")
    same = int(np.argmax(logits)) == int(np.argmax(arrays["logits"][0]))
    print(f"next token: numpy {int(np.argmax(logits))}, kvlab {int(np.argmax(arrays['logits'][0]))}")
    return 0 if all(e < TOLERANCE for e in errors.values()) and same else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: trace_numpy.py TRACE_DIR CHECKPOINT")
    sys.exit(main(sys.argv[1], sys.argv[2]))
