/* The NCCL profiler plugin: ncclProfiler_v1 .. v6, one set of event handlers behind them.
 *
 * Each event NCCL starts gets a slot of a process-wide table; its handle is the slot's index and
 * generation packed into the pointer (never dereferenced by NCCL), so a stale parent handle, e.g.
 * a collective's that was stopped before its proxy ops started, is recognised instead of read
 * after reuse. A stop stamps the slot's record and pushes it into the lock-free ring; the shipper
 * thread (shipper.c) sends it. NCCL's threads never wait: no lock, no syscall but clock_gettime. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "runtime.h"

#define EXPORT __attribute__((visibility("default")))
#define PROBES 16 /* slots tried per event before it is dropped */

typedef struct {
  uint64_t comm_id;
  int rank, version;
} nms_context;

typedef struct {
  _Atomic uint32_t busy, gen;
  _Atomic uint64_t acc_bytes; /* proxy op: transfer sizes its steps added */
  _Atomic uint32_t acc_steps;
  uint32_t kind;
  void* parent; /* proxy step: its proxy op's handle */
  nms_record rec;
} __attribute__((aligned(64))) nms_slot;

static nms_slot* slots;
static uint64_t slot_mask;
static _Atomic uint64_t slot_cursor, next_event_id = 1;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int live_contexts;

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* into a zeroed field: NUL-padded, and a name that fills the field has no NUL (cut if longer) */
static inline void copy_name(char* dst, size_t len, const char* src) {
  for (size_t i = 0; src && i < len && src[i]; i++) dst[i] = src[i];
}

/* --- slots and handles ---------------------------------------------------------------------------- */

static nms_slot* slot_alloc(void** handle) {
  uint64_t start = atomic_fetch_add_explicit(&slot_cursor, 1, memory_order_relaxed);
  for (int i = 0; i < PROBES; i++) {
    uint64_t idx = (start + (uint64_t)i) & slot_mask;
    nms_slot* s = &slots[idx];
    uint32_t expected = 0;
    if (atomic_load_explicit(&s->busy, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong_explicit(&s->busy, &expected, 1, memory_order_acquire, memory_order_relaxed)) {
      uint32_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
      atomic_store_explicit(&s->gen, gen, memory_order_relaxed);
      atomic_thread_fence(memory_order_release); /* readers of the old generation see the change first */
      *handle = (void*)(((uintptr_t)gen << 32) | (uintptr_t)(idx + 1));
      return s;
    }
  }
  atomic_fetch_add_explicit(&nms_stats.dropped_slots, 1, memory_order_relaxed);
  *handle = NULL;
  return NULL;
}

/* The slot a handle names while it is still that event's; NULL for foreign, stale or null handles. */
static nms_slot* slot_of(const void* handle, uint32_t* gen) {
  uintptr_t h = (uintptr_t)handle;
  uint64_t idx = (uint64_t)(h & 0xFFFFFFFFu) - 1;
  if (slots == NULL || h == 0 || idx > slot_mask) return NULL;
  nms_slot* s = &slots[idx];
  *gen = (uint32_t)(h >> 32);
  return atomic_load_explicit(&s->gen, memory_order_acquire) == *gen ? s : NULL;
}

/* A consistent copy of a parent event's record, or 0 when the handle no longer names it. */
static int parent_record(const void* handle, nms_record* out) {
  uint32_t gen;
  nms_slot* s = slot_of(handle, &gen);
  if (s == NULL) return 0;
  memcpy(out, &s->rec, sizeof(*out));
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&s->gen, memory_order_relaxed) == gen;
}

static void slot_release(nms_slot* s) { atomic_store_explicit(&s->busy, 0, memory_order_release); }

