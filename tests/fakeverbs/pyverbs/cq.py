"""pyverbs.cq: CQ (poll), CqInitAttrEx, CQEX (start_poll / poll_next / end_poll and the read_*
accessors), WC, PollCqAttr.

Polling any CQ of a device first drains the device's wire: received datagrams become receive
completions on their QP's receive CQ. A completion is consumed when start_poll / poll_next /
poll returns it; that frees its send queue slot (and those of unsignaled sends before it), as on
mlx5. Stricter than real pyverbs, where these are undefined behaviour: end_poll without a successful
start_poll, start_poll inside a poll, a read_* outside a poll, and a read_* of a field the CQ was not
created for (e.g. read_timestamp without IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) raise PyverbsError.
"""

import collections
import errno

import pyverbs.enums as e
from pyverbs import _fabric
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError


def _check_context(context):
    from pyverbs.device import Context
    if not isinstance(context, Context):
        raise TypeError(f"Argument 'context' has incorrect type (expected pyverbs.device.Context, got "
                        f"{type(context).__name__})")
    if context._dev is None:
        raise PyverbsRDMAError('Failed to create a CQ', errno.EINVAL)


class _CqBase(_fabric.PyverbsCM):
    def _init_queue(self, context, cqe):
        self._dev = context._dev
        self._ctx = context
        self._cqe = cqe
        self._queue = collections.deque()
        context._add_ref(self)

    def _push(self, c: _fabric.Completion) -> None:
        if len(self._queue) >= self._cqe:
            _fabric.stats["cq_overrun"] += 1
            return
        self._queue.append(c)

    def _next(self):
        if not self._queue and self._dev is not None:
            self._dev.drain()
        if not self._queue:
            return None
        c = self._queue.popleft()
        _fabric.consumed(c)
        return c


class CQ(_CqBase):
    """ibv_cq: poll() gives WC objects."""

    def __init__(self, context, cqe, cq_context=None, channel=None, comp_vector=0):
        super().__init__()
        self._dev = None
        _check_context(context)
        if channel is not None:
            raise PyverbsRDMAError('Failed to create a CQ (completion channels are not supported by the fake)',
                                   errno.EOPNOTSUPP)
        if not 0 < cqe <= _fabric.MAX_CQE:
            raise PyverbsRDMAError('Failed to create a CQ', errno.EINVAL)
        self._init_queue(context, cqe)
        self.num_events = 0

    def close(self):
        if self._dev is not None:
            self._close_dependents()
            self._dev = None
            self._ctx = None

    def poll(self, num_entries=1):
        wcs = []
        while len(wcs) < num_entries:
            c = self._next()
            if c is None:
                break
            wcs.append(WC(wr_id=c.wr_id, status=c.status, opcode=c.opcode, vendor_err=c.vendor_err,
                          byte_len=c.byte_len, qp_num=c.qp_num, src_qp=c.src_qp, imm_data=c.imm_data,
                          wc_flags=c.wc_flags, pkey_index=c.pkey_index, slid=c.slid, sl=c.sl,
                          dlid_path_bits=c.dlid_path_bits))
        return len(wcs), wcs

    def req_notify(self, solicited_only=False):
        raise PyverbsRDMAError(f'Request notify CQ returned {errno.EOPNOTSUPP}', errno.EOPNOTSUPP)

    @property
    def comp_channel(self):
        return None

    @property
    def cqe(self):
        return self._cqe

    def __str__(self):
        return 'CQ\n' + '{:22}: {:<20}\n'.format('CQEs', self._cqe)


class CqInitAttrEx(_fabric.PyverbsObject):
    """ibv_cq_init_attr_ex. As in v44, cq_context is a setter-only property, not an argument."""

    def __init__(self, cqe=100, channel=None, comp_vector=0, wc_flags=0, comp_mask=0, flags=0, parent_domain=None):
        super().__init__()
        self.cqe = cqe
        self._channel = channel
        self.comp_vector = comp_vector
        self.wc_flags = wc_flags
        self.comp_mask = comp_mask
        self.flags = flags
        self._parent_domain = parent_domain
        self._cq_context = None

    def _set_cq_context(self, val):
        self._cq_context = val

    cq_context = property(None, _set_cq_context)

    parent_domain = _fabric.c_field('parent_domain')

    @property
    def comp_channel(self):
        return self._channel

    @comp_channel.setter
    def comp_channel(self, val):
        self._channel = val

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('Number of CQEs', self.cqe) + f.format('WC flags', self.wc_flags)
                + f.format('comp mask', self.comp_mask) + f.format('flags', self.flags))


_FIELD_FLAGS = {
    'read_byte_len': e.IBV_WC_EX_WITH_BYTE_LEN, 'read_imm_data': e.IBV_WC_EX_WITH_IMM,
    'read_qp_num': e.IBV_WC_EX_WITH_QP_NUM, 'read_src_qp': e.IBV_WC_EX_WITH_SRC_QP,
    'read_slid': e.IBV_WC_EX_WITH_SLID, 'read_sl': e.IBV_WC_EX_WITH_SL,
    'read_dlid_path_bits': e.IBV_WC_EX_WITH_DLID_PATH_BITS,
    'read_timestamp': e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
}
_SUPPORTED_WC_FLAGS = e.IBV_WC_STANDARD_FLAGS | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP


