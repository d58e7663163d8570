/* The NCCL profiler plugin ABI, versions 1 to 6, as this plugin and its test driver see it.
 *
 * Written from the layouts of NVIDIA/nccl's src/include/plugin/profiler/profiler_v{1..6}.h and
 * net_ib_v1.h / net_socket_v1.h (NCCL 2.23 .. 2.29). tests/nccl/abi_layout.txt holds the sizes and
 * offsets those headers give; tests/test_nccl_abi.py checks these definitions against it. */
#ifndef NMS_NCCL_ABI_H
#define NMS_NCCL_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef int ncclResult_t; /* ncclSuccess 0, ncclSystemError 2, ncclInternalError 3, ncclInvalidArgument 4, ncclInvalidUsage 5 */
#define NCCL_OK 0
#define NCCL_SYSTEM_ERROR 2
#define NCCL_INVALID_ARGUMENT 4
#define NCCL_INVALID_USAGE 5

typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
#define NCCL_LOG_WARN 2
#define NCCL_LOG_INFO 3
#define NCCL_INIT_FLAG 1UL

/* event types (activation mask bits) */
enum {
  ncclProfileGroup = 1 << 0, ncclProfileColl = 1 << 1, ncclProfileP2p = 1 << 2, ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4, ncclProfileProxyCtrl = 1 << 5, ncclProfileKernelCh = 1 << 6,
  ncclProfileNetPlugin = 1 << 7, ncclProfileGroupApi = 1 << 8, ncclProfileCollApi = 1 << 9,
  ncclProfileP2pApi = 1 << 10, ncclProfileKernelLaunch = 1 << 11,
};

/* event states (recordEventState) this plugin uses */
enum {
  ncclProfilerProxyStepSendGPUWait = 8, ncclProfilerProxyStepSendWait = 9, ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11, ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyStepSendPeerWait_v4 = 20, ncclProfilerNetPluginUpdate = 21,
};

/* network plugin events: descr.netPlugin.id = type | version */
#define NCCL_PROFILER_NET_VER_MASK 0xFFFFu
#define NCCL_PROFILER_NET_TYPE_MASK 0xFFFF0000u
#define NCCL_PROFILER_NET_TYPE_IB (1u << 16)
#define NCCL_PROFILER_NET_TYPE_SOCK (2u << 16)
#define ncclProfileQp 1
#define ncclProfileSocket 1

typedef struct {
  uint8_t type;
  union {
    struct { int device; uint64_t wr_id; int opcode; int qpNum; size_t length; } qp;
  };
} ncclProfilerNetIbDescr_v1_t;

typedef struct {
  uint8_t type;
  union {
    struct { int fd; int op; size_t length; } sock;
  };
} ncclProfilerNetSockDescr_v1_t;

/* --- descriptor union members shared by several versions --- */
typedef struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } nmsProxyOpDescr;
typedef struct { int step; } nmsProxyStepDescr;
typedef struct { int64_t id; void* data; } nmsNetPluginDescr;

/* v1: numeric func / datatype / algo / proto */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name; uint64_t commHash; uint64_t seqNumber; uint8_t func; void const* sendBuff; void* recvBuff;
      size_t count; int root; uint8_t datatype; uint32_t op; size_t trafficBytes; uint8_t nMaxChannels;
      uint8_t nWarps; uint8_t algo; uint8_t proto; int isCollnet; int isNvls;
    } coll;
    struct { const char* name; uint64_t commHash; uint8_t func; void* buff; uint8_t datatype; size_t count; int peer; } p2p;
    nmsProxyOpDescr proxyOp;
    nmsProxyStepDescr proxyStep;
  };
} ncclProfilerEventDescr_v1_t;

/* v2: strings, trafficBytes */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name; uint64_t commHash; uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff;
      size_t count; int root; const char* datatype; size_t trafficBytes; uint8_t nMaxChannels; uint8_t nWarps;
      const char* algo; const char* proto;
    } coll;
    struct { const char* name; uint64_t commHash; const char* func; void* buff; const char* datatype; size_t count; int peer; } p2p;
    nmsProxyOpDescr proxyOp;
    nmsProxyStepDescr proxyStep;
  };
} ncclProfilerEventDescr_v2_t;