static nms_slot* event_begin(nms_context* ctx, void** handle, uint8_t kind, int rank) {
  nms_slot* s = slot_alloc(handle);
  if (s == NULL) return NULL;
  memset(&s->rec, 0, sizeof(s->rec));
  s->rec.kind = kind;
  s->rec.rank = rank;
  s->rec.comm_id = ctx->comm_id;
  s->rec.event_id = atomic_fetch_add_explicit(&next_event_id, 1, memory_order_relaxed);
  s->rec.start_ns = now_ns();
  s->kind = kind;
  s->parent = NULL;
  atomic_store_explicit(&s->acc_bytes, 0, memory_order_relaxed);
  atomic_store_explicit(&s->acc_steps, 0, memory_order_relaxed);
  return s;
}

static void set_parent(nms_record* rec, const nms_record* parent) {
  rec->parent_id = parent->event_id;
  rec->flags |= 1;
}

/* --- the version-independent event handlers --------------------------------------------------------- */

typedef struct { /* what the versions' coll / p2p descriptors give */
  uint64_t comm_hash, seq, count;
  const char *func, *datatype, *algo, *proto;
  int root_or_peer, nchannels, nwarps;
} nms_task;

static void start_task(nms_context* ctx, void** handle, uint8_t kind, int rank, const nms_task* t) {
  if (ctx->comm_id == 0 && t->comm_hash != 0) ctx->comm_id = t->comm_hash; /* v1-v3: known from events only */
  nms_slot* s = event_begin(ctx, handle, kind, rank);
  if (s == NULL) return;
  nms_coll_payload* c = &s->rec.coll;
  c->seq = t->seq;
  c->count = t->count;
  c->root_or_peer = t->root_or_peer;
  c->nchannels = (uint8_t)t->nchannels;
  c->nwarps = (uint8_t)t->nwarps;
  copy_name(c->func, sizeof(c->func), t->func);
  copy_name(c->datatype, sizeof(c->datatype), t->datatype);
  copy_name(c->algo, sizeof(c->algo), t->algo);
  copy_name(c->proto, sizeof(c->proto), t->proto);
}

static void start_proxy_op(nms_context* ctx, void** handle, int rank, void* parent, const nmsProxyOpDescr* d) {
  nms_slot* s = event_begin(ctx, handle, NMS_REC_PROXY_OP, rank);
  if (s == NULL) return;
  nms_proxy_op_payload* op = &s->rec.op;
  op->peer = d->peer;
  op->n_steps = d->nSteps;
  op->chunk_size = d->chunkSize;
  op->pid = d->pid;
  op->channel = d->channelId;
  op->is_send = (uint8_t)d->isSend;
  nms_record task;
  /* the parent is a collective / p2p of this process only: a proxy in another one has other handles */
  if (parent && d->pid == getpid() && parent_record(parent, &task)) set_parent(&s->rec, &task);
}

static void start_proxy_step(nms_context* ctx, void** handle, int rank, void* parent, int step) {
  nms_slot* s = event_begin(ctx, handle, NMS_REC_PROXY_STEP, rank);
  if (s == NULL) return;
  s->rec.step.step = step;
  s->rec.step.peer = -1;
  s->parent = parent;
  nms_record op;
  if (parent && parent_record(parent, &op) && op.kind == NMS_REC_PROXY_OP) {
    set_parent(&s->rec, &op);
    s->rec.step.peer = op.op.peer;
    s->rec.step.channel = op.op.channel;
    s->rec.step.is_send = op.op.is_send;
  }
}

/* A network plugin event names the QP (IB) or socket of its proxy step: kept in the step's record. */
static void net_event(void* step_handle, int64_t id, const void* data) {
  uint32_t gen;
  nms_slot* s = slot_of(step_handle, &gen);
  if (s == NULL || s->kind != NMS_REC_PROXY_STEP || data == NULL) return;
  nms_proxy_step_payload* st = &s->rec.step;
  uint32_t type = (uint32_t)id & NCCL_PROFILER_NET_TYPE_MASK, version = (uint32_t)id & NCCL_PROFILER_NET_VER_MASK;
  if (type == NCCL_PROFILER_NET_TYPE_IB && version == 1) {
    const ncclProfilerNetIbDescr_v1_t* ib = data;
    if (ib->type != ncclProfileQp) return;
    if (st->net_events == 0) {
      st->connection = ib->qp.qpNum;
      st->net_device = ib->qp.device;
    }
    st->net_type = NMS_NET_IB;
    st->net_bytes += ib->qp.length;
  } else if (type == NCCL_PROFILER_NET_TYPE_SOCK && version == 1) {
    const ncclProfilerNetSockDescr_v1_t* so = data;
    if (so->type != ncclProfileSocket) return;
    if (st->net_events == 0) st->connection = so->sock.fd;
    st->net_type = NMS_NET_SOCKET;
    st->net_bytes += so->sock.length;
  } else {
    return;
  }
  st->net_events++;
}

