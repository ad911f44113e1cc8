# expect: pack into
# Every code in a byte of its own, int4 too: quantize and dequantize agree with each other, but
# an int4 block takes twice the bytes put_code's packing gives it (two codes per byte), and the
# cache holds twice the payload it promises.
s|q.codes.assign((std::size_t(rows) \* cols \* bits + 7) / 8, 0);|q.codes.assign(std::size_t(rows) * cols, 0);  // the mistake: one byte per code, whatever bits|
s|QuantizedCache::put_code(q.codes.data(), i, quant_encode(x\[std::size_t(i)\], r, bits), bits);|q.codes[std::size_t(i)] = std::uint8_t(quant_encode(x[std::size_t(i)], r, bits));|
s|QuantizedCache::get_code(q.codes.data(), i, bits)|(q.codes[std::size_t(i)] \& ((1u << bits) - 1u))|
