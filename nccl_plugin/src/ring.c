#include "ring.h"

#include <stdlib.h>
#include <string.h>

int nms_ring_init(nms_ring* ring, uint64_t capacity) {
  ring->cells = aligned_alloc(64, capacity * sizeof(nms_cell));
  if (ring->cells == NULL) return -1;
  for (uint64_t i = 0; i < capacity; i++) atomic_init(&ring->cells[i].seq, i);
  ring->mask = capacity - 1;
  atomic_init(&ring->head, 0);
  ring->tail = 0;
  return 0;
}

void nms_ring_free(nms_ring* ring) {
  free(ring->cells);
  ring->cells = NULL;
}

bool nms_ring_push(nms_ring* ring, const nms_record* rec) {
  uint64_t pos = atomic_load_explicit(&ring->head, memory_order_relaxed);
  nms_cell* cell;
  for (;;) {
    cell = &ring->cells[pos & ring->mask];
    uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
    int64_t diff = (int64_t)(seq - pos);
    if (diff == 0) {
      if (atomic_compare_exchange_weak_explicit(&ring->head, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed))
        break;
    } else if (diff < 0) {
      return false; /* full: the consumer has not freed this cell yet */
    } else {
      pos = atomic_load_explicit(&ring->head, memory_order_relaxed);
    }
  }
  memcpy(&cell->rec, rec, sizeof(*rec));
  atomic_store_explicit(&cell->seq, pos + 1, memory_order_release);
  return true;
}

size_t nms_ring_pop(nms_ring* ring, nms_record* out, size_t max) {
  size_t n = 0;
  while (n < max) {
    nms_cell* cell = &ring->cells[ring->tail & ring->mask];
    if (atomic_load_explicit(&cell->seq, memory_order_acquire) != ring->tail + 1) break; /* empty or being written */
    memcpy(&out[n++], &cell->rec, sizeof(nms_record));
    atomic_store_explicit(&cell->seq, ring->tail + ring->mask + 1, memory_order_release);
    ring->tail++;
  }
  return n;
}
