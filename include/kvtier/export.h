// Symbol visibility: kvtier is compiled with hidden visibility; what the public API needs is
// marked KVTIER_EXPORT.
#ifndef KVTIER_EXPORT_H_
#define KVTIER_EXPORT_H_

#define KVTIER_EXPORT __attribute__((visibility("default")))

#endif  // KVTIER_EXPORT_H_
