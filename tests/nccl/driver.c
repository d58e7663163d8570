/* Test driver for the NCCL profiler plugin: dlopens it and drives the ABI as NCCL does.
 *
 *   driver PLUGIN VERSION run THREADS ITERS   communicators on THREADS threads, ITERS groups each
 *   driver PLUGIN - layout                    every ncclProfiler_vN: dlsym, name, functions, a call
 *   driver PLUGIN VERSION init                init once and report its result
 *   driver PLUGIN VERSION bench ITERS         ns per event: the plugin vs no-op functions
 *
 * Per group (NCCL's order): group start, collective start, p2p start, collective and p2p stop
 * (enqueued), group stop; then on the communicator's proxy thread, as NCCL's does after that, per
 * task a proxy op (parent: the task's handle, made on the other thread) with 2 steps, each with
 * wait states, a network plugin event (v3+: an IB QP for collectives, a socket for p2p) and a
 * stop. Prints key=value lines. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../../nccl_plugin/src/nccl_abi.h"

static void* lib;
static int version;
static void* fn_init; /* the version's init, called with its own signature */
static ncclResult_t (*fn_start)(void*, void**, void*);
static ncclResult_t (*fn_stop)(void*);
static ncclResult_t (*fn_state)(void*, int, void*);
static ncclResult_t (*fn_finalize)(void*);
static int iters, threads;
static _Atomic uint64_t max_call_ns;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void note(uint64_t t0) {
  uint64_t d = now_ns() - t0, m = max_call_ns;
  while (d > m && !__atomic_compare_exchange_n((uint64_t*)&max_call_ns, &m, d, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)level, (void)flags, (void)file, (void)line;
  fprintf(stderr, "nccl-log: %s\n", fmt);
}

static int load(const char* path, int ver) {
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return -1; }
  char sym[32];
  snprintf(sym, sizeof(sym), "ncclProfiler_v%d", ver);
  ncclProfiler_v6_t* p = dlsym(lib, sym); /* every version: name, init, start, stop, state, finalize */
  if (!p) { fprintf(stderr, "dlsym %s: %s\n", sym, dlerror()); return -1; }
  version = ver;
  fn_init = (void*)p->init;
  fn_start = (void*)p->startEvent;
  fn_stop = (void*)p->stopEvent;
  fn_state = (void*)p->recordEventState;
  fn_finalize = p->finalize;
  return 0;
}

static ncclResult_t do_init(void** ctx, int* mask, uint64_t comm, const char* name, int nranks, int rank) {
  if (version >= 5)
    return ((ncclResult_t(*) NMS_INIT_V5)fn_init)(ctx, comm, mask, name, 1, nranks, rank, logger);
  if (version == 4)
    return ((ncclResult_t(*) NMS_INIT_V4)fn_init)(ctx, mask, name, comm, 1, nranks, rank, logger);
  return ((ncclResult_t(*) NMS_INIT_V1)fn_init)(ctx, mask);
}

/* One descriptor big enough for every version; each version's fields are filled through its own type. */
typedef union { ncclProfilerEventDescr_v1_t v1; ncclProfilerEventDescr_v2_t v2; ncclProfilerEventDescr_v3_t v3;
                ncclProfilerEventDescr_v4_t v4; ncclProfilerEventDescr_v5_t v5; ncclProfilerEventDescr_v6_t v6; } descr_t;
typedef union { ncclProfilerEventStateArgs_v1_t v1; ncclProfilerEventStateArgs_v4_t v4; } args_t;

#define SET_HEAD(d, t, parent, r) do { if (version >= 5) { (d).v5.type = (t); (d).v5.parentObj = (parent); (d).v5.rank = (r); } \
                                       else { (d).v1.type = (t); (d).v1.parentObj = (parent); (d).v1.rank = (r); } } while (0)

static void* start(void* ctx, descr_t* d) {
  void* h = NULL;
  uint64_t t0 = now_ns();
  fn_start(ctx, &h, d);
  note(t0);
  return h;
}
static void stop(void* h) { uint64_t t0 = now_ns(); fn_stop(h); note(t0); }
static void state(void* h, int s, size_t trans) {
  args_t a;
  memset(&a, 0, sizeof(a));
  if (version >= 4) a.v4.proxyStep.transSize = trans; else a.v1.proxyOp.transSize = trans;
  uint64_t t0 = now_ns();
  fn_state(h, s, &a);
  note(t0);
}

