# expect: past the largest finite value: saturate
# A value past 448 becomes NaN, as a conversion without saturation gives in e4m3fn (no infinity):
# one large K element then turns its whole attention row into NaN.
s|^    if (a >= 448.0f) return sign \| 0x7e;  // saturate (S.1111.110 = 448)|    if (a > 464.0f) return sign \| 0x7f;  // the mistake: NaN past the range|
