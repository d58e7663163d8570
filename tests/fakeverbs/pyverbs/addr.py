"""pyverbs.addr: GID, GlobalRoute, AHAttr, AH."""

import errno

from pyverbs import _fabric
from pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError


def _gid_str_to_raw(val) -> bytes:
    """pyverbs.utils.gid_str_to_array: only the 8-word form 'xxxx:xxxx:...:xxxx' (four hex digits each)."""
    words = val.split(':')
    if len(words) != 8:
        raise PyverbsUserError(f'Invalid GID value ({words})')
    if any(len(w) != 4 for w in words):
        raise PyverbsUserError(f'Invalid GID value ({words})')
    int(''.join(words), 16)  # ValueError on a non-hex digit, like the real one
    return bytes.fromhex(''.join(words))


def _gid_raw_to_str(raw: bytes) -> str:
    h = raw.hex()
    return ':'.join(h[i:i + 4] for i in range(0, 32, 4))


class GID(_fabric.PyverbsObject):
    """ibv_gid; str() and .gid give the 8-word form."""

    def __init__(self, val=None):
        super().__init__()
        self._raw = bytes(16)
        if val is not None:
            self._raw = _gid_str_to_raw(val)

    @property
    def gid(self):
        return self.__str__()

    @gid.setter
    def gid(self, val):
        self._raw = _gid_str_to_raw(val)

    def __str__(self):
        return _gid_raw_to_str(self._raw)


class GlobalRoute(_fabric.PyverbsObject):
    """ibv_global_route: the GRH fields of an address handle. (Real pyverbs reads garbage when dgid
    is None; this one uses the zero GID.)"""

    def __init__(self, dgid=None, flow_label=0, sgid_index=0, hop_limit=1, traffic_class=0):
        super().__init__()
        if dgid is not None and not isinstance(dgid, GID):
            raise TypeError(
                f"Argument 'dgid' has incorrect type (expected pyverbs.addr.GID, got {type(dgid).__name__})"
            )
        self._dgid = dgid._raw if dgid is not None else bytes(16)
        self.flow_label = flow_label
        self.sgid_index = sgid_index
        self.hop_limit = hop_limit
        self.traffic_class = traffic_class

    @property
    def dgid(self):
        return _gid_raw_to_str(self._dgid)

    @dgid.setter
    def dgid(self, val):
        self._dgid = _gid_str_to_raw(val)

    flow_label = _fabric.c_field('flow_label', 0xFFFFFFFF)
    sgid_index = _fabric.c_field('sgid_index', 0xFF)
    hop_limit = _fabric.c_field('hop_limit', 0xFF)
    traffic_class = _fabric.c_field('traffic_class', 0xFF)

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('DGID', self.dgid) + f.format('flow label', self.flow_label)
                + f.format('sgid index', self.sgid_index) + f.format('hop limit', self.hop_limit)
                + f.format('traffic class', self.traffic_class))


class AHAttr(_fabric.PyverbsObject):
    """ibv_ah_attr. The GRH properties read None unless is_global, like the real one."""

    def __init__(self, dlid=0, sl=0, src_path_bits=0, static_rate=0, is_global=0, port_num=1, gr=None):
        super().__init__()
        if gr is not None and not isinstance(gr, GlobalRoute):
            raise TypeError(
                f"Argument 'gr' has incorrect type (expected pyverbs.addr.GlobalRoute, got {type(gr).__name__})"
            )
        self.port_num, self.sl, self.src_path_bits, self.dlid = port_num, sl, src_path_bits, dlid
        self.static_rate, self.is_global = static_rate, is_global
        self._dgid, self._flow_label, self._sgid_index, self._hop_limit, self._traffic_class = bytes(16), 0, 0, 0, 0
        if is_global:
            if gr is None:
                raise PyverbsUserError('Global AH Attr is created but gr parameter is None')
            self._dgid = gr._dgid
            self._flow_label, self._sgid_index = gr.flow_label, gr.sgid_index
            self._hop_limit, self._traffic_class = gr.hop_limit, gr.traffic_class

    @property
    def dgid(self):
        if self.is_global:
            return _gid_raw_to_str(self._dgid)

    @dgid.setter
    def dgid(self, val):
        if self.is_global:
            self._dgid = _gid_str_to_raw(val)

    flow_label = _fabric.c_field('flow_label', 0xFFFFFFFF, grh=True)
    sgid_index = _fabric.c_field('sgid_index', 0xFF, grh=True)
    hop_limit = _fabric.c_field('hop_limit', 0xFF, grh=True)
    traffic_class = _fabric.c_field('traffic_class', 0xFF, grh=True)

    def __str__(self):
        f = '  {:22}: {:<20}\n'
        g = ''
        if self.is_global:
            g = (f.format('dgid', self.dgid) + f.format('flow label', self.flow_label)
                 + f.format('sgid index', self.sgid_index) + f.format('hop limit', self.hop_limit)
                 + f.format('traffic_class', self.traffic_class))
        return (f.format('port num', self.port_num) + f.format('sl', self.sl)
                + f.format('source path bits', self.src_path_bits) + f.format('dlid', self.dlid)
                + f.format('static rate', self.static_rate) + f.format('is global', self.is_global) + g)


class AH(_fabric.PyverbsCM):
    """An address handle, as mlx5 makes one on a RoCE port: a GRH is required (is_global), the sgid
    index must name a populated GID, and a RoCE v2 sgid fixes the UDP source port from the flow label
    (ibv_flow_label_to_udp_sport; flow label 0: a random port, chosen once)."""

    def __init__(self, pd, **kwargs):
        super().__init__()
        from pyverbs.pd import PD
        if not isinstance(pd, PD):
            raise TypeError(f"Argument 'pd' has incorrect type (expected pyverbs.pd.PD, got {type(pd).__name__})")
        self._pd = None
        if len(kwargs) != 1:
            raise PyverbsRDMAError('Failed to create AH (the fake supports AH(pd, attr=AHAttr) only)',
                                   errno.EOPNOTSUPP)
        attr = kwargs['attr']
        if not isinstance(attr, AHAttr):
            raise TypeError(f"expected pyverbs.addr.AHAttr, got {type(attr).__name__}")
        if pd._dev is None:
            raise PyverbsRDMAError('Failed to create AH', errno.EINVAL)
        cfg = pd._dev.current()
        if attr.port_num != 1 or not attr.is_global:  # one Ethernet port: RoCE needs a GRH (mlx5: EINVAL)
            raise PyverbsRDMAError('Failed to create AH', errno.EINVAL)
        if attr._sgid_index >= len(cfg.gids):  # an empty GID entry has no netdev: the kernel refuses
            raise PyverbsRDMAError('Failed to create AH', errno.EINVAL)
        self._dgid = attr._dgid
        self._flow_label = attr._flow_label & _fabric.FLOW_LABEL_MASK
        self._sgid_index, self._hop_limit, self._traffic_class = attr._sgid_index, attr._hop_limit, attr._traffic_class
        if self._flow_label:
            self._sport = _fabric.flow_label_to_udp_sport(self._flow_label)
        else:
            self._sport = _fabric.rng().randrange(_fabric.SPORT_MIN, 0x10000)
        self._pd = pd
        pd._add_ref(self)

    def close(self):
        if self._pd is not None:
            self._pd = None
