/* CUPTI's kernel records for the map, taken in C (device.cupti_records).

   Through cupti-python every buffer CUPTI asked for or handed over went through a Python
   callback, under the interpreter lock, and every record became a Python object before the map
   read it: on the H100's BF16 grid (~1.6 million records) ~13 s of the map's one Python thread,
   and each exchange held the C thread's launches up (~1.5 ms of idle GPU). Here CUPTI's buffer
   callbacks are C: a buffer asked for is allocated at once; a buffer handed over is read at once
   into compact rows (the few fields the map reads, at the offsets and widths of cupti-python's
   own record type, so that no CUPTI header is needed) and freed. Python takes the rows in one
   call. Kernel names are kept once each, numbered in the order first seen. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*requested_fn)(uint8_t **, size_t *, size_t *);
typedef void (*completed_fn)(void *, uint32_t, uint8_t *, size_t, size_t);
typedef int (*register_fn)(requested_fn, completed_fn);
typedef int (*next_fn)(uint8_t *, size_t, void **);

typedef struct { /* device.cupti_records.ROW */
    int64_t start, end;
    int32_t grid[3], block[3], registers, name; /* name: its number among the names seen */
} kernel_row;

/* the record's fields, in this order, at the offsets and widths (bytes) Python gives */
enum {
    KIND, START, END, GRID_X, GRID_Y, GRID_Z, BLOCK_X, BLOCK_Y, BLOCK_Z, REGISTERS, NAME, FIELDS
};
enum { NAME_SLOTS = 1 << 14 };

static next_fn next_record;
static size_t buffer_bytes; /* device.cupti_records.BUFFER_BYTES */
static int64_t offset[FIELDS], width[FIELDS];
static int64_t kernel_kind;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static kernel_row *rows;
static int64_t count, capacity, skipped; /* skipped: other kinds, or no memory */
static const char *seen[NAME_SLOTS];     /* CUPTI's name pointers (open addressing) */
static int32_t slot_name[NAME_SLOTS];    /* and their numbers */
static char *names[NAME_SLOTS];          /* copies, by number */
static int32_t name_count;

static int64_t field(const uint8_t *record, int which) {
    const uint8_t *at = record + offset[which];
    switch (width[which]) {
    case 1: return *at;
    case 2: { uint16_t v; memcpy(&v, at, 2); return v; }
    case 4: { int32_t v; memcpy(&v, at, 4); return v; }
    default: { int64_t v; memcpy(&v, at, 8); return v; }
    }
}

/* The number of the name at `pointer` (a kernel's records all share CUPTI's one copy); -1 where
   no more names fit. */
static int32_t name_number(const char *pointer) {
    uint64_t hash = ((uint64_t)(uintptr_t)pointer >> 3) * 0x9E3779B97F4A7C15ull;
    for (uint64_t probe = hash >> 50;; probe = (probe + 1) & (NAME_SLOTS - 1)) {
        if (seen[probe] == pointer) return slot_name[probe];
        if (seen[probe] == NULL) {
            if (name_count >= NAME_SLOTS / 2) return -1; /* (half full: probes stay short) */
            char *copy = strdup(pointer ? pointer : "");
            if (copy == NULL) return -1;
            seen[probe] = pointer;
            names[name_count] = copy;
            return slot_name[probe] = name_count++;
        }
    }
}

static int room_for_one(void) {
    if (count < capacity) return 1;
    int64_t wanted = capacity ? 2 * capacity : 1 << 16;
    kernel_row *grown = realloc(rows, (size_t)wanted * sizeof *rows);
    if (grown == NULL) return 0;
    rows = grown;
    capacity = wanted;
    return 1;
}

static void requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, buffer_bytes);
    *size = *buffer ? buffer_bytes : 0;
    *max_records = 0;
}

static void completed(void *context, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)context, (void)stream, (void)size;
    if (buffer == NULL) return;
    void *record = NULL;
    pthread_mutex_lock(&lock);
    while (valid > 0 && next_record(buffer, valid, &record) == 0) {
        const uint8_t *r = record;
        int32_t name = field(r, KIND) == kernel_kind
                           ? name_number((const char *)(uintptr_t)field(r, NAME)) : -1;
        if (name < 0 || !room_for_one()) {
            skipped++;
            continue;
        }
        kernel_row *row = &rows[count++];
        row->start = field(r, START);
        row->end = field(r, END);
        row->grid[0] = (int32_t)field(r, GRID_X);
        row->grid[1] = (int32_t)field(r, GRID_Y);
        row->grid[2] = (int32_t)field(r, GRID_Z);
        row->block[0] = (int32_t)field(r, BLOCK_X);
        row->block[1] = (int32_t)field(r, BLOCK_Y);
        row->block[2] = (int32_t)field(r, BLOCK_Z);
        row->registers = (int32_t)field(r, REGISTERS);
        row->name = name;
    }
    pthread_mutex_unlock(&lock);
    free(buffer);
}

/* CUPTI's buffers (`bytes` each, a multiple of 8) handed to the callbacks above, in the
   libcupti at `path` (already loaded); `offsets` and `widths` of the FIELDS in a kernel record
   of kind `kind`. 0, or 1: libcupti or an entry point not found, 2: CUPTI refused the callbacks
   (then its status is in *status). */
int cupti_records_start(const char *path, const int64_t *offsets, const int64_t *widths,
                        int64_t kind, int64_t bytes, int *status) {
    void *cupti = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (cupti == NULL) return 1;
    register_fn register_callbacks;
    *(void **)&register_callbacks = dlsym(cupti, "cuptiActivityRegisterCallbacks");
    *(void **)&next_record = dlsym(cupti, "cuptiActivityGetNextRecord");
    if (!register_callbacks || !next_record) return 1;
    pthread_mutex_lock(&lock);
    memcpy(offset, offsets, sizeof offset);
    memcpy(width, widths, sizeof width);
    kernel_kind = kind;
    buffer_bytes = (size_t)bytes;
    pthread_mutex_unlock(&lock);
    *status = register_callbacks(requested, completed);
    return *status ? 2 : 0;
}

/* The rows handed over so far, at most `most` of them, moved into `out`; how many. */
int64_t cupti_records_take(kernel_row *out, int64_t most) {
    pthread_mutex_lock(&lock);
    int64_t taken = count < most ? count : most;
    memcpy(out, rows, (size_t)taken * sizeof *rows);
    memmove(rows, rows + taken, (size_t)(count - taken) * sizeof *rows);
    count -= taken;
    pthread_mutex_unlock(&lock);
    return taken;
}

/* The rows handed over and not taken yet, and the records not kept (another kind, no memory
   left) since the start. */
void cupti_records_counts(int64_t *waiting, int64_t *not_kept) {
    pthread_mutex_lock(&lock);
    *waiting = count;
    *not_kept = skipped;
    pthread_mutex_unlock(&lock);
}

/* Name number `number`, or NULL. */
const char *cupti_records_name(int32_t number) {
    pthread_mutex_lock(&lock);
    const char *found = number >= 0 && number < name_count ? names[number] : NULL;
    pthread_mutex_unlock(&lock);
    return found;
}
