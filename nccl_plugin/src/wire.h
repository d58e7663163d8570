/* Wire format v1: what the plugin sends to the agent, one Unix datagram per batch.
 * A 128-byte header, then record_count fixed-size 128-byte records; every integer little-endian,
 * strings NUL-padded. nccl_plugin/decode.py is the reader; docs/nccl_plugin.md the description. */
#ifndef NMS_NCCL_WIRE_H
#define NMS_NCCL_WIRE_H

#include <stdint.h>

#define NMS_WIRE_MAGIC "NMSN"
#define NMS_WIRE_VERSION 1
#define NMS_MAX_BATCH 128 /* records per datagram: 16 KiB + header */

enum { NMS_REC_COLL = 1, NMS_REC_P2P = 2, NMS_REC_PROXY_OP = 3, NMS_REC_PROXY_STEP = 4, NMS_REC_COMM = 5 };
enum { NMS_NET_NONE = 0, NMS_NET_IB = 1, NMS_NET_SOCKET = 2 };
/* proxy step states, in the order of nms_proxy_step.state_ns */
enum { NMS_ST_SEND_GPU_WAIT, NMS_ST_SEND_PEER_WAIT, NMS_ST_SEND_WAIT, NMS_ST_RECV_WAIT, NMS_ST_RECV_FLUSH_WAIT,
       NMS_ST_RECV_GPU_WAIT, NMS_ST_COUNT };

typedef struct {
  char magic[4];
  uint16_t version, header_size, record_size, record_count;
  uint32_t pid;
  uint64_t batch_seq;
  uint64_t dropped_ring;  /* records lost so far: ring full (cumulative) */
  uint64_t dropped_slots; /* events not recorded: no free event slot (cumulative) */
  uint64_t dropped_send;  /* records lost: agent socket absent or too slow (cumulative) */
  uint64_t sent_ns;
  char job_id[64];
  uint32_t abi_version; /* the ncclProfiler_vN NCCL loaded */
  uint32_t reserved;
} nms_batch_header;

typedef struct {
  uint64_t seq;
  uint64_t count;
  int32_t root_or_peer;
  uint8_t nchannels, nwarps, reserved[2];
  char func[16], datatype[16], algo[16], proto[8];
} nms_coll_payload;

typedef struct {
  int32_t peer, n_steps, chunk_size, pid;
  uint8_t channel, is_send;
  uint16_t reserved;
  uint32_t steps;
  uint64_t trans_bytes;
} nms_proxy_op_payload;

typedef struct {
  int32_t step, peer;
  uint8_t channel, is_send, net_type, reserved;
  uint32_t net_events;
  uint64_t trans_size;
  int32_t connection; /* IB: QP number; socket: fd */
  int32_t net_device;
  uint64_t net_bytes;
  uint32_t state_ns[NMS_ST_COUNT]; /* ns after start the step entered each state; 0 = not seen */
} nms_proxy_step_payload;

typedef struct {
  int32_t nranks, nnodes;
  char comm_name[64];
} nms_comm_payload;

typedef struct {
  uint8_t kind, flags; /* flags bit 0: parent_id is known */
  uint16_t reserved;
  int32_t rank;
  uint64_t comm_id, event_id, parent_id, start_ns, stop_ns;
  union {
    nms_coll_payload coll;
    nms_proxy_op_payload op;
    nms_proxy_step_payload step;
    nms_comm_payload comm;
    uint8_t bytes[80];
  };
} nms_record;

_Static_assert(sizeof(nms_batch_header) == 128, "header is 128 bytes");
_Static_assert(sizeof(nms_record) == 128, "record is 128 bytes");
_Static_assert(sizeof(nms_coll_payload) == 80, "coll payload");
_Static_assert(sizeof(nms_proxy_step_payload) <= 80, "step payload");

#endif