static const int step_state_index[] = {
    [ncclProfilerProxyStepSendGPUWait] = NMS_ST_SEND_GPU_WAIT + 1, [ncclProfilerProxyStepSendWait] = NMS_ST_SEND_WAIT + 1,
    [ncclProfilerProxyStepRecvWait] = NMS_ST_RECV_WAIT + 1, [ncclProfilerProxyStepRecvFlushWait] = NMS_ST_RECV_FLUSH_WAIT + 1,
    [ncclProfilerProxyStepRecvGPUWait] = NMS_ST_RECV_GPU_WAIT + 1, [ncclProfilerProxyStepSendPeerWait_v4] = NMS_ST_SEND_PEER_WAIT + 1,
};

/* trans_size < 0: the version's arguments carry none for this state */
static ncclResult_t record_state(void* handle, int state, int64_t trans_size) {
  uint32_t gen;
  nms_slot* s = slot_of(handle, &gen);
  if (s == NULL) return NCCL_OK;
  if (s->kind == NMS_REC_PROXY_STEP && state >= 0 && state < (int)(sizeof(step_state_index) / sizeof(int)) &&
      step_state_index[state]) {
    uint64_t since = now_ns() - s->rec.start_ns;
    s->rec.step.state_ns[step_state_index[state] - 1] = since > UINT32_MAX ? UINT32_MAX : (since ? (uint32_t)since : 1);
    if (trans_size >= 0) s->rec.step.trans_size = (uint64_t)trans_size;
  } else if (s->kind == NMS_REC_PROXY_OP && trans_size > 0 && state >= 0 && state <= 7) { /* v1-v3 op states */
    if ((uint64_t)trans_size > s->rec.op.trans_bytes) s->rec.op.trans_bytes = (uint64_t)trans_size;
  }
  return NCCL_OK;
}

static ncclResult_t stop_event(void* handle) {
  uint32_t gen;
  nms_slot* s = slot_of(handle, &gen);
  if (s == NULL || atomic_load_explicit(&s->busy, memory_order_relaxed) == 0) return NCCL_OK; /* stopped already */
  s->rec.stop_ns = now_ns();
  if (s->kind == NMS_REC_PROXY_STEP) {
    nms_slot* op = slot_of(s->parent, &gen);
    if (op && op->kind == NMS_REC_PROXY_OP) {
      atomic_fetch_add_explicit(&op->acc_bytes, s->rec.step.trans_size, memory_order_relaxed);
      atomic_fetch_add_explicit(&op->acc_steps, 1, memory_order_relaxed);
    }
  } else if (s->kind == NMS_REC_PROXY_OP) {
    uint64_t bytes = atomic_load_explicit(&s->acc_bytes, memory_order_relaxed);
    if (bytes > s->rec.op.trans_bytes) s->rec.op.trans_bytes = bytes;
    s->rec.op.steps = atomic_load_explicit(&s->acc_steps, memory_order_relaxed);
  }
  nms_push(&s->rec);
  slot_release(s);
  return NCCL_OK;
}

/* --- init / finalize ------------------------------------------------------------------------------------ */

static void log_warn(ncclDebugLogger_t logfn, const char* why) {
  if (logfn) logfn(NCCL_LOG_WARN, NCCL_INIT_FLAG, __FILE__, __LINE__, "NMS profiler plugin disabled: %s", why);
  else fprintf(stderr, "NMS profiler plugin disabled: %s\n", why);
}