static void* group_start(void* ctx) { descr_t d; memset(&d, 0, sizeof(d)); SET_HEAD(d, ncclProfileGroup, NULL, 0); return start(ctx, &d); }

static void* coll_start(void* ctx, void* group, uint64_t comm, int rank, uint64_t seq, size_t count) {
  descr_t d;
  memset(&d, 0, sizeof(d));
  SET_HEAD(d, ncclProfileColl, group, rank);
  switch (version) {
  case 1: d.v1.coll.commHash = comm; d.v1.coll.seqNumber = seq; d.v1.coll.func = 4 /* AllReduce */; d.v1.coll.count = count;
          d.v1.coll.datatype = 7 /* Float32 */; d.v1.coll.nMaxChannels = 2; d.v1.coll.nWarps = 8; d.v1.coll.algo = 1; d.v1.coll.proto = 2; break;
  case 2: d.v2.coll.commHash = comm; d.v2.coll.seqNumber = seq; d.v2.coll.func = "AllReduce"; d.v2.coll.count = count;
          d.v2.coll.datatype = "ncclFloat32"; d.v2.coll.nMaxChannels = 2; d.v2.coll.nWarps = 8; d.v2.coll.algo = "RING"; d.v2.coll.proto = "SIMPLE"; break;
  case 3: d.v3.coll.commHash = comm; d.v3.coll.seqNumber = seq; d.v3.coll.func = "AllReduce"; d.v3.coll.count = count;
          d.v3.coll.datatype = "ncclFloat32"; d.v3.coll.nMaxChannels = 2; d.v3.coll.nWarps = 8; d.v3.coll.algo = "RING"; d.v3.coll.proto = "SIMPLE"; break;
  case 4: d.v4.coll.seqNumber = seq; d.v4.coll.func = "AllReduce"; d.v4.coll.count = count; d.v4.coll.datatype = "ncclFloat32";
          d.v4.coll.nChannels = 2; d.v4.coll.nWarps = 8; d.v4.coll.algo = "RING"; d.v4.coll.proto = "SIMPLE"; break;
  default: /* v5, v6: parentObj is the collective API event (none here); the group is parentGroup */
          d.v5.parentObj = NULL; d.v5.coll.parentGroup = group; d.v5.coll.seqNumber = seq; d.v5.coll.func = "AllReduce";
          d.v5.coll.count = count; d.v5.coll.datatype = "ncclFloat32"; d.v5.coll.nChannels = 2; d.v5.coll.nWarps = 8;
          d.v5.coll.algo = "RING"; d.v5.coll.proto = "SIMPLE"; break;
  }
  return start(ctx, &d);
}

static void* p2p_start(void* ctx, void* group, uint64_t comm, int rank, int peer, size_t count) {
  descr_t d;
  memset(&d, 0, sizeof(d));
  SET_HEAD(d, ncclProfileP2p, group, rank);
  switch (version) {
  case 1: d.v1.p2p.commHash = comm; d.v1.p2p.func = 6 /* Send */; d.v1.p2p.datatype = 0 /* Int8 */; d.v1.p2p.count = count; d.v1.p2p.peer = peer; break;
  case 2: d.v2.p2p.commHash = comm; d.v2.p2p.func = "Send"; d.v2.p2p.datatype = "ncclInt8"; d.v2.p2p.count = count; d.v2.p2p.peer = peer; break;
  case 3: d.v3.p2p.commHash = comm; d.v3.p2p.func = "Send"; d.v3.p2p.datatype = "ncclInt8"; d.v3.p2p.count = count; d.v3.p2p.peer = peer; break;
  case 4: d.v4.p2p.func = "Send"; d.v4.p2p.datatype = "ncclInt8"; d.v4.p2p.count = count; d.v4.p2p.peer = peer; d.v4.p2p.nChannels = 1; break;
  default: d.v5.p2p.parentGroup = group; d.v5.p2p.func = "Send"; d.v5.p2p.datatype = "ncclInt8"; d.v5.p2p.count = count;
           d.v5.p2p.peer = peer; d.v5.p2p.nChannels = 1; break;
  }
  return start(ctx, &d);
}

