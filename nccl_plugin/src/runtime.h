/* Process-wide state of the plugin: configuration, the ring, the shipper thread, counters. */
#ifndef NMS_NCCL_RUNTIME_H
#define NMS_NCCL_RUNTIME_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/un.h>
#include "nccl_abi.h"
#include "ring.h"

#define NMS_DEFAULT_SOCKET "/var/lib/nms-agent/buffer/nccl.sock"
#define NMS_DEFAULT_MASK (ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin)

typedef struct {
  char socket_path[sizeof(((struct sockaddr_un*)0)->sun_path)];
  char job_id[64];
  uint64_t ring_size, slots;
  int event_mask;
  int flush_ms;     /* the shipper wakes this often */
  int send_wait_ms; /* a slow agent is waited for this long per batch, then the batch is dropped */
} nms_config;

typedef struct {
  _Atomic uint64_t recorded, dropped_ring, dropped_slots, dropped_send, sent, batches;
} nms_counters;

extern nms_config nms_cfg;
extern nms_ring nms_records;
extern nms_counters nms_stats;
extern _Atomic uint32_t nms_abi_version;

/* Reads the environment into nms_cfg; on error returns an NCCL error code and writes why into `why`. */
ncclResult_t nms_config_load(char* why, size_t why_len);
/* Starts / stops the shipper thread (the ring must exist); stop sends what is left, then returns. */
int nms_shipper_start(void);
void nms_shipper_stop(void);

static inline void nms_push(const nms_record* rec) {
  if (nms_ring_push(&nms_records, rec))
    atomic_fetch_add_explicit(&nms_stats.recorded, 1, memory_order_relaxed);
  else
    atomic_fetch_add_explicit(&nms_stats.dropped_ring, 1, memory_order_relaxed);
}

#endif
