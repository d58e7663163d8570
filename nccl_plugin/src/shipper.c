/* Configuration from the environment, and the shipper thread: ring -> batches -> the agent's socket. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "runtime.h"

nms_config nms_cfg;
nms_ring nms_records;
nms_counters nms_stats;
_Atomic uint32_t nms_abi_version;

static const char* const launcher_job_vars[] = {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID",
                                                "TORCHELASTIC_RUN_ID", NULL};

static int env_number(const char* name, long long lo, long long hi, long long dflt, long long* out) {
  const char* text = getenv(name);
  if (text == NULL || *text == '\0') { *out = dflt; return 0; }
  char* end;
  errno = 0;
  long long value = strtoll(text, &end, 0);
  if (errno || *end != '\0' || value < lo || value > hi) return -1;
  *out = value;
  return 0;
}

ncclResult_t nms_config_load(char* why, size_t why_len) {
  memset(&nms_cfg, 0, sizeof(nms_cfg));
  const char* path = getenv("NMS_NCCL_SOCKET");
  if (path == NULL || *path == '\0') path = NMS_DEFAULT_SOCKET;
  if (strlen(path) >= sizeof(nms_cfg.socket_path)) {
    snprintf(why, why_len, "NMS_NCCL_SOCKET is longer than %zu bytes", sizeof(nms_cfg.socket_path) - 1);
    return NCCL_INVALID_ARGUMENT;
  }
  strcpy(nms_cfg.socket_path, path);
  long long ring, slots, mask, flush, wait;
  if (env_number("NMS_NCCL_RING_SIZE", 16, 1 << 24, 8192, &ring) || (ring & (ring - 1))) {
    snprintf(why, why_len, "NMS_NCCL_RING_SIZE must be a power of two from 16 to 16777216");
    return NCCL_INVALID_ARGUMENT;
  }
  if (env_number("NMS_NCCL_SLOTS", 16, 1 << 22, 8192, &slots) || (slots & (slots - 1))) {
    snprintf(why, why_len, "NMS_NCCL_SLOTS must be a power of two from 16 to 4194304");
    return NCCL_INVALID_ARGUMENT;
  }
  if (env_number("NMS_NCCL_EVENT_MASK", 0, 0xFFFF, NMS_DEFAULT_MASK, &mask)) {
    snprintf(why, why_len, "NMS_NCCL_EVENT_MASK must be an integer from 0 to 0xFFFF");
    return NCCL_INVALID_ARGUMENT;
  }
  if (env_number("NMS_NCCL_FLUSH_MS", 1, 10000, 20, &flush) || env_number("NMS_NCCL_SEND_WAIT_MS", 0, 10000, 100, &wait)) {
    snprintf(why, why_len, "NMS_NCCL_FLUSH_MS (1..10000) or NMS_NCCL_SEND_WAIT_MS (0..10000) is not valid");
    return NCCL_INVALID_ARGUMENT;
  }
  nms_cfg.ring_size = (uint64_t)ring;
  nms_cfg.slots = (uint64_t)slots;
  nms_cfg.event_mask = (int)mask;
  nms_cfg.flush_ms = (int)flush;
  nms_cfg.send_wait_ms = (int)wait;
  /* the job id: the variable NMS_JOB_ID_VAR names, else the first launcher variable that is set */
  const char* var = getenv("NMS_JOB_ID_VAR");
  const char* job = (var && *var) ? getenv(var) : NULL;
  for (int i = 0; job == NULL && launcher_job_vars[i]; i++) job = getenv(launcher_job_vars[i]);
  if (job) snprintf(nms_cfg.job_id, sizeof(nms_cfg.job_id), "%s", job);
  return NCCL_OK;
}

/* --- the shipper thread ------------------------------------------------------------------------- */

static pthread_t thread;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int stopping;
static int sock = -1;
static uint64_t retry_at_ns, batch_seq;