/* The proxy thread's part for one task: an op, 2 steps, their states and network events. */
static void proxy(void* ctx, void* task, int rank, int peer, int channel, int qp, int use_socket) {
  descr_t d;
  memset(&d, 0, sizeof(d));
  SET_HEAD(d, ncclProfileProxyOp, task, rank);
  nmsProxyOpDescr* op = version >= 5 ? &d.v5.proxyOp : &d.v1.proxyOp; /* same offset in every version */
  op->pid = getpid(); op->channelId = (uint8_t)channel; op->peer = peer; op->nSteps = 2; op->chunkSize = 4096; op->isSend = 1;
  void* op_handle = start(ctx, &d);
  for (int s = 0; s < 2; s++) {
    memset(&d, 0, sizeof(d));
    SET_HEAD(d, ncclProfileProxyStep, op_handle, rank);
    (version >= 5 ? &d.v5.proxyStep : &d.v1.proxyStep)->step = s;
    void* step = start(ctx, &d);
    state(step, ncclProfilerProxyStepSendGPUWait, 0);
    if (version >= 4) state(step, ncclProfilerProxyStepSendPeerWait_v4, 0);
    if (version >= 3) { /* the network plugin's event under the step, as ncclProfilerCallback starts it */
      ncclProfilerNetIbDescr_v1_t ib = {.type = ncclProfileQp, .qp = {.device = 1, .wr_id = (uint64_t)s, .opcode = 0, .qpNum = qp, .length = 4096}};
      ncclProfilerNetSockDescr_v1_t so = {.type = ncclProfileSocket, .sock = {.fd = qp, .op = 0, .length = 4096}};
      memset(&d, 0, sizeof(d));
      SET_HEAD(d, ncclProfileNetPlugin, step, rank);
      nmsNetPluginDescr* net = version >= 5 ? &d.v5.netPlugin : (version == 4 ? (nmsNetPluginDescr*)&d.v4.netPlugin : (nmsNetPluginDescr*)&d.v3.netPlugin);
      net->id = use_socket ? (NCCL_PROFILER_NET_TYPE_SOCK | 1) : (NCCL_PROFILER_NET_TYPE_IB | 1);
      net->data = use_socket ? (void*)&so : (void*)&ib;
      void* nh = start(ctx, &d);
      if (version >= 4) state(nh, ncclProfilerNetPluginUpdate, 0);
      stop(nh); /* NCCL stops it whatever handle it got, NULL included */
    }
    state(step, ncclProfilerProxyStepSendWait, 4096);
    stop(step);
  }
  stop(op_handle);
}

/* The communicator's proxy thread: NCCL starts proxy ops there, after the main thread stopped the
 * tasks they belong to. Tasks are handed over through a small queue. */
typedef struct { void* handle; int is_coll, channel; } task_t;
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  task_t items[64];
  int head, count, done;
  void* ctx;
  int rank;
} proxy_queue_t;

static void proxy_push(proxy_queue_t* q, task_t t) {
  pthread_mutex_lock(&q->lock);
  while (q->count == 64) pthread_cond_wait(&q->changed, &q->lock);
  q->items[(q->head + q->count++) % 64] = t;
  pthread_cond_broadcast(&q->changed);
  pthread_mutex_unlock(&q->lock);
}

static void* proxy_thread(void* arg) {
  proxy_queue_t* q = arg;
  for (;;) {
    pthread_mutex_lock(&q->lock);
    while (q->count == 0 && !q->done) pthread_cond_wait(&q->changed, &q->lock);
    if (q->count == 0) { pthread_mutex_unlock(&q->lock); return NULL; }
    task_t t = q->items[q->head];
    q->head = (q->head + 1) % 64;
    q->count--;
    pthread_cond_broadcast(&q->changed);
    pthread_mutex_unlock(&q->lock);
    int rank = q->rank;
    if (t.is_coll) proxy(q->ctx, t.handle, rank % 2, (rank + 1) % 2, t.channel, 1000 + rank, 0);
    else proxy(q->ctx, t.handle, rank % 2, (rank + 1) % 2, 0, 50 + rank, 1);
  }
}

