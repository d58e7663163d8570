"""pyverbs.enums as rdma-core v44 has it: IntEnum classes named after the C enums, whose members are
also module-level constants (pyverbs.enums.IBV_QPT_UD is ibv_qp_type.IBV_QPT_UD == 4), and a few plain
ints (IBV_LINK_LAYER_*, IBV_WC_STANDARD_FLAGS). A subset of the real module; every value is the real
one (tests/test_fakeverbs.py checks names, values and class names against the installed pyverbs).

rdma-core v59 removed pyverbs.enums: the classes live in pyverbs.libibverbs_enums there and, built
with Cython >= 3.1, their members are no longer module-level names. This fake follows v44."""

from enum import IntEnum


class ibv_qp_type(IntEnum):
    IBV_QPT_RC = 2
    IBV_QPT_UC = 3
    IBV_QPT_UD = 4
    IBV_QPT_RAW_PACKET = 8
    IBV_QPT_XRC_SEND = 9
    IBV_QPT_XRC_RECV = 10
    IBV_QPT_DRIVER = 255


class ibv_qp_state(IntEnum):
    IBV_QPS_RESET = 0
    IBV_QPS_INIT = 1
    IBV_QPS_RTR = 2
    IBV_QPS_RTS = 3
    IBV_QPS_SQD = 4
    IBV_QPS_SQE = 5
    IBV_QPS_ERR = 6
    IBV_QPS_UNKNOWN = 7


class ibv_wc_status(IntEnum):
    IBV_WC_SUCCESS = 0
    IBV_WC_LOC_LEN_ERR = 1
    IBV_WC_LOC_QP_OP_ERR = 2
    IBV_WC_LOC_EEC_OP_ERR = 3
    IBV_WC_LOC_PROT_ERR = 4
    IBV_WC_WR_FLUSH_ERR = 5
    IBV_WC_MW_BIND_ERR = 6
    IBV_WC_BAD_RESP_ERR = 7
    IBV_WC_LOC_ACCESS_ERR = 8
    IBV_WC_REM_INV_REQ_ERR = 9
    IBV_WC_REM_ACCESS_ERR = 10
    IBV_WC_REM_OP_ERR = 11
    IBV_WC_RETRY_EXC_ERR = 12
    IBV_WC_RNR_RETRY_EXC_ERR = 13
    IBV_WC_LOC_RDD_VIOL_ERR = 14
    IBV_WC_REM_INV_RD_REQ_ERR = 15
    IBV_WC_REM_ABORT_ERR = 16
    IBV_WC_INV_EECN_ERR = 17
    IBV_WC_INV_EEC_STATE_ERR = 18
    IBV_WC_FATAL_ERR = 19
    IBV_WC_RESP_TIMEOUT_ERR = 20
    IBV_WC_GENERAL_ERR = 21
    IBV_WC_TM_ERR = 22
    IBV_WC_TM_RNDV_INCOMPLETE = 23


class ibv_wc_opcode(IntEnum):
    IBV_WC_SEND = 0
    IBV_WC_RDMA_WRITE = 1
    IBV_WC_RDMA_READ = 2
    IBV_WC_COMP_SWAP = 3
    IBV_WC_FETCH_ADD = 4
    IBV_WC_BIND_MW = 5
    IBV_WC_LOCAL_INV = 6
    IBV_WC_TSO = 7
    IBV_WC_ATOMIC_WRITE = 9
    IBV_WC_RECV = 128
    IBV_WC_RECV_RDMA_WITH_IMM = 129
    IBV_WC_TM_ADD = 130
    IBV_WC_TM_DEL = 131
    IBV_WC_TM_SYNC = 132
    IBV_WC_TM_RECV = 133
    IBV_WC_TM_NO_TAG = 134
    IBV_WC_DRIVER2 = 136
    IBV_WC_DRIVER3 = 137


class ibv_wr_opcode(IntEnum):
    IBV_WR_RDMA_WRITE = 0
    IBV_WR_RDMA_WRITE_WITH_IMM = 1
    IBV_WR_SEND = 2
    IBV_WR_SEND_WITH_IMM = 3
    IBV_WR_RDMA_READ = 4
    IBV_WR_ATOMIC_CMP_AND_SWP = 5
    IBV_WR_ATOMIC_FETCH_AND_ADD = 6
    IBV_WR_LOCAL_INV = 7
    IBV_WR_BIND_MW = 8
    IBV_WR_SEND_WITH_INV = 9
    IBV_WR_TSO = 10
    IBV_WR_ATOMIC_WRITE = 15


class ibv_send_flags(IntEnum):
    IBV_SEND_FENCE = 1
    IBV_SEND_SIGNALED = 2
    IBV_SEND_SOLICITED = 4
    IBV_SEND_INLINE = 8
    IBV_SEND_IP_CSUM = 16


class ibv_access_flags(IntEnum):
    IBV_ACCESS_LOCAL_WRITE = 1
    IBV_ACCESS_REMOTE_WRITE = 2
    IBV_ACCESS_REMOTE_READ = 4
    IBV_ACCESS_REMOTE_ATOMIC = 8
    IBV_ACCESS_MW_BIND = 16
    IBV_ACCESS_ZERO_BASED = 32
    IBV_ACCESS_ON_DEMAND = 64
    IBV_ACCESS_HUGETLB = 128
    IBV_ACCESS_RELAXED_ORDERING = 1048576


