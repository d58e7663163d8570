"""pyverbs.qp: QPCap, QPInitAttr, QPAttr, QP. Only UD QPs (other types: PyverbsRDMAError EOPNOTSUPP).

As in real pyverbs a QP created with a QPAttr goes RESET -> INIT -> RTR -> RTS when it is UD, with
the masks pyverbs uses (INIT: pkey index, port, qkey; RTS: sq psn). post_send/post_recv check like
mlx5: a full queue (sends whose completion, or a later signaled one, was not yet polled; posted
receives) raises ENOMEM, too many SGEs ENOMEM (send) / EINVAL (receive). Stricter than mlx5:
post_send on a QP in RESET, INIT or RTR raises EINVAL (mlx5 queues the WQE and never executes it).
Send errors (an SGE outside its MR, a message over the path MTU) complete with an error status and
put the send queue in the SQE state (later sends: IBV_WC_WR_FLUSH_ERR) until a modify to RTS. A
failing sendto (the simulation's own trouble) completes with IBV_WC_GENERAL_ERR and changes nothing.
"""

import collections
import errno
import time

import pyverbs.enums as e
from pyverbs import _fabric
from pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError


class QPCap(_fabric.PyverbsObject):
    def __init__(self, max_send_wr=1, max_recv_wr=10, max_send_sge=1, max_recv_sge=1, max_inline_data=0):
        super().__init__()
        self.max_send_wr = max_send_wr
        self.max_recv_wr = max_recv_wr
        self.max_send_sge = max_send_sge
        self.max_recv_sge = max_recv_sge
        self.max_inline_data = max_inline_data

    def __str__(self):
        f = '{:20}: {:<20}\n'
        return (f.format('max send wrs', self.max_send_wr) + f.format('max recv wrs', self.max_recv_wr)
                + f.format('max send sges', self.max_send_sge) + f.format('max recv sges', self.max_recv_sge)
                + f.format('max inline data', self.max_inline_data))


_CAP_FIELDS = ('max_send_wr', 'max_recv_wr', 'max_send_sge', 'max_recv_sge', 'max_inline_data')


class _CapsMixin:
    """The cap property and the max_* shortcuts of QPInitAttr (and QPAttr's cap)."""

    def _set_caps(self, cap):
        if cap is None:
            return
        for name in _CAP_FIELDS:
            self._caps[name] = getattr(cap, name)

    @property
    def cap(self):
        return QPCap(**self._caps)

    @cap.setter
    def cap(self, val):
        self._set_caps(val)


def _cap_property(name):
    return property(lambda self: self._caps[name], lambda self, val: self._caps.__setitem__(name, val))


class QPInitAttr(_CapsMixin, _fabric.PyverbsObject):
    """ibv_qp_init_attr. Without `cap` every capacity is 0 (the C struct is zeroed), as in pyverbs."""

    def __init__(self, qp_type=e.IBV_QPT_UD, qp_context=None, scq=None, rcq=None, srq=None, cap=None, sq_sig_all=1):
        super().__init__()
        from pyverbs.cq import CQ, CQEX
        for _arg, val in (('scq', scq), ('rcq', rcq)):
            if val is not None and not isinstance(val, (CQ, CQEX)):
                raise PyverbsUserError(f'Expected CQ/CQEX, got {type(val)}')
        self._caps = dict.fromkeys(_CAP_FIELDS, 0)
        self._set_caps(cap)
        self._qp_context = qp_context
        self.send_cq = scq
        self.recv_cq = rcq
        self.qp_type = qp_type
        self.sq_sig_all = sq_sig_all
        self.srq = srq

    max_send_wr = _cap_property('max_send_wr')
    max_recv_wr = _cap_property('max_recv_wr')
    max_send_sge = _cap_property('max_send_sge')
    max_recv_sge = _cap_property('max_recv_sge')
    max_inline_data = _cap_property('max_inline_data')

    def __str__(self):
        return f'QP type: {self.qp_type}\nSQ sig. all: {self.sq_sig_all}\n' + str(self.cap)


