"""pyverbs.device: get_device_list, Device, Context, DeviceAttr, DeviceAttrEx, PortAttr.

Each configured device looks like a ConnectX-5 on a RoCE (Ethernet) port: one port, a GID table in
mlx5's order (0: fe80::<EUI-64> RoCE v1, 1: the same RoCE v2, 2: ::ffff:<IPv4> RoCE v1, 3: the same
RoCE v2; the other entries up to gid_tbl_len are empty: the zero GID, type RoCE v1, as libibverbs
reports an empty entry), a free-running HCA clock read by query_rt_values_ex as mlx5 does it
(seconds 0, nanoseconds = the raw cycle counter).
"""

import errno
import time

import pyverbs.enums as e
from pyverbs import _fabric
from pyverbs.addr import GID, _gid_raw_to_str
from pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError


class Device(_fabric.PyverbsObject):
    """An entry of get_device_list(): name (bytes), node type, transport type, GUID, index."""

    def __init__(self, name, guid, node_type, transport_type, index):
        super().__init__()
        self._name, self._guid, self._node_type, self._transport_type, self._index = (name, guid, node_type,
                                                                                      transport_type, index)

    @property
    def name(self):
        return self._name

    @property
    def node_type(self):
        return self._node_type

    @property
    def transport_type(self):
        return self._transport_type

    @property
    def guid(self):
        return self._guid

    @property
    def index(self):
        return self._index

    def __str__(self):
        return 'Device {dev}, node type {ntype}, transport type {ttype}, guid {guid}, index {index}'.format(
            dev=self.name.decode(), ntype='CA', ttype='IB', guid=f'{self.guid:016x}', index=self.index)


def get_device_list():
    """Devices of $NMS_FAKE_VERBS. None configured: PyverbsRDMAError('Failed to get devices list'), as
    the real one raises on a host without RDMA devices (ibv_get_device_list returns NULL)."""
    cfg = _fabric.config()
    if cfg is None or not cfg.devices:
        raise PyverbsRDMAError('Failed to get devices list')
    return [Device(d.name.encode(), d.guid, e.IBV_NODE_CA, e.IBV_TRANSPORT_IB, d.index) for d in cfg.devices.values()]


class Context(_fabric.PyverbsCM):
    """An opened device. Context(name='fake_0'); closing it closes everything created from it."""

    def __init__(self, **kwargs):
        super().__init__()
        self._dev = None
        self._name = kwargs.get('name')
        if kwargs.get('cmid') is not None or kwargs.get('cmd_fd') is not None or kwargs.get('attr') is not None:
            raise PyverbsRDMAError('Fake pyverbs: Context(cmid=/cmd_fd=/attr=) is not supported', errno.EOPNOTSUPP)
        if self._name is None:
            raise PyverbsUserError('Device name must be provided')
        self._dev = _fabric.open_device(self._name)

    def close(self):
        if self._dev is not None:
            self._close_dependents()
            dev, self._dev = self._dev, None
            _fabric.close_device(dev)

    def _cfg(self):
        if self._dev is None:
            raise PyverbsRDMAError(f'Fake pyverbs: device {self._name} is closed', errno.EBADF)
        return self._dev.current()

    @property
    def name(self):
        return self._name

    @property
    def num_comp_vectors(self):
        return 1

    def query_device(self):
        return _attrs(DeviceAttr, self._cfg())

    def query_device_ex(self, ex_input=None):
        return _attrs(DeviceAttrEx, self._cfg())

    def query_port(self, port_num, /):
        cfg = self._cfg()
        if port_num != 1:
            raise PyverbsRDMAError(f'Failed to query port {port_num}', errno.EINVAL)
        return _attrs(PortAttr, cfg)

    def query_pkey(self, port_num, index):
        self._cfg()
        if port_num != 1 or not 0 <= index < _fabric.PKEY_TBL_LEN:
            raise PyverbsRDMAError(f'Failed to query pkey {index} of port {port_num}')
        return 0xFFFF

    def query_gid(self, port_num, index):
        cfg = self._cfg()
        if port_num != 1 or not 0 <= index < _fabric.GID_TBL_LEN:
            raise PyverbsRDMAError(f'Failed to query gid {index} of port {port_num}')
        gid = GID()
        if index < len(cfg.gids):
            gid.gid = _gid_raw_to_str(cfg.gids[index][0])
        return gid

    def query_gid_type(self, port_num, index):
        cfg = self._cfg()
        if port_num != 1 or not 0 <= index < _fabric.GID_TBL_LEN:
            raise PyverbsRDMAError(f'Failed to query gid type of port {port_num} and gid index {index}',
                                   errno.EINVAL)
        if index < len(cfg.gids):
            return int(cfg.gids[index][1])
        return int(e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1)

    def query_rt_values_ex(self, comp_mask=e.IBV_VALUES_MASK_RAW_CLOCK):
        cfg = self._cfg()
        if comp_mask != e.IBV_VALUES_MASK_RAW_CLOCK:
            raise PyverbsRDMAError('Failed to query real time values with requested comp_mask')
        return 0, cfg.cycles(time.time_ns())


