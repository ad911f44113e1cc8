# expect: allocate() returned
# allocate() reads the free list's last block but never removes it: the next request gets the
# same block, and two sequences overwrite each other's rows.
/    free_.pop_back();/d
s|int LabAllocator::n_free() const { return int(free_.size()); }|int LabAllocator::n_free() const { return int(std::count(allocated_.begin(), allocated_.end(), 0)); }|
s|#include <fmt/format.h>|#include <fmt/format.h>\n\n#include <algorithm>|