class QPAttr(_CapsMixin, _fabric.PyverbsObject):
    """ibv_qp_attr with the defaults pyverbs gives it (a RESET -> INIT transition); everything else 0."""

    def __init__(self, qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET, port_num=1, path_mtu=e.IBV_MTU_1024):
        super().__init__()
        self._caps = dict.fromkeys(_CAP_FIELDS, 0)
        self.qp_state = qp_state
        self.cur_qp_state = cur_qp_state
        self.port_num = port_num
        self.path_mtu = path_mtu
        self.path_mig_state = self.qkey = self.rq_psn = self.sq_psn = self.dest_qp_num = 0
        self.qp_access_flags = self.pkey_index = self.alt_pkey_index = self.en_sqd_async_notify = 0
        self.sq_draining = self.max_rd_atomic = self.max_dest_rd_atomic = self.min_rnr_timer = 0
        self.timeout = self.retry_cnt = self.rnr_retry = self.alt_port_num = self.alt_timeout = self.rate_limit = 0
        self._ah_attr = None
        self._alt_ah_attr = None

    @property
    def ah_attr(self):
        from pyverbs.addr import AHAttr
        return self._ah_attr if self._ah_attr is not None else AHAttr(port_num=0)

    @ah_attr.setter
    def ah_attr(self, val):
        if val is not None:
            self._ah_attr = val

    @property
    def alt_ah_attr(self):
        from pyverbs.addr import AHAttr
        return self._alt_ah_attr if self._alt_ah_attr is not None else AHAttr(port_num=0)

    @alt_ah_attr.setter
    def alt_ah_attr(self, val):
        if val is not None:
            self._alt_ah_attr = val

    def __str__(self):
        return f'QP state: {self.qp_state}\nqkey: {self.qkey}\nport: {self.port_num}\npkey index: {self.pkey_index}\n'


RESET, INIT, RTR, RTS, SQD, SQE, ERR = (e.IBV_QPS_RESET, e.IBV_QPS_INIT, e.IBV_QPS_RTR, e.IBV_QPS_RTS, e.IBV_QPS_SQD,
                                        e.IBV_QPS_SQE, e.IBV_QPS_ERR)
_TRANSITIONS = {(RESET, INIT), (INIT, INIT), (INIT, RTR), (RTR, RTS), (RTS, RTS), (SQE, RTS), (RTS, SQD), (SQD, RTS),
                (SQD, SQD)}
_REQUIRED = {(RESET, INIT): e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY, (RTR, RTS): e.IBV_QP_SQ_PSN}
_UD_MASKS = {'INIT': e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY, 'RTR': 0, 'RTS': e.IBV_QP_SQ_PSN}
_SEND_OPCODES = (e.IBV_WR_SEND, e.IBV_WR_SEND_WITH_IMM)