static void* comm_thread(void* arg) {
  int rank = (int)(intptr_t)arg;
  uint64_t comm = 0xC0FFEE0000ull + (uint64_t)rank / 2; /* two ranks per communicator */
  void* ctx = NULL;
  int mask = 0;
  if (do_init(&ctx, &mask, comm, "driver-comm", 2, rank % 2) != 0) { fprintf(stderr, "init failed\n"); exit(3); }
  proxy_queue_t q = {.lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER, .ctx = ctx, .rank = rank};
  pthread_t proxy_tid;
  pthread_create(&proxy_tid, NULL, proxy_thread, &q);
  /* DRIVER_GROUP=N: N collectives + N p2ps in one group (ncclGroupStart ... ncclGroupEnd), all in flight */
  const char* group_env = getenv("DRIVER_GROUP");
  int group_size = group_env ? atoi(group_env) : 1;
  if (group_size < 1 || group_size > 256) group_size = 1;
  const char* pace_env = getenv("DRIVER_PACE_US");
  int pace_us = pace_env ? atoi(pace_env) : 0;
  void *colls[256], *p2ps[256];
  for (int i0 = 0; i0 < iters; i0 += group_size) {
    int n = iters - i0 < group_size ? iters - i0 : group_size;
    void* group = group_start(ctx);
    for (int k = 0; k < n; k++) {
      colls[k] = coll_start(ctx, group, comm, rank % 2, (uint64_t)(i0 + k), 1024 + (size_t)(i0 + k));
      p2ps[k] = p2p_start(ctx, group, comm, rank % 2, (rank + 1) % 2, 100 + (size_t)(i0 + k));
    }
    for (int k = 0; k < n; k++) { stop(colls[k]); stop(p2ps[k]); }
    stop(group);
    for (int k = 0; k < n; k++) {
      proxy_push(&q, (task_t){colls[k], 1, (i0 + k) % 4});
      proxy_push(&q, (task_t){p2ps[k], 0, 0});
    }
    if (pace_us > 0) usleep((useconds_t)pace_us); /* DRIVER_PACE_US: a job's pace, for rates per second */
  }
  pthread_mutex_lock(&q.lock);
  q.done = 1;
  pthread_cond_broadcast(&q.changed);
  pthread_mutex_unlock(&q.lock);
  pthread_join(proxy_tid, NULL);
  const char* hold = getenv("DRIVER_HOLD_MS"); /* a communicator that lives on after its work */
  if (hold) usleep((useconds_t)atoi(hold) * 1000);
  fn_finalize(ctx);
  return NULL;
}

static void print_stats(void) {
  int (*stats)(uint64_t*, int) = dlsym(lib, "nmsNcclPluginStats");
  uint64_t v[6] = {0};
  if (stats) stats(v, 6);
  printf("recorded=%llu\ndropped_ring=%llu\ndropped_slots=%llu\ndropped_send=%llu\nsent=%llu\nbatches=%llu\n",
         (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2], (unsigned long long)v[3],
         (unsigned long long)v[4], (unsigned long long)v[5]);
}

static int run(void) {
  pthread_t tid[256];
  uint64_t t0 = now_ns();
  for (int t = 0; t < threads; t++) pthread_create(&tid[t], NULL, comm_thread, (void*)(intptr_t)t);
  for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
  int per_group = 2 + 2 * 3; /* coll, p2p, and per task an op and 2 steps */
  printf("expected=%d\n", threads * iters * per_group + (version >= 4 ? threads : 0));
  printf("max_call_ns=%llu\nwall_ns=%llu\n", (unsigned long long)max_call_ns, (unsigned long long)(now_ns() - t0));
  print_stats();
  return 0;
}

