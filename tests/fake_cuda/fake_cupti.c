/* A stand-in for libcupti, for testing data/cupti_records.c without a GPU: the two entry points
   it looks up, over records of this file's own layout (the test describes it to the C side as
   cupti-python's record type would), and a helper that hands the registered callbacks one
   buffer of records, as CUPTI's flush does. */
#include <stdint.h>
#include <string.h>

typedef void (*requested_fn)(uint8_t **, size_t *, size_t *);
typedef void (*completed_fn)(void *, uint32_t, uint8_t *, size_t, size_t);

typedef struct { /* tests/test_cupti_records.py's RECORD */
    int32_t kind;
    uint16_t registers, pad;
    uint64_t start, end;
    int32_t grid[3], block[3];
    const char *name;
} fake_record;

static requested_fn requested;
static completed_fn completed;

int cuptiActivityRegisterCallbacks(requested_fn asked, completed_fn done) {
    requested = asked;
    completed = done;
    return asked && done ? 0 : 1;
}

int cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
    uint8_t *next = *record ? (uint8_t *)*record + sizeof(fake_record) : buffer;
    if (next + sizeof(fake_record) > buffer + valid) return 3; /* no more */
    *record = next;
    return 0;
}

/* `n` records (kind, name and start of each; the rest derived from i) handed over in one
   buffer; the bytes the buffer had room for, or -1 where none was given. */
int64_t fake_cupti_deliver(int n, const int32_t *kinds, const char *const *names,
                           const uint64_t *starts) {
    uint8_t *buffer = NULL;
    size_t size = 0, most = 0;
    requested(&buffer, &size, &most);
    if (buffer == NULL || (size_t)n * sizeof(fake_record) > size) return -1;
    for (int i = 0; i < n; i++) {
        fake_record r = {kinds[i], (uint16_t)(32 + i), 0, starts[i], starts[i] + 100 + i,
                         {i + 1, 2, 3}, {128 + i, 1, 1}, names[i]};
        memcpy(buffer + (size_t)i * sizeof r, &r, sizeof r);
    }
    completed(NULL, 7, buffer, size, (size_t)n * sizeof(fake_record));
    return (int64_t)size;
}