class CQEX(_CqBase):
    """ibv_cq_ex. Our simulated NIC has a free-running HCA clock and no real-time clock: like
    ConnectX-4/5, it refuses IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK (EOPNOTSUPP). It also
    refuses the CVLAN, flow tag and TM info fields (not simulated; mlx5 has them)."""

    def __init__(self, context, init_attr):
        super().__init__()
        self._dev = None
        self._cur = None
        self._polling = False
        _check_context(context)
        if init_attr is None:
            init_attr = CqInitAttrEx()
        if not isinstance(init_attr, CqInitAttrEx):
            raise TypeError("Argument 'init_attr' has incorrect type (expected pyverbs.cq.CqInitAttrEx)")
        if init_attr.comp_channel is not None or init_attr.parent_domain is not None:
            raise PyverbsRDMAError('Failed to create extended CQ', errno.EOPNOTSUPP)
        if init_attr.wc_flags & ~_SUPPORTED_WC_FLAGS:  # wallclock, cvlan, flow tag, TM info
            raise PyverbsRDMAError('Failed to create extended CQ', errno.EOPNOTSUPP)
        if not 0 < init_attr.cqe <= _fabric.MAX_CQE:
            raise PyverbsRDMAError('Failed to create extended CQ', errno.EINVAL)
        self._wc_flags = init_attr.wc_flags
        self._init_queue(context, init_attr.cqe)

    def close(self):
        if self._dev is not None:
            self._close_dependents()
            self._dev = None
            self._ctx = None
            self._cur = None
            self._polling = False

    def start_poll(self, attr, /):
        if attr is not None and not isinstance(attr, PollCqAttr):
            raise TypeError("Argument 'attr' has incorrect type (expected pyverbs.cq.PollCqAttr)")
        if self._dev is None:
            raise PyverbsUserError('Fake CQEX: start_poll on a closed CQ')
        if self._polling:
            raise PyverbsError('Fake CQEX: start_poll while a poll is in progress (end_poll first)')
        self._cur = self._next()
        if self._cur is None:
            return errno.ENOENT
        self._polling = True
        return 0

    def poll_next(self):
        if not self._polling:
            raise PyverbsError('Fake CQEX: poll_next without a successful start_poll')
        self._cur = self._next()
        return 0 if self._cur is not None else errno.ENOENT

    def end_poll(self):
        if not self._polling:
            raise PyverbsError('Fake CQEX: end_poll without a successful start_poll (start_poll returned ENOENT?)')
        self._polling = False
        self._cur = None

    def _current(self, field=None):
        if self._cur is None:
            raise PyverbsError('Fake CQEX: no current completion (start_poll / poll_next did not return 0)')
        if field is not None and not self._wc_flags & _FIELD_FLAGS[field]:
            raise PyverbsError(f'Fake CQEX: {field}() on a CQ created without {_FIELD_FLAGS[field].name}')
        return self._cur

    def read_opcode(self):
        return self._current().opcode

    def read_vendor_err(self):
        return self._current().vendor_err

    def read_byte_len(self):
        return self._current('read_byte_len').byte_len

    def read_imm_data(self):
        return self._current('read_imm_data').imm_data

    def read_qp_num(self):
        return self._current('read_qp_num').qp_num

    def read_src_qp(self):
        return self._current('read_src_qp').src_qp

    def read_wc_flags(self):
        return self._current().wc_flags

    def read_slid(self):
        return self._current('read_slid').slid

    def read_sl(self):
        return self._current('read_sl').sl

    def read_dlid_path_bits(self):
        return self._current('read_dlid_path_bits').dlid_path_bits

    def read_timestamp(self):
        return self._current('read_timestamp').timestamp

    @property
    def status(self):
        return self._current().status

    @status.setter
    def status(self, val):
        self._current().status = val

    @property
    def wr_id(self):
        return self._current().wr_id

    @wr_id.setter
    def wr_id(self, val):
        self._current().wr_id = val

    def __str__(self):
        return 'Extended CQ:\n' + '{:<22}: {:<20}\n'.format('CQEs', self._cqe)


class WC(_fabric.PyverbsObject):
    def __init__(self, wr_id=0, status=0, opcode=0, vendor_err=0, byte_len=0, qp_num=0, src_qp=0, imm_data=0,
                 wc_flags=0, pkey_index=0, slid=0, sl=0, dlid_path_bits=0):
        super().__init__()
        self.wr_id, self.status, self.opcode, self.vendor_err, self.byte_len = (
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
        )
        self.qp_num, self.src_qp, self.imm_data, self.wc_flags = qp_num, src_qp, imm_data, wc_flags
        self.pkey_index, self.slid, self.sl, self.dlid_path_bits = pkey_index, slid, sl, dlid_path_bits

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return ''.join(f.format(k, getattr(self, k)) for k in (
            'wr_id', 'status', 'opcode', 'vendor_err', 'byte_len', 'qp_num', 'src_qp', 'wc_flags', 'pkey_index',
            'slid', 'sl', 'imm_data', 'dlid_path_bits'))


class PollCqAttr(_fabric.PyverbsObject):
    def __init__(self):
        super().__init__()
        self.comp_mask = 0
