"""pyverbs.wr: SGE, RecvWR, SendWR. Like the real ones, WRs copy their SGEs (address, length, lkey)
when built; the data an SGE points at is read when the send is posted, written when a datagram is
received."""

import pyverbs.enums as e
from pyverbs import _fabric
from pyverbs.pyverbs_error import PyverbsUserError


class SGE(_fabric.PyverbsCM):
    def __init__(self, addr, length, lkey):
        super().__init__()
        self.addr, self.length, self.lkey = addr, length, lkey

    def close(self):
        pass

    def read(self, length, offset):
        found = _fabric.resolve_sge(self._addr + offset, length, self._lkey, False)
        if found is None:
            raise PyverbsUserError('Fake SGE: the range is not inside a registered MR with this lkey')
        mr, off = found
        return bytes(mr._data[off:off + length])

    addr = _fabric.c_field('addr', 0xFFFFFFFFFFFFFFFF)
    length = _fabric.c_field('length', 0xFFFFFFFF)
    lkey = _fabric.c_field('lkey', 0xFFFFFFFF)

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return f.format('Address', hex(self.addr)) + f.format('Length', self.length) + f.format('Key', hex(self.lkey))


def _copy_sg(sg, num_sge):
    return [(sg[i].addr, sg[i].length, sg[i].lkey) for i in range(num_sge)]


class RecvWR(_fabric.PyverbsCM):
    def __init__(self, wr_id=0, num_sge=0, sg=None, next_wr=None):
        super().__init__()
        if next_wr is not None and not isinstance(next_wr, RecvWR):
            raise TypeError("Argument 'next_wr' has incorrect type")
        if num_sge < 1 or sg is None:
            raise PyverbsUserError('A WR needs at least one SGE')
        self._sges = _copy_sg(sg, num_sge)
        self.num_sge = num_sge
        self.wr_id = wr_id
        self._next = next_wr

    def close(self):
        pass

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return f.format('WR ID', self.wr_id) + f.format('Num SGE', self.num_sge)

    @property
    def next_wr(self):
        return self._next

    @next_wr.setter
    def next_wr(self, val):
        if not isinstance(val, RecvWR):
            raise TypeError("Argument 'val' has incorrect type")
        self._next = val

    wr_id = _fabric.c_field('wr_id', 0xFFFFFFFFFFFFFFFF)
    num_sge = _fabric.c_field('num_sge')


class SendWR(_fabric.PyverbsCM):
    def __init__(self, wr_id=0, opcode=e.IBV_WR_SEND, num_sge=0, imm_data=0, sg=None,
                 send_flags=e.IBV_SEND_SIGNALED, next_wr=None):
        super().__init__()
        if next_wr is not None and not isinstance(next_wr, SendWR):
            raise TypeError("Argument 'next_wr' has incorrect type")
        mw_opcodes = [e.IBV_WR_LOCAL_INV, e.IBV_WR_BIND_MW, e.IBV_WR_SEND_WITH_INV]
        if opcode not in mw_opcodes and (num_sge < 1 or sg is None):
            raise PyverbsUserError('A WR needs at least one SGE')
        self._sges = _copy_sg(sg, num_sge) if sg is not None else []
        self.num_sge = num_sge
        self.wr_id = wr_id
        self._next = next_wr
        self.opcode = opcode
        self.send_flags = send_flags
        self.imm_data = imm_data
        self._ah = None
        self._remote_qpn = 0
        self._remote_qkey = 0

    def close(self):
        pass

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('WR ID', self.wr_id) + f.format('Num SGE', self.num_sge) + f.format('Opcode', self.opcode)
                + f.format('Send flags', self.send_flags) + f.format('Imm Data', self.imm_data))

    @property
    def next_wr(self):
        return self._next

    @next_wr.setter
    def next_wr(self, val):
        if not isinstance(val, SendWR):
            raise TypeError("Argument 'val' has incorrect type")
        self._next = val

    wr_id = _fabric.c_field('wr_id', 0xFFFFFFFFFFFFFFFF)
    num_sge = _fabric.c_field('num_sge')
    imm_data = _fabric.c_field('imm_data', 0xFFFFFFFF)
    opcode = _fabric.c_field('opcode')
    send_flags = _fabric.c_field('send_flags')

    def _set_sg_list(self, val):
        """Real pyverbs: a setter-only property pointing the WR's scatter list at one SGE."""
        if not isinstance(val, SGE):
            raise TypeError("Argument 'val' has incorrect type")
        self._sges = [(val.addr, val.length, val.lkey)]

    sg_list = property(None, _set_sg_list)

    def set_wr_ud(self, ah, rqpn, rqkey):
        from pyverbs.addr import AH
        if not isinstance(ah, AH):
            raise TypeError("Argument 'ah' has incorrect type (expected pyverbs.addr.AH)")
        self._ah = ah
        self._remote_qpn = rqpn & 0xFFFFFFFF
        self._remote_qkey = rqkey & 0xFFFFFFFF