def _attrs(cls, cfg):
    """DeviceAttr, DeviceAttrEx, PortAttr take no arguments (real pyverbs fills their C struct)."""
    obj = cls()
    obj._cfg = cfg
    return obj


class DeviceAttr(_fabric.PyverbsObject):
    """ibv_device_attr of a ConnectX-5 (the values the fake enforces: max_qp_wr, max_sge, max_cqe)."""

    def __init__(self):
        super().__init__()
        self._cfg = None

    fw_version = property(lambda self: '16.35.2000')
    node_guid = property(lambda self: self._cfg.guid)
    sys_image_guid = property(lambda self: self._cfg.guid)
    max_mr_size = property(lambda self: 0xFFFFFFFFFFFFFFFF)
    page_size_cap = property(lambda self: 0xFFFFFFFFFFFFF000)
    vendor_id = property(lambda self: 0x02C9)
    vendor_part_id = property(lambda self: 4119)
    hw_ver = property(lambda self: 0)
    max_qp = property(lambda self: 262144)
    max_qp_wr = property(lambda self: _fabric.MAX_QP_WR)
    max_sge = property(lambda self: _fabric.MAX_SGE)
    max_cq = property(lambda self: 16777216)
    max_cqe = property(lambda self: _fabric.MAX_CQE)
    max_mr = property(lambda self: 16777216)
    max_pd = property(lambda self: 16777216)
    max_ah = property(lambda self: 0x7FFFFFFF)
    max_pkeys = property(lambda self: _fabric.PKEY_TBL_LEN)
    phys_port_cnt = property(lambda self: 1)

    def __str__(self):
        return f'Device attributes:\nFW version: {self.fw_version}\nPhysical ports: {self.phys_port_cnt}\n'


class DeviceAttrEx(_fabric.PyverbsObject):
    """ibv_device_attr_ex: hca_core_clock in kHz and completion_timestamp_mask from the configuration."""

    def __init__(self):
        super().__init__()
        self._cfg = None
        self.comp_mask = 0

    orig_attr = property(lambda self: _attrs(DeviceAttr, self._cfg))
    completion_timestamp_mask = property(lambda self: self._cfg.mask)
    hca_core_clock = property(lambda self: self._cfg.khz)
    device_cap_flags_ex = property(lambda self: 0)
    phys_port_cnt_ex = property(lambda self: 1)


class PortAttr(_fabric.PyverbsObject):
    """ibv_port_attr of a RoCE port (state from the configuration's port_state)."""

    def __init__(self):
        super().__init__()
        self._cfg = None

    state = property(lambda self: int(self._cfg.port_state))
    max_mtu = property(lambda self: int(e.IBV_MTU_4096))
    active_mtu = property(lambda self: int(self._cfg.active_mtu))
    gid_tbl_len = property(lambda self: _fabric.GID_TBL_LEN)
    port_cap_flags = property(lambda self: 0x04010000)
    max_msg_sz = property(lambda self: 0x40000000)
    pkey_tbl_len = property(lambda self: _fabric.PKEY_TBL_LEN)
    lid = property(lambda self: 0)
    sm_lid = property(lambda self: 0)
    lmc = property(lambda self: 0)
    link_layer = property(lambda self: int(e.IBV_LINK_LAYER_ETHERNET))
    phys_state = property(lambda self: 5 if self._cfg.port_state == e.IBV_PORT_ACTIVE else 3)  # LinkUp / Disabled
    active_width = property(lambda self: 2)  # 4X
    active_speed = property(lambda self: 32)  # EDR (25 Gb/s per lane)
    flags = property(lambda self: 1)  # IBV_QPF_GRH_REQUIRED

    def __str__(self):
        return f'Port state: {self.state}\nActive MTU: {self.active_mtu}\nGID table len: {self.gid_tbl_len}\n'
