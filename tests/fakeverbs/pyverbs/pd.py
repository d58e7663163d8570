"""pyverbs.pd: PD."""

import errno

from pyverbs import _fabric
from pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError


class PD(_fabric.PyverbsCM):
    """A protection domain of a Context; closing it closes its QPs, MRs and AHs first."""

    def __init__(self, creator, **kwargs):
        super().__init__()
        from pyverbs.device import Context
        self._dev = None
        if creator is None:
            raise TypeError("Argument 'creator' must not be None")
        if not isinstance(creator, Context):
            raise PyverbsUserError(f'Cannot create PD from {type(creator)}')
        if kwargs.get('handle') is not None:
            raise PyverbsRDMAError('Failed to import PD (not supported by the fake)', errno.EOPNOTSUPP)
        if creator._dev is None:
            raise PyverbsRDMAError('Failed to allocate PD', errno.EINVAL)
        self._ctx = creator
        self._dev = creator._dev
        creator._add_ref(self)

    def close(self):
        if self._dev is not None:
            self._close_dependents()
            self._dev = None
            self._ctx = None