static ncclResult_t runtime_start(ncclDebugLogger_t logfn) {
  char why[160] = "";
  ncclResult_t rc = nms_config_load(why, sizeof(why));
  if (rc != NCCL_OK) {
    log_warn(logfn, why);
    return rc;
  }
  slots = aligned_alloc(64, nms_cfg.slots * sizeof(nms_slot));
  if (slots == NULL || nms_ring_init(&nms_records, nms_cfg.ring_size) != 0) goto nomem;
  memset(slots, 0, nms_cfg.slots * sizeof(nms_slot));
  slot_mask = nms_cfg.slots - 1;
  if (nms_shipper_start() != 0) goto nomem;
  return NCCL_OK;
nomem:
  free(slots);
  slots = NULL;
  nms_ring_free(&nms_records);
  log_warn(logfn, "out of memory or threads");
  return NCCL_SYSTEM_ERROR;
}

static ncclResult_t init_common(void** context, int* mask, int version, uint64_t comm_id, const char* comm_name,
                                int nnodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  *context = NULL;
  pthread_mutex_lock(&init_lock);
  if (live_contexts == 0) {
    ncclResult_t rc = runtime_start(logfn);
    if (rc != NCCL_OK) {
      pthread_mutex_unlock(&init_lock);
      return rc;
    }
  }
  nms_context* ctx = calloc(1, sizeof(*ctx));
  if (ctx == NULL) {
    if (live_contexts == 0) {
      nms_shipper_stop();
      free(slots);
      slots = NULL;
      nms_ring_free(&nms_records);
    }
    pthread_mutex_unlock(&init_lock);
    return NCCL_SYSTEM_ERROR;
  }
  live_contexts++;
  atomic_store(&nms_abi_version, (uint32_t)version);
  pthread_mutex_unlock(&init_lock);
  ctx->comm_id = comm_id;
  ctx->rank = rank;
  ctx->version = version;
  *mask = nms_cfg.event_mask;
  *context = ctx;
  if (nranks > 0) { /* v4+: the communicator is known now; one record says which rank of it we are */
    nms_record rec = {.kind = NMS_REC_COMM, .rank = rank, .comm_id = comm_id};
    rec.event_id = atomic_fetch_add(&next_event_id, 1);
    rec.start_ns = rec.stop_ns = now_ns();
    rec.comm.nranks = nranks;
    rec.comm.nnodes = nnodes;
    copy_name(rec.comm.comm_name, sizeof(rec.comm.comm_name), comm_name);
    nms_push(&rec);
  }
  return NCCL_OK;
}

static ncclResult_t finalize_common(void* context) {
  free(context);
  pthread_mutex_lock(&init_lock);
  if (--live_contexts == 0) {
    nms_shipper_stop(); /* sends what is left */
    nms_ring_free(&nms_records);
    free(slots);
    slots = NULL;
  }
  pthread_mutex_unlock(&init_lock);
  return NCCL_OK;
}

/* --- one adapter per ABI version ------------------------------------------------------------------------- */

