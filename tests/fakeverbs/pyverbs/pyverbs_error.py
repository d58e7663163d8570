"""pyverbs.pyverbs_error: the same hierarchy, arguments and messages as rdma-core's."""

import os


class PyverbsError(Exception):
    """Base of pyverbs' exceptions (PyverbsRDMAError: rdma-core returned an error; PyverbsUserError:
    pyverbs found the user's input wrong)."""

    def __init__(self, msg, error_code=-1):
        if error_code != -1:
            msg = f'{msg}. Errno: {error_code}, {os.strerror(error_code)}'
        super().__init__(msg)


class PyverbsRDMAError(PyverbsError):
    """An rdma-core function returned an error; `error_code` is its errno (-1: none given)."""

    def __init__(self, msg, error_code=-1):
        super().__init__(msg, error_code)
        self._error_code = error_code

    @property
    def error_code(self):
        return self._error_code


class PyverbsUserError(PyverbsError):
    """An error in the user's action or input."""

    def __init__(self, msg):
        super().__init__(msg)