class QP(_fabric.PyverbsCM):
    def __init__(self, creator, init_attr, qp_attr=None):
        super().__init__()
        from pyverbs.cq import CQ, CQEX
        from pyverbs.device import Context
        from pyverbs.pd import PD
        self._dev = None
        if creator is None or init_attr is None:
            raise TypeError("Argument 'creator' / 'init_attr' must not be None")
        if isinstance(creator, Context):  # ibv_create_qp_ex with a QPInitAttrEx: not in the fake
            raise PyverbsRDMAError('Failed to create QP (QPInitAttrEx is not supported by the fake)', errno.EOPNOTSUPP)
        if not isinstance(creator, PD):
            raise TypeError(f"Argument 'pd' has incorrect type (expected pyverbs.pd.PD, got {type(creator).__name__})")
        if not isinstance(init_attr, QPInitAttr):
            raise TypeError("Argument 'attr' has incorrect type (expected pyverbs.qp.QPInitAttr)")
        if qp_attr is not None and not isinstance(qp_attr, QPAttr):
            raise TypeError("Argument 'qp_attr' has incorrect type (expected pyverbs.qp.QPAttr)")
        if init_attr.qp_type != e.IBV_QPT_UD:
            raise PyverbsRDMAError('Failed to create QP (the fake has UD QPs only)', errno.EOPNOTSUPP)
        if init_attr.srq is not None:
            raise PyverbsRDMAError('Failed to create QP (SRQs are not supported by the fake)', errno.EOPNOTSUPP)
        dev = creator._dev
        scq, rcq = init_attr.send_cq, init_attr.recv_cq
        if dev is None or scq is None or rcq is None:
            raise PyverbsRDMAError('Failed to create QP', errno.EINVAL)
        for cq in (scq, rcq):
            if not isinstance(cq, (CQ, CQEX)) or cq._dev is not dev:
                raise PyverbsRDMAError('Failed to create QP', errno.EINVAL)
        caps = init_attr._caps
        if (caps['max_send_wr'] > _fabric.MAX_QP_WR or caps['max_recv_wr'] > _fabric.MAX_QP_WR
                or caps['max_send_sge'] > _fabric.MAX_SGE or caps['max_recv_sge'] > _fabric.MAX_SGE
                or caps['max_inline_data'] > 512):
            raise PyverbsRDMAError('Failed to create QP', errno.EINVAL)
        dev.bind()
        self._caps = dict(caps)
        self._qp_type = init_attr.qp_type
        self._sq_sig_all = init_attr.sq_sig_all
        self._pd, self._scq, self._rcq = creator, scq, rcq
        self._state = RESET
        self._sq_error = False
        self._qkey = self._pkey_index = self._sq_psn = 0
        self._port_num = 1
        self._sq = collections.deque()  # sequence numbers of sends whose slot is still taken
        self._sq_seq = 0
        self._rq = collections.deque()  # (wr_id, [(addr, length, lkey)])
        self._qpn = dev.new_qpn()
        self._dev = dev
        dev.qps[self._qpn] = self
        for owner in (creator, scq, rcq):
            owner._add_ref(self)
        if qp_attr is not None:
            self.to_rts(qp_attr)

    def close(self):
        if self._dev is not None:
            if self._dev.qps.get(self._qpn) is self:
                del self._dev.qps[self._qpn]
            self._dev = None
            self._sq.clear()
            self._rq.clear()
            self._pd = self._scq = self._rcq = None

    # -- state ---------------------------------------------------------------------------------------
    def _check_open(self):
        if self._dev is None:
            raise PyverbsRDMAError('Fake QP: the QP is closed', errno.EINVAL)

    def _modify(self, attr, mask, what):
        self._check_open()
        cur = self._state if not (self._sq_error and self._state == RTS) else SQE
        new = attr.qp_state if mask & e.IBV_QP_STATE else cur
        ok = new in (RESET, ERR) or (cur, new) in _TRANSITIONS
        ok = ok and (mask & _REQUIRED.get((cur, new), 0)) == _REQUIRED.get((cur, new), 0)
        ok = ok and not (mask & e.IBV_QP_PORT and attr.port_num != 1)
        ok = ok and not (mask & e.IBV_QP_PKEY_INDEX and not 0 <= attr.pkey_index < _fabric.PKEY_TBL_LEN)
        ok = ok and not (mask & e.IBV_QP_CUR_STATE and attr.cur_qp_state != cur)
        if not ok:
            raise PyverbsRDMAError(what, errno.EINVAL)
        if mask & e.IBV_QP_QKEY:
            self._qkey = attr.qkey & 0xFFFFFFFF
        if mask & e.IBV_QP_PKEY_INDEX:
            self._pkey_index = attr.pkey_index
        if mask & e.IBV_QP_SQ_PSN:
            self._sq_psn = attr.sq_psn & 0xFFFFFF
        if mask & e.IBV_QP_CAP:
            self._set_caps(attr)
        self._state = new
        if new == RTS:
            self._sq_error = False
        if new == RESET:
            self._sq.clear()
            self._rq.clear()
            self._qkey = self._pkey_index = 0
        elif new == ERR:
            self._flush_rq()

    def _set_caps(self, attr):
        for name in ('max_send_wr', 'max_recv_wr'):
            self._caps[name] = attr._caps[name]

    def _flush_rq(self):
        while self._rq:
            wr_id, _sges = self._rq.popleft()
            self._rcq._push(_fabric.Completion(wr_id, e.IBV_WC_WR_FLUSH_ERR, e.IBV_WC_RECV, self._qpn, 0, qp=self))

    def to_init(self, qp_attr, /):
        qp_attr.qp_state = INIT
        self._modify(qp_attr, _UD_MASKS['INIT'] | e.IBV_QP_STATE, 'Failed to modify QP state to init')

    def to_rtr(self, qp_attr, /):
        if self.qp_state != INIT:
            self.to_init(qp_attr)
        qp_attr.qp_state = RTR
        self._modify(qp_attr, _UD_MASKS['RTR'] | e.IBV_QP_STATE, 'Failed to modify QP state to RTR')

    def to_rts(self, qp_attr, /):
        if self.qp_state != RTR:
            self.to_rtr(qp_attr)
        qp_attr.qp_state = RTS
        self._modify(qp_attr, _UD_MASKS['RTS'] | e.IBV_QP_STATE, 'Failed to modify QP state to RTS')

    def modify(self, qp_attr, comp_mask):
        if not isinstance(qp_attr, QPAttr):
            raise TypeError("Argument 'qp_attr' has incorrect type (expected pyverbs.qp.QPAttr)")
        self._modify(qp_attr, comp_mask, 'Failed to modify QP')

    def query(self, attr_mask, /):
        self._check_open()
        attr = QPAttr(qp_state=SQE if self._sq_error and self._state == RTS else self._state,
                      cur_qp_state=self._state, port_num=self._port_num,
                      path_mtu=self._dev.current().active_mtu)
        attr.qkey, attr.pkey_index, attr.sq_psn = self._qkey, self._pkey_index, self._sq_psn
        attr._caps = dict(self._caps)
        init_attr = QPInitAttr(qp_type=self._qp_type, scq=self._scq, rcq=self._rcq, sq_sig_all=self._sq_sig_all)
        init_attr._caps = dict(self._caps)
        return attr, init_attr

    def _can_receive(self) -> bool:
        return self._state in (RTR, RTS, SQD, SQE)

    # -- send ----------------------------------------------------------------------------------------
    def post_send(self, wr, bad_wr=None):
        from pyverbs.wr import SendWR
        if not isinstance(wr, SendWR):
            raise TypeError("Argument 'wr' has incorrect type (expected pyverbs.wr.SendWR)")
        self._check_open()
        while wr is not None:
            self._post_one_send(wr)
            wr = wr.next_wr

    def _post_one_send(self, wr):
        if self._state in (RESET, INIT, RTR):
            raise PyverbsRDMAError('Failed to post send', errno.EINVAL)
        if wr.opcode not in _SEND_OPCODES:
            raise PyverbsRDMAError('Failed to post send', errno.EINVAL)
        if len(self._sq) >= self._caps['max_send_wr']:
            raise PyverbsRDMAError('Failed to post send', errno.ENOMEM)
        if wr.num_sge > self._caps['max_send_sge']:
            raise PyverbsRDMAError('Failed to post send', errno.ENOMEM)
        total = sum(length for _a, length, _k in wr._sges)
        if wr.send_flags & e.IBV_SEND_INLINE and total > self._caps['max_inline_data']:
            raise PyverbsRDMAError('Failed to post send', errno.ENOMEM)
        ah = wr._ah
        if ah is None or ah._pd is None or ah._pd._dev is not self._dev:
            raise PyverbsRDMAError('Failed to post send', errno.EINVAL)
        chunks = []
        status = e.IBV_WC_SUCCESS
        for addr, length, lkey in wr._sges:  # the data is taken now, as if inline
            found = _fabric.resolve_sge(addr, length, lkey, need_write=False)
            if found is None:
                status = e.IBV_WC_LOC_PROT_ERR
                break
            mr, off = found
            chunks.append(bytes(mr._data[off:off + length]))
        payload = b''.join(chunks)
        seq = self._sq_seq
        self._sq_seq += 1
        self._sq.append(seq)
        cycles = self._dev.current().cycles(time.time_ns())
        if self._state in (ERR, SQD) or self._sq_error:
            status = e.IBV_WC_WR_FLUSH_ERR
        elif status == e.IBV_WC_SUCCESS and len(payload) > _fabric.MTU_BYTES[self._dev.current().active_mtu]:
            status = e.IBV_WC_LOC_LEN_ERR
        elif status == e.IBV_WC_SUCCESS:
            qkey = self._qkey if wr._remote_qkey & 0x80000000 else wr._remote_qkey
            imm = wr.imm_data if wr.opcode == e.IBV_WR_SEND_WITH_IMM else None
            sent, cycles = self._dev.transmit(ah, wr._remote_qpn, self._qpn, qkey, payload, imm)
            if not sent:
                status = e.IBV_WC_GENERAL_ERR
        if status in (e.IBV_WC_LOC_PROT_ERR, e.IBV_WC_LOC_LEN_ERR):  # the WR's fault: the send queue stops
            self._sq_error = True
        if status != e.IBV_WC_SUCCESS or wr.send_flags & e.IBV_SEND_SIGNALED or self._sq_sig_all:
            self._scq._push(_fabric.Completion(wr.wr_id, status, e.IBV_WC_SEND, self._qpn, cycles, qp=self,
                                               sq_seq=seq))

    def _retire_sends(self, seq):
        while self._sq and self._sq[0] <= seq:
            self._sq.popleft()

    # -- receive -------------------------------------------------------------------------------------
    def post_recv(self, wr, bad_wr=None):
        from pyverbs.wr import RecvWR
        if not isinstance(wr, RecvWR):
            raise TypeError("Argument 'wr' has incorrect type (expected pyverbs.wr.RecvWR)")
        self._check_open()
        while wr is not None:
            if len(self._rq) >= self._caps['max_recv_wr']:
                raise PyverbsRDMAError('Failed to post recv', errno.ENOMEM)
            if wr.num_sge > self._caps['max_recv_sge']:
                raise PyverbsRDMAError('Failed to post recv', errno.EINVAL)
            self._rq.append((wr.wr_id, list(wr._sges)))
            if self._state == ERR:
                self._flush_rq()
            wr = wr.next_wr

    def _receive(self, data: bytes, src_qpn: int, imm, cycles: int) -> None:
        wr_id, sges = self._rq.popleft()
        status = e.IBV_WC_SUCCESS
        pos = 0
        for addr, length, lkey in sges:
            if pos >= len(data):
                break
            n = min(length, len(data) - pos)
            found = _fabric.resolve_sge(addr, n, lkey, need_write=True)
            if found is None:
                status = e.IBV_WC_LOC_PROT_ERR
                _fabric.stats["rx_prot_err"] += 1
                break
            mr, off = found
            mr._data[off:off + n] = data[pos:pos + n]
            pos += n
        if status == e.IBV_WC_SUCCESS and pos < len(data):
            status = e.IBV_WC_LOC_LEN_ERR
            _fabric.stats["rx_len_err"] += 1
        flags = e.IBV_WC_GRH | (e.IBV_WC_WITH_IMM if imm is not None else 0)
        self._rcq._push(_fabric.Completion(wr_id, status, e.IBV_WC_RECV, self._qpn, cycles, byte_len=len(data),
                                           src_qp=src_qpn, imm_data=imm or 0, wc_flags=flags, qp=self))

    # -- properties ----------------------------------------------------------------------------------
    @property
    def qp_type(self):
        return int(self._qp_type)

    @property
    def qp_state(self):
        """The state last set by a modify (libibverbs' cached ibv_qp.state; query() has the live one)."""
        return int(self._state)

    @property
    def qp_num(self):
        return self._qpn

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return f.format('QP type', 'UD') + f.format('  number', self.qp_num) + f.format('  state', self.qp_state)
