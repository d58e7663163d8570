"""A fake pyverbs (rdma-core v44's Python bindings) for hosts without RDMA hardware.

Put tests/fakeverbs on sys.path / PYTHONPATH and code written against pyverbs runs unchanged: UD
SENDs between the devices of a JSON "fabric" ($NMS_FAKE_VERBS, see _fabric.py) travel as UDP
datagrams on loopback, so two processes (two agents) can talk RDMA UD to each other.

Faithful to rdma-core v44 (tests/test_fakeverbs.py checks what it can against the installed
python3-pyverbs, run by /usr/bin/python3):
  - module, class, method, property and enum names (a subset: pyverbs.enums, pyverbs_error, device,
    pd, cq, qp, addr, mr, wr), every enum value and enum class name, keyword names and defaults,
    positional-only arguments where the real (Cython) method takes no keywords;
  - call semantics: get_device_list / Context errors ('Failed to get devices list' without
    devices), Device.name as bytes, GID's 8-word form and its parsing rules, AHAttr's
    PyverbsUserError for is_global without gr, WRs copying their SGEs when built, a UD QP given a
    QPAttr ending in RTS with its qkey, mlx5's post_send/post_recv errors (ENOMEM for a full queue),
    start_poll/poll_next returning 0 or ENOENT, mlx5's query_rt_values_ex (sec 0, nsec = raw cycles),
    an mlx5-like GID table, RoCE v2 UDP source port = ibv_flow_label_to_udp_sport(flow label) (a
    random port per AH for flow label 0), the 40-byte GRH of a UD receive (RoCE v2 over IPv4: 20 zero
    bytes and the IPv4 header), byte_len = 40 + payload, IBV_WC_GRH, src_qp, silent drops for a bad
    qkey or no posted receive, CQs refusing IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
    (EOPNOTSUPP, as ConnectX-4/5).

Not faithful:
  - no NIC, no RoCE on a wire, no switches: the "wire" is UDP between loopback addresses; loss,
    port state and clocks come from the JSON file (re-read when it changes);
  - timestamps: the send completion's is the simulated HCA clock read just before the sendto, the
    receive completion's is the kernel's UDP receive stamp (SO_TIMESTAMPNS, CLOCK_REALTIME)
    converted to the receiving device's simulated HCA clock: cycles = (realtime_ns + offset) *
    (1 + drift_ppm * 1e-6) * hca_core_clock_khz / 1e6, masked by the timestamp mask;
  - only UD QPs, SEND / SEND_WITH_IMM, PD-created QPs (no QPInitAttrEx, SRQ, completion channels,
    memory windows, user-address / DM / DMA-buf MRs, AH from a WC, multicast);
  - MR buffers are Python bytearrays at fake addresses: an SGE only reaches an MR of this process;
  - receives are delivered only when a CQ of the device is polled (no events, no interrupts);
  - stricter than the real library where it has undefined behaviour: end_poll/poll_next without a
    successful start_poll, read_* outside a poll or of a field the CQ was not created with, MR
    read/write out of bounds and post_send on a QP in RESET/INIT/RTR raise instead.
"""
