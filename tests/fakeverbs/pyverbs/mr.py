"""pyverbs.mr: MR. The buffer is a bytearray behind a fake address (unique per MR, page aligned):
`buf` is an int as in real pyverbs, and SGEs whose [addr, addr + length) lies inside it, with its
lkey, resolve to it. Out-of-range write()/read() raise PyverbsUserError where the real one would
corrupt or read foreign memory."""

import errno

from pyverbs import _fabric
from pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError


class MR(_fabric.PyverbsCM):
    def __init__(self, creator, length=0, access=0, address=None, implicit=False, **kwargs):
        super().__init__()
        from pyverbs.pd import PD
        self._data = None
        self._pd = None
        if creator is None:
            raise TypeError("Argument 'creator' must not be None")
        if address or implicit or kwargs.get('handle') is not None:
            raise PyverbsRDMAError('Failed to register a MR (user addresses, implicit and imported MRs are not '
                                   'supported by the fake)', errno.EOPNOTSUPP)
        if not isinstance(creator, PD) or creator._dev is None:
            raise PyverbsRDMAError(f'Failed to register a MR. length: {length}, access flags: {access}',
                                   errno.EINVAL)
        if length <= 0:  # ibv_reg_mr(NULL, 0): the kernel refuses
            raise PyverbsRDMAError(f'Failed to register a MR. length: {length}, access flags: {access}',
                                   errno.EINVAL)
        self._addr, self._key = _fabric.alloc_region(length)
        self._data = bytearray(length)
        self._access = access
        self._length = length
        self._pd = creator
        creator._add_ref(self)
        _fabric.mrs_by_lkey[self._key] = self

    def close(self):
        if self._data is not None:
            _fabric.mrs_by_lkey.pop(self._key, None)
            self._data = None
            self._pd = None

    def write(self, data, length, offset=0):
        if self._data is None or length < 0:
            raise PyverbsUserError('The MR buffer isn\'t allocated or length'
                                   f' {length} is invalid')
        if isinstance(data, str):
            data = data.encode()
        data = bytes(data)
        if len(data) < length or offset < 0 or offset + length > len(self._data):
            raise PyverbsUserError(f'Fake MR: writing {length} bytes (of {len(data)} given) at offset {offset} '
                                   f'overruns the {len(self._data)}-byte buffer or the data')
        self._data[offset:offset + length] = data[:length]

    def read(self, length, offset):
        if offset < 0:
            raise PyverbsUserError(f'Invalid offset {offset}')
        if self._data is None or length < 0:
            raise PyverbsUserError('The MR buffer isn\'t allocated or length'
                                   f' {length} is invalid')
        if offset + length > len(self._data):
            raise PyverbsUserError(f'Fake MR: reading {length} bytes at offset {offset} overruns the '
                                   f'{len(self._data)}-byte buffer')
        return bytes(self._data[offset:offset + length])

    @property
    def buf(self):
        return self._addr if self._data is not None else 0

    @property
    def lkey(self):
        return self._key

    @property
    def rkey(self):
        return self._key

    @property
    def length(self):
        return self._length

    @property
    def handle(self):
        return self._key & 0xFFFF

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return ('MR:\n' + f.format('lkey', self.lkey) + f.format('rkey', self.rkey) + f.format('length', self.length)
                + f.format('buf', self.buf) + f.format('handle', self.handle))
