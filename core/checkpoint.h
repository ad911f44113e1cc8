// kvlab core: reading and writing llama2.c checkpoints.
//
// Two float32 layouts are read (see checkpoint.cpp for the byte-level description):
//   legacy  the format llama2.c's run.c reads (export.py --version 0): a 28-byte header, the
//           weights, two RoPE tables (ignored on load), then the classifier when unshared.
//   ak42 v1 export.py --version 1: a 256-byte header starting with the magic "ak42", no RoPE tables.
// Every problem with a file (missing, short, long, nonsensical header, unsupported version) is
// reported as a one-line kvlab::Error naming the file; nothing is allocated before the header has
// been validated and the file size checked against it.
#pragma once

#include <string>

#include "model.h"

namespace kvlab {

// Reads a llama2.c checkpoint: the legacy format run.c reads, or the "ak42" version-1 format of
// llama2.c's export.py.
Model load_checkpoint(const std::string& path);

// Writes the legacy format, so any llama2.c-compatible program runs the same weights.
// The RoPE tables written are model.rope's cos and sin.
void save_checkpoint(const std::string& path, const Model& model);

}  // namespace kvlab
