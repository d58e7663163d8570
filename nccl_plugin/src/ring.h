/* Bounded multi-producer / single-consumer ring of records (D. Vyukov's bounded queue): producers
 * never wait; a full ring refuses the record and the caller counts it. */
#ifndef NMS_NCCL_RING_H
#define NMS_NCCL_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include "wire.h"

typedef struct {
  _Atomic uint64_t seq;
  nms_record rec;
} __attribute__((aligned(64))) nms_cell;

typedef struct {
  nms_cell* cells;
  uint64_t mask;
  _Atomic uint64_t head __attribute__((aligned(64))); /* next slot producers claim */
  uint64_t tail __attribute__((aligned(64)));         /* next slot the consumer reads */
} nms_ring;

int nms_ring_init(nms_ring* ring, uint64_t capacity); /* capacity: a power of two */
void nms_ring_free(nms_ring* ring);
bool nms_ring_push(nms_ring* ring, const nms_record* rec);
size_t nms_ring_pop(nms_ring* ring, nms_record* out, size_t max); /* the consumer only */

#endif