class ibv_create_cq_wc_flags(IntEnum):
    IBV_WC_EX_WITH_BYTE_LEN = 1
    IBV_WC_EX_WITH_IMM = 2
    IBV_WC_EX_WITH_QP_NUM = 4
    IBV_WC_EX_WITH_SRC_QP = 8
    IBV_WC_EX_WITH_SLID = 16
    IBV_WC_EX_WITH_SL = 32
    IBV_WC_EX_WITH_DLID_PATH_BITS = 64
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP = 128
    IBV_WC_EX_WITH_CVLAN = 256
    IBV_WC_EX_WITH_FLOW_TAG = 512
    IBV_WC_EX_WITH_TM_INFO = 1024
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK = 2048


class ibv_wc_flags(IntEnum):
    IBV_WC_GRH = 1
    IBV_WC_WITH_IMM = 2
    IBV_WC_IP_CSUM_OK = 4
    IBV_WC_WITH_INV = 8
    IBV_WC_TM_SYNC_REQ = 16
    IBV_WC_TM_MATCH = 32
    IBV_WC_TM_DATA_VALID = 64


class ibv_values_mask(IntEnum):
    IBV_VALUES_MASK_RAW_CLOCK = 1


class ibv_gid_type_sysfs(IntEnum):
    IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = 0
    IBV_GID_TYPE_SYSFS_ROCE_V2 = 1


class ibv_port_state(IntEnum):
    IBV_PORT_NOP = 0
    IBV_PORT_DOWN = 1
    IBV_PORT_INIT = 2
    IBV_PORT_ARMED = 3
    IBV_PORT_ACTIVE = 4
    IBV_PORT_ACTIVE_DEFER = 5


class ibv_mtu(IntEnum):
    IBV_MTU_256 = 1
    IBV_MTU_512 = 2
    IBV_MTU_1024 = 3
    IBV_MTU_2048 = 4
    IBV_MTU_4096 = 5


class ibv_qp_attr_mask(IntEnum):
    IBV_QP_STATE = 1
    IBV_QP_CUR_STATE = 2
    IBV_QP_EN_SQD_ASYNC_NOTIFY = 4
    IBV_QP_ACCESS_FLAGS = 8
    IBV_QP_PKEY_INDEX = 16
    IBV_QP_PORT = 32
    IBV_QP_QKEY = 64
    IBV_QP_AV = 128
    IBV_QP_PATH_MTU = 256
    IBV_QP_TIMEOUT = 512
    IBV_QP_RETRY_CNT = 1024
    IBV_QP_RNR_RETRY = 2048
    IBV_QP_RQ_PSN = 4096
    IBV_QP_MAX_QP_RD_ATOMIC = 8192
    IBV_QP_ALT_PATH = 16384
    IBV_QP_MIN_RNR_TIMER = 32768
    IBV_QP_SQ_PSN = 65536
    IBV_QP_MAX_DEST_RD_ATOMIC = 131072
    IBV_QP_PATH_MIG_STATE = 262144
    IBV_QP_CAP = 524288
    IBV_QP_DEST_QPN = 1048576
    IBV_QP_RATE_LIMIT = 33554432


class ibv_node_type(IntEnum):
    IBV_NODE_UNKNOWN = -1
    IBV_NODE_CA = 1
    IBV_NODE_SWITCH = 2
    IBV_NODE_ROUTER = 3
    IBV_NODE_RNIC = 4
    IBV_NODE_USNIC = 5
    IBV_NODE_USNIC_UDP = 6
    IBV_NODE_UNSPECIFIED = 7


class ibv_transport_type(IntEnum):
    IBV_TRANSPORT_UNKNOWN = -1
    IBV_TRANSPORT_IB = 0
    IBV_TRANSPORT_IWARP = 1
    IBV_TRANSPORT_USNIC = 2
    IBV_TRANSPORT_USNIC_UDP = 3


class ibv_mig_state(IntEnum):
    IBV_MIG_MIGRATED = 0
    IBV_MIG_REARM = 1
    IBV_MIG_ARMED = 2


for _cls in (
    ibv_qp_type,
    ibv_qp_state,
    ibv_wc_status,
    ibv_wc_opcode,
    ibv_wr_opcode,
    ibv_send_flags,
    ibv_access_flags,
    ibv_create_cq_wc_flags,
    ibv_wc_flags,
    ibv_values_mask,
    ibv_gid_type_sysfs,
    ibv_port_state,
    ibv_mtu,
    ibv_qp_attr_mask,
    ibv_node_type,
    ibv_transport_type,
    ibv_mig_state,
):
    globals().update(_cls.__members__)
del _cls

IBV_LINK_LAYER_ETHERNET = 2
IBV_LINK_LAYER_INFINIBAND = 1
IBV_LINK_LAYER_UNSPECIFIED = 0
IBV_QPF_GRH_REQUIRED = 1
IBV_WC_STANDARD_FLAGS = 127