/* every exported version: found, named, its functions in the plugin, and callable through its own layout */
static int layout(void) {
  int bad = 0;
  for (int v = 1; v <= 6; v++) {
    char sym[32];
    snprintf(sym, sizeof(sym), "ncclProfiler_v%d", v);
    ncclProfiler_v6_t* p = dlsym(lib, sym);
    if (!p) { printf("%s=missing\n", sym); bad = 1; continue; }
    void* fns[] = {(void*)p->init, (void*)p->startEvent, (void*)p->stopEvent, (void*)p->recordEventState, (void*)p->finalize};
    int inside = 1;
    for (int i = 0; i < 5; i++) {
      Dl_info info;
      if (!fns[i] || !dladdr(fns[i], &info) || info.dli_fbase == NULL) inside = 0;
      Dl_info self;
      dladdr((void*)p, &self);
      if (inside && info.dli_fbase != self.dli_fbase) inside = 0;
    }
    version = v;
    fn_init = (void*)p->init; fn_start = (void*)p->startEvent; fn_stop = p->stopEvent;
    fn_state = (void*)p->recordEventState; fn_finalize = p->finalize;
    void* ctx = NULL;
    int mask = 0;
    int rc = do_init(&ctx, &mask, 0xAB00ull + (uint64_t)v, "layout", 2, 0);
    void* h = rc == 0 ? coll_start(ctx, NULL, 0xAB00ull + (uint64_t)v, 0, 1, 8) : NULL;
    if (h) stop(h);
    if (rc == 0) fn_finalize(ctx);
    printf("%s=name:%s functions_in_plugin:%d init:%d mask:%d handle:%d\n", sym, p->name ? p->name : "(null)", inside, rc,
           mask, h != NULL);
  }
  return bad;
}

static int init_only(void) {
  void* ctx = (void*)1;
  int mask = -1;
  int rc = do_init(&ctx, &mask, 0x1234, "init-test", 2, 0);
  printf("init=%d\ncontext_null=%d\n", rc, ctx == NULL);
  if (rc == 0) printf("mask=%d\n", mask);
  if (rc == 0) fn_finalize(ctx);
  return 0;
}

static ncclResult_t noop_start(void* c, void** h, void* d) { (void)c; (void)d; *h = NULL; return 0; }
static ncclResult_t noop_stop(void* h) { (void)h; return 0; }
static ncclResult_t noop_state(void* h, int s, void* a) { (void)h; (void)s; (void)a; return 0; }

/* ns per event (start + state + stop of one proxy step, NCCL's most frequent event), same loop both ways */
static double bench_loop(void* ctx, int n) {
  descr_t d;
  memset(&d, 0, sizeof(d));
  SET_HEAD(d, ncclProfileProxyStep, NULL, 0);
  args_t a;
  memset(&a, 0, sizeof(a));
  uint64_t t0 = now_ns();
  for (int i = 0; i < n; i++) {
    void* h = NULL;
    (version >= 5 ? &d.v5.proxyStep : &d.v1.proxyStep)->step = i;
    fn_start(ctx, &h, &d);
    fn_state(h, ncclProfilerProxyStepSendWait, &a);
    fn_stop(h);
  }
  return (double)(now_ns() - t0) / n;
}

static int bench(void) {
  void* ctx = NULL;
  int mask = 0;
  if (do_init(&ctx, &mask, 0xBE4C, "bench", 2, 0) != 0) return 3;
  ncclResult_t (*p_start)(void*, void**, void*) = fn_start;
  ncclResult_t (*p_stop)(void*) = fn_stop;
  ncclResult_t (*p_state)(void*, int, void*) = fn_state;
  double best_plugin = 1e18, best_noop = 1e18;
  for (int round = 0; round < 5; round++) { /* interleaved rounds, best of each: the machine is shared */
    fn_start = p_start; fn_stop = p_stop; fn_state = p_state;
    double p = bench_loop(ctx, iters);
    fn_start = noop_start; fn_stop = noop_stop; fn_state = noop_state;
    double n = bench_loop(ctx, iters);
    if (p < best_plugin) best_plugin = p;
    if (n < best_noop) best_noop = n;
    usleep(50000); /* lets the shipper drain the ring between rounds */
  }
  fn_finalize(ctx);
  printf("plugin_ns_per_event=%.1f\nnoop_ns_per_event=%.1f\n", best_plugin, best_noop);
  print_stats();
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 4) { fprintf(stderr, "usage: driver PLUGIN VERSION|- run|layout|init|bench [args]\n"); return 2; }
  const char* mode = argv[3];
  if (strcmp(mode, "layout") == 0) {
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    return layout();
  }
  if (load(argv[1], atoi(argv[2])) != 0) return 2;
  if (strcmp(mode, "init") == 0) return init_only();
  if (strcmp(mode, "bench") == 0) { iters = argc > 4 ? atoi(argv[4]) : 1000000; return bench(); }
  if (strcmp(mode, "run") == 0 && argc >= 6) {
    threads = atoi(argv[4]);
    iters = atoi(argv[5]);
    if (threads < 1 || threads > 256) return 2;
    return run();
  }
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