static const char* const v1_funcs[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv"};
static const char* const v1_types[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                                       "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
static const char* const v1_algos[] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
static const char* const v1_protos[] = {"LL", "LL128", "SIMPLE"};
#define NAME_OF(table, i) ((size_t)(i) < sizeof(table) / sizeof(*(table)) ? (table)[i] : "Unknown")

static ncclResult_t start_v1(void* context, void** handle, ncclProfilerEventDescr_v1_t* d) {
  nms_context* ctx = context;
  nms_task t = {0};
  *handle = NULL;
  switch (d->type) {
  case ncclProfileColl:
    t = (nms_task){d->coll.commHash, d->coll.seqNumber, d->coll.count, NAME_OF(v1_funcs, d->coll.func),
                   NAME_OF(v1_types, d->coll.datatype), NAME_OF(v1_algos, d->coll.algo), NAME_OF(v1_protos, d->coll.proto),
                   d->coll.root, d->coll.nMaxChannels, d->coll.nWarps};
    start_task(ctx, handle, NMS_REC_COLL, d->rank, &t);
    break;
  case ncclProfileP2p:
    t = (nms_task){d->p2p.commHash, 0, d->p2p.count, NAME_OF(v1_funcs, d->p2p.func), NAME_OF(v1_types, d->p2p.datatype),
                   NULL, NULL, d->p2p.peer, 0, 0};
    start_task(ctx, handle, NMS_REC_P2P, d->rank, &t);
    break;
  case ncclProfileProxyOp: start_proxy_op(ctx, handle, d->rank, d->parentObj, &d->proxyOp); break;
  case ncclProfileProxyStep: start_proxy_step(ctx, handle, d->rank, d->parentObj, d->proxyStep.step); break;
  }
  return NCCL_OK;
}

/* v2 and v3 differ only in v2's trafficBytes, v3's kernel channel and network plugin members */
#define START_V2_V3(ver, net)                                                                                          \
  static ncclResult_t start_v##ver(void* context, void** handle, ncclProfilerEventDescr_v##ver##_t* d) {                  \
    nms_context* ctx = context;                                                                                         \
    nms_task t;                                                                                                         \
    *handle = NULL;                                                                                                     \
    switch (d->type) {                                                                                                  \
    case ncclProfileColl:                                                                                               \
      t = (nms_task){d->coll.commHash, d->coll.seqNumber, d->coll.count, d->coll.func, d->coll.datatype, d->coll.algo,   \
                     d->coll.proto, d->coll.root, d->coll.nMaxChannels, d->coll.nWarps};                                 \
      start_task(ctx, handle, NMS_REC_COLL, d->rank, &t);                                                               \
      break;                                                                                                            \
    case ncclProfileP2p:                                                                                                \
      t = (nms_task){d->p2p.commHash, 0, d->p2p.count, d->p2p.func, d->p2p.datatype, NULL, NULL, d->p2p.peer, 0, 0};     \
      start_task(ctx, handle, NMS_REC_P2P, d->rank, &t);                                                                \
      break;                                                                                                            \
    case ncclProfileProxyOp: start_proxy_op(ctx, handle, d->rank, d->parentObj, &d->proxyOp); break;                    \
    case ncclProfileProxyStep: start_proxy_step(ctx, handle, d->rank, d->parentObj, d->proxyStep.step); break;          \
    net                                                                                                                 \
    }                                                                                                                   \
    return NCCL_OK;                                                                                                     \
  }
START_V2_V3(2, )
START_V2_V3(3, case ncclProfileNetPlugin: net_event(d->parentObj, d->netPlugin.id, d->netPlugin.data); break;)

/* v4, v5 and v6 share member names; v5/v6 coll/p2p parentObj is the API event (the group is parentGroup) */
#define START_V4_UP(ver)                                                                                               \
  static ncclResult_t start_v##ver(void* context, void** handle, ncclProfilerEventDescr_v##ver##_t* d) {                  \
    nms_context* ctx = context;                                                                                         \
    nms_task t;                                                                                                         \
    *handle = NULL;                                                                                                     \
    switch (d->type) {                                                                                                  \
    case ncclProfileColl:                                                                                               \
      t = (nms_task){0, d->coll.seqNumber, d->coll.count, d->coll.func, d->coll.datatype, d->coll.algo, d->coll.proto,   \
                     d->coll.root, d->coll.nChannels, d->coll.nWarps};                                                   \
      start_task(ctx, handle, NMS_REC_COLL, d->rank, &t);                                                               \
      break;                                                                                                            \
    case ncclProfileP2p:                                                                                                \
      t = (nms_task){0, 0, d->p2p.count, d->p2p.func, d->p2p.datatype, NULL, NULL, d->p2p.peer, d->p2p.nChannels, 0};    \
      start_task(ctx, handle, NMS_REC_P2P, d->rank, &t);                                                                \
      break;                                                                                                            \
    case ncclProfileProxyOp: start_proxy_op(ctx, handle, d->rank, d->parentObj, &d->proxyOp); break;                    \
    case ncclProfileProxyStep: start_proxy_step(ctx, handle, d->rank, d->parentObj, d->proxyStep.step); break;          \
    case ncclProfileNetPlugin: net_event(d->parentObj, d->netPlugin.id, d->netPlugin.data); break;                      \
    }                                                                                                                   \
    return NCCL_OK;                                                                                                     \
  }