static uint64_t now_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A connected datagram socket to the agent, or -1 (then retried at most every 200 ms). */
static int agent_socket(void) {
  if (sock >= 0) return sock;
  uint64_t now = now_ns(CLOCK_MONOTONIC);
  if (now < retry_at_ns) return -1;
  retry_at_ns = now + 200000000ull;
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  memcpy(addr.sun_path, nms_cfg.socket_path, sizeof(addr.sun_path));
  if (connect(fd, (struct sockaddr*)&addr, sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return sock = fd;
}

static void drop_socket(void) {
  if (sock >= 0) close(sock);
  sock = -1;
}

/* Sends one batch; a slow agent is waited for up to send_wait_ms, an absent one not at all. */
static int send_batch(uint8_t* buf, size_t count) {
  nms_batch_header* h = (nms_batch_header*)buf;
  memcpy(h->magic, NMS_WIRE_MAGIC, 4);
  h->version = NMS_WIRE_VERSION;
  h->header_size = sizeof(nms_batch_header);
  h->record_size = sizeof(nms_record);
  h->record_count = (uint16_t)count;
  h->pid = (uint32_t)getpid();
  h->batch_seq = ++batch_seq;
  h->dropped_ring = atomic_load(&nms_stats.dropped_ring);
  h->dropped_slots = atomic_load(&nms_stats.dropped_slots);
  h->dropped_send = atomic_load(&nms_stats.dropped_send);
  h->sent_ns = now_ns(CLOCK_REALTIME);
  memcpy(h->job_id, nms_cfg.job_id, sizeof(h->job_id));
  h->abi_version = atomic_load(&nms_abi_version);
  size_t len = sizeof(nms_batch_header) + count * sizeof(nms_record);
  int waited_ms = 0;
  for (;;) {
    int fd = agent_socket();
    if (fd < 0) return -1;
    if (send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)len) return 0;
    if ((errno != EAGAIN && errno != ENOBUFS) || waited_ms >= nms_cfg.send_wait_ms) {
      if (errno != EAGAIN && errno != ENOBUFS) drop_socket(); /* agent gone: reconnect later */
      return -1;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int step = nms_cfg.send_wait_ms - waited_ms < 10 ? nms_cfg.send_wait_ms - waited_ms : 10;
    poll(&p, 1, step);
    waited_ms += step;
  }
}

/* Ships what the ring holds. Without an agent the records stay in the ring (which then fills and
 * counts its drops) unless `final`: at the end they are counted as not sent. */
static void drain(uint8_t* buf, int final) {
  nms_record* recs = (nms_record*)(buf + sizeof(nms_batch_header));
  for (;;) {
    if (!final && agent_socket() < 0) return;
    size_t n = nms_ring_pop(&nms_records, recs, NMS_MAX_BATCH);
    if (n == 0) return;
    if (send_batch(buf, n) == 0) {
      atomic_fetch_add(&nms_stats.sent, n);
      atomic_fetch_add(&nms_stats.batches, 1);
    } else {
      atomic_fetch_add(&nms_stats.dropped_send, n);
      if (final) nms_cfg.send_wait_ms = 0; /* finalize must not wait a slow agent out batch by batch */
    }
  }
}

static void* shipper_main(void* arg) {
  uint8_t* buf = arg;
  pthread_mutex_lock(&lock);
  while (!stopping) {
    pthread_mutex_unlock(&lock);
    drain(buf, 0);
    pthread_mutex_lock(&lock);
    if (stopping) break;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)nms_cfg.flush_ms * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&wake, &lock, &until);
  }
  pthread_mutex_unlock(&lock);
  retry_at_ns = 0; /* one last connection attempt for what is left */
  drain(buf, 1);
  drop_socket();
  free(buf);
  return NULL;
}

int nms_shipper_start(void) {
  uint8_t* buf = malloc(sizeof(nms_batch_header) + NMS_MAX_BATCH * sizeof(nms_record));
  if (buf == NULL) return -1;
  memset(buf, 0, sizeof(nms_batch_header));
  stopping = 0;
  retry_at_ns = 0;
  if (pthread_create(&thread, NULL, shipper_main, buf) != 0) {
    free(buf);
    return -1;
  }
  return 0;
}

void nms_shipper_stop(void) {
  pthread_mutex_lock(&lock);
  stopping = 1;
  pthread_cond_signal(&wake);
  pthread_mutex_unlock(&lock);
  pthread_join(thread, NULL);
}