/* v3: no trafficBytes; kernel channel and network plugin events */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name; uint64_t commHash; uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff;
      size_t count; int root; const char* datatype; uint8_t nMaxChannels; uint8_t nWarps; const char* algo;
      const char* proto;
    } coll;
    struct { const char* name; uint64_t commHash; const char* func; void* buff; const char* datatype; size_t count; int peer; } p2p;
    nmsProxyOpDescr proxyOp;
    nmsProxyStepDescr proxyStep;
    struct { uint8_t channelId; } kernelCh;
    nmsNetPluginDescr netPlugin;
  };
} ncclProfilerEventDescr_v3_t;

/* v4: comm name/hash moved to init; nChannels */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff; size_t count; int root;
      const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto;
    } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels; } p2p;
    nmsProxyOpDescr proxyOp;
    nmsProxyStepDescr proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    nmsNetPluginDescr netPlugin;
  };
} ncclProfilerEventDescr_v4_t;

/* v5 and v6 share the members this plugin reads; v6 adds copy-engine members (bigger union) */
#define NMS_V5_COMMON_MEMBERS                                                                                   \
  struct { bool graphCaptured; int groupDepth; } groupApi;                                                      \
  struct { const char* func; size_t count; const char* datatype; int root; void* stream; bool graphCaptured; } collApi; \
  struct { const char* func; size_t count; const char* datatype; void* stream; bool graphCaptured; } p2pApi;   \
  struct { void* stream; } kernelLaunch;                                                                        \
  struct {                                                                                                      \
    uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff; size_t count; int root;         \
    const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto; void* parentGroup; \
  } coll;                                                                                                       \
  struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels; void* parentGroup; } p2p; \
  nmsProxyOpDescr proxyOp;                                                                                      \
  nmsProxyStepDescr proxyStep;                                                                                  \
  struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                                                      \
  nmsNetPluginDescr netPlugin;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union { NMS_V5_COMMON_MEMBERS };
} ncclProfilerEventDescr_v5_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    NMS_V5_COMMON_MEMBERS
    struct {
      uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff; size_t count; int root;
      const char* datatype; const char* syncStrategy; bool intraBatchSync; uint32_t batchSize; uint32_t numBatches;
      uint32_t ceSeqNum; void* stream;
    } ceColl;
    struct { bool isComplete; int nRanks; } ceCollSync;
    struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

/* state arguments */
typedef union {
  struct { size_t transSize; int steps; } proxyOp;
  struct { int appendedProxyOps; } proxyCtrl;
} ncclProfilerEventStateArgs_v1_t; /* v1, v2, v3 */

typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} ncclProfilerEventStateArgs_v4_t; /* v4, v5, v6 */

typedef int ncclProfilerEventState_t;

/* the exported structs: name + five functions; init's arguments changed in v4 and v5 */
#define NMS_PROFILER_STRUCT(ver, init_args, descr_t, args_t)                                                   \
  typedef struct {                                                                                              \
    const char* name;                                                                                           \
    ncclResult_t (*init) init_args;                                                                             \
    ncclResult_t (*startEvent)(void* context, void** eHandle, descr_t* eDescr);                                 \
    ncclResult_t (*stopEvent)(void* eHandle);                                                                   \
    ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState, args_t* eStateArgs);       \
    ncclResult_t (*finalize)(void* context);                                                                    \
  } ncclProfiler_v##ver##_t;

#define NMS_INIT_V1 (void** context, int* eActivationMask)
#define NMS_INIT_V4 (void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes, \
                     int nranks, int rank, ncclDebugLogger_t logfn)
#define NMS_INIT_V5 (void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,     \
                     int nranks, int rank, ncclDebugLogger_t logfn)

NMS_PROFILER_STRUCT(1, NMS_INIT_V1, ncclProfilerEventDescr_v1_t, ncclProfilerEventStateArgs_v1_t)
NMS_PROFILER_STRUCT(2, NMS_INIT_V1, ncclProfilerEventDescr_v2_t, ncclProfilerEventStateArgs_v1_t)
NMS_PROFILER_STRUCT(3, NMS_INIT_V1, ncclProfilerEventDescr_v3_t, ncclProfilerEventStateArgs_v1_t)
NMS_PROFILER_STRUCT(4, NMS_INIT_V4, ncclProfilerEventDescr_v4_t, ncclProfilerEventStateArgs_v4_t)
NMS_PROFILER_STRUCT(5, NMS_INIT_V5, ncclProfilerEventDescr_v5_t, ncclProfilerEventStateArgs_v4_t)
NMS_PROFILER_STRUCT(6, NMS_INIT_V5, ncclProfilerEventDescr_v6_t, ncclProfilerEventStateArgs_v4_t)

#endif