START_V4_UP(4)
START_V4_UP(5)
START_V4_UP(6)

static ncclResult_t state_v1(void* handle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v1_t* args) {
  return record_state(handle, state, args && state <= 7 ? (int64_t)args->proxyOp.transSize : -1);
}
static ncclResult_t state_v4(void* handle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v4_t* args) {
  int is_step = state >= 8 && state <= 12 ? 1 : state == ncclProfilerProxyStepSendPeerWait_v4;
  return record_state(handle, state, args && is_step ? (int64_t)args->proxyStep.transSize : -1);
}

static ncclResult_t init_v1(void** context, int* mask) { return init_common(context, mask, 1, 0, NULL, 0, 0, -1, NULL); }
static ncclResult_t init_v2(void** context, int* mask) { return init_common(context, mask, 2, 0, NULL, 0, 0, -1, NULL); }
static ncclResult_t init_v3(void** context, int* mask) { return init_common(context, mask, 3, 0, NULL, 0, 0, -1, NULL); }
static ncclResult_t init_v4(void** context, int* mask, const char* name, uint64_t hash, int nnodes, int nranks, int rank,
                            ncclDebugLogger_t logfn) {
  return init_common(context, mask, 4, hash, name, nnodes, nranks, rank, logfn);
}
static ncclResult_t init_v5(void** context, uint64_t comm_id, int* mask, const char* name, int nnodes, int nranks,
                            int rank, ncclDebugLogger_t logfn) {
  return init_common(context, mask, 5, comm_id, name, nnodes, nranks, rank, logfn);
}
static ncclResult_t init_v6(void** context, uint64_t comm_id, int* mask, const char* name, int nnodes, int nranks,
                            int rank, ncclDebugLogger_t logfn) {
  return init_common(context, mask, 6, comm_id, name, nnodes, nranks, rank, logfn);
}

#define PLUGIN_NAME "nms"
EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {PLUGIN_NAME, init_v6, start_v6, stop_event, state_v4, finalize_common};
EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {PLUGIN_NAME, init_v5, start_v5, stop_event, state_v4, finalize_common};
EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {PLUGIN_NAME, init_v4, start_v4, stop_event, state_v4, finalize_common};
EXPORT ncclProfiler_v3_t ncclProfiler_v3 = {PLUGIN_NAME, init_v3, start_v3, stop_event, state_v1, finalize_common};
EXPORT ncclProfiler_v2_t ncclProfiler_v2 = {PLUGIN_NAME, init_v2, start_v2, stop_event, state_v1, finalize_common};
EXPORT ncclProfiler_v1_t ncclProfiler_v1 = {PLUGIN_NAME, init_v1, start_v1, stop_event, state_v1, finalize_common};

/* Counters for tests and tools (not part of NCCL's ABI): recorded, dropped_ring, dropped_slots,
 * dropped_send, sent, batches. Returns how many it wrote. */
EXPORT int nmsNcclPluginStats(uint64_t* out, int max) {
  uint64_t all[] = {atomic_load(&nms_stats.recorded), atomic_load(&nms_stats.dropped_ring),
                    atomic_load(&nms_stats.dropped_slots), atomic_load(&nms_stats.dropped_send),
                    atomic_load(&nms_stats.sent), atomic_load(&nms_stats.batches)};
  int n = max < 6 ? max : 6;
  for (int i = 0; i < n; i++) out[i] = all[i];
  return n;
}
